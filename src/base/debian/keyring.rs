//! An OpenPGP keyring (binary or armored) and the policy rPGP leaves to its callers: which keys
//! and subkeys may sign at a given time. A key counts when its newest verified self-signature or
//! subkey binding (with back-signature) grants signing and has not expired, and no verified
//! revocation exists. Third-party certifications are ignored, never verified (see DEBIAN.md:
//! `SignedPublicKey::verify_bindings` fails on them).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use pgp::composed::{Deserializable, SignedPublicKey, SignedPublicSubKey};
use pgp::packet::{PublicKey, PublicSubkey, Signature, SignatureType, SubpacketData};
use pgp::types::{KeyDetails, Tag, Timestamp};

use super::{Error, Result};

/// The certificates of one keyring file.
#[derive(Debug, Clone)]
pub struct Keyring {
    path: PathBuf,
    certs: Vec<SignedPublicKey>,
}

/// A key that may sign now: a certificate's primary key or one of its subkeys.
#[derive(Debug, Clone, Copy)]
pub enum SigningKey<'a> {
    /// The primary key.
    Primary(&'a PublicKey),
    /// A signing-capable subkey.
    Subkey(&'a PublicSubkey),
}

impl SigningKey<'_> {
    /// When the key was created.
    pub fn created_at(&self) -> Timestamp {
        match self {
            SigningKey::Primary(key) => key.created_at(),
            SigningKey::Subkey(key) => key.created_at(),
        }
    }

    /// The key's fingerprint, lowercase hex.
    pub fn fingerprint(&self) -> String {
        match self {
            SigningKey::Primary(key) => format!("{:x}", key.fingerprint()),
            SigningKey::Subkey(key) => format!("{:x}", key.fingerprint()),
        }
    }

    /// Whether `sig` is a valid signature by this key over `data`.
    pub fn verifies(&self, sig: &Signature, data: &[u8]) -> bool {
        match self {
            SigningKey::Primary(key) => sig.verify(*key, data).is_ok(),
            SigningKey::Subkey(key) => sig.verify(*key, data).is_ok(),
        }
    }
}

impl Keyring {
    /// Loads every certificate of a binary or ASCII-armored keyring file, such as
    /// `/usr/share/keyrings/debian-archive-keyring.gpg`.
    ///
    /// # Errors
    /// When the file cannot be read or parsed, or holds no certificate.
    pub fn load(path: &Path) -> Result<Keyring> {
        let file = File::open(path).map_err(Error::io("opening keyring", path))?;
        let keyring_error = |source| Error::Keyring {
            path: path.to_path_buf(),
            source,
        };
        let (certs, _) =
            SignedPublicKey::from_reader_many(BufReader::new(file)).map_err(keyring_error)?;
        let certs = certs
            .collect::<Result<Vec<_>, _>>()
            .map_err(keyring_error)?;
        if certs.is_empty() {
            return Err(Error::EmptyKeyring {
                path: path.to_path_buf(),
            });
        }
        Ok(Keyring {
            path: path.to_path_buf(),
            certs,
        })
    }

    /// The file this keyring came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of certificates.
    pub fn len(&self) -> usize {
        self.certs.len()
    }

    /// Whether the keyring has no certificate.
    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }

    /// Every primary key and subkey that is valid and may sign at `now`.
    pub fn signing_keys(&self, now: SystemTime) -> Vec<SigningKey<'_>> {
        let mut keys = Vec::new();
        for cert in &self.certs {
            let primary = &cert.primary_key;
            let Some(self_sig) = newest_self_signature(cert) else {
                continue;
            };
            if is_revoked(cert) || is_expired(primary.created_at(), self_sig, now) {
                continue;
            }
            if grants_signing(self_sig, true) {
                keys.push(SigningKey::Primary(primary));
            }
            for subkey in &cert.public_subkeys {
                if subkey_may_sign(primary, subkey, now) {
                    keys.push(SigningKey::Subkey(&subkey.key));
                }
            }
        }
        keys
    }
}

/// Whether `sig` names `primary` as its issuer (or names no issuer at all).
fn issued_by(sig: &Signature, primary: &PublicKey) -> bool {
    let ids = sig.issuer_key_id();
    let fingerprints = sig.issuer_fingerprint();
    (ids.is_empty() && fingerprints.is_empty())
        || ids.iter().any(|id| **id == primary.legacy_key_id())
        || fingerprints.iter().any(|fp| **fp == primary.fingerprint())
}

