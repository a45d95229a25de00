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

use futures_util::{StreamExt as _, TryStreamExt as _};
use serde::Deserialize;

use super::function::DepInputs;
use super::source::Tree;
use crate::base::download;
use crate::base::npm::{self, NpmTarball};
use crate::base::packages::admits;
use crate::oci::Platform;
use crate::oci::layer::{Content, EntryKind};
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
        npm_cpu(&platform.architecture)
    )
}

/// npm's name (`process.arch`) for a GOARCH.
fn npm_cpu(arch: &str) -> &str {
    match arch {
        "amd64" => "x64",
        "386" => "ia32",
        "ppc64le" => "ppc64",
        other => other,
    }
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

/// The entries one tarball gives below `p/` (file or link paths), every file with bytes
/// going to `spill` (none kept in memory, so the disk path is exercised): for the fuzz
/// target.
pub(crate) fn unpack_for_checks(tgz: &Path, spill: &Path) -> Result<Vec<String>, Error> {
    let mut tree = Building::new(spill, 0);
    unpack(tgz, "p", &mut tree)?;
    tree.check_parents()?;
    Ok(tree.entries.into_keys().collect())
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
    let (os, cpu) = (platform.os.as_str(), npm_cpu(&platform.architecture));
    let mut packages = Vec::new();
    for (key, entry) in &parsed.packages {
        if key.is_empty() || entry.dev {
            continue;
        }
        let path = below_node_modules(key).ok_or_else(|| format!("the lock's {key:?}"))?;
        if entry.link || entry.in_bundle || entry.extraneous {
            return Err(format!("the lock's {key} is linked, bundled or extraneous"));
        }
        let fits = admits(&entry.os, os) && admits(&entry.cpu, cpu) && libc_admits(&entry.libc);
        if !fits {
            if entry.optional || entry.dev_optional {
                continue;
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
        packages.push(Package {
            path,
            tarball,
            bins,
        });
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
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
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

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
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

/// File bytes an install keeps in memory; past this, files are written to the scratch
/// directory and read back by the layer writer.
pub(super) const IN_MEMORY: u64 = 64 << 20;

/// Downloads (or takes from `cache_dir/npm/`) every tarball of `plan`, verified against its
/// integrity, and returns the tree npm would write into `node_modules`, ready to layer. The
/// tree is built in memory (up to [`IN_MEMORY`] of file bytes, the rest in files in
/// `scratch`), not on disk: creating and reading back thousands of small files cost seconds
/// on an ext4 disk, far more than the decompression itself.
///
/// # Errors
/// A download that fails or does not match the lock, an unreadable tarball, I/O.
pub async fn install(
    plan: &Plan,
    http: &reqwest::Client,
    cache_dir: &Path,
    scratch: &Path,
) -> Result<Tree, Error> {
    let registry = url::Url::parse(REGISTRY).expect("a valid URL");
    let started = std::time::Instant::now();
    let cached = plan
        .packages
        .iter()
        .filter(|p| p.tarball.cached_path(cache_dir).is_ok_and(|f| f.is_file()))
        .count();
    let files: Vec<PathBuf> = futures_util::stream::iter(&plan.packages)
        .map(|p| p.tarball.fetch(http, &registry, cache_dir))
        .buffered(PARALLEL_DOWNLOADS)
        .try_collect()
        .await?;
    tracing::info!(
        downloaded = plan.packages.len() - cached,
        cached,
        seconds = started.elapsed().as_secs_f32(),
        "fetched the tarballs the lock file names"
    );
    let (plan, spill) = (plan.clone(), scratch.join("spill"));
    let tree = tokio::task::spawn_blocking(move || build_tree(&plan, &files, &spill));
    tree.await?
}

/// The tree below `node_modules`: every package unpacked (parents first), then the bins.
fn build_tree(plan: &Plan, tarballs: &[PathBuf], spill: &Path) -> Result<Tree, Error> {
    let mut tree = Building::new(spill, IN_MEMORY);
    for (p, tgz) in plan.packages.iter().zip(tarballs) {
        unpack(tgz, &p.path, &mut tree).map_err(|source| Error::Tarball {
            package: p.tarball.package.clone(),
            version: p.tarball.version.clone(),
            source: Box::new(source),
        })?;
    }
    for p in &plan.packages {
        let dir = match bin_dir(&p.path) {
            top if top.is_empty() => ".bin".to_string(),
            nested => format!("{nested}/.bin"),
        };
        for (name, target) in &p.bins {
            tree.link_bin(&p.path, &dir, name, target)?;
        }
    }
    tree.check_parents()?;
    Ok(tree.into_tree())
}

/// A tree being built in memory by kiln's own installs (this one and
/// [`super::pinned`]): `/`-separated paths below the install's directory (files and links;
/// the layer writer adds their directories).
pub(super) struct Building {
    pub(super) entries: BTreeMap<String, EntryKind>,
    /// File bytes held in memory so far.
    in_memory: u64,
    /// How many may be; past this, files go to `spill`.
    budget: u64,
    spill: PathBuf,
    spilled: u64,
}

impl Building {
    /// An empty tree keeping up to `budget` bytes of files in memory, the rest in `spill`.
    pub(super) fn new(spill: &Path, budget: u64) -> Building {
        Building {
            entries: BTreeMap::new(),
            in_memory: 0,
            budget,
            spill: spill.to_path_buf(),
            spilled: 0,
        }
    }

    /// Adds a file, or replaces the entry at `path` (as a later tar member does), which it
    /// returns.
    pub(super) fn put_file(
        &mut self,
        path: String,
        bytes: Vec<u8>,
        executable: bool,
    ) -> Result<Option<EntryKind>, Error> {
        let content = if self.in_memory + bytes.len() as u64 <= self.budget {
            self.in_memory += bytes.len() as u64;
            Content::Bytes(bytes)
        } else {
            std::fs::create_dir_all(&self.spill).map_err(io("creating", &self.spill))?;
            let file = self.spill.join(self.spilled.to_string());
            self.spilled += 1;
            std::fs::write(&file, &bytes).map_err(io("writing", &file))?;
            Content::Path(file)
        };
        Ok(self.entries.insert(
            path,
            EntryKind::File {
                content,
                executable,
            },
        ))
    }

    /// The finished tree.
    pub(super) fn into_tree(self) -> Tree {
        Tree {
            entries: self.entries,
        }
    }

    /// Links `dir/name` to the package's `target` if the package has it, and fixes the
    /// target as bin-links does: executable, and LF at the end of a file's `#!` line.
    fn link_bin(
        &mut self,
        package: &str,
        dir: &str,
        name: &str,
        target: &str,
    ) -> Result<(), Error> {
        let path = format!("{package}/{target}");
        let below = format!("{path}/");
        let is_dir = self
            .entries
            .range(below.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&below));
        let file = match self.entries.get_mut(&path) {
            Some(EntryKind::File {
                content,
                executable,
            }) => Some((content, executable)),
            // npm links nothing for a missing target.
            None if !is_dir => return Ok(()),
            _ => None,
        };
        if let Some((content, executable)) = file {
            *executable = true;
            let bytes = match content {
                Content::Bytes(bytes) => unix_hashbang(bytes),
                Content::Path(file) => {
                    unix_hashbang(&std::fs::read(&*file).map_err(io("reading", file))?)
                }
                Content::Beneath { .. } => None,
            };
            if let Some(fixed) = bytes {
                *content = Content::Bytes(fixed);
            }
        }
        let link = format!("{dir}/{name}");
        if self.entries.contains_key(&link) {
            return Err(Error::Io {
                action: "linking the bin",
                path: PathBuf::from("node_modules").join(&link),
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        self.entries
            .insert(link, EntryKind::Symlink(relative(&path, dir)));
        Ok(())
    }

    /// Refuses a file where another entry needs a directory (`a` and `a/b`), which no file
    /// system holds.
    fn check_parents(&self) -> Result<(), Error> {
        for path in self.entries.keys() {
            for (i, _) in path.match_indices('/') {
                if self.entries.contains_key(&path[..i]) {
                    return Err(Error::Io {
                        action: "unpacking",
                        path: PathBuf::from("node_modules").join(path),
                        source: std::io::Error::other(format!(
                            "node_modules/{} is a file, not a directory",
                            &path[..i]
                        )),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The `/`-separated path `to` relative to the directory `from`, both below one root.
fn relative(to: &str, from: &str) -> String {
    let (to, from): (Vec<&str>, Vec<&str>) = (to.split('/').collect(), from.split('/').collect());
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let ups = std::iter::repeat_n("..", from.len() - common);
    ups.chain(to[common..].iter().copied())
        .collect::<Vec<_>>()
        .join("/")
}

/// The file with its `#!` line's CRLF made LF, when it has one within its first 2048 bytes,
/// as bin-links' `dos2Unix` does: it reads and writes the file as UTF-8, so invalid bytes
/// become U+FFFD there too.
fn unix_hashbang(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.starts_with(b"#!") {
        return None;
    }
    let end = bytes.iter().position(|&b| b == b'\n')?;
    if !(4..2048).contains(&end) || bytes[end - 1] != b'\r' {
        return None;
    }
    let mut fixed = String::from_utf8_lossy(bytes).into_owned().into_bytes();
    // The lossy text keeps the ASCII first line where it was.
    let end = fixed.iter().position(|&b| b == b'\n')?;
    fixed.remove(end - 1);
    Some(fixed)
}

/// Unpacks a package tarball below `prefix` as pacote does: the top directory of each member
/// dropped; only regular files kept (links, devices and directories skipped: the layer gets
/// the directories its files need); a member whose path is absolute or climbs is skipped; a
/// `.gitignore` becomes `.npmignore` unless one was seen; executable when the mode has any
/// execute bit. Names must be UTF-8, as the layer's are.
fn unpack(tgz: &Path, prefix: &str, tree: &mut Building) -> Result<(), Error> {
    let bad = |e: std::io::Error| Error::Io {
        action: "reading",
        path: tgz.to_path_buf(),
        source: e,
    };
    let file = std::fs::File::open(tgz).map_err(io("opening", tgz))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut npmignores = BTreeSet::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            continue;
        }
        let path = entry.path().map_err(bad)?.into_owned();
        let mut steps = Vec::new();
        let mut plain = true;
        for c in path.components() {
            match c {
                Component::Normal(n) => match n.to_str() {
                    Some(n) => steps.push(n.to_string()),
                    None => {
                        return Err(bad(std::io::Error::other(format!(
                            "{} is not a UTF-8 name",
                            path.display()
                        ))));
                    }
                },
                Component::CurDir => {}
                _ => plain = false,
            }
        }
        if !plain || steps.len() < 2 {
            continue;
        }
        let name = steps.last().map(String::as_str);
        let mut rel = steps[1..].join("/");
        if name == Some(".npmignore") {
            npmignores.insert(rel.clone());
        } else if name == Some(".gitignore") {
            let renamed = format!("{}npmignore", rel.trim_end_matches("gitignore"));
            if npmignores.contains(&renamed) {
                continue;
            }
            rel = renamed;
        }
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        let mut bytes = Vec::with_capacity(entry.size().try_into().unwrap_or(0));
        std::io::Read::read_to_end(&mut entry, &mut bytes).map_err(bad)?;
        tree.put_file(format!("{prefix}/{rel}"), bytes, executable)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "lockfile_tests.rs"]
mod tests;
