//! Tests of .deb unpacking on synthetic packages built here with the `ar` and `tar` crates,
//! including crafted entries that try to leave the root.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;

/// One tar entry of a synthetic data.tar.
enum Item<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

/// A tar header with `path` written raw, so tests can put `..` and absolute paths in it
/// (the tar crate's own setters refuse them).
fn header(path: &str, kind: EntryType, size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_mtime(1_700_000_000);
    header
}

fn data_tar(items: &[Item<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for item in items {
        let (mut header, content): (tar::Header, &[u8]) = match item {
            Item::Dir(path) => (header(path, EntryType::Directory, 0, 0o755), b""),
            Item::File(path, content, mode) => (
                header(path, EntryType::Regular, content.len() as u64, *mode),
                content,
            ),
            Item::Symlink(path, target) | Item::Hardlink(path, target) => {
                let kind = match item {
                    Item::Symlink(..) => EntryType::Symlink,
                    _ => EntryType::Link,
                };
                let mut h = header(path, kind, 0, 0o777);
                h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
                (h, b"")
            }
        };
        header.set_cksum();
        builder.append(&header, content).unwrap();
    }
    builder.into_inner().unwrap()
}

/// A .deb file (`debian-binary`, `control.tar.gz`, `data.tar<ext>`) in `dir`.
fn make_deb(dir: &Path, name: &str, ext: &str, items: &[Item<'_>]) -> PathBuf {
    let tar = data_tar(items);
    let data = match ext {
        ".xz" => {
            let mut enc = liblzma::write::XzEncoder::new(Vec::new(), 6);
            enc.write_all(&tar).unwrap();
            enc.finish().unwrap()
        }
        ".gz" => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&tar).unwrap();
            enc.finish().unwrap()
        }
        ".zst" => {
            ruzstd::encoding::compress_to_vec(&tar[..], ruzstd::encoding::CompressionLevel::Fastest)
        }
        _ => tar,
    };
    let path = dir.join(name);
    let mut ar = ar::Builder::new(File::create(&path).unwrap());
    let mut add = |name: &str, bytes: &[u8]| {
        let header = ar::Header::new(name.as_bytes().to_vec(), bytes.len() as u64);
        ar.append(&header, bytes).unwrap();
    };
    add("debian-binary", b"2.0\n");
    add("control.tar.gz", &[]);
    if !ext.is_empty() || !items.is_empty() {
        add(&format!("data.tar{ext}"), &data);
    }
    path
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap()
}

#[test]
fn files_links_and_modes_unpack_under_merged_usr() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    fs::create_dir(&root).unwrap();
    merged_usr_links(&root).unwrap();
    merged_usr_links(&root).unwrap(); // idempotent
    let items = [
        Item::Dir("./"),
        Item::Dir("./lib/"),
        Item::Dir("./lib/x86_64-linux-gnu/"),
        Item::File("./lib/x86_64-linux-gnu/libfoo.so.1", b"elf", 0o644),
        Item::Dir("./usr/bin/"),
        Item::File("./usr/bin/tool", b"#!/bin/sh\n", 0o755),
        Item::Hardlink("./usr/bin/tool2", "./usr/bin/tool"),
        Item::Symlink("./usr/bin/alias", "tool"),
    ];
    for (i, ext) in ["", ".gz", ".xz", ".zst"].iter().enumerate() {
        let deb = make_deb(work.path(), &format!("t{i}.deb"), ext, &items);
        let written = unpack_deb(&deb, &root).unwrap();
        let written: Vec<_> = written.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            written,
            [
                "lib/x86_64-linux-gnu",
                "lib/x86_64-linux-gnu/libfoo.so.1",
                "usr/bin",
                "usr/bin/tool",
                "usr/bin/tool2",
                "usr/bin/alias",
            ],
            "{ext}: the `./lib/` directory entry is skipped, the merged-/usr link stays"
        );
    }
    assert!(fs::symlink_metadata(root.join("lib")).unwrap().is_symlink());
    assert_eq!(
        read(&root.join("usr/lib/x86_64-linux-gnu/libfoo.so.1")),
        "elf"
    );
    let tool = fs::metadata(root.join("usr/bin/tool")).unwrap();
    assert_eq!(tool.permissions().mode() & 0o7777, 0o755);
    assert_eq!(tool.mtime(), 1_700_000_000);
    assert_eq!(
        tool.ino(),
        fs::metadata(root.join("usr/bin/tool2")).unwrap().ino()
    );
    assert_eq!(
        fs::read_link(root.join("usr/bin/alias")).unwrap(),
        Path::new("tool")
    );
}

