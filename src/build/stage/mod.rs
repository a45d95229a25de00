//! The hand-over between the two halves of a split build. `--stage deps` (which runs the
//! third-party install, without push credentials) writes the dependency layer and a small
//! record of it into a stage directory; `--stage publish` (with push credentials, running no
//! program) reads them back trusting nothing there: every file is opened without following
//! symlinks and must be a regular file, the record must describe this very Function, and the
//! layer is copied out while its size, digest and diff_id are checked.

mod lookup;
mod open;
#[cfg(test)]
mod tests;

pub use lookup::{Found, LOOKUP_FILE, Lookup, read_lookup, write_lookup};

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};
use tempfile::{NamedTempFile, TempPath};

use open::{copy_verified, open_beneath};

use super::function::DepInputs;
use crate::io_error::IoContext as _;
use crate::oci::{Digest, Hasher, MediaType};

/// The record's file name in the stage directory.
pub const RECORD_FILE: &str = "dependencies.json";
/// The dependency layer's file name in the stage directory.
pub const BLOB_FILE: &str = "dependencies.tar.gz";
/// The record format this kiln writes and reads.
pub const FORMAT: &str = "kiln-staged-dependencies/v1";
/// A record is a few hundred bytes; anything bigger is not one.
const RECORD_LIMIT: u64 = 64 * 1024;

/// What `--stage deps` hands to `--stage publish`. It holds no registry configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    /// [`FORMAT`].
    pub format: String,
    /// The runtime the dependencies were installed for.
    pub runtime: String,
    /// `SOURCE_DATE_EPOCH` of the install (part of the layer's bytes).
    pub epoch: u64,
    /// [`manifest_digest`] of the Function's dependency manifest and lock file; `None` when
    /// it has nothing to install.
    pub manifest_digest: Option<Digest>,
    /// The layer; `None` when the Function has nothing to install.
    pub dependencies: Option<StagedLayer>,
}

/// The dependency layer in the stage directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StagedLayer {
    /// The dependency cache key (the build key's dependency part).
    pub key: Digest,
    /// The blob's media type as written.
    pub media_type: MediaType,
    /// Digest of the compressed blob.
    pub digest: Digest,
    /// Digest of the uncompressed tar.
    pub diff_id: Digest,
    /// Size of the compressed blob.
    pub size: u64,
    /// The image history entry's `created_by`.
    pub created_by: String,
    /// What installed it, as the key names it (the image's `dev.kiln.deps.toolchain` label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolchain: Option<String>,
    /// The layer is the cache repository entry `--stage lookup` found, so nothing was
    /// installed and there is no blob here: publish takes the layer from the repository,
    /// trusting the lookup's record, never this one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_cache_repo: bool,
}

/// What the publishing build expects the record to say.
#[derive(Clone, Debug)]
pub struct Expected<'a> {
    /// The runtime.
    pub runtime: &'a str,
    /// `SOURCE_DATE_EPOCH`.
    pub epoch: u64,
    /// The Function's dependency inputs.
    pub inputs: Option<&'a DepInputs>,
    /// The install command line, for the history text.
    pub install_command: String,
    /// The layer compression of this build (`--compression`).
    pub compression: crate::oci::Compression,
}

/// A verified stage: the record, and a private copy of the layer made while checking it.
#[derive(Debug)]
pub struct Verified {
    /// The record.
    pub record: Record,
    /// The layer copy, when there are dependencies.
    pub blob: Option<TempPath>,
}

/// Why the stage directory cannot be written or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file is missing or cannot be opened.
    #[error(
        "opening {path}: run the stage that writes it for this Function first (`kiln build --stage \
            deps --stage-dir DIR`, or `--stage lookup --lookup-dir DIR` for a lookup directory)"
    )]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A symlink, directory, device or other non-regular file.
    #[error(
        "{path} is {kind}, not a regular file; refusing it: only `kiln build --stage deps` writes \
            the stage directory"
    )]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Not a record.
    #[error("{path} is not a kiln dependency record")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The record describes another build.
    #[error(
        "{path} does not describe this build: its {field} is {recorded}, this build's is \
            {current}; run both stages with the same Function and flags"
    )]
    Mismatch {
        /// The record.
        path: PathBuf,
        /// Which field.
        field: &'static str,
        /// What the record says.
        recorded: String,
        /// What this build has.
        current: String,
    },
    /// The layer `--stage lookup` found is gone from the cache repository, or unusable.
    #[error(
        "the dependency layer {key} that --stage lookup found in {repo} cannot be used now: it is \
            gone or does not verify; run the build again (its lookup will then miss and install)"
    )]
    EntryGone {
        /// The dependency key.
        key: Digest,
        /// The cache repository.
        repo: String,
    },
    /// The blob is not what the record says.
    #[error("{path} does not match its record: {field} is {actual}, the record says {expected}")]
    Blob {
        /// The blob.
        path: PathBuf,
        /// size, digest or diff_id.
        field: &'static str,
        /// What the record says.
        expected: String,
        /// What the file has.
        actual: String,
    },
    /// The blob is not a gzip tar stream.
    #[error("{path} is not a gzip-compressed layer")]
    Gzip {
        /// The blob.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading or writing.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

impl Error {
    /// Whether the stage directory's content is at fault (exit code 2) rather than I/O.
    pub fn is_input_error(&self) -> bool {
        !matches!(
            self,
            Error::Io(crate::io_error::IoError { .. }) | Error::EntryGone { .. }
        )
    }
}

/// The digest that ties a record to a Function: its dependency manifest and lock file,
/// names and bytes (never the registry config, which publish does not need to have).
pub fn manifest_digest(inputs: &DepInputs) -> Digest {
    let mut h = Hasher::new();
    for file in std::iter::once(&inputs.manifest).chain(&inputs.lock) {
        for part in [file.name.as_bytes(), &file.bytes] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    h.finish().0
}

/// The history text of a dependency layer.
pub fn created_by(install_command: &str, key: &Digest) -> String {
    format!("{}{install_command}, key {key})", super::plan::DEPS_HISTORY)
}

/// Writes `record` (and the layer at `blob`, copied) into `dir`, creating it. Each file is
/// written to a temporary name and renamed over the final one, so a symlink planted there
/// beforehand is replaced, never followed.
///
/// # Errors
/// I/O errors naming the file.
pub fn write(dir: &Path, record: &Record, blob: Option<&Path>) -> Result<(), Error> {
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| {
            Error::Io(crate::io_error::IoError {
                action,
                path,
                source,
            })
        }
    };
    std::fs::create_dir_all(dir).at("creating", dir)?;
    let blob_path = dir.join(BLOB_FILE);
    match blob {
        Some(source) => {
            let mut from = File::open(source).at("reading", source)?;
            let mut tmp = NamedTempFile::new_in(dir).at("writing into", dir)?;
            io::copy(&mut from, &mut tmp).at("writing", &blob_path)?;
            tmp.persist(&blob_path)
                .map_err(|e| io("writing", &blob_path)(e.error))?;
        }
        None => match std::fs::remove_file(&blob_path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io("removing the stale", &blob_path)(e));
            }
            _ => {}
        },
    }
    write_json(dir, RECORD_FILE, record)
}

