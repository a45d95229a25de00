//! Kyma's runtime packages in the base images: what Kyma's own runtime images install next to
//! their function server (axios, express, OpenTelemetry…; requests, bottle, cloudevents…),
//! so a Function can `require`/`import` them without declaring them.
//!
//! `kiln base lock` resolves the recipe's `[packages]` with the package managers themselves —
//! `npm install --package-lock-only` gives the exact `node_modules` tree, `pip install
//! --dry-run --report` the exact wheels for the image's Python and platform — and pins every
//! tarball and wheel with its hash in `lock.toml`. `kiln base build` then needs neither: it
//! downloads each pinned file, verifies its hash while streaming, and unpacks it into the
//! packages' own layer. No install script runs (none of these packages needs one to work).
//!
//! The packages go where the runtime's module lookup finds them *after* the Function's own
//! dependencies: Node.js walks up from `/usr/src/app/function/node_modules` to
//! `/usr/src/app/node_modules`; Debian's Python puts `/usr/local/lib/python3.X/dist-packages`
//! on `sys.path` after `PYTHONPATH` (`/kubeless/site-packages`).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use futures_util::{StreamExt as _, TryStreamExt as _, stream};
use serde::{Deserialize, Serialize};

pub use super::wheels::{install_wheels, lock_pip};
use crate::fetch::npm::{self, NpmTarball, admits};
use crate::io_error::IoContext as _;

/// The `[packages]` table of a recipe.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackagesRecipe {
    /// Where they go in the image (a `node_modules` or a `dist-packages` directory).
    pub dest: String,
    /// npm dependencies, as in a `package.json`: name → version range.
    #[serde(default)]
    pub npm: BTreeMap<String, String>,
    /// pip requirements, as lines of a `requirements.txt`.
    #[serde(default)]
    pub pip: Vec<String>,
    /// The image's Python version (`3.13`), which the wheels must fit.
    #[serde(default)]
    pub python: Option<String>,
}

/// One package of a locked `node_modules` tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedNpmPath {
    /// Where below the destination (`axios`, `express/node_modules/debug`).
    pub path: String,
    /// The tarball.
    #[serde(flatten)]
    pub tarball: NpmTarball,
}

/// One pinned Python wheel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedWheel {
    /// Distribution name.
    pub name: String,
    /// Exact version.
    pub version: String,
    /// Where the wheel is downloaded from.
    pub url: String,
    /// Hex SHA-256 of the wheel.
    pub sha256: String,
}

/// Why Kyma's packages could not be locked or installed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The package manager used for locking failed or is missing.
    #[error("{tool} failed while locking the runtime packages: {detail}")]
    Tool {
        /// The command.
        tool: &'static str,
        /// Its output or the spawn error.
        detail: String,
    },
    /// The package manager's output was not what was expected.
    #[error("{what}: {detail}")]
    Output {
        /// Which output.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// npm side.
    #[error(transparent)]
    Npm(#[from] npm::Error),
    /// Downloading a wheel.
    #[error(transparent)]
    Download(crate::fetch::download::Error),
    /// A wheel whose bytes are not the locked ones.
    #[error("wheel {url} has SHA-256 {actual}, the lock file pins {expected}")]
    Hash {
        /// What.
        url: String,
        /// Pinned.
        expected: String,
        /// Received.
        actual: String,
    },
    /// A wheel that is not a valid zip archive, or a member that would leave its directory.
    #[error("wheel {wheel}: {detail}")]
    Wheel {
        /// Which wheel.
        wheel: String,
        /// What is wrong.
        detail: String,
    },
    /// Local file trouble.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

pub(super) type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `cmd` in `dir`; its stderr becomes the error's detail.
pub(super) fn run(tool: &'static str, cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(|e| Error::Tool {
        tool,
        detail: format!("{e} (it must be installed to lock the runtime packages)"),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Tool {
            tool,
            detail: format!("{}: {}", out.status, stderr.trim()),
        });
    }
    Ok(())
}

/// Resolves `deps` with npm (`--package-lock-only --ignore-scripts`: nothing is downloaded or
/// run) against `registry`: the text of the `package-lock.json`, which
/// [`parse_package_lock`] reads for each CPU.
///
/// # Errors
/// npm missing or failing.
pub fn lock_npm(deps: &BTreeMap<String, String>, registry: &url::Url) -> Result<String> {
    let dir = tempfile::tempdir().at("creating", std::env::temp_dir())?;
    let manifest = serde_json::json!({
        "name": "kiln-runtime-packages",
        "version": "0.0.0",
        "private": true,
        "dependencies": deps,
    });
    let path = dir.path().join("package.json");
    std::fs::write(&path, manifest.to_string()).at("writing", &path)?;
    run(
        "npm install --package-lock-only",
        Command::new("npm")
            .args([
                "install",
                "--package-lock-only",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                "--registry",
                registry.as_str(),
            ])
            .current_dir(dir.path()),
    )?;
    let path = dir.path().join("package-lock.json");
    Ok(std::fs::read_to_string(&path).at("reading", &path)?)
}

#[derive(Deserialize)]
struct PackageLock {
    #[serde(rename = "lockfileVersion")]
    version: u32,
    packages: BTreeMap<String, LockEntry>,
}

#[derive(Deserialize)]
struct LockEntry {
    name: Option<String>,
    version: Option<String>,
    integrity: Option<String>,
    #[serde(default)]
    dev: bool,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    link: bool,
    #[serde(default)]
    os: Vec<String>,
    #[serde(default)]
    cpu: Vec<String>,
}

