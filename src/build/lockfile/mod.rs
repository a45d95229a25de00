//! `npm ci` without npm, when the lock file alone decides what it installs.
//!
//! A `package-lock.json` of version 2 or 3 names every package of the tree: its place below
//! `node_modules`, its registry tarball, its integrity and its bins. When nothing else can
//! change what `npm ci --omit=dev` writes — no registry config, no install script, no link,
//! bundle, workspace or override, a lock in step with `package.json` — kiln unpacks the
//! tarballs itself (verified while they download, cached by integrity) and links the bins
//! as npm does. No builder image is unpacked and no npm starts: a cold build saves the
//! builder's download and npm's own seconds of CPU, and a changed lock downloads only the
//! tarballs it adds. Anything else (or `--lockfile-install off`) runs npm in the builder
//! image as before; [`plan`] says why, and the build logs it.
//!
//! What is written is what npm writes (`tests/it/build_lockfile.rs` compares the two):
//! - each tarball's regular files below its top directory, as pacote extracts them: links and
//!   other special members skipped, directories made only for the files in them, a
//!   `.gitignore` renamed `.npmignore` unless the package has one, a file executable when its
//!   mode has an execute bit;
//! - each bin linked, relative, from the `.bin` directory of the `node_modules` holding its
//!   package, its target made executable and a CRLF ending of its `#!` line made LF, as
//!   bin-links does;
//! - not npm's hidden lock file `node_modules/.package-lock.json`: npm reads it only to
//!   speed up a later install in place, and nothing at run time does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::function::DepInputs;
use crate::fetch::download;
use crate::fetch::npm::admits;
use crate::fetch::npm::{self, NpmTarball};
use crate::oci::Platform;
use crate::runtime::{Language, RuntimeSpec};

/// The registry whose tarballs kiln fetches itself (npm's default; a `.npmrc` naming
/// another makes npm run).
const REGISTRY: &str = "https://registry.npmjs.org/";

/// Tarballs downloaded at once.
const PARALLEL_DOWNLOADS: usize = 16;

/// The toolchain of a lock-file install in the dependency key: this module's rules (bump
/// the version when what they write changes) and the platform the optional packages were
/// chosen for. No builder image or npm version enters: neither is used.
pub fn toolchain_id(platform: &Platform) -> String {
    format!(
        "kiln lock-file install v1 for {}/{}",
        platform.os,
        platform.node_cpu()
    )
}

/// What a lock-file install unpacks and links.
#[derive(Clone, Debug)]
pub struct Plan {
    packages: Vec<Package>,
}

impl Plan {
    /// How many packages it installs.
    pub fn len(&self) -> usize {
        self.packages.len()
    }

    /// Whether it installs nothing.
    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    /// Each package's path below `node_modules` and its bins (name to file), for checks.
    pub(crate) fn paths(&self) -> impl Iterator<Item = (&str, &BTreeMap<String, String>)> {
        self.packages.iter().map(|p| (p.path.as_str(), &p.bins))
    }
}

