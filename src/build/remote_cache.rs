//! The dependency-layer cache in a registry (`--cache-repo REPO`), shared by build Pods on
//! any node. Each entry is a small OCI artifact tagged `deps-<key hex>`: an image manifest
//! with `artifactType` [`ARTIFACT_TYPE`], the empty config, and one layer — the dependency
//! layer, annotated with its diff ID — plus annotations naming the key and its inputs
//! (digests only: registry configs may hold tokens).
//!
//! A hit is one manifest `GET`; the layer is then mounted into the target when both are on
//! one registry (no download, no upload), else downloaded — verified against its digest and
//! diff ID — into the local cache and uploaded. An entry that is not exactly what kiln
//! writes for this key is ignored with a warning and the dependencies are installed. A miss
//! installs and pushes the entry after the image. A cache repository that cannot be used
//! (credentials, network) costs a warning, never the build. The local cache is checked
//! first.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;

use super::cache;
use super::function::DepInputs;
use super::options::Options;
use crate::oci;
use crate::oci::{Descriptor, Digest, Document, MediaType};
use crate::registry::{self, BlobSource, Client, Reference};

/// The artifact type of a cache entry.
pub const ARTIFACT_TYPE: &str = "application/vnd.kiln.dependencies.v1";
/// The OCI empty descriptor's media type (the entry's config).
const EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// Annotation on the entry's layer: the layer's diff ID.
const DIFF_ID: &str = "dev.kiln.dependencies.diff-id";
/// Annotation on the entry: the dependency key.
const KEY: &str = "dev.kiln.dependencies.key";

/// The tag of the entry for `key`.
pub fn tag(key: &Digest) -> String {
    format!("deps-{}", key.hex())
}

/// A usable entry: the layer and where it is.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The compressed layer.
    pub digest: Digest,
    /// Its diff ID (from the entry; verified when the layer is downloaded).
    pub diff_id: Digest,
    /// Its size.
    pub size: u64,
    /// The cache repository.
    pub repo: Reference,
}

/// Looks up `key` in `repo`. `Ok(None)` when there is no entry or it is not one kiln wrote
/// for this key (warned); `Err` when the repository cannot be read.
///
/// # Errors
/// Registry errors other than a missing tag or repository.
pub async fn lookup(
    client: &Client,
    repo: &Reference,
    key: &Digest,
) -> Result<Option<Entry>, registry::Error> {
    let tagged = repo.with_tag(&tag(key))?;
    let doc = match client
        .get_manifest(&tagged, &[MediaType::OciManifest])
        .await
    {
        Ok(doc) => doc,
        Err(registry::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    match parse(&doc, key) {
        Ok((digest, diff_id, size)) => Ok(Some(Entry {
            digest,
            diff_id,
            size,
            repo: repo.repository_only(),
        })),
        Err(problem) => {
            tracing::warn!(
                entry = %tagged,
                problem,
                "ignoring a dependency cache entry kiln did not write for this key; installing",
            );
            Ok(None)
        }
    }
}

/// The layer of an entry, if the document is exactly an entry for `key`.
fn parse(doc: &Document, key: &Digest) -> Result<(Digest, Digest, u64), &'static str> {
    let v: serde_json::Value = doc.parse().map_err(|_| "not JSON")?;
    if v["artifactType"] != ARTIFACT_TYPE {
        return Err("another artifactType");
    }
    if v["annotations"][KEY] != key.to_string() {
        return Err("another dependency key");
    }
    let layers = v["layers"].as_array().ok_or("no layers")?;
    let [layer] = layers.as_slice() else {
        return Err("not exactly one layer");
    };
    let descriptor: Descriptor =
        serde_json::from_value(layer.clone()).map_err(|_| "a malformed layer descriptor")?;
    if !matches!(
        descriptor.media_type,
        MediaType::OciLayerGzip | MediaType::OciLayerZstd
    ) {
        return Err("a layer that is not a gzip or zstd OCI layer");
    }
    let diff_id = layer["annotations"][DIFF_ID]
        .as_str()
        .and_then(|d| d.parse::<Digest>().ok())
        .ok_or("no diff ID")?;
    Ok((descriptor.digest, diff_id, descriptor.size))
}

/// What an entry says about the key's inputs (digests and names only).
pub struct Describe<'a> {
    /// The runtime.
    pub runtime: &'a str,
    /// The install command.
    pub install: &'a str,
    /// The inputs.
    pub inputs: &'a DepInputs,
    /// `SOURCE_DATE_EPOCH`.
    pub epoch: u64,
}

