//! What a dependency install leaves is as untrusted as its scripts: kiln layers its output
//! directory only when it is one (not a link an install script put there to a host
//! directory), and never when a file in it holds a registry credential of the install's
//! `.npmrc`/`pip.conf`, which every install script could read.

use crate::common;

use std::fs;

use super::install_reads::{build, with_postinstall};
use common::kiln::{Kiln, kiln_built_builder};

#[test]
fn an_output_an_install_script_turned_into_a_link_to_the_host_is_not_layered() {
    common::require_tool("bwrap", "bubblewrap");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    // Followed after the sandbox is gone, the link would lead to the host's directory.
    let host_dir = work.path().join("host-secrets");
    fs::create_dir_all(&host_dir).unwrap();
    fs::write(host_dir.join("id_ed25519"), "PRIVATE KEY OF THE HOST").unwrap();
    let script = format!(
        "const fs=require('fs');fs.rmSync('node_modules',{{recursive:true,force:true}});\
         fs.symlinkSync({:?},'node_modules')",
        host_dir.display().to_string()
    );
    let function = with_postinstall(work.path(), "linker", &script);
    let out = work.path().join("out");
    let run = build(&kiln, &function, &builder, &out, "auto");
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("produced no node_modules directory"),
        "{}",
        run.stderr
    );
    assert!(!out.join("index.json").exists(), "nothing is written");
}

#[test]
fn an_install_script_that_copies_a_registry_credential_into_its_output_is_refused() {
    common::require_tool("bwrap", "bubblewrap");
    const TOKEN: &str = "KILN-LEAKED-TOKEN-3b9e71";
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let script = "const fs=require('fs');\
                  fs.writeFileSync('node_modules/is-number/leak.txt',fs.readFileSync('.npmrc'))";
    let function = with_postinstall(work.path(), "copier", script);
    fs::write(
        function.join(".npmrc"),
        format!("//npm.secret.example/:_authToken={TOKEN}\n"),
    )
    .unwrap();
    let out = work.path().join("out");
    let run = build(&kiln, &function, &builder, &out, "auto");
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "wrote a registry credential from .npmrc/pip.conf into node_modules/is-number/leak.txt"
        ),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(TOKEN), "{}", run.stderr);
    assert!(!out.join("index.json").exists(), "nothing is written");
}
