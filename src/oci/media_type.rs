//! Media types of the OCI image-spec and of Docker's image manifest v2 schema 2, and the
//! family (OCI or Docker) a built image keeps so that it matches its base.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A media type; the known ones are variants, anything else is kept verbatim.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum MediaType {
    /// `application/vnd.oci.image.manifest.v1+json`
    OciManifest,
    /// `application/vnd.oci.image.index.v1+json`
    OciIndex,
    /// `application/vnd.oci.image.config.v1+json`
    OciConfig,
    /// `application/vnd.oci.image.layer.v1.tar+gzip`
    OciLayerGzip,
    /// `application/vnd.oci.image.layer.v1.tar`
    OciLayer,
    /// `application/vnd.oci.image.layer.v1.tar+zstd`
    OciLayerZstd,
    /// `application/vnd.docker.distribution.manifest.v2+json`
    DockerManifest,
    /// `application/vnd.docker.distribution.manifest.list.v2+json`
    DockerManifestList,
    /// `application/vnd.docker.container.image.v1+json`
    DockerConfig,
    /// `application/vnd.docker.image.rootfs.diff.tar.gzip`
    DockerLayerGzip,
    /// `application/vnd.docker.image.rootfs.foreign.diff.tar.gzip`
    DockerForeignLayerGzip,
    /// Any other media type.
    Other(String),
}

const TABLE: [(MediaType, &str); 11] = [
    (
        MediaType::OciManifest,
        "application/vnd.oci.image.manifest.v1+json",
    ),
    (
        MediaType::OciIndex,
        "application/vnd.oci.image.index.v1+json",
    ),
    (
        MediaType::OciConfig,
        "application/vnd.oci.image.config.v1+json",
    ),
    (
        MediaType::OciLayerGzip,
        "application/vnd.oci.image.layer.v1.tar+gzip",
    ),
    (
        MediaType::OciLayer,
        "application/vnd.oci.image.layer.v1.tar",
    ),
    (
        MediaType::OciLayerZstd,
        "application/vnd.oci.image.layer.v1.tar+zstd",
    ),
    (
        MediaType::DockerManifest,
        "application/vnd.docker.distribution.manifest.v2+json",
    ),
    (
        MediaType::DockerManifestList,
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ),
    (
        MediaType::DockerConfig,
        "application/vnd.docker.container.image.v1+json",
    ),
    (
        MediaType::DockerLayerGzip,
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    ),
    (
        MediaType::DockerForeignLayerGzip,
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    ),
];

impl MediaType {
    /// The media type string.
    pub fn as_str(&self) -> &str {
        match self {
            MediaType::Other(s) => s,
            known => TABLE
                .iter()
                .find(|(m, _)| m == known)
                .map(|(_, s)| *s)
                .expect("every known variant is in TABLE"),
        }
    }

    /// Whether this names a single-image manifest.
    pub fn is_manifest(&self) -> bool {
        matches!(self, MediaType::OciManifest | MediaType::DockerManifest)
    }

    /// Whether this names a multi-platform index or manifest list.
    pub fn is_index(&self) -> bool {
        matches!(self, MediaType::OciIndex | MediaType::DockerManifestList)
    }

    /// Whether this names a layer blob (plain, gzip or foreign).
    pub fn is_layer(&self) -> bool {
        match self {
            MediaType::OciLayerGzip
            | MediaType::OciLayer
            | MediaType::OciLayerZstd
            | MediaType::DockerLayerGzip
            | MediaType::DockerForeignLayerGzip => true,
            MediaType::Other(s) => s.starts_with("application/vnd.oci.image.layer."),
            _ => false,
        }
    }

    /// The family a manifest, index, config or layer type belongs to, if any.
    pub fn family(&self) -> Option<Family> {
        match self {
            MediaType::DockerManifest
            | MediaType::DockerManifestList
            | MediaType::DockerConfig
            | MediaType::DockerLayerGzip
            | MediaType::DockerForeignLayerGzip => Some(Family::Docker),
            MediaType::Other(s) if s.starts_with("application/vnd.oci.") => Some(Family::Oci),
            MediaType::Other(_) => None,
            _ => Some(Family::Oci),
        }
    }
}

impl From<&str> for MediaType {
    fn from(s: &str) -> Self {
        TABLE
            .iter()
            .find(|(_, t)| *t == s)
            .map(|(m, _)| m.clone())
            .unwrap_or_else(|| MediaType::Other(s.to_string()))
    }
}

impl fmt::Display for MediaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for MediaType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for MediaType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(MediaType::from(String::deserialize(deserializer)?.as_str()))
    }
}

/// The two media-type families; a built image uses its base image's family throughout.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Family {
    /// OCI image-spec media types.
    Oci,
    /// Docker image manifest v2 schema 2 media types.
    Docker,
}

impl Family {
    /// The single-image manifest type.
    pub fn manifest(self) -> MediaType {
        match self {
            Family::Oci => MediaType::OciManifest,
            Family::Docker => MediaType::DockerManifest,
        }
    }

    /// The image config type.
    pub fn config(self) -> MediaType {
        match self {
            Family::Oci => MediaType::OciConfig,
            Family::Docker => MediaType::DockerConfig,
        }
    }

    /// The gzip-compressed layer type.
    pub fn layer_gzip(self) -> MediaType {
        match self {
            Family::Oci => MediaType::OciLayerGzip,
            Family::Docker => MediaType::DockerLayerGzip,
        }
    }

    /// The layer type for `compression`; `None` when the family has none (Docker's v2
    /// schema 2 defines no zstd layer).
    pub fn layer(self, compression: Compression) -> Option<MediaType> {
        match (self, compression) {
            (_, Compression::Gzip) => Some(self.layer_gzip()),
            (Family::Oci, Compression::Zstd) => Some(MediaType::OciLayerZstd),
            (Family::Docker, Compression::Zstd) => None,
        }
    }
}

/// How kiln compresses the layers it writes (`--compression`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Deterministic gzip at a fixed level, in parallel blocks for large layers: what every
    /// registry and runtime reads.
    #[default]
    Gzip,
    /// Zstandard (pure Rust, its fastest level): for registries and runtimes that accept
    /// OCI zstd layers (containerd 1.5+, CRI-O, Podman).
    Zstd,
}

impl Compression {
    /// The compression a layer media type names (`None`: neither gzip nor zstd).
    pub fn of(media_type: &MediaType) -> Option<Compression> {
        let s = media_type.as_str();
        if s.ends_with("+zstd") {
            Some(Compression::Zstd)
        } else if s.ends_with("+gzip") || s.ends_with(".tar.gzip") {
            Some(Compression::Gzip)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_types_round_trip_and_unknown_ones_are_kept() {
        for (m, s) in TABLE.iter() {
            assert_eq!(MediaType::from(*s), *m);
            assert_eq!(m.as_str(), *s);
        }
        let other = MediaType::from("application/x-thing");
        assert_eq!(other.as_str(), "application/x-thing");
        assert_eq!(other.family(), None);
    }

    #[test]
    fn families_are_recognised() {
        assert_eq!(MediaType::DockerLayerGzip.family(), Some(Family::Docker));
        assert_eq!(MediaType::OciIndex.family(), Some(Family::Oci));
        assert!(MediaType::from("application/vnd.oci.image.layer.v1.tar+zstd").is_layer());
    }
}
