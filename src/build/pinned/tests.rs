#![allow(clippy::unwrap_used)]
use super::wheel::{csv_fields, csv_row, entry_point_script, entry_points, record_hash};
use super::*;
use crate::build::function::NamedBytes;
use crate::oci::layer::{Content, EntryKind};
use crate::runtime::Catalog;

fn inputs(requirements: &str) -> DepInputs {
    DepInputs {
        manifest: NamedBytes {
            name: "requirements.txt".into(),
            bytes: requirements.as_bytes().to_vec(),
        },
        lock: None,
        configs: vec![],
    }
}

fn python313() -> RuntimeSpec {
    Catalog::embedded().get("python313").unwrap().clone()
}

fn amd64() -> Platform {
    Platform::linux_amd64()
}

pub(super) fn plan_of(text: &str) -> Result<Plan, String> {
    plan(&python313(), &inputs(text), &amd64())
}

#[test]
fn only_a_requirements_file_of_plain_pins_is_planned() {
    let p = plan_of("# pinned\nrequests[socks]==2.32.3  # http\nPyYAML==6.0.2\n\nsix==1.17.0 \\\n")
        .unwrap();
    let keys: Vec<_> = p.requirements.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["requests", "pyyaml", "six"]);
    assert_eq!(p.requirements[0].extras, ["socks"]);
    let hashed = format!("idna==3.10 \\\n    --hash=sha256:{}\n", "AB".repeat(32));
    assert!(
        plan_of(&hashed).unwrap().requirements[0]
            .hashes
            .contains(&"ab".repeat(32))
    );
    for (text, why) in [
        ("requests>=2\n", "not pinned"),
        ("requests==2.*\n", "one version"),
        ("requests===2.0\n", "one version"),
        ("-r other.txt\n", "the option -r"),
        (
            "--index-url https://x/simple\nsix==1.17.0\n",
            "the option --index-url",
        ),
        ("six==1.17.0; python_version<'3'\n", "which is for pip"),
        ("six==1.17.0;python_version<'3'\n", "one version"),
        ("six==1.17.0 --no-binary=:all:\n", "which is for pip"),
        ("six==1.17.0\nSix==1.16.0\n", "named twice"),
        ("\n# nothing\n", "nothing is named"),
        (
            "# a comment \\\nsix==1.17.0\n",
            "comment line ends in a backslash",
        ),
        ("pkg @ https://example.com/p.whl\n", "for pip"),
        ("pkg@https://example.com/p.whl\n", "not pinned"),
        (
            &format!("six==1.17.0 --hash=sha256:{}\nidna==3.10\n", "a".repeat(64)),
            "some lines have hashes",
        ),
    ] {
        let err = plan_of(text).unwrap_err();
        assert!(err.contains(why), "{text:?}: {err}");
    }
    let mut with_config = inputs("six==1.17.0\n");
    with_config.configs.push(NamedBytes {
        name: "pip.conf".into(),
        bytes: b"[global]\n".to_vec(),
    });
    assert!(
        plan(&python313(), &with_config, &amd64())
            .unwrap_err()
            .contains("pip.conf")
    );
    let node = Catalog::embedded().get("nodejs22").unwrap().clone();
    assert!(plan(&node, &inputs("six==1.17.0\n"), &amd64()).is_err());
}

#[test]
fn records_are_written_as_pythons_csv_writes_them() {
    assert_eq!(
        csv_row(&["a/b.py", "sha256=x", "12"]),
        "a/b.py,sha256=x,12\r\n"
    );
    assert_eq!(csv_row(&["a,b.py", "", ""]), "\"a,b.py\",,\r\n");
    assert_eq!(
        csv_fields("\"a,\"\"b.py\",sha256=x,3"),
        ["a,\"b.py", "sha256=x", "3"]
    );
    assert_eq!(
        csv_fields("x.dist-info/RECORD,,"),
        ["x.dist-info/RECORD", "", ""]
    );
    assert_eq!(
        record_hash(b""),
        "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
    );
}

