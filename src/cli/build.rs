//! `kiln build`: flags, their validation into [`crate::build::Options`], and the run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::Args;

use super::Failure;
use super::registry::RegistryArgs;
use crate::build::{
    self, FunctionSpec, Options, Target,
    base::BaseRef,
    deps::{InstallEnv, Isolation},
    function::FunctionManifest,
};
use crate::oci::Platform;
use crate::registry::{Client, ClientConfig, Reference};
use crate::runtime::{Catalog, RuntimeSpec};

/// Flags of `kiln build`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kiln build ./hello --runtime nodejs22 --image registry.example.com/team/hello:1.0\n  kiln build ./hello --runtime python313 --output oci:./out/hello\n  kiln build --function hello.yaml --image registry.example.com/team/hello"
)]
pub struct BuildArgs {
    /// The Function directory: handler.js + package.json (Node.js) or handler.py +
    /// requirements.txt (Python), plus any files the handler needs.
    #[arg(value_name = "DIR", conflicts_with = "function")]
    pub dir: Option<PathBuf>,
    /// Build a Kyma Function manifest (serverless.kyma-project.io/v1alpha2) with inline source.
    #[arg(long, value_name = "FILE")]
    pub function: Option<PathBuf>,
    /// The runtime (nodejs22, nodejs24, python313). Taken from the manifest with --function.
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
    /// Platform to pick from a multi-platform base image.
    #[arg(long, default_value = "linux/amd64", value_name = "OS/ARCH[/VARIANT]")]
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
    /// Write a JSON report (reference, digest, build key, one entry per blob with its outcome
    /// and the bytes sent) to this file.
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
    /// Reinstall dependencies even when a cached layer matches.
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
    /// The builder image to install dependencies in (a registry reference or oci:DIR[:NAME]);
    /// `kiln base build RUNTIME` makes one. Needed when --base overrides the runtime's base
    /// and the Function has dependencies (unless --deps-sandbox none).
    #[arg(long, value_name = "REF", env = "KILN_BUILDER_IMAGE")]
    pub builder_image: Option<String>,
}

/// Where the dependency install runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DepsSandbox {
    /// bwrap, or the toolchain on PATH inside the runtime's builder image.
    Auto,
    /// Inside the builder image, in a rootless sandbox (bubblewrap or kiln's built-in one).
    Bwrap,
    /// The toolchain on PATH.
    None,
}

/// The values `kiln build` takes from the environment, read once here.
struct Env {
    source_date_epoch: Option<String>,
    path: OsString,
    ssl_cert_file: Option<PathBuf>,
    /// `KILN_BUILDER`: set in builder images to their runtime's name.
    in_builder: Option<String>,
    proxy: Vec<(String, String)>,
}

