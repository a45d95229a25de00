//! `kiln rebase --sign-key` signs only an image whose own build is proven by a key: its
//! signature and provenance must name it and the build key it records. A rebase keeps the
//! image's dependency layer as it is, and its new provenance says the image was built as that
//! key says; an image edited in the registry must not come out of it signed.

use std::path::Path;
use std::process::Command;

use crate::common;
use crate::rebase::{Setup, digest_of, manifest_digest};
use crate::sign::check;
use common::base_change::node_lock;
use common::images::{read_blob, tagged_digest, write_blob};
use common::registry::writes;

/// `fns/NAME:live` as an attacker who can push to the repository would edit it: the
/// dependency layer swapped for another blob of the repository (here the source layer), the
/// config's diff_id with it, the history (which names the dependency key) kept. Returns the
/// edited image's digest.
fn swap_dependency_layer(s: &Setup, name: &str) -> String {
    let layout = s.work.path().join(format!("{name}-edited"));
    let at = format!("oci:{}:edited", layout.display());
    let live = format!("docker://{}", s.reg.reference(&format!("fns/{name}:live")));
    skopeo(&["copy", "--src-tls-verify=false", &live, &at]);
    let digest = tagged_digest(&layout, "edited");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&read_blob(&layout, &digest)).unwrap();
    let config_digest = manifest["config"]["digest"].as_str().unwrap().to_string();
    let mut config: serde_json::Value =
        serde_json::from_slice(&read_blob(&layout, &config_digest)).unwrap();
    let layers = manifest["layers"].as_array_mut().unwrap();
    let n = layers.len();
    layers[n - 2] = layers[n - 1].clone();
    let diff_ids = config["rootfs"]["diff_ids"].as_array_mut().unwrap();
    diff_ids[n - 2] = diff_ids[n - 1].clone();
    let (config_digest, size) = write_blob(&layout, &serde_json::to_vec(&config).unwrap());
    manifest["config"]["digest"] = config_digest.into();
    manifest["config"]["size"] = size.into();
    let (edited, size) = write_blob(&layout, &serde_json::to_vec(&manifest).unwrap());
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["manifests"][0]["digest"] = edited.clone().into();
    index["manifests"][0]["size"] = size.into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    skopeo(&[
        "copy",
        "--preserve-digests",
        "--dest-tls-verify=false",
        &at,
        &live,
    ]);
    assert_eq!(s.live(name), edited);
    edited
}

fn skopeo(args: &[&str]) {
    common::run(Command::new("skopeo").args(args));
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_signed_rebase_signs_only_an_image_whose_build_is_proven() {
    let s = Setup::new();
    let old = s.base("nodejs22", "1", None);
    let new = s.base("nodejs22", "2", Some(&node_lock(s.work.path(), "22.23.5")));
    let keys = s.keys();
    let (a_key, b_key, a_pub, b_pub) = (
        keys.join("a.key"),
        keys.join("b.key"),
        keys.join("a.pub"),
        keys.join("b.pub"),
    );
    let sign_a = ["--sign-key", path(&a_key)];
    let name = "node-lockfile";

    // Built without a signature: nothing proves what the image is. Refused, the tag stays,
    // nothing is signed.
    let built = s.build(name, "nodejs22", &old, "live", &[]);
    let (run, _) = s.rebase(name, &new.0, &sign_a);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("has no signatures"), "{}", run.stderr);
    assert!(run.stderr.contains("--input-key"), "{}", run.stderr);
    assert_eq!(s.live(name), digest_of(&built));

    // Signed by another key (CI's, say): refused with --sign-key's own key, rebased when
    // --input-key names the key that signed the build. The rebase is signed by --sign-key.
    let built = s.build(
        name,
        "nodejs22",
        &old,
        "live",
        &["--sign-key", path(&b_key)],
    );
    let (run, _) = s.rebase(name, &new.0, &sign_a);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("verifies with key"), "{}", run.stderr);
    assert_eq!(s.live(name), digest_of(&built));
    let trusted = [&sign_a[..], &["--input-key", path(&b_pub)]].concat();
    let (run, report) = s.rebase(name, &new.0, &trusted);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let verify =
        |image: &str, public: &Path| s.kiln(&["verify", image, "--key", path(public)]).code;
    assert_eq!(verify(run.stdout.trim(), &a_pub), 0);
    let image_key = report["imageKey"].as_str().unwrap();
    let on = [
        "fns/node-lockfile",
        digest_of(run.stdout.trim()),
        path(&a_pub),
    ];
    let host = s.reg.host();
    assert_eq!(
        check(&[&["provenance", &host][..], &on].concat()),
        image_key
    );

    // The attack: a build signed by the key, then edited in the registry (its dependency
    // layer swapped, which the rebase keeps as it is). Every check of a rebase's safety
    // passes, as the dry run says; only the proof stops it from being signed.
    let built = s.build(name, "nodejs22", &old, "live", &sign_a);
    assert_eq!(verify(&built, &a_pub), 0);
    let edited = swap_dependency_layer(&s, name);
    let (run, _) = s.rebase(name, &new.0, &["--dry-run"]);
    assert!(run.stdout.starts_with("rebase "), "{}", run.stdout);
    let before = s.reg.settled_access_log().len();
    let (run, _) = s.rebase(name, &new.0, &sign_a);
    assert_eq!(run.code, 1, "{}", run.stderr);
    // Refused before anything is written: no blob, no manifest, no signature.
    let log = s.reg.access_log_since(before);
    assert_eq!(writes(&log), Vec::<&String>::new(), "{log:#?}");
    assert!(
        run.stderr.contains(&format!("fns/node-lockfile@{edited}")),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("has no signatures"), "{}", run.stderr);
    assert_eq!(manifest_digest(&s.reg, "fns/node-lockfile", "live"), edited);
    // The attacker copies the real build's signature to the edited image's tag: it signs
    // the real build's digest, not this one. A dry run says so too (it only reads).
    let sig_tag = |digest: &str| format!("{}.sig", digest.replace(':', "-"));
    let signature = s.reg.skopeo_inspect_raw(
        &s.reg
            .reference(&format!("fns/{name}:{}", sig_tag(digest_of(&built)))),
    );
    let manifest_type = "application/vnd.oci.image.manifest.v1+json";
    put_manifest(
        &s,
        &format!("fns/{name}"),
        &sig_tag(&edited),
        manifest_type,
        &signature,
    );
    for dry in [true, false] {
        let before = s.reg.settled_access_log().len();
        let flags = [&sign_a[..], if dry { &["--dry-run"][..] } else { &[][..] }].concat();
        let (run, report) = s.rebase(name, &new.0, &flags);
        assert_eq!(run.code, 1, "{}", run.stderr);
        assert!(run.stderr.contains("verifies with key"), "{}", run.stderr);
        assert_eq!(report["decision"], "unproven", "{report:#}");
        assert_eq!(
            writes(&s.reg.access_log_since(before)),
            Vec::<&String>::new()
        );
    }
    assert_eq!(s.live(name), edited);
}

/// `PUT /v2/REPO/manifests/REFERENCE` of `bytes` as `media_type`, as any client may.
fn put_manifest(s: &Setup, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) {
    common::registry::put_manifest(&s.reg.host(), repo, reference, media_type, bytes);
}
