//! Root filesystems shared by layer chain: the base part of a Function image is unpacked once
//! and copied, by hard links, into the rootfs of every image on that base, so that running a
//! new image of a Function (a rebuild, a rebase) unpacks only the Function's own layers.
//!
//! A prefix is keyed by the OCI chain ID of its layers
//! (<https://github.com/opencontainers/image-spec/blob/main/config.md#layer-chainid>), made of
//! the uncompressed layers' digests: each of them was checked while the prefix was unpacked, so
//! an image that claims the same diff_ids has those very layers below its own. It is stored as
//! the unpacker left it between two layers: directories writable, their modes and times in
//! `pending.json` ([`Pending`]), no mount points. A copy shares every file with it; that is safe
//! because nothing writes into a file of an unpacked tree: the unpacker unlinks whatever it
//! replaces, and the sandbox mounts the root read-only.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, symlink};
use std::path::Path;
use std::time::SystemTime;

use crate::oci::image::{DEPS_HISTORY, SOURCE_HISTORY};
use crate::oci::{Digest, ImageConfig};

/// The chain ID of every prefix of `diff_ids`: the first is the first layer's diff_id, each
/// next one the digest of the one before, a space, and the layer's diff_id.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut chains: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match chains.last() {
            None => diff_id.clone(),
            Some(below) => Digest::of(format!("{below} {diff_id}").as_bytes()),
        };
        chains.push(next);
    }
    chains
}

/// How many of the image's `layers` are its base's: those below the first layer kiln added
/// for a Function (its history says `kiln: dependencies (…)` or `kiln: source (…)`). `None`
/// for an image kiln did not build, or a history that does not match the layers.
pub fn base_layers(config: &ImageConfig, layers: usize) -> Option<usize> {
    let history: Vec<&str> = config
        .history
        .iter()
        .filter(|h| h.empty_layer != Some(true))
        .map(|h| h.created_by.as_deref().unwrap_or_default())
        .collect();
    if history.len() != layers {
        return None;
    }
    history
        .iter()
        .position(|by| by.starts_with(DEPS_HISTORY) || by.starts_with(SOURCE_HISTORY))
        .filter(|&base| base > 0)
}

/// Copies the tree `from` into the existing directory `to`: directories anew (mode 0755 under
/// the umask, so that later layers can change them), every file as a hard link to the same
/// inode (a copy when the file has as many links as the file system allows), symlinks as
/// symlinks. Returns the entries copied.
///
/// # Errors
/// A tree that cannot be read or written.
pub fn clone_tree(from: &Path, to: &Path) -> io::Result<u64> {
    let mut copied = 0;
    let mut dirs = vec![(from.to_path_buf(), to.to_path_buf())];
    let mut builder = fs::DirBuilder::new();
    builder.mode(0o755);
    while let Some((from_dir, to_dir)) = dirs.pop() {
        for entry in fs::read_dir(&from_dir)? {
            let entry = entry?;
            let (source, dest) = (entry.path(), to_dir.join(entry.file_name()));
            let kind = entry.file_type()?;
            if kind.is_dir() {
                builder.create(&dest)?;
                dirs.push((source, dest));
            } else if kind.is_symlink() {
                symlink(fs::read_link(&source)?, &dest)?;
            } else {
                link_or_copy(&source, &dest)?;
            }
            copied += 1;
        }
    }
    Ok(copied)
}

