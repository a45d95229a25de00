//! `pip install -r requirements.txt` without pip, when requirements.txt pins every package.
//!
//! A requirements.txt whose every line is `name==version` (with extras and `--hash` options
//! allowed, nothing else) is Python's lock file when it also pins every dependency of what it
//! names. Then pip has nothing to decide but which file of each release to take, and kiln
//! takes the same one: the wheel with the best tag for the runtime's CPython on its glibc, in
//! pip's order of preference. The wheels download in parallel (verified against PyPI's
//! SHA-256 and any `--hash`, cached by it) and are unpacked as pip unpacks them into
//! `--target`, with the console scripts and the `RECORD` pip writes; no builder image is
//! unpacked and no pip starts.
//!
//! Whether every dependency is pinned shows only in the wheels' own metadata, so it is
//! decided after the download: [`install`] then answers [`Outcome::NeedsPip`] (a package
//! pinned nowhere, a pin its dependent does not accept, a release without a fitting wheel, a
//! marker kiln cannot evaluate, a wheel with headers or data files), and pip runs in the
//! builder image as before. The dependency key names both (`… else` the builder's), so one
//! key always means one way of installing. Anything that fails [`plan`] (an option line, a
//! range, a `pip.conf`, `--lockfile-install off`) runs pip straight away.
//!
//! What is written is what pip writes (`tests/it/build_pinned.rs` compares the two), with
//! `--no-compile` as the runtime runs it: no bytecode.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use futures_util::{StreamExt as _, TryStreamExt as _};
use sha2::Sha256;

use crate::io_error::IoContext as _;

mod index;
pub(crate) mod pages;
pub(crate) mod provenance;
mod wheel;

use index::{INDEX, IndexFile, choose, release};
#[cfg(test)]
use index::{Project, release_files};
use wheel::{Skip, Wheel, read_wheel, unpack};
pub(crate) use wheel::{headers, unpack_for_checks};

use super::function::DepInputs;
use super::memtree::{Building, IN_MEMORY};
use super::pep440::{self, Environment, Version};
use crate::fetch::download;
use crate::oci::Platform;
use crate::oci::source::Tree;
use crate::runtime::{Language, RuntimeSpec};

/// Requests at once.
const PARALLEL: usize = 16;

/// The patch releases of the runtime's CPython minor release a marker or `Requires-Python`
/// is evaluated for: it must give one answer for all of them, since the exact patch release
/// is the builder's (and changes when the base is locked again).
const PATCHES: std::ops::RangeInclusive<u32> = 0..=40;

/// One `name==version` line of requirements.txt.
#[derive(Clone, Debug)]
struct Requirement {
    /// As written.
    name: String,
    /// Normalized.
    key: String,
    version: String,
    extras: Vec<String>,
    /// `--hash=sha256:` values, lower-case hex.
    hashes: BTreeSet<String>,
}

/// Which wheels fit: the runtime's CPython and glibc, and the platform's machine.
#[derive(Clone, Debug)]
struct Target {
    /// `(3, 13)`.
    python: (u32, u32),
    /// `(2, 41)`.
    glibc: (u32, u32),
    /// `x86_64`, `aarch64`.
    machine: String,
    /// The interpreter pip runs as (`sys.executable`), for the scripts' `#!` line.
    executable: String,
}

impl Target {
    fn environments(&self, extra: &str) -> Vec<Environment> {
        PATCHES
            .map(|patch| Environment {
                python_full_version: format!("{}.{}.{patch}", self.python.0, self.python.1),
                machine: self.machine.clone(),
                extra: extra.to_string(),
            })
            .collect()
    }
}

/// What a pinned-requirements install fetches and unpacks.
#[derive(Clone, Debug)]
pub struct Plan {
    requirements: Vec<Requirement>,
    target: Target,
}

impl Plan {
    /// How many packages requirements.txt pins.
    pub fn len(&self) -> usize {
        self.requirements.len()
    }

