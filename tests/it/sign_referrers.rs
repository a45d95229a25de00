//! Signatures and attestations as OCI 1.1 referrers of the image, where the registry serves
//! the referrers API (ferro-oci-server, in the test process): written beside cosign's tags,
//! read back by check.py through that API alone, and verified by `kiln verify` without the
//! tags. Debian's registry (2.8) does not serve it, and a busy answer is asked again.

use crate::common;

use std::path::Path;
use std::process::Command;

use super::sign::{build, build_to, check};
use common::faults::{FaultProxy, Faults};
use common::kiln::{Kiln, copy_fixture, tiny_base};
use common::referrers_registry::ReferrersRegistry;
use common::registry::{Registry, RegistryKind};

/// The hello-node fixture in `dir` built on the tiny base for `(image, host)`, signed by `key`.
fn hello_to(kiln: &Kiln, dir: &Path, to: (&str, &str), key: &str) -> String {
    build_to(kiln, dir, "nodejs22", &["--base", &tiny_base()], to, key)
}

/// `curl -s` of `/v2/REPO/manifests/PATH` on `host`, asking for an OCI manifest, with `args`.
fn curl(host: &str, repo: &str, args: &[&str], path: &str) -> Vec<u8> {
    let url = format!("http://{host}/v2/{repo}/manifests/{path}");
    let accept = "Accept: application/vnd.oci.image.manifest.v1+json";
    common::run_bytes(
        Command::new("curl")
            .args(["-s", "-H", accept])
            .args(args)
            .arg(url),
    )
}

/// Deletes the manifest tagged `tag` in `repo` (and so the tag), and checks it is gone.
fn untag(host: &str, repo: &str, tag: &str) {
    let manifest = common::sha256_digest(&curl(host, repo, &["-f"], tag));
    let status = ["-o", "/dev/null", "-w", "%{http_code}"];
    let deleted = curl(
        host,
        repo,
        &[&["-f", "-X", "DELETE"][..], &status].concat(),
        &manifest,
    );
    assert_eq!(String::from_utf8_lossy(&deleted), "202");
    let gone = curl(host, repo, &status, tag);
    assert_eq!(String::from_utf8_lossy(&gone), "404", "{tag}");
}

/// Deletes the cosign tags (`.sig`, `.att`) of the image `digest` in `repo`.
fn untag_cosign(host: &str, repo: &str, digest: &str) {
    for suffix in ["sig", "att"] {
        untag(
            host,
            repo,
            &format!("{}.{suffix}", digest.replace(':', "-")),
        );
    }
}

