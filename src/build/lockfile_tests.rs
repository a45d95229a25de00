#![allow(clippy::unwrap_used)]
use super::*;
use crate::build::function::NamedBytes;
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
        r#"{{"lockfileVersion":3,"packages":{{
        "":{{"name":"f","dependencies":{{"a":"^1.0.0","@s/b":"2.0.0"}},"devDependencies":{{"t":"1"}}}},
        "node_modules/a":{},
        "node_modules/@s/b":{},
        "node_modules/a/node_modules/c":{},
        "node_modules/t":{},
        "node_modules/mac":{}{more}}}}}"#,
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
                r#","node_modules/g":{"version":"1.0.0","resolved":"git+ssh://git@github.com/x/g.git#abc","integrity":"sha512-AA=="}"#,
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

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    path.symlink_metadata().unwrap().permissions().mode() & 0o777
}

#[test]
fn a_tarball_unpacks_as_pacote_extracts_it_and_nothing_leaves_the_package() {
    use tar::EntryType::{Directory, Link, Regular, Symlink};
    let outside = tempfile::tempdir().unwrap();
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
        ("top.js", Regular, b"t", 0o644),
    ]);
    let dest = outside.path().join("pkg");
    unpack(t.path(), &dest).unwrap();
    let mut found: Vec<String> = walkdir(&dest);
    found.sort();
    assert_eq!(
        found,
        [
            "doc/",
            "doc/.npmignore",
            "evil/",
            "evil/planted",
            "index.js",
            "lib/",
            "lib/.npmignore",
            "run.sh"
        ]
    );
    assert_eq!(std::fs::read(dest.join("doc/.npmignore")).unwrap(), b"n");
    assert_eq!(std::fs::read(dest.join("lib/.npmignore")).unwrap(), b"g");
    assert_eq!(mode(&dest.join("index.js")), 0o644);
    assert_eq!(mode(&dest.join("run.sh")), 0o755);
    assert!(dest.join("evil").is_dir(), "the link was never made");
    assert!(!outside.path().join("planted").exists());
}

fn walkdir(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{rel}/"));
                todo.push(e.path());
            } else {
                out.push(rel);
            }
        }
    }
    out
}

#[test]
fn bins_are_linked_relative_from_their_node_modules_and_fixed_as_bin_links_does() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    for (dir, file, text) in [
        (
            "a",
            "bin/cli.js",
            &b"#!/usr/bin/env node\r\nconsole.log(1)\r\n"[..],
        ),
        ("a/node_modules/c", "c.js", b"#!/bin/sh\r\r\nx\r\n"),
    ] {
        std::fs::create_dir_all(root.join(dir).join(file).parent().unwrap()).unwrap();
        std::fs::write(root.join(dir).join(file), text).unwrap();
    }
    let bins = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let plan = Plan {
        packages: vec![
            Package {
                path: "a".into(),
                tarball: NpmTarball {
                    package: "a".into(),
                    version: "1".into(),
                    integrity: String::new(),
                },
                bins: bins(&[("a-cli", "bin/cli.js"), ("gone", "missing.js")]),
            },
            Package {
                path: "a/node_modules/c".into(),
                tarball: NpmTarball {
                    package: "c".into(),
                    version: "1".into(),
                    integrity: String::new(),
                },
                bins: bins(&[("c", "c.js")]),
            },
        ],
    };
    for p in &plan.packages {
        let dir = root.join(bin_dir(&p.path)).join(".bin");
        for (name, target) in &p.bins {
            link_bin(&root.join(&p.path), &dir, name, target).unwrap();
        }
    }
    assert_eq!(
        std::fs::read_link(root.join(".bin/a-cli")).unwrap(),
        Path::new("../a/bin/cli.js")
    );
    assert_eq!(
        std::fs::read_link(root.join("a/node_modules/.bin/c")).unwrap(),
        Path::new("../c/c.js")
    );
    assert!(!root.join(".bin/gone").exists());
    assert_eq!(
        std::fs::read(root.join("a/bin/cli.js")).unwrap(),
        b"#!/usr/bin/env node\nconsole.log(1)\r\n"
    );
    // Only the last CR of the line goes, as npm's pattern takes it.
    assert_eq!(
        std::fs::read(root.join("a/node_modules/c/c.js")).unwrap(),
        b"#!/bin/sh\r\nx\r\n"
    );
    assert_eq!(mode(&root.join("a/bin/cli.js")), 0o755);
}
