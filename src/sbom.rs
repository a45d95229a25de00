//! The SBOM of a built image, in CycloneDX 1.6 JSON, attached as a signed in-toto attestation
//! beside the provenance (predicate type [`PREDICATE_TYPE`], as `cosign attest --type
//! cyclonedx` writes it).
//!
//! CycloneDX rather than SPDX 2.3: every package has a purl (pkg:deb, pkg:npm, pkg:pypi) that
//! serves as its `bom-ref`, and a package's license is kept as the package states it
//! (`license.name`), where SPDX would need each to be an SPDX expression or a
//! `LicenseRef-` with its text; npm's `integrity` and a wheel's SHA-256 are component
//! `hashes`. Its JSON schema is strict (no unknown fields), and cosign and Dependency-Track
//! read it as it is.
//!
//! What goes in, each found by kiln's own code, never by the install:
//! - the base image's packages (Debian, and the npm and PyPI packages kiln puts in its bases),
//!   from the SBOM layer `kiln base build` writes (`usr/share/kiln/sbom.json`);
//! - every package in the Function's own layers (the dependency layer, and the source layer
//!   for anything vendored there): npm packages from each `node_modules/**/package.json`,
//!   with the integrity npm recorded (`node_modules/.package-lock.json`, else the Function's
//!   `package-lock.json`), and Python distributions from each `*.dist-info/METADATA`.
//!
//! The components of a layer depend only on its bytes, so they are read once per layer digest
//! and kept ([`Component`] lists, by the caller).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod layer;

pub use layer::{file_in_layer, layer_components, metadata_headers};

/// The in-toto predicate type of a CycloneDX SBOM (cosign's `--type cyclonedx`).
pub const PREDICATE_TYPE: &str = "https://cyclonedx.org/bom";
/// Where a kiln base image keeps its SBOM.
pub const BASE_SBOM_PATH: &str = "usr/share/kiln/sbom.json";
/// The history entry of the base layer that holds it.
pub const BASE_SBOM_HISTORY: &str = "kiln base: SBOM";

/// Where a package comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    /// A Debian package.
    Debian,
    /// An npm package.
    Npm,
    /// A Python distribution.
    Pypi,
}

/// One package.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Component {
    /// Where from.
    pub ecosystem: Ecosystem,
    /// Its name, as the ecosystem spells it.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Its licenses, as the package states them.
    pub licenses: Vec<String>,
    /// `(algorithm, hex)`, CycloneDX's names (`SHA-512`, `SHA-256`, `SHA-1`).
    pub hash: Option<(String, String)>,
}

impl Component {
    /// Its package URL.
    pub fn purl(&self) -> String {
        let version = encode(&self.version);
        match self.ecosystem {
            Ecosystem::Debian => format!("pkg:deb/debian/{}@{version}", encode(&self.name)),
            Ecosystem::Npm => match self.name.split_once('/') {
                Some((scope, name)) => {
                    format!("pkg:npm/{}/{}@{version}", encode(scope), encode(name))
                }
                None => format!("pkg:npm/{}@{version}", encode(&self.name)),
            },
            Ecosystem::Pypi => {
                let name = self.name.to_ascii_lowercase().replace(['_', '.'], "-");
                format!("pkg:pypi/{}@{version}", encode(&name))
            }
        }
    }
}

/// Percent-encodes what a purl segment may not hold as it is.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~+".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The packages of a kiln base image's `sbom.json`.
///
/// # Errors
/// It is not the document `kiln base build` writes.
pub fn base_components(sbom_json: &[u8]) -> Result<Vec<Component>, String> {
    #[derive(Deserialize)]
    struct Entry {
        name: String,
        version: String,
        origin: String,
        #[serde(default)]
        licenses: Vec<String>,
    }
    #[derive(Deserialize)]
    struct Doc {
        packages: Vec<Entry>,
    }
    let doc: Doc = serde_json::from_slice(sbom_json)
        .map_err(|e| format!("the base's {BASE_SBOM_PATH} does not parse: {e}"))?;
    doc.packages
        .into_iter()
        .map(|e| {
            let ecosystem = match e.origin.as_str() {
                "debian" => Ecosystem::Debian,
                "npm" => Ecosystem::Npm,
                "pypi" => Ecosystem::Pypi,
                other => return Err(format!("a package of unknown origin {other:?}")),
            };
            Ok(Component {
                ecosystem,
                name: e.name,
                version: e.version,
                licenses: e.licenses,
                hash: None,
            })
        })
        .collect()
}

/// What the SBOM describes: the image and the base it was built on.
#[derive(Debug)]
pub struct Subject<'a> {
    /// The image's repository (`host/path`).
    pub repository: &'a str,
    /// Its manifest digest.
    pub digest: &'a crate::oci::Digest,
    /// The base as named, and its manifest digest.
    pub base: (&'a str, &'a crate::oci::Digest),
}

