//! Integration-test harness shared by the test binaries under `tests/`.
//!
//! It is an independent checker: it does not use the kiln crate's logic (only its digest and,
//! in `function_server`, its package installers, to fetch the servers' runtime packages), but
//! std, `tempfile`, the crate's HTTP and Kubernetes client dependencies (for the fake API
//! server, `kube_api`) and external programs (docker-registry, skopeo, umoci, openssl,
//! htpasswd, curl, jq, python3).

#![allow(dead_code)]

pub mod base_change;
pub mod cert_manager;
pub mod controller_env;
pub mod crd_schema;
pub mod echo;
pub mod fake_builds;
pub mod faults;
pub mod function_run;
pub mod function_server;
pub mod git;
pub mod http;
pub mod images;
pub mod k8s_validate;
pub mod kiln;
pub mod kube_api;
pub mod kube_client;
pub mod kubectl;
pub mod netpol;
pub mod referrers_registry;
pub mod registry;
pub mod schema;
pub mod skopeo;
pub mod sshd;

use std::ffi::OsStr;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Directory of this harness (`tests/common`), where the Python helpers live.
pub fn harness_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("common")
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// The command line of `cmd`, for error messages.
pub fn command_line(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(
        cmd.get_args()
            .map(|a: &OsStr| a.to_string_lossy().into_owned()),
    );
    parts.join(" ")
}

fn describe_failure(cmd: &Command, out: &Output) -> String {
    format!(
        "command failed: {}\nexit status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        command_line(cmd),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` (stdin: /dev/null, optionally fed `input`), returning its output or a
/// description of the failure naming the command line, exit status, stdout and stderr.
pub fn try_run_with_input(cmd: &mut Command, input: Option<&[u8]>) -> Result<Vec<u8>, String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", command_line(cmd)))?;
    if let Some(data) = input {
        let mut stdin = child.stdin.take().expect("piped stdin");
        let data = data.to_vec();
        // Write from a thread so a child that fills its stdout pipe cannot deadlock us.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let _ = writer.join();
        return check_output(cmd, out);
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    check_output(cmd, out)
}

fn check_output(cmd: &Command, out: Output) -> Result<Vec<u8>, String> {
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(describe_failure(cmd, &out))
    }
}

/// Runs `cmd`, returning its stdout as bytes; panics with the full story on failure.
pub fn run_bytes(cmd: &mut Command) -> Vec<u8> {
    try_run_with_input(cmd, None).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `cmd`, returning its stdout as (lossy) UTF-8; panics with the command line, exit
/// status, stdout and stderr on failure.
pub fn run(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run_bytes(cmd)).into_owned()
}

/// Like [`run`], feeding `input` on stdin.
pub fn run_with_input(cmd: &mut Command, input: &[u8]) -> String {
    let out = try_run_with_input(cmd, Some(input)).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `name` is an executable found on PATH (or an existing path, if it has a slash).
pub fn tool_exists(name: &str) -> bool {
    if name.contains('/') {
        return Path::new(name).is_file();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
        .unwrap_or(false)
}

/// Panics with a clear message naming the Debian package when `name` is not installed.
pub fn require_tool(name: &str, debian_package: &str) {
    assert!(
        tool_exists(name),
        "required tool `{name}` is not installed; install the Debian package with \
         `apt-get install -y --no-install-recommends {debian_package}`"
    );
}

/// Runs `jq -c <filter>` on a JSON document and returns the trimmed output. Handy for
/// assertions in tests, e.g. `jq(".layers | length", &manifest) == "1"`.
pub fn jq(filter: &str, json: &[u8]) -> String {
    require_tool("jq", "jq");
    let out = try_run_with_input(Command::new("jq").arg("-c").arg(filter), Some(json))
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out).trim().to_string()
}

/// Like [`jq`] with `-r` (raw strings, one per line).
pub fn jq_raw(filter: &str, json: &[u8]) -> String {
    require_tool("jq", "jq");
    let out = try_run_with_input(Command::new("jq").arg("-r").arg(filter), Some(json))
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&out).trim().to_string()
}

/// `sha256:<hex>` of some bytes (computed by coreutils `sha256sum`).
pub fn sha256_digest(bytes: &[u8]) -> String {
    let out = run_with_input(Command::new("sha256sum").arg("-"), bytes);
    format!(
        "sha256:{}",
        out.split_whitespace().next().expect("sha256sum output")
    )
}

/// `sha256:<hex>` of a file (computed by coreutils `sha256sum`).
pub fn sha256_file(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    format!(
        "sha256:{}",
        out.split_whitespace().next().expect("sha256sum output")
    )
}

/// Standard base64 (with padding), for Basic credentials and docker config files.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
