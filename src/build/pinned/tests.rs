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

fn plan_of(text: &str) -> Result<Plan, String> {
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

fn target() -> Target {
    plan_of("six==1.17.0\n").unwrap().target
}

#[test]
fn tags_come_in_pips_order() {
    let tags = target().tags();
    let at = |t: &str| {
        tags.iter()
            .position(|x| x == t)
            .unwrap_or_else(|| panic!("{t}"))
    };
    assert_eq!(tags[0], "cp313-cp313-manylinux_2_41_x86_64");
    assert!(at("cp313-cp313-manylinux_2_17_x86_64") < at("cp313-cp313-manylinux2014_x86_64"));
    assert!(at("cp313-cp313-manylinux2014_x86_64") < at("cp313-cp313-manylinux_2_16_x86_64"));
    assert!(at("cp313-cp313-manylinux1_x86_64") < at("cp313-cp313-linux_x86_64"));
    assert!(at("cp313-cp313-linux_x86_64") < at("cp313-abi3-manylinux_2_41_x86_64"));
    assert!(at("cp313-none-linux_x86_64") < at("cp312-abi3-manylinux_2_41_x86_64"));
    assert!(at("cp32-abi3-linux_x86_64") < at("py313-none-manylinux_2_41_x86_64"));
    assert!(at("py30-none-linux_x86_64") < at("cp313-none-any"));
    assert!(at("cp313-none-any") < at("py313-none-any"));
    assert!(at("py3-none-any") < at("py312-none-any"));
    assert_eq!(tags.last().unwrap(), "py30-none-any");
    assert!(
        !tags
            .iter()
            .any(|t| t.contains("cp314") || t.contains("manylinux_2_42") || t.contains("musl"))
    );
}

fn file(name: &str, sha: char, requires_python: Option<&str>, yanked: bool) -> IndexFile {
    IndexFile {
        filename: name.into(),
        url: format!("https://files.example/{name}"),
        sha256: sha.to_string().repeat(64),
        requires_python: requires_python.map(str::to_string),
        yanked,
        limit: 1 << 20,
    }
}

#[test]
fn a_release_is_its_wheels_on_the_project_page_with_their_sizes() {
    let r = plan_of("pyyaml==6.0.2\n").unwrap().requirements.remove(0);
    let page = serde_json::json!({
        "meta": {"api-version": "1.1"},
        "files": [
            {"filename": "PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.whl",
             "url": "../../packages/a/PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.whl",
             "hashes": {"sha256": "AB".repeat(32)}, "size": 759_457, "yanked": false},
            {"filename": "PyYAML-6.0.2-py3-none-any.whl", "url": "https://files.example/b.whl",
             "hashes": {"sha256": "cd".repeat(32)}, "yanked": "broken"},
            {"filename": "PyYAML-6.0.2.0-py3-none-any.whl", "url": "https://files.example/c.whl",
             "hashes": {"sha256": "ef".repeat(32)}, "size": null, "requires-python": ">=3.8"},
            {"filename": "PyYAML-6.0.2-py2-none-any.whl", "url": "https://files.example/d.whl",
             "hashes": {"sha256": "01".repeat(32)}, "size": 0},
            {"filename": "PyYAML-6.0.1-py3-none-any.whl", "url": "https://files.example/e.whl",
             "hashes": {"sha256": "23".repeat(32)}, "size": 10},
            {"filename": "PyYAML-6.0.2.tar.gz", "url": "https://files.example/f.tar.gz",
             "hashes": {"sha256": "45".repeat(32)}, "size": 10}
        ]
    });
    let project: Project = serde_json::from_value(page).unwrap();
    let files = release_files(project, "https://pypi.org/simple/pyyaml/", &r);
    let got: Vec<(&str, &str, u64, bool)> = files
        .iter()
        .map(|f| (f.url.as_str(), &f.sha256[..4], f.limit, f.yanked))
        .collect();
    assert_eq!(
        got,
        [
            (
                "https://pypi.org/packages/a/PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.whl",
                "abab",
                759_457,
                false
            ),
            ("https://files.example/b.whl", "cdcd", download::LIMIT, true),
            (
                "https://files.example/c.whl",
                "efef",
                download::LIMIT,
                false
            ),
            (
                "https://files.example/d.whl",
                "0101",
                download::LIMIT,
                false
            ),
        ]
    );
    assert_eq!(files[2].requires_python.as_deref(), Some(">=3.8"));
}

#[test]
fn the_wheel_pip_would_take_is_chosen() {
    let t = target();
    let tags: BTreeMap<String, usize> = t
        .tags()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i))
        .collect();
    let r = plan_of("pyyaml==6.0.2\n").unwrap().requirements.remove(0);
    let files = [
        file(
            "PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            'b',
            Some(">=3.8"),
            false,
        ),
        file(
            "PyYAML-6.0.2-cp313-cp313-musllinux_1_1_x86_64.whl",
            'c',
            None,
            false,
        ),
        file(
            "PyYAML-6.0.2-cp312-cp312-manylinux_2_28_x86_64.whl",
            'd',
            None,
            false,
        ),
        file(
            "PyYAML-6.0.2-cp313-cp313-macosx_11_0_arm64.whl",
            'e',
            None,
            false,
        ),
        file("PyYAML-6.0.2-py3-none-any.whl", 'f', None, false),
        file(
            "PyYAML-6.0.2-cp313-cp313-manylinux_2_28_x86_64.whl",
            '0',
            Some("<3.13"),
            false,
        ),
        file(
            "PyYAML-6.0.2-cp313-cp313-manylinux_2_34_x86_64.whl",
            '1',
            None,
            true,
        ),
    ];
    assert_eq!(
        choose(&r, &files, &tags, &t).unwrap().sha256,
        "b".repeat(64)
    );
    // A build number wins among equal tags.
    let built = file(
        "PyYAML-6.0.2-2-cp313-cp313-manylinux_2_17_x86_64.whl",
        '2',
        None,
        false,
    );
    let both = [files[0].clone(), built];
    assert_eq!(choose(&r, &both, &tags, &t).unwrap().sha256, "2".repeat(64));
    // A hash in requirements.txt narrows the choice to the file it names.
    let mut hashed = r.clone();
    hashed.hashes.insert("f".repeat(64));
    assert_eq!(
        choose(&hashed, &files, &tags, &t).unwrap().sha256,
        "f".repeat(64)
    );
    // Only wheels for other systems: pip builds the sdist.
    let why = choose(&r, &files[1..4], &tags, &t).unwrap_err();
    assert!(why.contains("no wheel"), "{why}");
    // No build tag ranks below build 0; tags are read lower-cased.
    let untagged = file("PyYAML-6.0.2-py3-none-any.whl", '3', None, false);
    let zero = file("PyYAML-6.0.2-0-PY3-none-any.whl", '4', None, false);
    assert_eq!(
        choose(&r, &[untagged.clone(), zero], &tags, &t)
            .unwrap()
            .sha256,
        "4".repeat(64)
    );
    // Two files that rank the same: pip's order among them is its own.
    let twin = file("PyYAML-6.0.2-py2.py3-none-any.whl", '5', None, false);
    let why = choose(&r, &[untagged, twin], &tags, &t).unwrap_err();
    assert!(why.contains("rank the same"), "{why}");
    // A Requires-Python that depends on the patch release is for pip to decide.
    let patchy = [file(
        "PyYAML-6.0.2-py3-none-any.whl",
        'f',
        Some("!=3.13.0"),
        false,
    )];
    assert!(
        choose(&r, &patchy, &tags, &t)
            .unwrap_err()
            .contains("patch release")
    );
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
    let text = "[console_scripts]\nnormalizer = charset_normalizer.cli:cli_detect\n\n[other]\nx = y:z\n[gui_scripts]\ng = pkg.gui:App.run [extra]\n";
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
        .map(|(_, members)| crate::base::wheels::tests::wheel(members))
        .collect();
    let names: Vec<String> = wheels.iter().map(|(n, _)| n.to_string()).collect();
    let paths: Vec<PathBuf> = files.iter().map(|f| f.path().to_path_buf()).collect();
    let spill = tempfile::tempdir().unwrap();
    (build(&plan, &names, &paths, spill.path()), spill)
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
            "dep/__init__.py",
            "extra.py",
            "pkg-1.0.dist-info/INSTALLER",
            "pkg-1.0.dist-info/METADATA",
            "pkg-1.0.dist-info/RECORD",
            "pkg-1.0.dist-info/REQUESTED",
            "pkg-1.0.dist-info/WHEEL",
            "pkg-1.0.dist-info/entry_points.txt",
            "pkg/__init__.py",
            "pkg/tool.so",
        ]
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

