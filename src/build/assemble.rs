//! Assembling and publishing a build's image: the dependency layer (however it was made),
//! the source layer written here, both appended to the base with the runtime's config, then
//! every blob to the registry or OCI layout, the manifest last.

use std::path::PathBuf;

use super::cache::LayerCache;
use super::error::Error;
use super::function::Function;
use super::options::{Options, Target};
use super::plan;
use super::publish::{
    BlobPlan, LayoutPublisher, PublishInput, Published, Publisher, RegistryPublisher, Role,
};
use crate::image::resolve::{BaseRef, ResolvedBase};
use crate::oci::{self, Digest, Image, LayerBlob, NewLayer, layer::write_layer};
use crate::registry::Client;

/// The dependency layer of a build, wherever it came from.
pub(super) struct DepLayer {
    pub key: Digest,
    /// What installed it, as its key names it (`None` from a stage record without it).
    pub toolchain: Option<String>,
    pub digest: Digest,
    pub diff_id: Digest,
    pub size: u64,
    pub created_by: String,
    /// The blob's bytes, when they are local.
    pub local: Option<PathBuf>,
    /// The cache repository holding the blob, when it is not local (mounted into the target).
    pub remote: Option<crate::registry::Reference>,
    /// Keeps a verified copy of a staged blob alive until it is published.
    pub _copy: Option<tempfile::TempPath>,
    /// Keeps `kiln cache prune` from removing the cached blob until it is published.
    pub _in_use: crate::inuse::InUse,
}

/// The image's config edit and image key: known once the source layer is written and the
/// dependency key computed, before anything is installed or uploaded.
pub(super) struct Planned {
    pub image_key: Digest,
    edit: oci::ConfigEdit,
    source_created_by: String,
}

pub(super) fn plan(
    opts: &Options,
    function: &Function,
    base: &ResolvedBase,
    deps: Option<(&Digest, Option<&str>)>,
    source: &LayerBlob,
) -> Planned {
    let source_created_by = format!(
        "{}{} files to {})",
        plan::SOURCE_HISTORY,
        function.tree.file_count(),
        opts.runtime.source.dir
    );
    let edit = plan::config_edit(&plan::PlanInput {
        runtime: &opts.runtime,
        function_name: &function.name,
        namespace: &function.namespace,
        epoch: opts.epoch,
        base_name: match &opts.base {
            BaseRef::Registry(_) => Some(&opts.base_name),
            BaseRef::Layout { .. } => None,
        },
        base_digest: &base.base.manifest.digest,
        deps_toolchain: deps.and_then(|(_, toolchain)| toolchain),
    });
    let layers = plan::KeyLayers {
        runtime: &opts.runtime.name,
        base: &base.base.manifest.digest,
        deps: deps.map(|(key, _)| key),
        source_diff_id: &source.diff_id,
        source_created_by: &source_created_by,
        compression: opts.compression,
    };
    let image_key = plan::image_key(&layers, &edit);
    Planned {
        edit: plan::with_image_key(edit, &image_key),
        image_key,
        source_created_by,
    }
}

/// Appends the dependency layer and the source layer to the base, with the planned config.
pub(super) fn assemble(
    base: &ResolvedBase,
    deps: Option<&DepLayer>,
    source: LayerBlob,
    planned: Planned,
) -> Result<Assembled, Error> {
    let mut layers = Vec::new();
    let mut plans = Vec::new();
    if let Some(dep) = deps {
        // Compressed as the source layer is (`--compression`), typed in the base's family.
        let media_type = source.descriptor.media_type.clone();
        let descriptor = oci::Descriptor::new(media_type, dep.digest.clone(), dep.size);
        plans.push(BlobPlan {
            descriptor: descriptor.clone(),
            role: Role::Dependencies,
            local: dep.local.clone(),
            remote: dep.remote.clone(),
        });
        layers.push(NewLayer {
            descriptor,
            diff_id: dep.diff_id.clone(),
            created_by: dep.created_by.clone(),
        });
    }
    plans.push(BlobPlan {
        descriptor: source.descriptor.clone(),
        role: Role::Source,
        local: Some(source.file.to_path_buf()),
        remote: None,
    });
    layers.push(NewLayer {
        descriptor: source.descriptor.clone(),
        diff_id: source.diff_id.clone(),
        created_by: planned.source_created_by,
    });
    let image = oci::image::append(&base.base, &layers, &planned.edit)?;
    Ok(Assembled {
        image,
        plans,
        _source: source,
    })
}

/// An image ready to publish.
pub(super) struct Assembled {
    pub image: Image,
    pub plans: Vec<BlobPlan>,
    /// The source layer's temp file, which must outlive the publish.
    _source: LayerBlob,
}

/// Writes the source layer.
pub(super) async fn source_layer(
    opts: &Options,
    cache: &LayerCache,
    function: &Function,
    media_type: oci::MediaType,
) -> Result<LayerBlob, Error> {
    let entries = function.tree.to_layer_entries(&opts.runtime.source.dir);
    let (epoch, tmp) = (opts.epoch, cache.tmp_dir());
    let blob = tokio::task::spawn_blocking(move || write_layer(entries, epoch, media_type, &tmp))
        .await?
        .map_err(|source| Error::Layer {
            what: "source",
            source,
        })?;
    tracing::info!(
        digest = %blob.descriptor.digest,
        size = blob.descriptor.size,
        "wrote source layer",
    );
    Ok(blob)
}

pub(super) async fn publish(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    image: &Image,
    base: &ResolvedBase,
    new: Vec<BlobPlan>,
    image_key: &Digest,
) -> Result<Published, Error> {
    let base_layers = image.layers.len() - new.len();
    let mut layers: Vec<BlobPlan> = image.layers[..base_layers]
        .iter()
        .map(|d| BlobPlan {
            descriptor: d.clone(),
            role: Role::Base,
            local: None,
            remote: None,
        })
        .collect();
    layers.extend(new);
    let scratch = cache.tmp_dir();
    let input = PublishInput {
        image,
        layers: &layers,
        base: Some(base),
        scratch: &scratch,
    };
    let published = match &opts.target {
        Target::Registry(target) => {
            RegistryPublisher {
                client: client.clone(),
                target: target.clone(),
                key_tag: opts.tag_by_key.then(|| plan::key_tag(image_key)),
                pushed: Some(super::pushed::PushedBlobs::new(&opts.cache_dir, target)),
                jobs: opts.jobs,
            }
            .publish(input)
            .await?
        }
        Target::Layout { dir, name } => {
            LayoutPublisher {
                client: client.clone(),
                dir: dir.clone(),
                name: name.clone(),
                jobs: opts.jobs,
            }
            .publish(input)
            .await?
        }
    };
    Ok(published)
}
