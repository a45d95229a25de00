//! skopeo helpers for a test [`Registry`]: skopeo spells its flags differently per subcommand
//! (`inspect --tls-verify` but `copy --src-tls-verify` / `--dest-tls-verify`).

use std::path::Path;
use std::process::Command;

use super::registry::{PASSWORD, Registry, RegistryKind, USER};
use super::{require_tool, run, run_bytes};

/// Which flag family of skopeo: `inspect` (no prefix), `copy` source or `copy` destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkopeoSide {
    /// `skopeo inspect`: `--tls-verify`, `--cert-dir`, `--creds`.
    Inspect,
    /// `skopeo copy` source: `--src-…`.
    Src,
    /// `skopeo copy` destination: `--dest-…`.
    Dest,
}

impl Registry {
    /// skopeo flags that let `side` talk to this registry.
    pub fn skopeo_args(&self, side: SkopeoSide) -> Vec<String> {
        let p = match side {
            SkopeoSide::Inspect => "",
            SkopeoSide::Src => "src-",
            SkopeoSide::Dest => "dest-",
        };
        let creds = format!("{USER}:{PASSWORD}");
        match self.kind() {
            RegistryKind::Plain => vec![format!("--{p}tls-verify=false")],
            RegistryKind::BasicTls => vec![
                format!("--{p}cert-dir"),
                self.cert_dir().display().to_string(),
                format!("--{p}creds"),
                creds,
            ],
            RegistryKind::Token => {
                vec![
                    format!("--{p}tls-verify=false"),
                    format!("--{p}creds"),
                    creds,
                ]
            }
        }
    }

    fn skopeo(&self, subcommand: &str) -> Command {
        require_tool("skopeo", "skopeo");
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", subcommand]);
        if subcommand == "inspect" {
            cmd.args(self.skopeo_args(SkopeoSide::Inspect));
        }
        cmd
    }

    /// The manifest (or index) bytes exactly as stored: `skopeo inspect --raw`.
    pub fn skopeo_inspect_raw(&self, reference: &str) -> Vec<u8> {
        run_bytes(
            self.skopeo("inspect")
                .arg("--raw")
                .arg(docker_ref(reference)),
        )
    }

    /// The image config bytes: `skopeo inspect --config --raw` (for an index, the config of the
    /// linux/amd64 image).
    pub fn skopeo_inspect_config(&self, reference: &str) -> Vec<u8> {
        run_bytes(
            self.skopeo("inspect")
                .args(["--config", "--raw"])
                .arg(docker_ref(reference)),
        )
    }

    /// `skopeo copy --preserve-digests docker://REF oci:DIR:TAG` (for an index, only the
    /// linux/amd64 image is copied; see [`Registry::skopeo_copy_all_to_layout`]).
    pub fn skopeo_copy_to_layout(&self, reference: &str, layout_dir: &Path, tag: &str) {
        self.copy_to_layout(reference, layout_dir, tag, false);
    }

    /// `skopeo copy --all --preserve-digests docker://REF oci:DIR:TAG` (whole index).
    pub fn skopeo_copy_all_to_layout(&self, reference: &str, layout_dir: &Path, tag: &str) {
        self.copy_to_layout(reference, layout_dir, tag, true);
    }

    fn copy_to_layout(&self, reference: &str, layout_dir: &Path, tag: &str, all: bool) {
        let mut cmd = self.skopeo("copy");
        cmd.arg("--preserve-digests")
            .args(self.skopeo_args(SkopeoSide::Src));
        if all {
            cmd.arg("--all");
        }
        run(cmd.arg(docker_ref(reference)).arg(oci_ref(layout_dir, tag)));
    }

    /// `skopeo copy [--format F] oci:DIR:TAG docker://REF`; `format` is e.g. `Some("v2s2")` for
    /// Docker media types or `Some("oci")`. Without a format, `--preserve-digests` is passed so
    /// the pushed manifest is byte-identical to the layout's.
    pub fn skopeo_copy_from_layout(
        &self,
        layout_dir: &Path,
        tag: &str,
        reference: &str,
        format: Option<&str>,
    ) {
        let mut cmd = self.skopeo("copy");
        cmd.args(self.skopeo_args(SkopeoSide::Dest));
        match format {
            Some(f) => cmd.args(["--format", f]),
            None => cmd.arg("--preserve-digests"),
        };
        run(cmd.arg(oci_ref(layout_dir, tag)).arg(docker_ref(reference)));
    }

    /// `skopeo copy --all --preserve-digests oci:DIR:TAG docker://REF`, for an image index.
    pub fn skopeo_copy_all_from_layout(&self, layout_dir: &Path, tag: &str, reference: &str) {
        let mut cmd = self.skopeo("copy");
        cmd.args(self.skopeo_args(SkopeoSide::Dest))
            .args(["--all", "--preserve-digests"]);
        run(cmd.arg(oci_ref(layout_dir, tag)).arg(docker_ref(reference)));
    }
}

/// `docker://REF` unless it already has a transport prefix.
pub fn docker_ref(reference: &str) -> String {
    if reference.starts_with("docker://") {
        reference.to_string()
    } else {
        format!("docker://{reference}")
    }
}

fn oci_ref(layout_dir: &Path, tag: &str) -> String {
    format!("oci:{}:{tag}", layout_dir.display())
}
