//! Image signatures stored the way cosign stores them, so `cosign verify --key` and kiln's own
//! `kiln verify` accept them (sigstore/cosign specs/SIGNATURE_SPEC.md):
//!
//! - the signed bytes are a *simple signing* payload naming the image's manifest digest;
//! - the signature is ECDSA P-256 over SHA-256, ASN.1 DER, base64 in the layer annotation
//!   `dev.cosignproject.cosign/signature`;
//! - the payload is a layer (`application/vnd.dev.cosign.simplesigning.v1+json`) of an OCI image
//!   manifest tagged `sha256-<hex>.sig` in the image's repository. Signatures of other keys
//!   already there are kept: a new one is added beside them.
//!
//! Keys are PEM: a private key as PKCS#8 (`PRIVATE KEY`, as `openssl genpkey -algorithm EC
//! -pkeyopt ec_paramgen_curve:P-256` writes it) or SEC1 (`EC PRIVATE KEY`); a public key as
//! SubjectPublicKeyInfo (`PUBLIC KEY`, as `cosign generate-key-pair` and `openssl pkey -pubout`
//! write it). A key is named by `sha256:` over its public key's DER, never shown itself.

use std::collections::BTreeMap;
use std::fmt;

use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use p256::ecdsa::signature::Signer as _;
use p256::pkcs8::{DecodePrivateKey as _, EncodePublicKey as _};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::oci::{Descriptor, Digest, Document, Manifest, MediaType};
use crate::registry::{self, BlobSource, Client, Reference};
use crate::signing::pem_body;

/// The media type of a simple signing payload.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign image signature.
const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The largest payload `kiln verify` reads (a payload is a few hundred bytes).
const MAX_PAYLOAD: u64 = 64 * 1024;

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Neither PEM label of a private key, or a bad public key block.
    #[error("not a PEM {what} (expected a `-----BEGIN {labels}-----` block, as `{hint}` writes)")]
    NotPem {
        /// Private or public key.
        what: &'static str,
        /// The labels accepted.
        labels: &'static str,
        /// A command that writes one.
        hint: &'static str,
    },
    /// A key encrypted the way kiln does not read (PKCS#8 encryption).
    #[error(
        "an encrypted PKCS#8 key: decrypt it (`openssl pkey -in KEY -out PLAIN`) or give the \
         key as `cosign generate-key-pair` wrote it"
    )]
    Encrypted,
    /// A cosign-encrypted key without its password.
    #[error(
        "a password-encrypted cosign key: set COSIGN_PASSWORD to its password (empty for \
         none), as cosign reads it"
    )]
    NeedsPassword,
    /// A cosign-encrypted key the password does not open.
    #[error("the cosign key does not open with COSIGN_PASSWORD: the password is wrong")]
    WrongPassword,
    /// A cosign-encrypted key that is not what cosign writes.
    #[error("not a cosign-encrypted key as cosign writes it: {0}")]
    BadEncrypted(String),
    /// A PEM block that is not an ECDSA P-256 key.
    #[error("not an ECDSA P-256 {what} ({detail}); cosign-compatible signatures use P-256")]
    NotP256 {
        /// Private or public key.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
}

/// An ECDSA P-256 private key. It signs deterministically (RFC 6979): the same payload gets
/// the same signature, and signing needs no random source (whose first use costs aws-lc about
/// 30 ms, six times a whole source-only rebuild's budget for signing).
pub struct SignKey {
    key: p256::ecdsa::SigningKey,
    public: VerifyKey,
}

impl fmt::Debug for SignKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignKey")
            .field("id", &self.public.id())
            .finish()
    }
}

/// An ECDSA P-256 public key (its SubjectPublicKeyInfo DER).
#[derive(Clone, PartialEq, Eq)]
pub struct VerifyKey {
    spki: Vec<u8>,
}

impl fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifyKey({})", self.id())
    }
}