/// The entry document for a layer.
pub fn entry_manifest(
    key: &Digest,
    layer: &Descriptor,
    diff_id: &Digest,
    about: &Describe<'_>,
) -> Document {
    let mut annotations = BTreeMap::from([
        (KEY.to_string(), key.to_string()),
        (
            "dev.kiln.dependencies.runtime".to_string(),
            about.runtime.to_string(),
        ),
        (
            "dev.kiln.dependencies.install".to_string(),
            about.install.to_string(),
        ),
        (
            "dev.kiln.dependencies.epoch".to_string(),
            about.epoch.to_string(),
        ),
        (
            "org.opencontainers.image.created".to_string(),
            crate::oci::rfc3339(about.epoch),
        ),
    ]);
    let files = std::iter::once(&about.inputs.manifest)
        .chain(&about.inputs.lock)
        .chain(&about.inputs.configs);
    for file in files {
        annotations.insert(
            format!("dev.kiln.dependencies.file.{}", file.name),
            Digest::of(&file.bytes).to_string(),
        );
    }
    let empty = Digest::of(b"{}");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MediaType::OciManifest.as_str(),
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY, "digest": empty, "size": 2, "data": "e30="},
        "layers": [{
            "mediaType": layer.media_type.as_str(),
            "digest": layer.digest,
            "size": layer.size,
            "annotations": {DIFF_ID: diff_id},
        }],
        "annotations": annotations,
    });
    let bytes = serde_json::to_vec(&manifest).unwrap_or_default();
    Document::new(MediaType::OciManifest, bytes)
}

/// Pushes the entry for a freshly installed layer: the layer (mounted from `mount_from` on
/// the same registry, else uploaded from `local`), the empty config, the manifest last.
///
/// # Errors
/// Registry errors.
pub async fn store(
    client: &Client,
    repo: &Reference,
    key: &Digest,
    entry: &Document,
    layer: &Descriptor,
    local: &std::path::Path,
    mount_from: Option<&str>,
) -> Result<(), registry::Error> {
    let empty = Descriptor::new(MediaType::from(EMPTY), Digest::of(b"{}"), 2);
    client
        .push_blob(
            repo,
            layer,
            BlobSource::File(local.to_path_buf()),
            mount_from,
        )
        .await?;
    client
        .push_blob(
            repo,
            &empty,
            BlobSource::Bytes(b"{}".as_slice().into()),
            None,
        )
        .await?;
    let tagged = repo.with_tag(&tag(key))?;
    client.put_manifest(&tagged, entry).await?;
    Ok(())
}

/// Pushes the cache repository entry of the dependency layer `layer` (its bytes at `local`,
/// or mounted from `mount_from` on the same registry) for `key`.
#[allow(clippy::too_many_arguments)]
pub async fn push_cache_entry(
    client: &Client,
    opts: &Options,
    repo: &Reference,
    key: &Digest,
    layer: &cache::CachedLayer,
    inputs: &DepInputs,
    install: &str,
    local: &Path,
    mount_from: Option<&str>,
) -> Result<(), crate::registry::Error> {
    let about = Describe {
        runtime: &opts.runtime.name,
        install,
        inputs,
        epoch: opts.epoch,
    };
    let descriptor = oci::Descriptor::new(
        super::dependency_media_type(opts.compression),
        layer.digest.clone(),
        layer.size,
    );
    let entry = entry_manifest(key, &descriptor, &layer.diff_id, &about);
    store(client, repo, key, &entry, &descriptor, local, mount_from).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::function::{DepInputs, NamedBytes};

    fn entry_key(entry: &Document) -> Option<Digest> {
        let v: serde_json::Value = entry.parse().ok()?;
        v["annotations"][KEY].as_str()?.parse().ok()
    }

    fn inputs() -> DepInputs {
        DepInputs {
            manifest: NamedBytes {
                name: "package.json".into(),
                bytes: b"{}".to_vec(),
            },
            lock: None,
            configs: vec![NamedBytes {
                name: ".npmrc".into(),
                bytes: b"//reg/:_authToken=secret".to_vec(),
            }],
        }
    }

    #[test]
    fn an_entry_parses_back_and_names_no_secret() {
        let key = Digest::of(b"key");
        let layer = Descriptor::new(MediaType::OciLayerGzip, Digest::of(b"layer"), 5);
        let diff_id = Digest::of(b"tar");
        let inputs = inputs();
        let about = Describe {
            runtime: "nodejs22",
            install: "npm ci",
            inputs: &inputs,
            epoch: 0,
        };
        let doc = entry_manifest(&key, &layer, &diff_id, &about);
        assert_eq!(parse(&doc, &key), Ok((layer.digest.clone(), diff_id, 5)));
        assert_eq!(entry_key(&doc), Some(key.clone()));
        assert!(!String::from_utf8_lossy(&doc.bytes).contains("secret"));
        assert_eq!(
            parse(&doc, &Digest::of(b"other")),
            Err("another dependency key")
        );
        let tampered = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_slice(&doc.bytes).unwrap();
            f(&mut v);
            let bytes = serde_json::to_vec(&v).unwrap();
            parse(&Document::new(MediaType::OciManifest, bytes), &key)
        };
        assert!(tampered(&|v| v["artifactType"] = json!("x")).is_err());
        assert!(tampered(&|v| v["layers"][0]["annotations"] = json!({})).is_err());
        assert!(tampered(&|v| v["layers"][0]["mediaType"] = json!("application/x")).is_err());
        assert!(
            tampered(&|v| {
                let l = v["layers"][0].clone();
                v["layers"] = json!([l.clone(), l]);
            })
            .is_err()
        );
    }
}
