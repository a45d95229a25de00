//! Publishing a built image (ko's `publish` seam): to a registry — blobs in parallel with a
//! bound, each HEAD → mount → upload, the manifest last and only after every blob succeeded —
//! or into an OCI image layout, downloading and verifying base layers so it is complete.

use std::path::{Path, PathBuf};

use serde::Serialize;

mod layout;
mod to_registry;

pub use layout::LayoutPublisher;
pub use to_registry::{RegistryPublisher, manifest_destinations};

use super::resolve::ResolvedBase;
use crate::oci::{self, Descriptor, Digest, Image};
use crate::registry::{self, Client, Reference, Scope};

/// What a blob is in the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A base image layer.
    Base,
    /// The dependency layer.
    Dependencies,
    /// The source layer.
    Source,
    /// The image config.
    Config,
    /// The image manifest.
    Manifest,
}

/// What happened to a blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The destination had it already.
    Existed,
    /// Mounted from the base repository.
    Mounted,
    /// Uploaded.
    Uploaded,
    /// Written to the layout.
    Written,
}

/// One line of the per-blob report.
#[derive(Clone, Debug, Serialize)]
pub struct BlobReport {
    /// Its digest.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// What it is.
    pub role: Role,
    /// What happened.
    pub outcome: Outcome,
    /// Bytes sent to the registry (or written) for it.
    pub bytes_sent: u64,
}

/// A blob of the image and where its bytes are.
#[derive(Clone, Debug)]
pub struct BlobPlan {
    /// The blob.
    pub descriptor: Descriptor,
    /// What it is.
    pub role: Role,
    /// Its local file; `None` for base layers, which stay where the base is, and for a
    /// dependency layer in the cache repository.
    pub local: Option<PathBuf>,
    /// The registry repository holding the blob when it is not local and not the base's (the
    /// cache repository): mounted from there, or downloaded.
    pub remote: Option<Reference>,
}

/// A finished publish.
#[derive(Clone, Debug)]
pub struct Published {
    /// `repo@sha256:…` or `oci:DIR@sha256:…`.
    pub reference: String,
    /// The manifest digest.
    pub digest: Digest,
    /// One entry per blob, manifest last.
    pub blobs: Vec<BlobReport>,
}

/// Why publishing failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A registry request failed.
    #[error("pushing {what} to {target}")]
    Registry {
        /// The blob or manifest.
        what: String,
        /// The destination.
        target: String,
        /// The cause.
        #[source]
        source: Box<registry::Error>,
    },
    /// Getting push access (and the mount source's pull access) failed.
    #[error("getting push access to {target}")]
    Authorize {
        /// The destination.
        target: String,
        /// The cause.
        #[source]
        source: Box<registry::Error>,
    },
    /// A layer with neither a local file nor a base to take it from (a bug in the caller).
    #[error("layer {0} has no source")]
    MissingLayer(Digest),
    /// Writing the layout.
    #[error("writing the image to {0}")]
    Layout(String, #[source] oci::layout::Error),
}

/// Wraps a registry error with what was being pushed or fetched, and where.
pub fn registry_err(
    what: impl Into<String>,
    target: impl ToString,
) -> impl Fn(registry::Error) -> Error {
    let (what, target) = (what.into(), target.to_string());
    move |source| Error::Registry {
        what: what.clone(),
        target: target.clone(),
        source: Box::new(source),
    }
}

/// One token for the whole build: the target's push scope, and on the same registry the
/// base's pull scope (also the mount source) and the cache repository's push scope. They are
/// registered before the base is read, so the first token (fetched on the registry's first
/// 401) carries them all; otherwise reading the base fetched a pull-only token and the push
/// a second one.
///
/// # Errors
/// An invalid registry name.
pub async fn authorize_up_front(
    client: &Client,
    target: &Reference,
    base: Option<&Reference>,
    cache: Option<&Reference>,
) -> Result<(), Error> {
    let mut scopes = vec![Scope::push(&target.repository)];
    if let Some(base) = base
        && base.registry == target.registry
    {
        scopes.push(Scope::pull(&base.repository));
    }
    if let Some(cache) = cache
        && cache.registry == target.registry
    {
        scopes.push(Scope::push(&cache.repository));
    }
    client
        .want_scopes(&target.registry, &scopes)
        .await
        .map_err(|source| Error::Authorize {
            target: target.to_string(),
            source: Box::new(source),
        })
}

/// Everything a publisher needs.
#[derive(Clone, Copy, Debug)]
pub struct PublishInput<'a> {
    /// The image.
    pub image: &'a Image,
    /// Every layer blob, in manifest order.
    pub layers: &'a [BlobPlan],
    /// The base (for mounting or fetching base layers); `None` when every layer is local.
    pub base: Option<&'a ResolvedBase>,
    /// Scratch directory for downloads.
    pub scratch: &'a Path,
}

/// A place images are published to.
pub trait Publisher {
    /// Publishes `input`.
    fn publish(
        &self,
        input: PublishInput<'_>,
    ) -> impl Future<Output = Result<Published, Error>> + Send;
}

/// What happened to the blobs (layers and config) of `blobs`, for the push step's line:
/// `2 new (1.2 MB), 5 mounted, 1 present`.
pub fn counts(blobs: &[BlobReport]) -> String {
    let blobs: Vec<&BlobReport> = blobs.iter().filter(|b| b.role != Role::Manifest).collect();
    let count = |o: Outcome| blobs.iter().filter(|b| b.outcome == o).count();
    let sent: u64 = blobs.iter().map(|b| b.bytes_sent).sum();
    let new = count(Outcome::Uploaded) + count(Outcome::Written);
    let mut parts = vec![format!("{new} new ({})", crate::progress::bytes(sent))];
    for (n, what) in [
        (count(Outcome::Mounted), "mounted"),
        (count(Outcome::Existed), "present"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    parts.join(", ")
}