impl SignKey {
    /// Parses a PEM PKCS#8 or SEC1 P-256 private key.
    ///
    /// # Errors
    /// When it is not one, or is encrypted.
    pub fn from_pem(text: &str) -> Result<SignKey, KeyError> {
        let password = std::env::var("COSIGN_PASSWORD").ok();
        SignKey::from_pem_with_password(text, password.as_deref())
    }

    /// [`SignKey::from_pem`] with the password of a cosign-encrypted key given.
    ///
    /// # Errors
    /// As [`SignKey::from_pem`].
    pub fn from_pem_with_password(text: &str, password: Option<&str>) -> Result<SignKey, KeyError> {
        if let Some(body) = [
            "ENCRYPTED SIGSTORE PRIVATE KEY",
            "ENCRYPTED COSIGN PRIVATE KEY",
        ]
        .into_iter()
        .find_map(|label| pem_body(text, label, "").ok())
        {
            let password = password.ok_or(KeyError::NeedsPassword)?;
            let der = decrypt_cosign_key(&body, password.as_bytes())?;
            return SignKey::from_der(&der, false);
        }
        if text.contains("ENCRYPTED PRIVATE KEY") {
            return Err(KeyError::Encrypted);
        }
        let not_pem = KeyError::NotPem {
            what: "private key",
            labels: "PRIVATE KEY` or `EC PRIVATE KEY",
            hint: "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256",
        };
        if let Ok(der) = pem_body(text, "EC PRIVATE KEY", "") {
            SignKey::from_der(&der, true)
        } else if let Ok(der) = pem_body(text, "PRIVATE KEY", "") {
            SignKey::from_der(&der, false)
        } else {
            Err(not_pem)
        }
    }

    /// A key from its DER: SEC1 (`sec1`) or PKCS#8.
    fn from_der(der: &[u8], sec1: bool) -> Result<SignKey, KeyError> {
        let bad = |detail: String| KeyError::NotP256 {
            what: "private key",
            detail,
        };
        let secret = if sec1 {
            p256::SecretKey::from_sec1_der(der).map_err(|e| bad(e.to_string()))?
        } else {
            p256::SecretKey::from_pkcs8_der(der).map_err(|e| bad(e.to_string()))?
        };
        let spki = secret
            .public_key()
            .to_public_key_der()
            .map_err(|e| bad(format!("its public key cannot be encoded: {e}")))?
            .as_bytes()
            .to_vec();
        Ok(SignKey {
            key: p256::ecdsa::SigningKey::from(secret),
            public: VerifyKey { spki },
        })
    }

    /// The key's public half.
    pub fn public(&self) -> &VerifyKey {
        &self.public
    }

    /// The ASN.1 DER signature of `message` (ECDSA over SHA-256).
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let signature: p256::ecdsa::Signature = self.key.sign(message);
        signature.to_der().as_bytes().to_vec()
    }
}

