//! `kiln verify`: an image's signature and provenance checked against a key.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::attach::{ATTESTATION_ARTIFACT, SIGNATURE_ARTIFACT};
use super::{
    DSSE_ENVELOPE, MAX_ENVELOPE, MAX_PAYLOAD, SIMPLE_SIGNING, VerifyKey, attestation_tag, existing,
    signature_of, signature_tag, signed_digest,
};
use crate::oci::{Digest, Manifest};
use crate::registry::{self, Client, Reference};

/// Why an image did not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The image has no signature tag (and no referrer that is a signature).
    #[error("{image} has no signatures: nothing is tagged {tag}, and no referrer is one")]
    Unsigned {
        /// The image.
        image: String,
        /// The tag looked for.
        tag: String,
    },
    /// Signatures exist, none valid for the key.
    #[error("no signature of {image} verifies with key {key}: {reasons}")]
    NoValidSignature {
        /// The image.
        image: String,
        /// The key's id.
        key: String,
        /// Why each signature failed, `; `-separated.
        reasons: String,
    },
    /// A provenance was asked for ([`Wanted`]) and none by the key exists.
    #[error("{image} has no provenance signed by key {key}, so nothing says it is {wanted}")]
    NoProvenance {
        /// The image.
        image: String,
        /// The key's id.
        key: String,
        /// What was asked for, in words.
        wanted: String,
    },
    /// Provenances by the key exist, none for this image (and build key).
    #[error("the provenance of {image} does not hold: {reasons}")]
    BadProvenance {
        /// The image.
        image: String,
        /// Why each provenance failed.
        reasons: String,
    },
    /// An image index that does not parse.
    #[error("{image} is not a valid image index: {reason}")]
    BadIndex {
        /// The index.
        image: String,
        /// Why.
        reason: String,
    },
    /// An image an index lists does not verify.
    #[error("the {platform} image {image} of the index")]
    Platform {
        /// Its platform, or `no platform`.
        platform: String,
        /// The image, by digest.
        image: String,
        /// Why.
        #[source]
        source: Box<VerifyError>,
    },
    /// A registry request failed.
    #[error("reading {what}")]
    Registry {
        /// What was being read.
        what: String,
        /// The cause.
        #[source]
        source: registry::Error,
    },
}

/// A verified image.
#[derive(Debug)]
pub struct Verified {
    /// The manifest digest that was signed.
    pub digest: Digest,
    /// The verified payload, as signed.
    pub payload: Vec<u8>,
    /// The build key of its verified provenance, if it has one by the key.
    pub build_key: Option<String>,
}

/// What a provenance must say, beyond naming the image; nothing asked for by default.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted<'a> {
    /// Its build key (`buildDefinition.internalParameters.buildKey`, `--build-key`).
    pub build_key: Option<&'a str>,
    /// The reference the build pushed to (`buildDefinition.externalParameters.image`): a
    /// controller's build key is the tag of its push.
    pub pushed_as: Option<&'a str>,
}

impl Wanted<'_> {
    fn any(&self) -> bool {
        self.build_key.is_some() || self.pushed_as.is_some()
    }

    /// In words, for errors.
    fn shown(&self) -> String {
        let mut parts = Vec::new();
        if let Some(k) = self.build_key {
            parts.push(format!("build {k}"));
        }
        if let Some(p) = self.pushed_as {
            parts.push(format!("the build pushed as {p}"));
        }
        parts.join(" and ")
    }

    /// Why `claims` do not say what is wanted, or `None` when they do.
    fn mismatch(&self, c: &crate::provenance::Claims) -> Option<String> {
        if let Some(want) = self.build_key {
            match &c.build_key {
                None => return Some("a provenance without a build key".into()),
                Some(have) if have != want => {
                    return Some(format!("a provenance of build key {have}"));
                }
                Some(_) => {}
            }
        }
        if let Some(want) = self.pushed_as
            && c.image.as_deref() != Some(want)
        {
            let have = c.image.as_deref().unwrap_or("no reference");
            return Some(format!("a provenance of a build pushed as {have}"));
        }
        None
    }
}