impl Env {
    fn read() -> Env {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let proxy = [
            "http_proxy",
            "https_proxy",
            "no_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "NO_PROXY",
        ]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
        Env {
            source_date_epoch: std::env::var("SOURCE_DATE_EPOCH")
                .ok()
                .filter(|v| !v.is_empty()),
            path: var("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            ssl_cert_file: var("SSL_CERT_FILE").map(PathBuf::from),
            in_builder: std::env::var("KILN_BUILDER").ok().filter(|v| !v.is_empty()),
            proxy,
        }
    }
}

pub(super) async fn run(args: BuildArgs) -> Result<String, Failure> {
    let env = Env::read();
    let (mut opts, config, extra) = validate(&args, &env).map_err(Failure::Usage)?;
    let client = Client::new(config)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    let mut builder = args.builder_image.clone();
    if let Some(store) = &extra.store {
        ensure_store(&opts, store).await.map_err(Failure::Build)?;
        // The runtime's own base: install in its own builder unless told otherwise.
        builder = builder.or_else(|| {
            Some(format!(
                "oci:{}:{}",
                store.display(),
                crate::base::store::builder_name(&opts.runtime.name)
            ))
        });
    }
    opts.install.isolation = isolation(
        args.deps_sandbox,
        builder.as_deref(),
        env.in_builder.as_deref(),
        &opts.runtime.name,
    )
    .map_err(Failure::Usage)?;
    let output = build::run(&client, &opts).await.map_err(|e| {
        let input = e.is_input_error();
        let e = anyhow::Error::new(e);
        if input {
            Failure::Usage(e)
        } else {
            Failure::Build(e)
        }
    })?;
    if extra.verify {
        crate::oci::validate::check_image(&output.image.manifest, &output.image.config)
            .context("verifying the built image")
            .map_err(Failure::Build)?;
    }
    write_outputs(&extra, &output).map_err(Failure::Build)?;
    Ok(output.published.reference)
}

/// Resolves `--deps-sandbox` into where the install runs; `in_builder` is `KILN_BUILDER`.
fn isolation(
    mode: DepsSandbox,
    builder: Option<&str>,
    in_builder: Option<&str>,
    runtime: &str,
) -> anyhow::Result<Isolation> {
    let sandbox = match mode {
        DepsSandbox::None => return Ok(Isolation::Host),
        // Inside the runtime's builder image (a build Job) the toolchain on PATH is its own.
        DepsSandbox::Auto if in_builder == Some(runtime) => return Ok(Isolation::Host),
        DepsSandbox::Auto => "auto",
        DepsSandbox::Bwrap => "bwrap",
    };
    let Some(image) = builder else {
        // A base override without a builder: the build refuses it only if the Function has
        // dependencies to install, never by falling back to the toolchain on PATH.
        return Ok(Isolation::MissingBuilder { sandbox });
    };
    let image = image
        .parse::<crate::run::ImageRef>()
        .with_context(|| format!("invalid --builder-image {image:?}"))?;
    // Unpacked by the build only if the Function has dependencies to install.
    Ok(Isolation::Pending(image))
}

/// Makes sure the local store has the runtime's base and builder images.
async fn ensure_store(opts: &Options, store: &Path) -> anyhow::Result<()> {
    // The fast path: finding the package sources runs npm, which costs more than the build.
    if crate::base::store::has_images(store, &opts.runtime.name) {
        return Ok(());
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let source_args = super::base::SourceArgs {
        debian_mirror: var("KILN_DEBIAN_MIRROR")
            .map(|u| u.parse())
            .transpose()
            .context("KILN_DEBIAN_MIRROR")?,
        keyring: crate::base::debian::DEBIAN_ARCHIVE_KEYRING.into(),
        npm_registry: var("KILN_NPM_REGISTRY")
            .map(|u| u.parse())
            .transpose()
            .context("KILN_NPM_REGISTRY")?,
        cache_dir: Some(opts.cache_dir.clone()),
    };
    let sources = super::base::sources(&source_args)?;
    let kiln = std::env::current_exe().context("finding the kiln binary")?;
    crate::base::store::ensure(&sources, &opts.runtime.name, store, &kiln)
        .await
        .with_context(|| {
            format!(
                "preparing the {} runtime images in {}",
                opts.runtime.name,
                store.display()
            )
        })
}

struct Extra {
    digest_file: Option<PathBuf>,
    report: Option<PathBuf>,
    verify: bool,
    /// The local store, when the base comes from it.
    store: Option<PathBuf>,
}

fn write_outputs(extra: &Extra, output: &build::Output) -> anyhow::Result<()> {
    if let Some(path) = &extra.digest_file {
        std::fs::write(path, format!("{}\n", output.published.digest))
            .with_context(|| format!("writing the digest to {}", path.display()))?;
    }
    if let Some(path) = &extra.report {
        let report = serde_json::json!({
            "reference": output.published.reference,
            "digest": output.published.digest,
            "buildKey": output.build_key,
            "blobs": output.published.blobs,
        });
        let bytes = serde_json::to_vec_pretty(&report).context("serialising the report")?;
        std::fs::write(path, bytes)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(())
}

fn validate(args: &BuildArgs, env: &Env) -> anyhow::Result<(Options, ClientConfig, Extra)> {
    let catalog = Catalog::embedded();
    let manifest = args
        .function
        .as_deref()
        .map(FunctionManifest::read)
        .transpose()?;
    let runtime = pick_runtime(&catalog, args.runtime.as_deref(), manifest.as_ref())?;
    let (function, default_name, default_ns) = match &manifest {
        Some(m) => (
            FunctionSpec::Manifest(m.clone()),
            m.name.clone(),
            m.namespace.clone(),
        ),
        None => {
            let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            if !dir.is_dir() {
                return Err(anyhow!(
                    "function directory {} does not exist",
                    dir.display()
                ));
            }
            let name = dir_name(&dir);
            (FunctionSpec::Dir(dir), name, None)
        }
    };
    let cache_dir = super::cache_dir(args.cache_dir.as_deref())?;
    let store = cache_dir.join("store");
    let explicit_base = args
        .base
        .clone()
        .or_else(|| {
            manifest
                .as_ref()
                .and_then(|m| m.runtime_image_override.clone())
        })
        .or_else(|| runtime.base.clone());
    let default_base = explicit_base.is_none();
    // Without a base, the runtime's own base image from the local store (built on first use).
    let base_name =
        explicit_base.unwrap_or_else(|| format!("oci:{}:{}", store.display(), runtime.name));
    let base =
        BaseRef::parse(&base_name).with_context(|| format!("invalid --base {base_name:?}"))?;
    let platform = Platform::parse(&args.platform).ok_or_else(|| {
        anyhow!(
            "invalid --platform {:?}: expected OS/ARCH[/VARIANT], e.g. linux/amd64",
            args.platform
        )
    })?;
    let name = args.name.clone().unwrap_or(default_name);
    let target = target(args, &store, &name)?;
    let epoch = match &env.source_date_epoch {
        None => 0,
        Some(v) => v
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a whole number of seconds"))?,
    };
    let install = InstallEnv {
        path: env.path.clone(),
        ca_bundle: args.ca_bundle.clone().or_else(|| env.ssl_cert_file.clone()),
        proxy: env.proxy.clone(),
        package_cache: cache_dir.join("packages"),
        isolation: Isolation::Host,
    };
    if let Some(ca) = &install.ca_bundle
        && !ca.is_file()
    {
        return Err(anyhow!("CA bundle {} does not exist", ca.display()));
    }
    let config = args.registry.client_config()?;
    let opts = Options {
        function,
        runtime: runtime.clone(),
        name,
        namespace: args
            .namespace
            .clone()
            .or(default_ns)
            .unwrap_or_else(|| "default".into()),
        base,
        base_name,
        platform,
        target,
        epoch,
        cache_dir,
        use_cache: !args.no_cache,
        jobs: usize::from(args.jobs),
        install,
    };
    let extra = Extra {
        digest_file: args.digest_file.clone(),
        report: args.report.clone(),
        verify: args.verify,
        store: default_base.then_some(store),
    };
    Ok((opts, config, extra))
}

fn pick_runtime<'a>(
    catalog: &'a Catalog,
    flag: Option<&str>,
    manifest: Option<&FunctionManifest>,
) -> anyhow::Result<&'a RuntimeSpec> {
    let resolve = |name: &str| -> anyhow::Result<&'a RuntimeSpec> {
        let (spec, alias) = catalog.resolve(name)?;
        if let Some(alias) = alias {
            tracing::warn!("{}", alias.warning());
        }
        Ok(spec)
    };
    match (flag, manifest) {
        (Some(f), Some(m)) => {
            let (flagged, declared) = (resolve(f)?, resolve(&m.runtime)?);
            if flagged.name != declared.name {
                return Err(anyhow!(
                    "--runtime {f} contradicts spec.runtime {} in the Function manifest",
                    m.runtime
                ));
            }
            Ok(flagged)
        }
        (Some(f), None) => resolve(f),
        (None, Some(m)) => resolve(&m.runtime),
        (None, None) => Err(anyhow!(
            "--runtime is required; known runtimes: {}",
            catalog.names().join(", ")
        )),
    }
}

