//! What kiln added to a Function image (its own layers, read from the history) and whether
//! its dependency layer may stay as it is on a new base: installed by the same installer, for
//! the same binary interface.

use std::collections::BTreeMap;

use crate::build::plan::{self, DEPS_TOOLCHAIN_LABEL};
use crate::oci::{self, Base, Digest, ImageConfig, NewLayer};
use crate::runtime::abi::Abi;

/// What names a builder image in a dependency toolchain (`deps::builder_toolchain_id`).
const BUILDER_PREFIX: &str = "builder image ";

/// Whether the image's dependency layer, installed against its base by the toolchain its
/// labels name, is what a build on the new base would install: the same installer, the same
/// binary interface.
pub(super) fn deps_run_on(
    labels: &BTreeMap<String, String>,
    new_labels: &BTreeMap<String, String>,
    (new_builder, builder_index): (Option<&Digest>, Option<&Digest>),
) -> Result<(), String> {
    let toolchain = labels.get(DEPS_TOOLCHAIN_LABEL).ok_or_else(|| {
        format!(
            "the image does not say what installed its dependencies (no {DEPS_TOOLCHAIN_LABEL} \
             label: built before kiln recorded it)"
        )
    })?;
    match toolchain.split_once(BUILDER_PREFIX) {
        Some((_, digest)) => {
            let built_in = digest.split_whitespace().next().unwrap_or_default();
            match new_builder {
                None => {
                    return Err(format!(
                        "the dependencies were installed in builder image {built_in}, and which \
                         builder the new base pairs with is not known (--builder)"
                    ));
                }
                Some(builder)
                    if builder.to_string() != built_in
                        && builder_index.is_none_or(|i| i.to_string() != built_in) =>
                {
                    return Err(format!(
                        "the dependencies were installed in builder image {built_in}, and the \
                         new base pairs with builder {builder}: a build would install them \
                         there"
                    ));
                }
                Some(_) => {}
            }
        }
        None if toolchain.starts_with("kiln lock-file install") => {}
        None => {
            return Err(format!(
                "the dependencies were installed by the toolchain on PATH ({toolchain}), not in \
                 a builder image: what they were built against is not known"
            ));
        }
    }
    let old = Abi::from_labels(labels)?.ok_or_else(|| {
        "the image does not record the binary interface its dependencies were built for (its \
         base has no dev.kiln.abi labels)"
            .to_string()
    })?;
    let new = Abi::from_labels(new_labels)?.ok_or_else(|| {
        "the new base does not record its binary interface (no dev.kiln.abi labels): it was \
         not assembled by `kiln base build`"
            .to_string()
    })?;
    old.runs_on(&new)
}

/// The image's dependency layer.
pub(super) struct DepsLayer {
    pub layer: NewLayer,
    /// Its dependency key, from its history text.
    pub key: Digest,
}

/// The layers kiln added to the base, from the history: the source layer last, the
/// dependency layer before it if there is one.
pub(super) struct Own {
    pub deps: Option<DepsLayer>,
    pub source: NewLayer,
    /// Every layer of the image.
    pub all: Vec<Digest>,
}

pub(super) fn own_layers(image: &Base, config: &ImageConfig) -> Result<Own, String> {
    let manifest = image
        .parse_manifest()
        .map_err(|e| format!("the image's manifest: {e}"))?;
    let history: Vec<&oci::History> = config
        .history
        .iter()
        .filter(|h| h.empty_layer != Some(true))
        .collect();
    let (layers, diff_ids) = (&manifest.layers, &config.rootfs.diff_ids);
    if history.len() != layers.len() || diff_ids.len() != layers.len() {
        return Err("the image's history does not match its layers".into());
    }
    let at = |i: usize| NewLayer {
        descriptor: layers[i].clone(),
        diff_id: diff_ids[i].clone(),
        created_by: history[i].created_by.clone().unwrap_or_default(),
    };
    let n = layers.len();
    let source = (n > 0)
        .then(|| at(n - 1))
        .filter(|l| l.created_by.starts_with(plan::SOURCE_HISTORY))
        .ok_or("the image's last layer is not a kiln source layer")?;
    let deps = match (n > 1).then(|| at(n - 2)) {
        Some(layer) if layer.created_by.starts_with(plan::DEPS_HISTORY) => {
            let key = layer
                .created_by
                .rsplit_once(", key ")
                .and_then(|(_, k)| k.strip_suffix(')'))
                .and_then(|k| k.parse().ok())
                .ok_or("the dependency layer's history names no key")?;
            Some(DepsLayer { layer, key })
        }
        _ => None,
    };
    let all = layers.iter().map(|d| d.digest.clone()).collect();
    Ok(Own { deps, source, all })
}
