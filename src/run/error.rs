//! [`Error`]: why `kiln run` could not run the image (the function's own failure is an exit
//! code, not an error).

use std::io;

use super::{unpack, user};
use crate::oci::{self, Digest};
use crate::registry::{self, Reference};
use crate::rootpath;
use crate::sandbox::{self, Signal};

/// Errors of `kiln run`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// bwrap is missing or cannot create namespaces, or a signal could not be forwarded.
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    /// A foreign image, and no emulator to run it.
    #[error(transparent)]
    Emulator(#[from] sandbox::emulator::Error),
    /// A registry request failed.
    #[error("fetching {what} of {reference}")]
    Registry {
        /// What was fetched (`the manifest`, `layer sha256:…`).
        what: String,
        /// From where.
        reference: String,
        /// The cause.
        #[source]
        source: Box<registry::Error>,
    },
    /// The OCI layout cannot be read, lacks the image, or holds a corrupt blob.
    #[error("reading the image from its OCI layout")]
    Layout(#[from] oci::layout::Error),
    /// The index has no entry for the platform.
    #[error("the image has no {wanted} variant (it has: {available}); pass --platform")]
    NoPlatform {
        /// Wanted (`os/arch`).
        wanted: String,
        /// Present.
        available: String,
    },
    /// A JSON document does not parse.
    #[error("document {digest} of the image does not parse")]
    Malformed {
        /// Its digest.
        digest: Digest,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The reference names something other than an image manifest or index.
    #[error("{digest} is a {media_type}, not an image manifest or index")]
    NotAnImage {
        /// Its digest.
        digest: Digest,
        /// What it is.
        media_type: String,
    },
    /// The config lists another number of layers than the manifest.
    #[error("the manifest has {layers} layers but the config lists {diff_ids} diff_ids")]
    LayerCount {
        /// In the manifest.
        layers: usize,
        /// In the config.
        diff_ids: usize,
    },
    /// A layer's download task vanished.
    #[error("layer {0} was never fetched")]
    MissingLayer(usize),
    /// A layer does not unpack.
    #[error("unpacking layer {digest}")]
    Unpack {
        /// The layer.
        digest: Digest,
        /// The cause.
        #[source]
        source: unpack::Error,
    },
    /// The unpacked tree's directory modes and times cannot be set.
    #[error("finishing the unpacked root filesystem")]
    Finish(#[source] unpack::Error),
    /// A layer blob's bytes do not match its digest.
    #[error("layer blob {expected} has digest {actual}")]
    LayerDigest {
        /// Its name.
        expected: Digest,
        /// Of its bytes.
        actual: Digest,
    },
    /// A layer's uncompressed content does not match the config's `diff_id`.
    #[error("layer {layer} unpacks to {actual}, but the config's diff_id is {expected}")]
    DiffId {
        /// The layer.
        layer: Digest,
        /// From the config.
        expected: Digest,
        /// Of the tar stream.
        actual: Digest,
    },
    /// A path inside the rootfs cannot be resolved.
    #[error(transparent)]
    Path(#[from] rootpath::Error),
    /// The config's `User` names an unknown user or group.
    #[error(transparent)]
    User(#[from] user::Error),
    /// Neither `Entrypoint` nor `Cmd` is set.
    #[error("the image has no Entrypoint or Cmd to run; pass a command after --")]
    NoCommand,
    /// The config's `WorkingDir` is not a directory of the image.
    #[error("the image's WorkingDir {0} is not a directory in it")]
    NoWorkingDir(String),
    /// File system trouble in the cache.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// Signal handlers cannot be installed.
    #[error("installing SIGINT/SIGTERM handlers")]
    Signals {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// bwrap cannot be started.
    #[error("starting bwrap")]
    Spawn {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Waiting for bwrap failed.
    #[error("waiting for the sandbox")]
    Wait {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A background task panicked or was cancelled.
    #[error("a background task failed")]
    Task(#[source] tokio::task::JoinError),
    /// SIGINT or SIGTERM arrived before the function started.
    #[error("interrupted by {signal} before the function started")]
    Interrupted {
        /// The signal.
        signal: Signal,
    },
}

impl Error {
    pub(super) fn registry(what: String, reference: &Reference, source: registry::Error) -> Error {
        Error::Registry {
            what,
            reference: reference.to_string(),
            source: Box::new(source),
        }
    }

    /// Whether the user must change the input (reference, platform, image), rather than the
    /// environment having failed.
    pub fn is_input_error(&self) -> bool {
        match self {
            Error::Registry { source, .. } => matches!(**source, registry::Error::NotFound { .. }),
            Error::Layout(oci::layout::Error::NotALayout(_))
            | Error::Layout(oci::layout::Error::NoSuchRef { .. }) => true,
            Error::Layout(oci::layout::Error::Io(crate::io_error::IoError { source, .. })) => {
                source.kind() == io::ErrorKind::NotFound
            }
            Error::NoPlatform { .. }
            | Error::NotAnImage { .. }
            | Error::NoCommand
            | Error::NoWorkingDir(_)
            | Error::User(_) => true,
            _ => false,
        }
    }

    /// The exit code to use when this error is an interruption (128 + the signal).
    pub fn interrupted_exit_code(&self) -> Option<u8> {
        match self {
            Error::Interrupted { signal } => Some(128 + signal.number()),
            _ => None,
        }
    }
}
