//! Tests of InRelease verification on small fixtures made once with gpg (see
//! `testdata/README.md`): a subkey-signed message that also carries a signature by a key revoked
//! afterwards, one by a key that expired in 2020, and one with a past `Valid-Until`.

use std::path::PathBuf;

use super::*;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/base/debian/testdata")
        .join(name)
}

fn keyring(name: &str) -> Keyring {
    Keyring::load(&testdata(name)).unwrap()
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(testdata(name)).unwrap()
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// 2027-01-01T00:00:00Z: after every fixture was made.
const LATER: u64 = 1_798_761_600;

#[test]
fn a_clearsigned_release_verifies_by_subkey_and_parses() {
    let release =
        verify_release(&read("InRelease"), &keyring("signing-key.asc"), at(LATER)).unwrap();
    assert_eq!(release.suite, "stable");
    assert_eq!(release.codename, "trixie");
    assert!(release.acquire_by_hash);
    assert_eq!(release.valid_until, None);
    // Only the subkey's signature counts: the other is by a key the keyring does not hold.
    assert_eq!(
        release.signed_by,
        ["26d2ef437470229ece26f84c02e78fe71884fef7"]
    );
    let entry = release.index("main/binary-amd64/Packages.xz").unwrap();
    assert_eq!(entry.size, 9_678_380);
    assert!(entry.sha256.starts_with("7778d3e3") && entry.sha256.len() == 64);
    assert!(release.text().starts_with("Origin: Debian\n"));
    assert!(!release.text().contains("PGP"));
    release.check_suite("trixie").unwrap();
    release.check_suite("stable").unwrap();
    assert!(matches!(
        release.check_suite("bookworm"),
        Err(Error::SuiteMismatch { .. })
    ));
}

#[test]
fn one_changed_byte_in_the_body_is_rejected() {
    let bytes = read("InRelease");
    let at_digit = bytes.windows(6).position(|w| w == b"13.1\nC").unwrap();
    let mut tampered = bytes.clone();
    tampered[at_digit + 3] = b'2';
    let err = verify_release(&tampered, &keyring("signing-key.asc"), at(LATER)).unwrap_err();
    let Error::NoValidSignature { issuers } = &err else {
        panic!("unexpected {err}");
    };
    assert_eq!(
        issuers.len(),
        2,
        "both signatures are reported: {issuers:?}"
    );
}

#[test]
fn a_signature_by_a_revoked_key_does_not_count() {
    // The revoked key's signature is cryptographically sound; only the revocation rejects it.
    let err = verify_release(&read("InRelease"), &keyring("revoked-key.asc"), at(LATER));
    assert!(matches!(err, Err(Error::NoValidSignature { .. })));
}

#[test]
fn a_signature_by_an_expired_key_counts_only_before_expiry() {
    let keys = keyring("expired-key.asc");
    let bytes = read("InRelease-expired-key");
    let err = verify_release(&bytes, &keys, at(LATER));
    assert!(matches!(err, Err(Error::NoValidSignature { .. })));
    // One hour after signing, within the key's one-day lifetime.
    verify_release(&bytes, &keys, at(1_577_883_600)).unwrap();
}

#[test]
fn signatures_by_unknown_keys_are_ignored() {
    let err = verify_release(&read("InRelease"), &keyring("expired-key.asc"), at(LATER));
    assert!(matches!(err, Err(Error::NoValidSignature { .. })));
    let err = verify_release(
        &read("InRelease-expired-key"),
        &keyring("signing-key.asc"),
        at(LATER),
    );
    assert!(matches!(err, Err(Error::NoValidSignature { .. })));
}

#[test]
fn a_release_past_valid_until_is_rejected() {
    let keys = keyring("signing-key.asc");
    let bytes = read("InRelease-valid-until");
    let err = verify_release(&bytes, &keys, at(LATER)).unwrap_err();
    assert!(matches!(&err, Error::ReleaseExpired { valid_until, .. }
        if valid_until == "Sat, 13 Sep 2025 09:24:51 UTC"));
    // 2025-09-10, before Valid-Until.
    verify_release(&bytes, &keys, at(1_757_462_400)).unwrap();
    // `--allow-expired-release` waives only Valid-Until: the signature still counts.
    let release = verify_release_signature(&bytes, &keys, at(LATER)).unwrap();
    assert!(matches!(
        release.check_valid_until(at(LATER)),
        Err(Error::ReleaseExpired { .. })
    ));
    let at_digit = bytes.windows(6).position(|w| w == b"13.1\nC").unwrap();
    let mut tampered = bytes.clone();
    tampered[at_digit + 3] = b'2';
    assert!(matches!(
        verify_release_signature(&tampered, &keys, at(LATER)),
        Err(Error::NoValidSignature { .. })
    ));
}

#[test]
fn garbage_is_not_a_clearsigned_message() {
    let err = verify_release(b"Origin: Debian\n", &keyring("signing-key.asc"), at(LATER));
    assert!(matches!(err, Err(Error::Clearsigned { .. })));
}

#[test]
fn release_dates_parse_as_utc() {
    assert_eq!(
        parse_date("Sat, 06 Sep 2025 09:24:51 UTC"),
        Some(1_757_150_691)
    );
    assert_eq!(
        parse_date("Tue, 29 Feb 2000 23:59:59 UTC"),
        Some(951_868_799)
    );
    assert_eq!(parse_date("Sat, 06 Sep 2025 09:24:51 +0200"), None);
    assert_eq!(parse_date("yesterday"), None);
}

#[test]
fn dash_escaped_lines_are_unescaped() {
    assert_eq!(dash_unescape("a\n- -b\n- c\n"), "a\n-b\nc\n");
}

#[test]
fn a_malformed_sha256_list_is_an_error() {
    let err = Release::parse("Suite: x\nSHA256:\n abc 12 main/Packages\n").unwrap_err();
    assert!(matches!(
        err,
        Error::ReleaseField {
            field: "SHA256",
            ..
        }
    ));
}
