#![allow(clippy::unwrap_used)]
use super::*;
use crate::build::function::NamedBytes;
use crate::build::memtree::{Building, IN_MEMORY};
use crate::oci::layer::{Content, EntryKind};
use crate::runtime::Catalog;

fn nb(name: &str, text: &str) -> NamedBytes {
    NamedBytes {
        name: name.into(),
        bytes: text.as_bytes().to_vec(),
    }
}

fn url(name: &str, version: &str) -> String {
    let base = name.rsplit('/').next().unwrap();
    format!("https://registry.npmjs.org/{name}/-/{base}-{version}.tgz")
}

/// A lock entry of a registry package, with `extra` JSON fields.
fn entry(name: &str, version: &str, extra: &str) -> String {
    format!(
        r#"{{"version":"{version}","resolved":"{}","integrity":"sha512-AA=="{extra}}}"#,
        url(name, version)
    )
}

const MANIFEST: &str =
    r#"{"name":"f","dependencies":{"a":"^1.0.0","@s/b":"2.0.0"},"devDependencies":{"t":"1"}}"#;

/// A lock in step with [`MANIFEST`], plus `more` entries.
fn lock(more: &str) -> String {
    format!(
        "{{\"lockfileVersion\":3,\"packages\":{{
        \"\":{{\"name\":\"f\",\"dependencies\":{{\"a\":\"^1.0.0\",\"@s/b\":\"2.0.0\"}},\
            \"devDependencies\":{{\"t\":\"1\"}}}},
        \"node_modules/a\":{},
        \"node_modules/@s/b\":{},
        \"node_modules/a/node_modules/c\":{},
        \"node_modules/t\":{},
        \"node_modules/mac\":{}{more}}}}}",
        entry(
            "a",
            "1.2.0",
            r#","bin":{"a-cli":"./bin/../bin/cli.js","../up":"x.js","":"y.js"}"#
        ),
        entry("@s/b", "2.0.0", r#","bin":"main.js""#),
        entry("c", "3.0.0", r#","bin":{"c":"c.js"}"#),
        entry("t", "1.0.0", r#","dev":true,"hasInstallScript":true"#),
        entry(
            "mac",
            "1.0.0",
            r#","optional":true,"os":["darwin"],"hasInstallScript":true"#
        ),
    )
}

fn inputs(manifest: &str, lock: &str) -> DepInputs {
    DepInputs {
        manifest: nb("package.json", manifest),
        lock: Some(nb("package-lock.json", lock)),
        configs: vec![],
    }
}

fn node() -> RuntimeSpec {
    Catalog::embedded().get("nodejs22").unwrap().clone()
}

fn plan_of(manifest: &str, lock: &str) -> Result<Plan, String> {
    plan(&node(), &inputs(manifest, lock), &Platform::linux_amd64())
}

#[test]
fn a_lock_in_step_gives_the_tree_without_dev_or_foreign_packages_and_npm_s_bin_names() {
    let plan = plan_of(MANIFEST, &lock("")).unwrap();
    type Row<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);
    let got: Vec<Row<'_>> = plan
        .packages
        .iter()
        .map(|p| {
            let bins = p
                .bins
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            (p.path.as_str(), p.tarball.package.as_str(), bins)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("@s/b", "@s/b", vec![("b", "main.js")]),
            ("a", "a", vec![("a-cli", "bin/cli.js"), ("up", "x.js")]),
            ("a/node_modules/c", "c", vec![("c", "c.js")]),
        ]
    );
    assert_eq!(bin_dir("a/node_modules/c"), "a/node_modules");
    assert_eq!(bin_dir("@s/b"), "");
}

#[test]
fn whatever_npm_would_do_beyond_unpacking_the_lock_makes_npm_run() {
    let cases: Vec<(String, String, &str)> = vec![
        (
            MANIFEST.replace("\"name\"", r#""scripts":{"postinstall":"x"},"name""#),
            lock(""),
            "\"postinstall\" script",
        ),
        (
            MANIFEST.replace("\"name\"", r#""overrides":{"a":"1"},"name""#),
            lock(""),
            "\"overrides\"",
        ),
        (MANIFEST.replace("^1.0.0", "^1.1.0"), lock(""), "differ"),
        (
            MANIFEST.into(),
            lock(&format!(
                r#","node_modules/s":{}"#,
                entry("s", "1.0.0", r#","hasInstallScript":true"#)
            )),
            "install script",
        ),
        (
            MANIFEST.into(),
            lock(
                r#","node_modules/g":{"version":"1.0.0",
                    "resolved":"git+ssh://git@github.com/x/g.git#abc","integrity":"sha512-AA=="}"#,
            ),
            "not resolved to",
        ),
        (
            MANIFEST.into(),
            lock(&format!(
                r#","node_modules/o":{}"#,
                entry("o", "1.0.0", r#","resolved":"https://evil.example/o.tgz""#).replacen(
                    &format!(r#""resolved":"{}","#, url("o", "1.0.0")),
                    "",
                    1
                )
            )),
            "not resolved to",
        ),
        (
            MANIFEST.into(),
            lock(r#","node_modules/w":{"resolved":"w","link":true}"#),
            "linked",
        ),
        (
            MANIFEST.into(),
            lock(&format!(
                r#","node_modules/m":{}"#,
                entry("m", "1.0.0", r#","os":["darwin"]"#)
            )),
            "not for linux/x64",
        ),
        (
            MANIFEST.into(),
            lock(&format!(
                r#","node_modules/z":{}"#,
                entry("z", "1.0.0", r#","bin":{"a-cli":"z.js"}"#)
            )),
            "bin named \"a-cli\"",
        ),
        (
            MANIFEST.into(),
            lock("").replace("\"lockfileVersion\":3", "\"lockfileVersion\":1"),
            "lockfileVersion 1",
        ),
        (
            MANIFEST.into(),
            lock(&format!(
                r#","node_modules/../../x":{}"#,
                entry("x", "1.0.0", "")
            )),
            "the lock's \"node_modules/../../x\"",
        ),
    ];
    for (manifest, lock, why) in cases {
        let e = plan_of(&manifest, &lock).unwrap_err();
        assert!(e.contains(why), "{why:?} not in {e:?}");
    }
    let mut with_npmrc = inputs(MANIFEST, &lock(""));
    with_npmrc
        .configs
        .push(nb(".npmrc", "registry=https://npm.corp.example/"));
    let e = plan(&node(), &with_npmrc, &Platform::linux_amd64()).unwrap_err();
    assert!(e.contains(".npmrc"), "{e}");
    let mut unlocked = inputs(MANIFEST, "");
    unlocked.lock = None;
    assert!(plan(&node(), &unlocked, &Platform::linux_amd64()).is_err());
}

#[test]
fn the_toolchain_names_the_rules_and_the_platform() {
    let arm = Platform {
        architecture: "arm64".into(),
        ..Platform::linux_amd64()
    };
    assert_eq!(
        toolchain_id(&Platform::linux_amd64()),
        "kiln lock-file install v1 for linux/x64"
    );
    assert_ne!(toolchain_id(&arm), toolchain_id(&Platform::linux_amd64()));
}

type Member<'a> = (&'a str, tar::EntryType, &'a [u8], u32);

fn tgz(members: &[Member<'_>]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let gz = flate2::write::GzEncoder::new(file.reopen().unwrap(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, kind, data, mode) in members {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        if *kind == tar::EntryType::Symlink {
            h.set_link_name("/etc/passwd").unwrap();
        }
        // Names that `set_path` refuses (`..`) go in raw, as a hostile tarball has them.
        let raw = &mut h.as_old_mut().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        tar.append(&h, *data).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
    file
}

fn building(spill: &Path) -> Building {
    Building::new(spill, IN_MEMORY)
}

/// Path → (executable, bytes) of the files.
type Files = BTreeMap<String, (bool, Vec<u8>)>;

/// The files, and path → target of the links.
fn files_and_links(tree: &Building) -> (Files, BTreeMap<String, String>) {
    let (mut files, mut links) = (BTreeMap::new(), BTreeMap::new());
    for (path, kind) in &tree.entries {
        match kind {
            EntryKind::File {
                content,
                executable,
            } => {
                let bytes = match content {
                    Content::Bytes(b) => b.clone(),
                    Content::Path(p) => std::fs::read(p).unwrap(),
                    Content::Beneath { .. } => unreachable!(),
                };
                files.insert(path.clone(), (*executable, bytes));
            }
            EntryKind::Symlink(target) => {
                links.insert(path.clone(), target.clone());
            }
            other => panic!("{path} is a {other:?}"),
        }
    }
    (files, links)
}

#[test]
fn a_tarball_unpacks_as_pacote_extracts_it_and_nothing_leaves_the_package() {
    use tar::EntryType::{Directory, Link, Regular, Symlink};
    let t = tgz(&[
        ("package/", Directory, b"", 0o755),
        ("package/empty/", Directory, b"", 0o755),
        ("package/index.js", Regular, b"x", 0o600),
        ("package/run.sh", Regular, b"y", 0o744),
        ("package/lib/.gitignore", Regular, b"g", 0o644),
        ("package/doc/.npmignore", Regular, b"n", 0o644),
        ("package/doc/.gitignore", Regular, b"g", 0o644),
        ("package/evil", Symlink, b"", 0o777),
        ("package/evil/planted", Regular, b"z", 0o644),
        ("package/hard", Link, b"", 0o644),
        ("package/../../planted", Regular, b"z", 0o644),
        ("/abs/planted", Regular, b"z", 0o644),
        ("top.js", Regular, b"t", 0o644),
        ("package/index.js", Regular, b"again", 0o600),
    ]);
    let spill = tempfile::tempdir().unwrap();
    let mut tree = building(spill.path());
    unpack(t.path(), "p", &mut tree).unwrap();
    let (files, links) = files_and_links(&tree);
    let got: Vec<(&str, bool, &[u8])> = files
        .iter()
        .map(|(k, (x, b))| (k.as_str(), *x, b.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("p/doc/.npmignore", false, &b"n"[..]),
            ("p/evil/planted", false, b"z"),
            ("p/index.js", false, b"again"),
            ("p/lib/.npmignore", false, b"g"),
            ("p/run.sh", true, b"y"),
        ]
    );
    assert!(links.is_empty());
    // Nothing was written anywhere: the tree is in memory.
    assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
}

#[test]
fn a_member_past_the_memory_budget_streams_to_disk_and_one_past_the_limit_is_refused() {
    use tar::EntryType::Regular;
    // 3 MiB of zeros: a few kilobytes of gzip, as a bomb's members are.
    let zeros = vec![0u8; 3 << 20];
    let t = tgz(&[
        ("package/small.js", Regular, b"s", 0o644),
        ("package/big.bin", Regular, &zeros, 0o644),
    ]);
    assert!(t.as_file().metadata().unwrap().len() < 64 << 10);
    let spill = tempfile::tempdir().unwrap();
    let mut tree = Building::new(spill.path(), 1 << 20).with_limit(4 << 20);
    unpack(t.path(), "p", &mut tree).unwrap();
    let EntryKind::File {
        content: Content::Path(big),
        ..
    } = &tree.entries["p/big.bin"]
    else {
        panic!("{:?}", tree.entries["p/big.bin"]);
    };
    assert_eq!(std::fs::read(big).unwrap(), zeros);
    assert!(matches!(
        &tree.entries["p/small.js"],
        EntryKind::File {
            content: Content::Bytes(b),
            ..
        } if b == b"s"
    ));
    // A second package that would pass the limit is refused before its member is read.
    let err = unpack(t.path(), "q", &mut tree).unwrap_err().to_string();
    assert!(
        err.contains("unpack to more than 4 MiB (passed at q/big.bin)"),
        "{err}"
    );
}

#[test]
fn a_tarball_with_more_than_16_mib_of_metadata_for_an_entry_fails() {
    use tar::EntryType::{Fifo, GNULongName, Regular};
    let spill = tempfile::tempdir().unwrap();
    // 20 MiB in an entry kiln skips (a FIFO has no data for it to keep), and a 20 MiB long
    // name, which the tar reader would hold in memory whole.
    let zeros = vec![b'a'; 20 << 20];
    for bomb in [
        ("package/pipe", Fifo, &zeros[..], 0o644),
        ("././@LongLink", GNULongName, &zeros[..], 0o644),
    ] {
        let t = tgz(&[("package/index.js", Regular, b"x", 0o644), bomb]);
        let mut tree = building(spill.path());
        let err = unpack(t.path(), "p", &mut tree).unwrap_err();
        let err = format!("{:#}", anyhow::Error::new(err));
        assert!(err.contains("16 MiB of headers"), "{err}");
    }
    // 40,000 empty files: 20 MiB of headers and no more than their allowance.
    let names: Vec<String> = (0..40_000).map(|i| format!("package/f{i}")).collect();
    let members: Vec<Member<'_>> = names
        .iter()
        .map(|n| (n.as_str(), Regular, &b""[..], 0o644))
        .collect();
    let t = tgz(&members);
    let mut tree = building(spill.path());
    unpack(t.path(), "p", &mut tree).unwrap();
    assert_eq!(tree.entries.len(), 40_000);
}

#[test]
fn a_large_spilled_bin_is_fixed_only_up_to_the_memory_budget() {
    let spill = tempfile::tempdir().unwrap();
    let mut big = b"#!/usr/bin/env node\r\n".to_vec();
    big.resize(IN_MEMORY as usize + 1, b'x');
    // Budget 0: every file is spilled, as a file past the budget is.
    let mut tree = Building::new(spill.path(), 0);
    tree.put_file("a/cli.js".into(), big, false).unwrap();
    tree.put_file(
        "a/small.js".into(),
        b"#!/bin/sh\r\necho\r\n".to_vec(),
        false,
    )
    .unwrap();
    link_bin(&mut tree, "a", ".bin", "small", "small.js").unwrap();
    let (files, _) = files_and_links(&tree);
    assert_eq!(files["a/small.js"], (true, b"#!/bin/sh\necho\r\n".to_vec()));
    let err = link_bin(&mut tree, "a", ".bin", "cli", "cli.js")
        .unwrap_err()
        .to_string();
    assert!(err.contains("node_modules/a/cli.js"), "{err}");
}

#[test]
fn bins_are_linked_relative_from_their_node_modules_and_fixed_as_bin_links_does() {
    let spill = tempfile::tempdir().unwrap();
    let mut tree = building(spill.path());
    let crlf = b"#!/usr/bin/env node\r\nconsole.log(1)\r\n".to_vec();
    tree.put_file("a/bin/cli.js".into(), crlf, false).unwrap();
    tree.put_file("a/lib/x.js".into(), b"x".to_vec(), false)
        .unwrap();
    tree.put_file(
        "a/node_modules/c/c.js".into(),
        b"#!/bin/sh\r\r\nx\r\n".to_vec(),
        false,
    )
    .unwrap();
    link_bin(&mut tree, "a", ".bin", "a-cli", "bin/cli.js").unwrap();
    link_bin(&mut tree, "a", ".bin", "gone", "missing.js").unwrap();
    link_bin(&mut tree, "a", ".bin", "libdir", "lib").unwrap();
    link_bin(
        &mut tree,
        "a/node_modules/c",
        "a/node_modules/.bin",
        "c",
        "c.js",
    )
    .unwrap();
    let (files, links) = files_and_links(&tree);
    assert_eq!(
        links,
        BTreeMap::from([
            (".bin/a-cli".to_string(), "../a/bin/cli.js".to_string()),
            (".bin/libdir".to_string(), "../a/lib".to_string()),
            ("a/node_modules/.bin/c".to_string(), "../c/c.js".to_string()),
        ])
    );
    assert_eq!(
        files["a/bin/cli.js"],
        (true, b"#!/usr/bin/env node\nconsole.log(1)\r\n".to_vec())
    );
    // Only the last CR of the line goes, as npm's pattern takes it.
    assert_eq!(
        files["a/node_modules/c/c.js"],
        (true, b"#!/bin/sh\r\nx\r\n".to_vec())
    );
    assert!(!files["a/lib/x.js"].0, "not a bin");
    // A link where the tree already has a file is an error, as npm's is.
    let e = link_bin(&mut tree, "a", ".bin", "a-cli", "lib/x.js").unwrap_err();
    assert!(format!("{e}").contains(".bin/a-cli"), "{e}");
}

#[test]
fn a_file_where_a_directory_must_be_is_refused() {
    let spill = tempfile::tempdir().unwrap();
    let mut tree = building(spill.path());
    tree.put_file("a/x".into(), b"1".to_vec(), false).unwrap();
    tree.put_file("a/x/y".into(), b"2".to_vec(), false).unwrap();
    let e = check_parents(&tree).unwrap_err();
    assert!(format!("{e:#}").contains("node_modules/a/x/y"), "{e:?}");
}

#[test]
fn relative_links_climb_only_as_far_as_needed() {
    assert_eq!(
        relative("semver/bin/semver.js", ".bin"),
        "../semver/bin/semver.js"
    );
    assert_eq!(
        relative("a/node_modules/@s/b/x.js", "a/node_modules/.bin"),
        "../@s/b/x.js"
    );
}
