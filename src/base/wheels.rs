//! Python wheels for the base images' runtime packages (see [`super::packages`]): pip's
//! resolver pins them at lock time; at build time each is downloaded, checked against its
//! SHA-256 and installed by kiln itself, as pip would install a library, without running
//! anything.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use futures_util::{StreamExt as _, TryStreamExt as _, stream};
use serde::Deserialize;
use sha2::Sha256;

use super::packages::{Error, LockedWheel, Result, run};
use crate::fetch::download;
use crate::io_error::IoContext as _;

/// Resolves `requirements` into exact wheels for CPython `python` on manylinux `machine`
/// (`x86_64`, `aarch64`) with pip's resolver (`--dry-run --report`: nothing is installed),
/// binary wheels only.
///
/// # Errors
/// pip missing or failing, a requirement without a fitting wheel.
pub fn lock_pip(requirements: &[String], python: &str, machine: &str) -> Result<Vec<LockedWheel>> {
    let dir = tempfile::tempdir().at("creating", std::env::temp_dir())?;
    let reqs = dir.path().join("requirements.txt");
    std::fs::write(&reqs, requirements.join("\n") + "\n").at("writing", &reqs)?;
    let abi = format!("cp{}", python.replace('.', ""));
    let report = dir.path().join("report.json");
    let target = dir.path().join("target");
    run(
        "pip install --dry-run --report",
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--quiet",
                "--ignore-installed",
            ])
            .args(["--disable-pip-version-check", "--only-binary=:all:"])
            .args(
                manylinux_platforms(machine)
                    .into_iter()
                    .flat_map(|p| ["--platform".to_string(), p]),
            )
            .args(["--implementation", "cp"])
            .args(["--python-version", python, "--abi", &abi])
            .arg("--target")
            .arg(&target)
            .arg("--report")
            .arg(&report)
            .arg("-r")
            .arg(&reqs)
            .current_dir(dir.path()),
    )?;
    let text = std::fs::read_to_string(&report).at("reading", &report)?;
    parse_pip_report(&text)
}

/// The newest glibc a locked wheel may need: older than any base's (trixie's is 2.41).
const GLIBC_CEILING: u32 = 39;

/// `--platform` values for every manylinux tag up to [`GLIBC_CEILING`], newest first, with the
/// legacy aliases: pip before 24 expands none of them itself, and a wheel tagged only
/// `manylinux_2_17` (most compiled wheels) must still be found.
/// (aarch64 wheels have only `manylinux2014` among them.)
fn manylinux_platforms(machine: &str) -> Vec<String> {
    let legacy: &[&str] = match machine {
        "x86_64" => &["manylinux2014", "manylinux2010", "manylinux1"],
        _ => &["manylinux2014"],
    };
    (17..=GLIBC_CEILING)
        .rev()
        .map(move |minor| format!("manylinux_2_{minor}_{machine}"))
        .chain(legacy.iter().map(|tag| format!("{tag}_{machine}")))
        .collect()
}

#[derive(Deserialize)]
struct PipReport {
    install: Vec<PipInstall>,
}

#[derive(Deserialize)]
struct PipInstall {
    download_info: PipDownload,
    metadata: PipMetadata,
}

#[derive(Deserialize)]
struct PipDownload {
    url: String,
    archive_info: Option<PipArchive>,
}

