//! Unit tests of layer application with synthetic tar layers.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;

use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

use super::*;

/// An entry of a synthetic layer (also for `super::super::chain`'s tests).
pub(crate) enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a str, u32),
    Link(&'a str, &'a str),
    Hard(&'a str, &'a str),
}

/// A header whose name is written raw, so tests can build entries `tar::Builder` refuses.
fn header(name: &str, kind: EntryType, mode: u32, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(946_684_800);
    h.set_cksum();
    h
}

pub(crate) fn tar(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        match *e {
            E::Dir(name, mode) => {
                let h = header(name, EntryType::Directory, mode, 0);
                b.append(&h, io::empty()).unwrap();
            }
            E::File(name, body, mode) => {
                let h = header(name, EntryType::Regular, mode, body.len() as u64);
                b.append(&h, body.as_bytes()).unwrap();
            }
            E::Link(name, target) | E::Hard(name, target) => {
                let kind = match e {
                    E::Link(..) => EntryType::Symlink,
                    _ => EntryType::Link,
                };
                let mut h = header(name, kind, 0o777, 0);
                h.set_link_name(target).unwrap();
                h.set_cksum();
                b.append(&h, io::empty()).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

pub(crate) fn unpack(layers: &[Vec<u8>]) -> (tempfile::TempDir, Result<()>) {
    let dir = tempfile::tempdir().unwrap();
    let mut u = Unpacker::new(dir.path());
    for layer in layers {
        if let Err(e) = u.apply(&gzip(layer)[..]) {
            return (dir, Err(e));
        }
    }
    let done = u.finish();
    (dir, done)
}

#[test]
fn files_directories_and_links_keep_modes_without_setuid_bits() {
    let layer = tar(&[
        E::Dir("./", 0o755),
        E::Dir("./bin/", 0o750),
        E::File("./bin/tool", "#!/bin/sh\n", 0o4755),
        E::File("./bin/data", "d", 0o640),
        E::Link("./bin/sh", "tool"),
        E::Hard("./bin/again", "./bin/tool"),
    ]);
    let (dir, done) = unpack(&[layer]);
    done.unwrap();
    let root = dir.path();
    let mode = |p: &str| fs::symlink_metadata(root.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("bin"), 0o750);
    assert_eq!(mode("bin/tool"), 0o755);
    assert_eq!(mode("bin/data"), 0o640);
    assert_eq!(
        fs::read_link(root.join("bin/sh")).unwrap(),
        Path::new("tool")
    );
    let ino = |p: &str| fs::metadata(root.join(p)).unwrap().ino();
    assert_eq!(ino("bin/again"), ino("bin/tool"));
    let mtime = fs::metadata(root.join("bin/data")).unwrap().mtime();
    assert_eq!(mtime, 946_684_800);
    assert_eq!(fs::metadata(root.join("bin")).unwrap().mtime(), 946_684_800);
}

#[test]
fn whiteouts_delete_lower_entries_and_opaque_markers_clear_lower_directories() {
    let lower = tar(&[
        E::Dir("etc/", 0o755),
        E::File("etc/gone", "x", 0o644),
        E::File("etc/kept", "x", 0o644),
        E::Dir("app/", 0o755),
        E::File("app/old.js", "old", 0o644),
        E::Dir("app/lib/", 0o755),
        E::File("app/lib/a.js", "a", 0o644),
    ]);
    let upper = tar(&[
        E::File("etc/.wh.gone", "", 0o644),
        E::File("etc/.wh.never-existed", "", 0o644),
        E::Dir("app/", 0o700),
        E::File("app/new.js", "new", 0o644),
        // After a sibling from this layer: it must survive the opaque marker.
        E::File("app/.wh..wh..opq", "", 0o644),
    ]);
    let (dir, done) = unpack(&[lower, upper]);
    done.unwrap();
    let root = dir.path();
    assert!(!root.join("etc/gone").exists());
    assert!(!root.join("etc/.wh.gone").exists());
    assert!(root.join("etc/kept").exists());
    assert!(!root.join("app/old.js").exists());
    assert!(!root.join("app/lib").exists());
    assert_eq!(fs::read_to_string(root.join("app/new.js")).unwrap(), "new");
    assert!(!root.join("app/.wh..wh..opq").exists());
    assert_eq!(
        fs::metadata(root.join("app")).unwrap().mode() & 0o777,
        0o700
    );
}

#[test]
fn names_tar_and_containerd_accept_are_accepted() {
    // umoci's `/` root entry, absolute and `./` names, folded `..`, a repeated entry (the
    // later wins) and a hard link to an earlier entry by its absolute name.
    let layer = tar(&[
        E::Dir("/", 0o755),
        E::Dir(".", 0o755),
        E::Dir("/etc/", 0o755),
        E::File("/etc/os-release", "first", 0o644),
        E::File("./etc/os-release", "second", 0o644),
        E::File("etc/sub/../motd", "hi", 0o644),
        E::Hard("/etc/again", "/etc/os-release"),
    ]);
    let (dir, done) = unpack(&[layer]);
    done.unwrap();
    let root = dir.path();
    assert_eq!(
        fs::read_to_string(root.join("etc/os-release")).unwrap(),
        "second"
    );
    assert_eq!(fs::read_to_string(root.join("etc/motd")).unwrap(), "hi");
    assert_eq!(
        fs::read_to_string(root.join("etc/again")).unwrap(),
        "second"
    );
}

#[test]
fn entries_that_climb_above_the_root_are_refused_with_their_name() {
    for name in ["../evil", "a/../../evil", "/../evil"] {
        let (_dir, done) = unpack(&[tar(&[E::File(name, "x", 0o644)])]);
        let err = done.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Path {
                    source: rootpath::Error::AboveRoot(_),
                    ..
                }
            ),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
    let (_dir, done) = unpack(&[tar(&[E::Hard("link", "../../etc/passwd")])]);
    assert!(matches!(
        done,
        Err(Error::Path {
            source: rootpath::Error::AboveRoot(_),
            ..
        })
    ));
}

#[test]
fn a_layer_may_not_write_through_a_symlink_it_made() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap();
    for (link, through) in [("evil", "/"), ("evil", target), ("evil", "../../..")] {
        let layer = tar(&[
            E::Link(link, through),
            E::File(&format!("{link}/etc/x"), "x", 0o644),
        ]);
        let (dir, done) = unpack(&[layer]);
        let err = done.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Path {
                    source: rootpath::Error::ThroughOwnLink { .. },
                    ..
                }
            ),
            "{through}: {err:?}"
        );
        assert!(err.to_string().contains("evil/etc/x"), "{err}");
        assert!(!dir.path().join("etc/x").exists());
        // Nor a hard link through it.
        let layer = tar(&[E::Link("evil", through), E::Hard("h", "evil/etc/passwd")]);
        let (_dir, done) = unpack(&[layer]);
        assert!(matches!(done, Err(Error::Path { .. })), "{done:?}");
    }
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    // A link the layer made and then replaced with a directory is a directory again.
    let layer = tar(&[
        E::Link("d", "/"),
        E::Dir("d/", 0o755),
        E::File("d/f", "x", 0o644),
    ]);
    let (dir, done) = unpack(&[layer]);
    done.unwrap();
    assert!(dir.path().join("d/f").is_file());
}