/// The PKCS#8 DER inside a cosign-encrypted key's body (sigstore's `encrypted` format: a JSON
/// document naming scrypt's parameters and salt, and NaCl secretbox's nonce and ciphertext).
/// scrypt's cost is bounded (N at most 2^16, r 8, p 4: at most 64 MiB), so a key file cannot
/// make kiln spend memory without end; cosign writes N = 2^15 or 2^16, r = 8, p = 1.
fn decrypt_cosign_key(body: &[u8], password: &[u8]) -> Result<Vec<u8>, KeyError> {
    use crypto_secretbox::aead::{Aead as _, KeyInit as _};
    let bad = |what: &str| KeyError::BadEncrypted(what.to_string());
    let doc: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| bad("its body is not JSON"))?;
    let b64 = |v: &serde_json::Value, what: &str| {
        v.as_str()
            .and_then(|t| STANDARD.decode(t).ok())
            .ok_or_else(|| bad(what))
    };
    let (kdf, cipher) = (&doc["kdf"], &doc["cipher"]);
    if kdf["name"] != "scrypt" || cipher["name"] != "nacl/secretbox" {
        return Err(bad("not scrypt and nacl/secretbox"));
    }
    let param = |k: &str| {
        kdf["params"][k]
            .as_u64()
            .ok_or_else(|| bad("scrypt parameters"))
    };
    let (n, r, p) = (param("N")?, param("r")?, param("p")?);
    if !n.is_power_of_two()
        || !(2..=1 << 16).contains(&n)
        || !(1..=8).contains(&r)
        || !(1..=4).contains(&p)
    {
        return Err(bad("scrypt parameters past N 2^16, r 8, p 4"));
    }
    let log_n = u8::try_from(n.trailing_zeros()).map_err(|_| bad("scrypt parameters"))?;
    let params =
        scrypt::Params::new(log_n, r as u32, p as u32).map_err(|_| bad("scrypt parameters"))?;
    let salt = b64(&kdf["salt"], "the salt")?;
    let mut key = [0u8; 32];
    scrypt::scrypt(password, &salt, &params, &mut key).map_err(|_| bad("scrypt"))?;
    let nonce = b64(&cipher["nonce"], "the nonce")?;
    if nonce.len() != 24 {
        return Err(bad("a nonce that is not 24 bytes"));
    }
    let ciphertext = b64(&doc["ciphertext"], "the ciphertext")?;
    crypto_secretbox::XSalsa20Poly1305::new(&key.into())
        .decrypt(
            crypto_secretbox::Nonce::from_slice(&nonce),
            ciphertext.as_slice(),
        )
        .map_err(|_| KeyError::WrongPassword)
}

impl VerifyKey {
    /// Parses a PEM SubjectPublicKeyInfo P-256 key.
    ///
    /// # Errors
    /// When it is not one.
    pub fn from_pem(text: &str) -> Result<VerifyKey, KeyError> {
        let spki = pem_body(text, "PUBLIC KEY", "").map_err(|_| KeyError::NotPem {
            what: "public key",
            labels: "PUBLIC KEY",
            hint: "cosign generate-key-pair` or `openssl pkey -pubout",
        })?;
        // A P-256 SubjectPublicKeyInfo: id-ecPublicKey with the prime256v1 curve.
        const P256_OIDS: [&[u8]; 2] = [
            &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01],
            &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
        ];
        if !P256_OIDS
            .iter()
            .all(|oid| spki.windows(oid.len()).any(|w| w == *oid))
        {
            return Err(KeyError::NotP256 {
                what: "public key",
                detail: "its algorithm is not id-ecPublicKey on prime256v1".into(),
            });
        }
        Ok(VerifyKey { spki })
    }

    /// `sha256:` over the public key's DER.
    pub fn id(&self) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(&self.spki)))
    }

    /// Whether `signature` (ASN.1 DER) is this key's over `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.spki)
            .verify(message, signature)
            .is_ok()
    }
}

/// The simple signing payload for the manifest `digest` in `repository` (`host/path`).
pub fn payload(repository: &str, digest: &Digest) -> Vec<u8> {
    let doc = json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest.to_string()},
            "type": SIGNATURE_TYPE,
        },
        "optional": null,
    });
    serde_json::to_vec(&doc).expect("a JSON value serialises")
}

/// The tag of the signatures of the manifest `digest`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// What signing did.
#[derive(Debug, PartialEq, Eq)]
pub enum Signed {
    /// A signature by this key was pushed, to this reference.
    Pushed(String),
    /// The image already carried a valid signature by this key.
    Present(String),
}

/// What [`Prepared::push`] attached to an image.
#[derive(Debug)]
pub struct Attached {
    /// The signature.
    pub signature: Signed,
    /// Where the provenance went, when it was added (an image found unchanged keeps its own).
    pub provenance: Option<String>,
}

/// An image's signature and provenance, made ready while the image itself is pushed: their
/// tags read, their layers and configs uploaded, so that once the image's manifest is up
/// only their two manifests remain ([`Prepared::push`]). Nothing is tagged before that.
#[derive(Debug)]
pub struct Prepared {
    signature: Pending,
    provenance: Pending,
}

