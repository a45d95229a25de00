//! Git sources against a real git server (`git http-backend` behind `gitsrv.py`, plain HTTP
//! and HTTPS with a test CA and Basic auth): a Function builds from a branch, a tag and a
//! commit SHA at a base directory, the fetch is shallow, bad credentials, unknown references
//! fail clearly, SSH sources build with a key against a real `sshd` (and a wrong key or host key
//! fails clearly), credentials do not follow a redirect to another origin, a tree
//! that escapes its base directory is refused, and a fetch past its size limit and a
//! reference listing without end stop.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use common::git::{GIT_FORBIDDEN_PASSWORD, GIT_PASSWORD, GitServer, GitServerKind, Repo};
use common::kiln::{Kiln, Run, read_report, tiny_base};
use common::schema::validate_layout;
use common::sshd::{KEY_PASSPHRASE, SshServer};

/// A repository `fns` with two commits: `fn/` holds a Node.js Function (v1, then v2), the
/// root a README outside it. Tag `v1` (lightweight) and `release` (annotated) are on the
/// first commit. Returns (first, second) commit SHAs.
fn two_commit_repo(work: &Path, server: &GitServer) -> (String, String) {
    let repo = Repo::init(&work.join("src"));
    repo.write("README.md", b"not part of the Function\n");
    repo.write("fn/handler.js", b"module.exports = { main: () => 'v1' };\n");
    repo.write("fn/package.json", b"{}\n");
    repo.write_executable("fn/bin/run.sh", b"#!/bin/sh\necho run\n");
    repo.symlink("bin/run.sh", "fn/run");
    let first = repo.commit("v1");
    repo.git(&["tag", "v1"]);
    repo.git(&["tag", "-a", "release", "-m", "annotated"]);
    repo.write("fn/handler.js", b"module.exports = { main: () => 'v2' };\n");
    let second = repo.commit("v2");
    repo.publish(&server.root(), "fns");
    (first, second)
}