#[test]
fn a_file_shipped_twice_is_overwritten_by_the_later_package() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let first = make_deb(
        work.path(),
        "a.deb",
        ".gz",
        &[Item::File("./etc/x", b"first", 0o644)],
    );
    let second = make_deb(
        work.path(),
        "b.deb",
        ".gz",
        &[Item::File("./etc/x", b"second", 0o600)],
    );
    unpack_deb(&first, &root).unwrap();
    unpack_deb(&second, &root).unwrap();
    assert_eq!(read(&root.join("etc/x")), "second");
}

#[test]
fn entries_escaping_the_root_are_refused() {
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    fs::create_dir(&root).unwrap();
    let target = outside.path().to_str().unwrap();
    let evil: [&[Item<'_>]; 4] = [
        &[Item::File("../escaped", b"x", 0o644)],
        &[Item::File("./a/../../escaped", b"x", 0o644)],
        &[
            Item::Symlink("./up", "../../../.."),
            Item::File("./up/escaped", b"x", 0o644),
        ],
        // A package never writes through a link it made itself.
        &[
            Item::Symlink("./abs", target),
            Item::File("./abs/escaped", b"x", 0o644),
        ],
    ];
    for (i, items) in evil.iter().enumerate() {
        let deb = make_deb(work.path(), &format!("evil{i}.deb"), "", items);
        let err = unpack_deb(&deb, &root).unwrap_err();
        assert!(matches!(&err, Error::UnsafeEntry { .. }), "case {i}: {err}");
        assert!(err.to_string().contains("escaped"), "case {i}: {err}");
    }
    assert!(!work.path().join("escaped").exists());
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    // An absolute name is taken inside the root, as tar and dpkg take it.
    let deb = make_deb(
        work.path(),
        "tmp.deb",
        "",
        &[Item::File("/tmp/inside", b"x", 0o644)],
    );
    unpack_deb(&deb, &root).unwrap();
    assert_eq!(read(&root.join("tmp/inside")), "x");
    // An earlier package's absolute symlink means the root's own path, as it would inside
    // the image.
    let link = make_deb(
        work.path(),
        "link.deb",
        "",
        &[Item::Symlink("./abs2", target)],
    );
    let file = make_deb(
        work.path(),
        "file.deb",
        "",
        &[Item::File("./abs2/inside", b"x", 0o644)],
    );
    unpack_deb(&link, &root).unwrap();
    unpack_deb(&file, &root).unwrap();
    assert!(
        !outside.path().join("inside").exists(),
        "nothing is written through to the host"
    );
    assert_eq!(
        read(&root.join(target.trim_start_matches('/')).join("inside")),
        "x"
    );
    // A hard link to a file outside the root is refused too.
    let items = [Item::Hardlink("./stolen", "../../etc/passwd")];
    let deb = make_deb(work.path(), "hard.deb", "", &items);
    assert!(matches!(
        unpack_deb(&deb, &root),
        Err(Error::UnsafeEntry { .. })
    ));
}

#[test]
fn a_deb_without_data_member_or_with_a_directory_conflict_is_an_error() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let empty = make_deb(work.path(), "empty.deb", "", &[]);
    assert!(matches!(
        unpack_deb(&empty, &root),
        Err(Error::DebFormat { .. })
    ));
    let dir = make_deb(work.path(), "dir.deb", "", &[Item::Dir("./etc/x/")]);
    let file = make_deb(
        work.path(),
        "file.deb",
        "",
        &[Item::File("./etc/x", b"x", 0o644)],
    );
    unpack_deb(&dir, &root).unwrap();
    let err = unpack_deb(&file, &root).unwrap_err();
    assert!(matches!(err, Error::EntryConflict { .. }), "{err}");
}