/// A signature or attestation (or what went wrong making it ready).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The signature.
    #[error("the signature")]
    Signature(#[source] registry::Error),
    /// The provenance.
    #[error("the provenance attestation")]
    Provenance(#[source] registry::Error),
}

/// Prepares the signature of the manifest `digest` in `image`'s repository by `key`, and the
/// attestation of `statement` (an in-toto Statement about it, signed in a DSSE envelope),
/// both as cosign stores them: beside the other keys' signatures under `sha256-<hex>.sig`,
/// and beside the other attestations under `sha256-<hex>.att` with its predicate type.
///
/// `fresh`: the image is new in the repository (its manifest is going up now), so its tags
/// are nearly always absent: each layer and the config of a manifest of it alone are uploaded
/// while the tag is read, without a `HEAD` first. Otherwise (a rebuild that found its image)
/// an image already signed by this key, or with an attestation, is left as it is.
///
/// # Errors
/// Registry errors, saying which of the two failed.
pub async fn prepare(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    statement: &[u8],
    fresh: bool,
) -> Result<Prepared, AttachError> {
    let (signature, provenance) = tokio::join!(
        prepare_signature(client, image, digest, key, fresh),
        prepare_attestation(client, image, digest, key, statement, fresh),
    );
    Ok(Prepared {
        signature: signature.map_err(AttachError::Signature)?,
        provenance: provenance.map_err(AttachError::Provenance)?,
    })
}

impl Prepared {
    /// Puts the signature and attestation manifests, side by side: call it once the image's
    /// own manifest is up.
    ///
    /// # Errors
    /// Registry errors, saying which of the two failed.
    pub async fn push(self, client: &Client) -> Result<Attached, AttachError> {
        let (signature, provenance) =
            tokio::join!(self.signature.push(client), self.provenance.push(client));
        let signature = signature.map_err(AttachError::Signature)?;
        let provenance = provenance.map_err(AttachError::Provenance)?;
        Ok(Attached {
            signature: if signature.added {
                Signed::Pushed(signature.shown)
            } else {
                Signed::Present(signature.shown)
            },
            provenance: provenance.added.then_some(provenance.shown),
        })
    }
}

async fn prepare_signature(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    fresh: bool,
) -> Result<Pending, registry::Error> {
    let payload = payload(&image.repository_path(), digest);
    let mut layer = Descriptor::new(
        MediaType::from(SIMPLE_SIGNING),
        Digest::of(&payload),
        payload.len() as u64,
    );
    let signature = STANDARD.encode(key.sign(&payload));
    layer.annotations = Some(BTreeMap::from([(
        SIGNATURE_ANNOTATION.to_string(),
        signature,
    )]));
    // The same payload already signed by this key: nothing to add.
    let signed_already = |layers: &[Descriptor]| {
        layers.iter().any(|l| {
            l.digest == layer.digest
                && signature_of(l).is_some_and(|s| key.public.verify(&payload, &s))
        })
    };
    let tag = signature_tag(digest);
    let addition = Addition {
        layer: layer.clone(),
        blob: payload.clone(),
        fresh,
    };
    prepare_append(client, image, &tag, addition, signed_already).await
}

async fn prepare_attestation(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &SignKey,
    statement: &[u8],
    fresh: bool,
) -> Result<Pending, registry::Error> {
    use crate::provenance::{PAYLOAD_TYPE, PREDICATE_TYPE, pae};
    let signature = STANDARD.encode(key.sign(&pae(PAYLOAD_TYPE, statement)));
    let envelope = serde_json::to_vec(&json!({
        "payloadType": PAYLOAD_TYPE,
        "payload": STANDARD.encode(statement),
        "signatures": [{"keyid": "", "sig": signature}],
    }))
    .expect("a JSON value serialises");
    let mut layer = Descriptor::new(
        MediaType::from(DSSE_ENVELOPE),
        Digest::of(&envelope),
        envelope.len() as u64,
    );
    layer.annotations = Some(BTreeMap::from([
        (SIGNATURE_ANNOTATION.to_string(), String::new()),
        ("predicateType".to_string(), PREDICATE_TYPE.to_string()),
    ]));
    let has_provenance = |layers: &[Descriptor]| !fresh && !layers.is_empty();
    let tag = attestation_tag(digest);
    let addition = Addition {
        layer,
        blob: envelope,
        fresh,
    };
    prepare_append(client, image, &tag, addition, has_provenance).await
}

/// A layer to add to a cosign tag: its descriptor, its bytes, and whether the image is new
/// in the repository.
struct Addition {
    layer: Descriptor,
    blob: Vec<u8>,
    fresh: bool,
}

/// A cosign manifest ready to be put (`manifest`, or `None` when its tag already holds what
/// it would add), and the tag as shown.
#[derive(Debug)]
struct Pending {
    tag_ref: Reference,
    shown: String,
    manifest: Option<Document>,
}

/// What putting a [`Pending`] did.
struct Put {
    shown: String,
    added: bool,
}

impl Pending {
    async fn push(self, client: &Client) -> Result<Put, registry::Error> {
        let added = self.manifest.is_some();
        if let Some(doc) = &self.manifest {
            client.put_manifest(&self.tag_ref, doc).await?;
        }
        Ok(Put {
            shown: self.shown,
            added,
        })
    }
}

/// Prepares the addition of a layer to the cosign manifest tagged `tag` in `image`'s
/// repository, after the layers already there, unless `done` says those hold what it would
/// add: uploads the layer's blob and the config cosign writes, and makes the manifest.
async fn prepare_append(
    client: &Client,
    image: &Reference,
    tag: &str,
    addition: Addition,
    done: impl Fn(&[Descriptor]) -> bool,
) -> Result<Pending, registry::Error> {
    let tag_ref = image.with_tag(tag)?;
    let shown = format!("{}:{tag}", image.repository_path());
    let upload = |desc: Descriptor, bytes: Vec<u8>| async move {
        client
            .push_new_blob(image, &desc, BlobSource::Bytes(Bytes::from(bytes)))
            .await
    };
    let Addition { layer, blob, fresh } = addition;
    let alone = config_for(std::slice::from_ref(&layer));
    let found = if fresh {
        let (found, layer_up, config_up) = tokio::join!(
            existing(client, &tag_ref),
            upload(layer.clone(), blob.clone()),
            upload(alone.0.clone(), alone.1.clone()),
        );
        layer_up?;
        config_up?;
        found?
    } else {
        existing(client, &tag_ref).await?
    };
    let mut layers = found.map(|m| m.layers).unwrap_or_default();
    if done(&layers) {
        return Ok(Pending {
            tag_ref,
            shown,
            manifest: None,
        });
    }
    layers.push(layer.clone());
    let (config_desc, config) = config_for(&layers);
    if !fresh {
        let (layer_up, config_up) =
            tokio::join!(upload(layer, blob), upload(config_desc.clone(), config));
        layer_up?;
        config_up?;
    } else if config_desc.digest != alone.0.digest {
        // Other signatures were there: the config names theirs too.
        upload(config_desc.clone(), config).await?;
    }
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MediaType::OciManifest),
        artifact_type: None,
        config: config_desc,
        layers,
        subject: None,
        annotations: None,
    };
    let doc = Document::new(
        MediaType::OciManifest,
        serde_json::to_vec(&manifest).expect("a manifest serialises"),
    );
    Ok(Pending {
        tag_ref,
        shown,
        manifest: Some(doc),
    })
}