/// The CycloneDX 1.6 document of `subject` with `components` (each package once, in order).
/// It holds no time and no random serial number, so the same image has the same SBOM.
pub fn document(subject: &Subject<'_>, components: &[Component]) -> Value {
    let unique: BTreeMap<String, &Component> = components.iter().map(|c| (c.purl(), c)).collect();
    let mut list: Vec<Value> = vec![json!({
        "type": "container",
        "bom-ref": "base",
        "name": subject.base.0,
        "version": subject.base.1.to_string(),
        "description": "the base image",
    })];
    for (purl, c) in unique {
        let mut v = json!({
            "type": "library",
            "bom-ref": purl,
            "name": c.name,
            "version": c.version,
            "purl": purl,
        });
        if !c.licenses.is_empty() {
            v["licenses"] = c
                .licenses
                .iter()
                .map(|l| json!({"license": {"name": l}}))
                .collect();
        }
        if let Some((alg, hex)) = &c.hash {
            v["hashes"] = json!([{"alg": alg, "content": hex}]);
        }
        v["properties"] = json!([{"name": "kiln:ecosystem", "value": c.ecosystem}]);
        list.push(v);
    }
    // A serial number derived from the image (RFC 4122's form, as a name-based version 5).
    let hex = subject.digest.hex();
    let serial = format!(
        "urn:uuid:{}-{}-5{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    );
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": serial,
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "kiln",
                                      "version": env!("CARGO_PKG_VERSION")}]},
            "component": {"type": "container", "bom-ref": "image",
                          "name": subject.repository, "version": subject.digest.to_string()},
        },
        "components": list,
    })
}

/// The in-toto Statement (v1) of `document`, for `subject`'s image.
pub fn statement(subject: &Subject<'_>, document: Value) -> Value {
    json!({
        "_type": crate::provenance::STATEMENT_TYPE,
        "subject": [{"name": subject.repository, "digest": {"sha256": subject.digest.hex()}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": document,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, text) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(text.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, text.as_bytes()).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn packages_are_read_from_their_roots_with_npms_integrity_and_pythons_metadata() {
        let nm = "usr/src/app/function/node_modules";
        let lock = r#"{"lockfileVersion":3,"packages":{
            "node_modules/ms":{"version":"2.1.3","integrity":"sha512-AAEC"},
            "node_modules/@scope/x":{"version":"1.0.0"}}}"#;
        let layer = tar_of(&[
            (
                &format!("{nm}/ms/package.json"),
                r#"{"name":"ms","version":"2.1.3","license":"MIT"}"#,
            ),
            (
                &format!("{nm}/ms/test/package.json"),
                r#"{"name":"fixture","version":"0.0.0"}"#,
            ),
            (
                &format!("{nm}/@scope/x/package.json"),
                r#"{"name":"@scope/x","version":"1.0.0","license":{"type":"ISC"}}"#,
            ),
            (&format!("{nm}/.package-lock.json"), lock),
            (
                "usr/src/app/site-packages/PyYAML-6.0.2.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: PyYAML\nVersion: 6.0.2\nLicense: MIT\n\n\
                 Name: not-a-header\n",
            ),
            (
                "usr/src/app/site-packages/PyYAML-6.0.2.dist-info/provenance.json",
                &format!(
                    r#"{{"archive_info":{{"hashes":{{"sha256":"{}"}}}},"url":"u"}}"#,
                    "AB".repeat(32)
                ),
            ),
            (
                "usr/src/app/site-packages/a-1.dist-info/METADATA",
                "Name: a\nVersion: 1\nClassifier: License :: OSI Approved :: BSD License\n",
            ),
            (
                "usr/src/app/site-packages/a-1.dist-info/provenance.json",
                r#"{"archive_info":{"hashes":{"sha256":"short"}}}"#,
            ),
        ]);
        let found = layer_components(&layer[..]).unwrap();
        let purls: Vec<String> = found.iter().map(Component::purl).collect();
        assert_eq!(
            purls,
            [
                "pkg:npm/%40scope/x@1.0.0",
                "pkg:npm/ms@2.1.3",
                "pkg:pypi/pyyaml@6.0.2",
                "pkg:pypi/a@1"
            ]
        );
        let ms = &found[1];
        assert_eq!(ms.licenses, ["MIT"]);
        assert_eq!(ms.hash, Some(("SHA-512".into(), "000102".into())));
        assert_eq!(found[0].licenses, ["ISC"]);
        assert_eq!(found[2].licenses, ["MIT"]);
        assert_eq!(found[2].hash, Some(("SHA-256".into(), "ab".repeat(32))));
        assert_eq!(found[3].licenses, ["BSD License"]);
        // Not a SHA-256: left out.
        assert_eq!(found[3].hash, None);
    }

    #[test]
    fn the_document_is_the_same_for_the_same_image_and_lists_each_package_once() {
        let digest = crate::oci::Digest::of(b"image");
        let base = crate::oci::Digest::of(b"base");
        let subject = Subject {
            repository: "reg/fns/a",
            digest: &digest,
            base: ("reg/kiln/nodejs22", &base),
        };
        let c = Component {
            ecosystem: Ecosystem::Debian,
            name: "libc6".into(),
            version: "2.41-12".into(),
            licenses: vec!["GPL-2".into()],
            hash: None,
        };
        let doc = document(&subject, &[c.clone(), c.clone()]);
        assert_eq!(doc, document(&subject, &[c]));
        assert_eq!(doc["components"].as_array().unwrap().len(), 2);
        assert_eq!(doc["components"][1]["purl"], "pkg:deb/debian/libc6@2.41-12");
        assert!(
            doc["serialNumber"]
                .as_str()
                .unwrap()
                .starts_with("urn:uuid:")
        );
    }
}
