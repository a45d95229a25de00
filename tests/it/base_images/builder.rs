//! Dependencies installed inside the kiln-built builder image (bwrap or kiln's built-in
//! sandbox): npm packages, compiled Python extensions, zstd layers, the examples, and a build
//! Job run in the builder image itself; without a builder image a sandboxed install is a
//! usage error.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{base_build, base_build_with, example, functions};
use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, copy_tree, host_ca_bundle};
use common::schema::validate_layout;

/// Builds `fixture` with its dependencies installed inside `runtime`'s kiln-built builder image
/// (in `sandbox`: `bwrap` or `builtin`; never from the lock file by kiln alone), runs the
/// result and returns the body of `GET /` plus the layout path.
fn build_in_builder_and_call(
    sandbox: &str,
    runtime: &str,
    fixture: PathBuf,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (String, PathBuf, tempfile::TempDir) {
    build_in_builder_and_call_with(sandbox, runtime, fixture, headers, body, &[]).0
}

/// [`build_in_builder_and_call`] with more `kiln build` flags; also returns the reference.
fn build_in_builder_and_call_with(
    sandbox: &str,
    runtime: &str,
    fixture: PathBuf,
    headers: &[(&str, &str)],
    body: &[u8],
    flags: &[&str],
) -> ((String, PathBuf, tempfile::TempDir), String) {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, runtime, &bases);
    let dir = work.path().join("fn");
    copy_tree(&fixture, &dir);
    let out = work.path().join("out");
    let base = format!("oci:{}:{runtime}", bases.display());
    let builder = format!("oci:{}:{runtime}-builder", bases.display());
    // The build's own cache (not the shared download cache): the install must really run
    // here, whatever other tests or earlier runs left behind.
    let built = k.run_cmd(
        k.command()
            .env("KILN_SANDBOX", sandbox)
            .args([
                "build",
                dir.to_str().unwrap(),
                "--runtime",
                runtime,
                "--base",
                &base,
                "--builder-image",
                &builder,
                "--deps-sandbox",
                "bwrap",
                "--lockfile-install",
                "off",
                "--output",
                &format!("oci:{}", out.display()),
            ])
            .args(flags),
    );
    let reference = built.reference();
    assert!(
        built
            .stderr
            .contains("dependencies install inside the builder image"),
        "{}",
        built.stderr
    );
    assert_eq!(
        built.stderr.contains("using kiln's built-in sandbox"),
        sandbox == "builtin",
        "{}",
        built.stderr
    );
    let (port, _running) = serve(&k, &reference, &[]);
    let method = if body.is_empty() { "GET" } else { "POST" };
    let (status, answer) = http::request(port, method, "/", headers, body);
    assert_eq!(status, 200, "{answer}");
    ((answer, out, work), reference)
}

