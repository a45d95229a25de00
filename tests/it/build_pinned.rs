//! Dependencies of a fully pinned requirements.txt installed by kiln itself (`--lockfile-install
//! auto`) are what pip installs: the same Function built both ways — kiln alone, then pip in
//! the builder image kiln assembled — gives dependency layers with the same files, modes and
//! bytes, `RECORD`s and console scripts included. Real wheels from PyPI: compiled ones
//! (PyYAML, charset-normalizer, which also has a console script) and pure ones. A
//! requirements.txt that leaves a dependency unpinned goes to pip, which resolves it.

use crate::common;

use common::kiln::{Kiln, copy_fixture, dependency_layer, kiln_built_builder, tiny_base};

#[test]
fn kiln_installs_pinned_wheels_as_pip_does_and_hands_unpinned_ones_to_pip() {
    common::require_tool("bwrap", "bubblewrap");
    let work = tempfile::tempdir().unwrap();
    let dir = copy_fixture("python-pinned", &work.path().join("fn"));
    let kiln = Kiln::new();
    let builder = kiln_built_builder(&kiln, "python313", &work.path().join("bases"));
    let build = |mode: &str, dir: &std::path::Path| {
        let (out, report) = (
            work.path().join(format!("out-{mode}")),
            work.path().join(format!("{mode}.json")),
        );
        let run = Kiln::new().run(&[
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "python313",
            "--base",
            &tiny_base(),
            "--builder-image",
            &builder,
            "--output",
            &format!("oci:{}", out.display()),
            "--report",
            report.to_str().unwrap(),
            "--lockfile-install",
            if mode == "off" { "off" } else { "auto" },
        ]);
        run.reference();
        (run.stderr, dependency_layer(&out, &report))
    };
    let (auto_log, by_kiln) = build("auto", &dir);
    assert!(
        auto_log.contains("installing the pinned requirements, without pip")
            && !auto_log.contains("dependencies install inside the builder image"),
        "{auto_log}"
    );
    let (off_log, by_pip) = build("off", &dir);
    assert!(
        off_log.contains("dependencies install inside the builder image"),
        "{off_log}"
    );
    let sp = |p: &str| format!("kubeless/site-packages/{p}");
    assert!(by_kiln.contains_key(&sp("yaml/_yaml.cpython-313-x86_64-linux-gnu.so")));
    assert!(by_kiln[&sp("bin/normalizer")].0.ends_with("755"));
    assert!(by_kiln.contains_key(&sp("six-1.17.0.dist-info/REQUESTED")));
    let differ: Vec<_> = by_kiln
        .keys()
        .chain(by_pip.keys())
        .filter(|k| by_kiln.get(*k) != by_pip.get(*k))
        .map(|k| (k, by_kiln.get(k), by_pip.get(k)))
        .take(10)
        .collect();
    assert!(differ.is_empty(), "kiln vs pip: {differ:#?}");

    // urllib3, idna, certifi and charset-normalizer left for pip to choose.
    let loose = copy_fixture("python-pinned", &work.path().join("loose"));
    std::fs::write(
        loose.join("requirements.txt"),
        "requests==2.32.3\nPyYAML==6.0.2\npython-dateutil==2.9.0.post0\nsix==1.17.0\n",
    )
    .unwrap();
    let (loose_log, by_pip) = build("loose", &loose);
    assert!(
        loose_log.contains("the dependencies need pip")
            && loose_log.contains("which requirements.txt does not pin")
            && loose_log.contains("dependencies install inside the builder image"),
        "{loose_log}"
    );
    assert!(by_pip.keys().any(|k| k.starts_with(&sp("urllib3/"))));
}
