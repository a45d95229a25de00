//! What a build is asked to do (`Options` and the types it is made of) and what it gives
//! back (`Output`, `DepsOutput`): the build's types, apart from the pipeline in mod.rs.

use std::path::PathBuf;

use super::deps::InstallEnv;
use super::function::FunctionManifest;
use super::stage;
use crate::image::publish::{self, Published};
use crate::image::resolve::BaseRef;
use crate::oci::{self, Digest, Image, Platform};
pub use crate::provenance::Inputs;
use crate::registry::{Client, Reference};
use crate::runtime::RuntimeSpec;

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
    /// Whose entries in `cache_repo` are used, and the key entries are stored signed with.
    pub cache_trust: super::remote_cache::CacheTrust,
    /// `--lookup-dir`: what `--stage lookup` found, for `--stage deps` and `--stage publish`.
    pub lookup_dir: Option<PathBuf>,
    /// `--compression`: how the dependency and source layers are compressed.
    pub compression: oci::Compression,
    /// `--lockfile-install auto`: install from the lock file without the package manager
    /// when the lock decides everything (see [`lockfile`]).
    pub lockfile_install: bool,
    /// `--sign-key`: sign the image and attach its provenance (registry targets only).
    pub signing: Option<Signing>,
}

/// What signing an image and attesting its provenance needs (see [`crate::cosign`]).
#[derive(Clone, Debug)]
pub struct Signing {
    /// The key.
    pub key: std::sync::Arc<crate::cosign::SignKey>,
    /// The flags that change the image: the provenance's external parameters.
    pub external: serde_json::Value,
    /// When the build started (RFC 3339).
    pub started: String,
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
    /// The image key label.
    pub image_key: Digest,
    /// The image documents; `None` when the target already held this build.
    pub image: Option<Image>,
    /// The target already held an image of this image key: nothing was installed or pushed.
    pub unchanged: bool,
    /// The commit built, for a git source.
    pub commit: Option<String>,
    /// What it was made from, for its provenance.
    pub inputs: Inputs,
    /// The signature and provenance attached, with `signing`.
    pub attached: Option<crate::cosign::Attached>,
}

/// A finished `--stage deps`.
#[derive(Debug)]
pub struct DepsOutput {
    /// What was written to the stage directory.
    pub record: stage::Record,
    /// The commit built, for a git source.
    pub commit: Option<String>,
}

impl Options {
    /// [`publish::authorize_up_front`] for the build's target, base and cache repository.
    ///
    /// # Errors
    /// An invalid registry name.
    pub async fn authorize_up_front(&self, client: &Client) -> Result<(), publish::Error> {
        let Target::Registry(target) = &self.target else {
            return Ok(());
        };
        let base = match &self.base {
            BaseRef::Registry(base) => Some(base),
            _ => None,
        };
        publish::authorize_up_front(client, target, base, self.cache_repo.as_ref()).await
    }
}