/// Builds `--git URL` with `extra` flags into a fresh layout under `work`.
fn build_git(kiln: &Kiln, work: &Path, url: &str, extra: &[&str]) -> (Run, std::path::PathBuf) {
    let out = tempfile::tempdir_in(work).unwrap().keep();
    let report = out.join("report.json");
    let base = tiny_base();
    let output = format!("oci:{}", out.join("layout").display());
    let mut args = vec![
        "build",
        "--git",
        url,
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--output",
        &output,
        "--report",
        report.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (kiln.run(&args), out)
}

/// The source layer (the image's last) as path → (mode, symlink target or content).
fn source_layer(layout: &Path) -> BTreeMap<String, (u32, String)> {
    let read = |d: &str| {
        fs::read(
            layout
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&read(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    let blob = read(layers.last().unwrap()["digest"].as_str().unwrap());
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&blob[..]));
    let mut out = BTreeMap::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let mode = entry.header().mode().unwrap();
        let value = match entry.link_name().unwrap() {
            Some(target) => format!("-> {}", target.display()),
            None => {
                let mut s = String::new();
                entry.read_to_string(&mut s).unwrap();
                s
            }
        };
        out.insert(path, (mode, value));
    }
    out
}

#[test]
fn a_function_builds_from_a_branch_a_tag_and_a_commit_at_its_base_directory() {
    let server = GitServer::start(GitServerKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let (first, second) = two_commit_repo(work.path(), &server);
    let kiln = Kiln::new();
    let url = server.url("fns");
    let mut digests = BTreeMap::new();
    for (reference, commit) in [
        ("", &second),
        ("main", &second),
        ("v1", &first),
        ("release", &first),
        (first.as_str(), &first),
    ] {
        let mut flags = vec!["--git-base-dir", "/fn/"];
        if !reference.is_empty() {
            flags.extend(["--git-ref", reference]);
        }
        let (run, out) = build_git(&kiln, work.path(), &url, &flags);
        let printed = run.reference();
        assert!(
            run.stderr.contains(&format!("commit={commit}")),
            "the resolved commit is logged: {}",
            run.stderr
        );
        let report = read_report(&out.join("report.json"));
        assert_eq!(report["commit"], commit.as_str(), "{reference}");
        let layout = out.join("layout");
        validate_layout(&layout);
        let files = source_layer(&layout);
        let want = if commit == &first { "'v1'" } else { "'v2'" };
        assert!(
            files["usr/src/app/function/handler.js"].1.contains(want),
            "{reference}: {files:?}"
        );
        assert_eq!(
            files["usr/src/app/function/bin/run.sh"].0, 0o755,
            "the executable bit is kept"
        );
        assert_eq!(files["usr/src/app/function/handler.js"].0, 0o644);
        assert_eq!(
            files["usr/src/app/function/run"].1, "-> bin/run.sh",
            "symlinks stay symlinks"
        );
        assert!(
            !files.keys().any(|p| p.contains("README")),
            "only the base directory is built: {files:?}"
        );
        digests.insert(
            reference.to_string(),
            printed.rsplit('@').next().unwrap().to_string(),
        );
    }
    assert_eq!(digests[""], digests["main"]);
    assert_eq!(digests["v1"], digests[first.as_str()]);
    assert_eq!(digests["v1"], digests["release"]);
    assert_ne!(digests["v1"], digests["main"]);
}

#[test]
fn the_fetch_is_shallow_one_commit_without_its_history() {
    let server = GitServer::start(GitServerKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    // History that a full clone would have to download: 2 MB that nothing random compresses.
    let mut noise = vec![0u8; 2 << 20];
    fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut noise)
        .unwrap();
    repo.write("history.bin", &noise);
    repo.write("handler.js", b"module.exports = { main: () => 'old' };\n");
    repo.commit("old");
    repo.git(&["rm", "-q", "history.bin"]);
    repo.write("handler.js", b"module.exports = { main: () => 'new' };\n");
    let head = repo.commit("new");
    repo.publish(&server.root(), "fns");
    let (run, out) = build_git(&Kiln::new(), work.path(), &server.url("fns"), &[]);
    run.reference();
    assert_eq!(
        read_report(&out.join("report.json"))["commit"],
        head.as_str()
    );
    let asked = server.upload_pack_log();
    assert!(
        asked.contains("deepen 1") && asked.contains(&format!("want {head}")),
        "{asked}"
    );
    // The fetch wants the commit by its id and asks for no reference listing but an empty
    // one (the resolve before it asked for HEAD).
    assert!(
        asked.contains("ref-prefix refs/kiln/none") && !asked.contains("refs/heads/main"),
        "{asked}"
    );
    let sent = server.bytes_sent();
    assert!(
        sent < 200 * 1024,
        "the server sent {sent} bytes: history was fetched"
    );
}

#[test]
fn https_with_basic_credentials_from_files_builds_and_bad_ones_fail_clearly() {
    let server = GitServer::start(GitServerKind::BasicTls);
    let work = tempfile::tempdir().unwrap();
    let (_, head) = two_commit_repo(work.path(), &server);
    let kiln = Kiln::new();
    let url = server.url("fns");
    let ca = server.ca_pem();
    let ca = ca.to_str().unwrap();
    let (good, bad) = (
        server.auth_dir(GIT_PASSWORD),
        server.auth_dir("wrong-Pa55word-xyz"),
    );
    let (good, bad) = (good.to_str().unwrap(), bad.to_str().unwrap());
    let flags = |auth| {
        [
            "--git-base-dir",
            "fn",
            "--git-ca",
            ca,
            "--git-auth-dir",
            auth,
        ]
    };
    let (run, out) = build_git(&kiln, work.path(), &url, &flags(good));
    run.reference();
    assert_eq!(
        read_report(&out.join("report.json"))["commit"],
        head.as_str()
    );
    assert!(
        server.access_log().iter().any(|l| l.ends_with("\tok")),
        "credentials were sent"
    );

    let (run, _) = build_git(&kiln, work.path(), &url, &flags(bad));
    let err = run.failure(1);
    assert!(
        err.contains(&format!(
            "{url} rejected the credentials (HTTP 401): check the username and \
            password files in --git-auth-dir"
        )),
        "{err}"
    );
    assert!(
        !err.contains("wrong-Pa55word-xyz"),
        "no password in errors: {err}"
    );

    let forbidden = server.auth_dir(GIT_FORBIDDEN_PASSWORD);
    let (run, _) = build_git(
        &kiln,
        work.path(),
        &url,
        &flags(forbidden.to_str().unwrap()),
    );
    let err = run.failure(1);
    assert!(
        err.contains(&format!("{url} denied access (HTTP 403)")),
        "{err}"
    );
    assert!(!err.contains(GIT_FORBIDDEN_PASSWORD), "{err}");

    let (run, _) = build_git(&kiln, work.path(), &url, &["--git-ca", ca]);
    let err = run.failure(1);
    assert!(
        err.contains("needs credentials (HTTP 401)") && err.contains("--git-auth-dir"),
        "{err}"
    );

    // Without the test CA the server's certificate is not trusted.
    let (run, _) = build_git(&kiln, work.path(), &url, &["--git-auth-dir", good]);
    let err = run.failure(1);
    assert!(
        err.contains(&format!("cannot reach the git server of {url}")),
        "{err}"
    );
}

/// Credentials go only to the origin they were given for. An HTTPS git server that needs
/// none redirects to another origin (the same host on another port) that asks for them:
/// kiln sends them nowhere but the origin, and the build fails saying credentials are needed.
#[test]
fn git_credentials_do_not_follow_a_redirect_to_another_origin() {
    let target = GitServer::start(GitServerKind::BasicTls);
    let work = tempfile::tempdir().unwrap();
    two_commit_repo(work.path(), &target);
    let origin = GitServer::redirecting_to(&target);
    let kiln = Kiln::new();
    let url = origin.url("fns");
    let (ca, auth) = (target.ca_pem(), target.auth_dir(GIT_PASSWORD));
    let flags = [
        "--git-base-dir",
        "fn",
        "--git-ca",
        ca.to_str().unwrap(),
        "--git-auth-dir",
        auth.to_str().unwrap(),
    ];
    let (run, _) = build_git(&kiln, work.path(), &url, &flags);
    let err = run.failure(1);
    let redirected = origin.access_log();
    assert!(
        redirected.iter().any(|l| l.contains("\t302\t")),
        "the origin redirected: {redirected:?}"
    );
    let log = target.access_log();
    assert!(!log.is_empty(), "the redirect was followed");
    assert!(
        log.iter().all(|l| l.ends_with("\tnone")),
        "credentials went to the redirect target: {log:?}"
    );
    let target_url = target.url("fns");
    assert!(
        err.contains(&format!(
            "{url} redirected to {target_url}, which asks for credentials (HTTP 401)"
        )),
        "{err}"
    );
    assert!(!err.contains(GIT_PASSWORD), "{err}");

    // The controller's reference lookups take the same path.
    let access = kiln::git::Access {
        credentials: Some(kiln::git::Credentials {
            username: common::git::GIT_USER.into(),
            password: GIT_PASSWORD.into(),
        }),
        extra_ca_pem: Some(fs::read(&ca).unwrap()),
        ..kiln::git::Access::default()
    };
    let lookup = kiln::git::resolve_reference(&url, "main", &access);
    assert!(
        matches!(lookup, Err(kiln::git::Error::CredentialsWithheld { .. })),
        "{lookup:?}"
    );
    let log = target.access_log();
    assert!(log.iter().all(|l| l.ends_with("\tnone")), "{log:?}");
}

/// The manifest digest of the one image in a layout.
fn layout_digest(layout: &Path) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_source_stage_fetches_with_the_credentials_and_its_directory_builds_the_same_image() {
    let server = GitServer::start(GitServerKind::BasicTls);
    let work = tempfile::tempdir().unwrap();
    let (_, head) = two_commit_repo(work.path(), &server);
    let kiln = Kiln::new();
    let url = server.url("fns");
    let ca = server.ca_pem();
    let auth = server.auth_dir(GIT_PASSWORD);
    let git = [
        "--git-base-dir",
        "fn",
        "--git-ca",
        ca.to_str().unwrap(),
        "--git-auth-dir",
        auth.to_str().unwrap(),
    ];
    let (run, whole) = build_git(
        &kiln,
        work.path(),
        &url,
        &[&git[..], &["--name", "fn"]].concat(),
    );
    run.reference();

    let fetched = work.path().join("fetched/function");
    fs::create_dir(fetched.parent().unwrap()).unwrap();
    let mut source = vec!["build", "--git", &url, "--runtime", "nodejs22"];
    source.extend(git);
    source.extend([
        "--stage",
        "source",
        "--source-dir",
        fetched.to_str().unwrap(),
    ]);
    assert_eq!(kiln.run(&source).reference(), head, "it prints the commit");
    let mut files: Vec<String> = walkdir(&fetched);
    files.sort();
    assert_eq!(
        files,
        ["bin", "bin/run.sh", "handler.js", "package.json", "run"]
    );
    assert_eq!(
        fs::read_link(fetched.join("run")).unwrap(),
        Path::new("bin/run.sh")
    );
    // A second fetch into the same place is refused before any network, not mixed in.
    let fetches = server.access_log().len();
    let err = kiln.run(&source).failure(2).to_string();
    assert!(
        err.contains(&format!(
            "--source-dir {} already exists",
            fetched.display()
        )),
        "{err}"
    );
    assert_eq!(server.access_log().len(), fetches);

    // The directory builds, with no git access at all, the image the git build made.
    let out = work.path().join("from-dir");
    let output = format!("oci:{}", out.display());
    let base = tiny_base();
    let dir = fetched.to_str().unwrap();
    let args = [
        "build",
        dir,
        "--runtime",
        "nodejs22",
        "--name",
        "fn",
        "--base",
        &base,
        "--output",
        &output,
    ];
    kiln.run(&args).reference();
    assert_eq!(layout_digest(&out), layout_digest(&whole.join("layout")));

    // The stage's flags are checked.
    let mut no_git = vec!["build", dir, "--runtime", "nodejs22", "--stage", "source"];
    no_git.extend(["--source-dir", "/nonexistent/x"]);
    let err = kiln.run(&no_git).failure(2).to_string();
    assert!(err.contains("--stage source fetches a git source"), "{err}");
    let stray = [&args[..], &["--source-dir", "/tmp/x"]].concat();
    let err = kiln.run(&stray).failure(2).to_string();
    assert!(
        err.contains("--source-dir is where --stage source writes"),
        "{err}"
    );
}

/// The paths under `dir`, relative, `/`-separated, without following symlinks.
fn walkdir(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            out.extend(
                walkdir(&entry.path())
                    .into_iter()
                    .map(|p| format!("{name}/{p}")),
            );
        }
        out.push(name);
    }
    out
}

