//! Invariant checks on images (the idea of go-containerregistry's `validate`): run by tests
//! on every image they produce and by `kiln build --verify`. Schema validity is checked
//! separately against the official JSON schemas; this checks what a schema cannot: digests,
//! sizes, counts and family consistency.

use std::fmt;
use std::io::{self, Read};

use super::{
    Descriptor, Digest, Document, Family, HashingReader, ImageConfig, Index, Layout, Manifest,
    MediaType, manifest::sniff_media_type,
};

/// Everything found wrong with an image, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invalid {
    /// One line per problem.
    pub problems: Vec<String>,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid image: {}", self.problems.join("; "))
    }
}

impl std::error::Error for Invalid {}

impl Invalid {
    fn push(&mut self, problem: impl Into<String>) {
        self.problems.push(problem.into());
    }

    fn into_result(self) -> Result<(), Invalid> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

/// Checks a manifest against its config.
///
/// # Errors
/// Every violated invariant.
pub fn check_image(manifest: &Document, config: &Document) -> Result<(), Invalid> {
    let mut bad = Invalid::default();
    check_manifest(manifest, config, &mut bad);
    bad.into_result()
}

fn check_manifest(manifest: &Document, config: &Document, bad: &mut Invalid) -> Option<Manifest> {
    if Digest::of(&manifest.bytes) != manifest.digest {
        bad.push(format!("manifest bytes do not hash to {}", manifest.digest));
    }
    let m: Manifest = match manifest.parse() {
        Ok(m) => m,
        Err(e) => {
            bad.push(format!("manifest does not parse: {e}"));
            return None;
        }
    };
    if m.schema_version != 2 {
        bad.push(format!("schemaVersion is {}, not 2", m.schema_version));
    }
    let kind = sniff_media_type(&manifest.bytes).unwrap_or(MediaType::OciManifest);
    let family = kind.family().unwrap_or(Family::Oci);
    if !kind.is_manifest() {
        bad.push(format!("manifest mediaType is {kind}"));
    }
    if m.config.media_type != family.config() {
        bad.push(format!(
            "config mediaType {} in a {family:?} manifest",
            m.config.media_type
        ));
    }
    if m.config.digest != Digest::of(&config.bytes) || m.config.size != config.bytes.len() as u64 {
        bad.push(format!(
            "config descriptor {} does not match the config bytes",
            m.config.digest
        ));
    }
    for layer in &m.layers {
        if !layer.media_type.is_layer() || layer.media_type.family() != Some(family) {
            bad.push(format!(
                "layer {} has mediaType {} in a {family:?} image",
                layer.digest, layer.media_type
            ));
        }
    }
    match config.parse::<ImageConfig>() {
        Err(e) => bad.push(format!("config does not parse: {e}")),
        Ok(c) => {
            if c.rootfs.kind != "layers" {
                bad.push(format!("rootfs.type is {:?}", c.rootfs.kind));
            }
            if c.rootfs.diff_ids.len() != m.layers.len() {
                bad.push(format!(
                    "{} layers but {} diff_ids",
                    m.layers.len(),
                    c.rootfs.diff_ids.len()
                ));
            }
            if !c.history.is_empty() && c.layer_history_len() != c.rootfs.diff_ids.len() {
                bad.push(format!(
                    "{} history entries with layers but {} diff_ids",
                    c.layer_history_len(),
                    c.rootfs.diff_ids.len()
                ));
            }
            if c.os.is_empty() || c.architecture.is_empty() {
                bad.push("config lacks os or architecture");
            }
        }
    }
    Some(m)
}

/// Checks every image in a layout: the index, each manifest and config, and every blob's
/// presence, size and digest; the diff_id of each gzip layer is recomputed.
///
/// # Errors
/// Every violated invariant.
pub fn check_layout(layout: &Layout) -> Result<(), Invalid> {
    let mut bad = Invalid::default();
    match layout.index() {
        Ok(index) => check_index_entries(layout, &index, &mut bad),
        Err(e) => bad.push(format!("index.json: {e}")),
    }
    bad.into_result()
}

fn check_index_entries(layout: &Layout, index: &Index, bad: &mut Invalid) {
    for entry in &index.manifests {
        let doc = match layout.read_document(entry) {
            Ok(doc) => doc,
            Err(e) => {
                bad.push(e.to_string());
                continue;
            }
        };
        if doc.bytes.len() as u64 != entry.size {
            bad.push(format!(
                "{} has size {} but the descriptor says {}",
                entry.digest,
                doc.bytes.len(),
                entry.size
            ));
        }
        if entry.media_type.is_index() {
            match doc.parse::<Index>() {
                Ok(nested) => check_index_entries(layout, &nested, bad),
                Err(e) => bad.push(format!("index {} does not parse: {e}", entry.digest)),
            }
        } else {
            check_layout_image(layout, &doc, bad);
        }
    }
}

fn check_layout_image(layout: &Layout, manifest: &Document, bad: &mut Invalid) {
    let Ok(m) = manifest.parse::<Manifest>() else {
        bad.push(format!("manifest {} does not parse", manifest.digest));
        return;
    };
    let config = match layout.read_document(&m.config) {
        Ok(c) => c,
        Err(e) => {
            bad.push(e.to_string());
            return;
        }
    };
    check_manifest(manifest, &config, bad);
    let diff_ids = config
        .parse::<ImageConfig>()
        .map(|c| c.rootfs.diff_ids)
        .unwrap_or_default();
    for (i, layer) in m.layers.iter().enumerate() {
        if let Err(problem) = check_layer_blob(layout, layer, diff_ids.get(i)) {
            bad.push(problem);
        }
    }
}

fn check_layer_blob(
    layout: &Layout,
    layer: &Descriptor,
    diff_id: Option<&Digest>,
) -> Result<(), String> {
    let path = layout.blob_path(&layer.digest);
    let file = std::fs::File::open(&path).map_err(|e| format!("layer {}: {e}", layer.digest))?;
    let mut compressed = HashingReader::new(file);
    let gzip = matches!(
        layer.media_type,
        MediaType::OciLayerGzip | MediaType::DockerLayerGzip
    );
    let uncompressed = if gzip {
        let mut tar = HashingReader::new(flate2::read::GzDecoder::new(&mut compressed));
        io::copy(&mut tar, &mut io::sink()).map_err(|e| format!("layer {}: {e}", layer.digest))?;
        Some(tar.finish().0)
    } else {
        None
    };
    // Drain whatever follows the gzip stream so the blob digest covers every byte.
    compressed
        .read_to_end(&mut Vec::new())
        .map_err(|e| format!("layer {}: {e}", layer.digest))?;
    let (digest, size) = compressed.finish();
    if digest != layer.digest || size != layer.size {
        return Err(format!(
            "layer blob {} has digest {digest} and size {size}",
            layer.digest
        ));
    }
    match (uncompressed, diff_id) {
        (Some(actual), Some(expected)) if actual != *expected => Err(format!(
            "layer {} uncompresses to {actual}, config says {expected}",
            layer.digest
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::image::{Base, ConfigEdit, NewLayer, append};

    #[test]
    fn an_appended_image_is_valid_and_a_tampered_one_is_not() {
        let base = crate::oci::image::tests::fixed_base(Family::Docker);
        let layer = NewLayer {
            descriptor: Descriptor::new(MediaType::DockerLayerGzip, Digest::of(b"l"), 1),
            diff_id: Digest::of(b"d"),
            created_by: "x".into(),
        };
        let edit = ConfigEdit {
            created: "1970-01-01T00:00:00Z".into(),
            ..Default::default()
        };
        let image = append(&base, &[layer], &edit).unwrap();
        check_image(&image.manifest, &image.config).unwrap();
        let other = Document::new(MediaType::DockerConfig, b"{}".to_vec());
        let err = check_image(&image.manifest, &other).unwrap_err();
        assert!(
            err.problems.iter().any(|p| p.contains("does not match")),
            "{err}"
        );
        let Base { manifest, .. } = base;
        assert!(check_image(&manifest, &image.config).is_err());
    }
}
