//! Rebasing a Function image onto a new base image without a build (`kiln rebase`, and the
//! controller's fleet roll): the new base's layers, the Function's own layers as they are, and
//! the config a build on the new base would write; pushed with blob mounts only, the manifest
//! last. [`decide`] says whether that is safe and assembles the image; [`publish`] pushes it.

pub mod attest;
mod decide;
mod index;
mod own;

use std::path::Path;

pub use crate::image::resolve::{BaseRef, ResolvedBase};
pub use decide::{Current, Decision, NewBase, Rebased, decide};
pub use index::{IndexDecision, KnownBases, PlatformPlan, plan_index, publish_index};

use crate::image::publish::{
    self, BlobPlan, BlobReport, Outcome, PublishInput, Published, Publisher, RegistryPublisher,
    Role,
};
use crate::image::resolve::{self, BaseLocation};
use crate::oci::{Digest, MediaType, Platform};
use crate::registry::{BlobSource, Client, Reference, Scope};
use crate::runtime::Catalog;

/// What to rebase onto what.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The Function image (one platform's manifest, by tag or digest).
    pub image: &'a Reference,
    /// The new base.
    pub base: &'a BaseRef,
    /// The new base as the user named it (`--base`), as a build names it in the image.
    pub base_name: &'a str,
    /// The builder image the new base pairs with, by digest, when known.
    pub builder: Option<&'a Digest>,
    /// The digest that builder was named by, when another (see [`NewBase::builder_index`]).
    pub builder_index: Option<&'a Digest>,
    /// The platform of the new base to take from an index.
    pub platform: &'a Platform,
    /// The runtimes.
    pub catalog: &'a Catalog,
    /// The new base, already resolved: the rebases of a fleet share one, so each reads only
    /// its own image.
    pub resolved: Option<&'a ResolvedBase>,
}

/// The digest a builder reference is pinned by, if it is (an index's, for a builder of
/// several platforms): what a build Job records as its builder.
pub fn pinned_digest(reference: &BaseRef) -> Option<&Digest> {
    match reference {
        BaseRef::Registry(r) => r.digest.as_ref(),
        BaseRef::Layout { .. } => None,
    }
}

/// A decision with what it was made from.
#[derive(Debug)]
pub struct Planned {
    /// The decision (and the rebased image, when safe).
    pub decision: Decision,
    /// The image's current manifest digest.
    pub current: Digest,
    /// The new base.
    pub new_base: ResolvedBase,
}

/// Why a rebase could not be made or pushed (a rebase that is not safe is a
/// [`Decision::Rebuild`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Function image cannot be read.
    #[error("reading the image {image}")]
    Image {
        /// The image.
        image: String,
        /// The cause.
        #[source]
        source: Box<resolve::Error>,
    },
    /// An image index (a build for several platforms): [`plan_index`] rebases it.
    #[error("{image} is an image index (a build for several platforms)")]
    Index {
        /// The image.
        image: String,
        /// The index.
        index: Box<crate::oci::Document>,
    },
    /// The new base cannot be read.
    #[error("reading the new base {base}")]
    Base {
        /// The base.
        base: String,
        /// The cause.
        #[source]
        source: Box<resolve::Error>,
    },
    /// Pushing failed; the manifest was not pushed unless every blob was there.
    #[error(transparent)]
    Publish(#[from] publish::Error),
    /// An image to put in another repository whose blob the registry would not mount there.
    #[error(
        "the registry declined to mount blob {blob} of {image} into {target}: copy the image \
         there first (skopeo copy)"
    )]
    MountDeclined {
        /// The image.
        image: String,
        /// The blob.
        blob: Digest,
        /// The repository it was to go to.
        target: String,
    },
}

