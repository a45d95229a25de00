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
//!
//! Anyone who can push to the cache repository could store a layer under the key an honest
//! build computes, so an entry is used only if a key the reader trusts signed it
//! ([`CacheTrust`]): the signature covers the dependency key and the layer (media type,
//! digest, size, diff ID), and sits in the entry's annotations with the id of the key that
//! made it. An unsigned entry, or one signed by another key or not matching its signature,
//! is ignored with a warning and the build installs: a poisoned cache can cost an install,
//! never a build. A build without a signing key stores no entry.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::cache;
use super::function::DepInputs;
use super::options::Options;
use crate::oci;
use crate::oci::{Descriptor, Digest, Document, MediaType};
use crate::registry::{self, BlobSource, Client, Reference};
use crate::signing::{PublicKey, SigningKey};

/// The artifact type of a cache entry.
pub const ARTIFACT_TYPE: &str = "application/vnd.kiln.dependencies.v1";
/// The OCI empty descriptor's media type (the entry's config).
const EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// Annotation on the entry's layer: the layer's diff ID.
const DIFF_ID: &str = "dev.kiln.dependencies.diff-id";
/// Annotation on the entry: the dependency key.
const KEY: &str = "dev.kiln.dependencies.key";
/// Annotation on the entry: the id of the key that signed it ([`PublicKey::id`]).
const SIGNER: &str = "dev.kiln.dependencies.signer";
/// Annotation on the entry: the base64 Ed25519 signature of [`signed_message`].
const SIGNATURE: &str = "dev.kiln.dependencies.signature";

/// Whose cache entries a build uses, and the key it signs the entries it stores with.
#[derive(Clone, Debug, Default)]
pub struct CacheTrust {
    /// `--cache-sign-key`: signs the entries this build stores; its public key is trusted
    /// too. Without it, nothing is stored.
    pub sign: Option<std::sync::Arc<SigningKey>>,
    /// `--cache-trust-key`: the keys whose entries are used.
    pub trusted: Vec<PublicKey>,
}

impl CacheTrust {
    /// Trusts `sign`'s public key and `trusted`, and signs with `sign`.
    pub fn new(sign: Option<SigningKey>, mut trusted: Vec<PublicKey>) -> CacheTrust {
        if let Some(key) = &sign
            && !trusted.contains(key.public())
        {
            trusted.push(key.public().clone());
        }
        CacheTrust {
            sign: sign.map(std::sync::Arc::new),
            trusted,
        }
    }

    /// Whether any key is trusted (else no entry can be used).
    pub fn trusts_any(&self) -> bool {
        !self.trusted.is_empty()
    }

    /// Why the entry `v` (for `key`, with `layer`) may not be used, if it may not.
    fn refuses(&self, v: &serde_json::Value, message: &[u8]) -> Option<String> {
        let annotations = &v["annotations"];
        let (Some(signer), Some(signature)) = (
            annotations[SIGNER].as_str(),
            annotations[SIGNATURE].as_str(),
        ) else {
            return Some("it is not signed".into());
        };
        let Some(key) = self.trusted.iter().find(|k| k.id() == signer) else {
            return Some(format!(
                "it is signed by {signer}, which is not a trusted key (--cache-trust-key)"
            ));
        };
        let verified = STANDARD
            .decode(signature)
            .is_ok_and(|sig| key.verify(message, &sig));
        (!verified).then(|| format!("its signature does not verify with {signer}"))
    }
}

/// What an entry's signature covers: the dependency key and the layer it names.
fn signed_message(key: &Digest, layer: &Descriptor, diff_id: &Digest) -> Vec<u8> {
    format!(
        "kiln dependency cache entry v1\nkey {key}\nlayer {} {} {}\ndiff-id {diff_id}\n",
        layer.media_type.as_str(),
        layer.digest,
        layer.size,
    )
    .into_bytes()
}

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