#[test]
fn a_fetch_past_its_size_limit_stops_and_says_so() {
    let server = GitServer::start(GitServerKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    repo.write("handler.js", b"module.exports = { main: () => 'big' };\n");
    repo.write("package.json", b"{}\n");
    // 24 MiB that do not compress: the pack is as large.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..24 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    repo.write("assets/noise.bin", &noise);
    repo.commit("big");
    repo.publish(&server.root(), "big");
    let kiln = Kiln::new();
    let url = server.url("big");
    let (run, _) = build_git(&kiln, work.path(), &url, &["--git-max-size", "4MiB"]);
    let err = run.failure(1);
    assert!(
        err.contains(&format!(
            "fetching from {url} received more than 4194304 bytes"
        )),
        "{err}"
    );
    // Under the default limit the same commit builds.
    let (run, _) = build_git(&kiln, work.path(), &url, &[]);
    run.reference();
}

#[test]
fn unknown_references_missing_base_directories_and_unreachable_servers_are_named() {
    let server = GitServer::start(GitServerKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let (_, head) = two_commit_repo(work.path(), &server);
    let kiln = Kiln::new();
    let url = server.url("fns");
    let (run, _) = build_git(&kiln, work.path(), &url, &["--git-ref", "no-such-branch"]);
    let err = run.failure(2);
    assert!(
        err.contains(&format!(
            "{url} has no branch or tag named \"no-such-branch\""
        )),
        "{err}"
    );
    let (run, _) = build_git(
        &kiln,
        work.path(),
        &url,
        &["--git-base-dir", "/orders/function"],
    );
    let err = run.failure(2);
    assert!(
        err.contains(&format!(
            "commit {head} of {url} has no directory /orders/function"
        )),
        "{err}"
    );
    let closed = format!("http://127.0.0.1:{}/fns.git", common::free_port());
    let (run, _) = build_git(&kiln, work.path(), &closed, &[]);
    let err = run.failure(1);
    assert!(
        err.contains(&format!("cannot reach the git server of {closed}")),
        "{err}"
    );
    let (run, _) = build_git(&kiln, work.path(), &server.url("missing"), &[]);
    let err = run.failure(1);
    assert!(
        err.contains(&server.url("missing")) && err.contains("404"),
        "{err}"
    );
}

/// Every file under `dir`, as bytes (to look for a secret in what a build wrote).
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            out.extend(all_bytes(&path));
        } else if meta.is_file() {
            out.extend(fs::read(&path).unwrap());
        }
    }
    out
}