#[test]
fn entry_points_give_scripts_and_odd_ones_go_to_pip() {
    let text = "[console_scripts]\nnormalizer = charset_normalizer.cli:cli_detect\n\n[other]\nx = \
        y:z\n[gui_scripts]\ng = pkg.gui:App.run [extra]\n";
    let eps = entry_points(text, "w.whl").ok().unwrap();
    assert_eq!(
        eps["normalizer"],
        (
            "charset_normalizer.cli".to_string(),
            "cli_detect".to_string()
        )
    );
    assert_eq!(eps["g"], ("pkg.gui".to_string(), "App.run".to_string()));
    assert!(!eps.contains_key("x"));
    for bad in [
        "[console_scripts]\nx = nomodule\n",
        "[console_scripts]\n../x = a:b\n",
        "[console_scripts]\npip = pip._internal:main\n",
    ] {
        assert!(
            matches!(entry_points(bad, "w.whl"), Err(Skip::Pip(_))),
            "{bad}"
        );
    }
    let script = entry_point_script("/usr/bin/python3", "pkg.gui", "App.run");
    assert!(script.starts_with("#!/usr/bin/python3\n# -*- coding: utf-8 -*-\n"));
    assert!(script.contains("from pkg.gui import App\n"));
    assert!(script.ends_with("    sys.exit(App.run())\n"));
}

/// A wheel's file name and its members (name, bytes, mode).
type TestWheel<'a> = (&'a str, Vec<(&'a str, &'a [u8], u32)>);

/// Builds `requirements` from wheels made of `members`, one wheel per entry.
fn build_from(
    requirements: &str,
    wheels: &[TestWheel],
) -> (Result<Outcome, Error>, tempfile::TempDir) {
    let plan = plan_of(requirements).unwrap();
    let files: Vec<_> = wheels
        .iter()
        .map(|(_, members)| crate::testing::wheel(members))
        .collect();
    let archives: Vec<Archive> = wheels
        .iter()
        .map(|(n, _)| Archive {
            filename: n.to_string(),
            url: format!("https://files.example/{n}"),
            sha256: "ab".repeat(32),
        })
        .collect();
    let paths: Vec<PathBuf> = files.iter().map(|f| f.path().to_path_buf()).collect();
    let spill = tempfile::tempdir().unwrap();
    (build(&plan, &archives, &paths, spill.path()), spill)
}

const PKG_RECORD: &str = "pkg/__init__.py,sha256=old,6\n\
pkg/tool.so,sha256=so,3\n\
pkg-1.0.data/purelib/extra.py,sha256=ex,6\n\
pkg-1.0.data/scripts/pkg-run,sha256=stale,20\n\
pkg-1.0.dist-info/METADATA,sha256=m,1\n\
pkg-1.0.dist-info/WHEEL,sha256=w,1\n\
pkg-1.0.dist-info/entry_points.txt,sha256=e,1\n\
pkg-1.0.dist-info/RECORD,,\n";

fn pkg(extra_meta: &'static str) -> TestWheel<'static> {
    let metadata: &'static str = Box::leak(
        format!(
            "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nRequires-Dist: dep>=2\n\
             Requires-Dist: winonly ; sys_platform == \"win32\"\n{extra_meta}\nbody\n"
        )
        .into_boxed_str(),
    );
    (
        "pkg-1.0-py3-none-any.whl",
        vec![
            ("pkg/__init__.py", b"x = 1\n", 0o644),
            ("pkg/tool.so", b"ELF", 0o755),
            ("pkg-1.0.data/purelib/extra.py", b"y = 2\n", 0o644),
            (
                "pkg-1.0.data/scripts/pkg-run",
                b"#!python\r\nprint(1)\n",
                0o755,
            ),
            ("pkg-1.0.dist-info/METADATA", metadata.as_bytes(), 0o644),
            (
                "pkg-1.0.dist-info/WHEEL",
                b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n",
                0o644,
            ),
            (
                "pkg-1.0.dist-info/entry_points.txt",
                b"[console_scripts]\npkg-cli = pkg.cli:main\n",
                0o644,
            ),
            ("pkg-1.0.dist-info/RECORD", PKG_RECORD.as_bytes(), 0o644),
        ],
    )
}

