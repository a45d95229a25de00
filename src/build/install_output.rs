//! What a dependency install prints: read to the end (stdout dropped as it comes, stderr
//! kept for the error's tail), its last line shown as progress, and every secret the
//! install's registry configs hold masked before kiln quotes any of it.

use tokio::io::AsyncReadExt;

use super::mask::Secrets;

/// How many trailing lines of the install's stderr an error carries.
const STDERR_TAIL_LINES: usize = 25;

/// Reads an install's stdout and stderr to their ends and returns stderr (for the error's
/// tail; stdout is dropped as it comes). Every [`crate::progress::PERIOD`] meanwhile, logs
/// the time elapsed and the last line either printed, masked.
pub(super) async fn read_output(
    stdout: Option<tokio::process::ChildStdout>,
    stderr: Option<tokio::process::ChildStderr>,
    secrets: &Secrets,
) -> std::io::Result<String> {
    let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let _progress = {
        let (last, secrets) = (last.clone(), secrets.clone());
        let line = move || last.lock().map(|l| secrets.mask(&l)).unwrap_or_default();
        let show = crate::progress::Show::Message {
            label: "installing dependencies".into(),
            message: Box::new(line.clone()),
        };
        crate::progress::Ticker::start(crate::progress::PERIOD, show, move |elapsed| {
            tracing::info!(
                elapsed_s = elapsed.as_secs(),
                last_line = %line(),
                "dependency install running",
            );
        })
    };
    // stdout only feeds the last line; stderr is also kept for the error's tail.
    let (_, err) = tokio::try_join!(drain(stdout, &last, false), drain(stderr, &last, true))?;
    Ok(String::from_utf8_lossy(&err).into_owned())
}

/// Reads `pipe` to its end, noting its last non-empty line in `last`; returns what it read
/// when `keep` (else nothing).
async fn drain(
    pipe: Option<impl tokio::io::AsyncRead + Unpin>,
    last: &std::sync::Mutex<String>,
    keep: bool,
) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else {
        return Ok(kept);
    };
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok(kept);
        }
        let text = String::from_utf8_lossy(&chunk[..n]);
        if let Some(line) = text.lines().rev().find(|l| !l.trim().is_empty())
            && let Ok(mut last) = last.lock()
        {
            line.trim().clone_into(&mut last);
        }
        if keep {
            kept.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The last lines of `text`, with `secrets` and every credential shape masked.
pub(super) fn tail(text: &str, secrets: &Secrets) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(STDERR_TAIL_LINES);
    secrets.mask(&lines[start..].join("\n"))
}
