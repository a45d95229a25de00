//! Image signatures stored the way cosign stores them, so `cosign verify --key` and kiln's own
//! `kiln verify` accept them (sigstore/cosign specs/SIGNATURE_SPEC.md):
//!
//! - the signed bytes are a *simple signing* payload naming the image's manifest digest;
//! - the signature is ECDSA P-256 over SHA-256, ASN.1 DER, base64 in the layer annotation
//!   `dev.cosignproject.cosign/signature`;
//! - the payload is a layer (`application/vnd.dev.cosign.simplesigning.v1+json`) of an OCI image
//!   manifest tagged `sha256-<hex>.sig` in the image's repository. Signatures of other keys
//!   already there are kept: a new one is added beside them.
//!
//! Keys are PEM: a private key as PKCS#8 (`PRIVATE KEY`, as `openssl genpkey -algorithm EC
//! -pkeyopt ec_paramgen_curve:P-256` writes it) or SEC1 (`EC PRIVATE KEY`); a public key as
//! SubjectPublicKeyInfo (`PUBLIC KEY`, as `cosign generate-key-pair` and `openssl pkey -pubout`
//! write it). A key is named by `sha256:` over its public key's DER, never shown itself.

mod attach;
mod keys;
mod verify;

pub use attach::{
    AttachError, Attached, Pending, Prepared, Signed, Statements, prepare, prepare_attestations,
    prepare_signature, sign,
};
pub use keys::{KeyError, SignKey, VerifyKey};
pub use verify::{Verified, VerifyError, Wanted, verify, verify_image};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use crate::oci::{Descriptor, Digest, Manifest, MediaType};
use crate::registry::{self, Client, Reference};

/// The media type of a simple signing payload.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign image signature.
const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The largest payload `kiln verify` reads (a payload is a few hundred bytes).
const MAX_PAYLOAD: u64 = 64 * 1024;

/// The simple signing payload for the manifest `digest` in `repository` (`host/path`).
pub fn payload(repository: &str, digest: &Digest) -> Vec<u8> {
    let doc = json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest.to_string()},
            "type": SIGNATURE_TYPE,
        },
        "optional": null,
    });
    serde_json::to_vec(&doc).expect("a JSON value serialises")
}

/// The tag of the signatures of the manifest `digest`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}
/// The tag of the attestations of the manifest `digest`.
pub fn attestation_tag(digest: &Digest) -> String {
    format!("sha256-{}.att", digest.hex())
}

/// The media type of a DSSE envelope layer.
pub const DSSE_ENVELOPE: &str = "application/vnd.dsse.envelope.v1+json";
/// The largest envelope `kiln verify` reads.
const MAX_ENVELOPE: u64 = 1 << 20;

/// The signature manifest at `sig_ref`, if there is one.
async fn existing(
    client: &Client,
    sig_ref: &Reference,
) -> Result<Option<Manifest>, registry::Error> {
    match client
        .get_manifest(sig_ref, &[MediaType::OciManifest])
        .await
    {
        Ok(doc) => Ok(serde_json::from_slice(&doc.bytes).ok()),
        Err(e) if e.status() == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The decoded signature a layer carries.
fn signature_of(layer: &Descriptor) -> Option<Vec<u8>> {
    let text = layer.annotations.as_ref()?.get(SIGNATURE_ANNOTATION)?;
    STANDARD.decode(text).ok()
}

/// The manifest digest a cosign payload signs.
fn signed_digest(payload: &[u8]) -> Result<Digest, String> {
    let doc: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("a payload that is not JSON: {e}"))?;
    let critical = &doc["critical"];
    if critical["type"] != SIGNATURE_TYPE {
        return Err(format!("a payload of type {}", critical["type"]));
    }
    critical["image"]["docker-manifest-digest"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| "a payload without a manifest digest".to_string())
}
