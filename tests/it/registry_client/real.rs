//! The registry client against a real CNCF distribution registry over plain HTTP: blobs are
//! uploaded, skipped and mounted, manifests round-trip, large blobs go up in chunks, and
//! concurrent pushes share one client.

use crate::common;

use super::{blob, config, pseudo_random, push_image, reference, test_image, uploaded, urlenc};
use common::registry::{Registry, RegistryKind};
use kiln::oci::{Descriptor, Digest, MediaType};
use kiln::registry::{BlobOutcome, BlobSource, Client, UploadPolicy};

#[tokio::test(flavor = "multi_thread")]
async fn blobs_are_uploaded_skipped_and_mounted_on_a_real_registry() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let app = reference(&format!("{host}/team/app"));
    let other = reference(&format!("{host}/team/other"));

    // First small blob: the single-request POST is tried, distribution 2.8 answers 202 and
    // stores nothing, and the upload continues with PUT in that session.
    let (d1, s1) = blob(b"first small blob");
    let sent = uploaded(client.push_blob(&app, &d1, s1.clone(), None).await.unwrap());
    assert_eq!(
        sent,
        2 * d1.size,
        "body sent with the POST (ignored) and with the PUT"
    );
    // Second small blob: the registry is known to ignore it, so POST (no body) + PUT.
    let (d2, s2) = blob(b"second small blob");
    assert_eq!(
        uploaded(client.push_blob(&app, &d2, s2, None).await.unwrap()),
        d2.size
    );
    let log = reg.settled_access_log().join("\n");
    assert!(
        log.contains(&format!(
            "POST /v2/team/app/blobs/uploads/?digest={} 202",
            urlenc(&d1.digest)
        )),
        "{log}"
    );
    assert_eq!(
        log.matches("?digest=").count(),
        1,
        "only the first blob tries the single POST:\n{log}"
    );

    // Existing blob: nothing sent.
    assert_eq!(
        client.push_blob(&app, &d1, s1.clone(), None).await.unwrap(),
        BlobOutcome::Existed
    );

    // A 3 MiB file, streamed with Content-Length.
    let dir = tempfile::tempdir().unwrap();
    let big = pseudo_random(3 << 20, 9);
    let path = dir.path().join("big");
    std::fs::write(&path, &big).unwrap();
    let big_d = Descriptor::new(MediaType::OciLayerGzip, Digest::of(&big), big.len() as u64);
    let sent = uploaded(
        client
            .push_blob(&app, &big_d, BlobSource::File(path.clone()), None)
            .await
            .unwrap(),
    );
    assert_eq!(sent, big_d.size);

    // Cross-repository mount.
    let outcome = client
        .push_blob(
            &other,
            &big_d,
            BlobSource::File(path.clone()),
            Some("team/app"),
        )
        .await
        .unwrap();
    assert_eq!(outcome, BlobOutcome::Mounted);
    assert_eq!(
        client.blob_exists(&other, &big_d.digest).await.unwrap(),
        Some(big_d.size)
    );
    // A mount the registry declines continues in the session it opened.
    let (d3, s3) = blob(b"not in the source repo");
    assert_eq!(
        uploaded(
            client
                .push_blob(&other, &d3, s3, Some("team/app"))
                .await
                .unwrap()
        ),
        d3.size
    );
    assert!(
        !client
            .mount_blob(&app, &d3.digest, "team/nothing")
            .await
            .unwrap()
    );
    // Neither declined mount left an upload session open (the first was used, the second
    // cancelled; it used to stay until the registry's purge, a week later).
    assert_eq!(
        reg.open_uploads("team/other"),
        Vec::<String>::new(),
        "{:#?}",
        reg.settled_access_log()
    );
    assert_eq!(
        reg.open_uploads("team/app"),
        Vec::<String>::new(),
        "{:#?}",
        reg.settled_access_log()
    );
    assert!(
        client
            .mount_blob(&app, &d3.digest, "team/other")
            .await
            .unwrap()
    );

    // Read back, verified while streaming.
    let back = dir.path().join("back");
    client
        .get_blob_to_file(&other, &big_d, &back)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&back).unwrap(), big);
    assert_eq!(
        client.get_blob(&app, &d1).await.unwrap(),
        b"first small blob"
    );
    let stored = reg.stored_blobs();
    for d in [&d1, &d2, &d3, &big_d] {
        assert!(
            stored.contains(&d.digest.to_string()),
            "{} not stored",
            d.digest
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn manifests_round_trip_through_a_real_registry() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let image = test_image(1);
    let tagged = reference(&format!("{host}/team/app:v1"));

    assert_eq!(client.head_manifest(&tagged).await.unwrap(), None);
    let digest = push_image(&client, &tagged, &image).await;
    assert_eq!(digest, image.manifest.digest);

    let got = client.get_manifest(&tagged, &[]).await.unwrap();
    assert_eq!(
        got, image.manifest,
        "same media type, digest and exact bytes"
    );
    let head = client.head_manifest(&tagged).await.unwrap().unwrap();
    assert_eq!(head, image.manifest.descriptor());
    let by_digest = client
        .get_manifest(&tagged.with_digest(digest.clone()), &[])
        .await
        .unwrap();
    assert_eq!(by_digest.bytes, image.manifest.bytes);
    assert_eq!(
        reg.skopeo_inspect_raw(&tagged.to_string()),
        image.manifest.bytes
    );
    assert_eq!(
        client.get_blob(&tagged, &image.config.0).await.unwrap(),
        match &image.config.1 {
            BlobSource::Bytes(b) => b.to_vec(),
            BlobSource::File(_) => unreachable!(),
        }
    );

    // Push by digest only.
    let image2 = test_image(2);
    let untagged = reference(&format!("{host}/team/app"));
    for (d, s) in [&image2.config, &image2.layer] {
        client
            .push_blob(&untagged, d, s.clone(), None)
            .await
            .unwrap();
    }
    let d2 = client
        .put_manifest(&untagged, &image2.manifest)
        .await
        .unwrap();
    assert!(
        client
            .head_manifest(&untagged.with_digest(d2))
            .await
            .unwrap()
            .is_some()
    );

    // A manifest whose blobs are missing is refused with the registry's code.
    let image3 = test_image(3);
    let err = client
        .put_manifest(
            &reference(&format!("{host}/team/app:broken")),
            &image3.manifest,
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.codes(),
        ["MANIFEST_BLOB_UNKNOWN", "MANIFEST_BLOB_UNKNOWN"],
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn large_blobs_go_up_in_chunks() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.upload = UploadPolicy {
        monolithic_max: 0,
        chunked_threshold: 1 << 20,
        chunk_size: 400 << 10,
    };
    let client = Client::new(cfg).unwrap();
    let repo = reference(&format!("{host}/team/chunked"));
    let data = pseudo_random((1 << 20) + 12_345, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    std::fs::write(&path, &data).unwrap();
    let d = Descriptor::new(
        MediaType::OciLayerGzip,
        Digest::of(&data),
        data.len() as u64,
    );
    let sent = uploaded(
        client
            .push_blob(&repo, &d, BlobSource::File(path), None)
            .await
            .unwrap(),
    );
    assert_eq!(sent, d.size);
    let patches = reg
        .settled_access_log()
        .iter()
        .filter(|l| l.starts_with("PATCH "))
        .count();
    assert_eq!(patches, 3, "{:?}", reg.access_log());
    let back = dir.path().join("back");
    client.get_blob_to_file(&repo, &d, &back).await.unwrap();
    assert_eq!(std::fs::read(back).unwrap(), data);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_pushes_share_one_client() {
    use futures_util::{StreamExt, TryStreamExt, stream};
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let repo = reference(&format!("{host}/team/parallel"));
    let blobs: Vec<_> = (0..12)
        .map(|i| blob(&pseudo_random(20_000 + i, i as u64)))
        .collect();
    let outcomes: Vec<BlobOutcome> = stream::iter(
        blobs
            .iter()
            .map(|(d, s)| client.push_blob(&repo, d, s.clone(), None)),
    )
    .buffer_unordered(4)
    .try_collect()
    .await
    .unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, BlobOutcome::Uploaded { .. }))
    );
    for (d, _) in &blobs {
        assert_eq!(
            client.blob_exists(&repo, &d.digest).await.unwrap(),
            Some(d.size)
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_blob_pushed_twice_at_once_goes_up_once() {
    let reg = Registry::start(RegistryKind::Plain);
    let host = reg.host();
    let client = Client::new(config(&[&host])).unwrap();
    let repo = reference(&format!("{host}/team/twice"));
    // As the platforms of one build push their shared source layer.
    let (d, s) = blob(&pseudo_random(50_000, 7));
    let (first, second) = tokio::join!(
        client.push_new_blob(&repo, &d, s.clone()),
        client.push_new_blob(&repo, &d, s.clone()),
    );
    let mut outcomes = [first.unwrap(), second.unwrap()];
    outcomes.sort_by_key(|o| matches!(o, BlobOutcome::Existed));
    assert!(
        matches!(
            outcomes,
            [BlobOutcome::Uploaded { .. }, BlobOutcome::Existed]
        ),
        "{outcomes:?}"
    );
    let puts = reg
        .settled_access_log()
        .iter()
        .filter(|l| l.contains("PUT /v2/team/twice/blobs/uploads/"))
        .count();
    assert_eq!(puts, 1, "{:?}", reg.access_log());
    // Once done, a later push is the registry's business again.
    let again = client.push_new_blob(&repo, &d, s).await.unwrap();
    assert!(matches!(again, BlobOutcome::Uploaded { .. }), "{again:?}");
    assert_eq!(
        client.blob_exists(&repo, &d.digest).await.unwrap(),
        Some(d.size)
    );
}