/// Checks that `image` (by tag or digest) carries a signature by `key` over a simple signing
/// payload naming its manifest digest, and that a provenance `key` signed names it too: with
/// anything [`Wanted`], such a provenance must exist and say it; without, one that exists
/// must still name this image.
///
/// # Errors
/// [`VerifyError`] with the reason.
pub async fn verify(
    client: &Client,
    image: &Reference,
    key: &VerifyKey,
    wanted: Wanted<'_>,
) -> Result<Verified, VerifyError> {
    let shown = image.to_string();
    let registry_err = |what: String| move |source| VerifyError::Registry { what, source };
    let digest = match &image.digest {
        Some(d) => d.clone(),
        None => {
            client
                .head_manifest(image)
                .await
                .map_err(registry_err(shown.clone()))?
                .ok_or_else(|| VerifyError::Registry {
                    what: shown.clone(),
                    source: registry::Error::Protocol {
                        method: reqwest::Method::HEAD,
                        url: shown.clone(),
                        problem: "the image does not exist",
                    },
                })?
                .digest
        }
    };
    let tag = signature_tag(&digest);
    let (sig_ref, found) = tagged(client, image, &tag, &shown, "signatures").await?;
    let layers = match found {
        Some(manifest) => manifest.layers,
        // Signed by cosign's OCI 1.1 mode, say: referrers only.
        None => match referred(client, image, &digest, SIGNATURE_ARTIFACT, &shown).await? {
            layers if layers.is_empty() => {
                return Err(VerifyError::Unsigned { image: shown, tag });
            }
            layers => layers,
        },
    };
    let mut reasons = Vec::new();
    for layer in &layers {
        if layer.media_type.as_str() != SIMPLE_SIGNING {
            reasons.push(format!("a layer of type {}", layer.media_type.as_str()));
            continue;
        }
        let Some(signature) = signature_of(layer) else {
            reasons.push("a payload without a base64 signature annotation".into());
            continue;
        };
        if layer.size > MAX_PAYLOAD {
            reasons.push(format!("a payload of {} bytes", layer.size));
            continue;
        }
        let payload = client
            .get_blob(&sig_ref, layer)
            .await
            .map_err(registry_err(format!("signature payload {}", layer.digest)))?;
        if !key.verify(&payload, &signature) {
            reasons.push("a signature that is not this key's over its payload".into());
            continue;
        }
        match signed_digest(&payload) {
            Ok(signed) if signed == digest => {
                let build_key = provenance(client, image, &digest, key, wanted).await?;
                return Ok(Verified {
                    digest,
                    payload,
                    build_key,
                });
            }
            Ok(signed) => reasons.push(format!("a valid signature of another image ({signed})")),
            Err(why) => reasons.push(why),
        }
    }
    Err(VerifyError::NoValidSignature {
        image: shown,
        key: key.id(),
        reasons: reasons.join("; "),
    })
}

/// [`verify`] for an image or an image index (a build for several platforms). An index's
/// own signature is checked, and then each image it lists as [`verify`] checks an image, with
/// `wanted` (its provenance is each image's: the index has none of its own).
///
/// # Errors
/// [`VerifyError`] with the reason; a listed image's is [`VerifyError::Platform`].
pub async fn verify_image(
    client: &Client,
    image: &Reference,
    key: &VerifyKey,
    wanted: Wanted<'_>,
) -> Result<Verified, VerifyError> {
    let shown = image.to_string();
    let doc = client
        .get_manifest(image, &registry::DEFAULT_MANIFEST_TYPES)
        .await
        .map_err(|source| VerifyError::Registry {
            what: shown.clone(),
            source,
        })?;
    let pinned = image.with_digest(doc.digest.clone());
    if !doc.media_type.is_index() {
        return verify(client, &pinned, key, wanted).await;
    }
    let verified = verify(client, &pinned, key, Wanted::default()).await?;
    let index: crate::oci::Index = doc.parse().map_err(|e| VerifyError::BadIndex {
        image: pinned.to_string(),
        reason: format!("{e:#}"),
    })?;
    for entry in index
        .manifests
        .iter()
        .filter(|d| d.media_type.is_manifest())
    {
        let platform = entry
            .platform
            .as_ref()
            .map_or_else(|| "no platform".to_string(), ToString::to_string);
        let one = image.with_digest(entry.digest.clone());
        match verify(client, &one, key, wanted).await {
            Ok(_) => {
                tracing::info!(%platform, digest = %entry.digest, "verified the platform's image")
            }
            Err(e @ VerifyError::Registry { .. }) => return Err(e),
            Err(e) => {
                return Err(VerifyError::Platform {
                    platform,
                    image: one.to_string(),
                    source: Box::new(e),
                });
            }
        }
    }
    Ok(verified)
}

