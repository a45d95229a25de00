//! The index and pip's choice of file: a release's wheels from PyPI's simple API (PEP 691
//! JSON, what pip reads), and the one pip would take for the runtime, by pip's tag order
//! (`packaging.tags.sys_tags`), `Requires-Python`, yanking and build number.

use std::collections::BTreeMap;
use std::path::Path;

use reqwest::StatusCode;
use serde::Deserialize;

use super::{Error, Requirement, Target, pages, python_admits};
use crate::build::pep440::Version;
use crate::fetch::download;

/// The index kiln asks for a project's files, as pip does (its default; a `pip.conf` makes
/// pip run): PEP 691's JSON form of the simple API.
pub(super) const INDEX: &str = "https://pypi.org/simple/";

/// The most a project's index page may be. Pages list every file of every release: 1.2 MB
/// for charset-normalizer, 2 MB for botocore or numpy (2026-11).
const INDEX_LIMIT: u64 = 64 << 20;

impl Target {
    /// The tags pip accepts, best first (`packaging.tags.sys_tags` for CPython on
    /// manylinux).
    pub(super) fn tags(&self) -> Vec<String> {
        let (major, minor) = self.python;
        let cp = format!("cp{major}{minor}");
        let mut platforms = Vec::new();
        // packaging's oldest glibc: 2.5 on x86 (manylinux1), 2.17 elsewhere.
        let oldest = if matches!(self.machine.as_str(), "x86_64" | "i686") {
            5
        } else {
            17
        };
        for m in (oldest..=self.glibc.1).rev() {
            platforms.push(format!("manylinux_2_{m}_{}", self.machine));
            let legacy = match m {
                17 => Some("manylinux2014"),
                12 => Some("manylinux2010"),
                5 => Some("manylinux1"),
                _ => None,
            };
            if let Some(legacy) = legacy {
                platforms.push(format!("{legacy}_{}", self.machine));
            }
        }
        platforms.push(format!("linux_{}", self.machine));
        let mut tags = Vec::new();
        for abi in [cp.as_str(), "abi3", "none"] {
            tags.extend(platforms.iter().map(|p| format!("{cp}-{abi}-{p}")));
        }
        for older in (2..minor).rev() {
            tags.extend(
                platforms
                    .iter()
                    .map(|p| format!("cp{major}{older}-abi3-{p}")),
            );
        }
        let py: Vec<String> = [format!("py{major}{minor}"), format!("py{major}")]
            .into_iter()
            .chain((0..minor).rev().map(|m| format!("py{major}{m}")))
            .collect();
        for v in &py {
            tags.extend(platforms.iter().map(|p| format!("{v}-none-{p}")));
        }
        tags.push(format!("{cp}-none-any"));
        tags.extend(py.iter().map(|v| format!("{v}-none-any")));
        tags
    }
}

#[derive(Deserialize)]
pub(super) struct Project {
    files: Vec<ProjectFile>,
}

#[derive(Deserialize)]
struct ProjectFile {
    filename: String,
    url: String,
    hashes: BTreeMap<String, String>,
    #[serde(default, rename = "requires-python")]
    requires_python: Option<String>,
    /// `false` or why it was yanked.
    #[serde(default)]
    yanked: serde_json::Value,
    /// In bytes (PEP 700).
    #[serde(default)]
    size: Option<u64>,
}

/// A wheel of the pinned release.
#[derive(Clone, Debug)]
pub(super) struct IndexFile {
    pub(super) filename: String,
    pub(super) url: String,
    /// Lower-case hex.
    pub(super) sha256: String,
    pub(super) requires_python: Option<String>,
    pub(super) yanked: bool,
    /// The download's limit: the size the index gives, else [`download::LIMIT`].
    pub(super) limit: u64,
}

/// The wheels of `r`'s release from `index` (PEP 691 JSON), through the page cache in
/// `cache_dir` ([`pages`]); `None` when it has no such project.
///
/// A file belongs to the release when its version is the pinned one by PEP 440 (`1.0` and
/// `1.0.0` are one); more than one version string matching is for pip to decide.
pub(super) async fn release(
    http: &reqwest::Client,
    index: &str,
    cache_dir: &Path,
    r: &Requirement,
) -> Result<Option<Vec<IndexFile>>, Error> {
    let url = format!("{index}{}/", r.key);
    let parse = |body: &[u8]| -> Result<Project, download::Error> {
        serde_json::from_slice(body).map_err(|source| download::Error::Json {
            url: url.clone(),
            source,
        })
    };
    // Only a kept page that parses is used, or revalidated.
    let cached =
        pages::read(cache_dir, &url).and_then(|page| Some((parse(&page.body).ok()?, page)));
    let cached = match cached {
        Some((project, page)) if page.fresh(pages::now()) => {
            tracing::debug!(%url, "project page from the cache");
            return Ok(Some(release_files(project, &url, r)));
        }
        other => other,
    };
    let mut request = http.get(&url).header(
        reqwest::header::ACCEPT,
        "application/vnd.pypi.simple.v1+json",
    );
    if let Some(etag) = cached.as_ref().and_then(|(_, page)| page.etag()) {
        request = request.header(reqwest::header::IF_NONE_MATCH, etag);
    }
    let resp = request
        .send()
        .await
        .map_err(|source| download::Error::Http {
            url: url.clone(),
            source,
        })?;
    let (status, headers) = (resp.status(), resp.headers().clone());
    let (project, body, etag) = match cached {
        Some((project, page)) if status == StatusCode::NOT_MODIFIED => {
            let etag = page.etag().map(str::to_string);
            (project, page.body, etag)
        }
        _ if status == StatusCode::NOT_FOUND => return Ok(None),
        _ if status.is_success() => {
            let body = download::document(resp, &url, INDEX_LIMIT).await?;
            (parse(&body)?, body, None)
        }
        _ => {
            return Err(download::Error::Status {
                url,
                status: status.as_u16(),
            }
            .into());
        }
    };
    pages::write(cache_dir, &url, &headers, &body, etag.as_deref());
    Ok(Some(release_files(project, &url, r)))
}

