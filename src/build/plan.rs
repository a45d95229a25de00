//! Pure build planning: the config edit a Function's image gets (runtime env, user, labels,
//! annotations) and the image key that identifies a build's inputs (its `dev.kiln.build-key`
//! label; not the controller's build key, which is computed before any layer exists). No I/O.

use std::collections::BTreeMap;

use crate::oci::{ConfigEdit, Digest, Hasher};
use crate::runtime::RuntimeSpec;

/// Label carrying the image key.
pub const BUILD_KEY_LABEL: &str = "dev.kiln.build-key";
/// Label carrying the runtime name.
pub const RUNTIME_LABEL: &str = "dev.kiln.runtime";
/// Label naming what installed the dependency layer, as its key does: kiln's lock-file or
/// pinned-wheel install for a platform, or a builder image by digest. `kiln rebase` reads it.
pub const DEPS_TOOLCHAIN_LABEL: &str = "dev.kiln.deps.toolchain";
pub use crate::oci::image::{DEPS_HISTORY, SOURCE_HISTORY};

/// Everything the config edit depends on.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// The runtime.
    pub runtime: &'a RuntimeSpec,
    /// `FUNC_NAME`.
    pub function_name: &'a str,
    /// `SERVICE_NAMESPACE`.
    pub namespace: &'a str,
    /// `SOURCE_DATE_EPOCH`: the only timestamp in the image.
    pub epoch: u64,
    /// The base image's registry reference; `None` for a local layout, whose path is not a
    /// portable name (and would make the digest depend on where the checkout lives).
    pub base_name: Option<&'a str>,
    /// The base manifest digest.
    pub base_digest: &'a Digest,
    /// What installed the dependency layer ([`DEPS_TOOLCHAIN_LABEL`]); `None` without one.
    pub deps_toolchain: Option<&'a str>,
}

/// What the image is made of besides the config edit: the base, and the layers kiln adds as
/// their history names them.
#[derive(Clone, Copy, Debug)]
pub struct KeyLayers<'a> {
    /// The runtime name.
    pub runtime: &'a str,
    /// The base manifest digest.
    pub base: &'a Digest,
    /// The dependency key (what decides the dependency layer's bytes; the layer itself need
    /// not exist yet), `None` without dependencies.
    pub deps: Option<&'a Digest>,
    /// The source layer's diff ID.
    pub source_diff_id: &'a Digest,
    /// The source layer's history text.
    pub source_created_by: &'a str,
    /// How the new layers are compressed.
    pub compression: crate::oci::Compression,
}