/// A git source over SSH, as Kyma's `auth.type: key` Secret gives it: a loopback `sshd`
/// serves the repository; the key (plain or encrypted with its `password`) authenticates,
/// `knownHosts` pins the host key, and the key appears in no log line, error or layer.
#[test]
fn a_function_builds_over_ssh_with_the_secrets_key_and_known_hosts() {
    let sshd = SshServer::start();
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    repo.write(
        "fn/handler.js",
        b"module.exports = { main: () => 'over ssh' };\n",
    );
    repo.write("fn/package.json", b"{}\n");
    let commit = repo.commit("ssh");
    repo.publish(work.path(), "fns");
    let url = sshd.url(&work.path().join("fns.git"));
    let kiln = Kiln::new();
    let key = sshd.key();
    let secret_line = key.lines().nth(1).unwrap().to_string();
    let pinned = sshd.auth_dir(&key, None, Some(&sshd.known_hosts()));
    let encrypted = sshd.auth_dir(
        &sshd.encrypted_key(),
        Some(KEY_PASSPHRASE),
        Some(&sshd.known_hosts()),
    );
    let unpinned = sshd.auth_dir(&key, None, None);
    for (auth, verified) in [(&pinned, true), (&encrypted, true), (&unpinned, false)] {
        let flags = [
            "--git-base-dir",
            "fn",
            "--git-auth-dir",
            auth.to_str().unwrap(),
        ];
        let (run, out) = build_git(&kiln, work.path(), &url, &flags);
        assert_eq!(run.code, 0, "{}\n{}", run.stderr, sshd.log());
        assert_eq!(
            read_report(&out.join("report.json"))["commit"],
            commit.as_str()
        );
        let files = source_layer(&out.join("layout"));
        assert!(
            files["usr/src/app/function/handler.js"]
                .1
                .contains("over ssh")
        );
        assert_eq!(
            run.stderr.contains("host key will not be verified"),
            !verified,
            "{}",
            run.stderr
        );
        let written = String::from_utf8_lossy(&all_bytes(&out)).into_owned();
        for secret in [secret_line.as_str(), KEY_PASSPHRASE] {
            assert!(!run.stderr.contains(secret) && !run.stdout.contains(secret));
            assert!(!written.contains(secret), "a secret in the build's output");
        }
    }
}

