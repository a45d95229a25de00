//! The Dockerfile's `ssh` stage, without Docker (these machines have neither Docker nor a way
//! to Docker Hub): its script runs here, on the Debian release the stage names, and what it
//! copies goes over a root holding only the packages the final stage's distroless base has.
//! In that root, as the image's user, kiln fetches a git source over SSH with the copied
//! `ssh`, as the controller does. Without the copied libraries the same `ssh` cannot start,
//! so the stage's list of what the base lacks is what this test checks.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::git::Repo;
use common::sshd::SshServer;

const DOCKERFILE: &str = include_str!("../../Dockerfile");

/// What distroless's `cc-debian12` image holds besides its own files (passwd, group, the
/// CA store): glibc, OpenSSL's libraries and the C/C++ runtime.
const DISTROLESS_PACKAGES: &[&str] = &["libc6", "libssl3", "libgcc-s1", "libgomp1", "libstdc++6"];

/// The `RUN` command of the stage named `name`, continuation lines joined.
fn stage_run(name: &str) -> String {
    let mut lines = DOCKERFILE
        .lines()
        .skip_while(|l| !(l.starts_with("FROM ") && l.ends_with(&format!(" AS {name}"))));
    let from = lines.next().unwrap_or_else(|| panic!("no stage {name}"));
    assert_eq!(
        from, "FROM debian:bookworm-slim AS ssh",
        "the test runs bookworm's"
    );
    let mut run = String::new();
    for line in lines.skip_while(|l| !l.starts_with("RUN ")) {
        let line = line.trim();
        match line.strip_suffix('\\') {
            Some(more) => run.push_str(more),
            None => {
                run.push_str(line);
                break;
            }
        }
    }
    run.strip_prefix("RUN ").unwrap().to_string()
}

/// Copies the files `dpkg` lists for `package` on this machine under `root`, at the paths
/// the package names (so `/lib` is a directory, as in distroless).
fn install_host_package(package: &str, root: &Path) {
    let listed = common::run(Command::new("dpkg").args(["-L", package]));
    for path in listed.lines().map(Path::new) {
        let wanted = ["/lib", "/lib64", "/usr/lib"]
            .iter()
            .any(|dir| path.starts_with(dir));
        if !wanted || !path.is_file() {
            continue;
        }
        let dest = root.join(path.strip_prefix("/").unwrap());
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(path, &dest).unwrap();
    }
}

/// A root with the distroless base's packages and its passwd (nonroot = 65532).
fn distroless_like_root(root: &Path) {
    for package in DISTROLESS_PACKAGES {
        install_host_package(package, root);
    }
    for dir in ["etc", "tmp", "home/nonroot", "proc", "dev", "auth", "work"] {
        fs::create_dir_all(root.join(dir)).unwrap();
    }
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\n\
         nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n").unwrap();
}

/// `argv` in `root` as user 65532, the image's, with the auth directory and a writable /work.
fn in_root(root: &Path, auth: &Path, work: &Path, argv: &[&str]) -> std::process::Output {
    Command::new("bwrap")
        .args(["--bind", root.to_str().unwrap(), "/"])
        .args(["--ro-bind", auth.to_str().unwrap(), "/auth"])
        .args(["--bind", work.to_str().unwrap(), "/work"])
        .args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"])
        .args(["--unshare-user", "--uid", "65532", "--gid", "65532"])
        .args(["--clearenv", "--setenv", "HOME", "/home/nonroot"])
        .args(["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"])
        .args(argv)
        .output()
        .unwrap()
}

#[test]
fn the_dockerfiles_ssh_stage_gives_the_distroless_image_a_working_ssh_for_git_sources() {
    common::require_tool("bwrap", "bubblewrap");
    let release = fs::read_to_string("/etc/os-release").unwrap_or_default();
    assert!(
        release.contains("VERSION_CODENAME=bookworm"),
        "this test runs the Dockerfile's ssh stage, which is Debian bookworm's, on the machine \
         itself: run it on bookworm (.ci/run's machines are)"
    );
    assert!(
        Path::new("/usr/bin/ssh").is_file(),
        "install Debian's openssh-client (.ci/run does)"
    );
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("out");
    let run = stage_run("ssh");
    // The stage's install is this machine's own (`openssh-client`, installed above); the rest
    // of its script runs as written, into `out` instead of /out.
    let (install, script) = run
        .split_once("openssh-client &&")
        .expect("the stage installs openssh-client, then copies");
    assert!(install.contains("apt-get install"), "{run}");
    let script = script.replace("/out", out.to_str().unwrap());
    let copied = Command::new("sh").args(["-ec", &script]).output().unwrap();
    assert!(copied.status.success(), "{copied:?}\n{script}");

    // The final stage: distroless, the stage's output, kiln.
    let root = work.path().join("root");
    distroless_like_root(&root);
    let bare = work.path().join("bare");
    distroless_like_root(&bare);
    fs::create_dir_all(bare.join("usr/bin")).unwrap();
    fs::copy("/usr/bin/ssh", bare.join("usr/bin/ssh")).unwrap();
    common::kiln::copy_tree(&out, &root);
    fs::create_dir_all(root.join("usr/local/bin")).unwrap();
    fs::copy(env!("CARGO_BIN_EXE_kiln"), root.join("usr/local/bin/kiln")).unwrap();

    // Without what the stage copies, the distroless base cannot start ssh: the stage's list
    // of libraries is needed, and the root does not lend them from elsewhere.
    let empty = work.path().join("empty");
    let scratch = work.path().join("scratch");
    fs::create_dir_all(&empty).unwrap();
    fs::create_dir_all(&scratch).unwrap();
    let without = in_root(&bare, &empty, &scratch, &["/usr/bin/ssh", "-V"]);
    assert!(!without.status.success(), "{without:?}");
    assert!(
        String::from_utf8_lossy(&without.stderr).contains("error while loading shared libraries"),
        "{without:?}"
    );
    let with = in_root(&root, &empty, &scratch, &["/usr/bin/ssh", "-V"]);
    assert!(with.status.success(), "{with:?}");

    // The controller's use: kiln resolves and fetches a git source over SSH with it.
    let sshd = SshServer::start();
    let repo = Repo::init(&work.path().join("src"));
    repo.write("fn/handler.js", b"module.exports = { main: () => 'ok' };\n");
    let head = repo.commit("over ssh");
    repo.publish(work.path(), "fns");
    let url = sshd.url(&work.path().join("fns.git"));
    let auth = sshd.auth_dir(&sshd.key(), None, Some(&sshd.known_hosts()));
    // The auth files are read as user 65532.
    common::run(Command::new("chmod").args(["-R", "a+rX", auth.to_str().unwrap()]));
    let fetched = in_root(
        &root,
        &auth,
        &scratch,
        &[
            "kiln",
            "build",
            "--git",
            &url,
            "--git-base-dir",
            "fn",
            "--git-auth-dir",
            "/auth",
            "--runtime",
            "nodejs22",
            "--stage",
            "source",
            "--source-dir",
            "/work/fetched",
        ],
    );
    assert!(
        fetched.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&fetched.stderr),
        sshd.log()
    );
    assert_eq!(String::from_utf8_lossy(&fetched.stdout).trim(), head);
    assert_eq!(
        fs::read_to_string(scratch.join("fetched/handler.js")).unwrap(),
        "module.exports = { main: () => 'ok' };\n"
    );
}
