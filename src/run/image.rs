//! Finding the image to run: its manifest (an index resolves to the wanted platform) and its
//! config, from a registry or an OCI layout, each verified against its digest; and getting a
//! layer blob onto local disk (downloaded and verified, or in place in the layout).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Error;
use super::reference::{ImageRef, Selector};
use crate::oci::{
    Descriptor, Digest, Document, Index, Layout, Manifest, MediaType, Platform, sniff_media_type,
};
use crate::registry::{Client, Reference};

/// The media types asked of a registry: either family, index or manifest.
const ACCEPT: [MediaType; 4] = [
    MediaType::OciIndex,
    MediaType::DockerManifestList,
    MediaType::OciManifest,
    MediaType::DockerManifest,
];

/// Where an image's blobs are read from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A registry repository.
    Registry(Reference),
    /// A local layout.
    Layout(Layout),
}

/// A resolved single-platform image.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The manifest's digest: the rootfs cache key.
    pub digest: Digest,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Where the config and layers are.
    pub source: Source,
}

/// A layer blob on local disk.
#[derive(Clone, Debug)]
pub enum LayerFile {
    /// Downloaded into scratch space; delete it once applied.
    Downloaded(PathBuf),
    /// A blob of a layout; leave it alone.
    InLayout(PathBuf),
}

impl LayerFile {
    /// Where it is.
    pub fn path(&self) -> &Path {
        match self {
            LayerFile::Downloaded(p) | LayerFile::InLayout(p) => p,
        }
    }
}

/// Resolves `image` for `platform`.
///
/// # Errors
/// Unreachable registry, missing image or platform, digest mismatches, malformed documents.
pub async fn resolve(
    client: &Client,
    image: &ImageRef,
    platform: &Platform,
) -> Result<Resolved, Error> {
    match image {
        ImageRef::Registry(reference) => resolve_registry(client, reference, platform).await,
        ImageRef::Layout { dir, selector } => {
            let (dir, selector, platform) = (dir.clone(), selector.clone(), platform.clone());
            tokio::task::spawn_blocking(move || resolve_layout(&dir, &selector, &platform))
                .await
                .map_err(Error::Task)?
        }
    }
}

async fn resolve_registry(
    client: &Client,
    reference: &Reference,
    platform: &Platform,
) -> Result<Resolved, Error> {
    let fetch = |what: String| move |e| Error::registry(what, reference, e);
    let mut doc = client
        .get_manifest(reference, &ACCEPT)
        .await
        .map_err(fetch("the manifest".into()))?;
    if doc.media_type.is_index() {
        let entry = select(&doc, platform)?;
        doc = client
            .get_manifest(&reference.with_digest(entry.digest.clone()), &ACCEPT)
            .await
            .map_err(fetch(format!("the {platform} manifest")))?;
    }
    Ok(Resolved {
        digest: doc.digest.clone(),
        manifest: parse_manifest(&doc)?,
        source: Source::Registry(reference.with_digest(doc.digest)),
    })
}

/// Fetches (and verifies) the image config.
///
/// # Errors
/// Download failures, digest mismatches, a corrupt layout blob.
pub async fn fetch_config(client: &Client, resolved: &Resolved) -> Result<Vec<u8>, Error> {
    let descriptor = &resolved.manifest.config;
    match &resolved.source {
        Source::Registry(reference) => client
            .get_blob(reference, descriptor)
            .await
            .map_err(|e| Error::registry("the image config".into(), reference, e)),
        Source::Layout(layout) => {
            let (layout, digest) = (layout.clone(), descriptor.digest.clone());
            tokio::task::spawn_blocking(move || layout.read_blob(&digest))
                .await
                .map_err(Error::Task)?
                .map_err(Error::Layout)
        }
    }
}

fn resolve_layout(dir: &Path, selector: &Selector, platform: &Platform) -> Result<Resolved, Error> {
    let layout = Layout::open(dir)?;
    let mut doc = match selector {
        Selector::Only => layout.read_document(&layout.resolve(None)?)?,
        Selector::Name(name) => layout.read_document(&layout.resolve(Some(name))?)?,
        Selector::Digest(digest) => {
            let bytes = layout.read_blob(digest)?;
            let media_type = MediaType::Other("unknown".into());
            Document {
                media_type,
                digest: digest.clone(),
                bytes,
            }
        }
    };
    // index.json may not say (or may misstate) what a blob is; its own fields decide.
    if let Some(kind) = sniff_media_type(&doc.bytes) {
        doc.media_type = kind;
    }
    if doc.media_type.is_index() {
        let entry = select(&doc, platform)?;
        doc = layout.read_document(&entry)?;
    }
    Ok(Resolved {
        manifest: parse_manifest(&doc)?,
        digest: doc.digest,
        source: Source::Layout(layout),
    })
}