/// Puts the image `at` (one platform's manifest, by digest) into `target`'s repository by
/// digest, each of its blobs mounted from `at`'s repository: an image kept as it is, for a
/// rebase whose result goes elsewhere. Its manifest document.
///
/// # Errors
/// A registry failure, or a mount the registry declined.
pub async fn copy_by_mounts(
    client: &Client,
    at: &Reference,
    target: &Reference,
) -> Result<crate::oci::Document, Error> {
    let repository = target.repository_only();
    let fail = |what: String| publish::registry_err(what, &repository);
    let accept = [MediaType::OciManifest, MediaType::DockerManifest];
    let doc = client
        .get_manifest(at, &accept)
        .await
        .map_err(fail(format!("{at} (reading it)")))?;
    let manifest: crate::oci::Manifest = doc.parse().map_err(|e| Error::Image {
        image: at.to_string(),
        source: Box::new(resolve::Error::Malformed {
            reference: at.to_string(),
            problem: format!("{e:#}"),
        }),
    })?;
    for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
        let mounted = client
            .mount_blob(&repository, &blob.digest, &at.repository)
            .await
            .map_err(fail(format!("blob {}", blob.digest)))?;
        if !mounted {
            return Err(Error::MountDeclined {
                image: at.to_string(),
                blob: blob.digest.clone(),
                target: repository.to_string(),
            });
        }
    }
    client
        .put_manifest(&repository.with_digest(doc.digest.clone()), &doc)
        .await
        .map_err(fail(format!("manifest {}", doc.digest)))?;
    Ok(doc)
}

/// Reads the image and the new base and decides.
///
/// # Errors
/// See [`Error`].
pub async fn plan(client: &Client, req: Request<'_>) -> Result<Planned, Error> {
    let shown = req.image.to_string();
    let accept = [
        MediaType::OciIndex,
        MediaType::DockerManifestList,
        MediaType::OciManifest,
        MediaType::DockerManifest,
    ];
    let image_err = |e| Error::Image {
        image: shown.clone(),
        source: Box::new(resolve::Error::Registry {
            reference: shown.clone(),
            source: Box::new(e),
        }),
    };
    let read_image = async {
        let manifest = client
            .get_manifest(req.image, &accept)
            .await
            .map_err(image_err)?;
        if manifest.media_type.is_index() {
            return Err(Error::Index {
                image: shown.clone(),
                index: Box::new(manifest),
            });
        }
        let descriptor = manifest
            .parse::<crate::oci::Manifest>()
            .map_err(|e| Error::Image {
                image: shown.clone(),
                source: Box::new(resolve::Error::Malformed {
                    reference: shown.clone(),
                    problem: format!("manifest {} does not parse: {e}", manifest.digest),
                }),
            })?
            .config;
        let bytes = client
            .get_blob(req.image, &descriptor)
            .await
            .map_err(image_err)?;
        let config = crate::oci::Document {
            media_type: descriptor.media_type,
            digest: descriptor.digest,
            bytes,
        };
        Ok(crate::oci::Base { manifest, config })
    };
    let resolve_base = async {
        match req.resolved {
            Some(resolved) => Ok(resolved.clone()),
            None => resolve::resolve(client, req.base, req.base_name, req.platform).await,
        }
    };
    let (image, new_base) = tokio::join!(read_image, resolve_base);
    let image = image?;
    let new_base = new_base.map_err(|e| Error::Base {
        base: req.base_name.to_string(),
        source: Box::new(e),
    })?;
    let name = match req.base {
        BaseRef::Registry(_) => Some(req.base_name),
        BaseRef::Layout { .. } => None,
    };
    let decision = decide(
        Current { image: &image },
        NewBase {
            base: &new_base.base,
            name,
            builder: req.builder,
            builder_index: req.builder_index,
        },
        req.catalog,
    );
    Ok(Planned {
        decision,
        current: image.manifest.digest.clone(),
        new_base,
    })
}

