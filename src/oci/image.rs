//! Appending layers to a base image: the pure core of a build. Takes the base manifest and
//! config as exact bytes, adds layers and a config edit, and serialises the new config and
//! manifest once, canonically, in the base image's media-type family.

use std::collections::BTreeMap;

use super::{
    Descriptor, Digest, Document, Family, History, ImageConfig, Manifest, MediaType, canonical,
    manifest::sniff_media_type,
};

/// How the history of the dependency layer kiln adds for a Function begins (what tells a
/// Function's own layers from its base's).
pub const DEPS_HISTORY: &str = "kiln: dependencies (";
/// How the history of the source layer kiln adds for a Function begins.
pub const SOURCE_HISTORY: &str = "kiln: source (";

/// Errors appending to a base image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The base manifest is not a single-image manifest.
    #[error("base manifest {digest} has media type {media_type}, not an image manifest")]
    NotAManifest {
        /// Its digest.
        digest: Digest,
        /// What it is.
        media_type: MediaType,
    },
    /// The base manifest does not parse.
    #[error("parsing base manifest {digest}")]
    Manifest {
        /// Its digest.
        digest: Digest,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The base config does not parse.
    #[error("parsing base image config {digest}")]
    Config {
        /// Its digest.
        digest: Digest,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The config bytes are not the ones the manifest names.
    #[error("base config has digest {actual} but the manifest names {expected}")]
    ConfigMismatch {
        /// From the manifest.
        expected: Digest,
        /// Of the bytes given.
        actual: Digest,
    },
    /// Layer count and diff_id count differ in the base.
    #[error("base image has {layers} layers but {diff_ids} rootfs.diff_ids")]
    LayerCount {
        /// Manifest layers.
        layers: usize,
        /// Config diff_ids.
        diff_ids: usize,
    },
    /// Serialising the result.
    #[error("serialising the new image")]
    Serialise(#[source] serde_json::Error),
}

/// A base image: manifest and config as fetched, verified bytes.
#[derive(Clone, Debug)]
pub struct Base {
    /// The image manifest.
    pub manifest: Document,
    /// The image config.
    pub config: Document,
}

impl Base {
    /// The parsed manifest, after checking it is one.
    ///
    /// # Errors
    /// When the document is an index or does not parse.
    pub fn parse_manifest(&self) -> Result<Manifest, Error> {
        let digest = self.manifest.digest.clone();
        let media_type = sniff_media_type(&self.manifest.bytes)
            .unwrap_or_else(|| self.manifest.media_type.clone());
        if !media_type.is_manifest() {
            return Err(Error::NotAManifest { digest, media_type });
        }
        self.manifest
            .parse()
            .map_err(|source| Error::Manifest { digest, source })
    }

    /// The media-type family of the base, which the built image keeps.
    pub fn family(&self) -> Family {
        sniff_media_type(&self.manifest.bytes)
            .and_then(|m| m.family())
            .unwrap_or(Family::Oci)
    }
}

/// A layer to append: its blob descriptor (media type of the base's family), its diff_id,
/// and the history line describing it.
#[derive(Clone, Debug)]
pub struct NewLayer {
    /// The compressed blob.
    pub descriptor: Descriptor,
    /// The uncompressed digest.
    pub diff_id: Digest,
    /// `created_by` in the history entry.
    pub created_by: String,
}

/// What the build changes in the config. `None`/empty leaves the base's value.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConfigEdit {
    /// `created` of the config and of the new history entries (RFC 3339).
    pub created: String,
    /// Variables to set, in order; an existing key is replaced in place.
    pub env: Vec<(String, String)>,
    /// Labels to add or replace.
    pub labels: BTreeMap<String, String>,
    /// The user to run as.
    pub user: Option<String>,
    /// The working directory.
    pub working_dir: Option<String>,
    /// The entrypoint; setting it also resets `Cmd` to `cmd`, as Docker does.
    pub entrypoint: Option<Vec<String>>,
    /// Default arguments.
    pub cmd: Option<Vec<String>>,
    /// Ports to expose (`8080/tcp`).
    pub exposed_ports: Vec<String>,
    /// Annotations for an OCI manifest (Docker manifests have none).
    pub annotations: BTreeMap<String, String>,
}

/// A built image: its manifest and config as the exact bytes to store or push, and the full
/// list of layer descriptors (base first).
#[derive(Clone, Debug)]
pub struct Image {
    /// The manifest.
    pub manifest: Document,
    /// The config.
    pub config: Document,
    /// Every layer, base layers first.
    pub layers: Vec<Descriptor>,
}

/// Appends `layers` to `base` and applies `edit`.
///
/// # Errors
/// When the base is not a consistent image manifest and config.
pub fn append(base: &Base, layers: &[NewLayer], edit: &ConfigEdit) -> Result<Image, Error> {
    let family = base.family();
    let manifest = base.parse_manifest()?;
    if manifest.config.digest != base.config.digest {
        return Err(Error::ConfigMismatch {
            expected: manifest.config.digest.clone(),
            actual: base.config.digest.clone(),
        });
    }
    let mut config: ImageConfig = base.config.parse().map_err(|source| Error::Config {
        digest: base.config.digest.clone(),
        source,
    })?;
    let (n_layers, n_diffs) = (manifest.layers.len(), config.rootfs.diff_ids.len());
    if n_layers != n_diffs {
        return Err(Error::LayerCount {
            layers: n_layers,
            diff_ids: n_diffs,
        });
    }
    edit_config(&mut config, layers, edit);
    let config_doc = Document::new(
        family.config(),
        canonical::to_vec(&config).map_err(Error::Serialise)?,
    );

    let mut all_layers = manifest.layers.clone();
    all_layers.extend(layers.iter().map(|l| l.descriptor.clone()));
    let annotations =
        (family == Family::Oci && !edit.annotations.is_empty()).then(|| edit.annotations.clone());
    let new_manifest = Manifest {
        schema_version: 2,
        media_type: Some(family.manifest()),
        artifact_type: None,
        config: config_doc.descriptor(),
        layers: all_layers.clone(),
        subject: None,
        annotations,
    };
    let bytes = canonical::to_vec(&new_manifest).map_err(Error::Serialise)?;
    Ok(Image {
        manifest: Document::new(family.manifest(), bytes),
        config: config_doc,
        layers: all_layers,
    })
}

fn edit_config(config: &mut ImageConfig, layers: &[NewLayer], edit: &ConfigEdit) {
    // History stays aligned with diff_ids only if it already was; an inconsistent base
    // history (some tools write none) is left alone rather than made worse.
    let aligned = config.layer_history_len() == config.rootfs.diff_ids.len();
    for layer in layers {
        config.rootfs.diff_ids.push(layer.diff_id.clone());
        if aligned {
            config.history.push(History {
                created: Some(edit.created.clone()),
                created_by: Some(layer.created_by.clone()),
                comment: Some("kiln".into()),
                ..History::default()
            });
        }
    }
    config.created = Some(edit.created.clone());
    let run = config.config.get_or_insert_with(Default::default);
    for (key, value) in &edit.env {
        run.set_env(key, value);
    }
    if !edit.labels.is_empty() {
        let labels = run.labels.get_or_insert_with(BTreeMap::new);
        labels.extend(edit.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if let Some(user) = &edit.user {
        run.user = Some(user.clone());
    }
    if let Some(dir) = &edit.working_dir {
        run.working_dir = Some(dir.clone());
    }
    if let Some(entrypoint) = &edit.entrypoint {
        run.entrypoint = Some(entrypoint.clone());
        run.cmd = edit.cmd.clone();
    } else if let Some(cmd) = &edit.cmd {
        run.cmd = Some(cmd.clone());
    }
    if !edit.exposed_ports.is_empty() {
        let ports = run.exposed_ports.get_or_insert_with(BTreeMap::new);
        for port in &edit.exposed_ports {
            ports.insert(port.clone(), serde_json::json!({}));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fixed base: one layer, Docker-style extra fields, a history entry.
    pub(crate) fn fixed_base(family: Family) -> Base {
        let layer = Digest::of(b"base-layer");
        let config = format!(
            r#"{{"architecture":"amd64","os":"linux","docker_version":"x",
            "config":{{"Env":["PATH=/bin"],"Cmd":["/bin/sh"]}},
            "rootfs":{{"type":"layers","diff_ids":["{}"]}},
            "history":[{{"created_by":"base"}}]}}"#,
            Digest::of(b"base-diff")
        );
        let config = Document::new(family.config(), config.into_bytes());
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"{}\",\"config\":{{\"mediaType\":\"{}\",\
                \"digest\":\"{}\",\"size\":{}}},
            \"layers\":[{{\"mediaType\":\"{}\",\"digest\":\"{}\",\"size\":10}}]}}",
            family.manifest(),
            family.config(),
            config.digest,
            config.bytes.len(),
            family.layer_gzip(),
            layer
        );
        Base {
            manifest: Document::new(family.manifest(), manifest.into_bytes()),
            config,
        }
    }

    fn new_layer(family: Family) -> NewLayer {
        NewLayer {
            descriptor: Descriptor::new(family.layer_gzip(), Digest::of(b"src"), 3),
            diff_id: Digest::of(b"src-diff"),
            created_by: "kiln: source".into(),
        }
    }

    fn edit() -> ConfigEdit {
        ConfigEdit {
            created: "1970-01-01T00:00:00Z".into(),
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("FUNC_PORT".into(), "8080".into()),
            ],
            user: Some("1000".into()),
            entrypoint: Some(vec!["node".into(), "server.js".into()]),
            ..ConfigEdit::default()
        }
    }

    #[test]
    fn append_keeps_the_family_base_fields_and_aligns_history() {
        for family in [Family::Oci, Family::Docker] {
            let image = append(&fixed_base(family), &[new_layer(family)], &edit()).unwrap();
            let m: Manifest = image.manifest.parse().unwrap();
            assert_eq!(m.media_type, Some(family.manifest()));
            assert_eq!(m.config.media_type, family.config());
            assert_eq!(m.layers.len(), 2);
            let c: ImageConfig = image.config.parse().unwrap();
            assert_eq!(c.rootfs.diff_ids.len(), 2);
            assert_eq!(c.history.len(), 2);
            assert_eq!(c.extra["docker_version"], "x");
            let run = c.config.unwrap();
            assert_eq!(run.env.unwrap(), ["PATH=/usr/bin", "FUNC_PORT=8080"]);
            assert_eq!(run.cmd, None, "setting the entrypoint resets Cmd");
            assert_eq!(image.manifest.digest, Digest::of(&image.manifest.bytes));
        }
    }

    /// Golden: the manifest digest of a fixed append. See layer.rs for when to regenerate.
    #[test]
    fn a_fixed_append_has_a_golden_manifest_digest() {
        let image = append(&fixed_base(Family::Oci), &[new_layer(Family::Oci)], &edit()).unwrap();
        assert_eq!(
            image.manifest.digest.to_string(),
            "sha256:9302c1fa73f532c09ea0386079aaa80d3d61a11dbb54b69f0b1550feefd5a2de"
        );
    }

    #[test]
    fn a_config_that_is_not_the_manifests_is_rejected() {
        let mut base = fixed_base(Family::Oci);
        base.config = Document::new(MediaType::OciConfig, b"{}".to_vec());
        assert!(matches!(
            append(&base, &[], &edit()),
            Err(Error::ConfigMismatch { .. })
        ));
    }
}
