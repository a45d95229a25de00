//! Building a Function image: the only module that uses `oci`, `registry` and `runtime`
//! together. [`run`] checks the Function, resolves the base, installs dependencies (or takes
//! the layer from the cache), writes the source layer, appends both to the base and publishes.

pub mod base;
pub mod cache;
pub mod deps;
pub mod function;
pub mod plan;
pub mod publish;
pub mod source;

use std::path::PathBuf;

use tracing::Instrument;

use crate::oci::{self, Digest, Image, LayerBlob, NewLayer, Platform, layer::write_layer};
use crate::registry::{Client, Reference};
use crate::runtime::RuntimeSpec;
use base::{BaseRef, ResolvedBase};
use cache::LayerCache;
use deps::InstallEnv;
use function::{Function, FunctionManifest};
use publish::{
    BlobPlan, LayoutPublisher, PublishInput, Published, Publisher, RegistryPublisher, Role,
};

/// Where the Function comes from.
#[derive(Clone, Debug)]
pub enum FunctionSpec {
    /// A directory.
    Dir(PathBuf),
    /// A Kyma Function manifest with inline source.
    Manifest(FunctionManifest),
}

/// Where the image goes.
#[derive(Clone, Debug)]
pub enum Target {
    /// A registry repository, tag optional.
    Registry(Reference),
    /// An OCI layout directory and the image name in it.
    Layout {
        /// The directory.
        dir: PathBuf,
        /// The name.
        name: String,
    },
}

/// A fully validated build request. Built by `cli`; nothing here reads the environment.
#[derive(Clone, Debug)]
pub struct Options {
    /// The Function.
    pub function: FunctionSpec,
    /// The runtime.
    pub runtime: RuntimeSpec,
    /// `FUNC_NAME`.
    pub name: String,
    /// `SERVICE_NAMESPACE`.
    pub namespace: String,
    /// The base image.
    pub base: BaseRef,
    /// The base image as the user wrote it.
    pub base_name: String,
    /// The platform to pick from a multi-platform base.
    pub platform: Platform,
    /// The destination.
    pub target: Target,
    /// `SOURCE_DATE_EPOCH`.
    pub epoch: u64,
    /// The cache directory (dependency layers, package caches, scratch).
    pub cache_dir: PathBuf,
    /// Whether to reuse cached dependency layers.
    pub use_cache: bool,
    /// Parallel blob transfers.
    pub jobs: usize,
    /// The install's environment.
    pub install: InstallEnv,
}

