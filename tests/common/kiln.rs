//! Running the `kiln` binary black-box (ripgrep `tests/util.rs`, fd `tests/testenv`): each
//! test copies a fixture Function into a temp dir and runs kiln with its own cache and
//! docker config, so tests never share state or read the host's credentials.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The repository's `tests/fixtures`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The checked-in tiny base layout (`oci:` reference).
pub fn tiny_base() -> String {
    format!("oci:{}:base", fixtures().join("base/tiny").display())
}

/// Copies `tests/fixtures/functions/<name>` (dot files included) into `dest`.
pub fn copy_fixture(name: &str, dest: &Path) -> PathBuf {
    let src = fixtures().join("functions").join(name);
    copy_tree(&src, dest);
    dest.to_path_buf()
}

/// Recursively copies a directory.
pub fn copy_tree(src: &Path, dest: &Path) {
    fs::create_dir_all(dest).unwrap();
    for entry in fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dest.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to);
        } else {
            fs::copy(entry.path(), &to).unwrap();
        }
    }
}

/// A kiln invocation environment: an isolated cache and docker config.
pub struct Kiln {
    /// Scratch space owned by the test.
    pub home: tempfile::TempDir,
}

/// What a kiln run produced.
#[derive(Debug)]
pub struct Run {
    /// Exit code.
    pub code: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl Run {
    /// Asserts success and returns the single stdout line.
    pub fn reference(&self) -> String {
        assert_eq!(self.code, 0, "kiln failed:\n{}", self.stderr);
        let lines: Vec<&str> = self.stdout.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "stdout must be exactly one line: {:?}",
            self.stdout
        );
        lines[0].to_string()
    }

    /// Asserts failure with `code` and returns stderr.
    pub fn failure(&self, code: i32) -> &str {
        assert_eq!(
            self.code, code,
            "expected exit {code}; stdout {:?}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        assert!(
            self.stdout.is_empty(),
            "a failed build prints nothing on stdout: {:?}",
            self.stdout
        );
        &self.stderr
    }
}

impl Default for Kiln {
    fn default() -> Self {
        Kiln::new()
    }
}

impl Kiln {
    /// A fresh environment.
    pub fn new() -> Kiln {
        let home = tempfile::tempdir().unwrap();
        fs::create_dir_all(home.path().join("docker")).unwrap();
        Kiln { home }
    }

    /// Writes kiln's Docker config with credentials for `host` (base64 of `user:password`,
    /// as `docker login` stores them).
    pub fn log_in(&self, host: &str, user: &str, password: &str) {
        let auth = super::base64(format!("{user}:{password}").as_bytes());
        fs::write(
            self.home.path().join("docker/config.json"),
            format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
        )
        .unwrap();
    }

    /// The cache directory kiln uses.
    pub fn cache_dir(&self) -> PathBuf {
        self.home.path().join("cache")
    }

    /// A `kiln` command with the isolated environment.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.env_remove("RUST_LOG")
            .env_remove("SOURCE_DATE_EPOCH")
            .env("DOCKER_CONFIG", self.home.path().join("docker"))
            .env("KILN_CACHE_DIR", self.cache_dir())
            .env("HOME", self.home.path())
            .env("KILN_LOG_FORMAT", "text");
        cmd
    }

    /// [`Kiln::command`] with the download cache every test shares
    /// ([`shared_download_cache`]) instead of its own, for tests that assemble base images.
    pub fn command_with_shared_downloads(&self) -> Command {
        let mut cmd = self.command();
        cmd.env("KILN_CACHE_DIR", shared_download_cache());
        cmd
    }

    /// Runs `kiln ARGS`.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_cmd(self.command().args(args))
    }

    /// `kiln build` of the Node.js Function in `dir` onto the tiny base, into the OCI layout
    /// `out`, with `extra` flags.
    pub fn build_node_into_layout(&self, dir: &Path, out: &Path, extra: &[&str]) -> Run {
        let output = format!("oci:{}", out.display());
        let mut args = vec![
            "build",
            dir.to_str().expect("a UTF-8 path"),
            "--runtime",
            "nodejs22",
            "--base",
        ];
        let base = tiny_base();
        args.extend([base.as_str(), "--output", &output]);
        args.extend(extra);
        self.run(&args)
    }

    /// Runs `kiln ARGS` on a pseudo-terminal (util-linux `script`) in the terminal's own log
    /// view, without colour: the exit code and what the terminal showed (stdout and stderr
    /// together).
    pub fn run_on_terminal(&self, args: &[&str]) -> (i32, String) {
        let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let line: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_kiln"))
            .chain(args.iter().copied())
            .map(quote)
            .collect();
        let mut cmd = Command::new("script");
        cmd.args(["-q", "-e", "-c", &line.join(" "), "/dev/null"]);
        for (key, value) in self.command().get_envs() {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        let out = cmd
            .env("KILN_LOG_FORMAT", "auto")
            .env("TERM", "xterm")
            .env("COLUMNS", "120")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code().unwrap_or(-1), shown)
    }

    /// Runs a prepared command.
    pub fn run_cmd(&self, cmd: &mut Command) -> Run {
        let Output {
            status,
            stdout,
            stderr,
        } = cmd.output().unwrap();
        Run {
            code: status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }
    }
}

