//! Publishing into an OCI image layout: every blob written (base layers imported from a
//! layout base or downloaded and verified), the config and manifest, then the name.

use futures_util::{StreamExt, TryStreamExt, stream};

use super::{
    BlobPlan, BlobReport, Error, Outcome, PublishInput, Published, Publisher, Role, registry_err,
};
use crate::image::resolve::BaseLocation;
use crate::oci::Layout;
use crate::progress::steps::Step;
use crate::registry::Client;
use std::path::PathBuf;

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

/// Copies the blob at `from` into `layout`, checking its digest, on the blocking pool: a
/// dependency layer can be hundreds of megabytes, and the layer downloads beside it go on.
async fn import(
    layout: &Layout,
    from: PathBuf,
    d: &crate::oci::Descriptor,
) -> Result<(), crate::oci::layout::Error> {
    let (layout, digest) = (layout.clone(), d.digest.clone());
    let path = from.clone();
    tokio::task::spawn_blocking(move || layout.import_blob(&from, &digest))
        .await
        .unwrap_or_else(|e| {
            Err(crate::oci::layout::Error::Io(crate::io_error::IoError {
                action: "importing",
                path,
                source: std::io::Error::other(e),
            }))
        })
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
            (Some(path), _) => import(layout, path.clone(), d).await.map_err(lerr)?,
            (None, _) if blob.remote.is_some() => {
                let from = blob
                    .remote
                    .as_ref()
                    .ok_or_else(|| Error::MissingLayer(d.digest.clone()))?;
                self.client
                    .get_blob_to_file(from, d, &layout.blob_path(&d.digest))
                    .await
                    .map_err(registry_err(
                        format!("layer {}", d.digest),
                        from.to_string(),
                    ))?;
            }
            (None, None) => return Err(Error::MissingLayer(d.digest.clone())),
            (None, Some(BaseLocation::Layout(base))) => {
                import(layout, base.blob_path(&d.digest), d)
                    .await
                    .map_err(lerr)?;
            }
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
        let step = Step::start("write layout");
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
        step.done(super::counts(&blobs));
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