/// Writes `value` as `dir/name`, through a temporary file renamed over it.
fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<(), Error> {
    let path = dir.join(name);
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| {
            Error::Io(crate::io_error::IoError {
                action,
                path,
                source,
            })
        }
    };
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| io("writing", &path)(e.into()))?;
    let mut tmp = NamedTempFile::new_in(dir).at("writing into", dir)?;
    tmp.write_all(&bytes).at("writing", &path)?;
    tmp.persist(&path)
        .map_err(|e| io("writing", &path)(e.error))?;
    Ok(())
}

/// Opens `dir` for reading files beneath it.
fn open_dir(dir: &Path) -> Result<rustix::fd::OwnedFd, Error> {
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Open {
        path: dir.to_path_buf(),
        source: e.into(),
    })
}

/// Reads `dir/name` (a regular file, no symlink followed, at most [`RECORD_LIMIT`] bytes)
/// as JSON.
fn read_json<T: serde::de::DeserializeOwned>(
    dir_fd: &rustix::fd::OwnedFd,
    dir: &Path,
    name: &str,
) -> Result<T, Error> {
    let path = dir.join(name);
    let mut bytes = Vec::new();
    open_beneath(dir_fd, dir, name)?
        .take(RECORD_LIMIT)
        .read_to_end(&mut bytes)
        .at("reading", &path)?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Parse { path, source })
}

/// Reads and checks the stage in `dir` against what this build expects, copying the layer
/// into `scratch` while verifying it.
///
/// # Errors
/// Any file that is missing, not a regular file, malformed, or does not match.
pub fn read(dir: &Path, expected: &Expected<'_>, scratch: &Path) -> Result<Verified, Error> {
    let dir_fd = open_dir(dir)?;
    let record_path = dir.join(RECORD_FILE);
    let record: Record = read_json(&dir_fd, dir, RECORD_FILE)?;
    check_record(&record, expected, &record_path)?;
    let blob = match &record.dependencies {
        None => None,
        // Nothing here: publish takes it from the cache repository.
        Some(layer) if layer.in_cache_repo => None,
        Some(layer) => {
            let file = open_beneath(&dir_fd, dir, BLOB_FILE)?;
            Some(copy_verified(file, &dir.join(BLOB_FILE), layer, scratch)?)
        }
    };
    Ok(Verified { record, blob })
}

fn check_record(record: &Record, expected: &Expected<'_>, path: &Path) -> Result<(), Error> {
    let mismatch = |field, recorded: String, current: String| {
        if recorded == current {
            return Ok(());
        }
        Err(Error::Mismatch {
            path: path.to_path_buf(),
            field,
            recorded,
            current,
        })
    };
    let none = || "none".to_string();
    mismatch("format", record.format.clone(), FORMAT.into())?;
    mismatch("runtime", record.runtime.clone(), expected.runtime.into())?;
    mismatch(
        "SOURCE_DATE_EPOCH",
        record.epoch.to_string(),
        expected.epoch.to_string(),
    )?;
    let current = expected.inputs.map(manifest_digest);
    mismatch(
        "dependency manifest digest",
        record
            .manifest_digest
            .as_ref()
            .map_or_else(none, Digest::to_string),
        current.as_ref().map_or_else(none, Digest::to_string),
    )?;
    let layer = match (&record.dependencies, current) {
        (None, None) => return Ok(()),
        (Some(layer), Some(_)) => layer,
        (recorded, _) => {
            let describe = |some: bool| if some { "a layer" } else { "none" }.to_string();
            return mismatch(
                "dependency layer",
                describe(recorded.is_some()),
                describe(recorded.is_none()),
            );
        }
    };
    mismatch(
        "history text",
        layer.created_by.clone(),
        created_by(&expected.install_command, &layer.key),
    )?;
    let wanted = crate::build::dependency_media_type(expected.compression);
    if layer.media_type != wanted {
        return mismatch(
            "media type",
            layer.media_type.to_string(),
            wanted.to_string(),
        );
    }
    Ok(())
}