#[test]
fn a_zstd_image_has_zstd_layers_that_match_their_diff_ids_and_serves_the_function() {
    let zstd = ["--compression", "zstd"];
    let ((answer, out, _work), first) = build_in_builder_and_call_with(
        "bwrap",
        "nodejs22",
        functions("node-deps"),
        &[("Content-Type", "text/plain")],
        b"one two",
        &zstd,
    );
    assert!(answer.contains(r#"["one","two"]"#), "{answer}");
    validate_layout(&out);
    let blob = |d: &str| {
        std::fs::read(
            out.join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("index.json")).unwrap()).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    // The dependency and source layers are zstd, and decompress to their diff IDs; the base
    // layers stay as they are.
    for (layer, diff_id) in layers.iter().zip(diff_ids).rev().take(2) {
        assert_eq!(
            layer["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        let bytes = blob(layer["digest"].as_str().unwrap());
        let mut tar = Vec::new();
        std::io::Read::read_to_end(
            &mut ruzstd::decoding::StreamingDecoder::new(&bytes[..]).unwrap(),
            &mut tar,
        )
        .unwrap();
        let digest = format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&tar))
        );
        assert_eq!(&digest, diff_id);
    }
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    // Reproducible as a gzip image is: the tar is kiln's deterministic one, and the same
    // bytes always give the same frame (oci::zstd's unit test).
    assert!(first.contains("@sha256:"), "{first}");
}

#[test]
fn a_compiled_python_extension_installed_in_the_builder_matches_the_base_interpreter() {
    let (answer, out, _work) =
        build_in_builder_and_call("bwrap", "python313", functions("python-deps"), &[], b"");
    assert!(
        answer.contains("\"libyaml\": true"),
        "PyYAML's C extension loads: {answer}"
    );
    let listing = common::run(Command::new("sh").arg("-c").arg(format!(
        "for l in {}/blobs/sha256/*; do tar tzf $l 2>/dev/null || true; done",
        out.display()
    )));
    assert!(
        listing.contains("_yaml.cpython-313-x86_64-linux-gnu.so"),
        "the cp313 wheel was chosen"
    );
    assert!(
        !listing.contains("pip.conf"),
        "the pip config stays out of the image"
    );
}

#[test]
fn npm_dependencies_installed_in_the_builder_serve_the_function() {
    // kiln's built-in sandbox, as on a machine without bubblewrap.
    let (answer, out, _work) = build_in_builder_and_call(
        "builtin",
        "nodejs22",
        functions("node-deps"),
        &[("Content-Type", "text/plain")],
        b"one two",
    );
    assert!(
        answer.contains(r#"["one","two"]"#),
        "lodash works: {answer}"
    );
    let secret = common::run(Command::new("sh").arg("-c").arg(format!(
        "for l in {}/blobs/sha256/*; do (tar xzOf $l 2>/dev/null || cat $l); done | grep -c \
            KILN-SECRET-TOKEN || true",
        out.display()
    )));
    assert_eq!(
        secret.trim(),
        "0",
        "the .npmrc token never enters the image"
    );
}

#[test]
fn the_examples_build_and_answer_over_http() {
    let (answer, _, _work) = build_in_builder_and_call(
        "bwrap",
        "nodejs24",
        example("node-words"),
        &[("Content-Type", "text/plain")],
        b"to be or not to be",
    );
    assert!(
        answer.contains(r#""be":2"#) && answer.contains(r#""id":""#),
        "{answer}"
    );
    let (answer, _, _work) = build_in_builder_and_call(
        "bwrap",
        "python313",
        example("python-yaml"),
        &[("Content-Type", "text/plain")],
        b"a: [1, 2]",
    );
    assert!(
        answer.contains("\"libyaml\": true") && answer.contains("[1, 2]"),
        "{answer}"
    );
}

#[test]
fn a_sandboxed_install_without_a_builder_image_is_a_usage_error() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let dir = common::kiln::copy_fixture("node-deps", &work.path().join("fn"));
    let run = k.run(&[
        "build",
        dir.to_str().unwrap(),
        "--runtime=nodejs22",
        "--base",
        &common::kiln::tiny_base(),
        "--deps-sandbox",
        "bwrap",
        "--output",
        &format!("oci:{}", work.path().join("o").display()),
    ]);
    let err = run.failure(2);
    assert!(
        err.contains("--deps-sandbox bwrap needs --builder-image"),
        "{err}"
    );
}

/// `--env K=V` for every proxy variable set here, for the package downloads in the sandbox.
fn proxy_env_args() -> Vec<String> {
    let names = ["http_proxy", "https_proxy", "no_proxy"];
    let upper = names.map(str::to_uppercase);
    names
        .iter()
        .map(|n| n.to_string())
        .chain(upper)
        .filter_map(|k| {
            std::env::var(&k)
                .ok()
                .map(|v| ["--env".into(), format!("{k}={v}")])
        })
        .flatten()
        .collect()
}

/// `runtime`'s base and builder images in `work/bases`, the builder carrying a stripped kiln:
/// the same program, a fraction of the bytes to layer.
fn bases_with_stripped_kiln(k: &Kiln, runtime: &str, work: &Path) -> PathBuf {
    let binary = work.join("kiln");
    common::run(Command::new("strip").args([
        "-o",
        binary.to_str().unwrap(),
        env!("CARGO_BIN_EXE_kiln"),
    ]));
    let bases = work.join("bases");
    base_build_with(
        k,
        runtime,
        &bases,
        &["--kiln-binary", binary.to_str().unwrap()],
    );
    bases
}

#[test]
fn a_build_job_in_the_builder_image_installs_compiled_dependencies_natively() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = bases_with_stripped_kiln(&k, "python313", work.path());
    let builder = format!("oci:{}:python313-builder", bases.display());
    let config = common::run_bytes(Command::new("skopeo").args(["inspect", "--config", &builder]));
    assert_eq!(
        common::jq_raw(".config.Entrypoint | join(\" \")", &config),
        "/usr/local/bin/kiln"
    );
    assert_eq!(
        common::jq_raw(".config.Cmd | join(\" \")", &config),
        "build --help"
    );
    // Without arguments the builder explains itself.
    let help = k.run_cmd(k.command_with_shared_downloads().args(["run", &builder]));
    assert!(
        help.code == 0 && help.stdout.contains("Usage: kiln build"),
        "{help:?}"
    );

    // A build Job: the source read-only, an output directory, the base as an OCI layout; the
    // host CA bundle and proxy settings for pip; kiln's cache in the sandbox's /tmp.
    let src = work.path().join("src");
    copy_tree(&example("python-yaml"), &src);
    let out = work.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let volume = |host: &Path, dest: &str| format!("{}:{dest}", host.display());
    let job = k.run_cmd(
        k.command_with_shared_downloads()
            .args(["run", &builder])
            .args(["--volume", &volume(&bases, "/workspace/bases:ro")])
            .args(["--volume", &volume(&src, "/workspace/src:ro")])
            .args(["--volume", &volume(&out, "/workspace/out")])
            .args([
                "--volume",
                &volume(&host_ca_bundle(), "/tmp/host-ca.crt:ro"),
            ])
            .args(proxy_env_args())
            .args(["--", "build", "/workspace/src", "--runtime", "python313"])
            .args(["--base", "oci:/workspace/bases:python313"])
            .args(["--output", "oci:/workspace/out", "--deps-sandbox", "auto"])
            .args([
                "--ca-bundle",
                "/tmp/host-ca.crt",
                "--cache-dir",
                "/tmp/kiln-cache",
            ])
            // PyYAML==6.0.2 pins everything, so kiln would install the wheel itself
            // (tests/it/build_pinned.rs): this test is about pip in the Job.
            .args(["--lockfile-install", "off"]),
    );
    let reference = job.reference();
    // Natively: pip from the builder's own PATH, no nested sandbox.
    assert!(
        job.stderr.contains("installing dependencies")
            && job.stderr.contains("python3 -m pip install")
            && job.stderr.contains("the toolchain on PATH")
            && !job
                .stderr
                .contains("dependencies install inside the builder image"),
        "{}",
        job.stderr
    );
    let digest = reference
        .strip_prefix("oci:/workspace/out@")
        .unwrap_or_else(|| panic!("{reference}"));
    validate_layout(&out);
    let built = format!("oci:{}@{digest}", out.display());
    let (port, _running) = serve(&k, &built, &[]);
    let (status, answer) = http::request(
        port,
        "POST",
        "/",
        &[("Content-Type", "text/plain")],
        b"a: [1, 2]",
    );
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains("\"libyaml\": true") && answer.contains("[1, 2]"),
        "PyYAML's C extension, built in the builder, loads in the base: {answer}"
    );
}

