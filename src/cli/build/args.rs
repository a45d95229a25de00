//! The flags of `kiln build`, as clap reads them (checked into options by `validate`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::super::git::GitArgs;
use super::super::install::DepsSandbox;
use super::super::registry::RegistryArgs;

/// Flags of `kiln build`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kiln build ./hello --runtime nodejs22 --image \
        registry.example.com/team/hello:1.0\n  kiln build ./hello --runtime python313 --output \
        oci:./out/hello\n  kiln build --function hello.yaml --image \
        registry.example.com/team/hello\n  kiln build --git https://github.com/org/fns.git \
        --git-ref main --git-base-dir /hello --runtime nodejs22 --output oci:./out\n\nA split \
        build (install scripts never see push credentials):\n  kiln build ./hello --runtime \
        nodejs22 --stage deps --stage-dir /workspace/deps\n  kiln build ./hello --runtime nodejs22 \
        --stage publish --stage-dir /workspace/deps --image REF"
)]
pub struct BuildArgs {
    /// The Function directory: handler.js + package.json (Node.js) or handler.py +
    /// requirements.txt (Python), plus any files the handler needs.
    #[arg(value_name = "DIR", conflicts_with = "function")]
    pub dir: Option<PathBuf>,
    /// Build a Kyma Function manifest (serverless.kyma-project.io/v1alpha2) with inline source.
    #[arg(long, value_name = "FILE")]
    pub function: Option<PathBuf>,
    /// Git source.
    #[command(flatten)]
    pub git: GitArgs,
    /// The runtime (nodejs22, nodejs24, nodejs26, python313, python314). Taken from the
    /// manifest with --function.
    #[arg(long, env = "KILN_RUNTIME")]
    pub runtime: Option<String>,
    /// Push the image here: REGISTRY/REPO[:TAG].
    #[arg(
        long,
        value_name = "REF",
        env = "KILN_IMAGE",
        conflicts_with = "output"
    )]
    pub image: Option<String>,
    /// Write the image to an OCI image layout instead: oci:DIR[:NAME] (NAME defaults to latest).
    #[arg(long, value_name = "oci:DIR[:NAME]")]
    pub output: Option<String>,
    /// Base image override (Kyma's runtimeImageOverride): a registry reference or oci:DIR[:NAME].
    #[arg(long, value_name = "REF", env = "KILN_BASE")]
    pub base: Option<String>,
    /// The platform to build for, picked from a multi-platform base and builder image; or
    /// several, comma-separated (linux/amd64,linux/arm64): one image each, sharing the source
    /// layer, and an OCI image index over them at the target, whose reference is printed.
    #[arg(
        long,
        default_value = "linux/amd64",
        value_name = "OS/ARCH[/VARIANT][,…]"
    )]
    pub platform: String,
    /// FUNC_NAME in the image; defaults to the manifest's name or the directory's name.
    #[arg(long)]
    pub name: Option<String>,
    /// SERVICE_NAMESPACE in the image; defaults to the manifest's namespace or `default`.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Also write the manifest digest (sha256:…) to this file.
    #[arg(long, value_name = "FILE")]
    pub digest_file: Option<PathBuf>,
    /// Write a JSON report to this file: reference, digest, build key, `unchanged` (the
    /// target already held this build), one entry per blob with its outcome and the bytes
    /// sent, and `registry`: the requests and request bytes of the whole build.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Registry access.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// CA bundle the dependency install trusts (TLS-intercepting proxies); defaults to
    /// $SSL_CERT_FILE when set. Never written into the image.
    #[arg(long, value_name = "FILE")]
    pub ca_bundle: Option<PathBuf>,
    /// Parallel blob transfers.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// Cache directory for dependency layers and package downloads
    /// [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// After the build, prune the cache to this size, least recently used first, as
    /// `kiln cache prune --max-size` does (a build Job's cap on a shared cache volume).
    #[arg(
        long,
        value_name = "SIZE",
        env = "KILN_CACHE_MAX_SIZE",
        value_parser = super::super::run::parse_size,
    )]
    pub cache_max_size: Option<u64>,
    /// Rebuild: reinstall dependencies even when a cached layer matches (locally or in
    /// --cache-repo), and push even when the target already holds an image of this build.
    #[arg(long)]
    pub no_cache: bool,
    /// Check the finished image's invariants (digests, sizes, layer counts) before exiting.
    #[arg(long)]
    pub verify: bool,
    /// Where the dependency install runs: `bwrap` inside the builder image's root file
    /// system in a rootless sandbox (bubblewrap, or kiln's built-in one where bubblewrap is
    /// not installed; the toolchain and native modules then match the base
    /// exactly); `none` with the toolchain on PATH, which must be the runtime's version;
    /// `auto` is `bwrap`, or the toolchain on PATH when already inside the runtime's builder
    /// image. With --base and dependencies to install, `auto` and `bwrap` need
    /// --builder-image.
    #[arg(long, value_enum, default_value_t = DepsSandbox::Auto, env = "KILN_DEPS_SANDBOX")]
    pub deps_sandbox: DepsSandbox,
    /// Never run the package manager for another platform (--platform linux/arm64 on an
    /// amd64 machine) under QEMU user-mode emulation: such an install (npm without a lock
    /// file that decides everything, pip) is refused, and only kiln's own installs remain.
    /// By default it runs in the sandbox under qemu-MACHINE-static from PATH (Debian's
    /// qemu-user-static), which Linux 6.7 or later lets kiln register for the sandbox alone.
    #[arg(long, env = "KILN_NO_EMULATION")]
    pub no_emulation: bool,
    /// The builder image to install dependencies in (a registry reference or oci:DIR[:NAME]);
    /// `kiln base build RUNTIME` makes one. Needed when --base overrides the runtime's base
    /// and the Function has dependencies (unless --deps-sandbox none).
    #[arg(long, value_name = "REF", env = "KILN_BUILDER_IMAGE")]
    pub builder_image: Option<String>,
    /// A directory with the runtime's package-registry config (.npmrc for Node.js, pip.conf
    /// for Python; a mounted Secret), given to the install in place of the Function's own
    /// files of the same name. Part of the dependency cache key; never layered.
    #[arg(long, value_name = "DIR")]
    pub package_registry_config: Option<PathBuf>,
    /// Allow dependencies that do not come from the package registry: package.json git, URL,
    /// file: and link: dependencies; requirements.txt URL and path requirements and its
    /// -e/-r/-c/--index-url/--extra-index-url/--find-links/--trusted-host lines. Refused by
    /// default, with the line: each bypasses the registry the build is configured for
    /// (dependency confusion) or reads files from outside the Function.
    #[arg(long, env = "KILN_ALLOW_DIRECT_DEPS")]
    pub allow_direct_deps: bool,
    /// Also tag the image `kiln-KEY`, KEY being the build key (a digest of every input of
    /// the image: base, dependency manifests and lock, source, config). A later build with
    /// the same inputs then finds its image with one manifest HEAD, prints its digest and
    /// stops (moving --image's tag to it if needed). Without this flag a build checks
    /// --image's tag with one manifest GET, and a layout's name locally.
    #[arg(long, env = "KILN_TAG_BY_KEY")]
    pub tag_by_key: bool,
    /// A registry repository shared as dependency-layer cache by every build (build Pods on
    /// any node): each layer is kept there as a small OCI artifact tagged `deps-KEY`. A hit
    /// is one manifest request and a mount into the target (or a verified download when the
    /// cache is on another registry); a miss installs and stores the layer after the image.
    /// The local cache is checked first; an unusable cache repository is a warning.
    /// An entry is used only if a key of --cache-trust-key or --cache-sign-key signed it
    /// (one of them is needed); others are ignored with a warning and the layer installed.
    #[arg(long, value_name = "REPO", env = "KILN_CACHE_REPO")]
    pub cache_repo: Option<String>,
    /// Who signs and whose entries are used.
    #[command(flatten)]
    pub cache_keys: CacheKeyArgs,
    /// How the dependency and source layers are compressed: `gzip` (deterministic, read by
    /// every registry and runtime) or `zstd` (smaller and faster to unpack; for registries
    /// and runtimes that accept OCI zstd layers — containerd 1.5+, CRI-O, Podman; needs an
    /// OCI base). Part of the build key and the dependency cache key.
    #[arg(long, value_enum, default_value_t = CompressionArg::Gzip, env = "KILN_COMPRESSION")]
    pub compression: CompressionArg,
    /// How a Node.js Function with a package-lock.json gets its dependencies. `auto`: when
    /// the lock decides everything `npm ci --omit=dev` would write (no .npmrc, no install
    /// script, every package a tarball of registry.npmjs.org with its integrity, the lock in
    /// step with package.json), kiln downloads and unpacks the tarballs itself and links
    /// their bins as npm does: no builder image, no npm run, and a changed lock downloads
    /// only what it adds. Otherwise, and with `off`, npm runs in the builder image. A Python
    /// Function's requirements.txt is its lock when every line pins `name==version` (extras
    /// and `--hash` allowed; no pip.conf): kiln takes from PyPI the wheel pip would take for
    /// each, and installs them as pip does if their metadata needs no other package;
    /// otherwise pip runs. The build's log says which and why. Part of the dependency cache
    /// key.
    #[arg(
        long,
        value_enum,
        default_value_t = LockfileInstallArg::Auto,
        env = "KILN_LOCKFILE_INSTALL",
    )]
    pub lockfile_install: LockfileInstallArg,
    /// Which part of the build to run. `deps` only installs the dependencies (running the
    /// packages' install scripts) and writes the layer and a record of it into --stage-dir:
    /// no base image, no registry, no --image or --output needed, and it prints the layer's
    /// digest (or `none`). `publish` does the rest with the layer from --stage-dir and runs
    /// no program at all: give push credentials to this stage only. `lookup`, before `deps`
    /// and with pull credentials for --cache-repo, computes the dependency key, looks it up
    /// in --cache-repo and writes what it found into --lookup-dir (it prints the layer's
    /// digest, `miss` or `none`); runs no third-party code. `source`, first, with the git
    /// credentials, fetches the --git source into --source-dir and prints the commit; the
    /// later stages then build that directory, so no stage that runs install scripts needs
    /// the credentials, and the repository is fetched once.
    #[arg(
        long,
        value_enum,
        default_value_t = StageArg::All,
        requires_if("deps", "stage_dir"),
        requires_if("publish", "stage_dir"),
        requires_if("lookup", "lookup_dir"),
        requires_if("lookup", "cache_repo"),
        requires_if("source", "source_dir"),
    )]
    pub stage: StageArg,
    /// The directory `--stage deps` writes and `--stage publish` reads.
    #[arg(long, value_name = "DIR")]
    pub stage_dir: Option<PathBuf>,
    /// The directory `--stage lookup` writes and `--stage deps` and `--stage publish` read:
    /// `deps` installs nothing when the lookup found the layer, and `publish` then mounts it
    /// from --cache-repo, or stores the installed layer there under the key the lookup
    /// computed. Mount it read-only where the install runs: the cache entry's key must not
    /// come from the stage that runs third-party code.
    #[arg(long, value_name = "DIR")]
    pub lookup_dir: Option<PathBuf>,
    /// Where `--stage source` writes the Function's files: a directory that does not exist
    /// yet, in one that does.
    #[arg(long, value_name = "DIR")]
    pub source_dir: Option<PathBuf>,
    /// Also write the outcome to this file (a Kubernetes termination message, e.g.
    /// /dev/termination-log): on success the line printed on stdout, on failure the error
    /// as printed, with the install's last output lines; at most 4096 bytes.
    #[arg(long, value_name = "PATH")]
    pub termination_log: Option<PathBuf>,
    /// Sign the image with this ECDSA P-256 private key: PEM (PKCS#8 or SEC1, or as `cosign
    /// generate-key-pair` writes it, its password in COSIGN_PASSWORD), a file or `env://VAR`
    /// for a key held in an environment variable. The signature and a signed SLSA provenance
    /// are stored as cosign stores them (the `sha256-<digest>.sig` and `.att` tags beside the
    /// image), so `kiln verify --key` and `cosign verify --key` check them. Registry targets
    /// only.
    #[arg(long, value_name = "FILE|env://VAR", env = "KILN_SIGN_KEY")]
    pub sign_key: Option<String>,
}

