//! Image manifests (<https://github.com/opencontainers/image-spec/blob/main/manifest.md>), in
//! either family, and [`Document`]: a JSON document's exact bytes kept with their digest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Descriptor, Digest, MediaType};

/// An image manifest (OCI or Docker v2 schema 2: the shapes are the same).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// The manifest's own media type; optional in OCI (umoci omits it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<MediaType>,
    /// Artifact type, for artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The image config.
    pub config: Descriptor,
    /// Layers, base first.
    pub layers: Vec<Descriptor>,
    /// A manifest this one refers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    /// Arbitrary metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A JSON document (manifest, index or config) as exact bytes, with its media type and digest.
/// Fetched documents are never re-serialised: these bytes are what was verified and what is
/// written or pushed.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// The media type it is stored or served as.
    pub media_type: MediaType,
    /// The digest of `bytes`.
    pub digest: Digest,
    /// The exact bytes.
    pub bytes: Vec<u8>,
}

impl Document {
    /// Wraps bytes, computing their digest.
    pub fn new(media_type: MediaType, bytes: Vec<u8>) -> Document {
        Document {
            media_type,
            digest: Digest::of(&bytes),
            bytes,
        }
    }

    /// A descriptor pointing at this document.
    pub fn descriptor(&self) -> Descriptor {
        Descriptor::new(
            self.media_type.clone(),
            self.digest.clone(),
            self.bytes.len() as u64,
        )
    }

    /// Parses the bytes as `T`.
    ///
    /// # Errors
    /// When the bytes are not JSON of that shape.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.bytes)
    }
}

/// The fields needed to tell a manifest from an index before parsing it fully.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sniff {
    media_type: Option<MediaType>,
    manifests: Option<serde_json::Value>,
    config: Option<serde_json::Value>,
}

/// The media type JSON bytes name in their `mediaType` field, if they name one.
pub fn named_media_type(bytes: &[u8]) -> Option<MediaType> {
    serde_json::from_slice::<Sniff>(bytes).ok()?.media_type
}

/// Works out the media type of manifest-or-index bytes from their `mediaType` field, or, when
/// that is absent (allowed by OCI), from their shape.
pub fn sniff_media_type(bytes: &[u8]) -> Option<MediaType> {
    let sniff: Sniff = serde_json::from_slice(bytes).ok()?;
    match (sniff.media_type, sniff.manifests, sniff.config) {
        (Some(m), _, _) => Some(m),
        (None, Some(_), _) => Some(MediaType::OciIndex),
        (None, None, Some(_)) => Some(MediaType::OciManifest),
        _ => None,
    }
}
