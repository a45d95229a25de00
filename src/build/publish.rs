//! Publishing a built image (ko's `publish` seam): to a registry — blobs in parallel with a
//! bound, each HEAD → mount → upload, the manifest last and only after every blob succeeded —
//! or into an OCI image layout, downloading and verifying base layers so it is complete.

use std::path::{Path, PathBuf};

use futures_util::{StreamExt, TryStreamExt, stream};
use serde::Serialize;

use super::base::{BaseLocation, ResolvedBase};
use crate::oci::{self, Descriptor, Digest, Image, Layout};
use crate::registry::{self, BlobOutcome, BlobSource, Client, Reference, Scope};

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
    /// Its local file; `None` for base layers, which stay where the base is.
    pub local: Option<PathBuf>,
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
fn registry_err(
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

/// When the base lives in the target's registry: one token with the target's push scope and
/// the base's pull scope (which is also the mount source), fetched before the base is read.
/// Otherwise reading the base fetched a pull-only token and the push a second one.
///
/// # Errors
/// Credentials the registry refuses.
pub async fn authorize_up_front(client: &Client, opts: &super::Options) -> Result<(), Error> {
    if let (super::Target::Registry(target), super::BaseRef::Registry(base)) =
        (&opts.target, &opts.base)
        && base.registry == target.registry
    {
        let scopes = [
            Scope::push(&target.repository),
            Scope::pull(&base.repository),
        ];
        client
            .authorize(&target.registry, &scopes)
            .await
            .map_err(|source| Error::Authorize {
                target: target.to_string(),
                source: Box::new(source),
            })?;
    }
    Ok(())
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

/// Publishes to a registry repository.
#[derive(Clone, Debug)]
pub struct RegistryPublisher {
    /// The client.
    pub client: Client,
    /// The destination (tag optional).
    pub target: Reference,
    /// Concurrent blob pushes.
    pub jobs: usize,
}

impl RegistryPublisher {
    fn mount_source(&self, base: Option<&ResolvedBase>) -> Option<String> {
        match base.map(|b| &b.location) {
            Some(BaseLocation::Registry(r)) if r.registry == self.target.registry => {
                Some(r.repository.clone())
            }
            _ => None,
        }
    }

    async fn push_layer(
        &self,
        blob: &BlobPlan,
        input: PublishInput<'_>,
    ) -> Result<BlobReport, Error> {
        let d = &blob.descriptor;
        let err = registry_err(format!("blob {}", d.digest), self.target.to_string());
        let report = |outcome: BlobOutcome| {
            let (outcome, bytes_sent) = match outcome {
                BlobOutcome::Existed => (Outcome::Existed, 0),
                BlobOutcome::Mounted => (Outcome::Mounted, 0),
                BlobOutcome::Uploaded { bytes_sent } => (Outcome::Uploaded, bytes_sent),
            };
            tracing::info!(digest = %d.digest, size = d.size, role = ?blob.role, ?outcome, bytes_sent, "blob");
            BlobReport {
                digest: d.digest.clone(),
                size: d.size,
                role: blob.role,
                outcome,
                bytes_sent,
            }
        };
        // Bytes already on disk (ours, or a layout base's): push_blob checks, then uploads.
        let on_disk = blob
            .local
            .clone()
            .or_else(|| match input.base.map(|b| &b.location) {
                Some(BaseLocation::Layout(layout)) => Some(layout.blob_path(&d.digest)),
                _ => None,
            });
        if let Some(path) = on_disk {
            let outcome = self
                .client
                .push_blob(&self.target, d, BlobSource::File(path), None)
                .await
                .map_err(&err)?;
            return Ok(report(outcome));
        }
        if self
            .client
            .blob_exists(&self.target, &d.digest)
            .await
            .map_err(&err)?
            .is_some()
        {
            return Ok(report(BlobOutcome::Existed));
        }
        if let Some(from) = self.mount_source(input.base)
            && self
                .client
                .mount_blob(&self.target, &d.digest, &from)
                .await
                .map_err(&err)?
        {
            return Ok(report(BlobOutcome::Mounted));
        }
        // The base lives on another registry or refused the mount: copy the layer through a
        // verified local file.
        let file = fetch_base_layer(&self.client, input.base, d, input.scratch).await?;
        let outcome = self
            .client
            .push_blob(
                &self.target,
                d,
                BlobSource::File(file.path().to_path_buf()),
                None,
            )
            .await
            .map_err(&err)?;
        Ok(report(outcome))
    }
}

/// A base layer as a local file: the layout's own blob, or a verified download.
async fn fetch_base_layer(
    client: &Client,
    base: Option<&ResolvedBase>,
    d: &Descriptor,
    scratch: &Path,
) -> Result<LocalFile, Error> {
    let Some(base) = base else {
        return Err(Error::MissingLayer(d.digest.clone()));
    };
    match &base.location {
        BaseLocation::Layout(layout) => Ok(LocalFile::Borrowed(layout.blob_path(&d.digest))),
        BaseLocation::Registry(r) => {
            tracing::warn!(digest = %d.digest, from = %r, "downloading base layer: it cannot be mounted");
            let tmp = tempfile::Builder::new()
                .prefix(".base-")
                .tempfile_in(scratch)
                .map_err(|e| {
                    Error::Layout(
                        scratch.display().to_string(),
                        oci::layout::Error::Io {
                            action: "creating a file in",
                            path: scratch.into(),
                            source: e,
                        },
                    )
                })?
                .into_temp_path();
            client
                .get_blob_to_file(r, d, &tmp)
                .await
                .map_err(registry_err(
                    format!("base layer {}", d.digest),
                    r.to_string(),
                ))?;
            Ok(LocalFile::Temp(tmp))
        }
    }
}

enum LocalFile {
    Borrowed(PathBuf),
    Temp(tempfile::TempPath),
}

impl LocalFile {
    fn path(&self) -> &Path {
        match self {
            LocalFile::Borrowed(p) => p,
            LocalFile::Temp(t) => t,
        }
    }
}

impl Publisher for RegistryPublisher {
    async fn publish(&self, input: PublishInput<'_>) -> Result<Published, Error> {
        let target = self.target.to_string();
        let mut scopes = vec![Scope::push(&self.target.repository)];
        scopes.extend(self.mount_source(input.base).map(|r| Scope::pull(&r)));
        self.client
            .authorize(&self.target.registry, &scopes)
            .await
            .map_err(|source| Error::Authorize {
                target: target.clone(),
                source: Box::new(source),
            })?;
        // Collected first: a mapping closure inside the stream trips rustc's higher-ranked
        // lifetime inference for `Send` futures.
        let pushes: Vec<_> = input
            .layers
            .iter()
            .map(|b| self.push_layer(b, input))
            .collect();
        let mut blobs: Vec<BlobReport> = stream::iter(pushes)
            .buffer_unordered(self.jobs.max(1))
            .try_collect()
            .await?;
        let config = &input.image.config;
        let outcome = self
            .client
            .push_blob(
                &self.target,
                &config.descriptor(),
                BlobSource::Bytes(config.bytes.clone().into()),
                None,
            )
            .await
            .map_err(registry_err(
                format!("config {}", config.digest),
                target.clone(),
            ))?;
        let (outcome, bytes_sent) = match outcome {
            BlobOutcome::Uploaded { bytes_sent } => (Outcome::Uploaded, bytes_sent),
            _ => (Outcome::Existed, 0),
        };
        blobs.push(BlobReport {
            digest: config.digest.clone(),
            size: config.bytes.len() as u64,
            role: Role::Config,
            outcome,
            bytes_sent,
        });
        let manifest = &input.image.manifest;
        let destination = match &self.target.tag {
            Some(_) => self.target.clone(),
            None => self.target.with_digest(manifest.digest.clone()),
        };
        self.client
            .put_manifest(&destination, manifest)
            .await
            .map_err(registry_err(
                format!("manifest {}", manifest.digest),
                target.clone(),
            ))?;
        let size = manifest.bytes.len() as u64;
        blobs.push(BlobReport {
            digest: manifest.digest.clone(),
            size,
            role: Role::Manifest,
            outcome: Outcome::Uploaded,
            bytes_sent: size,
        });
        tracing::info!(digest = %manifest.digest, "pushed manifest");
        Ok(Published {
            reference: format!("{}@{}", self.target.repository_path(), manifest.digest),
            digest: manifest.digest.clone(),
            blobs,
        })
    }
}

/// Publishes into an OCI image layout under a name.
#[derive(Clone, Debug)]
pub struct LayoutPublisher {
    /// Fetches base layers.
    pub client: Client,
    /// The layout directory.
    pub dir: PathBuf,
    /// The image name in the layout.
    pub name: String,
    /// Concurrent downloads.
    pub jobs: usize,
}

impl LayoutPublisher {
    async fn write_layer(
        &self,
        layout: &Layout,
        blob: &BlobPlan,
        input: PublishInput<'_>,
    ) -> Result<BlobReport, Error> {
        let d = &blob.descriptor;
        let lerr = |e| Error::Layout(self.dir.display().to_string(), e);
        let mut report = BlobReport {
            digest: d.digest.clone(),
            size: d.size,
            role: blob.role,
            outcome: Outcome::Existed,
            bytes_sent: 0,
        };
        if layout.has_blob(&d.digest, d.size) {
            return Ok(report);
        }
        match (&blob.local, input.base.map(|b| &b.location)) {
            (Some(path), _) => layout.import_blob(path, &d.digest).map_err(lerr)?,
            (None, None) => return Err(Error::MissingLayer(d.digest.clone())),
            (None, Some(BaseLocation::Layout(base))) => layout
                .import_blob(&base.blob_path(&d.digest), &d.digest)
                .map_err(lerr)?,
            (None, Some(BaseLocation::Registry(r))) => {
                self.client
                    .get_blob_to_file(r, d, &layout.blob_path(&d.digest))
                    .await
                    .map_err(registry_err(
                        format!("base layer {}", d.digest),
                        r.to_string(),
                    ))?;
            }
        }
        report.outcome = Outcome::Written;
        report.bytes_sent = d.size;
        Ok(report)
    }
}

impl Publisher for LayoutPublisher {
    async fn publish(&self, input: PublishInput<'_>) -> Result<Published, Error> {
        let lerr = |e| Error::Layout(self.dir.display().to_string(), e);
        let layout = Layout::create(&self.dir).map_err(lerr)?;
        let writes: Vec<_> = input
            .layers
            .iter()
            .map(|b| self.write_layer(&layout, b, input))
            .collect();
        let mut blobs: Vec<BlobReport> = stream::iter(writes)
            .buffer_unordered(self.jobs.max(1))
            .try_collect()
            .await?;
        for (doc, role) in [
            (&input.image.config, Role::Config),
            (&input.image.manifest, Role::Manifest),
        ] {
            layout.write_blob(&doc.bytes).map_err(lerr)?;
            let size = doc.bytes.len() as u64;
            blobs.push(BlobReport {
                digest: doc.digest.clone(),
                size,
                role,
                outcome: Outcome::Written,
                bytes_sent: size,
            });
        }
        layout
            .set_ref(input.image.manifest.descriptor(), &self.name)
            .map_err(lerr)?;
        // stdout has the digest form; this is the name that follows the tag.
        tracing::info!(
            name = %format!("oci:{}:{}", self.dir.display(), self.name),
            "wrote the image into the layout; `kiln run` and skopeo accept this name"
        );
        Ok(Published {
            reference: format!("oci:{}@{}", self.dir.display(), input.image.manifest.digest),
            digest: input.image.manifest.digest.clone(),
            blobs,
        })
    }
}
