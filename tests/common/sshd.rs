//! A real OpenSSH server for the tests: Debian's `sshd`, started on a free 127.0.0.1 port with
//! a host key of its own and the test keys it authorizes, serving the machine's `git` to the
//! user running the tests. Killed on drop.

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{require_tool, run};

/// The passphrase of [`SshServer::encrypted_key`].
pub const KEY_PASSPHRASE: &str = "ssh-Passphrase-1618";

/// A running `sshd`.
pub struct SshServer {
    dir: TempDir,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    child: Child,
}

impl SshServer {
    /// Starts `sshd` authorizing [`SshServer::key`] and [`SshServer::encrypted_key`], and
    /// waits until it listens.
    pub fn start() -> SshServer {
        require_tool("ssh-keygen", "openssh-client");
        let sshd = Path::new("/usr/sbin/sshd");
        assert!(
            sshd.is_file(),
            "required tool `sshd` is not installed; install the Debian package with \
             `apt-get install -y --no-install-recommends openssh-server`"
        );
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        keygen(&d.join("host_key"), "");
        keygen(&d.join("client_key"), "");
        keygen(&d.join("encrypted_key"), KEY_PASSPHRASE);
        keygen(&d.join("other_key"), "");
        keygen(&d.join("stall_key"), "");
        keygen(&d.join("trickle_key"), "");
        let mut authorized: String = ["client_key.pub", "encrypted_key.pub"]
            .iter()
            .map(|f| fs::read_to_string(d.join(f)).unwrap())
            .collect();
        // Keys whose session runs a command of the server's instead of git: one that says
        // nothing, one that announces a 64 KiB packet line and sends it a byte at a time.
        for (key, command) in [
            ("stall_key.pub", "sleep 30"),
            (
                "trickle_key.pub",
                "printf fff0; i=0; while [ $i -lt 200 ]; do printf a; sleep 0.3; i=$((i+1)); done",
            ),
        ] {
            authorized += &format!(
                "command=\"{command}\" {}",
                fs::read_to_string(d.join(key)).unwrap()
            );
        }
        fs::write(d.join("authorized_keys"), authorized).unwrap();
        // sshd checks that its privilege-separation directory exists.
        let _ = fs::create_dir_all("/run/sshd");
        let port = free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nLogLevel VERBOSE\n",
            d = d.display()
        );
        fs::write(d.join("sshd_config"), config).unwrap();
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(d.join("sshd.log")).unwrap())
            .spawn()
            .unwrap();
        let server = SshServer { dir, port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd did not listen: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// The private key sshd authorizes (OpenSSH format, unencrypted).
    pub fn key(&self) -> String {
        fs::read_to_string(self.dir.path().join("client_key")).unwrap()
    }

    /// An authorized key encrypted with [`KEY_PASSPHRASE`].
    pub fn encrypted_key(&self) -> String {
        fs::read_to_string(self.dir.path().join("encrypted_key")).unwrap()
    }

    /// A key sshd does not authorize.
    pub fn other_key(&self) -> String {
        fs::read_to_string(self.dir.path().join("other_key")).unwrap()
    }

    /// An authorized key whose session sends nothing.
    pub fn stall_key(&self) -> String {
        fs::read_to_string(self.dir.path().join("stall_key")).unwrap()
    }

    /// An authorized key whose session sends a byte every 0.3 s, without end.
    pub fn trickle_key(&self) -> String {
        fs::read_to_string(self.dir.path().join("trickle_key")).unwrap()
    }

    /// The `known_hosts` line for this server's host key.
    pub fn known_hosts(&self) -> String {
        let public = fs::read_to_string(self.dir.path().join("host_key.pub")).unwrap();
        let mut parts = public.split_whitespace();
        let (kind, key) = (parts.next().unwrap(), parts.next().unwrap());
        format!("[127.0.0.1]:{} {kind} {key}\n", self.port)
    }

    /// A `known_hosts` line for this address with another key.
    pub fn wrong_known_hosts(&self) -> String {
        let public = fs::read_to_string(self.dir.path().join("other_key.pub")).unwrap();
        let mut parts = public.split_whitespace();
        let (kind, key) = (parts.next().unwrap(), parts.next().unwrap());
        format!("[127.0.0.1]:{} {kind} {key}\n", self.port)
    }

    /// `ssh://USER@127.0.0.1:PORT/<path>` for a repository at the absolute `path`.
    pub fn url(&self, path: &Path) -> String {
        format!("ssh://{}@127.0.0.1:{}{}", user(), self.port, path.display())
    }

    /// A git auth directory as a mounted Kyma Secret of `type: key` has it.
    pub fn auth_dir(
        &self,
        key: &str,
        password: Option<&str>,
        known_hosts: Option<&str>,
    ) -> PathBuf {
        let dir = tempfile::tempdir_in(self.dir.path()).unwrap().keep();
        fs::write(dir.join("key"), key).unwrap();
        if let Some(p) = password {
            fs::write(dir.join("password"), p).unwrap();
        }
        if let Some(k) = known_hosts {
            fs::write(dir.join("knownHosts"), k).unwrap();
        }
        dir
    }

    /// What sshd logged.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path, passphrase: &str) {
    run(Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-C",
            "kiln-test",
            "-N",
            passphrase,
            "-f",
        ])
        .arg(path));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The user running the tests, whose login sshd accepts.
fn user() -> String {
    String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string()
}
