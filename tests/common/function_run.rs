//! A Function image served by `kiln run` on a free loopback port, the way a user runs one:
//! started, waited for until it answers `/healthz`, and killed when the test is done.

use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::http::request;
use super::kiln::Kiln;

/// A running `kiln run` (the process, for a test that signals it), killed on drop.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (120 s at most) until the server on `port` answers `/healthz` with 200; panics if
/// `child` exits first. A native server is up in well under a second, but an arm64 Python
/// server under qemu, three tests at a time on CI's two cores, once took over 30 s.
fn wait_ready(port: u16, child: &mut Child) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kiln run exited early with {status}");
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok()
            && request(port, "GET", "/healthz", &[], b"").0 == 200
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the function did not become ready on port {port}");
}

/// Starts `kiln run REFERENCE` on a free port and waits until the function answers /healthz.
pub fn serve(k: &Kiln, reference: &str, extra: &[&str]) -> (u16, Running) {
    let port = super::free_port();
    let mut child = k
        .command_with_shared_downloads()
        .args(["run", reference, "--port", &port.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(port, &mut child);
    (port, Running(child))
}
