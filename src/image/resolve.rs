//! Resolving the base image: its manifest (an index resolves to the wanted platform) and its
//! config, verified against their digests. Base layers are not fetched here: pushing to a
//! registry mounts or skips them, and only an OCI-layout output downloads them.

use std::path::PathBuf;

use crate::oci::{self, Base, Document, Index, Layout, MediaType, Platform, sniff_media_type};
use crate::registry::{self, Client, Reference};

/// Where a base image is read from.
#[derive(Clone, Debug)]
pub enum BaseRef {
    /// A registry reference.
    Registry(Reference),
    /// An OCI layout directory, optionally naming an image in it (`oci:DIR[:NAME]`).
    Layout {
        /// The directory.
        dir: PathBuf,
        /// The image name (`org.opencontainers.image.ref.name`).
        name: Option<String>,
    },
}

/// Why the base image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A registry request failed.
    #[error("resolving base image {reference}")]
    Registry {
        /// The base.
        reference: String,
        /// The cause.
        #[source]
        source: Box<registry::Error>,
    },
    /// The layout cannot be read.
    #[error("reading base image from {reference}")]
    Layout {
        /// The base.
        reference: String,
        /// The cause.
        #[source]
        source: oci::layout::Error,
    },
    /// The index has no entry for the platform.
    #[error("base image {reference} has no {wanted} image (it has: {available}); pass --platform")]
    NoPlatform {
        /// The base.
        reference: String,
        /// Wanted (`os/arch`).
        wanted: String,
        /// Present.
        available: String,
    },
    /// A document that should be an index or manifest is neither, or is malformed.
    #[error("base image {reference}: {problem}")]
    Malformed {
        /// The base.
        reference: String,
        /// What is wrong.
        problem: String,
    },
}

/// A resolved base image.
#[derive(Clone, Debug)]
pub struct ResolvedBase {
    /// The base as the user named it.
    pub name: String,
    /// Manifest and config bytes.
    pub base: Base,
    /// Where its layers are.
    pub location: BaseLocation,
}

/// Where a resolved base's layers can be read.
#[derive(Clone, Debug)]
pub enum BaseLocation {
    /// In a registry repository.
    Registry(Reference),
    /// In a local layout.
    Layout(Layout),
}

impl BaseRef {
    /// Parses `oci:DIR[:NAME]` or a registry reference.
    ///
    /// # Errors
    /// A malformed registry reference, or `oci:` without a directory.
    pub fn parse(s: &str) -> Result<BaseRef, registry::Error> {
        if let Some(rest) = s.strip_prefix("oci:") {
            let (dir, name) = oci::layout::split_layout_ref(rest);
            if dir.is_empty() {
                return Err(registry::Error::InvalidReference {
                    input: s.into(),
                    problem: "it names no layout directory (expected oci:DIR[:NAME])",
                });
            }
            return Ok(BaseRef::Layout {
                dir: dir.into(),
                name,
            });
        }
        Ok(BaseRef::Registry(s.parse()?))
    }
}

/// Resolves `base` for `platform`.
///
/// # Errors
/// Unreachable registry, missing image or platform, digest mismatches.
pub async fn resolve(
    client: &Client,
    base: &BaseRef,
    name: &str,
    platform: &Platform,
) -> Result<ResolvedBase, Error> {
    let resolved = resolve_any(client, base, name, platform).await?;
    check_platform(&resolved, platform)?;
    Ok(resolved)
}

/// A single-platform base (no index to choose from) must be the platform asked for: its
/// config says which it is. Otherwise `--platform linux/arm64` would build an amd64 image
/// that does not start on arm64 nodes.
fn check_platform(resolved: &ResolvedBase, wanted: &Platform) -> Result<(), Error> {
    #[derive(serde::Deserialize)]
    struct ConfigPlatform {
        architecture: Option<String>,
        os: Option<String>,
        variant: Option<String>,
    }
    let Ok(config) = serde_json::from_slice::<ConfigPlatform>(&resolved.base.config.bytes) else {
        return Ok(()); // read again, and refused with a reason, when the config is used
    };
    let (Some(architecture), Some(os)) = (config.architecture, config.os) else {
        return Ok(());
    };
    let found = Platform {
        architecture,
        os,
        os_version: None,
        os_features: None,
        variant: config.variant,
    };
    if wanted.matches(&found) {
        return Ok(());
    }
    Err(Error::NoPlatform {
        reference: resolved.name.clone(),
        wanted: wanted.to_string(),
        available: found.to_string(),
    })
}

async fn resolve_any(
    client: &Client,
    base: &BaseRef,
    name: &str,
    platform: &Platform,
) -> Result<ResolvedBase, Error> {
    match base {
        BaseRef::Registry(reference) => resolve_registry(client, reference, name, platform).await,
        BaseRef::Layout { dir, name: image } => {
            let err = |source| Error::Layout {
                reference: name.to_string(),
                source,
            };
            let layout = Layout::open(dir).map_err(err)?;
            let descriptor = layout.resolve(image.as_deref()).map_err(err)?;
            let mut doc = layout.read_document(&descriptor).map_err(err)?;
            if let Some(kind) = sniff_media_type(&doc.bytes) {
                doc.media_type = kind;
            }
            if doc.media_type.is_index() {
                let entry = select(&doc, name, platform)?;
                doc = layout.read_document(&entry).map_err(err)?;
            }
            let config = config_descriptor(&doc, name)?;
            let config = layout.read_document(&config).map_err(err)?;
            Ok(ResolvedBase {
                name: name.into(),
                base: Base {
                    manifest: doc,
                    config,
                },
                location: BaseLocation::Layout(layout),
            })
        }
    }
}

async fn resolve_registry(
    client: &Client,
    reference: &Reference,
    name: &str,
    platform: &Platform,
) -> Result<ResolvedBase, Error> {
    let err = |source: registry::Error| Error::Registry {
        reference: name.to_string(),
        source: Box::new(source),
    };
    let accept = [
        MediaType::OciIndex,
        MediaType::DockerManifestList,
        MediaType::OciManifest,
        MediaType::DockerManifest,
    ];
    let mut doc = client.get_manifest(reference, &accept).await.map_err(err)?;
    if doc.media_type.is_index() {
        let entry = select(&doc, name, platform)?;
        doc = client
            .get_manifest(&reference.with_digest(entry.digest.clone()), &accept)
            .await
            .map_err(err)?;
    }
    let config = config_descriptor(&doc, name)?;
    let bytes = client.get_blob(reference, &config).await.map_err(err)?;
    let config = Document {
        media_type: config.media_type,
        digest: config.digest,
        bytes,
    };
    let pinned = reference.with_digest(doc.digest.clone());
    Ok(ResolvedBase {
        name: name.into(),
        base: Base {
            manifest: doc,
            config,
        },
        location: BaseLocation::Registry(pinned),
    })
}

fn select(doc: &Document, name: &str, platform: &Platform) -> Result<oci::Descriptor, Error> {
    let index: Index = doc.parse().map_err(|e| Error::Malformed {
        reference: name.into(),
        problem: format!("index does not parse: {e}"),
    })?;
    index
        .select(platform)
        .cloned()
        .ok_or_else(|| Error::NoPlatform {
            reference: name.into(),
            wanted: platform.to_string(),
            available: index.platforms().join(", "),
        })
}

fn config_descriptor(doc: &Document, name: &str) -> Result<oci::Descriptor, Error> {
    let manifest: oci::Manifest = doc.parse().map_err(|e| Error::Malformed {
        reference: name.into(),
        problem: format!("manifest {} does not parse: {e}", doc.digest),
    })?;
    Ok(manifest.config)
}