#[test]
fn whiteouts_of_dot_and_dot_dot_are_refused_and_remove_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir(&root).unwrap();
    fs::write(dir.path().join("sibling"), "outside").unwrap();
    for name in ["a/.wh...", "a/.wh..", ".wh...", ".wh."] {
        let mut u = Unpacker::new(&root);
        u.apply(&tar(&[E::Dir("a/", 0o755), E::File("a/f", "x", 0o644)])[..])
            .unwrap();
        let err = u.apply(&tar(&[E::File(name, "", 0o644)])[..]).unwrap_err();
        assert!(matches!(err, Error::BadWhiteout(_)), "{name}: {err:?}");
        assert!(root.join("a/f").is_file(), "{name}");
        assert!(dir.path().join("sibling").is_file(), "{name}");
    }
}

#[test]
fn device_nodes_are_refused_with_their_name() {
    let mut b = tar::Builder::new(Vec::new());
    let h = header("dev/sda", EntryType::Block, 0o660, 0);
    b.append(&h, io::empty()).unwrap();
    let (_dir, done) = unpack(&[b.into_inner().unwrap()]);
    let err = done.unwrap_err();
    assert!(matches!(err, Error::Device(_)), "{err:?}");
    assert!(err.to_string().contains("dev/sda"), "{err}");
}

