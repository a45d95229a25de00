//! Image indexes and Docker manifest lists
//! (<https://github.com/opencontainers/image-spec/blob/main/image-index.md>).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Descriptor, MediaType, Platform};

/// A multi-platform index (OCI) or manifest list (Docker).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// Always 2.
    pub schema_version: u32,
    /// The index's own media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<MediaType>,
    /// The manifests it lists.
    pub manifests: Vec<Descriptor>,
    /// Arbitrary metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

impl Index {
    /// The OCI image index kiln writes over `manifests` (each with its platform), as a
    /// document: canonical JSON, no annotations. A multi-platform build and the rebase of
    /// its index both make it here, so that the same manifests give the same digest.
    ///
    /// # Errors
    /// When it cannot be serialised.
    pub fn document(manifests: Vec<Descriptor>) -> serde_json::Result<super::Document> {
        let index = Index {
            schema_version: 2,
            media_type: Some(MediaType::OciIndex),
            manifests,
            annotations: None,
        };
        let bytes = super::canonical::to_vec(&index)?;
        Ok(super::Document::new(MediaType::OciIndex, bytes))
    }

    /// The first manifest entry for `wanted`.
    pub fn select(&self, wanted: &Platform) -> Option<&Descriptor> {
        self.manifests
            .iter()
            .filter(|d| d.media_type.is_manifest())
            .find(|d| d.platform.as_ref().is_some_and(|p| wanted.matches(p)))
    }

    /// The platforms listed, for error messages.
    pub fn platforms(&self) -> Vec<String> {
        self.manifests
            .iter()
            .filter_map(|d| d.platform.as_ref().map(ToString::to_string))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::Digest;

    fn entry(arch: &str) -> Descriptor {
        let mut d = Descriptor::new(MediaType::OciManifest, Digest::of(arch.as_bytes()), 1);
        d.platform = Platform::parse(&format!("linux/{arch}"));
        d
    }

    #[test]
    fn select_picks_the_matching_platform() {
        let index = Index {
            schema_version: 2,
            media_type: Some(MediaType::OciIndex),
            manifests: vec![entry("arm64"), entry("amd64")],
            annotations: None,
        };
        let got = index.select(&Platform::linux_amd64()).unwrap();
        assert_eq!(got.digest, Digest::of(b"amd64"));
        assert!(
            index
                .select(&Platform::parse("linux/s390x").unwrap())
                .is_none()
        );
        assert_eq!(index.platforms(), ["linux/arm64", "linux/amd64"]);
    }
}