#[test]
fn a_wrong_key_a_host_key_mismatch_and_a_missing_key_fail_clearly_over_ssh() {
    let sshd = SshServer::start();
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    repo.write("handler.js", b"module.exports = { main: () => 'x' };\n");
    repo.commit("x");
    repo.publish(work.path(), "fns");
    let url = sshd.url(&work.path().join("fns.git"));
    let kiln = Kiln::new();
    // The fetch's size limit holds over SSH too: 300 KiB of incompressible data, 64 KiB allowed.
    let big = Repo::init(&work.path().join("big"));
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let noise: Vec<u8> = (0..300 << 10)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    big.write("noise.bin", &noise);
    big.commit("big");
    big.publish(work.path(), "big");
    let pinned = sshd.auth_dir(&sshd.key(), None, Some(&sshd.known_hosts()));
    let (run, _) = build_git(
        &kiln,
        work.path(),
        &sshd.url(&work.path().join("big.git")),
        &[
            "--git-max-size",
            "64KiB",
            "--git-auth-dir",
            pinned.to_str().unwrap(),
        ],
    );
    let err = run.failure(1);
    assert!(err.contains("received more than 65536 bytes"), "{err}");
    let other = sshd.other_key();
    let wrong_key = sshd.auth_dir(&other, None, Some(&sshd.known_hosts()));
    let (run, _) = build_git(
        &kiln,
        work.path(),
        &url,
        &["--git-auth-dir", wrong_key.to_str().unwrap()],
    );
    let err = run.failure(1);
    assert!(err.contains("refused the SSH key"), "{err}");
    assert!(err.contains("Permission denied"), "OpenSSH's words: {err}");
    assert!(!err.contains(other.lines().nth(1).unwrap()), "{err}");
    let wrong_pass = sshd.auth_dir(&sshd.encrypted_key(), Some("not-it"), None);
    let (run, _) = build_git(
        &kiln,
        work.path(),
        &url,
        &["--git-auth-dir", wrong_pass.to_str().unwrap()],
    );
    assert!(run.failure(1).contains("refused the SSH key"));
    let mismatch = sshd.auth_dir(&sshd.key(), None, Some(&sshd.wrong_known_hosts()));
    let logged = sshd.log().len();
    let (run, _) = build_git(
        &kiln,
        work.path(),
        &url,
        &["--git-auth-dir", mismatch.to_str().unwrap()],
    );
    let err = run.failure(1);
    assert!(
        err.contains("is not one of the Secret's knownHosts"),
        "{err}"
    );
    let since = sshd.log()[logged..].to_string();
    assert!(
        since.contains("Connection from") && !since.contains("Accepted publickey"),
        "nothing was authenticated to a host that did not prove itself: {since}"
    );
    // An SSH URL without a key, and a key for an HTTPS URL: usage errors, before any network.
    let (run, _) = build_git(
        &kiln,
        work.path(),
        "git@github.com:kyma-project/serverless.git",
        &[],
    );
    let err = run.failure(2);
    assert!(
        err.contains("pass --git-auth-dir DIR holding the private key"),
        "{err}"
    );
    let key_only = sshd.auth_dir(&sshd.key(), None, None);
    let (run, _) = build_git(
        &kiln,
        work.path(),
        "https://127.0.0.1:9/fns.git",
        &["--git-auth-dir", key_only.to_str().unwrap()],
    );
    assert!(run.failure(2).contains("is not an SSH URL"));
}