/// A PyPI stand-in answering every request with one project page, `Cache-Control:
/// max-age=<max_age>` and an ETag, or a bodiless 304 when asked with that ETag. Returns the
/// index URL and the requests so far, as (had If-None-Match, answered 304).
async fn page_server(
    max_age: u64,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<(bool, bool)>>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let index = format!("http://{}/simple/", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        let page = br#"{"meta": {"api-version": "1.1"}, "files": [{"filename": "six-1.17.0-py2.py3-none-any.whl", "url": "https://files.example/six.whl", "hashes": {"sha256": "abab"}, "size": 11}]}"#;
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
            let revalidating = head.contains("if-none-match: \"v1\"");
            log.lock()
                .unwrap()
                .push((head.contains("if-none-match"), revalidating));
            let answer = match revalidating {
                true => format!("HTTP/1.1 304 Not Modified\r\nCache-Control: max-age={max_age}\r\nConnection: close\r\n\r\n").into_bytes(),
                false => {
                    let mut a = format!("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.pypi.simple.v1+json\r\nCache-Control: max-age={max_age}, public\r\nETag: \"v1\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", page.len()).into_bytes();
                    a.extend_from_slice(page);
                    a
                }
            };
            let _ = conn.write_all(&answer).await;
        }
    });
    (index, seen)
}

