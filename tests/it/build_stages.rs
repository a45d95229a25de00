//! The split build of a build Job: `--stage deps` installs (real npm and pip, inside a
//! kiln-built builder image) into a stage directory, `--stage publish` assembles from it
//! without running any program, and the image is byte-identical to a whole build's. Publish
//! trusts nothing in the stage directory: symlinks, changed bytes and records of another
//! Function are refused, naming the file.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::kiln::{Kiln, Run, copy_fixture, kiln_built_builder, tiny_base};
use common::schema::validate_layout;

/// The `sha256:…` part of a printed reference.
fn digest(run: &Run) -> String {
    run.reference().rsplit('@').next().unwrap().to_string()
}

/// A directory of programs that the publish stage must never run: each records its name in
/// `ran` and fails.
fn tripwire_path(work: &Path) -> (PathBuf, PathBuf) {
    let (bin, ran) = (work.join("tripwire-bin"), work.join("ran"));
    fs::create_dir_all(&bin).unwrap();
    for tool in [
        "npm", "node", "npx", "python3", "pip", "bwrap", "unshare", "sh", "git",
    ] {
        let path = bin.join(tool);
        fs::write(
            &path,
            format!("#!/bin/sh\necho {tool} >> {}\nexit 1\n", ran.display()),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    (bin, ran)
}

struct Split {
    kiln: Kiln,
    work: tempfile::TempDir,
    function: PathBuf,
    runtime: &'static str,
    builder: Option<String>,
}

impl Split {
    fn new(fixture: &str, runtime: &'static str, with_builder: bool) -> Split {
        let kiln = Kiln::new();
        let work = tempfile::tempdir().unwrap();
        let builder =
            with_builder.then(|| kiln_built_builder(&kiln, runtime, &work.path().join("bases")));
        let function = copy_fixture(fixture, &work.path().join("fn"));
        Split {
            kiln,
            work,
            function,
            runtime,
            builder,
        }
    }

    fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "build",
            self.function.to_str().unwrap(),
            "--runtime",
            self.runtime,
            "--base",
            &tiny_base(),
        ]
        .map(String::from)
        .to_vec();
        if let Some(builder) = &self.builder {
            args.extend(["--builder-image".into(), builder.clone()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn deps(&self, stage: &Path) -> Run {
        common::require_tool("bwrap", "bubblewrap");
        self.kiln.run_cmd(self.kiln.command().args(self.args(&[
            "--stage",
            "deps",
            "--stage-dir",
            stage.to_str().unwrap(),
        ])))
    }

    /// Publishes from `stage` into a fresh layout with a PATH of tripwires and a fresh cache:
    /// nothing of the install is at hand, and nothing may run.
    fn publish(&self, stage: &Path, name: &str) -> (Run, PathBuf) {
        let out = self.work.path().join(name);
        let (bin, ran) = tripwire_path(self.work.path());
        let fresh = Kiln::new();
        let args = self.args(&[
            "--stage",
            "publish",
            "--stage-dir",
            stage.to_str().unwrap(),
            "--output",
            &format!("oci:{}", out.display()),
        ]);
        let run = fresh.run_cmd(fresh.command().env("PATH", &bin).args(args));
        assert!(
            !ran.exists(),
            "publish ran {}",
            fs::read_to_string(&ran).unwrap_or_default()
        );
        (run, out)
    }

    fn all(&self, name: &str) -> (Run, PathBuf) {
        let out = self.work.path().join(name);
        let run = self.kiln.run_cmd(
            self.kiln
                .command()
                .args(self.args(&["--output", &format!("oci:{}", out.display())])),
        );
        (run, out)
    }
}

/// Deps, then publish, then a whole build (sharing the deps stage's cache: it must hit the
/// very layer the deps stage made, so the key is the same): the same image.
fn split_equals_whole(split: &Split) -> PathBuf {
    let stage = split.work.path().join("stage");
    let deps = split.deps(&stage);
    let layer = deps.reference();
    assert!(
        layer.starts_with("sha256:"),
        "deps prints the layer digest: {layer}"
    );
    assert!(
        deps.stderr.contains("installing dependencies"),
        "{}",
        deps.stderr
    );
    let (published, layout) = split.publish(&stage, "published");
    let split_digest = digest(&published);
    validate_layout(&layout);
    let (whole, _) = split.all("whole");
    assert!(
        whole.stderr.contains("dependency layer from cache"),
        "same key: {}",
        whole.stderr
    );
    assert_eq!(
        split_digest,
        digest(&whole),
        "deps + publish builds the image a whole build does"
    );
    let record = fs::read_to_string(stage.join("dependencies.json")).unwrap();
    assert!(record.contains(&layer), "{record}");
    for secret in [
        "KILN-SECRET-TOKEN",
        "KILN-PIP-SECRET",
        "_authToken",
        "extra-index-url",
    ] {
        assert!(
            !record.contains(secret),
            "the record holds no registry config: {record}"
        );
    }
    stage
}

/// Publishing from a copy of `stage` changed by `tamper` fails with exit 2, naming `names`.
fn refused(split: &Split, stage: &Path, case: &str, tamper: impl Fn(&Path), names: &[&str]) {
    let copy = split.work.path().join(format!("stage-{case}"));
    common::kiln::copy_tree(stage, &copy);
    tamper(&copy);
    let (run, out) = split.publish(&copy, &format!("out-{case}"));
    let err = run.failure(2);
    for name in names {
        assert!(err.contains(name), "{case}: {name:?} missing in {err}");
    }
    assert!(
        !out.join("index.json").exists(),
        "{case}: nothing is written"
    );
}

#[test]
fn node_deps_then_publish_equals_a_whole_build_and_publish_trusts_nothing_in_the_stage() {
    let split = Split::new("node-deps", "nodejs22", true);
    let stage = split_equals_whole(&split);
    let record = stage.join("dependencies.json");
    let outside = split.work.path().join("registry-credentials.json");
    fs::write(&outside, "{\"auths\":{\"reg\":{\"auth\":\"c2VjcmV0\"}}}").unwrap();

    refused(
        &split,
        &stage,
        "symlinked-blob",
        |dir| {
            fs::remove_file(dir.join("dependencies.tar.gz")).unwrap();
            std::os::unix::fs::symlink(&outside, dir.join("dependencies.tar.gz")).unwrap();
        },
        &["dependencies.tar.gz is a symlink, not a regular file"],
    );
    refused(
        &split,
        &stage,
        "symlinked-record",
        |dir| {
            fs::remove_file(dir.join("dependencies.json")).unwrap();
            std::os::unix::fs::symlink(&record, dir.join("dependencies.json")).unwrap();
        },
        &["dependencies.json is a symlink"],
    );
    refused(
        &split,
        &stage,
        "changed-bytes",
        |dir| {
            let mut bytes = fs::read(dir.join("dependencies.tar.gz")).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x55;
            fs::write(dir.join("dependencies.tar.gz"), bytes).unwrap();
        },
        &["dependencies.tar.gz does not match its record: digest is sha256:"],
    );
    refused(
        &split,
        &stage,
        "appended-bytes",
        |dir| {
            let mut bytes = fs::read(dir.join("dependencies.tar.gz")).unwrap();
            bytes.extend_from_slice(b"more");
            fs::write(dir.join("dependencies.tar.gz"), bytes).unwrap();
        },
        &["does not match its record: size is"],
    );
    refused(
        &split,
        &stage,
        "directory-blob",
        |dir| {
            fs::remove_file(dir.join("dependencies.tar.gz")).unwrap();
            fs::create_dir(dir.join("dependencies.tar.gz")).unwrap();
        },
        &["dependencies.tar.gz is a directory"],
    );

    // A record made for another Function's dependencies.
    let other = copy_fixture("node-deps", &split.work.path().join("other-fn"));
    fs::write(
        other.join("package.json"),
        fs::read_to_string(other.join("package.json"))
            .unwrap()
            .replace("4.17.21", "4.17.20"),
    )
    .unwrap();
    let other_split = Split {
        kiln: Kiln::new(),
        work: tempfile::tempdir().unwrap(),
        function: other,
        runtime: "nodejs22",
        builder: None,
    };
    let (run, _) = other_split.publish(&stage, "other");
    let err = run.failure(2);
    assert!(
        err.contains(&format!(
            "{} does not describe this build: its dependency manifest digest is sha256:",
            record.display()
        )),
        "{err}"
    );
}

#[test]
fn python_deps_then_publish_equals_a_whole_build() {
    let split = Split::new("python-deps", "python313", true);
    split_equals_whole(&split);
}

#[test]
fn a_function_without_dependencies_stages_none_and_needs_no_builder() {
    let split = Split::new("hello-node", "nodejs22", false);
    let stage = split.work.path().join("stage");
    let deps = split.deps(&stage);
    assert_eq!(deps.reference(), "none");
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(stage.join("dependencies.json")).unwrap()).unwrap();
    assert_eq!(record["dependencies"], serde_json::Value::Null);
    assert!(!stage.join("dependencies.tar.gz").exists());
    let (published, _) = split.publish(&stage, "published");
    let (whole, _) = split.all("whole");
    assert_eq!(digest(&published), digest(&whole));

    // The stage of a Function without dependencies does not fit one with them.
    let with_deps = Split {
        kiln: Kiln::new(),
        work: tempfile::tempdir().unwrap(),
        function: copy_fixture("node-deps", &split.work.path().join("deps-fn")),
        runtime: "nodejs22",
        builder: None,
    };
    let (run, _) = with_deps.publish(&stage, "mismatch");
    let err = run.failure(2);
    assert!(err.contains("does not describe this build"), "{err}");
}

#[test]
fn stage_flags_are_checked() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let base = tiny_base();
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--stage",
        "publish",
    ]);
    let err = run.failure(2);
    assert!(err.contains("--stage-dir"), "{err}");
    let missing = work.path().join("never-staged");
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--stage",
        "publish",
        "--stage-dir",
        missing.to_str().unwrap(),
        "--output",
        &format!("oci:{}", work.path().join("out").display()),
    ]);
    let err = run.failure(2);
    assert!(
        err.contains("never-staged")
            && err.contains("run the stage that writes it")
            && err.contains("`kiln build --stage deps --stage-dir DIR`"),
        "{err}"
    );
    // The lookup stage writes --lookup-dir and asks --cache-repo: both are needed, and a
    // whole build has no use for a lookup directory.
    let lookup = work.path().join("lookup");
    let common = [
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
    ];
    for (extra, needs) in [
        (
            vec!["--stage", "lookup", "--cache-repo", "127.0.0.1:5000/cache"],
            "--lookup-dir",
        ),
        (
            vec![
                "--stage",
                "lookup",
                "--lookup-dir",
                lookup.to_str().unwrap(),
            ],
            "--cache-repo",
        ),
        (
            vec!["--lookup-dir", lookup.to_str().unwrap()],
            "--lookup-dir is for split builds",
        ),
    ] {
        let args: Vec<&str> = common.iter().copied().chain(extra).collect();
        let run = kiln.run(&args);
        let err = run.failure(2);
        assert!(err.contains(needs), "{needs}: {err}");
    }
}

#[test]
fn a_mounted_package_registry_config_replaces_the_functions_own() {
    let split = Split::new("node-deps", "nodejs22", true);
    // A Kubernetes Secret volume: the file is a symlink into a timestamped ..data directory.
    let mount = split.work.path().join("npm-secret");
    let data = mount.join("..2025_01_01_00_00_00.000000000");
    fs::create_dir_all(&data).unwrap();
    fs::write(
        data.join(".npmrc"),
        "registry=http://127.0.0.1:9/\nfetch-retries=0\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(data.file_name().unwrap(), mount.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/.npmrc", mount.join(".npmrc")).unwrap();
    let stage = split.work.path().join("stage");
    let run = split.kiln.run_cmd(split.kiln.command().args(split.args(&[
        "--stage",
        "deps",
        "--stage-dir",
        stage.to_str().unwrap(),
        "--package-registry-config",
        mount.to_str().unwrap(),
    ])));
    let err = run.failure(1);
    assert!(
        err.contains("127.0.0.1:9"),
        "npm used the mounted registry: {err}"
    );
}
