//! What the assembled images hold, as their labels and SBOM file say it: the packages (the
//! SBOM entries, `/usr/share/kiln/sbom.json` and the `dev.kiln.sbom` label) and the binary
//! interface native code built against the base needs (`dev.kiln.abi.*`).

use serde::Serialize;

use crate::base::debian::LockedPackage;
use crate::oci;
use crate::runtime::abi::{self, Abi};

#[derive(Clone, Debug, Serialize)]
pub(super) struct SbomEntry {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) origin: &'static str,
    pub(super) licenses: Vec<String>,
    /// Named in the `dev.kiln.sbom` label too: a Debian package or the runtime's own binary
    /// package, not one of the runtime packages beside its server (listed in the SBOM file).
    #[serde(skip)]
    pub(super) in_label: bool,
}

/// Node.js's version header in its binary package: the major and module versions.
pub(super) const NODE_VERSION_H: &str = "package/include/node/node_version.h";

/// The C library and Python version of the base's Debian packages.
pub(super) fn debian_abi(abi: &mut Abi, debs: &[LockedPackage]) {
    for deb in debs {
        let name = deb.name.as_str();
        if name == "libc6" {
            let version = abi::debian_upstream(&deb.version).to_string();
            abi.libc = Some(("libc.so.6".into(), version));
        }
        if let Some(minor) = name.strip_prefix("python3.")
            && !minor.is_empty()
            && minor.bytes().all(|b| b.is_ascii_digit())
        {
            abi.python = Some(format!("3.{minor}"));
        }
    }
}

/// The SBOM file's bytes: the runtime and every package, canonical JSON.
pub(super) fn sbom_document(runtime: &str, sbom: &[SbomEntry]) -> Vec<u8> {
    let doc = serde_json::json!({ "runtime": runtime, "packages": sbom });
    oci::canonical::to_vec(&doc).unwrap_or_default()
}

/// The Debian packages and the runtime's binaries by name and version, and how many
/// runtime packages the SBOM file lists besides. Every Function image's config inherits
/// the label, and a rebase uploads that config: the whole list (8 kB with Kyma's Node.js
/// packages) would be most of its bytes.
pub(super) fn sbom_label(sbom: &[SbomEntry]) -> String {
    let mut parts: Vec<String> = sbom
        .iter()
        .filter(|e| e.in_label)
        .map(|e| format!("{}@{}", e.name, e.version))
        .collect();
    let more = sbom.iter().filter(|e| !e.in_label).count();
    if more > 0 {
        parts.push(format!("{more} more in /usr/share/kiln/sbom.json"));
    }
    parts.join(",")
}