fn select(doc: &Document, platform: &Platform) -> Result<Descriptor, Error> {
    let index: Index = doc.parse().map_err(|source| Error::Malformed {
        digest: doc.digest.clone(),
        source,
    })?;
    index
        .select(platform)
        .cloned()
        .ok_or_else(|| Error::NoPlatform {
            wanted: platform.to_string(),
            available: index.platforms().join(", "),
        })
}

fn parse_manifest(doc: &Document) -> Result<Manifest, Error> {
    let kind = sniff_media_type(&doc.bytes).unwrap_or_else(|| doc.media_type.clone());
    if !kind.is_manifest() {
        return Err(Error::NotAnImage {
            digest: doc.digest.clone(),
            media_type: kind.to_string(),
        });
    }
    doc.parse().map_err(|source| Error::Malformed {
        digest: doc.digest.clone(),
        source,
    })
}

/// Makes layer `descriptor` available as a local file: a layout blob where it is, a registry
/// blob downloaded (and verified) into `scratch`.
///
/// # Errors
/// Download failures and digest mismatches.
pub async fn fetch_layer(
    client: &Client,
    source: &Source,
    descriptor: &Descriptor,
    scratch: &Path,
) -> Result<LayerFile, Error> {
    match source {
        Source::Layout(layout) => Ok(LayerFile::InLayout(layout.blob_path(&descriptor.digest))),
        Source::Registry(reference) => {
            let dest = scratch.join(descriptor.digest.hex());
            tracing::debug!(
                digest = %descriptor.digest,
                size = descriptor.size,
                "downloading layer",
            );
            client
                .get_blob_to_file(reference, descriptor, &dest)
                .await
                .map_err(|e| {
                    let what = format!("layer {}", descriptor.digest);
                    Error::registry(what, reference, e)
                })?;
            Ok(LayerFile::Downloaded(dest))
        }
    }
}

/// Layer downloads running in the background, `jobs` at a time, handed out in layer order so
/// that applying layer N overlaps with fetching the next ones. Dropping it aborts them.
#[derive(Debug)]
pub struct Fetches {
    tasks: JoinSet<(Digest, Result<LayerFile, Error>)>,
    done: HashMap<Digest, Result<LayerFile, Error>>,
    /// The digest of each layer, in manifest order. An image may list the same blob twice
    /// (two identical layers): it is fetched once, into one file, and applied twice.
    order: Vec<Digest>,
}

impl Fetches {
    /// Starts fetching every distinct layer of `resolved` from index `from` on into
    /// `scratch`.
    pub fn start(
        client: &Client,
        resolved: &Resolved,
        scratch: &Path,
        jobs: usize,
        from: usize,
    ) -> Fetches {
        let permits = Arc::new(Semaphore::new(jobs.max(1)));
        let mut tasks = JoinSet::new();
        let order: Vec<Digest> = resolved
            .manifest
            .layers
            .iter()
            .map(|l| l.digest.clone())
            .collect();
        let mut started = std::collections::HashSet::new();
        for descriptor in resolved.manifest.layers.iter().skip(from) {
            if !started.insert(descriptor.digest.clone()) {
                continue;
            }
            let (client, source) = (client.clone(), resolved.source.clone());
            let (descriptor, scratch) = (descriptor.clone(), scratch.to_path_buf());
            let permits = permits.clone();
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let file = fetch_layer(&client, &source, &descriptor, &scratch).await;
                (descriptor.digest, file)
            });
        }
        Fetches {
            tasks,
            done: HashMap::new(),
            order,
        }
    }

    /// Whether layer `index` is the last one to use its blob (the file may then go).
    pub fn last_use(&self, index: usize) -> bool {
        let digest = &self.order[index];
        !self.order[index + 1..].contains(digest)
    }

    /// Waits for layer `index`.
    ///
    /// # Errors
    /// Its download failed, or its task died.
    pub async fn get(&mut self, index: usize) -> Result<LayerFile, Error> {
        let digest = self
            .order
            .get(index)
            .cloned()
            .ok_or(Error::MissingLayer(index))?;
        loop {
            match self.done.get(&digest) {
                Some(Ok(file)) => return Ok(file.clone()),
                Some(Err(_)) => {
                    return self
                        .done
                        .remove(&digest)
                        .unwrap_or(Err(Error::MissingLayer(index)));
                }
                None => {}
            }
            match self.tasks.join_next().await {
                Some(Ok((d, file))) => {
                    self.done.insert(d, file);
                }
                Some(Err(e)) => return Err(Error::Task(e)),
                None => return Err(Error::MissingLayer(index)),
            }
        }
    }
}