/// `--lockfile-install`.
/// The dependency cache's keys, as `kiln build` and `kiln warm` take them.
#[derive(Clone, Debug, Default, Args)]
pub struct CacheKeyArgs {
    /// The Ed25519 private key (PEM PKCS#8: `openssl genpkey -algorithm ed25519`) that signs
    /// the --cache-repo entries stored; their readers trust its public key. Keep it where
    /// only trusted builds run: whoever holds it decides what other builds install. Without
    /// it nothing is stored (and `kiln warm` refuses to warm Functions).
    #[arg(long, value_name = "FILE", env = "KILN_CACHE_SIGN_KEY")]
    pub cache_sign_key: Option<PathBuf>,
    /// An Ed25519 public key (PEM: `openssl pkey -pubout`) whose signed --cache-repo entries
    /// are used; repeatable (comma-separated in the variable). The --cache-sign-key's own is
    /// trusted too.
    #[arg(
        long,
        value_name = "FILE",
        env = "KILN_CACHE_TRUST_KEY",
        value_delimiter = ','
    )]
    pub cache_trust_key: Vec<PathBuf>,
}

impl CacheKeyArgs {
    /// The same flags for a `kiln build` command line.
    pub(in crate::cli) fn flags(&self) -> Vec<OsString> {
        let mut flags: Vec<OsString> = Vec::new();
        if let Some(key) = &self.cache_sign_key {
            flags.extend(["--cache-sign-key".into(), key.into()]);
        }
        for key in &self.cache_trust_key {
            flags.extend(["--cache-trust-key".into(), key.into()]);
        }
        flags
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LockfileInstallArg {
    /// From the lock file when it decides everything, else the package manager.
    Auto,
    /// Always the package manager.
    Off,
}

/// `--compression`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressionArg {
    /// gzip.
    Gzip,
    /// Zstandard.
    Zstd,
}

/// The part of a build to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StageArg {
    /// The whole build.
    All,
    /// Only the dependency install, into --stage-dir.
    Deps,
    /// Everything but the install, with the dependency layer from --stage-dir.
    Publish,
    /// Only the dependency key and its --cache-repo entry, into --lookup-dir.
    Lookup,
    /// Only fetching the --git source, into --source-dir.
    Source,
}
