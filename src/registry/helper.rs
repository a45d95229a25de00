//! Docker credential helpers: `docker-credential-<name> get`, with the server name on stdin
//! and `{"ServerURL","Username","Secret"}` on stdout
//! (<https://github.com/docker/docker-credential-helpers>).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tracing::debug;

use super::credential::Credential;

/// How long a helper may take (it may talk to a cloud metadata service).
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a helper's stdout (and its stderr) is read: a credential is a few KiB.
const HELPER_OUTPUT: u64 = 1 << 20;
/// The user name helpers return when the secret is an identity token.
const TOKEN_USERNAME: &str = "<token>";

/// Why a helper gave no answer.
#[derive(Debug)]
pub(crate) struct HelperFailure {
    /// The helper program does not exist.
    pub missing: bool,
    /// A description without secrets (exit status, first line of its error output).
    pub problem: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HelperOutput {
    #[serde(default)]
    username: String,
    #[serde(default)]
    secret: String,
}

/// Runs `docker-credential-<helper> get` for `server`, searching `dirs` (or `PATH` when empty).
/// `Ok(None)` when the helper has no credentials for the server.
pub(crate) async fn get(
    helper: &str,
    server: &str,
    dirs: &[PathBuf],
) -> Result<Option<Credential>, HelperFailure> {
    let fail = |missing, problem: String| HelperFailure { missing, problem };
    let valid = !helper.starts_with('.')
        && helper
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(fail(
            false,
            "the helper name may only contain letters, digits, '-', '_' and '.'".into(),
        ));
    }
    let program_name = format!("docker-credential-{helper}");
    let program = resolve(&program_name, dirs).await.ok_or_else(|| {
        fail(
            true,
            format!("{program_name} not found in {}", show_dirs(dirs)),
        )
    })?;
    debug!(helper = %program_name, server, "running credential helper");
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            fail(
                e.kind() == std::io::ErrorKind::NotFound,
                format!("cannot start {program_name}: {e}"),
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that exits without reading stdin makes this fail; its exit status tells more.
        let _ = stdin.write_all(server.as_bytes()).await;
    }
    // Read up to a limit, not whole: a helper printing without end fills no memory (it is
    // killed when this returns, `kill_on_drop`).
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let capped = |pipe: Option<_>| async move {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let mut pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send> = pipe;
            (&mut pipe)
                .take(HELPER_OUTPUT)
                .read_to_end(&mut bytes)
                .await?;
        }
        Ok::<_, std::io::Error>(bytes)
    };
    let run = async {
        let (out, err) = tokio::try_join!(
            capped(stdout.map(|p| Box::new(p) as _)),
            capped(stderr.map(|p| Box::new(p) as _))
        )?;
        if out.len() as u64 >= HELPER_OUTPUT {
            return Err(std::io::Error::other("it printed over 1 MiB"));
        }
        let status = child.wait().await?;
        Ok(std::process::Output {
            status,
            stdout: out,
            stderr: err,
        })
    };
    let output = tokio::time::timeout(HELPER_TIMEOUT, run)
        .await
        .map_err(|_| fail(false, format!("timed out after {HELPER_TIMEOUT:?}")))?
        .map_err(|e| fail(false, format!("running {program_name}: {e}")))?;
    if !output.status.success() {
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stdout.contains("credentials not found") || stderr.contains("credentials not found") {
            return Ok(None);
        }
        let first = stderr
            .lines()
            .chain(stdout.lines())
            .find(|l| !l.trim().is_empty());
        let line: String = first.unwrap_or("").trim().chars().take(200).collect();
        return Err(fail(
            false,
            format!("exited with {}: {line}", output.status),
        ));
    }
    let parsed: HelperOutput = serde_json::from_slice(&output.stdout).map_err(|_| {
        fail(
            false,
            "printed something that is not {\"Username\",\"Secret\"} JSON".into(),
        )
    })?;
    if parsed.secret.is_empty() {
        return Ok(None);
    }
    if parsed.username == TOKEN_USERNAME {
        return Ok(Some(Credential::IdentityToken(parsed.secret)));
    }
    Ok(Some(Credential::basic(parsed.username, parsed.secret)))
}

/// The program to run: the first `dir/name` that is a file, or the bare name (resolved by the
/// OS through `PATH`) when no directories are given.
async fn resolve(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if dirs.is_empty() {
        return Some(PathBuf::from(name));
    }
    for dir in dirs {
        let candidate = dir.join(name);
        if tokio::fs::metadata(&candidate)
            .await
            .is_ok_and(|m| m.is_file())
        {
            return Some(candidate);
        }
    }
    None
}

fn show_dirs(dirs: &[PathBuf]) -> String {
    let shown: Vec<String> = dirs
        .iter()
        .map(|d: &PathBuf| Path::display(d).to_string())
        .collect();
    shown.join(":")
}
