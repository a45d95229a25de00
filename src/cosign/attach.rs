//! Storing a signature and an attestation beside an image, as cosign does.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde_json::json;

use super::verify::signed_statements;
use super::{
    DSSE_ENVELOPE, SIGNATURE_ANNOTATION, SIMPLE_SIGNING, SignKey, attestation_tag, existing,
    payload, signature_of, signature_tag,
};
use crate::oci::{Descriptor, Digest, Document, Manifest, MediaType};
use crate::registry::{self, BlobSource, Client, Reference};

/// What signing did.
#[derive(Debug, PartialEq, Eq)]
pub enum Signed {
    /// A signature by this key was pushed, to this reference.
    Pushed(String),
    /// The image already carried a valid signature by this key.
    Present(String),
}

/// What [`Prepared::push`] attached to an image.
#[derive(Debug)]
pub struct Attached {
    /// The signature.
    pub signature: Signed,
    /// Where the provenance went, when it was added (an image found unchanged keeps its own).
    pub provenance: Option<String>,
}

/// An image's signature and provenance, made ready while the image itself is pushed: their
/// tags read, their layers and configs uploaded, so that once the image's manifest is up
/// only their two manifests remain ([`Prepared::push`]). Nothing is tagged before that.
#[derive(Debug)]
pub struct Prepared {
    signature: Pending,
    provenance: Pending,
}

