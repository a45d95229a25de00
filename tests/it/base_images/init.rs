//! `kiln init`: the Function it writes builds and answers at once, as Kyma's templates do;
//! its manifest builds the same way; it never overwrites a file.

use crate::common;

use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, base_images_into};

/// Builds the Function in `dir` (or its `--function` manifest) on the shared bases of
/// `runtime`, serves it and returns the answer to `GET /`.
fn build_and_call(k: &Kiln, runtime: &str, source: &[&str]) -> String {
    let bases = tempfile::tempdir().unwrap();
    base_images_into(k, runtime, bases.path());
    let out = tempfile::tempdir().unwrap();
    let mut args = vec!["build"];
    args.extend(source);
    let (base, output) = (
        format!("oci:{}:{runtime}", bases.path().display()),
        format!("oci:{}", out.path().display()),
    );
    args.extend(["--runtime", runtime, "--base", &base, "--output", &output]);
    let reference = k.run(&args).reference();
    let (port, _running) = serve(k, &reference, &[]);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn kiln_init_writes_a_function_that_builds_and_answers_and_overwrites_nothing() {
    let k = Kiln::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hello");
    let path = dir.to_str().unwrap();
    let written = k.run(&["init", path, "--runtime", "nodejs22"]).reference();
    assert_eq!(written, path);
    for file in ["handler.js", "package.json", ".kilnignore"] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    assert_eq!(
        build_and_call(&k, "nodejs22", &[path]),
        "Hello World from the Kyma Function hello running on nodejs22!"
    );

    // Nothing is overwritten, not even the files that do not exist yet.
    std::fs::write(dir.join("handler.js"), "// mine\n").unwrap();
    std::fs::remove_file(dir.join("package.json")).unwrap();
    let err = k
        .run(&["init", path, "--runtime", "nodejs22"])
        .failure(2)
        .to_string();
    assert!(
        err.contains("handler.js") && err.contains("writes no file that exists"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("handler.js")).unwrap(),
        "// mine\n"
    );
    assert!(!dir.join("package.json").exists());

    // Python, with its Kyma manifest, built from the manifest as the cluster would.
    let py = tmp.path().join("py-hello");
    let py_path = py.to_str().unwrap();
    k.run(&["init", py_path, "--runtime", "python313", "--manifest"])
        .reference();
    let manifest = py.join("function.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(
        text.contains("name: py-hello") && text.contains("runtime: python313"),
        "{text}"
    );
    assert_eq!(
        build_and_call(&k, "python313", &["--function", manifest.to_str().unwrap()]),
        "Hello World from the Kyma Function py-hello running on python313!"
    );

    // A directory whose name cannot name a Function needs --name.
    let bad = tmp.path().join("Not_A_Name");
    let err = k
        .run(&[
            "init",
            bad.to_str().unwrap(),
            "--runtime",
            "python313",
            "--manifest",
        ])
        .failure(2)
        .to_string();
    assert!(err.contains("pass --name NAME"), "{err}");
    assert!(!bad.exists());
}

/// The templates of Kyma's new handler API (`main(req, res)` with the `sdk` module on
/// nodejs26, Flask's `main()` on python314) build and answer too.
#[test]
fn kiln_init_writes_new_api_functions_that_build_and_answer() {
    let k = Kiln::new();
    let tmp = tempfile::tempdir().unwrap();
    for runtime in ["nodejs26", "python314"] {
        let dir = tmp.path().join(format!("hi-{runtime}"));
        let path = dir.to_str().unwrap();
        k.run(&["init", path, "--runtime", runtime]).reference();
        assert_eq!(
            build_and_call(&k, runtime, &[path]),
            format!("Hello World from the Kyma Function hi-{runtime} running on {runtime}!")
        );
    }
}