/// The wheels of `r`'s release on the project page at `url`.
pub(super) fn release_files(project: Project, url: &str, r: &Requirement) -> Vec<IndexFile> {
    let pinned = Version::parse(&r.version).ok();
    let mut files = Vec::new();
    for f in project.files {
        let Some(version) = f
            .filename
            .strip_suffix(".whl")
            .and_then(|n| n.split('-').nth(1))
        else {
            continue;
        };
        let same = Version::parse(version)
            .ok()
            .zip(pinned.as_ref())
            .is_some_and(|(v, p)| v == *p);
        if !same {
            continue;
        }
        // PEP 691 allows a URL relative to the project's page.
        let Ok(file_url) = url::Url::parse(url).and_then(|page| page.join(&f.url)) else {
            continue;
        };
        files.push(IndexFile {
            filename: f.filename,
            url: file_url.to_string(),
            sha256: f
                .hashes
                .get("sha256")
                .cloned()
                .unwrap_or_default()
                .to_ascii_lowercase(),
            requires_python: f.requires_python,
            yanked: !matches!(
                f.yanked,
                serde_json::Value::Bool(false) | serde_json::Value::Null
            ),
            // A size of 0 is no size (no wheel is empty).
            limit: f.size.filter(|&n| n > 0).unwrap_or(download::LIMIT),
        });
    }
    files
}

/// pip's choice among a release's files: wheels whose tags fit, whose `Requires-Python`
/// admits the runtime and whose hash requirements.txt allows; not yanked first, then the
/// best tag, then the highest build number (none below any). Two files that rank the same
/// are for pip to decide.
pub(super) fn choose(
    r: &Requirement,
    files: &[IndexFile],
    tags: &BTreeMap<String, usize>,
    target: &Target,
) -> Result<IndexFile, String> {
    // (yanked, tag rank, build number highest first): the least is pip's choice.
    type Rank = (bool, usize, std::cmp::Reverse<Option<(u64, String)>>);
    let mut best: Option<(Rank, &IndexFile)> = None;
    let mut tied = false;
    for f in files {
        let Some((build, file_tags)) = wheel_tags(&f.filename) else {
            continue;
        };
        let Some(rank) = file_tags.iter().filter_map(|t| tags.get(t)).min() else {
            continue;
        };
        if let Some(spec) = f
            .requires_python
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            && !python_admits(target, spec, &f.filename)?
        {
            continue;
        }
        if !r.hashes.is_empty() && !r.hashes.contains(&f.sha256) {
            continue;
        }
        let key = (f.yanked, *rank, std::cmp::Reverse(build));
        match &best {
            Some((k, _)) if key == *k => tied = true,
            Some((k, _)) if key > *k => {}
            _ => {
                best = Some((key, f));
                tied = false;
            }
        }
    }
    match best {
        Some((_, f)) if tied => Err(format!(
            "{} and another file of {} {} rank the same",
            f.filename, r.name, r.version
        )),
        Some((_, f)) if f.sha256.len() == 64 && f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(f.clone())
        }
        Some((_, f)) => Err(format!("{} has no SHA-256 on the index", f.filename)),
        None => Err(format!(
            "{} {} has no wheel for CPython {}.{} on manylinux {} (pip would build it from source \
                or report it)",
            r.name, r.version, target.python.0, target.python.1, target.machine
        )),
    }
}

/// A wheel file name's build tag (`None` without one, which ranks below any) and its tags,
/// lower-cased as `packaging` reads them (`name-ver[-build]-py-abi-plat.whl`). `None` for a
/// name `packaging` refuses (a build tag not starting with a digit).
#[allow(clippy::type_complexity)]
fn wheel_tags(filename: &str) -> Option<(Option<(u64, String)>, Vec<String>)> {
    let parts: Vec<&str> = filename.strip_suffix(".whl")?.split('-').collect();
    let (build, py, abi, plat) = match parts.as_slice() {
        [_, _, py, abi, plat] => (None, *py, *abi, *plat),
        [_, _, build, py, abi, plat] => (Some(*build), *py, *abi, *plat),
        _ => return None,
    };
    let build = match build {
        None => None,
        Some(b) => {
            let digits = b.chars().take_while(char::is_ascii_digit).count();
            Some((b[..digits].parse().ok()?, b[digits..].to_string()))
        }
    };
    let mut tags = Vec::new();
    for p in py.split('.') {
        for a in abi.split('.') {
            for l in plat.split('.') {
                tags.push(format!("{p}-{a}-{l}").to_ascii_lowercase());
            }
        }
    }
    Some((build, tags))
}