#[test]
fn an_ssh_server_that_stalls_or_trickles_is_cut_off_at_the_git_timeout() {
    let sshd = SshServer::start();
    let work = tempfile::tempdir().unwrap();
    let url = sshd.url(&work.path().join("fns.git"));
    let kiln = Kiln::new();
    // A 2 s timeout against the trickle's 0.3 s between bytes: a loaded machine (tests run
    // three at a time) must not turn a slow handshake or one late byte into a stall.
    for (key, said, within) in [
        (
            sshd.stall_key(),
            "no data for 2 s: the connection stalled",
            12,
        ),
        (
            sshd.trickle_key(),
            "the connection took over 20 s (the git timeout, 2 s, times 10)",
            40,
        ),
    ] {
        let auth = sshd.auth_dir(&key, None, Some(&sshd.known_hosts()));
        let started = Instant::now();
        let (run, _) = build_git(
            &kiln,
            work.path(),
            &url,
            &[
                "--git-timeout",
                "2",
                "--git-auth-dir",
                auth.to_str().unwrap(),
            ],
        );
        let err = run.failure(1);
        assert!(err.contains(said), "{err}");
        assert!(started.elapsed() < Duration::from_secs(within), "{err}");
    }
}

#[test]
fn credentials_over_plain_http_are_refused_before_any_network() {
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    // Credentials are never sent over plain HTTP.
    let auth = work.path().join("auth");
    fs::create_dir_all(&auth).unwrap();
    fs::write(auth.join("username"), "u").unwrap();
    fs::write(auth.join("password"), "KILN-PLAIN-SECRET").unwrap();
    let (run, _) = build_git(
        &kiln,
        work.path(),
        "http://127.0.0.1:9/fns.git",
        &["--git-auth-dir", auth.to_str().unwrap()],
    );
    let err = run.failure(2);
    assert!(
        err.contains("--git-auth-dir needs an https:// URL"),
        "{err}"
    );
    assert!(!err.contains("KILN-PLAIN-SECRET"), "{err}");
    let help = kiln.run(&["build", "--help"]);
    let help = help.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("or an SSH URL"), "{help}");
}