    /// Whether it pins none.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// The toolchain of a pinned install in the dependency key: this module's rules (bump the
/// version when what they write changes) and the wheels it takes. The key also names pip's
/// toolchain, which runs when the wheels do not pin every dependency.
pub fn toolchain_id(plan: &Plan) -> String {
    let t = &plan.target;
    format!(
        "kiln pinned-wheel install v1 for cp{}{} on manylinux_{}_{}_{} as {}",
        t.python.0, t.python.1, t.glibc.0, t.glibc.1, t.machine, t.executable
    )
}

/// The install of `inputs` when requirements.txt pins every line to one version; else why
/// pip must run.
///
/// # Errors
/// The reason, one line, for the build's log.
pub fn plan(
    runtime: &RuntimeSpec,
    inputs: &DepInputs,
    platform: &Platform,
) -> Result<Plan, String> {
    if runtime.language != Language::Python {
        return Err(format!(
            "the {} runtime installs with its tool",
            runtime.name
        ));
    }
    let Some(wheels) = &runtime.dependencies.wheels else {
        return Err(format!(
            "the {} runtime names no wheel platform",
            runtime.name
        ));
    };
    if let Some(config) = inputs.configs.first() {
        return Err(format!(
            "{} may name another index or credentials",
            config.name
        ));
    }
    let machine = match (platform.os.as_str(), platform.machine()) {
        ("linux", Some(machine)) => machine,
        _ => return Err(format!("no wheels are chosen for {platform}")),
    };
    let number = |text: &str, what: &str| -> Result<(u32, u32), String> {
        let (a, b) = text
            .split_once('.')
            .ok_or_else(|| format!("the runtime's {what} {text:?}"))?;
        Ok((
            a.parse()
                .map_err(|_| format!("the runtime's {what} {text:?}"))?,
            b.parse()
                .map_err(|_| format!("the runtime's {what} {text:?}"))?,
        ))
    };
    // distlib writes another `#!` form for an interpreter path with a space or a long one.
    if wheels.executable.contains(char::is_whitespace) || wheels.executable.len() > 120 {
        return Err(format!(
            "the runtime's interpreter {:?} needs pip's own #! line",
            wheels.executable
        ));
    }
    let text = std::str::from_utf8(&inputs.manifest.bytes)
        .map_err(|_| format!("{} is not UTF-8", inputs.manifest.name))?;
    let requirements =
        parse_requirements(text).map_err(|why| format!("{}: {why}", inputs.manifest.name))?;
    Ok(Plan {
        requirements,
        target: Target {
            python: number(&wheels.python, "Python version")?,
            glibc: number(&wheels.glibc, "glibc version")?,
            machine: machine.into(),
            executable: wheels.executable.clone(),
        },
    })
}

/// The lines of a requirements.txt that pins everything: `name[extras]==version`, each
/// with `--hash=sha256:…` options or none.
fn parse_requirements(text: &str) -> Result<Vec<Requirement>, String> {
    // pip never joins a comment line to the next; kiln's joining below would.
    if text
        .lines()
        .any(|l| l.trim_start().starts_with('#') && l.trim_end_matches('\r').ends_with('\\'))
    {
        return Err("a comment line ends in a backslash".into());
    }
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut out: Vec<Requirement> = Vec::new();
    for raw in joined.lines() {
        // pip's comments: `#` at the start or after whitespace.
        let line = match raw.find('#') {
            Some(0) => "",
            Some(i) if raw[..i].ends_with([' ', '\t']) => &raw[..i],
            _ => raw,
        }
        .trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('-') {
            let option = line.split([' ', '=']).next().unwrap_or(line);
            return Err(format!("the option {option} is for pip"));
        }
        let mut words = line.split_whitespace();
        let spec = words.next().unwrap_or_default();
        let mut hashes = BTreeSet::new();
        for word in words {
            let Some(hex) = word.strip_prefix("--hash=sha256:") else {
                return Err(format!("{spec} has {word:?}, which is for pip"));
            };
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("{spec} has the hash {word:?}"));
            }
            hashes.insert(hex.to_ascii_lowercase());
        }
        let Some((name_part, version)) = spec.split_once("==") else {
            return Err(format!("{spec} is not pinned with =="));
        };
        if version.starts_with('=') || version.ends_with(".*") || version.contains(['$', ';', ','])
        {
            return Err(format!("{spec} is not pinned to one version"));
        }
        Version::parse(version)?;
        let dep = pep440::dependency(name_part)?;
        if !dep.specifiers.is_empty() || dep.marker.is_some() {
            return Err(format!("{spec} is not a plain pin"));
        }
        if out.iter().any(|r| r.key == dep.name) {
            return Err(format!("{} is named twice", dep.name));
        }
        let name = name_part.split('[').next().unwrap_or(name_part).to_string();
        out.push(Requirement {
            name,
            key: dep.name,
            version: version.to_string(),
            extras: dep.extras,
            hashes,
        });
    }
    if out.is_empty() {
        return Err("nothing is named".into());
    }
    if out.iter().any(|r| r.hashes.is_empty()) && out.iter().any(|r| !r.hashes.is_empty()) {
        return Err("some lines have hashes and some not".into());
    }
    Ok(out)
}