/// The image key: a digest over every input of the image — the exact base manifest, the
/// dependency key, the source layer and its history text, and the whole config edit (runtime
/// contract, names, epoch, base name) but the key itself. Same key, same image; it is known
/// before any dependency is installed or any blob uploaded, which is what lets a build find
/// that its image already exists.
pub fn image_key(layers: &KeyLayers<'_>, edit: &ConfigEdit) -> Digest {
    let mut h = Hasher::new();
    let none = String::from("none");
    let edit = serde_json::to_string(edit).unwrap_or_default();
    // Gzip keys stay what they were before zstd existed.
    let compression = match layers.compression {
        crate::oci::Compression::Gzip => None,
        crate::oci::Compression::Zstd => Some("compression zstd"),
    };
    for part in [
        "kiln-build-v2",
        layers.runtime,
        &layers.base.to_string(),
        &layers.deps.map_or(none, ToString::to_string),
        &layers.source_diff_id.to_string(),
        layers.source_created_by,
        &edit,
    ]
    .into_iter()
    .chain(compression)
    {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finish().0
}

/// The config edit for a Function image, without the image key ([`with_image_key`] adds it).
pub fn config_edit(input: &PlanInput<'_>) -> ConfigEdit {
    let created = crate::oci::rfc3339(input.epoch);
    let mut env: Vec<(String, String)> = input
        .runtime
        .image
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.push(("FUNC_NAME".into(), input.function_name.into()));
    env.push(("SERVICE_NAMESPACE".into(), input.namespace.into()));
    let oci = |k: &str| format!("org.opencontainers.image.{k}");
    let mut labels = BTreeMap::from([
        (RUNTIME_LABEL.to_string(), input.runtime.name.clone()),
        (oci("created"), created.clone()),
        (oci("title"), input.function_name.to_string()),
        (oci("base.digest"), input.base_digest.to_string()),
    ]);
    let mut annotations = BTreeMap::from([
        (oci("created"), created.clone()),
        (oci("base.digest"), input.base_digest.to_string()),
    ]);
    if let Some(toolchain) = input.deps_toolchain {
        // The toolchain on PATH prints a line per tool.
        let one_line: Vec<&str> = toolchain.lines().map(str::trim).collect();
        labels.insert(DEPS_TOOLCHAIN_LABEL.to_string(), one_line.join("; "));
    }
    if let Some(name) = input.base_name {
        labels.insert(oci("base.name"), name.to_string());
        annotations.insert(oci("base.name"), name.to_string());
    }
    ConfigEdit {
        created,
        env,
        labels,
        user: input.runtime.image.user.clone(),
        working_dir: input.runtime.image.workdir.clone(),
        entrypoint: input.runtime.image.entrypoint.clone(),
        cmd: None,
        exposed_ports: input.runtime.image.ports.clone(),
        annotations,
    }
}

/// The edit with the image key as a config label and a manifest annotation (so one manifest
/// fetch tells whether a tag holds this build).
pub fn with_image_key(mut edit: ConfigEdit, key: &Digest) -> ConfigEdit {
    edit.labels
        .insert(BUILD_KEY_LABEL.to_string(), key.to_string());
    edit.annotations
        .insert(BUILD_KEY_LABEL.to_string(), key.to_string());
    edit
}

/// The tag `--tag-by-key` gives an image: `kiln-` and the key's hex.
pub fn key_tag(key: &Digest) -> String {
    format!("kiln-{}", key.hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edit_carries_the_runtime_contract_env_and_labels() {
        let catalog = crate::runtime::Catalog::embedded();
        let runtime = catalog.get("nodejs22").unwrap();
        let d = Digest::of(b"base");
        let input = PlanInput {
            runtime,
            function_name: "hello",
            namespace: "team",
            epoch: 0,
            base_name: Some("reg/base:1"),
            base_digest: &d,
            deps_toolchain: None,
        };
        let layers = KeyLayers {
            runtime: "nodejs22",
            base: &d,
            deps: None,
            source_diff_id: &Digest::of(b"src"),
            source_created_by: "kiln: source",
            compression: crate::oci::Compression::Gzip,
        };
        let key = image_key(&layers, &config_edit(&input));
        let edit = with_image_key(config_edit(&input), &key);
        let env: BTreeMap<_, _> = edit.env.iter().cloned().collect();
        assert_eq!(env["FUNC_NAME"], "hello");
        assert_eq!(env["SERVICE_NAMESPACE"], "team");
        assert_eq!(env["FUNC_RUNTIME"], "nodejs22");
        assert_eq!(env["FUNC_PORT"], "8080");
        assert_eq!(edit.labels[BUILD_KEY_LABEL], key.to_string());
        assert_eq!(edit.annotations[BUILD_KEY_LABEL], key.to_string());
        assert_eq!(edit.user.as_deref(), Some("1000"));
        assert_eq!(key_tag(&key).len(), 69);
    }

    #[test]
    fn every_input_of_the_image_changes_the_build_key() {
        let catalog = crate::runtime::Catalog::embedded();
        let runtime = catalog.get("nodejs22").unwrap();
        let (d, src) = (Digest::of(b"base"), Digest::of(b"src"));
        let input = PlanInput {
            runtime,
            function_name: "hello",
            namespace: "team",
            epoch: 0,
            base_name: None,
            base_digest: &d,
            deps_toolchain: None,
        };
        let layers = KeyLayers {
            runtime: "nodejs22",
            base: &d,
            deps: None,
            source_diff_id: &src,
            source_created_by: "kiln: source",
            compression: crate::oci::Compression::Gzip,
        };
        let key = |l: &KeyLayers<'_>, i: &PlanInput<'_>| image_key(l, &config_edit(i));
        let reference = key(&layers, &input);
        assert_eq!(reference, key(&layers, &input), "deterministic");
        let other = Digest::of(b"other");
        let changed = [
            key(
                &KeyLayers {
                    base: &other,
                    ..layers
                },
                &input,
            ),
            key(
                &KeyLayers {
                    deps: Some(&d),
                    ..layers
                },
                &input,
            ),
            key(
                &KeyLayers {
                    source_diff_id: &other,
                    ..layers
                },
                &input,
            ),
            key(
                &KeyLayers {
                    source_created_by: "x",
                    ..layers
                },
                &input,
            ),
            key(
                &KeyLayers {
                    compression: crate::oci::Compression::Zstd,
                    ..layers
                },
                &input,
            ),
            key(
                &layers,
                &PlanInput {
                    function_name: "other",
                    ..input.clone()
                },
            ),
            key(
                &layers,
                &PlanInput {
                    namespace: "other",
                    ..input.clone()
                },
            ),
            key(
                &layers,
                &PlanInput {
                    epoch: 1,
                    ..input.clone()
                },
            ),
            key(
                &layers,
                &PlanInput {
                    base_name: Some("reg/b:1"),
                    ..input.clone()
                },
            ),
            key(
                &layers,
                &PlanInput {
                    runtime: catalog.get("python313").unwrap(),
                    ..input.clone()
                },
            ),
        ];
        for (i, k) in changed.iter().enumerate() {
            assert_ne!(*k, reference, "input {i} is not in the key");
        }
    }
}
