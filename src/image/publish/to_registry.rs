//! Publishing to a registry repository: every layer HEAD → mount → upload, `jobs` at a time,
//! the config beside them, and the manifest last, only once every blob is there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use futures_util::{StreamExt, TryStreamExt, stream};

use super::{
    BlobPlan, BlobReport, Error, Outcome, PublishInput, Published, Publisher, Role, counts,
    registry_err,
};
use crate::image::resolve::{BaseLocation, ResolvedBase};
use crate::oci::{self, Descriptor, Digest};
use crate::progress::steps::{self, Step};
use crate::registry::{BlobOutcome, BlobSource, Client, Reference, Scope};

/// Publishes to a registry repository.
#[derive(Clone, Debug)]
pub struct RegistryPublisher {
    /// The client.
    pub client: Client,
    /// The destination (tag optional).
    pub target: Reference,
    /// `--tag-by-key`: the build key's tag, pushed before the target's own tag.
    pub key_tag: Option<String>,
    /// The record of blobs this machine pushed to the target repository, whose `HEAD`s are
    /// skipped; `None` checks every blob.
    pub pushed: Option<crate::image::pushed::PushedBlobs>,
    /// Concurrent blob pushes.
    pub jobs: usize,
}

/// Where a manifest pushed to `target` goes, in order: `key_tag`, then the target's tag; the
/// digest alone when there is no tag.
///
/// # Errors
/// A key tag that is not a valid tag.
pub fn manifest_destinations(
    target: &Reference,
    key_tag: Option<&str>,
    digest: &Digest,
) -> Result<Vec<Reference>, Error> {
    let mut out = Vec::new();
    if let Some(tag) = key_tag {
        out.push(
            target
                .with_tag(tag)
                .map_err(registry_err(format!("tag {tag}"), target.to_string()))?,
        );
    }
    if target.tag.is_some() {
        out.push(target.clone());
    }
    if out.is_empty() {
        out.push(target.with_digest(digest.clone()));
    }
    Ok(out)
}

impl RegistryPublisher {
    fn manifest_destinations(&self, digest: &Digest) -> Result<Vec<Reference>, Error> {
        manifest_destinations(&self.target, self.key_tag.as_deref(), digest)
    }

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
        known: &BTreeSet<Digest>,
    ) -> Result<BlobReport, Error> {
        let d = &blob.descriptor;
        let err = registry_err(format!("blob {}", d.digest), self.target.to_string());
        let report = |outcome| report(blob, outcome);
        if known.contains(&d.digest) {
            tracing::debug!(digest = %d.digest, "pushed to this repository before: not checked");
            return Ok(report(BlobOutcome::Existed));
        }
        // The source layer is new in every build that gets this far: no HEAD first.
        if blob.role == Role::Source
            && let Some(path) = &blob.local
        {
            let outcome = self
                .client
                .push_new_blob(&self.target, d, BlobSource::File(path.clone()))
                .await
                .map_err(&err)?;
            return Ok(report(outcome));
        }
        // Bytes already on disk (ours, or a layout base's): push_blob checks, then uploads.
        let on_disk = match (&blob.local, &blob.remote) {
            (Some(path), _) => Some(path.clone()),
            (None, Some(_)) => None,
            (None, None) => match input.base.map(|b| &b.location) {
                Some(BaseLocation::Layout(layout)) => Some(layout.blob_path(&d.digest)),
                _ => None,
            },
        };
        if let Some(path) = on_disk {
            let outcome = self
                .client
                .push_blob(&self.target, d, BlobSource::File(path), None)
                .await
                .map_err(&err)?;
            return Ok(report(outcome));
        }
        self.push_remote_layer(blob, input).await.map(report)
    }

    /// A layer whose bytes are elsewhere (the base's or a cache repository's): there
    /// already, mounted across repositories, or copied through a verified local file.
    async fn push_remote_layer(
        &self,
        blob: &BlobPlan,
        input: PublishInput<'_>,
    ) -> Result<BlobOutcome, Error> {
        let d = &blob.descriptor;
        let err = registry_err(format!("blob {}", d.digest), self.target.to_string());
        if self
            .client
            .blob_exists(&self.target, &d.digest)
            .await
            .map_err(&err)?
            .is_some()
        {
            return Ok(BlobOutcome::Existed);
        }
        let mount_from = match &blob.remote {
            Some(r) => (r.registry == self.target.registry).then(|| r.repository.clone()),
            None => self.mount_source(input.base),
        };
        if let Some(from) = mount_from
            && self
                .client
                .mount_blob(&self.target, &d.digest, &from)
                .await
                .map_err(&err)?
        {
            return Ok(BlobOutcome::Mounted);
        }
        // The base (or cache repository) lives on another registry or refused the mount:
        // copy the layer through a verified local file.
        let file = match &blob.remote {
            Some(r) => download(&self.client, r, d, input.scratch).await?,
            None => fetch_base_layer(&self.client, input.base, d, input.scratch).await?,
        };
        self.client
            .push_blob(
                &self.target,
                d,
                BlobSource::File(file.path().to_path_buf()),
                None,
            )
            .await
            .map_err(&err)
    }
}

