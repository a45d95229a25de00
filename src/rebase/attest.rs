//! Signing a rebase, as a signed build is signed: the rebased image's signature, its SLSA
//! provenance (of type [`crate::provenance::REBASE_TYPE`], naming the image it was rebased
//! from and the new base) and its SBOM (the new base's packages and those in the Function's own
//! layers, read as a build reads them), stored as cosign stores them; for an index, each
//! platform's image so, and the index's own signature. A platform's image that stays as it is
//! gets a provenance for the new build key beside its old one.

use std::path::Path;

use serde_json::json;

use super::{Decision, PlatformPlan, Rebased, ResolvedBase};
use crate::build::sbom::{self, LayerAt};
use crate::cosign::{AttachError, SignKey, Statements};
use crate::oci::{Digest, Platform};
use crate::registry::{Client, Reference};

/// The key, where the SBOM's layer readings are kept, and when the rebase started.
#[derive(Clone, Copy, Debug)]
pub struct Signer<'a> {
    /// The key.
    pub key: &'a SignKey,
    /// Where the components of each layer read are kept (`<dir>/sbom/<digest hex>.json`).
    pub cache_dir: &'a Path,
    /// When the rebase started (RFC 3339).
    pub started: &'a str,
}

/// Why a rebase could not be signed (its image is pushed; it is not signed).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The signature or an attestation could not be stored.
    #[error("signing {image}")]
    Attach {
        /// The image.
        image: String,
        /// The cause.
        #[source]
        source: Box<AttachError>,
    },
    /// The image, or a layer for the SBOM, could not be read.
    #[error("reading {image}: {reason}")]
    Read {
        /// The image.
        image: String,
        /// Why.
        reason: String,
    },
}

/// One image of a rebase to sign: where it went, what it came from, and what it became.
#[derive(Clone, Copy, Debug)]
pub struct Image<'a> {
    /// Where it was pushed (the provenance's `image`: a tag, or the repository).
    pub target: &'a Reference,
    /// Its manifest digest.
    pub digest: &'a Digest,
    /// Its build key; `None`: the one it records (an image kept as it is).
    pub build_key: Option<&'a Digest>,
    /// The image it was rebased from, by digest (the same digest for one kept as it is).
    pub from: &'a Reference,
    /// Its platform.
    pub platform: &'a Platform,
    /// The new base as named, and its digest.
    pub base: (&'a str, &'a Digest),
    /// The builder image the new base pairs with, when one was named.
    pub builder: Option<&'a str>,
    /// For its SBOM, the new base and the image's own layers; `None` for an image kept as it
    /// is, whose SBOM is the one it has.
    pub sbom: Option<(&'a ResolvedBase, &'a [crate::oci::Descriptor])>,
}

/// Signs and attests one rebased (or kept) image. Whether this call put its provenance up
/// (`false`: an attestation there already was kept, [`crate::cosign::prepare`]): a provenance
/// it put up names `image.target` and is signed by `signer`, so a caller that trusts that key
/// needs not read it back to check it.
///
/// # Errors
/// See [`Error`].
pub async fn image(client: &Client, signer: Signer<'_>, image: Image<'_>) -> Result<bool, Error> {
    let repository = image.target.repository_path();
    let shown = format!("{repository}@{}", image.digest);
    let recorded;
    let build_key = match image.build_key {
        Some(key) => key,
        None => {
            recorded =
                recorded_key(client, &image.target.with_digest(image.digest.clone())).await?;
            &recorded
        }
    };
    let sbom = match image.sbom {
        Some((base, own)) => {
            let layers: Vec<LayerAt> = own
                .iter()
                .map(|descriptor| LayerAt {
                    descriptor: descriptor.clone(),
                    local: None,
                    remote: Some(image.target.repository_only()),
                })
                .collect();
            let statement = sbom::statement(
                client,
                signer.cache_dir,
                base,
                &layers,
                &repository,
                image.digest,
            )
            .await
            .map_err(|e| Error::Read {
                image: shown.clone(),
                reason: format!("the SBOM: {e:#}"),
            })?;
            Some(statement)
        }
        None => None,
    };
    let from = image.from.repository_path();
    let from_digest = image.from.digest.as_ref().unwrap_or(image.digest);
    let provenance = crate::provenance::rebase_statement(&crate::provenance::Rebase {
        repository: &repository,
        digest: image.digest,
        build_key,
        from: (&from, from_digest),
        base: image.base,
        builder: image.builder.map(str::to_string),
        external: json!({
            "image": image.target.to_string(),
            "base": image.base.0,
            "rebase": format!("{from}@{from_digest}"),
            "platform": image.platform.to_string(),
        }),
        started: signer.started.to_string(),
        finished: crate::provenance::now(),
    });
    let provenance = serde_json::to_vec(&provenance).expect("a JSON value serialises");
    let statements = Statements {
        provenance: &provenance,
        sbom: sbom.as_deref(),
    };
    // Not `fresh`, even for a new image: a rebase gives the digest a build gives, so the tags
    // may be there (a build, or this rebase made before), and what says the same is kept.
    let fresh = false;
    let attach = |source| Error::Attach {
        image: shown.clone(),
        source: Box::new(source),
    };
    let pinned = image.target.with_digest(image.digest.clone());
    let prepared = crate::cosign::prepare(
        client,
        &pinned,
        image.digest,
        signer.key,
        &statements,
        fresh,
    )
    .await
    .map_err(attach)?;
    let attached = prepared.push(client).await.map_err(attach)?;
    Ok(attached.provenance.is_some())
}