/// The config cosign writes for a signature or attestation manifest of `layers`: one diff id
/// per layer, no platform. Its descriptor and bytes.
fn config_for(layers: &[Descriptor]) -> (Descriptor, Vec<u8>) {
    let diff_ids: Vec<String> = layers.iter().map(|l| l.digest.to_string()).collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    }))
    .expect("a JSON value serialises");
    let desc = Descriptor::new(
        MediaType::OciConfig,
        Digest::of(&config),
        config.len() as u64,
    );
    (desc, config)
}

/// The tag of the attestations of the manifest `digest`.
pub fn attestation_tag(digest: &Digest) -> String {
    format!("sha256-{}.att", digest.hex())
}

/// The media type of a DSSE envelope layer.
pub const DSSE_ENVELOPE: &str = "application/vnd.dsse.envelope.v1+json";
/// The largest envelope `kiln verify` reads.
const MAX_ENVELOPE: u64 = 1 << 20;

/// The signature manifest at `sig_ref`, if there is one.
async fn existing(
    client: &Client,
    sig_ref: &Reference,
) -> Result<Option<Manifest>, registry::Error> {
    match client
        .get_manifest(sig_ref, &[MediaType::OciManifest])
        .await
    {
        Ok(doc) => Ok(serde_json::from_slice(&doc.bytes).ok()),
        Err(e) if e.status() == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The decoded signature a layer carries.
fn signature_of(layer: &Descriptor) -> Option<Vec<u8>> {
    let text = layer.annotations.as_ref()?.get(SIGNATURE_ANNOTATION)?;
    STANDARD.decode(text).ok()
}

/// Why an image did not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The image has no signature tag.
    #[error("{image} has no signatures: nothing is tagged {tag}")]
    Unsigned {
        /// The image.
        image: String,
        /// The tag looked for.
        tag: String,
    },
    /// Signatures exist, none valid for the key.
    #[error("no signature of {image} verifies with key {key}: {reasons}")]
    NoValidSignature {
        /// The image.
        image: String,
        /// The key's id.
        key: String,
        /// Why each signature failed, `; `-separated.
        reasons: String,
    },
    /// `--build-key` was asked for and no provenance by the key exists.
    #[error(
        "{image} has no provenance signed by key {key}, so nothing says it is build {build_key}"
    )]
    NoProvenance {
        /// The image.
        image: String,
        /// The key's id.
        key: String,
        /// The build key asked for.
        build_key: String,
    },
    /// Provenances by the key exist, none for this image (and build key).
    #[error("the provenance of {image} does not hold: {reasons}")]
    BadProvenance {
        /// The image.
        image: String,
        /// Why each provenance failed.
        reasons: String,
    },
    /// A registry request failed.
    #[error("reading {what}")]
    Registry {
        /// What was being read.
        what: String,
        /// The cause.
        #[source]
        source: registry::Error,
    },
}

