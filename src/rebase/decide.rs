//! Whether a Function image can move to a new base without a build, and the image it becomes:
//! pure, from the image's and the new base's manifests and configs.
//!
//! A rebase is safe when nothing a build would do differs on the new base but the base itself:
//! the dependency layer was installed by kiln's own lock-file install, or in the very builder
//! image the new base pairs with, for the binary interface the new base offers. The rebased
//! image is then assembled exactly as `kiln build` assembles it (the same config edit and image
//! key, from [`crate::build::plan`]), so its digest is the one a full build on the new base
//! gives. Before trusting its reading of the image, kiln recomputes the image's own build key
//! from it: an image it cannot reproduce is not rebased.

use std::collections::BTreeMap;

use super::own::{deps_run_on, own_layers};
use crate::build::plan::{self, BUILD_KEY_LABEL, DEPS_TOOLCHAIN_LABEL, RUNTIME_LABEL};
use crate::oci::{self, Base, Compression, Digest, Image, ImageConfig, MediaType, NewLayer};
use crate::runtime::Catalog;

const BASE_DIGEST_LABEL: &str = "org.opencontainers.image.base.digest";
const BASE_NAME_LABEL: &str = "org.opencontainers.image.base.name";
const TITLE_LABEL: &str = "org.opencontainers.image.title";
const CREATED_LABEL: &str = "org.opencontainers.image.created";

/// The new base, as the rebase sees it.
#[derive(Clone, Copy, Debug)]
pub struct NewBase<'a> {
    /// Its manifest and config.
    pub base: &'a Base,
    /// Its name in the image's labels: the registry reference, `None` for a layout (as
    /// `kiln build` names it).
    pub name: Option<&'a str>,
    /// The builder image the new base pairs with, by manifest digest, when known.
    pub builder: Option<&'a Digest>,
    /// The digest that builder was named by when that is another: the image index over its
    /// platforms' images, which a build Job records (it names its builder by that digest).
    pub builder_index: Option<&'a Digest>,
}

/// The Function image as read.
#[derive(Clone, Copy, Debug)]
pub struct Current<'a> {
    /// Its manifest and config.
    pub image: &'a Base,
}

/// What a rebase would do.
#[derive(Debug)]
pub enum Decision {
    /// The image is on the new base already.
    Current,
    /// Safe: the image on the new base.
    Rebase(Box<Rebased>),
    /// Not safe, or not possible: why a build is needed.
    Rebuild(String),
}

/// A rebased image.
#[derive(Debug)]
pub struct Rebased {
    /// The new image.
    pub image: Image,
    /// Its image key (`dev.kiln.build-key`).
    pub image_key: Digest,
    /// The image's own layers (dependencies, source), as in the current image.
    pub own_layers: Vec<oci::Descriptor>,
    /// Every layer of the current image: the image's repository holds them.
    pub current_layers: Vec<Digest>,
}

/// Decides, and assembles the rebased image when it is safe. Anything that does not read as
/// kiln wrote it is a reason to rebuild, never a guess.
pub fn decide(current: Current<'_>, new: NewBase<'_>, catalog: &Catalog) -> Decision {
    match decide_inner(current, new, catalog) {
        Ok(decision) => decision,
        Err(reason) => Decision::Rebuild(reason),
    }
}