#[test]
fn the_unpacked_size_is_capped_across_layers() {
    // Each entry costs its contents and ENTRY_COST.
    let limit = 2 * ENTRY_COST + 10;
    let dir = tempfile::tempdir().unwrap();
    let mut u = Unpacker::with_limit(dir.path(), limit);
    u.apply(&gzip(&tar(&[E::File("a", "123456", 0o644)]))[..])
        .unwrap();
    let err = u
        .apply(&gzip(&tar(&[E::File("b", "12345", 0o644)]))[..])
        .unwrap_err();
    assert!(
        matches!(&err, Error::TooLarge { limit: l, name } if *l == limit && name == Path::new("b")),
        "{err:?}"
    );
    // Exactly at the cap is fine.
    let dir = tempfile::tempdir().unwrap();
    let mut u = Unpacker::with_limit(dir.path(), ENTRY_COST + 10);
    u.apply(&tar(&[E::File("a", "1234567890", 0o644)])[..])
        .unwrap();
}

#[test]
fn entries_cost_their_metadata_and_their_number_is_capped() {
    // A small layer of empty directories: nothing in bytes of contents.
    let dirs: Vec<String> = (0..10_000).map(|i| format!("d{i}")).collect();
    let entries: Vec<E> = dirs.iter().map(|d| E::Dir(d, 0o755)).collect();
    let layer = gzip(&tar(&entries));
    assert!(layer.len() < 200_000, "{}", layer.len());
    let dir = tempfile::tempdir().unwrap();
    let err = Unpacker::with_limit(dir.path(), 4 << 20)
        .apply(&layer[..])
        .unwrap_err();
    assert!(matches!(&err, Error::TooLarge { .. }), "{err:?}");
    let made = std::fs::read_dir(dir.path()).unwrap().count() as u64;
    assert!(made <= (4 << 20) / ENTRY_COST, "{made} directories made");
    // The number of entries has a cap and a message of its own.
    let dir = tempfile::tempdir().unwrap();
    let err = Unpacker::new(dir.path())
        .max_entries(100)
        .apply(&layer[..])
        .unwrap_err();
    assert!(
        matches!(&err, Error::TooManyEntries { limit: 100, name } if name == Path::new("d100")),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("the image has more than 100 entries (at \"d100\")"),
        "{err}"
    );
}

#[test]
fn writes_through_symlinks_stay_inside_the_root() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap();
    let lower = tar(&[
        E::Link("escape", target),
        E::Link("up", "../../../.."),
        E::Link("file", &format!("{target}/victim")),
    ]);
    let upper = tar(&[
        E::File("escape/pwned", "x", 0o644),
        E::File("up/pwned2", "x", 0o644),
        E::File("file", "replaced", 0o644),
    ]);
    let (dir, done) = unpack(&[lower, upper]);
    done.unwrap();
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    let root = dir.path();
    let inside = root.join(target.trim_start_matches('/')).join("pwned");
    assert!(inside.is_file(), "{}", inside.display());
    assert!(root.join("pwned2").is_file());
    let file = fs::symlink_metadata(root.join("file")).unwrap();
    assert!(file.is_file());
}

#[test]
fn later_layers_replace_files_with_directories_and_back() {
    let lower = tar(&[
        E::Dir("d/", 0o555),
        E::File("d/f", "x", 0o444),
        E::File("plain", "x", 0o644),
    ]);
    let middle = tar(&[E::File("d/g", "y", 0o644), E::Dir("plain/", 0o755)]);
    let upper = tar(&[E::File("d", "now a file", 0o644)]);
    let (dir, done) = unpack(&[lower.clone(), middle.clone()]);
    done.unwrap();
    assert!(dir.path().join("d/g").is_file());
    assert_eq!(
        fs::metadata(dir.path().join("d")).unwrap().mode() & 0o777,
        0o555
    );
    assert!(dir.path().join("plain").is_dir());
    let (dir, done) = unpack(&[lower, middle, upper]);
    done.unwrap();
    let d = dir.path().join("d");
    assert_eq!(fs::read_to_string(&d).unwrap(), "now a file");
    assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o644);
}

