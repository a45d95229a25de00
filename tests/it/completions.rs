//! `kiln completions SHELL` and `kiln man`: generated from the flags, and usable as they are.

use crate::common;

use common::kiln::Kiln;

#[test]
fn bash_completes_kilns_commands_and_flags_and_the_man_page_lists_every_command() {
    let k = Kiln::new();
    let script = k.run(&["completions", "bash"]).stdout;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &script).unwrap();
    // Sourced into bash, it completes as bash would at `kiln b<TAB>` and `kiln build --pla<TAB>`.
    let complete = |words: &str| {
        let line = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); \
             _kiln kiln \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; \
             echo \"${{COMPREPLY[@]}}\"",
            file.path().display()
        );
        common::run(std::process::Command::new("bash").args(["-c", &line]))
    };
    let commands: Vec<String> = complete("kiln b")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(commands, ["build", "base"], "{commands:?}");
    assert!(
        complete("kiln build --pla")
            .split_whitespace()
            .any(|w| w == "--platform")
    );
    for shell in ["zsh", "fish"] {
        let run = k.run(&["completions", shell]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(run.stdout.contains("--runtime"), "{shell}");
    }
    let err = k.run(&["completions", "tcsh"]).failure(2).to_string();
    assert!(err.contains("possible values: bash"), "{err}");

    let page = k.run(&["man"]).stdout;
    assert!(
        page.starts_with(".ie") && page.contains(".TH kiln 1"),
        "{page}"
    );
    for command in [
        "build",
        "base",
        "run",
        "init",
        "controller",
        "warm",
        "verify",
        "man",
    ] {
        assert!(page.contains(&format!("kiln\\-{command}")), "{command}");
    }
    // With --dir, the pages it refers to as well.
    let dir = tempfile::tempdir().unwrap();
    k.run(&["man", "--dir", dir.path().to_str().unwrap()])
        .reference();
    for page in ["kiln.1", "kiln-build.1", "kiln-base-build.1", "kiln-init.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(text.contains(".TH"), "{page}");
    }
}
