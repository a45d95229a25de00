//! The licenses npm packages and Python wheels declare, for the base images' SBOM: what the
//! package's own metadata says (`license` in `package.json`; `License-Expression`, a short
//! `License`, or `License ::` classifiers in a wheel's `METADATA`). Nothing is guessed: a
//! package that declares nothing gets an empty list, as a free-form Debian copyright does.

use std::collections::BTreeMap;
use std::path::Path;

/// The license(s) a `package.json` declares: `license` (an SPDX expression, or the old
/// `{"type": …}` object) or the older `licenses` list.
pub fn npm_declared(package_json: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(package_json) else {
        return Vec::new();
    };
    let name = |l: &serde_json::Value| {
        l.as_str()
            .or_else(|| l.get("type").and_then(serde_json::Value::as_str))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    if let Some(l) = v.get("license").and_then(name) {
        return vec![l];
    }
    v.get("licenses")
        .and_then(serde_json::Value::as_array)
        .map(|ls| ls.iter().filter_map(name).collect())
        .unwrap_or_default()
}

/// The license of the `package/package.json` inside an npm tarball.
pub fn npm_tarball(tgz: &Path) -> Vec<String> {
    crate::fetch::npm::read_member(tgz, "package/package.json", 16 << 20)
        .map(|bytes| npm_declared(&bytes))
        .unwrap_or_default()
}

/// `(normalised name, licenses)` from a wheel's `METADATA` (RFC 822 headers; the body, the
/// long description, is not read).
pub fn wheel_metadata(text: &str) -> (String, Vec<String>) {
    let (mut name, mut expression, mut license, mut classifiers) =
        (String::new(), None, None, Vec::new());
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Name" => name = normalise(value),
            "License-Expression" => expression = Some(value.to_string()),
            // A short name only; some projects paste the whole license text here.
            "License" if !value.is_empty() && value.len() <= 64 && value != "UNKNOWN" => {
                license = Some(value.to_string());
            }
            "Classifier" => {
                if let Some(rest) = value.strip_prefix("License ::") {
                    let last = rest.rsplit("::").next().unwrap_or(rest).trim();
                    if !last.is_empty() && last != "OSI Approved" {
                        classifiers.push(last.to_string());
                    }
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
    (name, licenses)
}

/// Licenses of every distribution installed in `site` (a `site-packages`), by normalised
/// name (PEP 503: lowercase, runs of `-_.` as `-`).
pub fn installed_wheels(site: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(site) else {
        return out;
    };
    for entry in dir.flatten() {
        if !entry.file_name().to_string_lossy().ends_with(".dist-info") {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(entry.path().join("METADATA")) {
            let (name, licenses) = wheel_metadata(&text);
            out.insert(name, licenses);
        }
    }
    out
}

/// PEP 503 normalisation.
pub fn normalise(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npm_licenses_come_from_license_or_the_old_forms() {
        assert_eq!(npm_declared(br#"{"license":"MIT"}"#), ["MIT"]);
        assert_eq!(
            npm_declared(br#"{"license":"(MIT OR Apache-2.0)"}"#),
            ["(MIT OR Apache-2.0)"]
        );
        assert_eq!(npm_declared(br#"{"license":{"type":"ISC"}}"#), ["ISC"]);
        assert_eq!(
            npm_declared(br#"{"licenses":[{"type":"MIT"},{"type":"GPL-2.0"}]}"#),
            ["MIT", "GPL-2.0"]
        );
        assert!(npm_declared(br#"{"name":"x"}"#).is_empty());
        assert!(npm_declared(b"not json").is_empty());
    }

    #[test]
    fn wheel_licenses_prefer_the_expression_then_a_short_license_then_classifiers() {
        let m = "Metadata-Version: 2.4\nName: Prometheus_Client\nLicense-Expression: Apache-2.0 \
            AND BSD-2-Clause\nLicense: long\n\nbody License: no\n";
        assert_eq!(
            wheel_metadata(m),
            (
                "prometheus-client".into(),
                vec!["Apache-2.0 AND BSD-2-Clause".into()]
            )
        );
        let m = "Name: requests\nLicense: Apache 2.0\nClassifier: License :: OSI Approved :: \
            Apache Software License\n";
        assert_eq!(wheel_metadata(m).1, ["Apache 2.0"]);
        let m = "Name: bottle\nLicense: UNKNOWN\nClassifier: License :: OSI Approved :: MIT \
            License\nClassifier: Programming Language :: Python\n";
        assert_eq!(wheel_metadata(m).1, ["MIT License"]);
        assert!(wheel_metadata("Name: x\n").1.is_empty());
        assert_eq!(normalise("Foo.Bar__baz"), "foo-bar-baz");
    }
}