/// The build key of the provenance `key` signed for the manifest `digest` (see [`verify`]).
async fn provenance(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &VerifyKey,
    wanted: Wanted<'_>,
) -> Result<Option<String>, VerifyError> {
    use crate::provenance::claims;
    let shown = format!("{}@{digest}", image.repository_path());
    let tag = attestation_tag(digest);
    let (att_ref, found) = tagged(client, image, &tag, &shown, "attestations").await?;
    let layers = match found {
        Some(manifest) => manifest.layers,
        None => referred(client, image, digest, ATTESTATION_ARTIFACT, &shown).await?,
    };
    let mut reasons = Vec::new();
    let statements = signed_statements(client, &att_ref, &layers, key, &mut reasons)
        .await
        .map_err(|(what, source)| VerifyError::Registry { what, source })?;
    for statement in &statements {
        match claims(statement) {
            Err(why) => reasons.push(why),
            Ok(c) if !c.subjects.iter().any(|s| s == digest.hex()) => reasons.push(format!(
                "a provenance of another image (subject sha256:{})",
                c.subjects.join(", sha256:")
            )),
            Ok(c) => match wanted.mismatch(&c) {
                Some(why) => reasons.push(why),
                None => return Ok(c.build_key),
            },
        }
    }
    match statements.is_empty() {
        true if !wanted.any() => Ok(None),
        true => Err(VerifyError::NoProvenance {
            image: shown,
            key: key.id(),
            wanted: wanted.shown(),
        }),
        false => Err(VerifyError::BadProvenance {
            image: shown,
            reasons: reasons.join("; "),
        }),
    }
}

/// The in-toto Statements in the DSSE envelopes among `layers` (of the cosign attestation
/// manifest `att_ref`) that `key` signed. Another key's envelope is not this key's business;
/// why any other layer was passed over goes into `reasons`.
///
/// # Errors
/// What was being read, and the registry error.
pub(super) async fn signed_statements(
    client: &Client,
    att_ref: &Reference,
    layers: &[crate::oci::Descriptor],
    key: &VerifyKey,
    reasons: &mut Vec<String>,
) -> Result<Vec<Vec<u8>>, (String, registry::Error)> {
    use crate::provenance::{PAYLOAD_TYPE, pae};
    let mut statements = Vec::new();
    for layer in layers
        .iter()
        .filter(|l| l.media_type.as_str() == DSSE_ENVELOPE)
    {
        if layer.size > MAX_ENVELOPE {
            reasons.push(format!("an envelope of {} bytes", layer.size));
            continue;
        }
        let bytes = client
            .get_blob(att_ref, layer)
            .await
            .map_err(|e| (format!("attestation {}", layer.digest), e))?;
        let Ok(envelope) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            reasons.push("an envelope that is not JSON".into());
            continue;
        };
        let payload_type = envelope["payloadType"].as_str().unwrap_or_default();
        let Some(payload) = envelope["payload"]
            .as_str()
            .and_then(|p| STANDARD.decode(p).ok())
        else {
            reasons.push("an envelope without a base64 payload".into());
            continue;
        };
        let signed = envelope["signatures"].as_array().is_some_and(|sigs| {
            sigs.iter().any(|s| {
                s["sig"]
                    .as_str()
                    .and_then(|s| STANDARD.decode(s).ok())
                    .is_some_and(|sig| key.verify(&pae(payload_type, &payload), &sig))
            })
        });
        if signed && payload_type == PAYLOAD_TYPE {
            statements.push(payload);
        }
    }
    Ok(statements)
}