/// Pushes `rebased` to `target`, the image's own layers taken from `from` (the image's
/// repository). When both are one repository and the new base is on the same registry, this
/// is one mount per base layer the image lacks, the config, and the manifest; otherwise each
/// blob is checked, mounted or copied as a build pushes it.
///
/// # Errors
/// A registry failure; the manifest goes last, so nothing half-pushed is tagged.
pub async fn publish(
    client: &Client,
    rebased: &Rebased,
    new_base: &ResolvedBase,
    from: &Reference,
    target: &Reference,
    key_tag: Option<String>,
    scratch: &Path,
) -> Result<Published, Error> {
    if let Some(published) = mount_only(client, rebased, new_base, from, target, &key_tag).await? {
        return Ok(published);
    }
    let own: Vec<&Digest> = rebased.own_layers.iter().map(|d| &d.digest).collect();
    let layers: Vec<BlobPlan> = rebased
        .image
        .layers
        .iter()
        .map(|d| {
            let own = own.contains(&&d.digest);
            BlobPlan {
                descriptor: d.clone(),
                role: if own { Role::Source } else { Role::Base },
                local: None,
                remote: own.then(|| from.repository_only()),
            }
        })
        .collect();
    let publisher = RegistryPublisher {
        client: client.clone(),
        target: target.clone(),
        key_tag,
        pushed: None,
        jobs: 4,
    };
    let input = PublishInput {
        image: &rebased.image,
        layers: &layers,
        base: Some(new_base),
        scratch,
    };
    Ok(publisher.publish(input).await?)
}

/// The fast path: the target is the image's own repository (its layers are there) and the
/// new base is on the same registry (its layers mount). `None` when that does not hold, or a
/// mount was declined: the caller then pushes blob by blob.
async fn mount_only(
    client: &Client,
    rebased: &Rebased,
    new_base: &ResolvedBase,
    from: &Reference,
    target: &Reference,
    key_tag: &Option<String>,
) -> Result<Option<Published>, Error> {
    let BaseLocation::Registry(base) = &new_base.location else {
        return Ok(None);
    };
    if (&from.registry, &from.repository) != (&target.registry, &target.repository)
        || base.registry != target.registry
    {
        return Ok(None);
    }
    let err = |what: String| publish::registry_err(what, target.to_string());
    client
        .authorize(
            &target.registry,
            &[
                Scope::push(&target.repository),
                Scope::pull(&base.repository),
            ],
        )
        .await
        .map_err(err("authorizing".into()))?;
    // The repository holds the image's own layers and the old base's: only base layers new
    // to it are mounted.
    let mut blobs = Vec::new();
    for d in &rebased.image.layers {
        if rebased.current_layers.contains(&d.digest) {
            let own = rebased.own_layers.iter().any(|o| o.digest == d.digest);
            let role = if own { Role::Source } else { Role::Base };
            blobs.push(report(d.digest.clone(), d.size, role, Outcome::Existed, 0));
            continue;
        }
        let mounted = client
            .mount_blob(target, &d.digest, &base.repository)
            .await
            .map_err(err(format!("blob {}", d.digest)))?;
        if !mounted {
            tracing::info!(digest = %d.digest, "the mount was declined: pushing blob by blob");
            return Ok(None);
        }
        blobs.push(report(
            d.digest.clone(),
            d.size,
            Role::Base,
            Outcome::Mounted,
            0,
        ));
    }
    let config = &rebased.image.config;
    let sent = client
        .push_new_blob(
            target,
            &config.descriptor(),
            BlobSource::Bytes(config.bytes.clone().into()),
        )
        .await
        .map_err(err(format!("config {}", config.digest)))?;
    let bytes_sent = match sent {
        crate::registry::BlobOutcome::Uploaded { bytes_sent } => bytes_sent,
        _ => 0,
    };
    let size = config.bytes.len() as u64;
    blobs.push(report(
        config.digest.clone(),
        size,
        Role::Config,
        Outcome::Uploaded,
        bytes_sent,
    ));
    let manifest = &rebased.image.manifest;
    let destinations =
        publish::manifest_destinations(target, key_tag.as_deref(), &manifest.digest)?;
    for destination in &destinations {
        client
            .put_manifest(destination, manifest)
            .await
            .map_err(err(format!("manifest {}", manifest.digest)))?;
    }
    let size = manifest.bytes.len() as u64;
    blobs.push(report(
        manifest.digest.clone(),
        size,
        Role::Manifest,
        Outcome::Uploaded,
        size,
    ));
    Ok(Some(Published {
        reference: format!("{}@{}", target.repository_path(), manifest.digest),
        digest: manifest.digest.clone(),
        blobs,
    }))
}

fn report(digest: Digest, size: u64, role: Role, outcome: Outcome, bytes_sent: u64) -> BlobReport {
    BlobReport {
        digest,
        size,
        role,
        outcome,
        bytes_sent,
    }
}
