//! `kiln dev` on the real runtimes' images (assembled by `kiln base build`): the Function
//! answers on the port from the first build on, every save is built and swapped in without a
//! moment in which nothing answers, a source-only save neither installs nor unpacks, a failed
//! build leaves the last good Function answering, a dependency change installs, and Ctrl-C
//! stops it all.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::kiln::{Kiln, base_images_into};

/// A running `kiln dev`, its stderr going to `log`; killed on drop.
struct Dev {
    child: Child,
    port: u16,
    log: PathBuf,
    /// How much of the log earlier steps read.
    read: usize,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    fn start(kiln: &Kiln, dir: &Path, runtime: &str, bases: &Path) -> Dev {
        common::require_tool("bwrap", "bubblewrap");
        let port = common::free_port();
        let log = dir.with_extension("log");
        let child = kiln
            .command()
            .args(["dev", dir.to_str().unwrap(), "--runtime", runtime])
            .arg("--base")
            .arg(format!("oci:{}:{runtime}", bases.display()))
            .arg("--builder-image")
            .arg(format!("oci:{}:{runtime}-builder", bases.display()))
            .args(["--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Dev {
            child,
            port,
            log,
            read: 0,
        }
    }

    /// One GET / through the proxy: the status and the body, or `None` when no connection.
    fn get(&self) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .ok()?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, text.split_once("\r\n\r\n")?.1.to_string()))
    }

    /// Polls until the body is `want` (120 s at most); every answer seen on the way.
    fn wait_for(&mut self, want: &str) -> Vec<Option<(u16, String)>> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            let answer = self.get();
            let done = answer.as_ref().is_some_and(|(_, body)| body == want);
            seen.push(answer);
            if done {
                return seen;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("kiln dev exited ({status}):\n{}", self.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "no {want:?}; last answers {:?}\n{}",
                &seen[seen.len().saturating_sub(3)..],
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What the log gained since the last call.
    fn new_log(&mut self) -> String {
        let text = self.log_text();
        let new = text[self.read.min(text.len())..].to_string();
        self.read = text.len();
        new
    }

    /// Waits (60 s at most) until the log has gained a line containing `needle`.
    fn wait_log(&mut self, needle: &str) -> String {
        let start = Instant::now();
        let mut gained = String::new();
        while !gained.contains(needle) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {needle:?} in the log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
            gained += &self.new_log();
        }
        gained
    }
}

/// Every answer was the old body or the new one, with a 200: nothing in between failed.
fn no_gap(seen: &[Option<(u16, String)>], old: &str, new: &str) {
    for answer in seen {
        assert!(
            matches!(answer, Some((200, body)) if body == old || body == new),
            "an answer during the swap: {answer:?} (all: {seen:?})"
        );
    }
}

/// Writes `content` to `path` as an editor saves: a new file renamed over the old one.
fn save(path: &Path, content: &str) {
    let tmp = path.with_extension("swp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A work directory with `runtime`'s base and builder images in `bases/` and an empty
/// Function directory `fn/`.
fn setup(runtime: &str) -> (tempfile::TempDir, Kiln, PathBuf, PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let kiln = Kiln::new();
    let bases = work.path().join("bases");
    base_images_into(&kiln, runtime, &bases);
    let dir = work.path().join("fn");
    std::fs::create_dir_all(&dir).unwrap();
    (work, kiln, bases, dir)
}

#[test]
fn kiln_dev_swaps_each_save_in_and_keeps_the_last_good_build_answering() {
    let (_work, kiln, bases, dir) = setup("nodejs22");
    let handler = |version: &str| {
        format!(
            "const ms = require('ms');\n\
             module.exports = {{ main: () => '{version} ' + ms(60000) }};\n"
        )
    };
    save(&dir.join("handler.js"), &handler("v1"));
    // No lock file: npm installs in the builder image.
    save(
        &dir.join("package.json"),
        r#"{"name": "dev", "version": "1.0.0", "dependencies": {"ms": "2.1.3"}}"#,
    );
    let mut dev = Dev::start(&kiln, &dir, "nodejs22", &bases);
    dev.wait_for("v1 1m");
    dev.wait_log("answers on http://127.0.0.1:");
    dev.new_log();

    // A source-only save: no install, no unpack, and an answer at every moment.
    save(&dir.join("handler.js"), &handler("v2"));
    let seen = dev.wait_for("v2 1m");
    no_gap(&seen, "v1 1m", "v2 1m");
    let cycle = dev.wait_log(" answers, ");
    assert!(cycle.contains("dependency layer from cache"), "{cycle}");
    assert!(
        !cycle.contains("unpacking image") && !cycle.contains("installing dependencies"),
        "{cycle}"
    );

    // A build that fails is shown; the last good Function keeps answering.
    std::fs::remove_file(dir.join("handler.js")).unwrap();
    let cycle = dev.wait_log("the last good build keeps answering");
    assert!(
        cycle.contains("error:") && cycle.contains("handler.js"),
        "{cycle}"
    );
    assert_eq!(dev.get(), Some((200, "v2 1m".to_string())));
    save(&dir.join("handler.js"), &handler("v3"));
    let seen = dev.wait_for("v3 1m");
    no_gap(&seen, "v2 1m", "v3 1m");
    dev.wait_log(" answers, ");

    // A new dependency installs, and the new image is unpacked.
    save(
        &dir.join("package.json"),
        r#"{"name": "dev", "version": "1.0.0",
            "dependencies": {"ms": "2.1.3", "escape-html": "1.0.3"}}"#,
    );
    save(
        &dir.join("handler.js"),
        "const esc = require('escape-html');\nmodule.exports = { main: () => esc('<v4>') };\n",
    );
    let seen = dev.wait_for("&lt;v4&gt;");
    // The package.json save alone builds an image whose handler has no escape-html yet: it
    // may answer in between, as the editor saved it.
    for answer in &seen {
        assert!(
            matches!(answer, Some((200, _))),
            "{answer:?} (all: {seen:?})"
        );
    }
    let cycles = dev.wait_log(" answers, ");
    assert!(cycles.contains("unpacking image"), "{cycles}");

    // Ctrl-C stops the loop, its Function and the proxy.
    let pid = rustix::process::Pid::from_child(&dev.child);
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = dev.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "kiln dev did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}\n{}", dev.log_text());
    assert_eq!(dev.get(), None, "the port is closed");
}

#[test]
fn kiln_dev_serves_a_python_function_and_swaps_a_saved_change_in() {
    let (_work, kiln, bases, dir) = setup("python313");
    let handler = |v: &str| format!("def main(event, context):\n    return '{v}'\n");
    save(&dir.join("handler.py"), &handler("p1"));
    save(&dir.join("requirements.txt"), "");
    let mut dev = Dev::start(&kiln, &dir, "python313", &bases);
    dev.wait_for("p1");
    dev.wait_log("answers on http://127.0.0.1:");
    save(&dir.join("handler.py"), &handler("p2"));
    let seen = dev.wait_for("p2");
    no_gap(&seen, "p1", "p2");
    let cycle = dev.wait_log(" answers, ");
    assert!(!cycle.contains("unpacking image"), "{cycle}");
}