#[test]
fn a_symlink_leaving_the_base_directory_is_refused() {
    let server = GitServer::start(GitServerKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    repo.write("secret.txt", b"outside the Function\n");
    repo.write("fn/handler.js", b"module.exports = { main: () => 'x' };\n");
    repo.symlink("../secret.txt", "fn/data.txt");
    let head = repo.commit("escape");
    repo.publish(&server.root(), "fns");
    let (run, out) = build_git(
        &Kiln::new(),
        work.path(),
        &server.url("fns"),
        &["--git-base-dir", "fn"],
    );
    let err = run.failure(2);
    assert!(
        err.contains(&format!("the Function at /fn of commit {head}")),
        "{err}"
    );
    assert!(
        err.contains("data.txt points to \"../secret.txt\", outside"),
        "{err}"
    );
    assert!(
        !out.join("layout/index.json").exists(),
        "nothing is written"
    );
}

#[test]
fn the_library_resolves_references_without_fetching_objects() {
    let server = GitServer::start(GitServerKind::BasicTls);
    let work = tempfile::tempdir().unwrap();
    let (first, second) = two_commit_repo(work.path(), &server);
    let access = kiln::git::Access {
        credentials: Some(kiln::git::Credentials {
            username: common::git::GIT_USER.into(),
            password: GIT_PASSWORD.into(),
        }),
        extra_ca_pem: Some(fs::read(server.ca_pem()).unwrap()),
        ..kiln::git::Access::default()
    };
    let url = server.url("fns");
    let resolve = |r: &str| kiln::git::resolve_reference(&url, r, &access);
    assert_eq!(resolve("").unwrap(), second);
    assert_eq!(resolve("main").unwrap(), second);
    assert_eq!(resolve("v1").unwrap(), first);
    assert_eq!(
        resolve("release").unwrap(),
        first,
        "an annotated tag is peeled"
    );
    assert_eq!(resolve(&first.to_uppercase()).unwrap(), first);
    assert!(matches!(
        resolve("nope"),
        Err(kiln::git::Error::UnknownReference { .. })
    ));
    assert!(
        !server.upload_pack_log().contains("command=fetch"),
        "no objects were fetched: {}",
        server.upload_pack_log()
    );
}

/// A git server whose reference listing never ends: a v0 advertisement of ever more
/// branches, until the client hangs up or 256 MiB are out. The first `finite` connections
/// get a proper listing of `refs/heads/main` instead. Returns the repository URL and the
/// bytes sent by the endless answers.
fn endless_listing_server(finite: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&sent);
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            let counter = Arc::clone(&counter);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let pkt = |s: &str| format!("{:04x}{s}", s.len() + 4);
                let id = "1".repeat(40);
                let mut head = String::from(
                    "HTTP/1.1 200 OK\r\nContent-Type: \
                        application/x-git-upload-pack-advertisement\r\n\
                     Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
                );
                head += &pkt("# service=git-upload-pack\n");
                head += "0000";
                head += &pkt(&format!(
                    "{id} HEAD\0multi_ack thin-pack side-band-64k ofs-delta shallow\n"
                ));
                if i < finite {
                    head += &pkt(&format!("{id} refs/heads/main\n"));
                    head += "0000";
                    let _ = conn.write_all(head.as_bytes());
                    return;
                }
                if conn.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut n: u64 = 0;
                while counter.load(Ordering::Relaxed) < 256 << 20 {
                    let mut chunk = String::with_capacity(65 * 1024);
                    for _ in 0..1024 {
                        chunk += &pkt(&format!("{id} refs/heads/b{n:08}\n"));
                        n += 1;
                    }
                    if conn.write_all(chunk.as_bytes()).is_err() {
                        return;
                    }
                    counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (format!("http://127.0.0.1:{port}/fns.git"), sent)
}

/// kiln stops reading an endless listing at its limit, before it fills memory: when it
/// resolves a reference (as the controller does for every git Function), and when the
/// fetch lists the references again.
#[test]
fn a_reference_listing_without_end_stops_at_its_limit() {
    let refs_too_large = |err: kiln::git::Error, url: &str| {
        assert!(
            matches!(
                err,
                kiln::git::Error::RefsTooLarge { limit, .. } if limit == kiln::git::REFS_LIMIT,
            ),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!(
                "the git server of {url} sent more than 67108864 bytes"
            )),
            "{message}"
        );
    };
    // The limit, plus what the socket buffers and the reader can hold; the server stops at
    // 256 MiB anyway.
    let at_most = 2 * kiln::git::REFS_LIMIT;
    let access = kiln::git::Access::default();

    let (url, sent) = endless_listing_server(0);
    let err = kiln::git::resolve_reference(&url, "main", &access).expect_err("an endless listing");
    refs_too_large(err, &url);
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        sent < at_most,
        "the server got {sent} bytes out before kiln stopped"
    );

    // The reference resolves; the fetch's own listing is the endless one.
    let (url, sent) = endless_listing_server(1);
    let source = kiln::git::Source::parse(&url, Some("main"), None).unwrap();
    let work = tempfile::tempdir().unwrap();
    let err = kiln::git::fetch_tree(&source, &access, work.path(), &work.path().join("tree"))
        .expect_err("an endless listing");
    refs_too_large(err, &url);
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        sent < at_most,
        "the server got {sent} bytes out before kiln stopped"
    );
}
