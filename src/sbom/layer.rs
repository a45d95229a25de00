//! The packages in a Function image's own layers: npm packages from each
//! `node_modules/**/package.json` (with the integrity npm recorded), Python distributions from
//! each `*.dist-info/METADATA` (with the archive kiln recorded), read from the layer's tar.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use serde_json::Value;

use super::{Component, Ecosystem};

/// The largest file read from a layer (a package.json, METADATA or lock file).
const MAX_FILE: u64 = 16 << 20;
/// The most bytes of those files read from one layer: each is kept until the layer is read,
/// and a layer's archive may name one compressed to nothing many times.
const MAX_LAYER_FILES: u64 = 256 << 20;

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
}