fn dir_name(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "function".into())
}

fn target(args: &BuildArgs, store: &Path, name: &str) -> anyhow::Result<Target> {
    match (&args.image, &args.output) {
        (Some(image), None) => {
            let reference: Reference = image
                .parse()
                .with_context(|| format!("invalid --image {image:?}"))?;
            if reference.digest.is_some() {
                return Err(anyhow!(
                    "--image {image:?} names a digest; name a repository, optionally with a tag"
                ));
            }
            Ok(Target::Registry(reference))
        }
        (None, Some(output)) => {
            let rest = output
                .strip_prefix("oci:")
                .ok_or_else(|| anyhow!("--output {output:?} must start with oci:"))?;
            let (dir, name) = build::base::split_layout_ref(rest);
            Ok(Target::Layout {
                dir: dir.into(),
                name: name.unwrap_or_else(|| "latest".into()),
            })
        }
        // No registry named: the local store, where `kiln run` finds it.
        (None, None) => Ok(Target::Layout {
            dir: store.to_path_buf(),
            name: format!("functions/{name}"),
        }),
        _ => Err(anyhow!("--image and --output are exclusive")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_without_a_builder_image_is_left_for_the_build_to_refuse() {
        let resolve = |mode, builder, in_builder| {
            isolation(mode, builder, in_builder, "nodejs22").expect("valid flags")
        };
        let builder = Some("oci:/tmp/bases:nodejs22-builder");
        assert!(matches!(
            resolve(DepsSandbox::Auto, None, None),
            Isolation::MissingBuilder { sandbox: "auto" }
        ));
        assert!(matches!(
            resolve(DepsSandbox::Bwrap, None, Some("nodejs22")),
            Isolation::MissingBuilder { sandbox: "bwrap" }
        ));
        assert!(matches!(
            resolve(DepsSandbox::Auto, builder, None),
            Isolation::Pending(_)
        ));
        // Another runtime's builder image does not have this runtime's toolchain.
        assert!(matches!(
            resolve(DepsSandbox::Auto, builder, Some("python313")),
            Isolation::Pending(_)
        ));
        assert!(matches!(
            resolve(DepsSandbox::Auto, None, Some("nodejs22")),
            Isolation::Host
        ));
        assert!(matches!(
            resolve(DepsSandbox::None, builder, None),
            Isolation::Host
        ));
    }
}