/// Where the registry serves the OCI 1.1 referrers API (ferro-oci-server), the signature and
/// the attestations are referrers of the image too, as cosign's OCI 1.1 mode stores them, and
/// check.py finds and verifies them through that API alone. Debian's registry (2.8) does not
/// serve it: kiln asks once, keeps the answer, and puts no referrer there.
#[test]
fn signatures_and_attestations_are_referrers_where_the_registry_serves_the_api() {
    let work = tempfile::tempdir().unwrap();
    check(&["keys", work.path().to_str().unwrap(), "a", "b", "c"]);
    let key = |name: &str| work.path().join(name).to_str().unwrap().to_string();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let kiln = Kiln::new();

    let ferro = ReferrersRegistry::start();
    let host = ferro.host();
    let image = ferro.reference("fns/hello:1");
    let reference = hello_to(&kiln, &dir, (&image, &host), &key("a.key"));
    let digest = reference.split_once('@').unwrap().1;
    let referrers = |public: &str| check(&["referrers", &host, "fns/hello", digest, public]);
    assert_eq!(
        referrers(&key("a.pub")),
        "1 https://cyclonedx.org/bom https://slsa.dev/provenance/v1"
    );
    assert_eq!(referrers(&key("b.pub")), "0");
    // The same build signed by another key (the same image): its signature is added to the
    // tag, and a new referrer holds both. Both keys sign the same payload blob; what differs
    // is the signature in each layer's annotation.
    let again = hello_to(&kiln, &dir, (&image, &host), &key("b.key"));
    assert_eq!(again, reference);
    // The tags as well, which cosign reads by default, each still the manifest cosign writes
    // there (an image's config, no subject): a referrer goes up by digest, beside it.
    assert_eq!(
        check(&["verify", &host, "fns/hello", digest, &key("a.pub")]),
        "1"
    );
    let build_key = check(&["provenance", &host, "fns/hello", digest, &key("a.pub")]);
    for suffix in ["sig", "att"] {
        let tag = format!("{}.{suffix}", digest.replace(':', "-"));
        let raw = curl(&host, "fns/hello", &["-f"], &tag);
        let manifest: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(
            manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json",
            "{manifest:#}"
        );
        assert!(manifest.get("subject").is_none(), "{manifest:#}");
    }
    let verify = |public: &str, extra: &[&str]| {
        let mut args = vec!["verify", &reference, "--key", public];
        args.extend(["--insecure-registry", &host]);
        args.extend(extra);
        kiln.run(&args)
    };
    assert_eq!(verify(&key("a.pub"), &[]).reference(), reference);
    // Without the tags, as cosign's OCI 1.1 mode leaves an image: kiln verify finds the
    // signature and the provenance through the referrers API.
    untag_cosign(&host, "fns/hello", digest);
    let by_referrers = verify(&key("a.pub"), &["--build-key", &build_key]);
    assert_eq!(by_referrers.reference(), reference);
    assert_eq!(verify(&key("b.pub"), &[]).reference(), reference);
    let err = verify(&key("c.pub"), &[]).failure(1).to_string();
    assert!(err.contains("no signature of"), "{err}");
    let err = verify(&key("a.pub"), &["--build-key", "sha256:0"])
        .failure(1)
        .to_string();
    assert!(err.contains("does not hold"), "{err}");

    let reg = Registry::start(RegistryKind::Plain);
    build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key"));
    std::fs::write(
        dir.join("handler.js"),
        "module.exports = { main: () => 2 };",
    )
    .unwrap();
    build(&kiln, &reg, &dir, "fns/hello:2", &key("a.key"));
    let log = reg.settled_access_log();
    let asked: Vec<&String> = log.iter().filter(|l| l.contains("/referrers/")).collect();
    assert_eq!(asked.len(), 1, "{log:#?}");
    assert!(asked[0].ends_with(" 404"), "{asked:?}");
    // Every manifest put there is tagged: the images and their .sig and .att tags.
    let puts: Vec<&String> = log.iter().filter(|l| l.starts_with("PUT ")).collect();
    let manifests: Vec<&&String> = puts.iter().filter(|l| l.contains("/manifests/")).collect();
    assert_eq!(manifests.len(), 6, "{manifests:#?}");
    assert!(
        manifests.iter().all(|l| !l.contains("/manifests/sha256:")),
        "{manifests:#?}"
    );
}

/// A registry busy when asked about the referrers API (503) has not answered the question:
/// the answer is not kept, the next push asks again, and its referrers go up. (A busy answer
/// kept as "no" left an image signed through the referrers API unsigned there for a day.)
#[test]
fn a_busy_answer_about_the_referrers_api_is_asked_again() {
    let work = tempfile::tempdir().unwrap();
    check(&["keys", work.path().to_str().unwrap()]);
    let key = |name: &str| work.path().join(name).to_str().unwrap().to_string();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let kiln = Kiln::new();
    let ferro = ReferrersRegistry::start();
    let mut busy = true;
    let rule = move |_: &str, path: &str, _: u64| {
        (path.contains("/referrers/") && std::mem::take(&mut busy)).then_some(503)
    };
    let faults = Faults {
        rule: Some(Box::new(rule)),
        ..Faults::default()
    };
    let proxy = FaultProxy::start(&ferro.host(), faults);
    let host = proxy.host();
    let image = format!("{host}/fns/hello:1");
    hello_to(&kiln, &dir, (&image, &host), &key("a.key"));
    std::fs::write(
        dir.join("handler.js"),
        "module.exports = { main: () => 2 };",
    )
    .unwrap();
    let second = hello_to(&kiln, &dir, (&image, &host), &key("a.key"));
    let asked: Vec<String> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.request.contains("/referrers/"))
        .map(|s| s.outcome)
        .collect();
    assert_eq!(asked, ["answered 503", "forwarded 200"]);
    let digest = second.split_once('@').unwrap().1;
    assert_eq!(
        check(&["referrers", &host, "fns/hello", digest, &key("a.pub")]),
        "1 https://cyclonedx.org/bom https://slsa.dev/provenance/v1"
    );
}