fn decide_inner(
    current: Current<'_>,
    new: NewBase<'_>,
    catalog: &Catalog,
) -> Result<Decision, String> {
    let config = parse_config(&current.image.config, "the image")?;
    let labels = labels_of(&config);
    let label = |name: &str| {
        labels.get(name).map(String::as_str).ok_or_else(|| {
            format!(
                "the image has no {name} label: it was not built by kiln, or before kiln \
                 recorded it"
            )
        })
    };
    let runtime_name = label(RUNTIME_LABEL)?;
    let recorded_key: Digest = parse_digest(label(BUILD_KEY_LABEL)?, BUILD_KEY_LABEL)?;
    let old_base: Digest = parse_digest(label(BASE_DIGEST_LABEL)?, BASE_DIGEST_LABEL)?;
    let new_config = parse_config(&new.base.config, "the new base")?;
    let new_labels = labels_of(&new_config);
    if let Some(theirs) = new_labels.get(RUNTIME_LABEL)
        && theirs != runtime_name
    {
        return Err(format!(
            "the new base is the {theirs} runtime's, and the image is a {runtime_name} Function"
        ));
    }
    let platform = |c: &ImageConfig| {
        let variant = c
            .variant
            .as_deref()
            .map(|v| format!("/{v}"))
            .unwrap_or_default();
        format!("{}/{}{variant}", c.os, c.architecture)
    };
    if platform(&new_config) != platform(&config) {
        return Err(format!(
            "the new base is for {}, and the image for {}",
            platform(&new_config),
            platform(&config)
        ));
    }
    let own = own_layers(current.image, &config)?;
    if own.deps.is_some() {
        deps_run_on(&labels, &new_labels, (new.builder, new.builder_index))?;
    }
    // On the new base already, under the name a build would record (a build would install
    // as this one did: checked above). The same base under another name is a rebase: the
    // image a build makes records the name.
    let old_name = labels.get(BASE_NAME_LABEL).map(String::as_str);
    if old_base == new.base.manifest.digest && old_name == new.name {
        return Ok(Decision::Current);
    }
    let runtime = catalog.get(runtime_name).map_err(|e| e.to_string())?;
    let compression = match own.source.descriptor.media_type {
        MediaType::OciLayerZstd => Compression::Zstd,
        _ => Compression::Gzip,
    };
    let family = new.base.family();
    if family.layer(compression).as_ref() != Some(&own.source.descriptor.media_type) {
        return Err(format!(
            "the image's layers are {}, which a build on the new base (a {family:?} image) \
             would not write",
            own.source.descriptor.media_type
        ));
    }
    let epoch = label(CREATED_LABEL).and_then(|t| {
        oci::epoch_of(t).ok_or_else(|| format!("label {CREATED_LABEL}={t:?} is not kiln's"))
    })?;
    let env = env(&config);
    let namespace = env.get("SERVICE_NAMESPACE").ok_or_else(|| {
        "the image has no SERVICE_NAMESPACE: it was not built by kiln".to_string()
    })?;
    let function_name = label(TITLE_LABEL)?;
    let toolchain = labels.get(DEPS_TOOLCHAIN_LABEL).map(String::as_str);
    let key_of = |base_name: Option<&str>, base_digest: &Digest| {
        let edit = plan::config_edit(&plan::PlanInput {
            runtime,
            function_name,
            namespace,
            epoch,
            base_name,
            base_digest,
            deps_toolchain: toolchain,
        });
        let key = plan::image_key(
            &plan::KeyLayers {
                runtime: runtime_name,
                base: base_digest,
                deps: own.deps.as_ref().map(|d| &d.key),
                source_diff_id: &own.source.diff_id,
                source_created_by: &own.source.created_by,
                compression,
            },
            &edit,
        );
        (edit, key)
    };
    let old_name = labels.get(BASE_NAME_LABEL).map(String::as_str);
    let (_, reproduced) = key_of(old_name, &old_base);
    if reproduced != recorded_key {
        return Err(format!(
            "kiln cannot reproduce the image's build key ({recorded_key}) from the image: it \
             was built by another kiln version or runtime catalog, or edited since"
        ));
    }
    let (edit, image_key) = key_of(new.name, &new.base.manifest.digest);
    let edit = plan::with_image_key(edit, &image_key);
    let layers: Vec<NewLayer> = own
        .deps
        .iter()
        .map(|d| &d.layer)
        .chain([&own.source])
        .cloned()
        .collect();
    let image = oci::image::append(new.base, &layers, &edit)
        .map_err(|e| format!("assembling the image on the new base: {e}"))?;
    Ok(Decision::Rebase(Box::new(Rebased {
        own_layers: layers.into_iter().map(|l| l.descriptor).collect(),
        current_layers: own.all,
        image,
        image_key,
    })))
}

fn parse_config(doc: &oci::Document, what: &str) -> Result<ImageConfig, String> {
    doc.parse()
        .map_err(|e| format!("{what}'s config does not parse: {e}"))
}

fn parse_digest(text: &str, label: &str) -> Result<Digest, String> {
    text.parse()
        .map_err(|_| format!("label {label}={text:?} is not a digest"))
}

fn labels_of(config: &ImageConfig) -> BTreeMap<String, String> {
    config
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default()
}