/// A build Job's git source over SSH, in the builder image as the controller runs it: the
/// builder's own `ssh` (Debian's openssh-client, locked with the rest) reaches a loopback
/// `sshd` with the key of a mounted Secret, as user 1000 on a read-only root, and a host key
/// not in `knownHosts` stops it.
#[test]
fn a_build_job_fetches_a_git_source_over_ssh_with_the_builders_own_ssh() {
    use common::git::Repo;
    use common::sshd::SshServer;
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = bases_with_stripped_kiln(&k, "nodejs22", work.path());
    let builder = format!("oci:{}:nodejs22-builder", bases.display());
    let sshd = SshServer::start();
    let repo = Repo::init(&work.path().join("src"));
    repo.write(
        "fn/handler.js",
        b"module.exports = { main: () => 'from the job' };\n",
    );
    repo.commit("ssh");
    repo.publish(work.path(), "fns");
    let url = sshd.url(&work.path().join("fns.git"));
    let volume = |host: &Path, dest: &str| format!("{}:{dest}", host.display());
    let job = |auth: &Path, out: &Path| {
        k.run_cmd(
            k.command_with_shared_downloads()
                .args(["run", &builder])
                .args(["--volume", &volume(&bases, "/workspace/bases:ro")])
                .args(["--volume", &volume(auth, "/workspace/git:ro")])
                .args(["--volume", &volume(out, "/workspace/out")])
                .args(["--", "build", "--git", &url, "--git-base-dir", "fn"])
                .args(["--git-auth-dir", "/workspace/git", "--runtime", "nodejs22"])
                .args(["--base", "oci:/workspace/bases:nodejs22"])
                .args(["--output", "oci:/workspace/out"])
                .args(["--cache-dir", "/tmp/kiln-cache"]),
        )
    };
    let pinned = sshd.auth_dir(&sshd.key(), None, Some(&sshd.known_hosts()));
    let out = work.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let built = job(&pinned, &out);
    assert_eq!(built.code, 0, "{}\n{}", built.stderr, sshd.log());
    let digest = built.reference();
    let digest = digest.rsplit('@').next().unwrap();
    let (port, _running) = serve(&k, &format!("oci:{}@{digest}", out.display()), &[]);
    let (status, answer) = http::request(port, "GET", "/", &[], b"");
    assert_eq!((status, answer.as_str()), (200, "from the job"));
    // The same Job with a knownHosts entry for another key fails, naming the host key.
    let mismatch = sshd.auth_dir(&sshd.key(), None, Some(&sshd.wrong_known_hosts()));
    let out = work.path().join("out-mismatch");
    std::fs::create_dir(&out).unwrap();
    let refused = job(&mismatch, &out);
    assert_ne!(refused.code, 0);
    assert!(
        refused
            .stderr
            .contains("is not one of the Secret's knownHosts"),
        "{}",
        refused.stderr
    );
}