/// Looks up `key` in `repo`. `Ok(None)` when there is no entry, or it is not one kiln wrote
/// for this key, or no key `trust` trusts signed it (warned); `Err` when the repository
/// cannot be read.
///
/// # Errors
/// Registry errors other than a missing tag or repository.
pub async fn lookup(
    client: &Client,
    repo: &Reference,
    key: &Digest,
    trust: &CacheTrust,
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
    match parse(&doc, key, trust) {
        Ok((digest, diff_id, size)) => Ok(Some(Entry {
            digest,
            diff_id,
            size,
            repo: repo.repository_only(),
        })),
        Err(Refused::Shape(problem)) => {
            tracing::warn!(
                entry = %tagged,
                problem,
                "ignoring a dependency cache entry kiln did not write for this key; installing",
            );
            Ok(None)
        }
        Err(Refused::Untrusted(problem)) => {
            tracing::warn!(
                entry = %tagged,
                problem,
                "ignoring a dependency cache entry no trusted build wrote; installing",
            );
            Ok(None)
        }
    }
}

/// Why an entry is not used.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// Not an entry kiln writes for this key.
    Shape(&'static str),
    /// Not signed by a trusted key.
    Untrusted(String),
}

impl From<&'static str> for Refused {
    fn from(problem: &'static str) -> Refused {
        Refused::Shape(problem)
    }
}