/// Reads a kiln `--report` file.
pub fn read_report(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// The report's blobs with a given role.
pub fn blobs_with_role<'a>(
    report: &'a serde_json::Value,
    role: &str,
) -> Vec<&'a serde_json::Value> {
    report["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["role"] == role)
        .collect()
}

/// Total bytes kiln sent for blobs (the manifest excluded).
pub fn blob_bytes_sent(report: &serde_json::Value) -> u64 {
    report["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["role"] != "manifest")
        .map(|b| b["bytes_sent"].as_u64().unwrap())
        .sum()
}

/// The download cache (.debs, npm tarballs: content-addressed) that every test shares, so
/// assembling base and builder images is fast once it is warm.
///
/// The tests also unpack every image they run into it, each run's own: at most once an hour
/// it is kept to 10 GiB by `kiln cache prune`, least recently used first (safe while other
/// tests use it; base images and downloads stay), as a user would. Forty runs had left 45 GB
/// of root file systems and filled the disk.
pub fn shared_download_cache() -> PathBuf {
    static PRUNED: std::sync::Once = std::sync::Once::new();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-test-cache");
    PRUNED.call_once(|| {
        let stamp = dir.join("pruned-by-tests");
        let recent = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() < Duration::from_secs(3600));
        if !recent && fs::create_dir_all(&dir).is_ok() && fs::write(&stamp, "").is_ok() {
            let _ = Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["cache", "prune", "--max-size", "10G", "--cache-dir"])
                .arg(&dir)
                .env("KILN_LOG_FORMAT", "text")
                .output();
        }
    });
    dir
}

/// Assembles `runtime`'s base and builder images with `kiln base build` into the OCI layout
/// `dir` (see [`base_images_into`]) and returns the builder's `oci:` reference, for
/// `kiln build --builder-image`.
pub fn kiln_built_builder(kiln: &Kiln, runtime: &str, dir: &Path) -> String {
    base_images_into(kiln, runtime, dir);
    format!("oci:{}:{runtime}-builder", dir.display())
}