fn env(config: &ImageConfig) -> BTreeMap<String, String> {
    config
        .config
        .as_ref()
        .and_then(|c| c.env.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::oci::{Descriptor, Family};
    use crate::runtime::abi::Abi;

    /// A base image as `kiln base build` labels it, with one layer named `layer`.
    fn base(layer: &str, abi: &Abi) -> Base {
        let scratch = crate::oci::image::tests::fixed_base(Family::Oci);
        let mut labels = abi.labels();
        labels.insert(RUNTIME_LABEL.into(), "nodejs22".into());
        let edit = oci::ConfigEdit {
            created: oci::rfc3339(0),
            labels,
            ..Default::default()
        };
        let image =
            oci::image::append(&scratch, &[new_layer(layer, "kiln base: runtime")], &edit).unwrap();
        Base {
            manifest: image.manifest,
            config: image.config,
        }
    }

    fn new_layer(name: &str, created_by: &str) -> NewLayer {
        NewLayer {
            descriptor: Descriptor::new(MediaType::OciLayerGzip, Digest::of(name.as_bytes()), 10),
            diff_id: Digest::of(format!("diff {name}").as_bytes()),
            created_by: created_by.into(),
        }
    }

    fn node22(libc: &str) -> Abi {
        Abi {
            libc: Some(("libc.so.6".into(), libc.into())),
            node: Some((22, 127)),
            python: None,
        }
    }

    /// The Function image `kiln build` makes on `base`, with a dependency layer installed by
    /// `toolchain` when there is one.
    fn function(base: &Base, toolchain: Option<&str>) -> Image {
        function_on(base, "reg.example/kiln/nodejs22:1", toolchain)
    }

    /// [`function`] on `base` named `base_name`.
    fn function_on(base: &Base, base_name: &str, toolchain: Option<&str>) -> Image {
        let catalog = Catalog::embedded();
        let runtime = catalog.get("nodejs22").unwrap();
        let deps_key = Digest::of(b"deps key");
        let deps = toolchain.map(|_| {
            new_layer(
                "deps",
                &crate::build::stage::created_by("npm ci", &deps_key),
            )
        });
        let source = new_layer("source", "kiln: source (2 files to /usr/src/app/function)");
        let edit = plan::config_edit(&plan::PlanInput {
            runtime,
            function_name: "orders",
            namespace: "shop",
            epoch: 1_700_000_000,
            base_name: Some(base_name),
            base_digest: &base.manifest.digest,
            deps_toolchain: toolchain,
        });
        let key = plan::image_key(
            &plan::KeyLayers {
                runtime: "nodejs22",
                base: &base.manifest.digest,
                deps: toolchain.map(|_| &deps_key),
                source_diff_id: &source.diff_id,
                source_created_by: &source.created_by,
                compression: Compression::Gzip,
            },
            &edit,
        );
        let layers: Vec<NewLayer> = deps.into_iter().chain([source]).collect();
        oci::image::append(base, &layers, &plan::with_image_key(edit, &key)).unwrap()
    }

    fn as_base(image: &Image) -> Base {
        Base {
            manifest: image.manifest.clone(),
            config: image.config.clone(),
        }
    }

    fn decide_on(image: &Image, new: &Base, builder: Option<&Digest>) -> Decision {
        let current = as_base(image);
        let new = NewBase {
            base: new,
            name: Some("reg.example/kiln/nodejs22:1"),
            builder,
            builder_index: None,
        };
        decide(Current { image: &current }, new, &Catalog::embedded())
    }

    fn reason(decision: Decision) -> String {
        match decision {
            Decision::Rebuild(why) => why,
            other => panic!("expected a rebuild, got {other:?}"),
        }
    }

    const LOCKFILE: &str = "kiln lock-file install v1 for linux/x64";

    #[test]
    fn a_rebase_is_the_image_a_build_on_the_new_base_makes() {
        let (old, new) = (base("old", &node22("2.41")), base("new", &node22("2.42")));
        for toolchain in [None, Some(LOCKFILE)] {
            let image = function(&old, toolchain);
            let Decision::Rebase(rebased) = decide_on(&image, &new, None) else {
                panic!("{toolchain:?}: not rebased");
            };
            let built = function(&new, toolchain);
            assert_eq!(
                rebased.image.manifest.digest, built.manifest.digest,
                "{toolchain:?}"
            );
            assert_eq!(rebased.image.config.bytes, built.config.bytes);
            assert_eq!(
                rebased.own_layers.len(),
                1 + usize::from(toolchain.is_some())
            );
            assert!(matches!(decide_on(&built, &new, None), Decision::Current));
            // The same base under another name: the image a build under that name makes.
            let renamed = NewBase {
                base: &new,
                name: Some("reg.example/kiln/nodejs22:2"),
                builder: None,
                builder_index: None,
            };
            let Decision::Rebase(moved) = decide(
                Current {
                    image: &as_base(&built),
                },
                renamed,
                &Catalog::embedded(),
            ) else {
                panic!("{toolchain:?}: the same base under another name is not rebased");
            };
            let named = function_on(&new, "reg.example/kiln/nodejs22:2", toolchain);
            assert_eq!(moved.image.manifest.digest, named.manifest.digest);
        }
    }

    #[test]
    fn a_dependency_layer_from_another_builder_or_abi_is_rebuilt() {
        let old = base("old", &node22("2.41"));
        let builder = Digest::of(b"builder");
        let in_builder = format!("builder image {builder}");
        let image = function(&old, Some(&in_builder));
        let same = base("new", &node22("2.41"));
        assert!(matches!(
            decide_on(&image, &same, Some(&builder)),
            Decision::Rebase(_)
        ));
        let why = reason(decide_on(&image, &same, None));
        assert!(
            why.contains("which builder the new base pairs with is not known"),
            "{why}"
        );
        let why = reason(decide_on(&image, &same, Some(&Digest::of(b"other"))));
        assert!(why.contains("the new base pairs with builder"), "{why}");
        // A build Job names its builder by the index over the builder's platforms, and
        // records that digest; the platform's own image of it is the same builder.
        let index = Digest::of(b"builder index");
        let by_index = function(&old, Some(&format!("builder image {index}")));
        let paired = NewBase {
            base: &same,
            name: Some("reg.example/kiln/nodejs22:1"),
            builder: Some(&builder),
            builder_index: Some(&index),
        };
        let current = Current {
            image: &as_base(&by_index),
        };
        assert!(matches!(
            decide(current, paired, &Catalog::embedded()),
            Decision::Rebase(_)
        ));
        let why = reason(decide_on(&by_index, &same, Some(&builder)));
        assert!(why.contains("the new base pairs with builder"), "{why}");

        let lockfile = function(&old, Some(LOCKFILE));
        let node24 = Abi {
            node: Some((24, 137)),
            ..node22("2.41")
        };
        let why = reason(decide_on(&lockfile, &base("new", &node24), None));
        assert!(
            why.contains("Node.js changes from 22 (modules 127) to 24"),
            "{why}"
        );
        let why = reason(decide_on(&lockfile, &base("new", &node22("2.36")), None));
        assert!(why.contains("goes back"), "{why}");
        let why = reason(decide_on(&lockfile, &base("new", &Abi::default()), None));
        assert!(
            why.contains("does not record its binary interface"),
            "{why}"
        );

        let host = function(&old, Some("v22.1.0\n10.9.0"));
        let why = reason(decide_on(&host, &same, Some(&builder)));
        assert!(
            why.contains("the toolchain on PATH (v22.1.0; 10.9.0)"),
            "{why}"
        );
    }

    #[test]
    fn an_image_kiln_cannot_reproduce_is_rebuilt() {
        let (old, new) = (base("old", &node22("2.41")), base("new", &node22("2.41")));
        let image = function(&old, Some(LOCKFILE));
        // A label changed after the build (here, the function's name): the key no longer
        // follows from the image, so what kiln would write is not known.
        let mut config: ImageConfig = image.config.parse().unwrap();
        let labels = config.config.as_mut().unwrap().labels.as_mut().unwrap();
        labels.insert(TITLE_LABEL.into(), "payments".into());
        let bytes = oci::canonical::to_vec(&config).unwrap();
        let edited = Base {
            manifest: image.manifest.clone(),
            config: oci::Document::new(MediaType::OciConfig, bytes),
        };
        let decision = decide(
            Current { image: &edited },
            NewBase {
                base: &new,
                name: Some("reg.example/kiln/nodejs22:1"),
                builder: None,
                builder_index: None,
            },
            &Catalog::embedded(),
        );
        let why = reason(decision);
        assert!(
            why.contains("cannot reproduce the image's build key"),
            "{why}"
        );

        // An image kiln did not build: here, the base itself.
        let new = NewBase {
            base: &new,
            name: None,
            builder: None,
            builder_index: None,
        };
        let why = reason(decide(Current { image: &old }, new, &Catalog::embedded()));
        assert!(why.contains("no dev.kiln.build-key label"), "{why}");
    }
}
