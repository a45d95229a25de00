//! Why a build failed, and whether the input or the build is at fault.

use std::path::PathBuf;

use super::{deps, function, lockfile, pinned, stage};
use crate::image::{publish, resolve};
use crate::oci;

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
    /// Signing the image or attaching its provenance (`--sign-key`).
    #[error("signing {image}")]
    Attach {
        /// The image, by digest.
        image: String,
        /// The cause.
        #[source]
        source: Box<crate::cosign::AttachError>,
    },
    /// Reading what the SBOM lists (`--sign-key`).
    #[error("making the SBOM: {0}")]
    Sbom(String),
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
        "--deps-sandbox {sandbox} needs --builder-image REF to install the dependencies: the base \
            {base} is not the {runtime} runtime's own, so kiln cannot know which toolchain matches \
            it; pass --builder-image REF (the builder image that matches the base; `kiln base \
            build {runtime}` makes one), or --deps-sandbox none to install with the toolchain on \
            PATH (its version is checked)"
    )]
    NoBuilder {
        /// The `--deps-sandbox` mode.
        sandbox: &'static str,
        /// The base image as the user wrote it.
        base: String,
        /// The runtime.
        runtime: String,
    },
    /// Dependencies for a foreign platform that only the package manager can install.
    #[error(
        "installing the dependencies for {platform} needs {tool}: {why}. On this {host} \
            machine {tool} for {platform} runs only under emulation, and {not_emulated}. \
            Give the Function {remedy} (kiln then installs them itself), or build it on a \
            {platform} machine",
        host = crate::oci::Platform::host()
    )]
    ForeignInstall {
        /// The platform built for.
        platform: String,
        /// npm or pip.
        tool: &'static str,
        /// Why kiln cannot install them itself (names the package).
        why: String,
        /// Why the package manager cannot run under emulation here.
        not_emulated: String,
        /// What would let kiln install them.
        remedy: &'static str,
    },
    /// `--compression zstd` on a Docker v2 base: that format has no zstd layer type.
    #[error(
        "--compression zstd needs an OCI base image: {base} is a Docker v2 image, whose format has \
            no zstd layer type; use --compression gzip, or a base in OCI format (`skopeo copy \
            --format oci`)"
    )]
    NoZstd {
        /// The base as the user named it.
        base: String,
    },
    /// `kiln warm` without a key to sign the entries it stores.
    #[error(
        "storing a dependency cache entry needs --cache-sign-key FILE: readers use only entries a \
            key they trust signed"
    )]
    NoCacheSignKey,
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
            // A --base the registry does not have: the reference is the user's.
            Error::Base(resolve::Error::Registry { source, .. }) => {
                matches!(**source, crate::registry::Error::NotFound { .. })
            }
            Error::Function(_)
            | Error::GitFunction { .. }
            | Error::RegistryConfig { .. }
            | Error::NoZstd { .. }
            | Error::NoCacheSignKey
            | Error::NoBuilder { .. }
            | Error::ForeignInstall { .. } => true,
            _ => false,
        }
    }
}
