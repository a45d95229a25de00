//! The SBOM attestation of a signed build ([`crate::sbom`]): the base's packages, read from
//! the SBOM layer of a kiln base, and the packages in the Function's own layers. What a layer
//! holds depends on its bytes alone, so each layer is read once: its components are kept in
//! `<cache>/sbom/<digest hex>.json`, and a source-only rebuild reads only its new source layer
//! (a few KiB) and two small files.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::error::Error;
use crate::image::resolve::{BaseLocation, ResolvedBase};
use crate::oci::{Descriptor, Digest};
use crate::registry::{Client, Reference};
use crate::sbom::{self, Component};

/// Where one of the image's layers can be read.
#[derive(Clone, Debug)]
pub(crate) struct LayerAt {
    /// The layer.
    pub descriptor: Descriptor,
    /// Its local file, if there is one.
    pub local: Option<PathBuf>,
    /// Else the repository that holds it.
    pub remote: Option<Reference>,
}

/// The signed SBOM's in-toto Statement for the image `repository@digest` built on `base`,
/// whose own layers are `layers`.
///
/// # Errors
/// A layer that cannot be read or is not a tar, or a base SBOM that does not parse.
pub(crate) async fn statement(
    client: &Client,
    cache_dir: &Path,
    base: &ResolvedBase,
    layers: &[LayerAt],
    repository: &str,
    digest: &Digest,
) -> Result<Vec<u8>, Error> {
    let dir = cache_dir.join("sbom");
    let mut components = Vec::new();
    if let Some(at) = base_sbom_layer(base)? {
        components.extend(cached(client, &dir, &at, Read::BaseSbom).await?);
    }
    for at in layers {
        components.extend(cached(client, &dir, at, Read::Packages).await?);
    }
    let subject = sbom::Subject {
        repository,
        digest,
        base: (&base.name, &base.base.manifest.digest),
    };
    let statement = sbom::statement(&subject, sbom::document(&subject, &components));
    Ok(serde_json::to_vec(&statement).expect("a JSON value serialises"))
}

/// The base's SBOM layer, found by its history entry ([`sbom::BASE_SBOM_HISTORY`]); `None`
/// for a base kiln did not make.
fn base_sbom_layer(base: &ResolvedBase) -> Result<Option<LayerAt>, Error> {
    let fail = |e: String| Error::Sbom(format!("reading the base {}: {e}", base.name));
    let config: serde_json::Value =
        serde_json::from_slice(&base.base.config.bytes).map_err(|e| fail(e.to_string()))?;
    let manifest = base
        .base
        .parse_manifest()
        .map_err(|e| fail(e.to_string()))?;
    let mut index = 0;
    for entry in config["history"].as_array().into_iter().flatten() {
        if entry["empty_layer"].as_bool() == Some(true) {
            continue;
        }
        if entry["created_by"] == sbom::BASE_SBOM_HISTORY {
            let Some(descriptor) = manifest.layers.get(index).cloned() else {
                return Ok(None);
            };
            let (local, remote) = match &base.location {
                BaseLocation::Layout(layout) => (Some(layout.blob_path(&descriptor.digest)), None),
                BaseLocation::Registry(r) => (None, Some(r.clone())),
            };
            return Ok(Some(LayerAt {
                descriptor,
                local,
                remote,
            }));
        }
        index += 1;
    }
    Ok(None)
}

/// What to read from a layer.
#[derive(Clone, Copy)]
enum Read {
    /// A kiln base's `sbom.json`.
    BaseSbom,
    /// Every package in it.
    Packages,
}

/// The components of the layer `at`, from the cache or read (and then cached).
async fn cached(
    client: &Client,
    dir: &Path,
    at: &LayerAt,
    read: Read,
) -> Result<Vec<Component>, Error> {
    let path = dir.join(format!("{}.json", at.descriptor.digest.hex()));
    if let Ok(bytes) = std::fs::read(&path)
        && let Ok(components) = serde_json::from_slice(&bytes)
    {
        return Ok(components);
    }
    let what = |e: &dyn std::fmt::Display| {
        Error::Sbom(format!("reading layer {}: {e}", at.descriptor.digest))
    };
    let components = match (&at.local, &at.remote) {
        (Some(local), _) => {
            let file = local.clone();
            tokio::task::spawn_blocking(move || {
                let open = std::fs::File::open(&file)?;
                read_layer(&mut BufReader::new(open), read)
            })
            .await?
        }
        // Streamed as it arrives (its digest checked), into no file.
        (None, Some(repo)) => client
            .read_blob(repo, &at.descriptor, move |r| {
                read_layer(&mut BufReader::new(r), read)
            })
            .await
            .map_err(|e| what(&e))?,
        (None, None) => return Ok(Vec::new()),
    }
    .map_err(|e| what(&e))?;
    // Kept for next time; a cache that cannot be written costs only a re-read.
    if std::fs::create_dir_all(dir).is_ok()
        && let Ok(tmp) = tempfile::NamedTempFile::new_in(dir)
        && std::fs::write(
            tmp.path(),
            serde_json::to_vec(&components).unwrap_or_default(),
        )
        .is_ok()
    {
        let _ = tmp.persist(&path);
    }
    Ok(components)
}

fn read_layer(layer: &mut dyn std::io::BufRead, read: Read) -> std::io::Result<Vec<Component>> {
    let tar = crate::oci::layer::decompressed(layer)?;
    match read {
        Read::Packages => sbom::layer_components(tar),
        Read::BaseSbom => match sbom::file_in_layer(tar, sbom::BASE_SBOM_PATH)? {
            Some(bytes) => sbom::base_components(&bytes).map_err(std::io::Error::other),
            None => Err(std::io::Error::other(format!(
                "it has no {}",
                sbom::BASE_SBOM_PATH
            ))),
        },
    }
}
