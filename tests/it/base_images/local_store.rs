//! With no `--base` or destination, the runtime's base and builder images are built into
//! kiln's local store on first use and the Function is served from there.

use crate::common;

use super::example;
use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, copy_tree};

#[test]
fn with_no_base_or_destination_the_runtime_images_are_built_into_the_local_store_on_first_use() {
    let k = Kiln::new();
    let store = common::kiln::shared_download_cache().join("store");
    let built = k.run_cmd(k.command_with_shared_downloads().args([
        "build",
        example("hello-node").to_str().unwrap(),
        "--runtime",
        "nodejs22",
    ]));
    let reference = built.reference();
    assert!(
        reference.starts_with(&format!("oci:{}@sha256:", store.display())),
        "{reference}"
    );
    let (port, _running) = serve(&k, &reference, &[]);
    let (status, body) = http::request(
        port,
        "POST",
        "/",
        &[("Content-Type", "application/json")],
        br#"{"name":"store"}"#,
    );
    assert_eq!(
        (status, body.contains("Hello, store!")),
        (200, true),
        "{body}"
    );
    // A Function with dependencies installs them in the store's builder image by default;
    // with a lock file that decides everything, kiln installs it alone, and the Function
    // finds its packages.
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("words");
    copy_tree(&example("node-words"), &dir);
    for (lockfile, used) in [
        ("off", "dependencies install inside the builder image"),
        (
            "auto",
            "installing dependencies from the lock file, without npm",
        ),
    ] {
        let built = k.run_cmd(k.command_with_shared_downloads().args([
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--no-cache",
            "--lockfile-install",
            lockfile,
        ]));
        let reference = built.reference();
        assert!(built.stderr.contains(used), "{}", built.stderr);
        let (port, _running) = serve(&k, &reference, &[]);
        let text = [("Content-Type", "text/plain")];
        let (status, answer) = http::request(port, "POST", "/", &text, b"to be or not to be");
        assert_eq!(
            (status, answer.contains(r#""be":2"#)),
            (200, true),
            "{answer}"
        );
    }
}
