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

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The in-toto predicate type of a CycloneDX SBOM (cosign's `--type cyclonedx`).
pub const PREDICATE_TYPE: &str = "https://cyclonedx.org/bom";
/// Where a kiln base image keeps its SBOM.
pub const BASE_SBOM_PATH: &str = "usr/share/kiln/sbom.json";
/// The history entry of the base layer that holds it.
pub const BASE_SBOM_HISTORY: &str = "kiln base: SBOM";
/// The largest file read from a layer (a package.json, METADATA or lock file).
const MAX_FILE: u64 = 16 << 20;
/// The most bytes of those files read from one layer: each is kept until the layer is read,
/// and a layer's archive may name one compressed to nothing many times.
const MAX_LAYER_FILES: u64 = 256 << 20;

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

/// The bytes of the file at `path` in the tar `layer` (uncompressed), if it is there.
///
/// # Errors
/// A broken tar.
pub fn file_in_layer(layer: impl Read, path: &str) -> std::io::Result<Option<Vec<u8>>> {
    let mut archive = tar::Archive::new(layer);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.to_string_lossy().into_owned();
        if name.trim_start_matches("./") == path && entry.header().entry_type().is_file() {
            let mut bytes = Vec::new();
            entry.by_ref().take(MAX_FILE).read_to_end(&mut bytes)?;
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// The packages in one of the Function's layers (an uncompressed tar), sorted, each once.
///
/// # Errors
/// A broken tar; package files over [`MAX_LAYER_FILES`] in all.
pub fn layer_components(layer: impl Read) -> std::io::Result<Vec<Component>> {
    components_within(layer, MAX_LAYER_FILES)
}

/// [`layer_components`], reading at most `budget` bytes of package files.
fn components_within(layer: impl Read, budget: u64) -> std::io::Result<Vec<Component>> {
    let mut left = budget;
    let mut npm: Vec<(String, Vec<u8>)> = Vec::new();
    let mut locks: Vec<(String, Vec<u8>)> = Vec::new();
    let mut dists: BTreeMap<String, DistFiles> = BTreeMap::new();
    let mut archive = tar::Archive::new(layer);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.to_string_lossy().into_owned();
        let kind = if is_package_json(&path) {
            1
        } else if path.ends_with("node_modules/.package-lock.json")
            || path.ends_with("/package-lock.json")
        {
            2
        } else if is_dist_metadata(&path) {
            3
        } else if is_dist_file(&path, DIST_PROVENANCE) {
            4
        } else {
            continue;
        };
        let mut bytes = Vec::new();
        entry
            .by_ref()
            .take(MAX_FILE.min(left))
            .read_to_end(&mut bytes)?;
        left -= bytes.len() as u64;
        if left == 0 {
            return Err(std::io::Error::other(format!(
                "its package manifests hold more than {} MiB: kiln reads no more of them",
                budget >> 20
            )));
        }
        let dir = || path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        match kind {
            1 => npm.push((path, bytes)),
            2 => locks.push((path, bytes)),
            3 => dists.entry(dir()).or_default().metadata = Some(bytes),
            _ => dists.entry(dir()).or_default().provenance = Some(bytes),
        }
    }
    let integrity = integrities(&locks);
    let mut out = BTreeSet::new();
    for (path, bytes) in npm {
        if let Some(c) = npm_component(&path, &bytes, &integrity) {
            out.insert(c);
        }
    }
    for dist in dists.into_values() {
        let provenance = dist.provenance.as_deref();
        if let Some(c) = dist.metadata.and_then(|m| dist_component(&m, provenance)) {
            out.insert(c);
        }
    }
    Ok(out.into_iter().collect())
}

/// `…/node_modules/NAME/package.json` or `…/node_modules/@SCOPE/NAME/package.json`: a
/// package's root, not a file inside one.
fn is_package_json(path: &str) -> bool {
    let Some(dir) = path.strip_suffix("/package.json") else {
        return false;
    };
    let Some((parent, name)) = dir.rsplit_once('/') else {
        return false;
    };
    if name.starts_with('.') {
        return false;
    }
    parent.ends_with("node_modules")
        || parent
            .rsplit_once('/')
            .is_some_and(|(p, scope)| scope.starts_with('@') && p.ends_with("node_modules"))
}

/// The files of one `.dist-info` directory the SBOM reads.
#[derive(Default)]
struct DistFiles {
    /// Its `METADATA`.
    metadata: Option<Vec<u8>>,
    /// Its `provenance.json` (PEP 710).
    provenance: Option<Vec<u8>>,
}

/// `…/NAME-VERSION.dist-info/METADATA`.
fn is_dist_metadata(path: &str) -> bool {
    is_dist_file(path, "METADATA")
}

/// Where an installer records the archive a distribution came from (PEP 710).
const DIST_PROVENANCE: &str = "provenance.json";

/// `…/NAME-VERSION.dist-info/FILE`.
fn is_dist_file(path: &str, file: &str) -> bool {
    path.strip_suffix(file)
        .and_then(|p| p.strip_suffix('/'))
        .and_then(|d| d.rsplit('/').next())
        .is_some_and(|d| d.ends_with(".dist-info"))
}

/// npm's recorded integrity by `name@version`, from lock files (v2/v3 `packages`).
fn integrities(locks: &[(String, Vec<u8>)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, bytes) in locks {
        let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
            continue;
        };
        let Some(packages) = doc["packages"].as_object() else {
            continue;
        };
        for (key, p) in packages {
            let name = p["name"]
                .as_str()
                .map(str::to_string)
                .or_else(|| key.rsplit_once("node_modules/").map(|(_, n)| n.to_string()));
            if let (Some(name), Some(version), Some(integrity)) =
                (name, p["version"].as_str(), p["integrity"].as_str())
            {
                out.insert(format!("{name}@{version}"), integrity.to_string());
            }
        }
    }
    out
}

/// An SRI string (`sha512-BASE64`) as CycloneDX's `(alg, hex)`.
fn sri_hash(sri: &str) -> Option<(String, String)> {
    use base64::Engine as _;
    let (alg, b64) = sri.split_whitespace().next()?.split_once('-')?;
    let alg = match alg {
        "sha512" => "SHA-512",
        "sha384" => "SHA-384",
        "sha256" => "SHA-256",
        "sha1" => "SHA-1",
        _ => return None,
    };
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some((alg.to_string(), hex::encode(bytes)))
}

fn npm_component(
    path: &str,
    bytes: &[u8],
    integrity: &BTreeMap<String, String>,
) -> Option<Component> {
    let doc: Value = serde_json::from_slice(bytes).ok()?;
    let name = doc["name"].as_str()?.to_string();
    let version = doc["version"].as_str()?.to_string();
    // The directory names the package as installed; a package.json naming another is a
    // fixture or a test file inside some package, not an installed package.
    if !path.ends_with(&format!("node_modules/{name}/package.json")) {
        return None;
    }
    let licenses = match &doc["license"] {
        Value::String(s) => vec![s.clone()],
        Value::Object(o) => o
            .get("type")
            .and_then(Value::as_str)
            .map(|s| vec![s.to_string()])
            .unwrap_or_default(),
        _ => doc["licenses"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["type"].as_str().or(l.as_str()))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
    };
    let hash = integrity
        .get(&format!("{name}@{version}"))
        .and_then(|i| sri_hash(i));
    Some(Component {
        ecosystem: Ecosystem::Npm,
        name,
        version,
        licenses,
        hash,
    })
}

/// The header fields of an email-style metadata file (names lower-cased, continuation lines
/// joined), as Python's email parser reads them: up to the first empty line, or the first
/// line that is neither `name:` nor a continuation (a line starting with a space or tab,
/// blank ones included).
pub fn metadata_headers(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = out.last_mut() {
                v.push(' ');
                v.push_str(line.trim());
            }
            continue;
        }
        let Some((k, v)) = line.split_once(':') else {
            break;
        };
        if !k.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            break;
        }
        out.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    out
}