/// At most this many referrers of one artifact type are read for an image, and at most this
/// many distinct layers taken from them.
const MAX_REFERRERS: usize = 32;
const MAX_REFERRED_LAYERS: usize = 64;

/// The layers of the manifests of `artifact_type` that refer to `digest` in `image`'s
/// repository through the OCI 1.1 referrers API (where the registry serves it, every page of
/// its listing; elsewhere the referrers tag schema's `sha256-<hex>` index), each read by
/// digest and naming `digest` as its subject, each layer once: what cosign's OCI 1.1 mode
/// stores instead of its tags. Their blobs are in the image's repository. A fallback for an
/// image without tags: what the registry answers it does not have (no such API, a referrer
/// gone, an answer that is not one) is passed over, so the verdict is the same as with nothing
/// found (never a pass). A layer is taken once, by its whole descriptor: cosign's payload is
/// the same blob for every key, each key's signature is in the descriptor's annotation.
///
/// # Errors
/// What may pass when asked again (a failed connection, a busy registry, a refused
/// identity), as the tags' reading fails: a registry error about `shown`, not a verdict.
async fn referred(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    artifact_type: &str,
    shown: &str,
) -> Result<Vec<crate::oci::Descriptor>, VerifyError> {
    let repository = image.repository_only();
    // What is not passed over: the error to return.
    let failed = |what: String, e: registry::Error| {
        // Passed over or not, why nothing came of it is worth seeing: the verdict that
        // follows says only that no signature or provenance was found.
        tracing::warn!(error = %e, "reading {what}");
        (!passed_over(&e)).then_some(VerifyError::Registry { what, source: e })
    };
    let listed = match client
        .referrers(&repository, digest, artifact_type, MAX_REFERRERS)
        .await
    {
        Ok(listed) => listed,
        Err(e) => {
            return match failed(format!("the referrers of {shown}"), e) {
                Some(e) => Err(e),
                None => Ok(Vec::new()),
            };
        }
    };
    let mut layers: Vec<crate::oci::Descriptor> = Vec::new();
    for referrer in listed.iter().take(MAX_REFERRERS) {
        let at = repository.with_digest(referrer.digest.clone());
        let manifest = match client
            .get_manifest(&at, &[crate::oci::MediaType::OciManifest])
            .await
            .map(|doc| doc.parse::<Manifest>())
        {
            Ok(Ok(manifest)) => manifest,
            Ok(Err(_)) => continue,
            Err(e) => match failed(format!("the referrer {at} of {shown}"), e) {
                Some(e) => return Err(e),
                None => continue,
            },
        };
        if manifest
            .subject
            .as_ref()
            .is_none_or(|s| s.digest != *digest)
        {
            continue;
        }
        for layer in manifest.layers {
            if layers.len() < MAX_REFERRED_LAYERS && !layers.contains(&layer) {
                layers.push(layer);
            }
        }
    }
    Ok(layers)
}

/// Whether a registry's answer says it has nothing there (no such route or API, no such
/// manifest, an answer of another kind), rather than that asking again may succeed.
fn passed_over(e: &registry::Error) -> bool {
    match e {
        registry::Error::NotFound { .. } | registry::Error::Protocol { .. } => true,
        registry::Error::Status { .. } => !e.is_retryable(),
        _ => false,
    }
}

/// The cosign manifest tagged `tag` in the repository of `image` (`shown`): the tag's
/// reference, and the manifest if there is one. `what` it holds names it in errors.
async fn tagged(
    client: &Client,
    image: &Reference,
    tag: &str,
    shown: &str,
    what: &str,
) -> Result<(Reference, Option<Manifest>), VerifyError> {
    let registry_err = |what: String| move |source| VerifyError::Registry { what, source };
    let tag_ref = Reference {
        digest: None,
        ..image
            .with_tag(tag)
            .map_err(registry_err(shown.to_string()))?
    };
    let found = existing(client, &tag_ref)
        .await
        .map_err(registry_err(format!("the {what} of {shown}")))?;
    Ok((tag_ref, found))
}