#[derive(Deserialize)]
struct PipArchive {
    hash: Option<String>,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct PipMetadata {
    name: String,
    version: String,
}

fn parse_pip_report(text: &str) -> Result<Vec<LockedWheel>> {
    let report: PipReport = serde_json::from_str(text).map_err(|e| Error::Output {
        what: "pip's installation report",
        detail: e.to_string(),
    })?;
    let mut wheels = Vec::new();
    for item in report.install {
        let name = item.metadata.name;
        let archive = item.download_info.archive_info;
        let sha256 = archive.and_then(|a| {
            a.hashes.get("sha256").cloned().or_else(|| {
                a.hash
                    .and_then(|h| h.strip_prefix("sha256=").map(str::to_string))
            })
        });
        let Some(sha256) = sha256.filter(|h| is_sha256_hex(h)) else {
            return Err(Error::Output {
                what: "pip's installation report",
                detail: format!("{name} has no SHA-256"),
            });
        };
        if !item.download_info.url.ends_with(".whl") {
            return Err(Error::Output {
                what: "pip's installation report",
                detail: format!("{name} is not a wheel: {}", item.download_info.url),
            });
        }
        wheels.push(LockedWheel {
            name,
            version: item.metadata.version,
            url: item.download_info.url,
            sha256: sha256.to_ascii_lowercase(),
        });
    }
    wheels.sort_by_key(|w| w.name.to_lowercase());
    Ok(wheels)
}

fn is_sha256_hex(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Fetches every wheel (8 at a time) and installs it into `dest` (a `site-packages`).
///
/// # Errors
/// A download that fails verification, a wheel that cannot be unpacked.
pub async fn install_wheels(
    http: &reqwest::Client,
    cache_dir: &Path,
    wheels: &[LockedWheel],
    dest: &Path,
) -> Result<()> {
    let files: Vec<PathBuf> = stream::iter(wheels)
        .map(|w| fetch_wheel(http, cache_dir, w))
        .buffered(8)
        .try_collect()
        .await?;
    let dest = dest.to_path_buf();
    let wheels = wheels.to_vec();
    tokio::task::spawn_blocking(move || -> Result<()> {
        for (w, file) in wheels.iter().zip(files) {
            unpack_wheel(&file, &w.url, &dest)?;
        }
        Ok(())
    })
    .await
    .map_err(|e| {
        Error::Io(crate::io_error::IoError {
            action: "installing wheels into",
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })
    })?
}

/// Downloads a wheel into `cache_dir/wheels/<sha256>.whl` unless it is there, verifying the
/// pinned hash while streaming.
async fn fetch_wheel(http: &reqwest::Client, cache_dir: &Path, w: &LockedWheel) -> Result<PathBuf> {
    if !is_sha256_hex(&w.sha256) {
        return Err(Error::Output {
            what: "lock file",
            detail: format!("wheel {} has sha256 {:?}", w.name, w.sha256),
        });
    }
    let dest = cache_dir.join("wheels").join(format!("{}.whl", w.sha256));
    let expected = hex::decode(&w.sha256).unwrap_or_default();
    download::cached::<Sha256>(http, &w.url, &dest, &expected, download::LIMIT)
        .await
        .map_err(|e| match e {
            download::Error::Mismatch { url, actual } => Error::Hash {
                url,
                expected: w.sha256.clone(),
                actual: hex::encode(actual),
            },
            other => Error::Download(other),
        })
}

/// Installs a wheel's files into `dest` as pip does for a pure or platform library: the
/// archive root and `<dist>.data/purelib|platlib` go to `dest`; scripts, headers and data
/// files are left out (nothing of a runtime library needs them). Members must be plain
/// relative paths; modes are 0644, or 0755 where the archive marks a file executable.
fn unpack_wheel(file: &Path, url: &str, dest: &Path) -> Result<()> {
    let wheel = url.rsplit('/').next().unwrap_or(url).to_string();
    let bad = |detail: String| Error::Wheel {
        wheel: wheel.clone(),
        detail,
    };
    let f = std::fs::File::open(file).at("opening", file)?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| bad(e.to_string()))?;
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        let name = member.name().map_err(|e| bad(e.to_string()))?.into_owned();
        if member.is_dir() {
            continue;
        }
        let rel = Path::new(&name);
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(bad(format!("member {name:?} leaves its directory")));
        }
        let mut parts = rel.components();
        let first = parts
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned());
        let rel: PathBuf = match first {
            Some(top) if top.ends_with(".data") => {
                let scheme = parts
                    .next()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned());
                match scheme.as_deref() {
                    Some("purelib" | "platlib") => parts.collect(),
                    _ => continue,
                }
            }
            _ => rel.to_path_buf(),
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        if member.is_symlink() {
            return Err(bad(format!("member {name:?} is a symlink")));
        }
        let target = dest.join(&rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).at("creating", parent)?;
        }
        let mut bytes = Vec::new();
        member
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("reading {name}: {e}")))?;
        std::fs::write(&target, &bytes).at("writing", &target)?;
        let executable = member.unix_mode().is_some_and(|m| m & 0o111 != 0);
        let mode = if executable { 0o755 } else { 0o644 };
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .at("setting the mode of", &target)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_pip_report_gives_hashed_wheels_only() {
        let h = "a".repeat(64);
        let ok = format!(
            r#"{{"install":[
                {{"download_info":{{"url":"https://f/x/b-1-py3-none-any.whl",
                  "archive_info":{{"hash":"sha256={h}"}}}},
                  "metadata":{{"name":"b","version":"1"}}}},
                {{"download_info":{{"url":"https://f/x/A-2-py3-none-any.whl",
                  "archive_info":{{"hashes":{{"sha256":"{h}"}}}}}},
                  "metadata":{{"name":"A","version":"2"}}}}]}}"#
        );
        let wheels = parse_pip_report(&ok).unwrap();
        assert_eq!(
            wheels.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["A", "b"]
        );
        let sdist = ok.replace("b-1-py3-none-any.whl", "b-1.tar.gz");
        assert!(
            parse_pip_report(&sdist)
                .unwrap_err()
                .to_string()
                .contains("not a wheel")
        );
    }

    #[test]
    fn a_wheel_installs_its_library_and_leaves_out_scripts() {
        let whl = crate::testing::wheel(&[
            ("pkg/__init__.py", b"x = 1\n", 0o644),
            ("pkg/tool.so", b"ELF", 0o755),
            ("pkg-1.dist-info/METADATA", b"Name: pkg\n", 0o644),
            ("pkg-1.data/purelib/extra.py", b"y = 2\n", 0o644),
            ("pkg-1.data/scripts/pkg", b"#!python\n", 0o755),
        ]);
        let dest = tempfile::tempdir().unwrap();
        unpack_wheel(whl.path(), "https://f/pkg-1-py3-none-any.whl", dest.path()).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &str| {
            std::fs::metadata(dest.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("pkg/__init__.py"), 0o644);
        assert_eq!(mode("pkg/tool.so"), 0o755);
        assert!(dest.path().join("pkg-1.dist-info/METADATA").is_file());
        assert_eq!(
            std::fs::read(dest.path().join("extra.py")).unwrap(),
            b"y = 2\n"
        );
        assert!(!dest.path().join("pkg-1.data").exists());
        assert!(
            !dest
                .path()
                .join("pkg")
                .join("..")
                .join("pkg-1.data")
                .exists()
        );
    }

    #[test]
    fn a_wheel_member_that_leaves_its_directory_is_refused() {
        let whl = crate::testing::wheel(&[("../evil.py", b"x", 0o644)]);
        let dest = tempfile::tempdir().unwrap();
        let e = unpack_wheel(whl.path(), "https://f/evil-1-py3-none-any.whl", dest.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("evil-1-py3-none-any.whl") && e.contains("leaves"),
            "{e}"
        );
        assert!(!dest.path().parent().unwrap().join("evil.py").exists());
    }
}