fn dep(version: &'static str) -> TestWheel<'static> {
    let metadata: &'static str =
        Box::leak(format!("Name: dep\nVersion: {version}\n").into_boxed_str());
    let (name, info): (&'static str, &'static str) = match version {
        "2.1" => ("dep-2.1-py3-none-any.whl", "dep-2.1.dist-info"),
        _ => ("dep-1.0-py3-none-any.whl", "dep-1.0.dist-info"),
    };
    let member = |f: &str| -> &'static str { Box::leak(format!("{info}/{f}").into_boxed_str()) };
    (
        name,
        vec![
            ("dep/__init__.py", b"", 0o644),
            (member("METADATA"), metadata.as_bytes(), 0o644),
            (member("WHEEL"), b"Wheel-Version: 1.0\n", 0o644),
            (member("RECORD"), b"dep/__init__.py,sha256=d,0\n", 0o644),
        ],
    )
}

fn bytes_of(tree: &Tree, path: &str) -> (Vec<u8>, bool) {
    match &tree.entries[path] {
        EntryKind::File {
            content: Content::Bytes(b),
            executable,
        } => (b.clone(), *executable),
        other => panic!("{path}: {other:?}"),
    }
}

#[test]
fn a_wheel_is_installed_as_pip_installs_it_into_a_target() {
    let (outcome, _spill) = build_from("pkg==1.0\ndep==2.1\n", &[pkg(""), dep("2.1")]);
    let Ok(Outcome::Installed(tree)) = outcome else {
        panic!("not installed");
    };
    let paths: Vec<&str> = tree.entries.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        [
            "bin/pkg-cli",
            "bin/pkg-run",
            "dep-2.1.dist-info/INSTALLER",
            "dep-2.1.dist-info/METADATA",
            "dep-2.1.dist-info/RECORD",
            "dep-2.1.dist-info/REQUESTED",
            "dep-2.1.dist-info/WHEEL",
            "dep-2.1.dist-info/provenance.json",
            "dep/__init__.py",
            "extra.py",
            "pkg-1.0.dist-info/INSTALLER",
            "pkg-1.0.dist-info/METADATA",
            "pkg-1.0.dist-info/RECORD",
            "pkg-1.0.dist-info/REQUESTED",
            "pkg-1.0.dist-info/WHEEL",
            "pkg-1.0.dist-info/entry_points.txt",
            "pkg-1.0.dist-info/provenance.json",
            "pkg/__init__.py",
            "pkg/tool.so",
        ]
    );
    // Which archive it came from (PEP 710), and its RECORD row, last.
    let provenance = bytes_of(&tree, "pkg-1.0.dist-info/provenance.json").0;
    assert_eq!(
        provenance,
        super::provenance::document(
            "https://files.example/pkg-1.0-py3-none-any.whl",
            &"ab".repeat(32)
        )
    );
    let run = b"#!/usr/bin/python3\nprint(1)\n";
    assert_eq!(bytes_of(&tree, "bin/pkg-run"), (run.to_vec(), true));
    let (cli, exec) = bytes_of(&tree, "bin/pkg-cli");
    assert!(exec && cli.starts_with(b"#!/usr/bin/python3\n"));
    assert!(bytes_of(&tree, "pkg/tool.so").1 && !bytes_of(&tree, "pkg/__init__.py").1);
    let record = String::from_utf8(bytes_of(&tree, "pkg-1.0.dist-info/RECORD").0).unwrap();
    let expected = [
        format!("../../bin/pkg-cli,{},{}", record_hash(&cli), cli.len()),
        format!("../../bin/pkg-run,{},{}", record_hash(run), run.len()),
        "extra.py,sha256=ex,6".into(),
        format!("pkg-1.0.dist-info/INSTALLER,{},4", record_hash(b"pip\n")),
        "pkg-1.0.dist-info/METADATA,sha256=m,1".into(),
        "pkg-1.0.dist-info/RECORD,,".into(),
        format!("pkg-1.0.dist-info/REQUESTED,{},0", record_hash(b"")),
        "pkg-1.0.dist-info/WHEEL,sha256=w,1".into(),
        "pkg-1.0.dist-info/entry_points.txt,sha256=e,1".into(),
        "pkg/__init__.py,sha256=old,6".into(),
        "pkg/tool.so,sha256=so,3".into(),
        format!(
            "pkg-1.0.dist-info/provenance.json,{},{}",
            record_hash(&provenance),
            provenance.len()
        ),
    ]
    .map(|row| row + "\r\n")
    .concat();
    assert_eq!(record, expected);
}

