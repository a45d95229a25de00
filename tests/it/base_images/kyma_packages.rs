//! The packages of Kyma's runtime images in kiln's bases: there without being declared, pinned,
//! in the SBOM with their licenses, and a Function's own copy wins; pinned wheels installed by
//! kiln alone load in the Python base.

use crate::common;

use std::path::Path;
use std::process::Command;

use super::{base_build, functions};
use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, copy_tree};

/// Builds the Function in `dir` on the base (and, when it declares dependencies, installs them
/// in the builder image) and returns the JSON of `GET /`.
fn build_on_bases_and_get(
    k: &Kiln,
    bases: &Path,
    runtime: &str,
    dir: &Path,
    with_builder: bool,
) -> serde_json::Value {
    let out = dir.with_extension("out");
    let mut cmd = k.command_with_shared_downloads();
    cmd.args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        runtime,
        "--base",
        &format!("oci:{}:{runtime}", bases.display()),
        "--output",
        &format!("oci:{}", out.display()),
    ]);
    if with_builder {
        cmd.args([
            "--builder-image",
            &format!("oci:{}:{runtime}-builder", bases.display()),
            "--deps-sandbox",
            "bwrap",
        ]);
    }
    let reference = k.run_cmd(&mut cmd).reference();
    let (port, _running) = serve(k, &reference, &[]);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The SBOM file of the base image in `bases`.
fn base_sbom(bases: &Path) -> String {
    common::run(Command::new("sh").arg("-c").arg(format!(
        "for l in {}/blobs/sha256/*; do tar xzOf $l usr/share/kiln/sbom.json 2>/dev/null || true; \
            done",
        bases.display()
    )))
}

/// The SBOM's licenses: Debian's from the machine-readable copyright files (libc6 is
/// LGPL-2.1+ among others), npm's and PyPI's as each package declares them (`package`, one
/// of Kyma's, has one), and nearly every package has one.
fn check_sbom_licenses(sbom: &str, package: &str) {
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(sbom)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {sbom}"));
    for doc in docs {
        let packages = doc["packages"].as_array().unwrap();
        let licenses = |name: &str| -> Vec<String> {
            packages
                .iter()
                .find(|p| p["name"] == name)
                .map(|p| serde_json::from_value(p["licenses"].clone()).unwrap())
                .unwrap_or_default()
        };
        assert!(
            licenses("libc6").iter().any(|l| l == "LGPL-2.1+"),
            "libc6: {:?}",
            licenses("libc6")
        );
        let from_registries: Vec<_> = packages
            .iter()
            .filter(|p| p["origin"] != "debian")
            .collect();
        let without: Vec<_> = from_registries
            .iter()
            .filter(|p| p["licenses"].as_array().unwrap().is_empty())
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert!(
            without.len() * 10 <= from_registries.len(),
            "{} of {} npm/PyPI packages have no license: {without:?}",
            without.len(),
            from_registries.len()
        );
        if packages.iter().any(|p| p["name"] == package) {
            assert!(
                !licenses(package).is_empty(),
                "{package} declares a license"
            );
        }
    }
}

/// Kyma's runtime images carry packages a Function may use without declaring them; kiln's
/// bases carry them too — pinned by the lock, in a layer of their own, in the SBOM — and a
/// Function's own copy of one of them wins over the base's.
fn kyma_packages_are_there_and_the_functions_own_win(
    runtime: &str,
    fixture: &str,
    package: &str,
    own: (&str, &str),
    own_version: &str,
) {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, runtime, &bases);
    let (_, lock) = kiln::base::recipe::embedded(runtime).unwrap();
    let pinned = lock
        .first
        .npm_tree
        .iter()
        .find(|p| p.path == package)
        .map(|p| p.tarball.version.clone())
        .or_else(|| {
            lock.first
                .wheel
                .iter()
                .find(|w| w.name == package)
                .map(|w| w.version.clone())
        })
        .unwrap_or_else(|| panic!("{package} is pinned in the {runtime} lock"));
    assert_ne!(pinned, own_version);

    let dir = work.path().join("fn");
    copy_tree(&functions(fixture), &dir);
    let answer = build_on_bases_and_get(&k, &bases, runtime, &dir, false);
    assert_eq!(answer[package], pinned.as_str(), "{answer}");
    assert!(
        !answer["from"].as_str().unwrap().contains("function"),
        "from the base's directory: {answer}"
    );

    let sbom = base_sbom(&bases);
    assert!(
        sbom.contains(&format!(r#""name":"{package}""#)) && sbom.contains(&pinned),
        "the SBOM lists {package} {pinned}: {sbom}"
    );
    check_sbom_licenses(&sbom, package);
    let config = common::run(Command::new("sh").arg("-c").arg(format!(
        "grep -l created_by {}/blobs/sha256/* | xargs cat",
        bases.display()
    )));
    assert!(
        config.contains("Kyma's runtime packages"),
        "a layer of their own: {config}"
    );

    let own_dir = work.path().join("own");
    copy_tree(&functions(fixture), &own_dir);
    std::fs::write(own_dir.join(own.0), own.1).unwrap();
    let answer = build_on_bases_and_get(&k, &bases, runtime, &own_dir, true);
    assert_eq!(
        answer[package], own_version,
        "the Function's own wins: {answer}"
    );
}

#[test]
fn nodejs22_functions_require_kymas_packages_undeclared_and_their_own_win() {
    kyma_packages_are_there_and_the_functions_own_win(
        "nodejs22",
        "node-kyma-packages",
        "axios",
        (
            "package.json",
            r#"{"name":"f","version":"1.0.0","dependencies":{"axios":"1.6.0"}}"#,
        ),
        "1.6.0",
    );
}

#[test]
fn python313_functions_import_kymas_packages_undeclared_and_their_own_win() {
    kyma_packages_are_there_and_the_functions_own_win(
        "python313",
        "python-kyma-packages",
        "requests",
        ("requirements.txt", "requests==2.31.0\n"),
        "2.31.0",
    );
}

/// A Python Function whose requirements.txt pins every package gets its wheels from kiln,
/// without pip or the builder image, and they load in the base: compiled extensions
/// (PyYAML's libyaml binding, charset-normalizer) and pure packages alike.
#[test]
fn pinned_wheels_installed_by_kiln_run_in_the_python_base() {
    let k = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let bases = work.path().join("bases");
    base_build(&k, "python313", &bases);
    let dir = work.path().join("fn");
    copy_tree(&functions("python-pinned"), &dir);
    let out = work.path().join("out");
    let built = k.run_cmd(k.command_with_shared_downloads().args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "python313",
        "--base",
        &format!("oci:{}:python313", bases.display()),
        "--builder-image",
        &format!("oci:{}:python313-builder", bases.display()),
        "--output",
        &format!("oci:{}", out.display()),
        // The cache is shared with other tests: install here, whatever they left.
        "--no-cache",
    ]));
    let reference = built.reference();
    assert!(
        built
            .stderr
            .contains("installing the pinned requirements, without pip")
            && !built
                .stderr
                .contains("dependencies install inside the builder image"),
        "{}",
        built.stderr
    );
    let (port, _running) = serve(&k, &reference, &[]);
    let (status, answer) = http::request(port, "GET", "/", &[], b"");
    assert_eq!(
        (status, answer.as_str()),
        (200, "2024 {'a': [1, 2]} 2.32.3 3.4.1"),
        "{answer}"
    );
}