/// What happened to `blob`, logged and reported.
fn report(blob: &BlobPlan, outcome: BlobOutcome) -> BlobReport {
    let d = &blob.descriptor;
    let (outcome, bytes_sent) = match outcome {
        BlobOutcome::Existed => (Outcome::Existed, 0),
        BlobOutcome::Mounted => (Outcome::Mounted, 0),
        BlobOutcome::Uploaded { bytes_sent } => (Outcome::Uploaded, bytes_sent),
    };
    tracing::info!(
        digest = %d.digest,
        size = d.size,
        role = ?blob.role,
        ?outcome,
        bytes_sent,
        "blob",
    );
    BlobReport {
        digest: d.digest.clone(),
        size: d.size,
        role: blob.role,
        outcome,
        bytes_sent,
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
            tracing::warn!(
                digest = %d.digest,
                from = %r,
                "downloading base layer: it cannot be mounted",
            );
            download(client, r, d, scratch).await
        }
    }
}

/// A verified download of blob `d` from `from` into a temporary file in `scratch`.
async fn download(
    client: &Client,
    from: &Reference,
    d: &Descriptor,
    scratch: &Path,
) -> Result<LocalFile, Error> {
    let tmp = tempfile::Builder::new()
        .prefix(".blob-")
        .tempfile_in(scratch)
        .map_err(|e| {
            Error::Layout(
                scratch.display().to_string(),
                oci::layout::Error::Io(crate::io_error::IoError {
                    action: "creating a file in",
                    path: scratch.into(),
                    source: e,
                }),
            )
        })?
        .into_temp_path();
    client
        .get_blob_to_file(from, d, &tmp)
        .await
        .map_err(registry_err(
            format!("layer {}", d.digest),
            from.to_string(),
        ))?;
    Ok(LocalFile::Temp(tmp))
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

impl RegistryPublisher {
    /// Every layer, `jobs` at a time; those in `known` are not checked.
    async fn push_layers(
        &self,
        input: PublishInput<'_>,
        known: &BTreeSet<Digest>,
    ) -> Result<Vec<BlobReport>, Error> {
        // Collected first: a mapping closure inside the stream trips rustc's higher-ranked
        // lifetime inference for `Send` futures.
        let pushes: Vec<_> = input
            .layers
            .iter()
            .map(|b| self.push_layer(b, input, known))
            .collect();
        stream::iter(pushes)
            .buffer_unordered(self.jobs.max(1))
            .try_collect()
            .await
    }
}

impl RegistryPublisher {
    /// Logs the bytes sent every few seconds while the blobs are pushed.
    fn progress(&self, input: PublishInput<'_>) -> crate::progress::Ticker {
        let client = self.client.clone();
        let before = client.traffic().bytes_sent;
        let at_most: u64 = input.layers.iter().map(|b| b.descriptor.size).sum();
        let target = self.target.repository_path();
        let sent = move || client.traffic().bytes_sent.saturating_sub(before);
        let show = crate::progress::Show::Bytes {
            label: format!("pushing to {target}"),
            done: Box::new({
                let sent = sent.clone();
                move || (sent(), Some(at_most))
            }),
        };
        crate::progress::Ticker::start(crate::progress::PERIOD, show, move |elapsed| {
            let sent = sent();
            tracing::info!(
                target,
                sent = crate::progress::megabytes(sent),
                layers = crate::progress::megabytes(at_most),
                elapsed_s = elapsed.as_secs(),
                "pushing blobs"
            );
        })
    }
}

impl RegistryPublisher {
    /// The manifest, to each of its destinations. When `known` named a blob the repository
    /// lost, the registry refuses it: every layer is then checked (and `blobs` replaced by
    /// what that found) before it goes up again.
    async fn put_manifest(
        &self,
        input: PublishInput<'_>,
        known: &mut BTreeSet<Digest>,
        blobs: &mut Vec<BlobReport>,
    ) -> Result<(), Error> {
        let manifest = &input.image.manifest;
        for destination in self.manifest_destinations(&manifest.digest)? {
            let err = registry_err(
                format!("manifest {}", manifest.digest),
                destination.to_string(),
            );
            let trusted = input
                .layers
                .iter()
                .any(|b| known.contains(&b.descriptor.digest));
            match self
                .client
                .put_manifest_with(&destination, manifest, !trusted)
                .await
            {
                Ok(_) => {}
                Err(e) if trusted && e.is_blob_unknown() => {
                    // The record named a blob the repository lost: check every blob.
                    tracing::warn!(
                        repository = %self.target.repository_path(),
                        "a blob pushed here before is gone; checking every blob",
                    );
                    if let Some(p) = &self.pushed {
                        p.forget();
                    }
                    known.clear();
                    let checked = self.push_layers(input, known).await?;
                    blobs.retain(|b| b.role == Role::Config);
                    blobs.splice(0..0, checked);
                    self.client
                        .put_manifest(&destination, manifest)
                        .await
                        .map_err(err)?;
                }
                Err(e) => return Err(err(e)),
            }
        }
        Ok(())
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
        let mut known = self.pushed.as_ref().map(|p| p.load()).unwrap_or_default();
        let step = Step::start("push");
        let progress = self.progress(input);
        let config = &input.image.config;
        // A config is new in every build that gets this far: no HEAD first. It goes up
        // alongside the layers (a source-only build waits for one upload instead of two),
        // unless `--jobs 1` asks for one transfer at a time; only the manifest must wait
        // for all of them.
        let config_push = async {
            self.client
                .push_new_blob(
                    &self.target,
                    &config.descriptor(),
                    BlobSource::Bytes(config.bytes.clone().into()),
                )
                .await
                .map_err(registry_err(
                    format!("config {}", config.digest),
                    target.clone(),
                ))
        };
        let (mut blobs, outcome) = if self.jobs > 1 {
            futures_util::try_join!(self.push_layers(input, &known), config_push)?
        } else {
            (self.push_layers(input, &known).await?, config_push.await?)
        };
        // The blobs are up: a slow manifest PUT is not "pushing blobs".
        drop(progress);
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
        step.done(counts(&blobs));
        let manifest = &input.image.manifest;
        let step = Step::start("manifest");
        self.put_manifest(input, &mut known, &mut blobs).await?;
        step.done(steps::short_digest(&manifest.digest));
        if let Some(p) = &self.pushed {
            p.record(
                input
                    .layers
                    .iter()
                    .map(|b| &b.descriptor.digest)
                    .chain([&config.digest]),
            );
        }
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
