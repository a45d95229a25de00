//! The third part of a split build, for the shared dependency cache: `--stage lookup` runs
//! before the install with registry credentials and no third-party code, computes the
//! dependency key and asks the cache repository for it, and writes what it found into a
//! lookup directory that the install stage can read but not write. The install skips the
//! install on a hit; publish mounts the entry on a hit and, on a miss, stores the installed
//! layer under the key computed here: never under a key the install stage wrote, which
//! would let one Function's install scripts fill another's cache entry.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Error, manifest_digest, open_dir, read_json, write_json};
use crate::build::function::DepInputs;
use crate::io_error::IoContext as _;
use crate::oci::Digest;

/// The lookup record's file name in the lookup directory.
pub const LOOKUP_FILE: &str = "lookup.json";
/// The lookup record format this kiln writes and reads.
const FORMAT: &str = "kiln-dependency-lookup/v1";

/// What `--stage lookup` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lookup {
    /// [`FORMAT`].
    pub format: String,
    /// The runtime.
    pub runtime: String,
    /// `SOURCE_DATE_EPOCH`.
    pub epoch: u64,
    /// [`manifest_digest`] of the Function's dependency manifest and lock file; `None` when
    /// it has nothing to install.
    pub manifest_digest: Option<Digest>,
    /// The dependency key; `None` when there is nothing to install.
    pub key: Option<Digest>,
    /// The cache repository asked.
    pub cache_repo: String,
    /// The entry's layer, when the repository has one for the key.
    pub found: Option<Found>,
}

/// The layer of a cache repository entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Found {
    /// Digest of the compressed layer.
    pub digest: Digest,
    /// Its diff ID, as the entry names it.
    pub diff_id: Digest,
    /// Its size.
    pub size: u64,
}

impl Lookup {
    /// The record for a Function with dependency inputs `inputs` (and `key`).
    pub fn new(
        runtime: &str,
        epoch: u64,
        inputs: Option<&DepInputs>,
        key: Option<Digest>,
        cache_repo: String,
        found: Option<Found>,
    ) -> Lookup {
        Lookup {
            format: FORMAT.into(),
            runtime: runtime.into(),
            epoch,
            manifest_digest: inputs.map(manifest_digest),
            key,
            cache_repo,
            found,
        }
    }
}

/// Writes `lookup` into `dir`, creating it.
///
/// # Errors
/// I/O errors naming the file.
pub fn write_lookup(dir: &Path, lookup: &Lookup) -> Result<(), Error> {
    std::fs::create_dir_all(dir).at("creating", dir)?;
    write_json(dir, LOOKUP_FILE, lookup)
}

/// Reads the lookup record in `dir` (no symlink followed, a regular file) and checks that
/// it describes this build: `runtime`, `epoch` and the dependency inputs `inputs`.
///
/// # Errors
/// A missing, malformed or mismatched record.
pub fn read_lookup(
    dir: &Path,
    runtime: &str,
    epoch: u64,
    inputs: Option<&DepInputs>,
) -> Result<Lookup, Error> {
    let dir_fd = open_dir(dir)?;
    let lookup: Lookup = read_json(&dir_fd, dir, LOOKUP_FILE)?;
    let none = || "none".to_string();
    let current = inputs.map(manifest_digest);
    let fields = [
        ("format", lookup.format.clone(), FORMAT.to_string()),
        ("runtime", lookup.runtime.clone(), runtime.to_string()),
        (
            "SOURCE_DATE_EPOCH",
            lookup.epoch.to_string(),
            epoch.to_string(),
        ),
        (
            "dependency manifest digest",
            lookup
                .manifest_digest
                .as_ref()
                .map_or_else(none, Digest::to_string),
            current.as_ref().map_or_else(none, Digest::to_string),
        ),
    ];
    for (field, recorded, current) in fields {
        if recorded != current {
            return Err(Error::Mismatch {
                path: dir.join(LOOKUP_FILE),
                field,
                recorded,
                current,
            });
        }
    }
    Ok(lookup)
}