/// What [`install`] did.
pub enum Outcome {
    /// The tree pip would write into `--target`.
    Installed(Tree),
    /// pip must decide: why.
    NeedsPip(String),
}

/// Why a pinned install failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The index or a wheel could not be fetched, or a wheel is not the one the index names.
    #[error("fetching the wheels requirements.txt pins")]
    Fetch(#[from] download::Error),
    /// A wheel that cannot be installed.
    #[error("installing {wheel}: {detail}")]
    Wheel {
        /// The wheel's file name.
        wheel: String,
        /// What is wrong.
        detail: String,
    },
    /// Local files.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// A worker thread died.
    #[error("internal task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// The wheel kiln takes for a requirement.
struct Chosen {
    file: IndexFile,
}

/// Fetches each pinned release's wheel (or takes it from `cache_dir/wheels/`), checks that
/// the wheels pin every dependency, and returns the tree pip would write, or why pip must
/// decide.
///
/// # Errors
/// The index or a download failing, a wheel that is not PyPI's or cannot be read.
pub async fn install(
    plan: &Plan,
    http: &reqwest::Client,
    cache_dir: &Path,
    scratch: &Path,
) -> Result<Outcome, Error> {
    let started = std::time::Instant::now();
    let tags: BTreeMap<String, usize> = plan
        .target
        .tags()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i))
        .collect();
    let releases: Vec<Option<Vec<IndexFile>>> = futures_util::stream::iter(&plan.requirements)
        .map(|r| release(http, INDEX, cache_dir, r))
        .buffered(PARALLEL)
        .try_collect()
        .await?;
    let mut chosen = Vec::new();
    for (r, release) in plan.requirements.iter().zip(releases) {
        let Some(files) = release else {
            return Ok(Outcome::NeedsPip(format!("PyPI has no project {}", r.name)));
        };
        let versions: BTreeSet<&str> = files
            .iter()
            .filter_map(|f| f.filename.split('-').nth(1))
            .collect();
        if versions.len() > 1 {
            return Ok(Outcome::NeedsPip(format!(
                "{}=={} matches the versions {versions:?}",
                r.name, r.version
            )));
        }
        match choose(r, &files, &tags, &plan.target) {
            Ok(file) => chosen.push(Chosen { file }),
            Err(why) => return Ok(Outcome::NeedsPip(why)),
        }
    }
    let files: Vec<PathBuf> = futures_util::stream::iter(&chosen)
        .map(|c| {
            let expected = hex::decode(&c.file.sha256).unwrap_or_default();
            let dest = cache_dir
                .join("wheels")
                .join(format!("{}.whl", c.file.sha256));
            let (url, limit) = (&c.file.url, c.file.limit);
            async move { download::cached::<Sha256>(http, url, &dest, &expected, limit).await }
        })
        .buffered(PARALLEL)
        .try_collect()
        .await?;
    tracing::info!(
        wheels = files.len(),
        seconds = started.elapsed().as_secs_f32(),
        "fetched the wheels requirements.txt pins"
    );
    let (plan, spill) = (plan.clone(), scratch.join("spill"));
    let archives: Vec<Archive> = chosen
        .into_iter()
        .map(|c| Archive {
            filename: c.file.filename,
            url: c.file.url,
            sha256: c.file.sha256,
        })
        .collect();
    tokio::task::spawn_blocking(move || build(&plan, &archives, &files, &spill)).await?
}

/// Whether `spec` (a `Requires-Python`) admits the runtime's Python, the same for every
/// patch release of it.
fn python_admits(target: &Target, spec: &str, what: &str) -> Result<bool, String> {
    let mut answers = BTreeSet::new();
    for env in target.environments("") {
        let v = Version::parse(&env.python_full_version)?;
        answers.insert(
            pep440::satisfies(&v, spec)
                .map_err(|why| format!("{what} requires Python {spec:?}: {why}"))?,
        );
    }
    match answers.len() {
        1 => Ok(answers.contains(&true)),
        _ => Err(format!(
            "{what} requires Python {spec:?}, which depends on the patch release"
        )),
    }
}

/// A wheel kiln downloaded: its file name, where from, and its SHA-256 (hex).
struct Archive {
    filename: String,
    url: String,
    sha256: String,
}