#[test]
fn wheels_that_leave_a_choice_go_to_pip_and_a_bad_one_fails() {
    let needs_pip =
        |requirements: &str, wheels: &[TestWheel]| match build_from(requirements, wheels).0 {
            Ok(Outcome::NeedsPip(why)) => why,
            Ok(Outcome::Installed(_)) => panic!("{requirements}: installed"),
            Err(e) => panic!("{requirements}: {e}"),
        };
    let why = needs_pip("pkg==1.0\n", &[pkg("")]);
    assert!(
        why.contains("needs dep, which requirements.txt does not pin"),
        "{why}"
    );
    let why = needs_pip("pkg==1.0\ndep==1.0\n", &[pkg(""), dep("1.0")]);
    assert!(
        why.contains("needs dep >=2, and requirements.txt pins 1.0"),
        "{why}"
    );
    // An extra asked for brings its own dependencies.
    let socks = "Provides-Extra: socks\nRequires-Dist: sockety ; extra == \"socks\"";
    let (outcome, _spill) = build_from("pkg==1.0\ndep==2.1\n", &[pkg(socks), dep("2.1")]);
    assert!(matches!(outcome, Ok(Outcome::Installed(_))));
    let why = needs_pip("pkg[socks]==1.0\ndep==2.1\n", &[pkg(socks), dep("2.1")]);
    assert!(why.contains("needs sockety"), "{why}");
    let why = needs_pip(
        "pkg==1.0\ndep==2.1\n",
        &[
            pkg("Requires-Dist: odd ; platform_release >= '6'"),
            dep("2.1"),
        ],
    );
    assert!(why.contains("platform_release"), "{why}");
    let why = needs_pip(
        "pkg==1.0\ndep==2.1\n",
        &[pkg("Requires-Python: >=3.14"), dep("2.1")],
    );
    assert!(why.contains("does not run on this Python"), "{why}");
    let mut headers = pkg("");
    headers.1.push(("pkg-1.0.data/headers/pkg.h", b"", 0o644));
    let why = needs_pip("pkg==1.0\ndep==2.1\n", &[headers, dep("2.1")]);
    assert!(why.contains("installs headers files"), "{why}");
    let why = needs_pip(
        "pkg==1.0\ndep==2.1\n",
        &[
            pkg("Requires-Dist: odd ; python_full_version == '3.13.5'"),
            dep("2.1"),
        ],
    );
    assert!(why.contains("some patch releases"), "{why}");
    let mut top_bin = dep("2.1");
    top_bin.1.push(("bin/tool", b"", 0o755));
    let why = needs_pip("dep==2.1\n", &[top_bin]);
    assert!(why.contains("top-level bin/"), "{why}");
    let mut wrapper = pkg("");
    wrapper
        .1
        .push(("pkg-1.0.data/scripts/pkg-cli-script.py", b"", 0o644));
    let why = needs_pip("pkg==1.0\ndep==2.1\n", &[wrapper, dep("2.1")]);
    assert!(why.contains("wraps an entry point"), "{why}");
    let mut clash = dep("2.1");
    clash.1.push(("dep/__init__.py/x", b"", 0o644));
    let why = needs_pip("dep==2.1\n", &[clash]);
    assert!(why.contains("a file and a directory"), "{why}");
    let mut odd_name = dep("2.1");
    odd_name.1.push(("dep//x.py", b"", 0o644));
    let why = needs_pip("dep==2.1\n", &[odd_name]);
    assert!(why.contains("dep//x.py"), "{why}");
    // A member that climbs out is an error, not a fallback.
    let mut evil = dep("2.1");
    evil.1.push(("../../etc/evil.py", b"x", 0o644));
    let err = build_from("dep==2.1\n", &[evil])
        .0
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("dep-2.1-py3-none-any.whl") && err.contains("leaves"),
        "{err}"
    );
}

#[test]
fn metadata_headers_end_where_pythons_email_parser_ends_them() {
    // A blank line of spaces continues the description; a line without a colon ends the
    // headers.
    let text = "Name: a\nDescription: x\n        \n        more\nRequires-Dist: b\n\
                not a header\nRequires-Dist: c\n";
    let found = headers(text);
    assert!(found.iter().any(|(k, v)| k == "requires-dist" && v == "b"));
    assert!(!found.iter().any(|(_, v)| v == "c"), "{found:?}");
    assert_eq!(headers("Name: a\n\nRequires-Dist: b\n").len(), 1);
}