/// A verified image.
#[derive(Debug)]
pub struct Verified {
    /// The manifest digest that was signed.
    pub digest: Digest,
    /// The verified payload, as signed.
    pub payload: Vec<u8>,
    /// The build key of its verified provenance, if it has one by the key.
    pub build_key: Option<String>,
}

/// Checks that `image` (by tag or digest) carries a signature by `key` over a simple signing
/// payload naming its manifest digest, and that a provenance `key` signed names it too: with
/// `build_key`, such a provenance must exist and be for that build key; without, one that
/// exists must still name this image.
///
/// # Errors
/// [`VerifyError`] with the reason.
pub async fn verify(
    client: &Client,
    image: &Reference,
    key: &VerifyKey,
    build_key: Option<&str>,
) -> Result<Verified, VerifyError> {
    let shown = image.to_string();
    let registry_err = |what: String| move |source| VerifyError::Registry { what, source };
    let digest = match &image.digest {
        Some(d) => d.clone(),
        None => {
            client
                .head_manifest(image)
                .await
                .map_err(registry_err(shown.clone()))?
                .ok_or_else(|| VerifyError::Registry {
                    what: shown.clone(),
                    source: registry::Error::Protocol {
                        method: reqwest::Method::HEAD,
                        url: shown.clone(),
                        problem: "the image does not exist",
                    },
                })?
                .digest
        }
    };
    let tag = signature_tag(&digest);
    let sig_ref = image.with_tag(&tag).map_err(registry_err(shown.clone()))?;
    let sig_ref = Reference {
        digest: None,
        ..sig_ref
    };
    let Some(manifest) = existing(client, &sig_ref)
        .await
        .map_err(registry_err(format!("the signatures of {shown}")))?
    else {
        return Err(VerifyError::Unsigned { image: shown, tag });
    };
    let mut reasons = Vec::new();
    for layer in &manifest.layers {
        if layer.media_type.as_str() != SIMPLE_SIGNING {
            reasons.push(format!("a layer of type {}", layer.media_type.as_str()));
            continue;
        }
        let Some(signature) = signature_of(layer) else {
            reasons.push("a payload without a base64 signature annotation".into());
            continue;
        };
        if layer.size > MAX_PAYLOAD {
            reasons.push(format!("a payload of {} bytes", layer.size));
            continue;
        }
        let payload = client
            .get_blob(&sig_ref, layer)
            .await
            .map_err(registry_err(format!("signature payload {}", layer.digest)))?;
        if !key.verify(&payload, &signature) {
            reasons.push("a signature that is not this key's over its payload".into());
            continue;
        }
        match signed_digest(&payload) {
            Ok(signed) if signed == digest => {
                let build_key = provenance(client, image, &digest, key, build_key).await?;
                return Ok(Verified {
                    digest,
                    payload,
                    build_key,
                });
            }
            Ok(signed) => reasons.push(format!("a valid signature of another image ({signed})")),
            Err(why) => reasons.push(why),
        }
    }
    Err(VerifyError::NoValidSignature {
        image: shown,
        key: key.id(),
        reasons: reasons.join("; "),
    })
}

