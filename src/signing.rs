//! Ed25519 signing keys and the public keys that check them, in the PEM files `openssl`
//! writes: a private key is unencrypted PKCS#8 (`openssl genpkey -algorithm ed25519`), a
//! public key SubjectPublicKeyInfo (`openssl pkey -pubout`). kiln signs its shared
//! dependency-cache entries with them (`kiln build --cache-sign-key`), and a reader uses an
//! entry only if a key it trusts signed it (`--cache-trust-key`).
//!
//! A key is named by its id, `sha256:` over the public key's DER: that is what a signature
//! says it was made with, and what a log line names (never the key itself).

use std::fmt;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest as _, Sha256};

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the algorithm identifier
/// and the bit string header; the 32 key bytes follow.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// The longest key file read: a PEM key is a few hundred bytes.
pub const MAX_KEY_FILE: u64 = 64 * 1024;

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a PEM block of the expected label.
    #[error("not a PEM {label} (expected a `-----BEGIN {label}-----` block, as `{hint}` writes)")]
    NotPem {
        /// The PEM label expected.
        label: &'static str,
        /// The command that writes one.
        hint: &'static str,
    },
    /// A PEM block of the right label that is not an Ed25519 key.
    #[error("not an Ed25519 {what} ({detail}); kiln signs with Ed25519 keys")]
    NotEd25519 {
        /// Private or public key.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A key could not be made.
    #[error("generating an Ed25519 key failed")]
    Generate,
}

/// An Ed25519 private key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key: only which one.
        f.debug_struct("SigningKey")
            .field("id", &self.public.id())
            .finish()
    }
}

/// An Ed25519 public key.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    raw: [u8; 32],
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.id())
    }
}

/// The base64 body of the PEM block labelled `label`, decoded.
pub(crate) fn pem_body(
    text: &str,
    label: &'static str,
    hint: &'static str,
) -> Result<Vec<u8>, Error> {
    let not_pem = || Error::NotPem { label, hint };
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin).ok_or_else(not_pem)? + begin.len();
    let stop = text[start..].find(&end).ok_or_else(not_pem)? + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    STANDARD.decode(body).map_err(|_| not_pem())
}

impl SigningKey {
    /// Parses a PEM PKCS#8 Ed25519 private key.
    ///
    /// # Errors
    /// When it is not one.
    pub fn from_pem(text: &str) -> Result<SigningKey, Error> {
        let der = pem_body(text, "PRIVATE KEY", "openssl genpkey -algorithm ed25519")?;
        let pair =
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| Error::NotEd25519 {
                what: "private key",
                detail: e.to_string(),
            })?;
        let raw = pair
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| Error::NotEd25519 {
                what: "private key",
                detail: "its public key is not 32 bytes".into(),
            })?;
        Ok(SigningKey {
            pair,
            public: PublicKey { raw },
        })
    }

    /// A new random key, as PEM PKCS#8 (what [`SigningKey::from_pem`] reads).
    ///
    /// # Errors
    /// When the system's random source fails.
    pub fn generate_pem() -> Result<String, Error> {
        let doc =
            Ed25519KeyPair::generate_pkcs8v1(&SystemRandom::new()).map_err(|_| Error::Generate)?;
        Ok(pem("PRIVATE KEY", doc.as_ref()))
    }

    /// Its public key.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The signature of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

impl PublicKey {
    /// Parses a PEM SubjectPublicKeyInfo Ed25519 public key.
    ///
    /// # Errors
    /// When it is not one.
    pub fn from_pem(text: &str) -> Result<PublicKey, Error> {
        let der = pem_body(text, "PUBLIC KEY", "openssl pkey -pubout")?;
        let raw = der
            .strip_prefix(SPKI_PREFIX.as_slice())
            .and_then(|raw| <[u8; 32]>::try_from(raw).ok())
            .ok_or_else(|| Error::NotEd25519 {
                what: "public key",
                detail: "another algorithm, or not a SubjectPublicKeyInfo".into(),
            })?;
        Ok(PublicKey { raw })
    }

    /// The DER SubjectPublicKeyInfo.
    fn der(&self) -> Vec<u8> {
        [SPKI_PREFIX.as_slice(), &self.raw].concat()
    }

    /// As PEM (what [`PublicKey::from_pem`] reads, and `openssl pkey -pubout` writes).
    pub fn to_pem(&self) -> String {
        pem("PUBLIC KEY", &self.der())
    }

    /// `sha256:` and the hex of the SHA-256 of the DER: the key's name.
    pub fn id(&self) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(self.der())))
    }

    /// Whether `signature` is this key's over `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, self.raw)
            .verify(message, signature)
            .is_ok()
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` of it.
    const OPENSSL_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIO1lX9MAEbs8Gx28eDq/9qxwOQszUG3lJSsslbbrbPL2
-----END PRIVATE KEY-----
";
    const OPENSSL_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEA+HdRqSc1AaYHjusozd3EbcJzl9+rfgXhNZi07FWcG48=
-----END PUBLIC KEY-----
";

    #[test]
    fn a_signature_verifies_only_with_its_key_and_message() {
        let key = SigningKey::from_pem(OPENSSL_KEY).unwrap();
        let other = SigningKey::from_pem(&SigningKey::generate_pem().unwrap()).unwrap();
        let sig = key.sign(b"message");
        assert!(key.public().verify(b"message", &sig));
        assert!(!key.public().verify(b"messagf", &sig));
        assert!(!other.public().verify(b"message", &sig));
        let mut flipped = sig.clone();
        flipped[0] ^= 1;
        assert!(!key.public().verify(b"message", &flipped));
        assert!(!key.public().verify(b"message", b""));
        // The public key is the one openssl derives, round-trips through PEM, and names
        // itself by its DER.
        assert_eq!(key.public().to_pem(), OPENSSL_PUBLIC);
        let public = PublicKey::from_pem(&key.public().to_pem()).unwrap();
        assert_eq!(&public, key.public());
        assert_ne!(public.id(), other.public().id());
        assert!(public.id().starts_with("sha256:") && public.id().len() == 71);
        // Debug output names the key, never its secret.
        assert!(format!("{key:?}").contains(&public.id()));
    }

    #[test]
    fn other_files_are_refused_with_what_was_expected() {
        let err = |r: Result<SigningKey, Error>| r.unwrap_err().to_string();
        let public = SigningKey::from_pem(OPENSSL_KEY).unwrap().public().to_pem();
        assert!(err(SigningKey::from_pem(&public)).contains("BEGIN PRIVATE KEY"));
        assert!(err(SigningKey::from_pem("")).contains("openssl genpkey"));
        // An EC P-256 key (`openssl genpkey -algorithm ec -pkeyopt ec_paramgen_curve:P-256`).
        let ec = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgBHHlTPKYxsTtmMao
bU6voRGYauZezQzakt+gT2GcgB2hRANCAARGn9vN+RJBc4vCYUplyC4GGQc/9N1Z
2s1KmJdv1vI4Yy7G0BuukD7axCd7nfVtZI+WbbpcHg5d/Q+t15Tnn9IF
-----END PRIVATE KEY-----
";
        assert!(err(SigningKey::from_pem(ec)).contains("not an Ed25519 private key"));
        let e = PublicKey::from_pem(OPENSSL_KEY).unwrap_err().to_string();
        assert!(e.contains("BEGIN PUBLIC KEY"), "{e}");
    }
}