/// The layer of an entry, if the document is exactly an entry for `key` that a key `trust`
/// trusts signed.
fn parse(
    doc: &Document,
    key: &Digest,
    trust: &CacheTrust,
) -> Result<(Digest, Digest, u64), Refused> {
    let v: serde_json::Value = doc.parse().map_err(|_| "not JSON")?;
    if v["artifactType"] != ARTIFACT_TYPE {
        return Err(Refused::Shape("another artifactType"));
    }
    if v["annotations"][KEY] != key.to_string() {
        return Err(Refused::Shape("another dependency key"));
    }
    let layers = v["layers"].as_array().ok_or("no layers")?;
    let [layer] = layers.as_slice() else {
        return Err(Refused::Shape("not exactly one layer"));
    };
    let descriptor: Descriptor =
        serde_json::from_value(layer.clone()).map_err(|_| "a malformed layer descriptor")?;
    if !matches!(
        descriptor.media_type,
        MediaType::OciLayerGzip | MediaType::OciLayerZstd
    ) {
        return Err(Refused::Shape(
            "a layer that is not a gzip or zstd OCI layer",
        ));
    }
    let diff_id = layer["annotations"][DIFF_ID]
        .as_str()
        .and_then(|d| d.parse::<Digest>().ok())
        .ok_or("no diff ID")?;
    if let Some(problem) = trust.refuses(&v, &signed_message(key, &descriptor, &diff_id)) {
        return Err(Refused::Untrusted(problem));
    }
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

/// The entry document for a layer, signed with `sign`.
pub fn entry_manifest(
    key: &Digest,
    layer: &Descriptor,
    diff_id: &Digest,
    about: &Describe<'_>,
    sign: &SigningKey,
) -> Document {
    let signature = sign.sign(&signed_message(key, layer, diff_id));
    let mut annotations = BTreeMap::from([
        (SIGNER.to_string(), sign.public().id()),
        (SIGNATURE.to_string(), STANDARD.encode(signature)),
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
/// or mounted from `mount_from` on the same registry) for `key`, signed with
/// `--cache-sign-key`. `Ok(false)`: there is no signing key, so nothing is stored (no reader
/// would use an unsigned entry).
///
/// # Errors
/// Registry errors.
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
) -> Result<bool, crate::registry::Error> {
    let Some(sign) = &opts.cache_trust.sign else {
        return Ok(false);
    };
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
    let entry = entry_manifest(key, &descriptor, &layer.diff_id, &about, sign);
    store(client, repo, key, &entry, &descriptor, local, mount_from).await?;
    Ok(true)
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

    /// The dependency key, layer and diff ID the entries of these tests are for.
    fn for_layer() -> (Digest, Descriptor, Digest) {
        let layer = Descriptor::new(MediaType::OciLayerGzip, Digest::of(b"layer"), 5);
        (Digest::of(b"key"), layer, Digest::of(b"tar"))
    }

    /// The entry for [`for_layer`], signed by `signer`.
    fn entry(signer: &SigningKey) -> Document {
        let (key, layer, diff_id) = for_layer();
        let inputs = inputs();
        let about = Describe {
            runtime: "nodejs22",
            install: "npm ci",
            inputs: &inputs,
            epoch: 0,
        };
        entry_manifest(&key, &layer, &diff_id, &about, signer)
    }

    /// `doc` edited by `f`, parsed for [`for_layer`]'s key with `trust`.
    fn edited(
        doc: &Document,
        trust: &CacheTrust,
        f: &dyn Fn(&mut serde_json::Value),
    ) -> Result<(Digest, Digest, u64), Refused> {
        let mut v: serde_json::Value = serde_json::from_slice(&doc.bytes).unwrap();
        f(&mut v);
        let bytes = serde_json::to_vec(&v).unwrap();
        parse(
            &Document::new(MediaType::OciManifest, bytes),
            &for_layer().0,
            trust,
        )
    }

    fn new_key() -> SigningKey {
        SigningKey::from_pem(&SigningKey::generate_pem().unwrap()).unwrap()
    }

    #[test]
    fn an_entry_parses_back_and_names_no_secret() {
        let (key, layer, diff_id) = for_layer();
        let pem = SigningKey::generate_pem().unwrap();
        let signer = SigningKey::from_pem(&pem).unwrap();
        let trust = CacheTrust::new(Some(SigningKey::from_pem(&pem).unwrap()), vec![]);
        let doc = entry(&signer);
        assert_eq!(
            parse(&doc, &key, &trust),
            Ok((layer.digest.clone(), diff_id, 5))
        );
        assert_eq!(entry_key(&doc), Some(key.clone()));
        assert!(!String::from_utf8_lossy(&doc.bytes).contains("secret"));
        assert_eq!(
            parse(&doc, &Digest::of(b"other"), &trust),
            Err(Refused::Shape("another dependency key"))
        );
        let tampered = |f: &dyn Fn(&mut serde_json::Value)| edited(&doc, &trust, f);
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

    #[test]
    fn only_an_entry_a_trusted_key_signed_for_this_layer_is_used() {
        let key = for_layer().0;
        let (ours, theirs) = (new_key(), new_key());
        let trust = CacheTrust::new(None, vec![ours.public().clone()]);
        assert!(trust.sign.is_none() && trust.trusts_any());
        let untrusted = |r| matches!(r, Err(Refused::Untrusted(_)));
        assert!(parse(&entry(&ours), &key, &trust).is_ok());
        // Signed by a key nobody trusts, or trusted by nobody.
        let other = parse(&entry(&theirs), &key, &trust);
        assert!(
            matches!(&other, Err(Refused::Untrusted(p)) if p.contains(&theirs.public().id())),
            "{other:?}"
        );
        assert!(untrusted(parse(
            &entry(&ours),
            &key,
            &CacheTrust::default()
        )));
        let ours_edited = |f: &dyn Fn(&mut serde_json::Value)| edited(&entry(&ours), &trust, f);
        // Unsigned; another key's id over our signature; our signature over another layer,
        // size or diff ID; a signature that is not base64.
        assert!(untrusted(ours_edited(&|v| {
            v["annotations"].as_object_mut().unwrap().remove(SIGNATURE);
        })));
        assert!(untrusted(ours_edited(&|v| {
            v["annotations"][SIGNER] = json!(theirs.public().id())
        })));
        assert!(untrusted(ours_edited(&|v| {
            v["layers"][0]["digest"] = json!(Digest::of(b"evil"))
        })));
        assert!(untrusted(ours_edited(
            &|v| v["layers"][0]["size"] = json!(6)
        )));
        assert!(untrusted(ours_edited(&|v| {
            v["layers"][0]["annotations"][DIFF_ID] = json!(Digest::of(b"evil tar"))
        })));
        assert!(untrusted(ours_edited(&|v| {
            v["annotations"][SIGNATURE] = json!("%%%")
        })));
        // What the signature does not cover may change (a description of the inputs).
        assert!(
            ours_edited(&|v| v["annotations"]["dev.kiln.dependencies.install"] = json!("x"))
                .is_ok()
        );
    }
}
