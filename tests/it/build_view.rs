//! `kiln build`'s human view, on a real terminal: tmux runs kiln in an 80-column pane, with
//! stdout to a file, and the pane (its history too) is read back as the terminal drew it. A
//! build with a dependency install in the builder image and a push to a real registry shows
//! one line per step, each within the width and ending with its time, then the summary; no
//! spinner is left behind and no log line shows. stdout has the reference alone. `NO_COLOR`
//! takes the colour away and `-q` leaves the screen empty. `kiln run`'s unpack, a live line
//! of its own, leaves nothing behind either.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::kiln::{Kiln, kiln_built_builder, tiny_base};
use common::registry::{Registry, RegistryKind};

/// The pane's width.
const COLUMNS: usize = 80;

/// What a run under tmux left: its exit code, its stdout, and the pane with its history,
/// as text and with the colour escapes.
struct Screen {
    code: i32,
    stdout: String,
    text: String,
    escaped: String,
}

/// Runs `kiln ARGS` in a fresh tmux server's 80-column pane, with `env` added to the test
/// environment, and reads the pane back once kiln has exited.
fn on_tmux(kiln: &Kiln, work: &Path, args: &[&str], env: &[(&str, &str)]) -> Screen {
    common::require_tool("tmux", "tmux");
    let dir = tempfile::tempdir_in(work).unwrap();
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut script = String::new();
    for (key, value) in kiln.command().get_envs() {
        let key = key.to_str().unwrap();
        match value {
            Some(value) => script += &format!("export {key}={}\n", quote(value.to_str().unwrap())),
            None => script += &format!("unset {key}\n"),
        }
    }
    for (key, value) in env.iter().chain(&[("KILN_LOG_FORMAT", "auto")]) {
        script += &format!("export {key}={}\n", quote(value));
    }
    let line: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_kiln"))
        .chain(args.iter().copied())
        .map(quote)
        .collect();
    let (stdout, rc) = (dir.path().join("stdout"), dir.path().join("rc"));
    script += &format!(
        "{} > {}\necho $? > {rc}.tmp && mv {rc}.tmp {rc}\nexec sleep 600\n",
        line.join(" "),
        quote(stdout.to_str().unwrap()),
        rc = quote(rc.to_str().unwrap()),
    );
    let script_path = dir.path().join("run.sh");
    std::fs::write(&script_path, script).unwrap();
    let socket = dir.path().join("tmux.sock");
    let tmux = |args: &[&str]| {
        let out = std::process::Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args(["-f", "/dev/null"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let columns = COLUMNS.to_string();
    tmux(&[
        "new-session",
        "-d",
        "-x",
        &columns,
        "-y",
        "40",
        "sh",
        script_path.to_str().unwrap(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(600);
    while !rc.exists() {
        assert!(Instant::now() < deadline, "kiln did not finish in the pane");
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = tmux(&["capture-pane", "-p", "-J", "-S", "-"]);
    let escaped = tmux(&["capture-pane", "-p", "-J", "-e", "-S", "-"]);
    tmux(&["kill-server"]);
    Screen {
        code: std::fs::read_to_string(&rc)
            .unwrap()
            .trim()
            .parse()
            .unwrap(),
        stdout: std::fs::read_to_string(&stdout).unwrap(),
        text,
        escaped,
    }
}

impl Screen {
    /// The pane's lines, trailing blanks dropped.
    fn lines(&self) -> Vec<&str> {
        let lines: Vec<&str> = self.text.lines().map(str::trim_end).collect();
        let end = lines
            .iter()
            .rposition(|l| !l.is_empty())
            .map_or(0, |i| i + 1);
        lines[..end].to_vec()
    }

    /// The step line that starts `✓ label`.
    fn step(&self, label: &str) -> &str {
        let start = format!("✓ {label} ");
        let found = self.lines().into_iter().find(|l| l.starts_with(&start));
        found.unwrap_or_else(|| panic!("no step {label:?} on the screen:\n{}", self.text))
    }

    /// Checks what every screen must be: kiln succeeded, stdout is the reference alone, no
    /// line is wider than the pane (a wrapped line is joined back by `capture-pane -J`),
    /// and no live line was left behind.
    fn check(&self, repository: &str) {
        assert_eq!(self.code, 0, "{}", self.text);
        let reference = self.stdout.trim_end_matches('\n');
        assert!(
            !reference.contains('\n')
                && reference.starts_with(&format!("{repository}@sha256:"))
                && reference.len() == repository.len() + 1 + 71,
            "stdout: {:?}",
            self.stdout
        );
        for line in self.lines() {
            assert!(
                line.chars().count() <= COLUMNS,
                "a line wider than the terminal:\n{line}\n{}",
                self.text
            );
            // indicatif's spinners are braille characters.
            assert!(
                !line.chars().any(|c| ('\u{2800}'..='\u{28ff}').contains(&c)),
                "a spinner line was left behind:\n{}",
                self.text
            );
            assert!(
                !line.contains(" INFO ") && !line.contains("kiln::"),
                "a log line in the step view:\n{}",
                self.text
            );
        }
    }
}

/// A step's time as the line ends with it: `12ms`, `1.2s`, `1m05s`.
fn ends_with_a_time(line: &str) -> bool {
    let last = line.rsplit(' ').next().unwrap_or_default();
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    match last.strip_suffix("ms") {
        Some(ms) => digits(ms),
        None => match last.strip_suffix('s') {
            Some(s) => match s.split_once('m') {
                Some((m, s)) => digits(m) && digits(s),
                None => s
                    .split_once('.')
                    .is_some_and(|(a, b)| digits(a) && digits(b)),
            },
            None => false,
        },
    }
}

#[test]
fn a_build_on_a_terminal_shows_its_steps_and_a_summary_within_the_width() {
    common::require_tool("bwrap", "bubblewrap");
    let work = tempfile::tempdir().unwrap();
    let kiln = Kiln::new();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let dir = work.path().join("fn");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("handler.js"),
        "const ms = require('ms');\nmodule.exports = { main: () => String(ms('1m')) };\n",
    )
    .unwrap();
    // No lock file: npm installs, in the builder image.
    std::fs::write(
        dir.join("package.json"),
        r#"{"name": "view", "version": "1.0.0", "dependencies": {"ms": "2.1.3"}}"#,
    )
    .unwrap();
    let reg = Registry::start(RegistryKind::Plain);
    let image = reg.reference("team/view:1.0");
    let repository = image.rsplit_once(':').unwrap().0.to_string();
    let (base, host) = (tiny_base(), reg.host());
    let args = [
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &base,
        "--builder-image",
        &builder,
        "--image",
        &image,
        "--insecure-registry",
        &host,
    ];

    let screen = on_tmux(&kiln, work.path(), &args, &[]);
    screen.check(&repository);
    for label in [
        "resolve base",
        "source layer",
        "unpack builder",
        "dependencies",
        "push",
        "manifest",
    ] {
        let line = screen.step(label);
        assert!(ends_with_a_time(line), "{line:?}");
    }
    assert!(
        screen.step("dependencies").contains("installed (npm)"),
        "{}",
        screen.text
    );
    assert!(
        screen.step("source layer").contains("2 files"),
        "{}",
        screen.text
    );
    // The base's layers went up, the layer count and bytes are counted, not listed.
    let push = screen.step("push");
    assert!(
        push.contains(" new (") && !push.contains("sha256"),
        "{push}"
    );
    let lines = screen.lines();
    let summary: Vec<&str> = lines
        .iter()
        .skip_while(|l| !l.starts_with("  image"))
        .copied()
        .collect();
    let rows: Vec<&str> = summary
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(rows, ["image", "size", "sent", "time"], "{}", screen.text);
    assert!(summary[0].contains(&repository), "{}", screen.text);
    assert!(summary[1].contains("new,"), "{}", screen.text);
    assert!(
        !summary[2].ends_with(" 0 B"),
        "the base's layers went up: {}",
        screen.text
    );
    // The step marks are green.
    assert!(screen.escaped.contains("\u{1b}[32m✓"), "{}", screen.escaped);

    // Again, unchanged, without colour: the same view, no escape codes.
    let screen = on_tmux(&kiln, work.path(), &args, &[("NO_COLOR", "1")]);
    screen.check(&repository);
    assert!(
        screen.step("existing image").contains("unchanged"),
        "{}",
        screen.text
    );
    assert!(!screen.escaped.contains('\u{1b}'), "{}", screen.escaped);

    // -v adds the build key to the summary; -q shows nothing but the reference.
    let verbose = [&args[..], &["-v"]].concat();
    let screen = on_tmux(&kiln, work.path(), &verbose, &[]);
    assert_eq!(screen.code, 0, "{}", screen.text);
    assert!(
        screen
            .lines()
            .iter()
            .any(|l| l.starts_with("  key     sha256:")),
        "{}",
        screen.text
    );
    // A warning stands out: Kyma's name nodejs20 builds the same image, and says so in
    // yellow.
    let mut aliased = args.to_vec();
    aliased[3] = "nodejs20";
    let screen = on_tmux(&kiln, work.path(), &aliased, &[]);
    screen.check(&repository);
    let warning = screen
        .escaped
        .lines()
        .find(|l| l.contains("nodejs20"))
        .unwrap_or_else(|| panic!("no warning:\n{}", screen.escaped));
    assert!(warning.contains("\u{1b}[33m"), "{warning:?}");
    let quiet = [&args[..], &["-q"]].concat();
    let screen = on_tmux(&kiln, work.path(), &quiet, &[]);
    screen.check(&repository);
    assert!(screen.lines().is_empty(), "{}", screen.text);

    // A live line outside the step list (kiln run unpacking the image) leaves nothing behind
    // either: a bar's first frame once stayed as a line of its own. (The tiny base has no
    // programs: the run fails once the image is unpacked, which is what is looked at here.)
    let reference = screen.stdout.trim().to_string();
    let run = ["run", &reference, "--insecure-registry", &host];
    let screen = on_tmux(&kiln, work.path(), &run, &[]);
    assert!(screen.text.contains("rootfs unpacked"), "{}", screen.text);
    assert!(
        !screen
            .text
            .contains(|c| ('\u{2800}'..='\u{28ff}').contains(&c)),
        "a live line was left behind:\n{}",
        screen.text
    );
}