/// A registry may page a referrers listing, naming each next page in a `Link` header: kiln
/// verify reads it to the end. Three keys sign the image one after another, each signature
/// manifest holding one more (the registry lists the largest last, one per page): the third
/// key's signature is only on the listing's last page.
#[test]
fn kiln_verify_reads_a_referrers_listing_to_its_last_page() {
    let work = tempfile::tempdir().unwrap();
    check(&["keys", work.path().to_str().unwrap(), "a", "b", "c", "d"]);
    let key = |name: &str| work.path().join(name).to_str().unwrap().to_string();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let kiln = Kiln::new();
    let paged = ReferrersRegistry::start_paged(1);
    let host = paged.host();
    let image = paged.reference("fns/hello:1");
    let mut reference = String::new();
    for signer in ["a.key", "b.key", "c.key"] {
        reference = hello_to(&kiln, &dir, (&image, &host), &key(signer));
    }
    let digest = reference.split_once('@').unwrap().1;
    untag_cosign(&host, "fns/hello", digest);
    let verify = |public: &str| {
        let args = ["verify", &reference, "--key", public];
        kiln.run(&[&args[..], &["--insecure-registry", &host]].concat())
    };
    assert_eq!(paged.later_pages(), 0);
    assert_eq!(verify(&key("c.pub")).reference(), reference);
    assert!(paged.later_pages() >= 2, "{}", paged.later_pages());
    assert_eq!(verify(&key("a.pub")).reference(), reference);
    let err = verify(&key("d.pub")).failure(1).to_string();
    assert!(err.contains("no signature of"), "{err}");
}

/// A registry without the referrers API (Debian's, 2.8) keeps an image's referrers in an
/// index tagged `sha256-<hex>` (the OCI 1.1 referrers tag schema, which cosign's OCI 1.1 mode
/// and other OCI 1.1 clients write there): kiln verify reads it when the image has no `.sig`
/// tag. Here the signature referrer and the tag are put up by hand, as such a client would.
#[test]
fn kiln_verify_reads_the_referrers_tag_where_the_registry_has_no_api() {
    let work = tempfile::tempdir().unwrap();
    check(&["keys", work.path().to_str().unwrap()]);
    let key = |name: &str| work.path().join(name).to_str().unwrap().to_string();
    let dir = copy_fixture("hello-node", &work.path().join("hello"));
    let kiln = Kiln::new();
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let reference = build(&kiln, &reg, &dir, "fns/hello:1", &key("a.key"));
    let digest = reference.split_once('@').unwrap().1;
    let size = curl(&host, "fns/hello", &["-f"], digest).len();
    let sig_tag = format!("{}.sig", digest.replace(':', "-"));
    let mut referrer: serde_json::Value =
        serde_json::from_slice(&curl(&host, "fns/hello", &["-f"], &sig_tag)).unwrap();
    let artifact = "application/vnd.dev.cosign.artifact.sig.v1+json";
    referrer["artifactType"] = artifact.into();
    referrer["subject"] = serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest,
        "size": size,
    });
    let put = |path: &str, media_type: &str, body: &[u8]| {
        common::registry::put_manifest(&host, "fns/hello", path, media_type, body);
    };
    let manifest_type = "application/vnd.oci.image.manifest.v1+json";
    let referrer = serde_json::to_vec(&referrer).unwrap();
    let referrer_digest = common::sha256_digest(&referrer);
    put(&referrer_digest, manifest_type, &referrer);
    untag(&host, "fns/hello", &sig_tag);
    let verify = |public: &str| {
        let args = ["verify", &reference, "--key", public];
        kiln.run(&[&args[..], &["--insecure-registry", &host]].concat())
    };
    let err = verify(&key("a.pub")).failure(1).to_string();
    assert!(err.contains("has no signatures"), "{err}");
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": manifest_type,
            "digest": referrer_digest,
            "size": referrer.len(),
            "artifactType": artifact,
        }],
    });
    let index_type = "application/vnd.oci.image.index.v1+json";
    let schema_tag = digest.replace(':', "-");
    put(
        &schema_tag,
        index_type,
        &serde_json::to_vec(&index).unwrap(),
    );
    assert_eq!(verify(&key("a.pub")).reference(), reference);
    let err = verify(&key("b.pub")).failure(1).to_string();
    assert!(err.contains("no signature of"), "{err}");
}