#[derive(Clone, Debug)]
struct Package {
    /// Below `node_modules/`: `a`, `a/node_modules/@s/b`.
    path: String,
    tarball: NpmTarball,
    /// Bin name to its file, relative to the package, normalised as npm does.
    bins: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Lock {
    #[serde(rename = "lockfileVersion")]
    version: u32,
    #[serde(default)]
    packages: BTreeMap<String, Entry>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Entry {
    name: Option<String>,
    version: Option<String>,
    resolved: Option<String>,
    integrity: Option<String>,
    #[serde(default)]
    dev: bool,
    #[serde(default)]
    optional: bool,
    #[serde(default)]
    dev_optional: bool,
    #[serde(default)]
    link: bool,
    #[serde(default)]
    in_bundle: bool,
    #[serde(default)]
    extraneous: bool,
    #[serde(default)]
    has_install_script: bool,
    #[serde(default)]
    os: Vec<String>,
    #[serde(default)]
    cpu: Vec<String>,
    #[serde(default)]
    libc: Vec<String>,
    bin: Option<serde_json::Value>,
    #[serde(default)]
    dependencies: BTreeMap<String, String>,
    #[serde(default)]
    optional_dependencies: BTreeMap<String, String>,
    #[serde(default)]
    dev_dependencies: BTreeMap<String, String>,
    #[serde(default)]
    peer_dependencies: BTreeMap<String, String>,
    workspaces: Option<serde_json::Value>,
}

/// The root package's fields that make npm do more than unpack the lock.
const ROOT_SCRIPTS: [&str; 7] = [
    "preinstall",
    "install",
    "postinstall",
    "prepublish",
    "preprepare",
    "prepare",
    "postprepare",
];

/// The install of `inputs` when their lock file decides it alone; else why npm must run.
///
/// # Errors
/// The reason, one line, for the build's log.
pub fn plan(
    runtime: &RuntimeSpec,
    inputs: &DepInputs,
    platform: &Platform,
) -> Result<Plan, String> {
    if runtime.language != Language::Nodejs {
        return Err(format!(
            "the {} runtime installs with its tool",
            runtime.name
        ));
    }
    let Some(lock) = &inputs.lock else {
        return Err("no package-lock.json: npm resolves the versions".into());
    };
    if let Some(config) = inputs.configs.first() {
        return Err(format!(
            "{} may name another registry or credentials",
            config.name
        ));
    }
    let manifest: serde_json::Value = serde_json::from_slice(&inputs.manifest.bytes)
        .map_err(|e| format!("{} is not JSON ({e}): npm reports it", inputs.manifest.name))?;
    manifest_is_plain(&manifest)?;
    let parsed: Lock = serde_json::from_slice(&lock.bytes)
        .map_err(|e| format!("{} is not a lock file kiln reads ({e})", lock.name))?;
    if !(2..=3).contains(&parsed.version) {
        return Err(format!(
            "{} has lockfileVersion {}, not 2 or 3",
            lock.name, parsed.version
        ));
    }
    let root = parsed
        .packages
        .get("")
        .ok_or("the lock has no root package")?;
    in_step(&manifest, root, &parsed.packages)?;
    let mut packages = Vec::new();
    for (key, entry) in &parsed.packages {
        if key.is_empty() || entry.dev {
            continue;
        }
        if let Some(package) = package(key, entry, platform)? {
            packages.push(package);
        }
    }
    if packages.is_empty() {
        return Err("the lock installs nothing".into());
    }
    // Two packages of one node_modules with a bin of the same name: npm decides.
    let mut linked = BTreeSet::new();
    for p in &packages {
        for name in p.bins.keys() {
            if !linked.insert((bin_dir(&p.path), name.clone())) {
                return Err(format!("two packages have a bin named {name:?}"));
            }
        }
    }
    Ok(plan_sorted(packages))
}

/// Why npm must run for a package.json with install scripts of its own, workspaces, overrides
/// or bundled dependencies.
fn manifest_is_plain(manifest: &serde_json::Value) -> Result<(), String> {
    let scripts = manifest.get("scripts").and_then(|s| s.as_object());
    if let Some(script) = ROOT_SCRIPTS
        .iter()
        .find(|s| scripts.is_some_and(|m| m.contains_key(**s)))
    {
        return Err(format!("package.json has a {script:?} script"));
    }
    for field in [
        "workspaces",
        "overrides",
        "bundleDependencies",
        "bundledDependencies",
    ] {
        if manifest.get(field).is_some() {
            return Err(format!("package.json has {field:?}"));
        }
    }
    Ok(())
}

/// The lock's entry `key` as a package to unpack; `None` for an optional one `platform` does
/// not take; why npm must run when kiln cannot unpack it alone.
fn package(key: &str, entry: &Entry, platform: &Platform) -> Result<Option<Package>, String> {
    let (os, cpu) = (platform.os.as_str(), platform.node_cpu());
    let path = below_node_modules(key).ok_or_else(|| format!("the lock's {key:?}"))?;
    if entry.link || entry.in_bundle || entry.extraneous {
        return Err(format!("the lock's {key} is linked, bundled or extraneous"));
    }
    let fits = admits(&entry.os, os) && admits(&entry.cpu, cpu) && libc_admits(&entry.libc);
    if !fits {
        if entry.optional || entry.dev_optional {
            return Ok(None);
        }
        return Err(format!("{key} is not for {os}/{cpu}: npm reports it"));
    }
    if entry.has_install_script {
        return Err(format!("{key} has an install script"));
    }
    let name = entry
        .name
        .clone()
        .unwrap_or_else(|| package_name(&path).to_string());
    let (Some(version), Some(integrity)) = (&entry.version, &entry.integrity) else {
        return Err(format!("the lock's {key} has no version or integrity"));
    };
    let tarball = NpmTarball {
        package: name.clone(),
        version: version.clone(),
        integrity: integrity.clone(),
    };
    let expected = format!("{REGISTRY}{}", tarball.tarball_path());
    if entry.resolved.as_deref() != Some(expected.as_str()) {
        return Err(format!("{key} is not resolved to {expected}"));
    }
    if !integrity.starts_with("sha512-") {
        return Err(format!("{key} has no sha512 integrity"));
    }
    let bins = entry
        .bin
        .as_ref()
        .map(|b| normalize_bins(b, &name))
        .unwrap_or_default();
    Ok(Some(Package {
        path,
        tarball,
        bins,
    }))
}

/// Parents before the packages nested in them.
fn plan_sorted(mut packages: Vec<Package>) -> Plan {
    packages.sort_by(|a, b| a.path.cmp(&b.path));
    Plan { packages }
}

/// Whether the lock's root lists what package.json lists (what `npm ci` checks first), and
/// each of its dependencies is in the lock.
fn in_step(
    manifest: &serde_json::Value,
    root: &Entry,
    packages: &BTreeMap<String, Entry>,
) -> Result<(), String> {
    if root.workspaces.is_some() {
        return Err("the lock has workspaces".into());
    }
    let fields = [
        ("dependencies", &root.dependencies),
        ("optionalDependencies", &root.optional_dependencies),
        ("devDependencies", &root.dev_dependencies),
        ("peerDependencies", &root.peer_dependencies),
    ];
    for (field, locked) in fields {
        let wanted: BTreeMap<String, String> = match manifest.get(field) {
            None => BTreeMap::new(),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|_| format!("package.json's {field} is not names to versions"))?,
        };
        if &wanted != locked {
            return Err(format!(
                "package.json's {field} differ from the lock's: npm ci refuses the lock"
            ));
        }
    }
    let missing = root
        .dependencies
        .keys()
        .find(|name| !packages.contains_key(&format!("node_modules/{name}")));
    match missing {
        Some(name) => Err(format!("the lock has no node_modules/{name}")),
        None => Ok(()),
    }
}

/// `node_modules/a/node_modules/@s/b` → `a/node_modules/@s/b`, when every step is a name.
fn below_node_modules(key: &str) -> Option<String> {
    let path = key.strip_prefix("node_modules/")?;
    let plain = Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(n) if n != ".bin"));
    (plain && !path.ends_with('/') && !path.contains("//")).then(|| path.to_string())
}

