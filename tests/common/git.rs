//! Real git for the tests: repositories made with the machine's `git`, served over smart HTTP
//! by `git http-backend` behind `gitsrv.py` (HTTP or HTTPS with a test CA, optionally with
//! HTTP Basic auth). The server is killed on drop.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{harness_dir, require_tool, run};

/// User name the Basic-auth git server accepts.
pub const GIT_USER: &str = "gituser";
/// Password the Basic-auth git server accepts.
pub const GIT_PASSWORD: &str = "git-Secret-3141";
/// A password the Basic-auth git server authenticates ([`GIT_USER`]) but denies access (403).
pub const GIT_FORBIDDEN_PASSWORD: &str = "git-NoAccess-2718";

/// A working repository on disk, committed to with the machine's `git`.
pub struct Repo {
    /// Its directory.
    pub dir: PathBuf,
}

impl Repo {
    /// `git init -b main` in `dir`.
    pub fn init(dir: &Path) -> Repo {
        require_tool("git", "git");
        fs::create_dir_all(dir).unwrap();
        let repo = Repo {
            dir: dir.to_path_buf(),
        };
        repo.git(&["init", "-q", "-b", "main"]);
        repo
    }

    /// Runs `git ARGS` in the repository with a fixed identity, returning stdout trimmed.
    pub fn git(&self, args: &[&str]) -> String {
        let out = run(Command::new("git")
            .args([
                "-c",
                "user.name=kiln test",
                "-c",
                "user.email=test@kiln.invalid",
            ])
            .args(["-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"])
            .args(args)
            .current_dir(&self.dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", &self.dir));
        out.trim().to_string()
    }

    /// Writes `content` to `path` (relative), creating directories.
    pub fn write(&self, path: &str, content: &[u8]) {
        let path = self.dir.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    /// Makes `path` an executable file.
    pub fn write_executable(&self, path: &str, content: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        self.write(path, content);
        fs::set_permissions(self.dir.join(path), fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Makes `path` a symlink to `target`.
    pub fn symlink(&self, target: &str, path: &str) {
        let path = self.dir.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, path).unwrap();
    }

    /// Stages everything and commits; returns the commit SHA.
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }

    /// Publishes the repository as `<name>.git` under `root` (a bare clone with every ref).
    pub fn publish(&self, root: &Path, name: &str) {
        let bare = root.join(format!("{name}.git"));
        run(Command::new("git")
            .args(["clone", "-q", "--mirror"])
            .arg(&self.dir)
            .arg(&bare));
    }
}

/// How the git server is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitServerKind {
    /// Plain HTTP, anonymous.
    Plain,
    /// HTTPS with a test CA, HTTP Basic auth ([`GIT_USER`], [`GIT_PASSWORD`]).
    BasicTls,
}

/// A running `gitsrv.py` serving every repository under [`GitServer::root`].
pub struct GitServer {
    kind: GitServerKind,
    dir: TempDir,
    port: u16,
    child: Child,
}

impl GitServer {
    /// Starts a server and waits until it listens.
    pub fn start(kind: GitServerKind) -> GitServer {
        GitServer::spawn(kind, |cmd| {
            if kind == GitServerKind::BasicTls {
                cmd.args(["--basic", GIT_USER, GIT_PASSWORD]).args([
                    "--forbid",
                    GIT_USER,
                    GIT_FORBIDDEN_PASSWORD,
                ]);
            }
        })
    }

    /// Starts `gitsrv.py` with the arguments `options` adds, and a fresh test CA's certificate
    /// for HTTPS (`kind`) unless those name one; waits until it listens.
    fn spawn(kind: GitServerKind, options: impl FnOnce(&mut Command)) -> GitServer {
        require_tool("python3", "python3");
        require_tool("git", "git");
        let dir = tempfile::Builder::new()
            .prefix("kiln-git-")
            .tempdir()
            .unwrap();
        let (root, state) = (dir.path().join("repos"), dir.path().join("state"));
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&state).unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(harness_dir().join("gitsrv.py"))
            .arg(&state)
            .arg(&root);
        options(&mut cmd);
        let named_tls = cmd.get_args().any(|a| a == "--tls");
        if kind == GitServerKind::BasicTls && !named_tls {
            let tls = dir.path().join("tls");
            super::registry::make_test_tls(&tls);
            cmd.arg("--tls")
                .arg(tls.join("cert.pem"))
                .arg(tls.join("key.pem"));
        }
        let log = File::create(state.join("server.log")).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn gitsrv.py");
        let mut server = GitServer {
            kind,
            dir,
            port: 0,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(port) = fs::read_to_string(state.join("port")) {
                server.port = port.trim().parse().unwrap();
                return server;
            }
            let exited = server.child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                panic!(
                    "gitsrv.py did not start ({exited:?})\n{}",
                    server.log("server.log")
                );
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// An HTTPS server that redirects every request to the same path on `target` (another
    /// port: another origin), with `target`'s certificate.
    pub fn redirecting_to(target: &GitServer) -> GitServer {
        let tls = target.dir.path().join("tls");
        let base = format!("https://127.0.0.1:{}", target.port);
        GitServer::spawn(GitServerKind::BasicTls, |cmd| {
            cmd.arg("--redirect-to")
                .arg(&base)
                .arg("--tls")
                .arg(tls.join("cert.pem"))
                .arg(tls.join("key.pem"));
        })
    }

    /// Where repositories are served from.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("repos")
    }

    /// The URL of `<name>.git`.
    pub fn url(&self, name: &str) -> String {
        let scheme = match self.kind {
            GitServerKind::Plain => "http",
            GitServerKind::BasicTls => "https",
        };
        format!("{scheme}://127.0.0.1:{}/{name}.git", self.port)
    }

    /// The test CA's PEM (HTTPS only).
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("tls/ca.pem")
    }

    /// A directory with `username` and `password` files, as a mounted Secret has them.
    pub fn auth_dir(&self, password: &str) -> PathBuf {
        let hex: String = password.bytes().map(|b| format!("{b:02x}")).collect();
        let dir = self.dir.path().join(format!("auth-{hex}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("username"), GIT_USER).unwrap();
        fs::write(dir.join("password"), password).unwrap();
        dir
    }

    /// One line per request: METHOD, path, status, response bytes, auth state.
    pub fn access_log(&self) -> Vec<String> {
        self.log("access.log").lines().map(str::to_string).collect()
    }

    /// The pkt-lines clients sent to git-upload-pack (`want …`, `deepen 1`, …).
    pub fn upload_pack_log(&self) -> String {
        self.log("upload-pack.log")
    }

    /// Response bytes the server sent, in total.
    pub fn bytes_sent(&self) -> u64 {
        self.access_log()
            .iter()
            .filter_map(|l| l.split('\t').nth(3)?.parse::<u64>().ok())
            .sum()
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.dir.path().join("state").join(name)).unwrap_or_default()
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
