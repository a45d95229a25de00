//! Image signatures: `kiln build --sign-key` stores them as cosign does, beside the image in a
//! real registry. Python's `cryptography` checks them over the exact payload bytes, with the
//! registry's HTTP API only (tests/fixtures/cosign/check.py), and so does `kiln verify`. Another
//! key, a payload changed after signing and a signature of another image all fail.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::kiln::{Kiln, copy_fixture, tiny_base};
use common::registry::{Registry, RegistryKind};

/// `check.py ARGS` (tests/fixtures/cosign/check.py); its output, trimmed.
pub(crate) fn check(args: &[&str]) -> String {
    let script = common::kiln::fixtures().join("cosign/check.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A registry, kiln, and a directory holding the keys `check.py keys` writes (a.key, a.pub,
/// b.key, b.pub).
struct Setup {
    reg: Registry,
    host: String,
    kiln: Kiln,
    work: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let reg = Registry::start(RegistryKind::Plain);
        let work = tempfile::tempdir().unwrap();
        check(&["keys", work.path().to_str().unwrap()]);
        Setup {
            host: reg.host(),
            reg,
            kiln: Kiln::new(),
            work,
        }
    }
}

pub(crate) fn build(kiln: &Kiln, reg: &Registry, dir: &Path, image: &str, key: &str) -> String {
    build_on(
        kiln,
        reg,
        dir,
        "nodejs22",
        &["--base", &tiny_base()],
        image,
        key,
    )
}

/// A signed build of the `runtime` Function in `dir` to `image` in `reg`, on the base (and
/// builder) that `base` names with its flags.
fn build_on(
    kiln: &Kiln,
    reg: &Registry,
    dir: &Path,
    runtime: &str,
    base: &[&str],
    image: &str,
    key: &str,
) -> String {
    let (image, host) = (reg.reference(image), reg.host());
    build_to(kiln, dir, runtime, base, (&image, &host), key)
}

/// A signed build of the `runtime` Function in `dir` to `image` in the registry at `host`.
pub(crate) fn build_to(
    kiln: &Kiln,
    dir: &Path,
    runtime: &str,
    base: &[&str],
    (image, host): (&str, &str),
    key: &str,
) -> String {
    let mut args = vec!["build", dir.to_str().unwrap(), "--runtime", runtime];
    args.extend(base);
    args.extend([
        "--image",
        image,
        "--insecure-registry",
        host,
        "--sign-key",
        key,
    ]);
    kiln.run(&args).reference()
}

#[test]
fn signatures_verify_with_their_key_and_fail_for_another_key_a_changed_payload_or_image() {
    let Setup {
        reg,
        host,
        kiln,
        work,
    } = Setup::new();
    let keys = work.path();
    let key = |name: &str| keys.join(name).to_str().unwrap().to_string();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let reference = build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key"));
    let digest = reference.split_once('@').unwrap().1.to_string();
    let verify = |image: &str, public: &str| {
        kiln.run(&[
            "verify",
            image,
            "--key",
            public,
            "--insecure-registry",
            &host,
        ])
    };
    // cryptography agrees, over the bytes in the registry.
    assert_eq!(
        check(&["verify", &host, "fns/hello", &digest, &key("a.pub")]),
        "1"
    );
    assert_eq!(
        check(&["verify", &host, "fns/hello", &digest, &key("b.pub")]),
        "0"
    );
    assert_eq!(verify(&reference, &key("a.pub")).reference(), reference);
    // By tag too: the tag is resolved to the digest that was signed.
    assert_eq!(
        verify(&reg.reference("fns/hello:1"), &key("a.pub")).reference(),
        reference
    );
    let err = verify(&reference, &key("b.pub")).failure(1).to_string();
    assert!(
        err.contains("no signature of") && err.contains("not this key's"),
        "{err}"
    );
    // The same build again adds nothing; another key's signature goes beside the first.
    assert_eq!(
        build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key")),
        reference
    );
    assert_eq!(
        check(&["verify", &host, "fns/hello", &digest, &key("a.pub")]),
        "1"
    );
    let run = kiln.run_cmd(
        kiln.command()
            .env(
                "B_KEY",
                std::fs::read_to_string(keys.join("b.key")).unwrap(),
            )
            .args([
                "build",
                dir.to_str().unwrap(),
                "--runtime",
                "nodejs22",
                "--base",
            ])
            .arg(tiny_base())
            .args([
                "--image",
                &reg.reference("fns/hello:1"),
                "--insecure-registry",
                &host,
            ])
            .args(["--sign-key", "env://B_KEY"]),
    );
    assert_eq!(run.reference(), reference);
    assert!(!run.stderr.contains("PRIVATE KEY"), "{}", run.stderr);
    for public in ["a.pub", "b.pub"] {
        assert_eq!(
            check(&["verify", &host, "fns/hello", &digest, &key(public)]),
            "1"
        );
        verify(&reference, &key(public)).reference();
    }
    // An edit and its revert: the reverted build pushes its image again (the tag held the
    // edit's), meets the signatures already there, and keeps both keys' without a second
    // one of its own. Both images verify.
    let handler = dir.join("handler.js");
    let original = std::fs::read_to_string(&handler).unwrap();
    std::fs::write(&handler, format!("{original}// an edit\n")).unwrap();
    let edited = build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key"));
    assert_ne!(edited, reference);
    verify(&edited, &key("a.pub")).reference();
    std::fs::write(&handler, &original).unwrap();
    assert_eq!(
        build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key")),
        reference
    );
    for public in ["a.pub", "b.pub"] {
        assert_eq!(
            check(&["verify", &host, "fns/hello", &digest, &key(public)]),
            "1",
            "{public}'s signatures after the revert"
        );
    }
    // A signature of another image, stored as this one's: valid, but not for this digest.
    let other_dir = copy_fixture("hello-node", &work.path().join("other"));
    std::fs::write(other_dir.join("extra.txt"), "another image").unwrap();
    let other = build(&kiln, &reg, &other_dir, "fns/hello:2", &key("a.key"));
    let other_digest = other.split_once('@').unwrap().1.to_string();
    check(&["graft", &host, "fns/hello", &digest, &other_digest]);
    let err = verify(&other, &key("a.pub")).failure(1).to_string();
    assert!(
        err.contains(&format!("a valid signature of another image ({digest})")),
        "{err}"
    );
    // A payload changed after signing.
    check(&["tamper", &host, "fns/hello", &digest]);
    assert_eq!(
        check(&["verify", &host, "fns/hello", &digest, &key("a.pub")]),
        "0"
    );
    let err = verify(&reference, &key("a.pub")).failure(1).to_string();
    assert!(err.contains("not this key's over its payload"), "{err}");
    // Unsigned images, bad keys and layout targets are named.
    let plain = copy_fixture("hello-node", &work.path().join("plain"));
    std::fs::write(plain.join("extra.txt"), "unsigned").unwrap();
    let unsigned = kiln
        .run(&[
            "build",
            plain.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            &tiny_base(),
            "--image",
            &reg.reference("fns/plain"),
            "--insecure-registry",
            &host,
        ])
        .reference();
    let err = verify(&unsigned, &key("a.pub")).failure(1).to_string();
    assert!(
        err.contains("has no signatures: nothing is tagged sha256-"),
        "{err}"
    );
    let err = verify(&unsigned, &key("a.key")).failure(2).to_string();
    assert!(err.contains("not a PEM public key"), "{err}");
    let out = work.path().join("layout");
    let err = kiln
        .run(&[
            "build",
            dir.to_str().unwrap(),
            "--runtime",
            "nodejs22",
            "--base",
            &tiny_base(),
            "--output",
            &format!("oci:{}", out.display()),
            "--sign-key",
            &key("a.key"),
        ])
        .failure(2)
        .to_string();
    assert!(
        err.contains("--sign-key stores the signature in the image's registry"),
        "{err}"
    );
}

#[test]
fn the_provenance_names_its_build_and_one_of_another_image_is_refused_then_replaced_by_a_rebuild() {
    let Setup {
        reg,
        host,
        kiln,
        work,
    } = Setup::new();
    let keys = work.path();
    let key = |name: &str| keys.join(name).to_str().unwrap().to_string();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let reference = build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key"));
    let digest = reference.split_once('@').unwrap().1.to_string();
    let verify = |image: &str, extra: &[&str]| {
        let mut args = vec!["verify", image, "--key"];
        let public = key("a.pub");
        args.push(&public);
        args.extend(["--insecure-registry", &host]);
        args.extend(extra);
        kiln.run(&args)
    };
    // The in-toto models and SLSA's Provenance message read it, signed over DSSE's encoding,
    // for this digest and the build key the image carries.
    let build_key = check(&["provenance", &host, "fns/hello", &digest, &key("a.pub")]);
    assert!(build_key.starts_with("sha256:"), "{build_key}");
    verify(&reference, &["--build-key", &build_key]).reference();
    let other_key = format!("sha256:{}", "0".repeat(64));
    let err = verify(&reference, &["--build-key", &other_key])
        .failure(1)
        .to_string();
    assert!(
        err.contains(&format!("a provenance of build key {build_key}")),
        "{err}"
    );
    // Another image's provenance, signed with the same key, stored as this one's.
    let other_dir = copy_fixture("hello-node", &work.path().join("other"));
    std::fs::write(other_dir.join("extra.txt"), "another image").unwrap();
    let other = build(&kiln, &reg, &other_dir, "fns/hello:2", &key("a.key"));
    let other_digest = other.split_once('@').unwrap().1.to_string();
    check(&["graft", &host, "fns/hello", &other_digest, &digest, "att"]);
    let err = verify(&reference, &["--build-key", &build_key])
        .failure(1)
        .to_string();
    assert!(err.contains("a provenance of another image"), "{err}");
    // The same build again finds its image, sees no provenance of its own among the
    // attestations and adds one: verified again, the stranger's left beside it.
    assert_eq!(
        build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key")),
        reference
    );
    verify(&reference, &["--build-key", &build_key]).reference();
    assert_eq!(
        check(&["provenance", &host, "fns/hello", &digest, &key("a.pub")]),
        build_key
    );
    // And once it has one, a further rebuild adds nothing.
    let layers = |d: &str| {
        let tag = format!("{}.att", d.replace(':', "-"));
        let port: u16 = host.rsplit_once(':').unwrap().1.parse().unwrap();
        let accept = [("Accept", "application/vnd.oci.image.manifest.v1+json")];
        let path = format!("/v2/fns/hello/manifests/{tag}");
        let (_, body) = common::http::request(port, "GET", &path, &accept, b"");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        doc["layers"].as_array().unwrap().len()
    };
    let grafted = layers(&other_digest);
    assert_eq!(
        layers(&digest),
        grafted + 2,
        "the stranger's provenance and SBOM, then this build's"
    );
    build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key"));
    assert_eq!(layers(&digest), grafted + 2);
    // On a Docker-typed base the image's manifest is Docker's; a signed rebuild that finds it
    // reads it for the SBOM all the same.
    let bases = common::images::push_base_images(&reg, "base/busybox");
    let signed_on = |base: &str| {
        let base = ["--base", base];
        build_on(
            &kiln,
            &reg,
            &dir,
            "nodejs22",
            &base,
            "fns/docker:1",
            &key("a.key"),
        )
    };
    let on_docker = signed_on(&bases.docker);
    assert_eq!(signed_on(&bases.docker), on_docker);
    verify(&on_docker, &[]).reference();
}

#[test]
fn the_sbom_lists_the_bases_packages_and_the_functions_npm_and_python_packages() {
    use common::kiln::base_images_into;
    let Setup {
        reg,
        host,
        kiln,
        work,
    } = Setup::new();
    let keys = work.path();
    let key = |name: &str| keys.join(name).to_str().unwrap().to_string();
    let sbom = |reference: &str| {
        let digest = reference.split_once('@').unwrap().1;
        let repo = reference
            .split_once('@')
            .unwrap()
            .0
            .split_once('/')
            .unwrap()
            .1;
        let out = check(&["sbom", &host, repo, digest, &key("a.pub")]);
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    for (runtime, fixture, wanted) in [
        (
            "nodejs22",
            "node-deps",
            &[
                ("pkg:npm/lodash@4.17.21", "MIT"),
                ("pkg:npm/dayjs@1.11.13", "MIT"),
            ][..],
        ),
        (
            "python313",
            "python-pinned",
            &[
                ("pkg:pypi/requests@2.32.3", "Apache-2.0"),
                ("pkg:pypi/pyyaml@6.0.2", "MIT"),
            ][..],
        ),
    ] {
        let layout = work.path().join(runtime);
        base_images_into(&kiln, runtime, &layout);
        let base = format!("oci:{}:{runtime}", layout.display());
        let builder = format!("oci:{}:{runtime}-builder", layout.display());
        let dir = copy_fixture(fixture, &work.path().join(fixture));
        let image = format!("fns/{fixture}:1");
        let flags = ["--base", &base, "--builder-image", &builder];
        let build = || build_on(&kiln, &reg, &dir, runtime, &flags, &image, &key("a.key"));
        let reference = build();
        let packages = sbom(&reference);
        let all = packages.as_object().unwrap();
        // The base's packages: Debian's, from the base's own SBOM layer.
        assert!(
            all.keys().any(|p| p.starts_with("pkg:deb/debian/libc6@")),
            "{runtime}: no libc6 in {:?}",
            all.keys().collect::<Vec<_>>()
        );
        for (purl, license) in wanted {
            let p = &packages[*purl];
            assert!(p.is_object(), "{runtime}: no {purl} in {:?}", all.keys());
            assert!(
                p["licenses"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|l| l.as_str().unwrap().contains(license)),
                "{purl}: {p}"
            );
        }
        if runtime == "nodejs22" {
            // npm's integrity, as the lock file holds it.
            let lock: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("package-lock.json")).unwrap())
                    .unwrap();
            let sri = lock["packages"]["node_modules/lodash"]["integrity"]
                .as_str()
                .unwrap();
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(sri.strip_prefix("sha512-").unwrap())
                .unwrap();
            assert_eq!(
                packages["pkg:npm/lodash@4.17.21"]["hashes"]["SHA-512"],
                hex::encode(bytes)
            );
            // Not a dev dependency: it was not installed.
            assert!(!all.keys().any(|p| p.contains("left-pad")));
        } else {
            // The SHA-256 of the wheel each distribution came from: one PyPI publishes for
            // that release (its simple index, as JSON).
            let published = common::run(
                Command::new("curl")
                    .args(["-sf", "--cacert"])
                    .arg(common::kiln::host_ca_bundle())
                    .args(["-H", "Accept: application/vnd.pypi.simple.v1+json"])
                    .arg("https://pypi.org/simple/pyyaml/"),
            );
            let published: serde_json::Value = serde_json::from_str(&published).unwrap();
            let sha = packages["pkg:pypi/pyyaml@6.0.2"]["hashes"]["SHA-256"]
                .as_str()
                .unwrap_or_else(|| panic!("no SHA-256: {}", packages["pkg:pypi/pyyaml@6.0.2"]));
            let file = published["files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["hashes"]["sha256"] == sha)
                .unwrap_or_else(|| panic!("{sha} is no PyYAML file"));
            let filename = file["filename"].as_str().unwrap();
            assert!(
                filename.starts_with("PyYAML-6.0.2-") && filename.contains("cp313-manylinux"),
                "{file}"
            );
        }
        // A source-only rebuild reads what it read before and lists the same packages.
        std::fs::write(dir.join("extra.txt"), "an edit").unwrap();
        let edited = build();
        assert_ne!(edited, reference);
        assert_eq!(sbom(&edited), packages);
    }
}
