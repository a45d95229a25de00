//! Why locking or assembling base images failed.

use super::super::recipe::FIRST_ARCHITECTURE;
use super::super::{debian, packages};
use crate::fetch::npm;
use crate::oci::{self, source};

/// Why locking or assembling failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Debian side.
    #[error(transparent)]
    Debian(#[from] debian::Error),
    /// npm side.
    #[error(transparent)]
    Npm(#[from] npm::Error),
    /// Kyma's runtime packages.
    #[error(transparent)]
    Packages(#[from] packages::Error),
    /// Walking a staged tree.
    #[error(transparent)]
    Walk(#[from] source::Error),
    /// Writing a layer.
    #[error("writing the {what} layer")]
    Layer {
        /// Which.
        what: &'static str,
        /// The cause.
        #[source]
        source: oci::layer::Error,
    },
    /// Assembling the image.
    #[error(transparent)]
    Image(#[from] oci::image::Error),
    /// The lock does not match the recipe.
    #[error("lock file is for {found}, not {wanted}: run `kiln base lock {wanted}`")]
    StaleLock {
        /// Wanted.
        wanted: String,
        /// In the lock.
        found: String,
    },
    /// Compiling the image's Python bytecode failed.
    #[error("compiling the image's Python modules with {python}: {detail}")]
    Bytecode {
        /// The interpreter.
        python: String,
        /// What went wrong.
        detail: String,
    },
    /// A recipe whose architectures kiln cannot lock.
    #[error(
        "the {runtime} recipe's architectures must start with {FIRST_ARCHITECTURE} and name \
            only amd64 and arm64"
    )]
    Architectures {
        /// The runtime.
        runtime: String,
    },
    /// The lock has no inputs for the architecture asked for.
    #[error(
        "the {runtime} lock has no inputs for {arch} (it has: {available}): add it to the \
            recipe's architectures and run `kiln base lock {runtime}`"
    )]
    NoArchitecture {
        /// The runtime.
        runtime: String,
        /// Asked for.
        arch: String,
        /// What the lock has.
        available: String,
    },
    /// The recipe names runtime packages the lock does not pin.
    #[error(
        "the lock file pins none of the [packages] of the {runtime} recipe: run `kiln base lock \
            {runtime}`"
    )]
    UnlockedPackages {
        /// The runtime.
        runtime: String,
    },
    /// File-system trouble: scratch space, synthesised files.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// A worker thread died.
    #[error("internal task failed")]
    Task(#[from] tokio::task::JoinError),
}