/// A distribution's core metadata: Name, Version and its license (`License-Expression`, else
/// `License`, else the `License ::` classifiers); the SHA-256 of the archive it was installed
/// from when its `provenance` (PEP 710's `provenance.json`) says.
fn dist_component(bytes: &[u8], provenance: Option<&[u8]>) -> Option<Component> {
    let text = String::from_utf8_lossy(bytes);
    let (mut name, mut version, mut expression, mut license) = (None, None, None, None);
    let mut classifiers = Vec::new();
    for (key, value) in metadata_headers(&text) {
        match key.as_str() {
            "name" => name = Some(value),
            "version" => version = Some(value),
            "license-expression" => expression = Some(value),
            "license" if !value.is_empty() && value.len() <= 200 => license = Some(value),
            "classifier" => {
                if let Some(l) = value.strip_prefix("License :: ") {
                    let l = l.rsplit(" :: ").next().unwrap_or(l);
                    classifiers.push(l.to_string());
                }
            }
            _ => {}
        }
    }
    let licenses = match (expression, license) {
        (Some(e), _) => vec![e],
        (None, Some(l)) => vec![l],
        (None, None) => classifiers,
    };
    let hash = provenance
        .and_then(|p| serde_json::from_slice::<Value>(p).ok())
        .and_then(|doc| {
            let hex = doc["archive_info"]["hashes"]["sha256"]
                .as_str()?
                .to_ascii_lowercase();
            (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| ("SHA-256".to_string(), hex))
        });
    Some(Component {
        ecosystem: Ecosystem::Pypi,
        name: name?,
        version: version?,
        licenses,
        hash,
    })
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

    #[test]
    fn a_layer_of_package_files_past_the_budget_is_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        for n in 0..4 {
            let body = format!(
                "{{\"name\":\"p{n}\",\"version\":\"1.0.0\"}}{}",
                " ".repeat(300)
            );
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            let path = format!("usr/src/app/function/node_modules/p{n}/package.json");
            tar.append_data(&mut header, path, body.as_bytes()).unwrap();
        }
        let tar = tar.into_inner().unwrap();
        assert_eq!(components_within(&tar[..], 1 << 20).unwrap().len(), 4);
        let err = components_within(&tar[..], 1000).unwrap_err();
        assert!(
            err.to_string().contains("package manifests hold more than"),
            "{err}"
        );
    }

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