/// `runtime`'s base and builder images, as `kiln base build RUNTIME --output oci:DIR` makes
/// them, copied into the layout `dir`; returns what that command printed (the two references,
/// naming `dir`). This kiln binary assembles each runtime once for every test process: the
/// first test to need it builds it (downloads from [`shared_download_cache`]) under a lock,
/// the others copy the result. A test of `kiln base build` itself runs the command instead.
pub fn base_images_into(kiln: &Kiln, runtime: &str, dir: &Path) -> Vec<String> {
    let exe = Path::new(env!("CARGO_BIN_EXE_kiln"));
    let meta = std::fs::metadata(exe).unwrap();
    let stamp = format!(
        "{}-{}",
        meta.len(),
        meta.modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shared-bases");
    std::fs::create_dir_all(&root).unwrap();
    let shared = root.join(format!("{runtime}-{stamp}"));
    let printed = shared.join("printed");
    let layout = shared.join("layout");
    {
        let lock = std::fs::File::create(root.join(format!("{runtime}.lock"))).unwrap();
        lock.lock().unwrap();
        if !printed.is_file() {
            // Images of an earlier kiln binary are of no more use.
            for old in std::fs::read_dir(&root).unwrap().flatten() {
                let name = old.file_name().to_string_lossy().into_owned();
                if name.starts_with(&format!("{runtime}-")) && old.path().is_dir() {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
            std::fs::create_dir_all(&shared).unwrap();
            let run = kiln.run_cmd(
                kiln.command()
                    .env("KILN_CACHE_DIR", shared_download_cache())
                    .args(["base", "build", runtime, "--output"])
                    .arg(format!("oci:{}", layout.display())),
            );
            assert_eq!(
                run.code, 0,
                "kiln base build {runtime} failed:\n{}",
                run.stderr
            );
            std::fs::write(&printed, &run.stdout).unwrap();
        }
    }
    let status = Command::new("cp")
        .args(["-a", "--no-target-directory"])
        .arg(&layout)
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "copying the shared {runtime} images");
    let text = std::fs::read_to_string(&printed).unwrap();
    let from = format!("oci:{}@", layout.display());
    let to = format!("oci:{}@", dir.display());
    text.lines().map(|l| l.replace(&from, &to)).collect()
}

/// The host's CA bundle: this machine may reach package registries through a TLS-intercepting
/// proxy whose CA only the host trusts.
pub fn host_ca_bundle() -> PathBuf {
    std::env::var_os("SSL_CERT_FILE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || "/etc/ssl/certs/ca-certificates.crt".into(),
            PathBuf::from,
        )
}

/// Path → (kind and mode, link target, sha256 of the content) of every member of a layer.
pub type Members = std::collections::BTreeMap<String, (String, String, String)>;

/// The members of a gzip layer.
pub fn layer_members(layer: &[u8]) -> Members {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    let mut out = std::collections::BTreeMap::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let header = entry.header();
        let kind = format!("{:?} {:o}", header.entry_type(), header.mode().unwrap());
        let link = entry
            .link_name()
            .unwrap()
            .map(|l| l.display().to_string())
            .unwrap_or_default();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
        let sha = kiln::oci::Digest::of(&bytes).hex().to_string();
        out.insert(path, (kind, link, sha));
    }
    out
}

/// The dependency layer of the image a build wrote into the layout `out`.
pub fn dependency_layer(out: &Path, report: &Path) -> Members {
    let report = read_report(report);
    let digest = blobs_with_role(&report, "dependencies")[0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = out
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    layer_members(&fs::read(blob).unwrap())
}

/// An Ed25519 key pair for the dependency cache's entries, made by `openssl` as an operator
/// would: `--cache-sign-key private` signs, `--cache-trust-key public` trusts.
pub struct CacheKey {
    _dir: tempfile::TempDir,
    /// The PEM PKCS#8 private key.
    pub private: String,
    /// The PEM public key.
    pub public: String,
}

impl CacheKey {
    /// A new key pair.
    pub fn new() -> CacheKey {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("cache-key.pem");
        let public = dir.path().join("cache-key.pub");
        let openssl = |args: &[&str]| {
            let status = Command::new("openssl").args(args).status().unwrap();
            assert!(status.success(), "openssl {args:?}");
        };
        let (private, public) = (
            private.to_str().unwrap().to_string(),
            public.to_str().unwrap().to_string(),
        );
        openssl(&["genpkey", "-algorithm", "ed25519", "-out", &private]);
        openssl(&["pkey", "-in", &private, "-pubout", "-out", &public]);
        CacheKey {
            _dir: dir,
            private,
            public,
        }
    }
}

impl Default for CacheKey {
    fn default() -> Self {
        CacheKey::new()
    }
}

/// The key the tests' trusted builds sign their cache entries with, one per test process.
pub fn test_cache_key() -> &'static CacheKey {
    static KEY: std::sync::OnceLock<CacheKey> = std::sync::OnceLock::new();
    KEY.get_or_init(CacheKey::new)
}
