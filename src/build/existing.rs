//! Whether the target already holds this build's image: the image key is known before any
//! dependency is installed or blob uploaded, and kiln writes it into every image (config
//! label, and manifest annotation for OCI manifests). A build whose key is found prints the
//! existing digest and stops. A missing tag or repository is simply not found.
//!
//! - `--tag-by-key`: one manifest `HEAD` of `REPO:kiln-KEY`; the key's tag is kiln's own and
//!   only ever names a complete image (its manifest goes last). If the target's own tag points
//!   elsewhere it is moved (one `GET` and one `PUT` of the manifest).
//! - A tag: one manifest `GET`; its annotation, or for a Docker manifest its config's label.
//! - A layout: the named image's manifest, and every blob it lists present.

use super::options::Target;
use super::plan::{BUILD_KEY_LABEL, key_tag};
use crate::oci::{Digest, Document, ImageConfig, Layout, Manifest, MediaType};
use crate::registry::{self, Client, Reference};

/// An image of this build found in the target.
#[derive(Clone, Debug)]
pub struct Found {
    /// `repo@sha256:…` or `oci:DIR@sha256:…`, as a build prints it.
    pub reference: String,
    /// The manifest digest.
    pub digest: Digest,
}

/// Looks for an image with image key `key` where this build would put its image. A registry
/// that fails the lookup (after its retries) fails the build: the push would meet the same
/// registry, and retrying there again would only multiply the wait.
pub(super) async fn find(
    client: &Client,
    target: &Target,
    tag_by_key: bool,
    key: &Digest,
) -> Result<Option<Found>, super::error::Error> {
    match target {
        Target::Registry(target) => {
            in_registry(client, target, key, tag_by_key)
                .await
                .map_err(|source| super::error::Error::Lookup {
                    target: target.to_string(),
                    source: Box::new(source),
                })
        }
        Target::Layout { dir, name } => {
            let (dir, name, key) = (dir.clone(), name.clone(), key.clone());
            Ok(tokio::task::spawn_blocking(move || in_layout(&dir, &name, &key)).await?)
        }
    }
}

async fn in_registry(
    client: &Client,
    target: &Reference,
    key: &Digest,
    tag_by_key: bool,
) -> Result<Option<Found>, registry::Error> {
    let found = |digest: Digest| Found {
        reference: format!("{}@{}", target.repository_path(), digest),
        digest,
    };
    if tag_by_key {
        let by_key = target.with_tag(&key_tag(key))?;
        let Some(existing) = client.head_manifest(&by_key).await? else {
            return Ok(None);
        };
        if target.tag.is_some() {
            let current = client.head_manifest(target).await?;
            if current.as_ref().map(|d| &d.digest) != Some(&existing.digest) {
                let doc = client
                    .get_manifest(&by_key.with_digest(existing.digest.clone()), &[])
                    .await?;
                client.put_manifest(target, &doc).await?;
                tracing::info!(
                    tag = %target,
                    digest = %existing.digest,
                    "moved the tag to the image already built for this key",
                );
            }
        }
        return Ok(Some(found(existing.digest)));
    }
    if target.tag.is_none() {
        return Ok(None);
    }
    let accept = [MediaType::OciManifest, MediaType::DockerManifest];
    let doc = match client.get_manifest(target, &accept).await {
        Ok(doc) => doc,
        Err(registry::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(manifest) = image_manifest(&doc) else {
        return Ok(None);
    };
    let key_of = match annotated_key(&manifest) {
        Some(k) => Some(k),
        None if doc.media_type == MediaType::DockerManifest => {
            let config = client.get_blob(target, &manifest.config).await?;
            labelled_key(&config)
        }
        None => None,
    };
    Ok((key_of.as_deref() == Some(&key.to_string())).then(|| found(doc.digest)))
}

fn in_layout(dir: &std::path::Path, name: &str, key: &Digest) -> Option<Found> {
    if !dir.join("oci-layout").is_file() {
        return None;
    }
    let layout = Layout::open(dir).ok()?;
    let descriptor = layout.resolve(Some(name)).ok()?;
    let doc = layout.read_document(&descriptor).ok()?;
    let manifest = image_manifest(&doc)?;
    if annotated_key(&manifest).as_deref() != Some(&key.to_string()) {
        return None;
    }
    let complete = std::iter::once(&manifest.config)
        .chain(&manifest.layers)
        .all(|d| layout.has_blob(&d.digest, d.size));
    complete.then(|| Found {
        reference: format!("oci:{}@{}", dir.display(), doc.digest),
        digest: doc.digest,
    })
}

fn image_manifest(doc: &Document) -> Option<Manifest> {
    matches!(
        doc.media_type,
        MediaType::OciManifest | MediaType::DockerManifest
    )
    .then(|| doc.parse::<Manifest>().ok())
    .flatten()
}

fn annotated_key(manifest: &Manifest) -> Option<String> {
    manifest.annotations.as_ref()?.get(BUILD_KEY_LABEL).cloned()
}

fn labelled_key(config: &[u8]) -> Option<String> {
    let config: ImageConfig = serde_json::from_slice(config).ok()?;
    config.config?.labels?.get(BUILD_KEY_LABEL).cloned()
}