/// The package name a path installs: its last `node_modules/` step.
fn package_name(path: &str) -> &str {
    path.rsplit_once("/node_modules/").map_or(path, |(_, n)| n)
}

/// The `node_modules` directory whose `.bin` holds a package's bins, below `node_modules/`
/// (`""` for the top one).
fn bin_dir(path: &str) -> String {
    path.rsplit_once("/node_modules/")
        .map_or(String::new(), |(parent, _)| {
            format!("{parent}/node_modules")
        })
}

/// The runtime bases are Debian: glibc.
fn libc_admits(list: &[String]) -> bool {
    admits(list, "glibc")
}

/// A lock's `bin` (a path, or names to paths) as npm normalises it: a name is its last
/// path step, a path is resolved below the package; anything else is dropped.
fn normalize_bins(bin: &serde_json::Value, package: &str) -> BTreeMap<String, String> {
    let pairs: Vec<(String, String)> = match bin {
        serde_json::Value::String(target) => vec![(package.to_string(), target.clone())],
        serde_json::Value::Object(map) => map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        _ => Vec::new(),
    };
    let mut bins = BTreeMap::new();
    for (name, target) in pairs {
        let name = name.replace(['\\', ':'], "/");
        let name = clean(&name);
        let name = name.rsplit('/').next().unwrap_or_default();
        let target = clean(&target.replace('\\', "/"));
        if !name.is_empty() && !target.is_empty() {
            bins.insert(name.to_string(), target);
        }
    }
    bins
}

/// A `/`-separated path resolved as below a root: `.` and empty steps dropped, `..` taking
/// one step back but never above the root.
fn clean(path: &str) -> String {
    let mut steps: Vec<&str> = Vec::new();
    for step in path.split('/') {
        match step {
            "" | "." => {}
            ".." => {
                steps.pop();
            }
            s => steps.push(s),
        }
    }
    steps.join("/")
}

/// Why a lock-file install failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tarball could not be fetched or does not match the lock.
    #[error("fetching the tarballs the lock file names")]
    Fetch(#[from] npm::Error),
    /// Writing the tree.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// A file could not be added to the tree: the scratch directory, the tree's size limit.
    #[error(transparent)]
    Tree(#[from] crate::build::memtree::Error),
    /// A tarball that cannot be read.
    #[error("unpacking {package}@{version}")]
    Tarball {
        /// The package.
        package: String,
        /// Its version.
        version: String,
        /// The cause.
        #[source]
        source: Box<Error>,
    },
    /// The HTTP client.
    #[error("setting up the HTTP client for the npm registry")]
    Client(#[source] reqwest::Error),
    /// The CA bundle.
    #[error("reading the CA bundle {path}")]
    Ca {
        /// The bundle.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A worker thread died.
    #[error("internal task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// An HTTP client for the npm registry: the system's roots plus `ca_bundle` (a corporate TLS
/// proxy's); proxies from the environment, as npm takes them; the stall limit of
/// [`download::client_builder`].
///
/// # Errors
/// An unreadable or invalid bundle.
pub fn client(ca_bundle: Option<&Path>) -> Result<reqwest::Client, Error> {
    let mut builder = download::client_builder();
    if let Some(path) = ca_bundle {
        let pem = std::fs::read(path).map_err(|source| Error::Ca {
            path: path.to_path_buf(),
            source,
        })?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| Error::Ca {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        builder = builder.tls_certs_merge(certs);
    }
    builder.build().map_err(Error::Client)
}

mod install;

pub use install::install;
pub(crate) use install::unpack_for_checks;
#[cfg(test)]
use install::{check_parents, link_bin, relative, unpack};

#[cfg(test)]
mod tests;