impl<'a> Image<'a> {
    /// The image `rebased` became on `base`, pushed to `target`; `from` is the image rebased.
    pub fn rebased(
        rebased: &'a Rebased,
        base: &'a ResolvedBase,
        (from, target): (&'a Reference, &'a Reference),
        platform: &'a Platform,
        builder: Option<&'a str>,
    ) -> Image<'a> {
        Image {
            target,
            digest: &rebased.image.manifest.digest,
            build_key: Some(&rebased.image_key),
            from,
            platform,
            base: (&base.name, &base.base.manifest.digest),
            builder,
            sbom: Some((base, &rebased.own_layers)),
        }
    }

    /// The image `digest` (`from`, pinned) kept as it is for the build key it records, on
    /// the base as named with its digest, under `target`.
    pub fn kept(
        (from, target): (&'a Reference, &'a Reference),
        digest: &'a Digest,
        platform: &'a Platform,
        base: (&'a str, &'a Digest),
        builder: Option<&'a str>,
    ) -> Image<'a> {
        Image {
            target,
            digest,
            build_key: None,
            from,
            platform,
            base,
            builder,
            sbom: None,
        }
    }
}

/// Signs and attests each platform's image of a rebased index (those rebased and those kept;
/// `from` is the index's repository), then signs the index `digest`, pushed to `target`.
/// Whether every platform's provenance was put up by this call, as [`image`] says.
///
/// # Errors
/// See [`Error`].
pub async fn index(
    client: &Client,
    signer: Signer<'_>,
    platforms: &[PlatformPlan],
    (from, target): (&Reference, &Reference),
    digest: &Digest,
    builder: Option<&str>,
) -> Result<bool, Error> {
    let mut attached = true;
    // One after the other: a few platforms, and a future per platform borrowing them all
    // would not be `Send` for the controller's reconciles.
    for plan in platforms {
        let base = &plan.planned.new_base;
        let from = from.with_digest(plan.current.digest.clone());
        let one = match &plan.planned.decision {
            Decision::Rebase(r) => {
                Image::rebased(r, base, (&from, target), &plan.platform, builder)
            }
            _ => {
                let on = (base.name.as_str(), &base.base.manifest.digest);
                let digest = &plan.current.digest;
                Image::kept((&from, target), digest, &plan.platform, on, builder)
            }
        };
        attached &= image(client, signer, one).await?;
    }
    crate::cosign::sign(client, target, digest, signer.key)
        .await
        .map_err(|source| Error::Attach {
            image: format!("{}@{digest}", target.repository_path()),
            source: Box::new(source),
        })?;
    Ok(attached)
}

/// The build key an image records (`dev.kiln.build-key`): what an image kept as it is has.
///
/// # Errors
/// The image cannot be read, or records no key.
pub async fn recorded_key(client: &Client, image: &Reference) -> Result<Digest, Error> {
    let fail = |reason: String| Error::Read {
        image: image.to_string(),
        reason,
    };
    let doc = client
        .get_manifest(image, &crate::registry::DEFAULT_MANIFEST_TYPES)
        .await
        .map_err(|e| fail(format!("{e:#}")))?;
    let manifest: crate::oci::Manifest = doc.parse().map_err(|e| fail(format!("{e:#}")))?;
    let config = client
        .get_blob(image, &manifest.config)
        .await
        .map_err(|e| fail(format!("{e:#}")))?;
    let config: serde_json::Value =
        serde_json::from_slice(&config).map_err(|e| fail(e.to_string()))?;
    config["config"]["Labels"][crate::build::plan::BUILD_KEY_LABEL]
        .as_str()
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| fail("the image records no build key".into()))
}
