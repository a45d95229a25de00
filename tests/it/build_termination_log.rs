//! `--termination-log PATH`, what Kubernetes shows as a build container's termination
//! message: the printed reference on success; on failure the error as printed, with npm's own
//! error lines for a failed install, at most 4096 bytes and without secrets; and usage errors,
//! even those of flags this kiln does not know.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::kiln::{Kiln, Run, copy_fixture, kiln_built_builder, tiny_base};

/// Runs `kiln build DIR --runtime nodejs22 --base tiny ARGS --termination-log F` and
/// returns the run and F's content.
fn build(kiln: &Kiln, dir: &Path, args: &[&str]) -> (Run, String) {
    let log = dir.with_extension("termination-log");
    let base = tiny_base();
    let mut all = vec!["build", dir.to_str().unwrap(), "--base", &base];
    all.extend_from_slice(args);
    all.extend(["--termination-log", log.to_str().unwrap()]);
    let run = kiln.run(&all);
    let message = fs::read_to_string(&log)
        .unwrap_or_else(|e| panic!("no termination log ({e}): {}", run.stderr));
    (run, message)
}

fn output(work: &Path) -> String {
    format!("oci:{}", work.join("out").display())
}

/// A Node.js Function whose install fails.
fn failing_function(work: &Path, npmrc: Option<&str>) -> (PathBuf, String) {
    let dir = copy_fixture("hello-node", &work.join("fn"));
    fs::write(
        dir.join("package.json"),
        r#"{"dependencies": {"kiln-no-such-package-4d1e9": "1.0.0"}}"#,
    )
    .unwrap();
    if let Some(npmrc) = npmrc {
        fs::write(dir.join(".npmrc"), npmrc).unwrap();
    }
    let builder = kiln_built_builder(&Kiln::new(), "nodejs22", &work.join("bases"));
    (dir, builder)
}

#[test]
fn a_successful_build_records_exactly_the_printed_reference() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let (run, message) = build(
        &kiln,
        &dir,
        &["--runtime", "nodejs22", "--output", &output(work.path())],
    );
    assert_eq!(message, run.reference());
}

#[test]
fn a_failed_npm_install_records_npms_error() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let (dir, builder) = failing_function(work.path(), None);
    let out = output(work.path());
    let (run, message) = build(
        &kiln,
        &dir,
        &[
            "--runtime",
            "nodejs22",
            "--builder-image",
            &builder,
            "--output",
            &out,
        ],
    );
    let stderr = run.failure(1);
    assert!(message.len() <= 4096, "{}", message.len());
    assert!(
        message.starts_with("installing dependencies: `npm install --omit=dev"),
        "{message}"
    );
    assert!(
        message.contains("npm error") && message.contains("kiln-no-such-package-4d1e9"),
        "npm's own error: {message}"
    );
    assert!(
        stderr.contains(&format!("error: {message}")),
        "the message is the error as printed:\n{stderr}"
    );
}

#[test]
fn a_failed_install_leaks_no_registry_credentials_into_the_message() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let npmrc = "registry=http://kiln:KILN-TERM-SECRET-77@127.0.0.1:9/\nfetch-retries=0\n//\
        127.0.0.1:9/:_authToken=KILN-TERM-TOKEN-88\n";
    let (dir, builder) = failing_function(work.path(), Some(npmrc));
    let out = output(work.path());
    let (run, message) = build(
        &kiln,
        &dir,
        &[
            "--runtime",
            "nodejs22",
            "--builder-image",
            &builder,
            "--output",
            &out,
        ],
    );
    run.failure(1);
    assert!(message.contains("installing dependencies"), "{message}");
    assert!(
        message.contains("127.0.0.1:9"),
        "npm names the registry: {message}"
    );
    for secret in ["KILN-TERM-SECRET-77", "KILN-TERM-TOKEN-88"] {
        assert!(!message.contains(secret), "{secret} leaked: {message}");
        assert!(
            !run.stderr.contains(secret),
            "{secret} leaked: {}",
            run.stderr
        );
    }
}

#[test]
fn usage_errors_are_recorded_too() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let (run, message) = build(&kiln, &dir, &["--output", &output(work.path())]);
    run.failure(2);
    assert!(
        message.starts_with("--runtime is required; known runtimes: nodejs22"),
        "{message}"
    );

    // A flag this kiln does not know (a controller newer than the builder image's kiln).
    let (run, message) = build(&kiln, &dir, &["--runtime", "nodejs22", "--no-such-flag"]);
    run.failure(2);
    assert!(
        message.contains("unexpected argument '--no-such-flag'"),
        "{message}"
    );
}
