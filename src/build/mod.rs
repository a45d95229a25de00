//! Building a Function image: the only module that uses `oci`, `registry` and `runtime`
//! together. [`run`] checks the Function, resolves the base, installs dependencies (or takes
//! the layer from the cache, or from a `--stage deps` run), writes the source layer, appends
//! both to the base and publishes; [`run_deps`] is a split build's first half.

mod assemble;
pub mod cache;
pub mod deps;
pub mod egress;
pub mod existing;
pub mod function;
mod install;
mod load;
pub mod lockfile;
pub mod mask;
pub mod memtree;
pub(crate) mod pep440;
pub mod pinned;
pub mod plan;
pub mod remote_cache;
mod split;
pub mod stage;
mod warm;

use std::path::{Path, PathBuf};

use tracing::Instrument;

use crate::image::resolve::{self, BaseRef};
use crate::image::{publish, pushed};
use crate::oci::{self, Digest, Image, Platform, source};
use crate::registry::{Client, Reference};
use crate::runtime::RuntimeSpec;
use assemble::DepLayer;
use cache::LayerCache;
use deps::InstallEnv;
use function::{Function, FunctionManifest};
pub use load::run_source;
use publish::Published;
pub use split::run_lookup;
use split::{lookup_hit, staged_layer};
pub use warm::{Warmed, warm_deps};

/// Where the Function comes from.
#[derive(Clone, Debug)]
pub enum FunctionSpec {
    /// A directory.
    Dir(PathBuf),
    /// A Kyma Function manifest with inline source.
    Manifest(FunctionManifest),
    /// A directory of a git repository, fetched by kiln.
    Git {
        /// The repository, reference and base directory.
        source: crate::git::Source,
        /// Credentials, CA and timeout.
        access: crate::git::Access,
    },
}

/// Which part of a build to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The whole build.
    All,
    /// Only the dependency install, into this stage directory ([`run_deps`]).
    Deps(PathBuf),
    /// Everything but the install, with the dependency layer from this stage directory.
    Publish(PathBuf),
    /// Only the dependency key and its cache repository entry, into this lookup directory
    /// ([`run_lookup`]).
    Lookup(PathBuf),
    /// Only fetching the git source, into this directory ([`run_source`]).
    Source(PathBuf),
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
    /// The part of the build to run.
    pub stage: Stage,
    /// A directory with package-registry config files (`.npmrc`, `pip.conf`) that replace
    /// the Function's own for the install.
    pub package_registry_config: Option<PathBuf>,
    /// Allow dependencies that bypass the package registry (git, URL and path dependencies,
    /// `requirements.txt` index and file options); refused otherwise.
    pub allow_direct_deps: bool,
    /// `--tag-by-key`: also tag the image `kiln-KEY`, and look for an existing image of this
    /// build with one `HEAD` of that tag.
    pub tag_by_key: bool,
    /// `--cache-repo`: the registry repository of the shared dependency-layer cache.
    pub cache_repo: Option<Reference>,
    /// `--lookup-dir`: what `--stage lookup` found, for `--stage deps` and `--stage publish`.
    pub lookup_dir: Option<PathBuf>,
    /// `--compression`: how the dependency and source layers are compressed.
    pub compression: oci::Compression,
    /// `--lockfile-install auto`: install from the lock file without the package manager
    /// when the lock decides everything (see [`lockfile`]).
    pub lockfile_install: bool,
}

/// The media type a dependency layer is written, cached and staged with. In the image it
/// takes the base's family's type for the same compression (the bytes are the same).
pub fn dependency_media_type(compression: oci::Compression) -> oci::MediaType {
    match compression {
        oci::Compression::Gzip => oci::MediaType::OciLayerGzip,
        oci::Compression::Zstd => oci::MediaType::OciLayerZstd,
    }
}

/// A finished build.
#[derive(Debug)]
pub struct Output {
    /// Where it went and what each blob did.
    pub published: Published,
    /// The build key label.
    pub build_key: Digest,
    /// The image documents; `None` when the target already held this build.
    pub image: Option<Image>,
    /// The target already held an image of this build key: nothing was installed or pushed.
    pub unchanged: bool,
    /// The commit built, for a git source.
    pub commit: Option<String>,
}