/// Reads the wheels, checks that they pin every dependency, and builds the tree.
fn build(
    plan: &Plan,
    chosen: &[Archive],
    files: &[PathBuf],
    spill: &Path,
) -> Result<Outcome, Error> {
    let mut archives = Vec::new();
    let mut wheels = BTreeMap::new();
    for ((r, archive), file) in plan.requirements.iter().zip(chosen).zip(files) {
        let name = &archive.filename;
        let bad = |detail: String| Error::Wheel {
            wheel: name.clone(),
            detail,
        };
        let f = std::fs::File::open(file).at("opening", file)?;
        let mut zip = zip::ZipArchive::new(f).map_err(|e| bad(e.to_string()))?;
        let wheel = match read_wheel(&mut zip, name, r) {
            Ok(w) => Wheel {
                archive: Some((archive.url.clone(), archive.sha256.clone())),
                ..w
            },
            Err(Skip::Pip(why)) => return Ok(Outcome::NeedsPip(why)),
            Err(Skip::Bad(detail)) => return Err(bad(detail)),
        };
        wheels.insert(r.key.clone(), (r, wheel));
        archives.push(zip);
    }
    if let Err(why) = closed(plan, &wheels) {
        return Ok(Outcome::NeedsPip(why));
    }
    let mut tree = Building::new(spill, IN_MEMORY);
    for (r, mut zip) in plan.requirements.iter().zip(archives) {
        let wheel = &wheels[&r.key].1;
        match unpack(&mut zip, wheel, &plan.target, &mut tree) {
            Ok(()) => {}
            Err(Skip::Pip(why)) => return Ok(Outcome::NeedsPip(why)),
            Err(Skip::Bad(detail)) => {
                return Err(Error::Wheel {
                    wheel: wheel.filename.clone(),
                    detail,
                });
            }
        }
    }
    // `a` a file and `a/b` another: pip fails on it.
    if let Some((_, file)) = tree.file_as_parent() {
        return Ok(Outcome::NeedsPip(format!(
            "{file} would be a file and a directory"
        )));
    }
    Ok(Outcome::Installed(tree.into_tree()))
}

/// Whether the pinned wheels need nothing else: every dependency their markers select (for
/// the extras asked for) is pinned to a version its specifiers accept, and every wheel's
/// `Requires-Python` admits the runtime.
fn closed(plan: &Plan, wheels: &BTreeMap<String, (&Requirement, Wheel)>) -> Result<(), String> {
    let mut todo: Vec<(String, String)> = Vec::new();
    for r in &plan.requirements {
        todo.push((r.key.clone(), String::new()));
        todo.extend(r.extras.iter().map(|e| (r.key.clone(), e.clone())));
    }
    let mut seen = BTreeSet::new();
    while let Some((key, extra)) = todo.pop() {
        if !seen.insert((key.clone(), extra.clone())) {
            continue;
        }
        let (_, wheel) = &wheels[&key];
        if let Some(spec) = &wheel.requires_python
            && !python_admits(&plan.target, spec, &wheel.filename)?
        {
            return Err(format!("{} does not run on this Python", wheel.filename));
        }
        for dep in &wheel.requires {
            let mut answers = BTreeSet::new();
            for env in plan.target.environments(&extra) {
                let holds = match &dep.marker {
                    Some(m) => pep440::marker_holds(m, &env)
                        .map_err(|why| format!("{} {}: {why}", wheel.name, wheel.version))?,
                    None => true,
                };
                answers.insert(holds);
            }
            if answers.len() != 1 {
                return Err(format!(
                    "{} {} needs {} on some patch releases only",
                    wheel.name, wheel.version, dep.name
                ));
            }
            if answers.contains(&false) {
                continue;
            }
            let Some((pinned, _)) = wheels.get(&dep.name) else {
                return Err(format!(
                    "{} {} needs {}, which requirements.txt does not pin: pip resolves it",
                    wheel.name, wheel.version, dep.name
                ));
            };
            let version = Version::parse(&pinned.version)?;
            if !pep440::satisfies(&version, &dep.specifiers)? {
                return Err(format!(
                    "{} {} needs {} {}, and requirements.txt pins {}: pip reports it",
                    wheel.name, wheel.version, dep.name, dep.specifiers, pinned.version
                ));
            }
            todo.push((dep.name.clone(), String::new()));
            todo.extend(dep.extras.iter().map(|e| (dep.name.clone(), e.clone())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod index_tests;
#[cfg(test)]
mod tests;
