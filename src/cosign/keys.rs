//! Signing and verifying keys: PEM, cosign's encrypted keys, ECDSA P-256.

use std::fmt;

use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use p256::ecdsa::signature::Signer as _;
use p256::pkcs8::{DecodePrivateKey as _, EncodePublicKey as _};
use sha2::{Digest as _, Sha256};

use crate::signing::pem_body;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosign::{payload, signed_digest};
    use crate::oci::Digest;

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
        let text = include_str!("../../tests/fixtures/cosign/cosign-empty-password.key");
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
