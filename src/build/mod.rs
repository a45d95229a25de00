//! Building a Function image: the only module that uses `oci`, `registry` and `runtime`
//! together. [`run`] checks the Function, resolves the base, installs dependencies (or takes
//! the layer from the cache, or from a `--stage deps` run), writes the source layer, appends
//! both to the base and publishes; [`run_deps`] is a split build's first half.

mod assemble;
pub mod base;
pub mod cache;
pub mod deps;
pub mod egress;
pub mod function;
mod install;
mod load;
pub mod mask;
pub mod plan;
pub mod publish;
pub mod source;
pub mod stage;

use std::path::{Path, PathBuf};

use tracing::Instrument;

use crate::oci::{self, Digest, Image, Platform};
use crate::registry::{Client, Reference};
use crate::runtime::RuntimeSpec;
use assemble::DepLayer;
use base::BaseRef;
use cache::LayerCache;
use deps::InstallEnv;
use function::{Function, FunctionManifest};
use publish::Published;

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
        match self {
            Error::Git(e) => e.is_input_error(),
            Error::Stage(e) => e.is_input_error(),
            // The image exists but not for the platform asked for: like `kiln run`, a usage
            // error (another --platform or --base).
            Error::Base(base::Error::NoPlatform { .. }) => true,
            Error::Function(_)
            | Error::GitFunction { .. }
            | Error::RegistryConfig { .. }
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
        let deps = match &opts.stage {
            // Before anything is fetched: a bad stage directory should not wait for the network.
            Stage::Publish(dir) => staged_layer(opts, &cache, function, dir).await?,
            Stage::All | Stage::Deps(_) => {
                if function.deps.is_some() {
                    // Before anything is fetched: a usage error should not wait for the network.
                    install::require_builder(opts)?;
                }
                None
            }
        };
        publish::authorize_up_front(client, opts).await?;
        let base = base::resolve(client, &opts.base, &opts.base_name, &opts.platform).await?;
        tracing::info!(base = %opts.base_name, digest = %base.base.manifest.digest, "resolved base image");
        let deps = match (deps, &function.deps, &opts.stage) {
            (Some(staged), _, _) => Some(staged),
            (None, Some(inputs), Stage::All | Stage::Deps(_)) => {
                let (key, cached, in_use) = install::dependency_layer(client, opts, &cache, inputs).await?;
                let local = cache.blob_path(&cached.digest);
                let created_by = stage::created_by(&install_command(opts, function), &key);
                Some(DepLayer { key, digest: cached.digest, diff_id: cached.diff_id, size: cached.size, created_by, local, _copy: None, _in_use: in_use })
            }
            (None, _, _) => None,
        };
        let assembled = assemble::assemble(opts, &cache, function, &base, deps.as_ref()).await?;
        let published = assemble::publish(client, opts, &cache, &assembled.image, &base, assembled.plans).await?;
        tracing::info!(reference = %published.reference, "built");
        Ok(Output { published, build_key: assembled.build_key, image: assembled.image, commit: loaded.commit })
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
            install::require_builder(opts)?;
            let (key, cached, _in_use) = install::dependency_layer(client, opts, &cache, inputs).await?;
            blob = Some(cache.blob_path(&cached.digest));
            record.dependencies = Some(stage::StagedLayer {
                created_by: stage::created_by(&install_command(opts, function), &key),
                key,
                media_type: oci::MediaType::OciLayerGzip,
                digest: cached.digest,
                diff_id: cached.diff_id,
                size: cached.size,
            });
        }
        let (dir, written) = (dir.to_path_buf(), record.clone());
        tokio::task::spawn_blocking(move || stage::write(&dir, &written, blob.as_deref())).await??;
        tracing::info!(layer = ?record.dependencies.as_ref().map(|l| &l.digest), "staged the dependencies");
        Ok(DepsOutput { record, commit: loaded.commit })
    }
    .instrument(span)
    .await
}

fn open_cache(opts: &Options) -> Result<LayerCache, Error> {
    LayerCache::open(&opts.cache_dir).map_err(|source| Error::Cache {
        path: opts.cache_dir.clone(),
        source,
    })
}

/// The install command line, as the history text names it.
fn install_command(opts: &Options, function: &Function) -> String {
    let locked = function.deps.as_ref().is_some_and(|d| d.lock.is_some());
    opts.runtime.install_command(locked).join(" ")
}

/// The dependency layer from `--stage-dir`, checked against this build's Function. Runs no
/// program.
async fn staged_layer(
    opts: &Options,
    cache: &LayerCache,
    function: &Function,
    dir: &Path,
) -> Result<Option<DepLayer>, Error> {
    let (dir, scratch, runtime, epoch) = (
        dir.to_path_buf(),
        cache.tmp_dir(),
        opts.runtime.name.clone(),
        opts.epoch,
    );
    let inputs = function.deps.clone();
    let install_command = install_command(opts, function);
    let verified = tokio::task::spawn_blocking(move || {
        let expected = stage::Expected {
            runtime: &runtime,
            epoch,
            inputs: inputs.as_ref(),
            install_command,
        };
        stage::read(&dir, &expected, &scratch)
    })
    .await??;
    let (Some(layer), Some(copy)) = (verified.record.dependencies, verified.blob) else {
        return Ok(None);
    };
    tracing::info!(key = %layer.key, digest = %layer.digest, "dependency layer from the stage directory");
    Ok(Some(DepLayer {
        key: layer.key,
        digest: layer.digest,
        diff_id: layer.diff_id,
        size: layer.size,
        created_by: layer.created_by,
        local: copy.to_path_buf(),
        _copy: Some(copy),
        _in_use: crate::inuse::InUse::default(),
    }))
}