/// Hard-links `source` at `dest`, or copies it (mode and modification time kept) when it has
/// as many links as the file system allows.
fn link_or_copy(source: &Path, dest: &Path) -> io::Result<()> {
    match fs::hard_link(source, dest) {
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::MLINK.raw_os_error()) => {
            let meta = source.symlink_metadata()?;
            fs::copy(source, dest)?;
            let mtime = SystemTime::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(meta.mtime()).unwrap_or(0),
                    u32::try_from(meta.mtime_nsec()).unwrap_or(0),
                );
            fs::File::options()
                .write(true)
                .open(dest)
                .and_then(|f| f.set_modified(mtime))
        }
        linked => linked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::unpack::tests::{E, gzip, tar, unpack};
    use crate::run::unpack::{DEFAULT_LIMIT, ENTRY_COST, Unpacker};
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn chain_ids_follow_the_image_spec() {
        let (a, b, c) = (Digest::of(b"a"), Digest::of(b"b"), Digest::of(b"c"));
        let chains = chain_ids(&[a.clone(), b.clone(), c.clone()]);
        let ab = Digest::of(format!("{a} {b}").as_bytes());
        assert_eq!(
            chains,
            [a, ab.clone(), Digest::of(format!("{ab} {c}").as_bytes())]
        );
        assert!(chain_ids(&[]).is_empty());
    }

    fn config(history: &[(&str, bool)]) -> ImageConfig {
        let history: Vec<_> = history
            .iter()
            .map(|(by, empty)| serde_json::json!({"created_by": by, "empty_layer": empty}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
            "history": history,
        }))
        .unwrap()
    }

    #[test]
    fn the_base_ends_below_the_first_layer_kiln_added_for_the_function() {
        let with_deps = config(&[
            ("debian packages", false),
            ("ENV", true),
            ("node", false),
            ("kiln: dependencies (npm ci, key sha256:00)", false),
            ("kiln: source (2 files to /usr/src/app/function)", false),
        ]);
        assert_eq!(base_layers(&with_deps, 4), Some(2));
        let source_only = config(&[("base", false), ("kiln: source (1 file to /app)", false)]);
        assert_eq!(base_layers(&source_only, 2), Some(1));
        // Not kiln's, no base below, or a history that does not match the layers.
        assert_eq!(base_layers(&config(&[("a", false), ("b", false)]), 2), None);
        assert_eq!(
            base_layers(&config(&[("kiln: source (x)", false)]), 1),
            None
        );
        assert_eq!(base_layers(&source_only, 3), None);
    }

    #[test]
    fn a_clone_shares_files_copies_links_and_makes_its_own_writable_directories() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        fs::create_dir_all(from.join("usr/bin")).unwrap();
        fs::write(from.join("usr/bin/node"), "binary").unwrap();
        symlink("node", from.join("usr/bin/nodejs")).unwrap();
        fs::hard_link(from.join("usr/bin/node"), from.join("usr/bin/also")).unwrap();
        fs::set_permissions(from.join("usr"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::create_dir(&to).unwrap();
        assert_eq!(clone_tree(&from, &to).unwrap(), 5);
        let node = to.join("usr/bin/node").metadata().unwrap();
        assert_eq!(
            node.ino(),
            from.join("usr/bin/node").metadata().unwrap().ino()
        );
        assert_eq!(
            node.ino(),
            to.join("usr/bin/also").metadata().unwrap().ino()
        );
        assert_eq!(
            fs::read_link(to.join("usr/bin/nodejs")).unwrap(),
            Path::new("node")
        );
        let usr = to.join("usr").metadata().unwrap();
        assert_eq!(
            usr.permissions().mode() & 0o700,
            0o700,
            "writable by its owner"
        );
        assert_ne!(usr.ino(), from.join("usr").metadata().unwrap().ino());
    }

    /// Every entry under `root`: path, kind, mode, contents or link target, and a directory's
    /// modification time.
    fn listing(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                let name = path.strip_prefix(root).unwrap().display().to_string();
                let mode = meta.mode() & 0o7777;
                out.push(if meta.is_dir() {
                    dirs.push(path.clone());
                    format!("{name}/ {mode:o} {}", meta.mtime())
                } else if meta.file_type().is_symlink() {
                    format!("{name} -> {}", fs::read_link(&path).unwrap().display())
                } else {
                    format!("{name} {mode:o} {:?}", fs::read_to_string(&path).unwrap())
                });
            }
        }
        out.sort();
        out
    }

    #[test]
    fn going_on_from_a_copy_of_a_prefix_gives_the_tree_of_one_unpack_and_leaves_the_prefix() {
        let lower = tar(&[
            E::Dir("etc/", 0o555),
            E::File("etc/gone", "gone", 0o644),
            E::File("etc/kept", "old", 0o444),
            E::Dir("usr/bin/", 0o711),
            E::File("usr/bin/tool", "tool", 0o755),
            E::Link("usr/bin/sh", "tool"),
            E::Hard("usr/bin/again", "usr/bin/tool"),
        ]);
        let upper = tar(&[
            E::File("etc/.wh.gone", "", 0o644),
            E::File("etc/kept", "new", 0o600),
            E::Dir("usr/bin/", 0o755),
            E::File("usr/bin/tool", "patched", 0o755),
            E::File("app/index.js", "main", 0o644),
        ]);
        let (whole, done) = unpack(&[lower.clone(), upper.clone()]);
        done.unwrap();

        let dir = tempfile::tempdir().unwrap();
        let (prefix, copy) = (dir.path().join("prefix"), dir.path().join("copy"));
        fs::create_dir(&prefix).unwrap();
        let mut first = Unpacker::new(&prefix);
        first.apply(&gzip(&lower)[..]).unwrap();
        let pending = first.pending();
        let before = listing(&prefix);
        fs::create_dir(&copy).unwrap();
        clone_tree(&prefix, &copy).unwrap();
        let mut next = Unpacker::resume(&copy, DEFAULT_LIMIT, &pending).unwrap();
        next.apply(&gzip(&upper)[..]).unwrap();
        next.finish().unwrap();

        assert_eq!(listing(&copy), listing(whole.path()));
        assert_eq!(
            listing(&prefix),
            before,
            "the prefix is as the lower layer left it"
        );
        assert!(
            before.contains(&"etc/kept 444 \"old\"".to_string()),
            "{before:?}"
        );
        // What the lower layer used counts against the caps of the copy too.
        let used = 7 * ENTRY_COST + 11;
        assert!(Unpacker::resume(&copy, used, &pending).is_some());
        assert!(Unpacker::resume(&copy, used - 1, &pending).is_none());
    }
}