#[test]
fn digests_cover_the_compressed_blob_and_the_whole_tar_stream() {
    let layer = tar(&[E::File("a", "hello", 0o644)]);
    let blob = gzip(&layer);
    let dir = tempfile::tempdir().unwrap();
    let mut u = Unpacker::new(dir.path());
    let applied = u.apply(&blob[..]).unwrap();
    assert_eq!(applied.digest, Digest::of(&blob));
    assert_eq!(applied.size, blob.len() as u64);
    assert_eq!(applied.diff_id, Digest::of(&layer));
    let plain = u.apply(&layer[..]).unwrap();
    assert_eq!(plain.digest, Digest::of(&layer));
    assert_eq!(plain.diff_id, Digest::of(&layer));
}

/// The decoding thread runs ahead of the writer by a few chunks: a layer many times that
/// size, refused at its first entry, must end with the writer's error (not wait for ever on
/// the decoder), and a layer whose compressed stream breaks halfway must report that.
#[test]
fn a_layer_refused_early_or_broken_halfway_ends_with_its_error() {
    let big = "x".repeat(3 * PIPELINE_CHUNKS * CHUNK);
    let refused = tar(&[
        E::File("../escape", "x", 0o644),
        E::File("big", &big, 0o644),
    ]);
    let (dir, done) = unpack(&[refused]);
    assert!(matches!(done, Err(Error::Path { .. })), "{done:?}");
    assert!(!dir.path().join("big").exists());

    let layer = tar(&[E::File("big", &big, 0o644), E::File("after", "x", 0o644)]);
    let mut blob = gzip(&layer);
    let middle = blob.len() / 2;
    blob[middle..middle + 64].fill(0xff);
    let dir = tempfile::tempdir().unwrap();
    let err = Unpacker::new(dir.path()).apply(&blob[..]).unwrap_err();
    assert!(matches!(err, Error::Archive(_)), "{err:?}");
    assert!(!dir.path().join("after").exists());

    let mut truncated = gzip(&layer);
    truncated.truncate(truncated.len() / 2);
    let dir = tempfile::tempdir().unwrap();
    let err = Unpacker::new(dir.path()).apply(&truncated[..]).unwrap_err();
    assert!(matches!(err, Error::Archive(_)), "{err:?}");
}

#[test]
fn zstd_layers_unpack_and_dangling_hard_links_are_errors() {
    let layer = tar(&[E::File("z", "zstd", 0o644)]);
    let blob =
        ruzstd::encoding::compress_to_vec(&layer[..], ruzstd::encoding::CompressionLevel::Fastest);
    let dir = tempfile::tempdir().unwrap();
    let applied = Unpacker::new(dir.path()).apply(&blob[..]).unwrap();
    assert_eq!(applied.digest, Digest::of(&blob));
    assert_eq!(applied.diff_id, Digest::of(&layer));
    assert_eq!(fs::read_to_string(dir.path().join("z")).unwrap(), "zstd");
    let (_dir, done) = unpack(&[tar(&[E::Hard("b", "a")])]);
    assert!(matches!(done, Err(Error::DanglingHardLink { .. })));
}

#[test]
fn make_writable_lets_a_read_only_tree_be_removed() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("a/b");
    fs::create_dir_all(&sub).unwrap();
    fs::write(sub.join("f"), "x").unwrap();
    fs::set_permissions(&sub, Permissions::from_mode(0o500)).unwrap();
    fs::set_permissions(dir.path().join("a"), Permissions::from_mode(0o500)).unwrap();
    make_writable(&dir.path().join("a")).unwrap();
    fs::remove_dir_all(dir.path().join("a")).unwrap();
}

