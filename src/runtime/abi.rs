//! A runtime image's binary interface: what native code built against it needs of the image it
//! runs in. `kiln base build` writes it into the base image's config labels, a Function image
//! inherits them, and `kiln rebase` compares the base a dependency layer was built on with the
//! one it is to move to. Pure.

use std::collections::BTreeMap;
use std::fmt;

/// Label: the C library's soname and version, `libc.so.6 2.41`.
pub const LIBC_LABEL: &str = "dev.kiln.abi.libc";
/// Label: the Node.js major version.
pub const NODE_LABEL: &str = "dev.kiln.abi.node";
/// Label: Node.js's `process.versions.modules` (`NODE_MODULE_VERSION`).
pub const NODE_MODULES_LABEL: &str = "dev.kiln.abi.node-modules";
/// Label: the Python major.minor version.
pub const PYTHON_LABEL: &str = "dev.kiln.abi.python";

/// What a runtime image offers native code. A part the image has not is `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Abi {
    /// The C library: soname and upstream version (`libc.so.6`, `2.41`).
    pub libc: Option<(String, String)>,
    /// Node.js: major version and `NODE_MODULE_VERSION`.
    pub node: Option<(u32, u32)>,
    /// Python: major.minor.
    pub python: Option<String>,
}

impl Abi {
    /// The labels that record it.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some((soname, version)) = &self.libc {
            out.insert(LIBC_LABEL.into(), format!("{soname} {version}"));
        }
        if let Some((major, modules)) = self.node {
            out.insert(NODE_LABEL.into(), major.to_string());
            out.insert(NODE_MODULES_LABEL.into(), modules.to_string());
        }
        if let Some(python) = &self.python {
            out.insert(PYTHON_LABEL.into(), python.clone());
        }
        out
    }

    /// Read back from an image's labels; `None` when they hold no ABI at all (an image kiln
    /// did not assemble, or one assembled before kiln recorded it).
    ///
    /// # Errors
    /// A label that is present but malformed.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Result<Option<Abi>, String> {
        let bad = |label: &str, value: &str| format!("label {label}={value:?} is malformed");
        let libc = match labels.get(LIBC_LABEL) {
            Some(v) => Some(
                v.split_once(' ')
                    .map(|(s, v)| (s.to_string(), v.to_string()))
                    .ok_or_else(|| bad(LIBC_LABEL, v))?,
            ),
            None => None,
        };
        let number = |label: &str| -> Result<Option<u32>, String> {
            labels
                .get(label)
                .map(|v| v.parse().map_err(|_| bad(label, v)))
                .transpose()
        };
        let node = match (number(NODE_LABEL)?, number(NODE_MODULES_LABEL)?) {
            (Some(major), Some(modules)) => Some((major, modules)),
            (None, None) => None,
            _ => {
                return Err(format!(
                    "labels {NODE_LABEL} and {NODE_MODULES_LABEL} come together, and only one \
                     is set"
                ));
            }
        };
        let python = labels.get(PYTHON_LABEL).cloned();
        let abi = Abi { libc, node, python };
        Ok((abi != Abi::default()).then_some(abi))
    }

    /// Whether native code built against `self` runs against `new`, and if not, why: the same
    /// Node.js major and module version, the same Python major.minor, the same C library
    /// soname at a version no older.
    ///
    /// # Errors
    /// The first difference, as a sentence.
    pub fn runs_on(&self, new: &Abi) -> Result<(), String> {
        if self.node != new.node {
            return Err(format!(
                "Node.js changes from {} to {}: native modules are built for one \
                 NODE_MODULE_VERSION",
                node_text(self.node),
                node_text(new.node)
            ));
        }
        if self.python != new.python {
            return Err(format!(
                "Python changes from {} to {}: compiled extensions and installed wheels are \
                 built for one Python version",
                self.python.as_deref().unwrap_or("none"),
                new.python.as_deref().unwrap_or("none")
            ));
        }
        match (&self.libc, &new.libc) {
            (None, _) => Ok(()),
            (Some((soname, _)), None) => Err(format!("the new base has no {soname}")),
            (Some((old_so, old_v)), Some((new_so, new_v))) => {
                if old_so != new_so {
                    Err(format!("the C library changes from {old_so} to {new_so}"))
                } else if version_less(new_v, old_v) {
                    Err(format!(
                        "{new_so} goes back from version {old_v} to {new_v}: code built \
                         against {old_v} may need symbols {new_v} lacks"
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }
}

impl fmt::Display for Abi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let labels = self.labels();
        let parts: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{}={v}", k.trim_start_matches("dev.kiln.abi.")))
            .collect();
        f.write_str(&parts.join(" "))
    }
}

fn node_text(node: Option<(u32, u32)>) -> String {
    node.map_or("none".into(), |(major, modules)| {
        format!("{major} (modules {modules})")
    })
}

/// Dotted numeric versions compared part by part (`2.9` < `2.41`).
fn version_less(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a) < parts(b)
}

/// The upstream version of a Debian package version: no epoch, no revision
/// (`2.41-12+deb13u5` → `2.41`).
pub fn debian_upstream(version: &str) -> &str {
    let version = version.split_once(':').map_or(version, |(_, v)| v);
    version.rsplit_once('-').map_or(version, |(v, _)| v)
}

/// `NODE_MAJOR_VERSION` and the numeric `NODE_MODULE_VERSION` of Node.js's
/// `include/node/node_version.h`.
pub fn node_version_header(text: &str) -> Option<(u32, u32)> {
    let define = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("#define ")?.strip_prefix(name)?;
            rest.trim().parse::<u32>().ok()
        })
    };
    Some((
        define("NODE_MAJOR_VERSION ")?,
        define("NODE_MODULE_VERSION ")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node22() -> Abi {
        Abi {
            libc: Some(("libc.so.6".into(), "2.41".into())),
            node: Some((22, 127)),
            python: None,
        }
    }

    #[test]
    fn labels_round_trip() {
        let abi = node22();
        assert_eq!(Abi::from_labels(&abi.labels()), Ok(Some(abi.clone())));
        assert_eq!(
            abi.to_string(),
            "libc=libc.so.6 2.41 node=22 node-modules=127"
        );
        assert_eq!(Abi::from_labels(&BTreeMap::new()), Ok(None));
        let mut half = abi.labels();
        half.remove(NODE_MODULES_LABEL);
        assert!(Abi::from_labels(&half).is_err());
    }

    #[test]
    fn a_patch_release_runs_and_another_major_does_not() {
        let old = node22();
        let patched = Abi {
            libc: Some(("libc.so.6".into(), "2.42".into())),
            ..old.clone()
        };
        assert_eq!(old.runs_on(&patched), Ok(()));
        let why = old
            .runs_on(&Abi {
                node: Some((24, 137)),
                ..old.clone()
            })
            .unwrap_err();
        assert!(
            why.contains("from 22 (modules 127) to 24 (modules 137)"),
            "{why}"
        );
        let why = patched.runs_on(&old).unwrap_err();
        assert!(why.contains("goes back from version 2.42 to 2.41"), "{why}");
        let py = |v: &str| Abi {
            python: Some(v.into()),
            ..Abi::default()
        };
        assert!(py("3.13").runs_on(&py("3.14")).is_err());
        assert!(py("3.13").runs_on(&py("3.13")).is_ok());
    }

    #[test]
    fn versions_and_headers_parse() {
        assert_eq!(debian_upstream("2.41-12+deb13u5"), "2.41");
        assert_eq!(debian_upstream("1:2.3-1"), "2.3");
        assert_eq!(debian_upstream("2.3"), "2.3");
        assert!(version_less("2.9", "2.41"));
        let header = "#define NODE_MAJOR_VERSION 22\n#define NODE_MODULE_VERSION \
                      NODE_EMBEDDER_MODULE_VERSION\n#else\n#define NODE_MODULE_VERSION 127\n";
        assert_eq!(node_version_header(header), Some((22, 127)));
    }
}