/// A finished `--stage deps`.
#[derive(Debug)]
pub struct DepsOutput {
    /// What was written to the stage directory.
    pub record: stage::Record,
    /// The commit built, for a git source.
    pub commit: Option<String>,
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Function itself is wrong: fix the input.
    #[error(transparent)]
    Function(#[from] function::Error),
    /// The Function fetched from git is wrong.
    #[error("the Function at {base_dir} of commit {commit} of {url}")]
    GitFunction {
        /// The repository.
        url: String,
        /// The commit.
        commit: String,
        /// The base directory.
        base_dir: String,
        /// What is wrong.
        #[source]
        source: Box<function::Error>,
    },
    /// Fetching the git source.
    #[error(transparent)]
    Git(#[from] crate::git::Error),
    /// The package-registry config directory.
    #[error("reading the package-registry config {path}")]
    RegistryConfig {
        /// The directory or file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The stage directory of a split build.
    #[error(transparent)]
    Stage(#[from] stage::Error),
    /// The base image.
    #[error(transparent)]
    Base(#[from] resolve::Error),
    /// The dependency install.
    #[error("installing dependencies")]
    Install(#[from] deps::Error),
    /// The dependency install from the lock file, without the package manager.
    #[error("installing dependencies from the lock file")]
    Lockfile(#[from] lockfile::Error),
    /// kiln's own install of pinned Python requirements failed.
    #[error("installing the pinned requirements")]
    Pinned(#[from] pinned::Error),
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
    /// Looking for an image of this build in the target registry.
    #[error("looking for an image of this build in {target}")]
    Lookup {
        /// The target.
        target: String,
        /// The cause.
        #[source]
        source: Box<crate::registry::Error>,
    },
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
    /// `--compression zstd` on a Docker v2 base: that format has no zstd layer type.
    #[error(
        "--compression zstd needs an OCI base image: {base} is a Docker v2 image, whose format has no zstd layer type; use --compression gzip, or a base in OCI format (`skopeo copy --format oci`)"
    )]
    NoZstd {
        /// The base as the user named it.
        base: String,
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
        match self {
            Error::Git(e) => e.is_input_error(),
            Error::Stage(e) => e.is_input_error(),
            // The image exists but not for the platform asked for: like `kiln run`, a usage
            // error (another --platform or --base).
            Error::Base(resolve::Error::NoPlatform { .. }) => true,
            Error::Function(_)
            | Error::GitFunction { .. }
            | Error::RegistryConfig { .. }
            | Error::NoZstd { .. }
            | Error::NoBuilder { .. } => true,
            _ => false,
        }
    }
}

/// Builds and publishes the image described by `opts` (`--stage all`, or `--stage publish`
/// with the dependency layer from a stage directory).
///
/// # Errors
/// See [`Error`]; nothing is published unless every step before succeeded, and the manifest
/// goes last.
pub async fn run(client: &Client, opts: &Options) -> Result<Output, Error> {
    let span = tracing::info_span!("build", function = %opts.name, runtime = %opts.runtime.name);
    async move {
        let cache = open_cache(opts)?;
        let loaded = load::load(opts, &cache.tmp_dir()).await?;
        let function = &loaded.function;
        tracing::info!(files = function.tree.file_count(), "collected source");
        let mut planned = function.deps.as_ref().map(|inputs| install::lockfile_plan(opts, inputs));
        let history = planned.as_ref().and_then(install::history);
        let (deps, mut store_in) = match &opts.stage {
            // Before anything is fetched: a bad stage directory should not wait for the network.
            Stage::Publish(dir) => staged_layer(client, opts, &cache, function, history, dir).await?,
            Stage::All | Stage::Deps(_) | Stage::Lookup(_) | Stage::Source(_) => {
                if let Some(planned) = &planned {
                    // Before anything is fetched: a usage error should not wait for the network.
                    install::require_builder(opts, planned)?;
                }
                (None, None)
            }
        };
        authorize_up_front(client, opts).await?;
        let base = resolve::resolve(client, &opts.base, &opts.base_name, &opts.platform).await?;
        tracing::info!(base = %opts.base_name, digest = %base.base.manifest.digest, "resolved base image");
        // The dependency key, not the layer: enough for the build key. `--stage publish`
        // installs nothing: its layer is the staged one, or none.
        let dep_key = match (&deps, function.deps.as_ref().zip(planned.take()), &opts.stage) {
            (None, Some((inputs, planned)), Stage::All | Stage::Deps(_) | Stage::Lookup(_)) => {
                Some(install::dependency_key(client, opts, &cache, inputs, planned).await?)
            }
            _ => None,
        };
        let layer_type = base.base.family().layer(opts.compression).ok_or_else(|| Error::NoZstd { base: opts.base_name.clone() })?;
        let source = assemble::source_layer(opts, &cache, function, layer_type).await?;
        let keyed = deps.as_ref().map(|d| &d.key).or(dep_key.as_ref().map(|k| &k.key));
        let planned = assemble::plan(opts, function, &base, keyed, &source);
        // `--no-cache` rebuilds: no existing image is taken either.
        let found = match opts.use_cache {
            true => existing::find(client, opts, &planned.build_key).await?,
            false => None,
        };
        if let Some(found) = found {
            tracing::info!(reference = %found.reference, build_key = %planned.build_key, "the target already holds this build: nothing to install or push");
            let published = Published { reference: found.reference, digest: found.digest, blobs: Vec::new() };
            return Ok(Output { published, build_key: planned.build_key, image: None, unchanged: true, commit: loaded.commit });
        }
        let deps = match (deps, &function.deps, dep_key) {
            (Some(staged), _, _) => Some(staged),
            (None, Some(inputs), Some(dep_key)) => {
                let layer = install::dependency_layer(client, opts, &cache, inputs, dep_key, opts.cache_repo.as_ref()).await?;
                let local = layer.remote.is_none().then(|| cache.blob_path(&layer.cached.digest));
                let created_by = stage::created_by(&install_command(opts, function, history), &layer.key);
                store_in = layer.store_in;
                Some(DepLayer { key: layer.key, digest: layer.cached.digest, diff_id: layer.cached.diff_id, size: layer.cached.size, created_by, local, remote: layer.remote, _copy: None, _in_use: layer.in_use })
            }
            (None, _, _) => None,
        };
        let build_key = planned.build_key.clone();
        let assembled = assemble::assemble(&base, deps.as_ref(), source, planned)?;
        let published = assemble::publish(client, opts, &cache, &assembled.image, &base, assembled.plans, &build_key).await?;
        tracing::info!(reference = %published.reference, "built");
        if let (Some(repo), Some(dep), Some(inputs)) = (store_in, &deps, &function.deps) {
            store_in_cache_repo(client, opts, &repo, dep, inputs, &install_command(opts, function, history)).await;
        }
        Ok(Output { published, build_key, image: Some(assembled.image), unchanged: false, commit: loaded.commit })
    }
    .instrument(span)
    .await
}

/// `--stage deps`: loads the Function, installs its dependencies exactly as a whole build
/// would (same key, same layer, same cache) and writes the layer and its record into `dir`.
/// Needs no base image and no registry but a builder image's, and publishes nothing.
///
/// # Errors
/// See [`Error`].
pub async fn run_deps(client: &Client, opts: &Options, dir: &Path) -> Result<DepsOutput, Error> {
    let span = tracing::info_span!("build", function = %opts.name, runtime = %opts.runtime.name, stage = "deps");
    async move {
        let cache = open_cache(opts)?;
        let loaded = load::load(opts, &cache.tmp_dir()).await?;
        let function = &loaded.function;
        let mut record = stage::Record {
            format: stage::FORMAT.into(),
            runtime: opts.runtime.name.clone(),
            epoch: opts.epoch,
            manifest_digest: function.deps.as_ref().map(stage::manifest_digest),
            dependencies: None,
        };
        let mut blob = None;
        if let Some(inputs) = &function.deps {
            let planned = install::lockfile_plan(opts, inputs);
            let history = install::history(&planned);
            install::require_builder(opts, &planned)?;
            let dep_key = install::dependency_key(client, opts, &cache, inputs, planned).await?;
            let created_by = stage::created_by(&install_command(opts, function, history), &dep_key.key);
            let media_type = dependency_media_type(opts.compression);
            match lookup_hit(opts, inputs, &dep_key.key).await? {
                Some(found) => {
                    tracing::info!(key = %dep_key.key, digest = %found.digest, "the cache repository has the dependency layer (--stage lookup): nothing to install");
                    record.dependencies = Some(stage::StagedLayer { key: dep_key.key, media_type, digest: found.digest, diff_id: found.diff_id, size: found.size, created_by, in_cache_repo: true });
                }
                None => {
                    // The install stage has no registry credentials: the local cache only.
                    let install::Layer { key, cached, .. } = install::dependency_layer(client, opts, &cache, inputs, dep_key, None).await?;
                    blob = Some(cache.blob_path(&cached.digest));
                    record.dependencies = Some(stage::StagedLayer { key, media_type, digest: cached.digest, diff_id: cached.diff_id, size: cached.size, created_by, in_cache_repo: false });
                }
            }
        }
        let (dir, written) = (dir.to_path_buf(), record.clone());
        tokio::task::spawn_blocking(move || stage::write(&dir, &written, blob.as_deref())).await??;
        tracing::info!(layer = ?record.dependencies.as_ref().map(|l| &l.digest), "staged the dependencies");
        Ok(DepsOutput { record, commit: loaded.commit })
    }
    .instrument(span)
    .await
}

/// Pushes the freshly installed dependency layer to the cache repository, after the image.
/// A failure is a warning: the image is built.
async fn store_in_cache_repo(
    client: &Client,
    opts: &Options,
    repo: &Reference,
    dep: &DepLayer,
    inputs: &function::DepInputs,
    install: &str,
) {
    let Some(local) = &dep.local else { return };
    let mount_from = match &opts.target {
        Target::Registry(t) if t.registry == repo.registry => Some(t.repository.as_str()),
        _ => None,
    };
    let cached = cache::CachedLayer {
        digest: dep.digest.clone(),
        diff_id: dep.diff_id.clone(),
        size: dep.size,
    };
    match push_cache_entry(
        client, opts, repo, &dep.key, &cached, inputs, install, local, mount_from,
    )
    .await
    {
        Ok(()) => {
            tracing::info!(cache_repo = %repo, tag = %remote_cache::tag(&dep.key), "stored the dependency layer in the cache repository")
        }
        Err(e) => {
            tracing::warn!(cache_repo = %repo, error = %format!("{:#}", anyhow::Error::new(e)), "could not store the dependency layer in the cache repository")
        }
    }
}

/// Pushes the cache repository entry of the dependency layer `layer` (its bytes at `local`,
/// or mounted from `mount_from` on the same registry) for `key`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn push_cache_entry(
    client: &Client,
    opts: &Options,
    repo: &Reference,
    key: &Digest,
    layer: &cache::CachedLayer,
    inputs: &function::DepInputs,
    install: &str,
    local: &Path,
    mount_from: Option<&str>,
) -> Result<(), crate::registry::Error> {
    let about = remote_cache::Describe {
        runtime: &opts.runtime.name,
        install,
        inputs,
        epoch: opts.epoch,
    };
    let descriptor = oci::Descriptor::new(
        dependency_media_type(opts.compression),
        layer.digest.clone(),
        layer.size,
    );
    let entry = remote_cache::entry_manifest(key, &descriptor, &layer.diff_id, &about);
    remote_cache::store(client, repo, key, &entry, &descriptor, local, mount_from).await
}

pub(super) fn open_cache(opts: &Options) -> Result<LayerCache, Error> {
    LayerCache::open(&opts.cache_dir).map_err(|source| Error::Cache {
        path: opts.cache_dir.clone(),
        source,
    })
}

/// The install command line, as the history text names it; `history` says how kiln installs
/// without the package manager, when it does ([`install::history`]).
pub(super) fn install_command(
    opts: &Options,
    function: &Function,
    history: Option<&'static str>,
) -> String {
    let Some(inputs) = &function.deps else {
        return opts.runtime.install_command(false).join(" ");
    };
    let command = opts
        .runtime
        .install_command(inputs.lock.is_some())
        .join(" ");
    match history {
        Some(history) => format!("{command} {history}"),
        None => command,
    }
}

/// [`publish::authorize_up_front`] for a build's target, base and cache repository.
async fn authorize_up_front(client: &Client, opts: &Options) -> Result<(), publish::Error> {
    let Target::Registry(target) = &opts.target else {
        return Ok(());
    };
    let base = match &opts.base {
        BaseRef::Registry(base) => Some(base),
        _ => None,
    };
    publish::authorize_up_front(client, target, base, opts.cache_repo.as_ref()).await
}
