//! The registry client against scripted fault-injecting servers (axum on 127.0.0.1:0) and
//! against real CNCF distribution registries (plain HTTP, Basic auth over TLS with a test CA,
//! and Bearer token auth) started by the shared harness.
//!
//! One module per area; the client configuration, blobs and the minimal test image they share
//! are here.

mod auth;
mod logs;
mod real;
mod scripted;

use std::time::Duration;

use bytes::Bytes;
use kiln::oci::{Descriptor, Digest, Document, MediaType};
use kiln::registry::{BlobOutcome, BlobSource, Client, ClientConfig, Reference, RetryPolicy};

/// Three retries, milliseconds apart: the retry tests stay fast.
fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_millis(5),
    }
}

/// A client configuration with [`fast_retry`], trusting plain HTTP to `insecure` hosts.
fn config(insecure: &[&str]) -> ClientConfig {
    ClientConfig {
        insecure_hosts: insecure.iter().map(|h| h.to_string()).collect(),
        retry: fast_retry(),
        request_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    }
}

/// A parsed reference (panics on a bad one).
fn reference(s: &str) -> Reference {
    s.parse().unwrap()
}

/// A gzip-layer descriptor of `bytes` and the bytes to push.
fn blob(bytes: &[u8]) -> (Descriptor, BlobSource) {
    let d = Descriptor::new(
        MediaType::OciLayerGzip,
        Digest::of(bytes),
        bytes.len() as u64,
    );
    (d, BlobSource::Bytes(Bytes::copy_from_slice(bytes)))
}

/// Deterministic, incompressible-looking bytes.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A minimal image: config blob, one layer, and its manifest.
struct TestImage {
    config: (Descriptor, BlobSource),
    layer: (Descriptor, BlobSource),
    manifest: Document,
}

/// A [`TestImage`] whose layer is 50,000 pseudo-random bytes from `seed`.
fn test_image(seed: u64) -> TestImage {
    let config_bytes = format!(
        r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        Digest::of(&seed.to_be_bytes())
    );
    let (mut cd, cs) = blob(config_bytes.as_bytes());
    cd.media_type = MediaType::OciConfig;
    let layer = blob(&pseudo_random(50_000, seed));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MediaType::OciManifest.as_str(),
        "config": cd,
        "layers": [layer.0],
    });
    let manifest = Document::new(
        MediaType::OciManifest,
        serde_json::to_vec(&manifest).unwrap(),
    );
    TestImage {
        config: (cd, cs),
        layer,
        manifest,
    }
}

/// Pushes the image's blobs, then its manifest, to `target`; the manifest digest.
async fn push_image(client: &Client, target: &Reference, image: &TestImage) -> Digest {
    for (d, s) in [&image.config, &image.layer] {
        client.push_blob(target, d, s.clone(), None).await.unwrap();
    }
    client.put_manifest(target, &image.manifest).await.unwrap()
}

/// The bytes sent by a blob push that uploaded (panics on any other outcome).
fn uploaded(outcome: BlobOutcome) -> u64 {
    match outcome {
        BlobOutcome::Uploaded { bytes_sent } => bytes_sent,
        other => panic!("expected an upload, got {other:?}"),
    }
}

/// A digest as it appears in a URL query (`sha256%3A…`).
fn urlenc(d: &Digest) -> String {
    d.to_string().replace(':', "%3A")
}