/// The tree of a `package-lock.json` (version 2 or 3) for Linux on `cpu` (Node.js's name:
/// `x64`, `arm64`): an optional package for another OS or CPU is left out, as npm would.
///
/// # Errors
/// A lock entry npm would link or that lacks a sha512 integrity.
pub fn parse_package_lock(text: &str, cpu: &str) -> Result<Vec<LockedNpmPath>> {
    let lock: PackageLock = serde_json::from_str(text).map_err(|e| Error::Output {
        what: "npm's package-lock.json",
        detail: e.to_string(),
    })?;
    if lock.version < 2 {
        return Err(Error::Output {
            what: "npm's package-lock.json",
            detail: format!("lockfileVersion {} (npm 7 or later needed)", lock.version),
        });
    }
    let mut tree = Vec::new();
    for (key, entry) in lock.packages {
        if key.is_empty() || entry.dev {
            continue;
        }
        let Some(path) = key.strip_prefix("node_modules/") else {
            return Err(Error::Output {
                what: "npm's package-lock.json",
                detail: format!("{key:?} is not below node_modules"),
            });
        };
        if entry.optional && !(admits(&entry.os, "linux") && admits(&entry.cpu, cpu)) {
            continue;
        }
        if entry.link {
            return Err(Error::Output {
                what: "npm's package-lock.json",
                detail: format!("{key} is a link, not a registry package"),
            });
        }
        let package = entry.name.unwrap_or_else(|| {
            path.rsplit_once("node_modules/")
                .map_or(path, |(_, name)| name)
                .to_string()
        });
        let (Some(version), Some(integrity)) = (entry.version, entry.integrity) else {
            return Err(Error::Output {
                what: "npm's package-lock.json",
                detail: format!("{key} has no version or integrity"),
            });
        };
        if !integrity.starts_with("sha512-") {
            return Err(Error::Output {
                what: "npm's package-lock.json",
                detail: format!("{key} has integrity {integrity:?}, not sha512"),
            });
        }
        tree.push(LockedNpmPath {
            path: path.to_string(),
            tarball: NpmTarball {
                package,
                version,
                integrity,
            },
        });
    }
    Ok(tree)
}

/// Fetches every tarball of `tree` (8 at a time) and unpacks each into `dest/<path>`.
///
/// # Errors
/// A download that fails verification, a tarball that cannot be unpacked.
pub async fn install_npm(
    http: &reqwest::Client,
    registry: &url::Url,
    cache_dir: &Path,
    tree: &[LockedNpmPath],
    dest: &Path,
) -> Result<()> {
    let files: Vec<PathBuf> = stream::iter(tree)
        .map(|p| p.tarball.fetch(http, registry, cache_dir))
        .buffered(8)
        .try_collect()
        .await?;
    let tree = tree.to_vec();
    let dest = dest.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<()> {
        for (p, tgz) in tree.iter().zip(files) {
            let rel = Path::new(&p.path);
            if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(Error::Output {
                    what: "lock file",
                    detail: format!("npm path {:?} leaves node_modules", p.path),
                });
            }
            npm::unpack_package(&tgz, &dest.join(rel))?;
        }
        Ok(())
    })
    .await
    .map_err(|e| {
        Error::Io(crate::io_error::IoError {
            action: "unpacking npm packages into",
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })
    })?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_package_lock_gives_the_tree_for_each_linux_cpu() {
        let text = r#"{"lockfileVersion":3,"packages":{
            "":{"name":"x","dependencies":{"a":"1"}},
            "node_modules/a":{"version":"1.0.0","integrity":"sha512-AA=="},
            "node_modules/a/node_modules/@s/b":{"version":"2.0.0","integrity":"sha512-BB=="},
            "node_modules/alias":{"name":"real","version":"3.0.0","integrity":"sha512-CC=="},
            "node_modules/dev":{"version":"1.0.0","integrity":"sha512-DD==","dev":true},
            "node_modules/darwin":{"version":"1.0.0","integrity":"sha512-EE==","optional":true,
                "os":["darwin"]},
            "node_modules/notwin":{"version":"1.0.0","integrity":"sha512-FF==","optional":true,
                "os":["!win32"],"cpu":["x64"]}
        }}"#;
        let paths = |cpu| -> Vec<String> {
            let tree = parse_package_lock(text, cpu).unwrap();
            tree.iter()
                .map(|p| format!("{} {}", p.path, p.tarball.package))
                .collect()
        };
        let common = ["a a", "a/node_modules/@s/b @s/b", "alias real"];
        assert_eq!(paths("x64"), [&common[..], &["notwin notwin"]].concat());
        // The x64-only optional package is left out on arm64, as npm would.
        assert_eq!(paths("arm64"), common);
    }

    #[test]
    fn a_linked_or_unhashed_package_fails_the_lock() {
        let link = "{\"lockfileVersion\":3,\"packages\":\
            {\"node_modules/a\":{\"link\":true,\"resolved\":\"../a\"}}}";
        assert!(parse_package_lock(link, "x64").is_err());
        let sha1 = "{\"lockfileVersion\":3,\"packages\":\
            {\"node_modules/a\":{\"version\":\"1\",\"integrity\":\"sha1-AA==\"}}}";
        let e = parse_package_lock(sha1, "x64").unwrap_err().to_string();
        assert!(e.contains("not sha512"), "{e}");
    }
}