/// A finished build.
#[derive(Debug)]
pub struct Output {
    /// Where it went and what each blob did.
    pub published: Published,
    /// The build key label.
    pub build_key: Digest,
    /// The image documents.
    pub image: Image,
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Function itself is wrong: fix the input.
    #[error(transparent)]
    Function(#[from] function::Error),
    /// The base image.
    #[error(transparent)]
    Base(#[from] base::Error),
    /// The dependency install.
    #[error("installing dependencies")]
    Install(#[from] deps::Error),
    /// Writing a layer.
    #[error("writing the {what} layer")]
    Layer {
        /// Which layer.
        what: &'static str,
        /// The cause.
        #[source]
        source: oci::layer::Error,
    },
    /// Assembling the image.
    #[error(transparent)]
    Image(#[from] oci::image::Error),
    /// Publishing.
    #[error(transparent)]
    Publish(#[from] publish::Error),
    /// The cache directory.
    #[error("using the cache directory {path}")]
    Cache {
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Dependencies to install in a sandbox, but no builder image that matches the base.
    #[error(
        "--deps-sandbox {sandbox} needs --builder-image REF to install the dependencies: the base {base} is not the {runtime} runtime's own, so kiln cannot know which toolchain matches it; pass --builder-image REF (the builder image that matches the base; `kiln base build {runtime}` makes one), or --deps-sandbox none to install with the toolchain on PATH (its version is checked)"
    )]
    NoBuilder {
        /// The `--deps-sandbox` mode.
        sandbox: &'static str,
        /// The base image as the user wrote it.
        base: String,
        /// The runtime.
        runtime: String,
    },
    /// Preparing the builder image for the install.
    #[error("preparing the builder image for the dependency install")]
    Builder(#[from] Box<crate::run::Error>),
    /// A worker thread died.
    #[error("internal task failed")]
    Task(#[from] tokio::task::JoinError),
}

impl Error {
    /// Whether the user's input is at fault (exit code 2) rather than the build (exit 1).
    pub fn is_input_error(&self) -> bool {
        matches!(self, Error::Function(_) | Error::NoBuilder { .. })
    }
}

/// Builds and publishes the image described by `opts`.
///
/// # Errors
/// See [`Error`]; nothing is published unless every step before succeeded, and the manifest
/// goes last.
pub async fn run(client: &Client, opts: &Options) -> Result<Output, Error> {
    let span = tracing::info_span!("build", function = %opts.name, runtime = %opts.runtime.name);
    async move {
        let cache = LayerCache::open(&opts.cache_dir).map_err(|source| Error::Cache { path: opts.cache_dir.clone(), source })?;
        let function = load_function(opts).await?;
        tracing::info!(files = function.tree.file_count(), "collected source");
        if function.deps.is_some() {
            // Before anything is fetched: a usage error should not wait for the network.
            require_builder(opts)?;
        }
        let base = base::resolve(client, &opts.base, &opts.base_name, &opts.platform).await?;
        tracing::info!(base = %opts.base_name, digest = %base.base.manifest.digest, "resolved base image");
        let family = base.base.family();
        let mut layers = Vec::new();
        let mut plans = Vec::new();
        let deps = match &function.deps {
            Some(inputs) => Some(dependency_layer(client, opts, &cache, inputs).await?),
            None => None,
        };
        if let Some((key, cached)) = &deps {
            let descriptor = oci::Descriptor::new(family.layer_gzip(), cached.digest.clone(), cached.size);
            plans.push(BlobPlan { descriptor: descriptor.clone(), role: Role::Dependencies, local: Some(cache.blob_path(&cached.digest)) });
            let created_by = format!("kiln: dependencies ({}, key {})", opts.runtime.install_command(inputs_locked(&function)).join(" "), key);
            layers.push(NewLayer { descriptor, diff_id: cached.diff_id.clone(), created_by });
        }
        let source = source_layer(opts, &cache, &function, family.layer_gzip()).await?;
        plans.push(BlobPlan { descriptor: source.descriptor.clone(), role: Role::Source, local: Some(source.file.to_path_buf()) });
        layers.push(NewLayer {
            descriptor: source.descriptor.clone(),
            diff_id: source.diff_id.clone(),
            created_by: format!("kiln: source ({} files to {})", function.tree.file_count(), opts.runtime.source.dir),
        });
        let build_key = plan::build_key(&opts.runtime.name, &base.base.manifest.digest, deps.as_ref().map(|(k, _)| k), &source.diff_id);
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
            build_key: &build_key,
        });
        let image = oci::image::append(&base.base, &layers, &edit)?;
        let published = publish(client, opts, &cache, &image, &base, plans).await?;
        tracing::info!(reference = %published.reference, "built");
        Ok(Output { published, build_key, image })
    }
    .instrument(span)
    .await
}

fn inputs_locked(function: &Function) -> bool {
    function.deps.as_ref().is_some_and(|d| d.lock.is_some())
}

async fn load_function(opts: &Options) -> Result<Function, Error> {
    let opts = opts.clone();
    let f = tokio::task::spawn_blocking(move || match &opts.function {
        FunctionSpec::Dir(dir) => function::from_dir(
            dir,
            &opts.runtime,
            opts.name.clone(),
            opts.namespace.clone(),
        ),
        FunctionSpec::Manifest(m) => {
            function::from_manifest(m, &opts.runtime, opts.namespace.clone())
        }
    })
    .await??;
    Ok(f)
}

/// Refuses a sandboxed install without a builder image: the user must name one (or ask for
/// the toolchain on PATH), since nothing says which toolchain matches an overridden base.
fn require_builder(opts: &Options) -> Result<(), Error> {
    match &opts.install.isolation {
        deps::Isolation::MissingBuilder { sandbox } => Err(Error::NoBuilder {
            sandbox,
            base: opts.base_name.clone(),
            runtime: opts.runtime.name.clone(),
        }),
        _ => Ok(()),
    }
}

/// Unpacks a pending builder image (once, verified, cached by digest) into the root
/// filesystem the install runs in.
async fn resolve_builder(client: &Client, opts: &Options) -> Result<InstallEnv, Error> {
    let deps::Isolation::Pending(image) = &opts.install.isolation else {
        return Ok(opts.install.clone());
    };
    let run_opts = crate::run::Options {
        image: image.clone(),
        platform: opts.platform.clone(),
        cache_dir: opts.cache_dir.clone(),
        env: vec![],
        args: None,
        entrypoint: None,
        user: None,
        jobs: opts.jobs,
    };
    let entry = crate::run::prepare(client, &run_opts)
        .await
        .map_err(Box::new)?;
    let env = entry
        .config
        .config
        .as_ref()
        .map(|c| c.env_pairs())
        .unwrap_or_default();
    tracing::info!(builder = %entry.digest, "dependencies install inside the builder image");
    let isolation = deps::Isolation::Builder {
        rootfs: entry.rootfs,
        digest: entry.digest,
        env,
    };
    Ok(InstallEnv {
        isolation,
        ..opts.install.clone()
    })
}

async fn dependency_layer(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    inputs: &function::DepInputs,
) -> Result<(Digest, cache::CachedLayer), Error> {
    let scratch = tempfile::tempdir_in(cache.tmp_dir()).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })?;
    // A pending builder is only unpacked for an install: its digest alone names the toolchain,
    // so a cache hit needs neither the sandbox nor the builder's layers.
    let (toolchain, mut install) = match &opts.install.isolation {
        deps::Isolation::Pending(image) => {
            let resolved = crate::run::image::resolve(client, image, &opts.platform)
                .await
                .map_err(Box::new)?;
            (deps::builder_toolchain_id(&resolved.digest), None)
        }
        _ => {
            let install = opts.install.clone();
            let id = deps::toolchain_id(&opts.runtime, &install, scratch.path()).await?;
            (id, Some(install))
        }
    };
    let key = deps::cache_key(&opts.runtime, &toolchain, inputs, opts.epoch);
    if opts.use_cache
        && let Some(hit) = cache.get(&key)
    {
        tracing::info!(%key, digest = %hit.digest, "dependency layer from cache");
        return Ok((key, hit));
    }
    let install = match install.take() {
        Some(install) => install,
        None => resolve_builder(client, opts).await?,
    };
    let output = deps::install(&opts.runtime, inputs, &install, scratch.path()).await?;
    let (dest, tmp, epoch) = (
        opts.runtime.dependencies.dir.clone(),
        cache.tmp_dir(),
        opts.epoch,
    );
    let blob = tokio::task::spawn_blocking(move || -> Result<LayerBlob, Error> {
        let tree =
            source::walk(&output, &source::WalkRules::default()).map_err(function::Error::from)?;
        write_layer(
            tree.to_layer_entries(&dest),
            epoch,
            oci::MediaType::OciLayerGzip,
            &tmp,
        )
        .map_err(|source| Error::Layer {
            what: "dependency",
            source,
        })
    });
    let blob = blob.await??;
    tracing::info!(%key, digest = %blob.descriptor.digest, size = blob.descriptor.size, "wrote dependency layer");
    let cached = cache.put(&key, blob).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })?;
    Ok((key, cached))
}

async fn source_layer(
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
    tracing::info!(digest = %blob.descriptor.digest, size = blob.descriptor.size, "wrote source layer");
    Ok(blob)
}

async fn publish(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    image: &Image,
    base: &ResolvedBase,
    new: Vec<BlobPlan>,
) -> Result<Published, Error> {
    let base_layers = image.layers.len() - new.len();
    let mut layers: Vec<BlobPlan> = image.layers[..base_layers]
        .iter()
        .map(|d| BlobPlan {
            descriptor: d.clone(),
            role: Role::Base,
            local: None,
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