#[tokio::test]
async fn a_project_page_is_taken_from_the_cache_while_fresh_and_revalidated_after() {
    let r = plan_of("six==1.17.0\n").unwrap().requirements.remove(0);
    let http = reqwest::Client::new();
    let cache = tempfile::tempdir().unwrap();
    let wheels = |files: Option<Vec<IndexFile>>| -> Vec<String> {
        files.unwrap().into_iter().map(|f| f.filename).collect()
    };

    // PyPI's 600 s: the second build asks nothing.
    let (index, seen) = page_server(600).await;
    for _ in 0..2 {
        let files = release(&http, &index, cache.path(), &r).await.unwrap();
        assert_eq!(wheels(files), ["six-1.17.0-py2.py3-none-any.whl"]);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [(false, false)],
        "one request for two builds"
    );

    // max-age=0: every build asks, with the ETag, and a 304 serves the cached page.
    let cache = tempfile::tempdir().unwrap();
    let (index, seen) = page_server(0).await;
    for _ in 0..3 {
        let files = release(&http, &index, cache.path(), &r).await.unwrap();
        assert_eq!(wheels(files), ["six-1.17.0-py2.py3-none-any.whl"]);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [(false, false), (true, true), (true, true)]
    );

    // A kept page that does not parse is neither used nor revalidated (the stand-in would
    // answer 304 to its ETag): the index is asked for the page anew.
    let (index, seen) = page_server(600).await;
    let cache = tempfile::tempdir().unwrap();
    release(&http, &index, cache.path(), &r).await.unwrap();
    let url = format!("{index}six/");
    let h = reqwest::header::HeaderMap::from_iter([
        (
            reqwest::header::CACHE_CONTROL,
            reqwest::header::HeaderValue::from_static("max-age=600"),
        ),
        (
            reqwest::header::ETAG,
            reqwest::header::HeaderValue::from_static("\"v1\""),
        ),
    ]);
    pages::write(cache.path(), &url, &h, b"{not json", None);
    let files = release(&http, &index, cache.path(), &r).await.unwrap();
    assert_eq!(wheels(files), ["six-1.17.0-py2.py3-none-any.whl"]);
    assert_eq!(
        *seen.lock().unwrap(),
        [(false, false), (false, false)],
        "asked again, without the ETag"
    );
}
