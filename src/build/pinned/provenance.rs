//! Which archive each installed Python distribution came from, in its `.dist-info` as PEP 710
//! records it: `provenance.json` with the archive's URL and SHA-256, and a `RECORD` row for
//! it. The SBOM reads it back ([`crate::sbom`]): the installed tree alone does not say which
//! wheel (or sdist) it was made from.
//!
//! Both installers write the same bytes: kiln's own install of pinned wheels as it unpacks
//! each, and, after pip ran, kiln from pip's `--report` (the runtime's `report` file).

use std::io::Write as _;
use std::path::Path;

use super::pep440;
use super::wheel::{csv_row, record_hash};

/// The file's name in a `.dist-info` directory.
pub const FILE: &str = "provenance.json";

/// The largest pip report read.
const MAX_REPORT: u64 = 16 << 20;

/// `provenance.json` for an archive at `url` (its user and password left out) whose SHA-256
/// is `sha256` (lower-case hex). Keys sorted, no spaces: the same bytes for the same archive.
pub fn document(url: &str, sha256: &str) -> Vec<u8> {
    let doc = serde_json::json!({
        "archive_info": {"hashes": {"sha256": sha256}},
        "url": without_credentials(url),
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// `record` (a `RECORD`'s text) with the row of `dist_info`'s `provenance.json`, `bytes`,
/// appended, as the last row.
pub fn add_row(record: &mut String, dist_info: &str, bytes: &[u8]) {
    let (path, hash, size) = (
        format!("{dist_info}/{FILE}"),
        record_hash(bytes),
        bytes.len().to_string(),
    );
    record.push_str(&csv_row(&[&path, &hash, &size]));
}

fn without_credentials(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

/// Writes `provenance.json` into each distribution of `site` (pip's `--target`) that pip's
/// installation report `report` names with an archive SHA-256, and returns how many. The
/// report and the tree come from an install that ran untrusted code: a distribution is
/// matched by reading the tree's own `.dist-info` directories (real directories only, their
/// `METADATA` name and version), a hash must be 64 hex digits, and nothing is written
/// through a symbolic link.
///
/// # Errors
/// Reading the report or the tree, or writing a file.
pub fn from_pip_report(site: &Path, report: &Path) -> std::io::Result<usize> {
    if !std::fs::symlink_metadata(report)?.is_file() {
        return Err(std::io::Error::other("pip's report is not a regular file"));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(std::fs::File::open(report)?, MAX_REPORT),
        &mut bytes,
    )?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| std::io::Error::other(format!("pip's report is not JSON: {e}")))?;
    let mut archives = std::collections::BTreeMap::new();
    for item in doc["install"].as_array().into_iter().flatten() {
        let (Some(name), Some(version), Some(url)) = (
            item["metadata"]["name"].as_str(),
            item["metadata"]["version"].as_str(),
            item["download_info"]["url"].as_str(),
        ) else {
            continue;
        };
        let sha256 = &item["download_info"]["archive_info"]["hashes"]["sha256"];
        let Some(sha256) = sha256
            .as_str()
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            continue;
        };
        archives.insert(
            (pep440::normalize(name), version.to_string()),
            document(url, &sha256.to_ascii_lowercase()),
        );
    }
    let mut written = 0;
    for entry in std::fs::read_dir(site)? {
        let entry = entry?;
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        if !dir_name.ends_with(".dist-info") || !entry.file_type()?.is_dir() {
            continue;
        }
        // One distribution the install left odd (no RECORD, a directory where a file goes)
        // goes without; the others are still recorded.
        match record_one(&entry.path(), &dir_name, &archives) {
            Ok(true) => written += 1,
            Ok(false) => {}
            Err(e) => tracing::debug!(dist_info = dir_name, error = %e, "not recorded"),
        }
    }
    Ok(written)
}

/// Records the archive of the distribution in `dir` (named `dir_name`) if `archives` has it;
/// whether it did.
fn record_one(
    dir: &Path,
    dir_name: &str,
    archives: &std::collections::BTreeMap<(String, String), Vec<u8>>,
) -> std::io::Result<bool> {
    let Some((name, version)) = name_and_version(&dir.join("METADATA"))? else {
        return Ok(false);
    };
    let Some(document) = archives.get(&(pep440::normalize(&name), version)) else {
        return Ok(false);
    };
    let record_path = dir.join("RECORD");
    if !std::fs::symlink_metadata(&record_path)?.is_file() {
        return Ok(false);
    }
    let mut record = std::fs::read_to_string(&record_path)?;
    add_row(&mut record, dir_name, document);
    write_new(&dir.join(FILE), document)?;
    std::fs::remove_file(&record_path)?;
    write_new(&record_path, record.as_bytes())?;
    Ok(true)
}

/// Writes `bytes` to a new file at `path`, whatever was there (a link is removed, not
/// followed).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?
        .write_all(bytes)
}

/// `Name` and `Version` of a regular `METADATA` file.
fn name_and_version(metadata: &Path) -> std::io::Result<Option<(String, String)>> {
    match std::fs::symlink_metadata(metadata) {
        Ok(m) if m.is_file() && m.len() <= MAX_REPORT => {}
        _ => return Ok(None),
    }
    let text = String::from_utf8_lossy(&std::fs::read(metadata)?).into_owned();
    let headers = crate::sbom::metadata_headers(&text);
    let get = |key: &str| {
        headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    Ok(get("name").zip(get("version")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn dist(site: &Path, dir: &str, name: &str, version: &str) {
        let d = site.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("METADATA"),
            format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"),
        )
        .unwrap();
        std::fs::write(d.join("RECORD"), format!("{dir}/METADATA,,\r\n")).unwrap();
    }

    #[test]
    fn the_document_names_the_archive_without_its_credentials() {
        assert_eq!(
            String::from_utf8(document("https://u:p@files.example/a.whl", HASH)).unwrap(),
            format!(
                "{{\"archive_info\":{{\"hashes\":{{\"sha256\":\"{HASH}\"}}}},\
                 \"url\":\"https://files.example/a.whl\"}}"
            )
        );
    }

    #[test]
    fn pip_s_report_is_matched_to_the_tree_s_own_distributions() {
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("site");
        dist(&site, "PyYAML-6.0.2.dist-info", "PyYAML", "6.0.2");
        dist(&site, "six-1.17.0.dist-info", "six", "1.17.0");
        // Left odd by the install: no RECORD. Skipped, the others still recorded.
        dist(&site, "odd-1.dist-info", "odd", "1");
        std::fs::remove_file(site.join("odd-1.dist-info/RECORD")).unwrap();
        // Planted by an install script: a link where the file would go.
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, site.join("six-1.17.0.dist-info").join(FILE)).unwrap();
        let item = |name: &str, version: &str, hash: &str| {
            serde_json::json!({"metadata": {"name": name, "version": version},
                "download_info": {"url": format!("https://f.example/{name}.whl"),
                    "archive_info": {"hashes": {"sha256": hash}}}})
        };
        let report = tmp.path().join("report.json");
        let doc = serde_json::json!({"install": [
            item("pyyaml", "6.0.2", HASH),
            item("six", "1.17.0", HASH),
            item("odd", "1", HASH),
            item("evil", "1", "../../etc"),
        ]});
        std::fs::write(&report, doc.to_string()).unwrap();
        assert_eq!(from_pip_report(&site, &report).unwrap(), 2);
        let yaml = site.join("PyYAML-6.0.2.dist-info");
        let written = std::fs::read(yaml.join(FILE)).unwrap();
        assert_eq!(written, document("https://f.example/pyyaml.whl", HASH));
        let record = std::fs::read_to_string(yaml.join("RECORD")).unwrap();
        let mut expected = "PyYAML-6.0.2.dist-info/METADATA,,\r\n".to_string();
        add_row(&mut expected, "PyYAML-6.0.2.dist-info", &written);
        assert_eq!(record, expected);
        assert!(record.ends_with(&format!(",{}\r\n", written.len())));
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert!(
            std::fs::symlink_metadata(site.join("six-1.17.0.dist-info").join(FILE))
                .unwrap()
                .is_file()
        );
    }
}
