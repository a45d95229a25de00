//! `kiln run` end to end, black-box on the binary: images made with umoci from Debian's static
//! busybox (plus hand-made layers with OCI whiteouts), run from OCI layouts and from a real
//! registry, each in both sandboxes (bubblewrap and kiln's built-in one on util-linux
//! `unshare`); HTTP on the host network, the image's user or `--user` ids, `--entrypoint`, a
//! read-only root, a bound termination-log file, whiteouts, exit codes, signal forwarding and
//! the rootfs cache.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::images::{EPOCH, make_layout, tagged_digest, umoci};
use common::kiln::Kiln;
use common::registry::{Registry, RegistryKind};
use common::{free_port, run};

const CREATED: &str = "2000-01-01T00:00:00Z";
const INDEX_HTML: &str = "<h1>hello from kiln run</h1>\n";
/// Prints the ids, the shell's pid (2: under the sandbox's init, in its own PID namespace), the
/// effective and permitted capabilities, and whether / and /tmp are writable.
const WHO_AM_I: &str = "busybox id -u; busybox id -g; echo HOME=$HOME; echo pid=$$; \
     busybox grep -E '^Cap(Eff|Prm)' /proc/self/status; \
     if busybox touch /x 2>/dev/null; then echo root-writable; else echo root-read-only; fi; \
     busybox touch /tmp/y && echo tmp-writable";

/// Exits 5 on SIGINT, after saying so.
const TRAP: &str = "--config.entrypoint=trap 'echo got-INT; exit 5' INT; echo ready; \
     while true; do busybox sleep 0.1; done";