/// The build key of the provenance `key` signed for the manifest `digest` (see [`verify`]).
async fn provenance(
    client: &Client,
    image: &Reference,
    digest: &Digest,
    key: &VerifyKey,
    wanted: Option<&str>,
) -> Result<Option<String>, VerifyError> {
    use crate::provenance::{PAYLOAD_TYPE, claims, pae};
    let shown = format!("{}@{digest}", image.repository_path());
    let registry_err = |what: String| move |source| VerifyError::Registry { what, source };
    let att_ref = image
        .with_tag(&attestation_tag(digest))
        .map_err(registry_err(shown.clone()))?;
    let att_ref = Reference {
        digest: None,
        ..att_ref
    };
    let layers = existing(client, &att_ref)
        .await
        .map_err(registry_err(format!("the attestations of {shown}")))?
        .map(|m| m.layers)
        .unwrap_or_default();
    let mut reasons = Vec::new();
    let mut found = false;
    for layer in layers
        .iter()
        .filter(|l| l.media_type.as_str() == DSSE_ENVELOPE)
    {
        if layer.size > MAX_ENVELOPE {
            reasons.push(format!("an envelope of {} bytes", layer.size));
            continue;
        }
        let bytes = client
            .get_blob(&att_ref, layer)
            .await
            .map_err(registry_err(format!("attestation {}", layer.digest)))?;
        let Ok(envelope) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            reasons.push("an envelope that is not JSON".into());
            continue;
        };
        let payload_type = envelope["payloadType"].as_str().unwrap_or_default();
        let Some(payload) = envelope["payload"]
            .as_str()
            .and_then(|p| STANDARD.decode(p).ok())
        else {
            reasons.push("an envelope without a base64 payload".into());
            continue;
        };
        let signed = envelope["signatures"].as_array().is_some_and(|sigs| {
            sigs.iter().any(|s| {
                s["sig"]
                    .as_str()
                    .and_then(|s| STANDARD.decode(s).ok())
                    .is_some_and(|sig| key.verify(&pae(payload_type, &payload), &sig))
            })
        });
        if !signed || payload_type != PAYLOAD_TYPE {
            // Another key's attestation (or not an in-toto one): not this check's business.
            continue;
        }
        found = true;
        match claims(&payload) {
            Err(why) => reasons.push(why),
            Ok(c) if !c.subjects.iter().any(|s| s == digest.hex()) => reasons.push(format!(
                "a provenance of another image (subject sha256:{})",
                c.subjects.join(", sha256:")
            )),
            Ok(c) => match (wanted, &c.build_key) {
                (Some(want), Some(have)) if want != have => {
                    reasons.push(format!("a provenance of build key {have}"));
                }
                (Some(_), None) => reasons.push("a provenance without a build key".into()),
                _ => return Ok(c.build_key),
            },
        }
    }
    match (found, wanted) {
        (false, None) => Ok(None),
        (false, Some(want)) => Err(VerifyError::NoProvenance {
            image: shown,
            key: key.id(),
            build_key: want.to_string(),
        }),
        (true, _) => Err(VerifyError::BadProvenance {
            image: shown,
            reasons: reasons.join("; "),
        }),
    }
}