/// A signature or attestation (or what went wrong making it ready).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The signature.
    #[error("the signature")]
    Signature(#[source] registry::Error),
    /// The provenance.
    #[error("the provenance attestation")]
    Provenance(#[source] registry::Error),
}

/// Prepares the signature of the manifest `digest` in `image`'s repository by `key`, and the
/// attestation of `statement` (an in-toto Statement about it, signed in a DSSE envelope),
/// both as cosign stores them: beside the other keys' signatures under `sha256-<hex>.sig`,
/// and beside the other attestations under `sha256-<hex>.att` with its predicate type.
///
/// `fresh`: the image is new in the repository (its manifest is going up now), so its tags
/// are nearly always absent: each layer and the config of a manifest of it alone are uploaded
/// while the tag is read, without a `HEAD` first. Otherwise (a rebuild that found its image)
/// an image already signed by this key, or with an attestation, is left as it is.
///
/// # Errors
/// Registry errors, saying which of the two failed.
pub async fn prepare(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    statements: &Statements<'_>,
    fresh: bool,
) -> Result<Prepared, AttachError> {
    let (signature, attestations) = tokio::join!(
        prepare_signature(client, image, digest, key, fresh),
        prepare_attestations(client, image, digest, key, statements, fresh),
    );
    Ok(Prepared::new(signature?, attestations?))
}

/// The signature half of [`prepare`], for a caller that readies the attestations' statements
/// meanwhile.
///
/// # Errors
/// Registry errors.
pub async fn prepare_signature(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    fresh: bool,
) -> Result<Pending, AttachError> {
    signature_pending(client, image, digest, key, fresh)
        .await
        .map_err(AttachError::Signature)
}

/// Signs `digest` (an image index, say) and pushes the signature at once, unless one by this
/// key is there.
///
/// # Errors
/// Registry errors.
pub async fn sign(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
) -> Result<Signed, AttachError> {
    let pending = prepare_signature(client, image, digest, key, false).await?;
    let put = pending.push(client).await.map_err(AttachError::Signature)?;
    Ok(if put.added {
        Signed::Pushed(put.shown)
    } else {
        Signed::Present(put.shown)
    })
}

/// The attestations half of [`prepare`].
///
/// # Errors
/// Registry errors.
pub async fn prepare_attestations(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    statements: &Statements<'_>,
    fresh: bool,
) -> Result<Pending, AttachError> {
    attestation_pending(client, image, digest, key, statements, fresh)
        .await
        .map_err(AttachError::Provenance)
}

impl Prepared {
    /// The two halves, made ready by [`prepare_signature`] and [`prepare_attestations`].
    pub fn new(signature: Pending, attestations: Pending) -> Prepared {
        Prepared {
            signature,
            provenance: attestations,
        }
    }

    /// Puts the signature and attestation manifests, side by side: call it once the image's
    /// own manifest is up.
    ///
    /// # Errors
    /// Registry errors, saying which of the two failed.
    pub async fn push(self, client: &Client) -> Result<Attached, AttachError> {
        let (signature, provenance) =
            tokio::join!(self.signature.push(client), self.provenance.push(client));
        let signature = signature.map_err(AttachError::Signature)?;
        let provenance = provenance.map_err(AttachError::Provenance)?;
        Ok(Attached {
            signature: if signature.added {
                Signed::Pushed(signature.shown)
            } else {
                Signed::Present(signature.shown)
            },
            provenance: provenance.added.then_some(provenance.shown),
        })
    }
}

async fn signature_pending(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    fresh: bool,
) -> Result<Pending, registry::Error> {
    let payload = payload(&image.repository_path(), digest);
    let mut layer = Descriptor::new(
        MediaType::from(SIMPLE_SIGNING),
        Digest::of(&payload),
        payload.len() as u64,
    );
    let signature = STANDARD.encode(key.sign(&payload));
    layer.annotations = Some(BTreeMap::from([(
        SIGNATURE_ANNOTATION.to_string(),
        signature,
    )]));
    // The same payload already signed by this key: nothing to add.
    let done = Done::Signed {
        layer: &layer,
        payload: &payload,
        key,
    };
    let tag = signature_tag(digest);
    let addition = Addition {
        layers: vec![(layer.clone(), payload.clone())],
        fresh,
        kind: Kind::Signatures,
        subject: digest.clone(),
    };
    prepare_append(client, image, &tag, addition, done).await
}

async fn attestation_pending(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    statements: &Statements<'_>,
    fresh: bool,
) -> Result<Pending, registry::Error> {
    use crate::provenance::{PAYLOAD_TYPE, PREDICATE_TYPE, pae};
    let envelope = |statement: &[u8], predicate_type: &str| {
        let signature = STANDARD.encode(key.sign(&pae(PAYLOAD_TYPE, statement)));
        let envelope = serde_json::to_vec(&json!({
            "payloadType": PAYLOAD_TYPE,
            "payload": STANDARD.encode(statement),
            "signatures": [{"keyid": "", "sig": signature}],
        }))
        .expect("a JSON value serialises");
        let mut layer = Descriptor::new(
            MediaType::from(DSSE_ENVELOPE),
            Digest::of(&envelope),
            envelope.len() as u64,
        );
        layer.annotations = Some(BTreeMap::from([
            (SIGNATURE_ANNOTATION.to_string(), String::new()),
            ("predicateType".to_string(), predicate_type.to_string()),
        ]));
        (layer, envelope)
    };
    let mut layers = vec![envelope(statements.provenance, PREDICATE_TYPE)];
    if let Some(sbom) = statements.sbom {
        layers.push(envelope(sbom, crate::sbom::PREDICATE_TYPE));
    }
    let done = Done::Attested {
        ours: crate::provenance::claims(statements.provenance).ok(),
        key,
        fresh,
    };
    let tag = attestation_tag(digest);
    let addition = Addition {
        layers,
        fresh,
        kind: Kind::Attestations,
        subject: digest.clone(),
    };
    prepare_append(client, image, &tag, addition, done).await
}

/// The in-toto Statements attested for an image: its provenance, and its SBOM if made.
#[derive(Clone, Copy, Debug)]
pub struct Statements<'a> {
    /// The SLSA provenance ([`crate::provenance::statement`]).
    pub provenance: &'a [u8],
    /// The CycloneDX SBOM ([`crate::sbom::statement`]).
    pub sbom: Option<&'a [u8]>,
}

/// Layers to add to a cosign tag, each with its bytes, whether the image is new in the
/// repository, and what they are.
struct Addition {
    layers: Vec<(Descriptor, Vec<u8>)>,
    fresh: bool,
    kind: Kind,
    /// The image's manifest digest.
    subject: Digest,
}

/// What a cosign manifest holds: how it is also stored as an OCI 1.1 referrer of the image
/// (where the registry serves the referrers API), as `cosign` does in its OCI 1.1 mode.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Signatures: the same manifest, its config's media type the artifact type
    /// [`SIGNATURE_ARTIFACT`].
    Signatures,
    /// Attestations: their envelopes under the empty config, artifact type
    /// [`ATTESTATION_ARTIFACT`].
    Attestations,
}

/// The artifact type of a signature referrer.
pub(super) const SIGNATURE_ARTIFACT: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// The artifact type of an attestation referrer (an in-toto Statement in each envelope).
pub(super) const ATTESTATION_ARTIFACT: &str = "application/vnd.in-toto+json";
/// The content of OCI 1.1's empty descriptor ([`empty_config`]).
const EMPTY: &[u8] = b"{}";