/// Writes `files` (path, content; a path ending in `/` is a directory) under a fresh
/// directory and packs it as an uncompressed, reproducible tar.
fn tar_layer(dir: &Path, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let stage = dir.join(format!("{name}-stage"));
    for (path, content) in files {
        let target = stage.join(path);
        if path.ends_with('/') {
            fs::create_dir_all(&target).unwrap();
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).unwrap();
        } else {
            fs::create_dir_all(target.parent().unwrap()).unwrap();
            fs::write(&target, content).unwrap();
            fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let tar = dir.join(format!("{name}.tar"));
    run(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .arg(format!("--mtime=@{EPOCH}"))
        .arg("-C")
        .arg(&stage)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    tar
}

/// An OCI layout in `dir/layout` with the busybox base plus two layers: the first adds
/// /www/index.html, /data/{gone,kept}.txt and /olddir/{a,b}.txt; the second deletes
/// /data/gone.txt (whiteout) and replaces /olddir's contents with new.txt (opaque whiteout).
/// Tags, all on those layers:
/// - `web`: serves /www with busybox httpd on $FUNC_PORT;
/// - `user`: runs as user 1000 and prints [`WHO_AM_I`];
/// - `exit`: Entrypoint `sh -c`, Cmd `echo bye; exit 42`;
/// - `layers`: lists /data and /olddir;
/// - `trap`: prints `ready`, then waits for SIGINT and exits 5.
pub(crate) fn function_layout(dir: &Path) -> PathBuf {
    let layout = make_layout(dir);
    let l = layout.to_str().unwrap();
    let lower = tar_layer(
        dir,
        "lower",
        &[
            ("www/index.html", INDEX_HTML),
            ("data/gone.txt", "gone"),
            ("data/kept.txt", "kept"),
            ("olddir/a.txt", "a"),
            ("olddir/b.txt", "b"),
        ],
    );
    let upper = tar_layer(
        dir,
        "upper",
        &[
            ("data/.wh.gone.txt", ""),
            ("olddir/", ""),
            ("olddir/.wh..wh..opq", ""),
            ("olddir/new.txt", "new"),
        ],
    );
    let fun = format!("{l}:fn");
    let history = ["--history.created", CREATED];
    run(umoci(&[
        "raw",
        "add-layer",
        "--image",
        &format!("{l}:base"),
        "--tag",
        "fn",
    ])
    .args(history)
    .arg(&lower));
    run(umoci(&["raw", "add-layer", "--image", &fun])
        .args(history)
        .arg(&upper));
    let shell = |extra: &[&str]| -> Vec<String> {
        ["--config.entrypoint=/bin/sh", "--config.entrypoint=-c"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let who_am_i = format!("--config.entrypoint={WHO_AM_I}");
    let tags = [
        (
            "web",
            shell(&["--config.entrypoint=exec busybox httpd -f -p \"$FUNC_PORT\" -h /www"]),
        ),
        ("user", shell(&[&who_am_i, "--config.user=1000"])),
        ("exit", shell(&["--config.cmd=echo bye; exit 42"])),
        (
            "layers",
            shell(&["--config.entrypoint=busybox ls /data /olddir; cat /data/kept.txt"]),
        ),
        ("trap", shell(&[TRAP])),
    ];
    for (tag, args) in tags {
        run(umoci(&["config", "--image", &fun, "--tag", tag])
            .args(["--created", CREATED, "--no-history", "--clear=config.cmd"])
            .args(&args));
    }
    run(&mut umoci(&["gc", "--layout", l]));
    layout
}

pub(crate) fn oci(layout: &Path, tag: &str) -> String {
    format!("oci:{}:{tag}", layout.display())
}

/// Sends `signal` (`-TERM`, `-INT`) to a process with the `kill` utility.
fn kill(child: &Child, signal: &str) {
    run(Command::new("kill").arg(signal).arg(child.id().to_string()));
}

/// Waits up to `limit` for `child` to exit and returns its exit code.
fn wait_for(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        sleep(Duration::from_millis(20));
    }
    None
}

/// `GET path` over plain HTTP/1.0 on 127.0.0.1, returning the whole response.
pub(crate) fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

fn a_function_serves_http_on_the_host_port_and_stops_promptly_on_sigterm(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let port = free_port();
    let stderr = kiln.home.path().join("stderr.log");
    let mut child = command(&kiln, sandbox)
        .args(["run", &oci(&layout, "web"), "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let response = loop {
        if let Some(r) = http_get(port, "/index.html").filter(|r| r.contains(" 200 ")) {
            break r;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "kiln exited ({status}):\n{}",
                fs::read_to_string(&stderr).unwrap()
            );
        }
        assert!(Instant::now() < deadline, "no HTTP answer on port {port}");
        sleep(Duration::from_millis(50));
    };
    assert!(response.ends_with(INDEX_HTML), "{response}");
    let stopping = Instant::now();
    kill(&child, "-TERM");
    let code = wait_for(&mut child, Duration::from_secs(5));
    let log = fs::read_to_string(&stderr).unwrap();
    assert_eq!(code, Some(128 + 15), "httpd dies of SIGTERM:\n{log}");
    assert!(stopping.elapsed() < Duration::from_secs(3), "{log}");
    assert!(log.contains("forwarded signal"), "{log}");
    assert!(
        http_get(port, "/index.html").is_none(),
        "the server is gone"
    );
}

fn the_function_runs_as_the_images_user_with_a_read_only_root_and_a_writable_tmp(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let out = run_in(&kiln, sandbox, &["run", &oci(&layout, "user")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "1000\n1000\nHOME=/home/user\npid=2\nCapPrm:\t0000000000000000\n\
         CapEff:\t0000000000000000\nroot-read-only\ntmp-writable\n",
        "{}",
        out.stderr
    );
}

fn whiteouts_and_opaque_directories_of_later_layers_hide_lower_files(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let out = run_in(&kiln, sandbox, &["run", &oci(&layout, "layers")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout, "/data:\nkept.txt\n\n/olddir:\nnew.txt\nkept",
        "{}",
        out.stderr
    );
}

fn the_entrypoints_exit_code_is_kilns_exit_code_for_what_kiln_build_prints(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    // `kiln build --output oci:DIR` prints `oci:DIR@sha256:…`, DIR as given (here relative).
    let printed = format!("oci:layout@{}", tagged_digest(&layout, "exit"));
    let out = kiln.run_cmd(
        command(&kiln, sandbox)
            .current_dir(kiln.home.path())
            .args(["run", &printed]),
    );
    assert_eq!(out.code, 42, "{}", out.stderr);
    assert_eq!(out.stdout, "bye\n");
    let out = run_in(
        &kiln,
        sandbox,
        &["run", &oci(&layout, "exit"), "--", "exit 3"],
    );
    assert_eq!(out.code, 3, "arguments replace Cmd: {}", out.stderr);
}

fn a_registry_image_runs_by_digest_and_a_second_run_reuses_the_cached_rootfs(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let reg = Registry::start(RegistryKind::Plain);
    let tagged = reg.reference("fn/user:v1");
    reg.skopeo_copy_from_layout(&layout, "user", &tagged, None);
    let pinned = reg.reference(&format!("fn/user@{}", tagged_digest(&layout, "user")));
    let host = reg.host();
    let blob_gets = || {
        reg.settled_access_log()
            .iter()
            .filter(|l| l.starts_with("GET /v2/fn/user/blobs/"))
            .count()
    };

    let first = run_in(
        &kiln,
        sandbox,
        &["run", &pinned, "--insecure-registry", &host],
    );
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(first.stdout.starts_with("1000\n1000\n"), "{}", first.stdout);
    assert!(
        !first.stderr.contains("rootfs from cache"),
        "{}",
        first.stderr
    );
    let fetched = blob_gets();
    assert!(
        fetched >= 4,
        "config and three layers: {:?}",
        reg.access_log()
    );

    for image in [&pinned, &tagged] {
        let again = run_in(
            &kiln,
            sandbox,
            &["run", image, "--insecure-registry", &host],
        );
        assert_eq!(again.code, 0, "{}", again.stderr);
        assert_eq!(again.stdout, first.stdout);
        assert!(
            again.stderr.contains("rootfs from cache"),
            "{}",
            again.stderr
        );
    }
    assert_eq!(blob_gets(), fetched, "{:?}", reg.settled_access_log());
}

/// Tags a copy of image `tag` whose manifest lists its last layer a second time (an image may
/// repeat a blob: identical layers of two build steps), as `new_tag`.
fn with_repeated_last_layer(layout: &Path, tag: &str, new_tag: &str) {
    use common::images::{read_blob, write_blob};
    let manifest_digest = tagged_digest(layout, tag);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&read_blob(layout, &manifest_digest)).unwrap();
    let last = manifest["layers"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    manifest["layers"].as_array_mut().unwrap().push(last);
    let config_digest = manifest["config"]["digest"].as_str().unwrap().to_string();
    let mut config: serde_json::Value =
        serde_json::from_slice(&read_blob(layout, &config_digest)).unwrap();
    let diff_id = config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    config["rootfs"]["diff_ids"]
        .as_array_mut()
        .unwrap()
        .push(diff_id);
    config.as_object_mut().unwrap().remove("history");
    let (config_digest, config_size) = write_blob(layout, &serde_json::to_vec(&config).unwrap());
    manifest["config"]["digest"] = config_digest.into();
    manifest["config"]["size"] = config_size.into();
    let (digest, size) = write_blob(layout, &serde_json::to_vec(&manifest).unwrap());
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&fs::read(&index_path).unwrap()).unwrap();
    index["manifests"].as_array_mut().unwrap().push(serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
        "annotations": {"org.opencontainers.image.ref.name": new_tag},
    }));
    fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

fn an_image_that_lists_the_same_layer_twice_runs(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    with_repeated_last_layer(&layout, "user", "twice");
    let reg = Registry::start(RegistryKind::Plain);
    let tagged = reg.reference("fn/twice:v1");
    reg.skopeo_copy_from_layout(&layout, "twice", &tagged, None);
    let out = run_in(
        &kiln,
        sandbox,
        &["run", &tagged, "--insecure-registry", &reg.host()],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("1000\n1000\n"), "{}", out.stdout);
}

fn sigint_reaches_the_function_which_exits_gracefully_with_its_own_code(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let mut child = command(&kiln, sandbox)
        .args(["run", &oci(&layout, "trap")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    kill(&child, "-INT");
    let code = wait_for(&mut child, Duration::from_secs(5));
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(code, Some(5), "{stderr}");
    assert_eq!(rest, "got-INT\n", "{stderr}");
}

#[test]
fn without_bubblewrap_on_path_kiln_picks_its_built_in_sandbox() {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    // A PATH with util-linux's tools and `true` (the probe), but no bwrap.
    let bin = kiln.home.path().join("bin");
    fs::create_dir(&bin).unwrap();
    for tool in ["unshare", "setpriv", "true"] {
        let host = ["/usr/bin", "/bin"]
            .map(|dir| Path::new(dir).join(tool))
            .into_iter()
            .find(|p| p.exists())
            .unwrap();
        std::os::unix::fs::symlink(host, bin.join(tool)).unwrap();
    }
    let out = kiln.run_cmd(
        kiln.command()
            .env("PATH", &bin)
            .env_remove("KILN_SANDBOX")
            .args(["run", &oci(&layout, "user")]),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("1000\n1000\n"), "{}", out.stdout);
    assert!(out.stderr.contains("built-in sandbox"), "{}", out.stderr);
}

fn user_ids_replace_the_images_user_and_the_group_defaults_to_the_user_id(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let image = oci(&layout, "user");
    let out = run_in(&kiln, sandbox, &["run", &image, "--user", "10001:10002"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // No passwd entry for 10001: HOME is /.
    assert!(
        out.stdout.starts_with("10001\n10002\nHOME=/\npid=2\n"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.ends_with("root-read-only\ntmp-writable\n"));
    let out = run_in(&kiln, sandbox, &["run", &image, "--user", "4242"]);
    assert!(out.stdout.starts_with("4242\n4242\n"), "{}", out.stderr);
    let out = run_in(&kiln, sandbox, &["run", &image, "--user", "nobody"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("UID or UID:GID"), "{}", out.stderr);
}

fn an_entrypoint_replaces_the_images_and_drops_its_cmd(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let image = oci(&layout, "exit");
    let json = r#"["/bin/sh","-c","echo custom; exit 7"]"#;
    let out = run_in(&kiln, sandbox, &["run", &image, "--entrypoint", json]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (7, "custom\n"),
        "{}",
        out.stderr
    );
    let args = [
        "run",
        &image,
        "--entrypoint",
        "/bin/sh",
        "--",
        "-c",
        "exit 4",
    ];
    let out = run_in(&kiln, sandbox, &args);
    assert_eq!(out.code, 4, "{}", out.stderr);
}

fn a_host_file_bound_at_dev_termination_log_receives_what_the_function_writes(sandbox: &str) {
    let kiln = Kiln::new();
    let layout = function_layout(kiln.home.path());
    let log = kiln.home.path().join("termination-log");
    fs::write(&log, "").unwrap();
    let volume = format!("{}:/dev/termination-log", log.display());
    let script = r#"["/bin/sh","-c","echo -n image@sha256:abc > /dev/termination-log"]"#;
    let out = run_in(
        &kiln,
        sandbox,
        &[
            "run",
            &oci(&layout, "exit"),
            "--volume",
            &volume,
            "--entrypoint",
            script,
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(fs::read_to_string(&log).unwrap(), "image@sha256:abc");
}

/// Four `kiln run`s of one image from a registry at once, with an empty cache: each runs the
/// image, the cache ends with one unpacked root file system, and no staging area is left.
fn concurrent_runs_unpacking_the_same_image_all_run_and_leave_one_cache_entry(sandbox: &str) {
    let kiln = Kiln::new();
    let (reg, tagged) = pushed_user_image(&kiln);
    let host = reg.host();
    let children: Vec<_> = (0..4)
        .map(|_| {
            command(&kiln, sandbox)
                .args(["run", &tagged, "--insecure-registry", &host])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut unpacked = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("1000\n1000\n"),
            "{stderr}"
        );
        unpacked += stderr.matches("unpacking image").count();
    }
    // One unpacked it; the others waited for it and used the cache.
    assert_eq!(unpacked, 1);
    let rootfs = kiln.cache_dir().join("rootfs");
    let entries: Vec<_> = fs::read_dir(rootfs.join("sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let staging: Vec<_> = fs::read_dir(rootfs.join("tmp"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(staging.is_empty(), "staging areas left: {staging:?}");
}

/// Three long-running `kiln run`s of one image started at once with an empty cache (as a
/// kubelet starts a Deployment's replicas): each starts while the others run. One unpacks;
/// the others wait for the unpack, not for the first container to exit.
fn concurrent_long_running_runs_of_one_image_all_start(sandbox: &str) {
    let kiln = Kiln::new();
    let (reg, tagged) = pushed_user_image(&kiln);
    let host = reg.host();
    let entrypoint = r#"["/bin/sh", "-c", "echo started; exec busybox sleep 60"]"#;
    let mut children: Vec<Child> = (0..3)
        .map(|_| {
            command(&kiln, sandbox)
                .args(["run", &tagged, "--insecure-registry", &host])
                .args(["--entrypoint", entrypoint])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for child in &mut children {
        let stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut started = 0;
    while started < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == "started\n" => started += 1,
            Ok(line) => panic!("unexpected first line {line:?}"),
            Err(_) => break,
        }
    }
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(started, 3, "every run started while the others ran");
}

/// The test Function's `user` image pushed to a new plain registry: the registry (kept
/// running while it lives) and the image's tagged reference.
/// Tags `tag` in `layout`: its base plus `layer`, which the history says kiln added for a
/// Function (so the layers below are the base's, stored for other images on it), running
/// `script`.
fn on_base_as_kiln_would(layout: &Path, tag: &str, layer: &Path, script: &str) {
    let l = layout.to_str().unwrap();
    let image = format!("{l}:{tag}");
    run(
        umoci(&["raw", "add-layer", "--image", &format!("{l}:base")])
            .args(["--tag", tag, "--history.created", CREATED])
            .args(["--history.created_by", &format!("kiln: source ({tag})")])
            .arg(layer),
    );
    run(umoci(&["config", "--image", &image, "--tag", tag])
        .args(["--created", CREATED, "--no-history", "--clear=config.cmd"])
        .args(["--config.entrypoint=/bin/sh", "--config.entrypoint=-c"])
        .arg(format!("--config.entrypoint={script}")));
}

fn images_on_one_base_unpack_only_their_own_layers_and_cannot_change_each_others_files(
    sandbox: &str,
) {
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let layout = make_layout(dir);
    // One replaces and deletes files of the base it shares; the other reads them.
    let evil = tar_layer(
        dir,
        "evil",
        &[
            ("etc/passwd", "root:x:0:0:evil:/:/bin/sh\n"),
            ("etc/.wh.group", ""),
            ("bin/.wh.sh", ""),
        ],
    );
    let good = tar_layer(dir, "good", &[("app/hello.txt", "hello\n")]);
    let show = "busybox cat /etc/passwd /etc/group /app/hello.txt; busybox ls /bin";
    on_base_as_kiln_would(&layout, "evil", &evil, show);
    on_base_as_kiln_would(&layout, "good", &good, show);
    run(&mut umoci(&["gc", "--layout", layout.to_str().unwrap()]));
    // No /bin/sh in it: the shell is busybox's, by name.
    let run_image = |tag: &str| {
        let image = oci(&layout, tag);
        let out = run_in(
            &kiln,
            sandbox,
            &[
                "run",
                &image,
                "--entrypoint",
                "/bin/busybox",
                "--",
                "sh",
                "-c",
                show,
            ],
        );
        (out.stdout, out.stderr)
    };

    let (evil_out, first) = run_image("evil");
    assert!(
        evil_out.starts_with("root:x:0:0:evil:"),
        "{evil_out}\n{first}"
    );
    assert!(!evil_out.contains("user:x:1000:"), "{evil_out}");
    assert!(first.contains("from_cache=0"), "{first}");
    let (good_out, second) = run_image("good");
    assert!(
        second.contains("from_cache=1"),
        "the second image on the base unpacks only its own layer: {second}"
    );
    assert_eq!(
        good_out,
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n\
         root:x:0:\nuser:x:1000:\nhello\nbusybox\nsh\n",
        "the base's files as the base has them: {second}"
    );
    // The rootfs shares the base's files with the stored prefix (and the first image).
    let rootfs = kiln
        .cache_dir()
        .join("rootfs/sha256")
        .join(&tagged_digest(&layout, "good")["sha256:".len()..])
        .join("rootfs");
    let busybox = fs::metadata(rootfs.join("bin/busybox")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&busybox), 3);
    // And the first image, unpacked again from the prefix, is as it was.
    fs::remove_dir_all(kiln.cache_dir().join("rootfs/sha256")).unwrap();
    let (again, third) = run_image("evil");
    assert_eq!(again, evil_out, "{third}");
    assert!(third.contains("from_cache=1"), "{third}");
    // The prefix is a cache entry like the images' root file systems: prune removes it.
    let prefixes = kiln.cache_dir().join("rootfs/chains/sha256");
    assert_eq!(fs::read_dir(&prefixes).unwrap().count(), 1);
    let pruned = kiln.run(&["cache", "prune", "--max-size", "1"]);
    assert_eq!(pruned.code, 0, "{}", pruned.stderr);
    assert_eq!(
        fs::read_dir(&prefixes).unwrap().count(),
        0,
        "{}",
        pruned.stdout
    );
}

fn pushed_user_image(kiln: &Kiln) -> (Registry, String) {
    let layout = function_layout(kiln.home.path());
    let reg = Registry::start(RegistryKind::Plain);
    let tagged = reg.reference("fn/user:v1");
    reg.skopeo_copy_from_layout(&layout, "user", &tagged, None);
    (reg, tagged)
}

/// kiln with the sandbox `sandbox` chosen.
fn command(kiln: &Kiln, sandbox: &str) -> Command {
    let mut cmd = kiln.command();
    cmd.env("KILN_SANDBOX", sandbox);
    cmd
}

fn run_in(kiln: &Kiln, sandbox: &str, args: &[&str]) -> common::kiln::Run {
    kiln.run_cmd(command(kiln, sandbox).args(args))
}

/// Every test, once per sandbox.
macro_rules! in_each_sandbox {
    ($($test:ident),* $(,)?) => {
        mod bwrap {
            $(#[test] fn $test() { super::$test("bwrap") })*
        }
        mod builtin {
            $(#[test] fn $test() { super::$test("builtin") })*
        }
    };
}

in_each_sandbox!(
    a_function_serves_http_on_the_host_port_and_stops_promptly_on_sigterm,
    the_function_runs_as_the_images_user_with_a_read_only_root_and_a_writable_tmp,
    whiteouts_and_opaque_directories_of_later_layers_hide_lower_files,
    images_on_one_base_unpack_only_their_own_layers_and_cannot_change_each_others_files,
    the_entrypoints_exit_code_is_kilns_exit_code_for_what_kiln_build_prints,
    a_registry_image_runs_by_digest_and_a_second_run_reuses_the_cached_rootfs,
    an_image_that_lists_the_same_layer_twice_runs,
    sigint_reaches_the_function_which_exits_gracefully_with_its_own_code,
    user_ids_replace_the_images_user_and_the_group_defaults_to_the_user_id,
    an_entrypoint_replaces_the_images_and_drops_its_cmd,
    a_host_file_bound_at_dev_termination_log_receives_what_the_function_writes,
    concurrent_runs_unpacking_the_same_image_all_run_and_leave_one_cache_entry,
    concurrent_long_running_runs_of_one_image_all_start,
);