#[test]
fn gnu_and_pax_long_names_and_link_targets_unpack() {
    let deep = format!("{}/file", "d".repeat(120));
    let target = format!("../{}", "t".repeat(150));
    let mut b = tar::Builder::new(Vec::new());
    // GNU: tar-rs writes a ././@LongLink entry for names over 100 bytes.
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(3);
    b.append_data(&mut h, &deep, &b"gnu"[..]).unwrap();
    // PAX: a path and linkpath record before a ustar header with truncated names.
    b.append_pax_extensions([
        ("path", "pax/".to_string().repeat(30).as_bytes()),
        ("linkpath", target.as_bytes()),
    ])
    .unwrap();
    let mut h = Header::new_ustar();
    h.set_path("truncated").unwrap();
    h.set_entry_type(EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    h.set_cksum();
    b.append(&h, io::empty()).unwrap();
    let (dir, done) = unpack(&[b.into_inner().unwrap()]);
    done.unwrap();
    let root = dir.path();
    assert_eq!(fs::read_to_string(root.join(&deep)).unwrap(), "gnu");
    let link = root.join("pax/".repeat(30).trim_end_matches('/'));
    assert_eq!(fs::read_link(&link).unwrap(), Path::new(&target));
    assert!(!root.join("truncated").exists());
}

#[test]
fn a_layer_with_a_long_name_or_skipped_data_past_its_window_is_refused() {
    // A 20 MiB long name (the tar reader would hold it whole) and a FIFO carrying 20 MiB
    // (decompressed only to be skipped): neither is file data, so neither meets the cap on
    // what is written.
    let big = vec![b'a'; 20 << 20];
    for kind in [EntryType::GNULongName, EntryType::Fifo] {
        let mut b = tar::Builder::new(Vec::new());
        let h = header("././@LongLink", kind, 0o644, big.len() as u64);
        b.append(&h, &big[..]).unwrap();
        let h = header("after", EntryType::Regular, 0o644, 1);
        b.append(&h, &b"x"[..]).unwrap();
        let (_dir, done) = unpack(&[b.into_inner().unwrap()]);
        let err = format!("{:#}", anyhow::Error::new(done.unwrap_err()));
        assert!(err.contains("16 MiB of headers"), "{kind:?}: {err}");
    }
    // A 20 MiB file is data, and unpacks.
    let (dir, done) = unpack(&[tar(&[E::File(
        "big",
        std::str::from_utf8(&big).unwrap(),
        0o644,
    )])]);
    done.unwrap();
    assert_eq!(
        fs::metadata(dir.path().join("big")).unwrap().len(),
        20 << 20
    );
}

#[test]
fn more_than_16_mib_after_the_end_of_the_archive_is_refused() {
    let mut layer = tar(&[E::File("a", "x", 0o644)]);
    layer.extend(vec![0u8; 1 << 20]);
    let (_dir, done) = unpack(&[layer.clone()]);
    done.unwrap();
    layer.extend(vec![0u8; 16 << 20]);
    let (_dir, done) = unpack(&[layer]);
    let err = format!("{:#}", anyhow::Error::new(done.unwrap_err()));
    assert!(err.contains("follows the end of the archive"), "{err}");
}

#[test]
fn a_sparse_file_unpacks_with_its_holes_and_its_stored_data_counts_as_data() {
    /// `value` as a tar octal field of `N` bytes.
    fn octal<const N: usize>(value: u64) -> [u8; N] {
        let mut field = [0u8; N];
        let text = format!("{value:0width$o}", width = N - 1);
        field[..N - 1].copy_from_slice(text.as_bytes());
        field
    }
    // 20 MiB stored at offset 0 and 512 bytes at 60 MiB: more stored data than one entry's
    // metadata may take, so it passes only if it is counted as file data.
    let (first, second, at) = (20u64 << 20, 512u64, 60u64 << 20);
    let mut h = header("sparse", EntryType::GNUSparse, 0o644, first + second);
    let gnu = h.as_gnu_mut().unwrap();
    gnu.sparse[0].offset = octal(0);
    gnu.sparse[0].numbytes = octal(first);
    gnu.sparse[1].offset = octal(at);
    gnu.sparse[1].numbytes = octal(second);
    gnu.realsize = octal(at + second);
    h.set_cksum();
    let mut data = vec![b'a'; usize::try_from(first).unwrap()];
    data.extend(vec![b'b'; usize::try_from(second).unwrap()]);
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &data[..]).unwrap();
    let (dir, done) = unpack(&[b.into_inner().unwrap()]);
    done.unwrap();
    let bytes = fs::read(dir.path().join("sparse")).unwrap();
    assert_eq!(bytes.len() as u64, at + second);
    assert!(bytes[..(first as usize)].iter().all(|&c| c == b'a'));
    assert!(
        bytes[(first as usize)..(at as usize)]
            .iter()
            .all(|&c| c == 0)
    );
    assert!(bytes[(at as usize)..].iter().all(|&c| c == b'b'));
}