/// OCI 1.1's empty descriptor, the config of an artifact that needs none.
fn empty_config() -> Descriptor {
    let media_type = MediaType::from("application/vnd.oci.empty.v1+json");
    Descriptor::new(media_type, Digest::of(EMPTY), EMPTY.len() as u64)
}

/// A cosign manifest ready to be put (`manifest`, or `None` when its tag already holds what
/// it would add), and the tag as shown.
#[derive(Debug)]
pub struct Pending {
    tag_ref: Reference,
    shown: String,
    manifest: Option<Document>,
    /// The image's manifest digest, and what the manifest holds.
    subject: Digest,
    kind: Kind,
}

/// What putting a [`Pending`] did.
struct Put {
    shown: String,
    added: bool,
}

impl Pending {
    async fn push(self, client: &Client) -> Result<Put, registry::Error> {
        let added = self.manifest.is_some();
        if let Some(doc) = &self.manifest {
            client.put_manifest(&self.tag_ref, doc).await?;
            // An addition: the tag is what cosign reads unless told otherwise.
            if let Err(e) = self.refer(client, doc).await {
                tracing::warn!(
                    tag = %self.shown,
                    error = %e,
                    "not stored as an OCI 1.1 referrer of the image too",
                );
            }
        }
        Ok(Put {
            shown: self.shown,
            added,
        })
    }

    /// Where the registry serves the referrers API, stores what was added as a referrer of
    /// the image too (`doc`, the tag's new manifest): a manifest whose `subject` is the
    /// image, put by digest, which `GET /v2/<name>/referrers/<digest>` then lists.
    async fn refer(&self, client: &Client, doc: &Document) -> Result<(), registry::Error> {
        // By digest alone: a reference that kept the tag would be put to the tag.
        let repository = self.tag_ref.repository_only();
        let image = repository.with_digest(self.subject.clone());
        if !client.serves_referrers(&image, &self.subject).await? {
            return Ok(());
        }
        let subject = client.manifest_descriptor(&image).await?;
        let tagged: Manifest = doc.parse().map_err(|_| registry::Error::Protocol {
            method: reqwest::Method::PUT,
            url: self.shown.clone(),
            problem: "a cosign manifest kiln made does not parse",
        })?;
        if let Kind::Attestations = self.kind {
            let bytes = BlobSource::Bytes(Bytes::from_static(EMPTY));
            client
                .push_blob(&image, &empty_config(), bytes, None)
                .await?;
        }
        let referrer = referrer(tagged, subject, self.kind);
        let doc = Document::new(
            MediaType::OciManifest,
            serde_json::to_vec(&referrer).expect("a manifest serialises"),
        );
        client
            .put_manifest(&repository.with_digest(doc.digest.clone()), &doc)
            .await?;
        tracing::debug!(referrer = %doc.digest, image = %image, "stored as a referrer");
        Ok(())
    }
}

/// The referrer of `subject` that holds what the cosign manifest `tagged` holds, as cosign's
/// OCI 1.1 mode writes it.
fn referrer(tagged: Manifest, subject: Descriptor, kind: Kind) -> Manifest {
    let subject = Some(Descriptor::new(
        subject.media_type,
        subject.digest,
        subject.size,
    ));
    match kind {
        Kind::Signatures => Manifest {
            // Both, as cosign writes them: a registry lists the `artifactType`, or else the
            // config's media type; a tool may filter on the field alone.
            artifact_type: Some(SIGNATURE_ARTIFACT.to_string()),
            config: Descriptor {
                media_type: MediaType::from(SIGNATURE_ARTIFACT),
                ..tagged.config
            },
            subject,
            ..tagged
        },
        Kind::Attestations => Manifest {
            artifact_type: Some(ATTESTATION_ARTIFACT.to_string()),
            config: empty_config(),
            subject,
            ..tagged
        },
    }
}