fn created_secs(sig: &Signature) -> u32 {
    sig.created().map_or(0, Timestamp::as_secs)
}

/// The newest verified self-certification of a user id or direct-key self-signature.
fn newest_self_signature(cert: &SignedPublicKey) -> Option<&Signature> {
    let primary = &cert.primary_key;
    let certifications = cert.details.users.iter().flat_map(|user| {
        user.signatures.iter().filter(move |sig| {
            sig.is_certification()
                && sig.typ() != Some(SignatureType::CertRevocation)
                && issued_by(sig, primary)
                && sig
                    .verify_certification(primary, Tag::UserId, &user.id)
                    .is_ok()
        })
    });
    let direct = cert
        .details
        .direct_signatures
        .iter()
        .filter(|sig| issued_by(sig, primary) && sig.verify_key(primary).is_ok());
    certifications
        .chain(direct)
        .max_by_key(|sig| created_secs(sig))
}

/// Whether a verified key revocation signature exists. Designated revokers are not honoured.
fn is_revoked(cert: &SignedPublicKey) -> bool {
    let primary = &cert.primary_key;
    cert.details
        .revocation_signatures
        .iter()
        .any(|sig| issued_by(sig, primary) && sig.verify_key(primary).is_ok())
}

/// Whether a key created at `created` has expired by `now` according to its binding `sig`.
fn is_expired(created: Timestamp, sig: &Signature, now: SystemTime) -> bool {
    match sig.key_expiration_time().map(|d| d.as_secs()) {
        None | Some(0) => false,
        Some(secs) => {
            let expires = u64::from(created.as_secs()) + u64::from(secs);
            let now = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            now >= expires
        }
    }
}

/// Whether the binding grants signing. A primary key whose self-signature has no key flags at
/// all is taken as able to sign (RFC 4880 keys predating the subpacket); a subkey is not.
fn grants_signing(sig: &Signature, is_primary: bool) -> bool {
    let has_flags = sig.config().is_some_and(|c| {
        c.hashed_subpackets()
            .any(|p| matches!(p.data, SubpacketData::KeyFlags(_)))
    });
    if has_flags {
        sig.key_flags().sign()
    } else {
        is_primary
    }
}

fn subkey_may_sign(primary: &PublicKey, subkey: &SignedPublicSubKey, now: SystemTime) -> bool {
    let verified = |typ| {
        subkey.signatures.iter().filter(move |sig| {
            sig.typ() == Some(typ) && sig.verify_subkey_binding(primary, &subkey.key).is_ok()
        })
    };
    if verified(SignatureType::SubkeyRevocation).next().is_some() {
        return false;
    }
    let Some(binding) = verified(SignatureType::SubkeyBinding).max_by_key(|s| created_secs(s))
    else {
        return false;
    };
    // A signing subkey must prove it consents to the binding with an embedded back-signature.
    let backsig_ok = binding.embedded_signature().is_some_and(|back| {
        back.verify_primary_key_binding(&subkey.key, primary)
            .is_ok()
    });
    grants_signing(binding, false)
        && backsig_ok
        && !is_expired(subkey.key.created_at(), binding, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Keyring {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/base/debian/testdata");
        Keyring::load(&dir.join(name)).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    #[test]
    fn only_valid_signing_keys_count() {
        let later = at(1_798_761_600); // 2027-01-01
        let signing = fixture("signing-key.asc");
        let keys = signing.signing_keys(later);
        assert_eq!(
            keys.len(),
            1,
            "the certify-only primary cannot sign, its subkey can"
        );
        assert!(matches!(keys[0], SigningKey::Subkey(_)));
        assert!(fixture("revoked-key.asc").signing_keys(later).is_empty());
        let expired = fixture("expired-key.asc");
        assert!(expired.signing_keys(later).is_empty());
        let keys = expired.signing_keys(at(1_577_883_600)); // 2020-01-01T13:00Z
        assert!(matches!(keys[..], [SigningKey::Primary(_)]));
    }

    #[test]
    fn a_missing_or_garbage_keyring_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.gpg");
        let err = Keyring::load(&missing).unwrap_err();
        assert!(err.to_string().contains("absent.gpg"), "{err}");
        let garbage = dir.path().join("garbage.gpg");
        std::fs::write(&garbage, b"\x99\x00garbage").unwrap();
        let err = Keyring::load(&garbage).unwrap_err();
        assert!(err.to_string().contains("garbage.gpg"), "{err}");
    }
}
