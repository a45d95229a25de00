//! The binary Packages index of one component and architecture: parsed stanzas keyed by name
//! (the highest version wins when a name appears twice) plus a map of virtual names to their
//! providers. Pure: fetching and decompressing happen in `fetch`; resolving in `resolve`.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::control::{self, Paragraph};
use super::relation::{Group, Relation, parse_relations};
use super::version::Version;
use super::{Error, Result};

/// One binary package stanza, reduced to what building a root filesystem needs.
#[derive(Debug, Clone)]
pub struct Package {
    /// `Package`.
    pub name: String,
    /// `Version`.
    pub version: Version,
    /// `Architecture` (`amd64`, `all`, …).
    pub architecture: String,
    /// `Pre-Depends` followed by `Depends`: unpacking runs no scripts, so they are alike here.
    pub depends: Vec<Group>,
    /// `Provides`: virtual names, optionally versioned with `=`.
    pub provides: Vec<Relation>,
    /// `Filename`: the pool path relative to the mirror root.
    pub filename: String,
    /// `Size` of the .deb in bytes.
    pub size: u64,
    /// `SHA256` of the .deb, lowercase hex.
    pub sha256: String,
    /// `Source`, verbatim (`name` or `name (version)`), when it is given.
    pub source: Option<String>,
}

/// A package pinned by a resolution: everything needed to fetch and verify it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedPackage {
    /// Package name.
    pub name: String,
    /// Exact version.
    pub version: String,
    /// Architecture (`amd64` or `all`).
    pub architecture: String,
    /// Pool path relative to the mirror root (`pool/main/…`).
    pub filename: String,
    /// Size of the .deb in bytes.
    pub size: u64,
    /// SHA256 of the .deb, lowercase hex.
    pub sha256: String,
    /// The `Source` field verbatim, when the index gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl From<&Package> for LockedPackage {
    fn from(p: &Package) -> Self {
        LockedPackage {
            name: p.name.clone(),
            version: p.version.to_string(),
            architecture: p.architecture.clone(),
            filename: p.filename.clone(),
            size: p.size,
            sha256: p.sha256.clone(),
            source: p.source.clone(),
        }
    }
}

/// A provider of a virtual name: the providing package and the provided version, if any.
#[derive(Debug, Clone)]
pub struct Provider {
    /// The real package that provides the name.
    pub package: String,
    /// The version in a `name (= version)` Provides entry.
    pub version: Option<Version>,
}

/// A parsed Packages index.
#[derive(Debug, Default, Clone)]
pub struct PackageIndex {
    packages: BTreeMap<String, Package>,
    providers: HashMap<String, Vec<Provider>>,
}

impl PackageIndex {
    /// Parses the text of a Packages file.
    ///
    /// # Errors
    /// [`Error::PackageField`] when a stanza lacks a required field or has a malformed one.
    pub fn parse(text: &str) -> Result<PackageIndex> {
        let mut packages = BTreeMap::<String, Package>::new();
        for paragraph in control::paragraphs(text) {
            let package = parse_package(&paragraph)?;
            match packages.get(&package.name) {
                Some(existing) if existing.version >= package.version => {}
                _ => {
                    packages.insert(package.name.clone(), package);
                }
            }
        }
        let mut providers = HashMap::<String, Vec<Provider>>::new();
        for package in packages.values() {
            for provide in &package.provides {
                providers
                    .entry(provide.name.clone())
                    .or_default()
                    .push(Provider {
                        package: package.name.clone(),
                        version: provide.constraint.as_ref().map(|(_, v)| v.clone()),
                    });
            }
        }
        Ok(PackageIndex {
            packages,
            providers,
        })
    }

    /// The real package called `name`.
    pub fn get(&self, name: &str) -> Option<&Package> {
        self.packages.get(name)
    }

    /// The packages providing the virtual name `name`, in package-name order.
    pub fn providers(&self, name: &str) -> &[Provider] {
        self.providers.get(name).map_or(&[], Vec::as_slice)
    }