/// Prepares the addition of a layer to the cosign manifest tagged `tag` in `image`'s
/// repository, after the layers already there, unless `done` says those hold what it would
/// add: uploads the layer's blob and the config cosign writes, and makes the manifest.
async fn prepare_append(
    client: &Client,
    image: &Reference,
    tag: &str,
    addition: Addition,
    done: Done<'_>,
) -> Result<Pending, registry::Error> {
    let tag_ref = image.with_tag(tag)?;
    let shown = format!("{}:{tag}", image.repository_path());
    let upload = |desc: Descriptor, bytes: Vec<u8>| async move {
        client
            .push_new_blob(image, &desc, BlobSource::Bytes(Bytes::from(bytes)))
            .await
    };
    let Addition {
        layers: added,
        fresh,
        kind,
        subject,
    } = addition;
    let descriptors: Vec<Descriptor> = added.iter().map(|(d, _)| d.clone()).collect();
    let alone = config_for(&descriptors);
    // The layers, and with `alone` the config of a manifest of them alone.
    let upload_all = |alone: Option<(Descriptor, Vec<u8>)>| {
        futures_util::future::try_join_all(
            added
                .iter()
                .map(|(d, b)| (d.clone(), b.clone()))
                .chain(alone)
                .map(|(d, b)| upload(d, b)),
        )
    };
    let found = if fresh {
        let (found, uploaded) =
            tokio::join!(existing(client, &tag_ref), upload_all(Some(alone.clone())));
        uploaded?;
        found?
    } else {
        existing(client, &tag_ref).await?
    };
    let mut layers = found.map(|m| m.layers).unwrap_or_default();
    if done.holds(client, &tag_ref, &layers).await? {
        return Ok(Pending {
            tag_ref,
            shown,
            manifest: None,
            subject,
            kind,
        });
    }
    layers.extend(descriptors);
    let (config_desc, config) = config_for(&layers);
    if !fresh {
        let (uploaded, config_up) =
            tokio::join!(upload_all(None), upload(config_desc.clone(), config));
        uploaded?;
        config_up?;
    } else if config_desc.digest != alone.0.digest {
        // Other signatures were there: the config names theirs too.
        upload(config_desc.clone(), config).await?;
    }
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MediaType::OciManifest),
        artifact_type: None,
        config: config_desc,
        layers,
        subject: None,
        annotations: None,
    };
    let doc = Document::new(
        MediaType::OciManifest,
        serde_json::to_vec(&manifest).expect("a manifest serialises"),
    );
    Ok(Pending {
        tag_ref,
        shown,
        manifest: Some(doc),
        subject,
        kind,
    })
}

/// When a cosign tag holds what would be added to it already.
enum Done<'a> {
    /// A signature: the same payload, signed by this key.
    Signed {
        layer: &'a Descriptor,
        payload: &'a [u8],
        key: &'a SignKey,
    },
    /// Attestations: an image pushed before (a rebuild) keeps the attestations of a
    /// provenance this key signed that says what this one would (they went up together); any
    /// other (another key's, another build's, a forgery) gets these beside it, so a
    /// stranger's envelope under the tag cannot stand in for them.
    Attested {
        ours: Option<crate::provenance::Claims>,
        key: &'a SignKey,
        fresh: bool,
    },
}

impl Done<'_> {
    /// Whether `layers`, under `tag_ref`, hold it. (An enum, not a closure: a future over a
    /// closure taking references is not `Send` for every lifetime, which a controller's
    /// reconcile needs.)
    async fn holds(
        &self,
        client: &Client,
        tag_ref: &Reference,
        layers: &[Descriptor],
    ) -> Result<bool, registry::Error> {
        match self {
            Done::Signed {
                layer,
                payload,
                key,
            } => Ok(layers.iter().any(|l| {
                l.digest == layer.digest
                    && signature_of(l).is_some_and(|s| key.public().verify(payload, &s))
            })),
            Done::Attested { ours, key, fresh } => {
                if *fresh || layers.is_empty() {
                    return Ok(false);
                }
                let statements =
                    signed_statements(client, tag_ref, layers, key.public(), &mut Vec::new())
                        .await
                        .map_err(|(_, e)| e)?;
                Ok(statements
                    .iter()
                    .any(|s| crate::provenance::claims(s).ok().as_ref() == ours.as_ref()))
            }
        }
    }
}

/// The config cosign writes for a signature or attestation manifest of `layers`: one diff id
/// per layer, no platform. Its descriptor and bytes.
fn config_for(layers: &[Descriptor]) -> (Descriptor, Vec<u8>) {
    let diff_ids: Vec<String> = layers.iter().map(|l| l.digest.to_string()).collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    }))
    .expect("a JSON value serialises");
    let desc = Descriptor::new(
        MediaType::OciConfig,
        Digest::of(&config),
        config.len() as u64,
    );
    (desc, config)
}