/// The manifest digest a cosign payload signs.
fn signed_digest(payload: &[u8]) -> Result<Digest, String> {
    let doc: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("a payload that is not JSON: {e}"))?;
    let critical = &doc["critical"];
    if critical["type"] != SIGNATURE_TYPE {
        return Err(format!("a payload of type {}", critical["type"]));
    }
    critical["image"]["docker-manifest-digest"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| "a payload without a manifest digest".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SignKey {
        use aws_lc_rs::rand::SystemRandom;
        use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair};
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &SystemRandom::new())
                .unwrap();
        let text = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(pkcs8.as_ref())
        );
        SignKey::from_pem(&text).unwrap()
    }

    #[test]
    fn a_signature_verifies_with_its_key_only_and_over_its_payload_only() {
        let (a, b) = (key(), key());
        let digest = Digest::of(b"manifest");
        let payload = payload("reg.example/fn", &digest);
        let sig = a.sign(&payload);
        assert!(a.public().verify(&payload, &sig));
        assert_eq!(a.sign(&payload), sig, "deterministic (RFC 6979)");
        assert!(!b.public().verify(&payload, &sig));
        let mut tampered = payload.clone();
        tampered[10] ^= 1;
        assert!(!a.public().verify(&tampered, &sig));
        assert_eq!(signed_digest(&payload).unwrap(), digest);
        let public = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(&a.public().spki)
        );
        assert_eq!(VerifyKey::from_pem(&public).unwrap(), *a.public());
    }

    #[test]
    fn a_key_cosign_encrypted_opens_with_its_password_only() {
        // Written by `cosign generate-key-pair` with an empty password (see the fixture's
        // README): scrypt N = 2^16, r = 8, p = 1, NaCl secretbox.
        let text = include_str!("../tests/fixtures/cosign/cosign-empty-password.key");
        let key = SignKey::from_pem_with_password(text, Some("")).unwrap();
        let sig = key.sign(b"payload");
        assert!(key.public().verify(b"payload", &sig));
        assert!(matches!(
            SignKey::from_pem_with_password(text, Some("not it")),
            Err(KeyError::WrongPassword)
        ));
        assert!(matches!(
            SignKey::from_pem_with_password(text, None),
            Err(KeyError::NeedsPassword)
        ));
        // A body asking scrypt for a gigabyte is refused before scrypt runs.
        let greedy = format!(
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n{}\n\
             -----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
            STANDARD.encode(
                r#"{"kdf":{"name":"scrypt","params":{"N":1048576,"r":8,"p":1},"salt":"AA=="},
                   "cipher":{"name":"nacl/secretbox","nonce":"AA=="},"ciphertext":"AA=="}"#
            )
        );
        let err = SignKey::from_pem_with_password(&greedy, Some("")).unwrap_err();
        assert!(err.to_string().contains("past N 2^16"), "{err}");
    }

    #[test]
    fn encrypted_and_foreign_keys_are_refused_with_the_reason() {
        let encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nabc\n\
                         -----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(matches!(
            SignKey::from_pem(encrypted),
            Err(KeyError::Encrypted)
        ));
        assert!(matches!(
            SignKey::from_pem("hello"),
            Err(KeyError::NotPem { .. })
        ));
        let ed25519 = crate::signing::SigningKey::generate_pem().unwrap();
        let err = SignKey::from_pem(&ed25519).unwrap_err();
        assert!(err.to_string().contains("P-256"), "{err}");
    }
}