    /// Number of distinct package names.
    pub fn len(&self) -> usize {
        self.packages.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }
}

fn parse_package(p: &Paragraph<'_>) -> Result<Package> {
    let name = p.get("Package").unwrap_or_default().to_string();
    let bad = |field: &'static str, value: &str| Error::PackageField {
        package: name.clone(),
        field,
        value: value.to_string(),
    };
    if name.is_empty() {
        return Err(bad("Package", ""));
    }
    let required = |field: &'static str| p.get(field).ok_or_else(|| bad(field, ""));
    let relations = |field: &'static str| {
        let value = p.get(field).unwrap_or_default();
        parse_relations(value).ok_or_else(|| bad(field, value))
    };
    let version = required("Version")?;
    let size = required("Size")?;
    let sha256 = required("SHA256")?;
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("SHA256", sha256));
    }
    let mut depends = relations("Pre-Depends")?;
    depends.extend(relations("Depends")?);
    let provides = relations("Provides")?
        .into_iter()
        .flat_map(|g| g.0)
        .collect();
    Ok(Package {
        version: version.parse().map_err(|_| bad("Version", version))?,
        architecture: required("Architecture")?.to_string(),
        depends,
        provides,
        filename: required("Filename")?.to_string(),
        size: size.parse().map_err(|_| bad("Size", size))?,
        sha256: sha256.to_ascii_lowercase(),
        source: p.get("Source").map(str::to_string),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn stanza(name: &str, version: &str, extra: &str) -> String {
        format!(
            "Package: {name}\nVersion: {version}\nArchitecture: amd64\n{extra}\
             Filename: pool/main/{name}_{version}_amd64.deb\nSize: 10\nSHA256: {SHA_A}\n\
             Description: a package\n with a long description\n .\n over lines\n\n"
        )
    }

    #[test]
    fn stanzas_with_continuations_parse_and_the_highest_version_wins() {
        let text = [
            stanza("linux-doc", "6.12.1-1", ""),
            stanza(
                "libssl3t64",
                "3.5.1-1",
                "Provides: libssl3 (= 3.5.1-1)\nSource: openssl\n",
            ),
            stanza(
                "linux-doc",
                "6.12.10-1",
                "Pre-Depends: libc6 (>= 2.38)\nDepends: a | b\n",
            ),
            stanza("linux-doc", "6.12.9-1", ""),
        ]
        .concat();
        let index = PackageIndex::parse(&text).unwrap();
        assert_eq!(index.len(), 2);
        let doc = index.get("linux-doc").unwrap();
        assert_eq!(doc.version.to_string(), "6.12.10-1");
        assert_eq!(doc.depends.len(), 2, "Pre-Depends and Depends are merged");
        assert_eq!(doc.depends[0].0[0].name, "libc6");
        let ssl = index.get("libssl3t64").unwrap();
        assert_eq!(ssl.source.as_deref(), Some("openssl"));
        let providers = index.providers("libssl3");
        assert_eq!(providers.len(), 1);
        assert_eq!(providers[0].package, "libssl3t64");
        assert_eq!(
            providers[0].version.as_ref().unwrap().to_string(),
            "3.5.1-1"
        );
        let locked = LockedPackage::from(ssl);
        assert_eq!(locked.filename, "pool/main/libssl3t64_3.5.1-1_amd64.deb");
        assert_eq!(locked.size, 10);
    }

    #[test]
    fn a_stanza_with_a_bad_field_is_an_error_naming_the_package() {
        let text = stanza("x", "1.0", "Depends: a (>= )\n");
        let err = PackageIndex::parse(&text).unwrap_err();
        assert!(
            matches!(&err, Error::PackageField { package, field: "Depends", .. } if package == "x")
        );
        let text = stanza("y", "1.0", "").replace("Size: 10", "Size: ten");
        assert!(
            PackageIndex::parse(&text)
                .unwrap_err()
                .to_string()
                .contains("Size")
        );
    }
}
