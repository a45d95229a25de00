//! The signed `InRelease` file of a suite: clearsigned-message verification against a
//! [`Keyring`] (accept when at least one signature is by a key that is valid at the given time;
//! signatures by unknown keys are ignored, as apt does), then the Release fields kiln trusts:
//! suite names, `Valid-Until`, `Acquire-By-Hash` and the SHA256 list of indexes. Pure.
//! Spec: <https://wiki.debian.org/DebianRepository/Format#A.22Release.22_files>.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use pgp::composed::CleartextSignedMessage;
use pgp::packet::Signature;
use tracing::debug;

use super::control;
use super::keyring::{Keyring, SigningKey};
use super::{Error, Result};

/// An index file listed in the Release: its SHA256 and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Lowercase hex SHA256.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

/// The verified body of a suite's Release file.
#[derive(Debug, Clone)]
pub struct Release {
    text: String,
    /// `Suite`, e.g. `stable`.
    pub suite: String,
    /// `Codename`, e.g. `trixie`.
    pub codename: String,
    /// `Date`, as written.
    pub date: String,
    /// `Valid-Until`, as written, when present.
    pub valid_until: Option<String>,
    /// Whether indexes may be fetched under `by-hash/SHA256/<hash>`.
    pub acquire_by_hash: bool,
    /// Fingerprints (lowercase hex) of the keys whose signatures verified; empty for text that
    /// was only parsed.
    pub signed_by: Vec<String>,
    sha256: BTreeMap<String, IndexEntry>,
}

impl Release {
    /// Parses Release text. This checks nothing cryptographic: use [`verify_release`] for text
    /// that came from a mirror.
    ///
    /// # Errors
    /// [`Error::ReleaseField`] when the SHA256 list is malformed.
    pub fn parse(text: &str) -> Result<Release> {
        let paragraph = control::paragraphs(text).next().unwrap_or_default();
        let field = |name| paragraph.get(name).unwrap_or_default().to_string();
        let mut sha256 = BTreeMap::new();
        for line in paragraph.get("SHA256").unwrap_or_default().lines() {
            let bad = || Error::ReleaseField {
                field: "SHA256",
                value: line.to_string(),
            };
            let mut words = line.split_whitespace();
            let (Some(hash), Some(size), Some(path), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                if line.trim().is_empty() {
                    continue;
                }
                return Err(bad());
            };
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            let size = size.parse().map_err(|_| bad())?;
            let entry = IndexEntry {
                sha256: hash.to_ascii_lowercase(),
                size,
            };
            sha256.insert(path.to_string(), entry);
        }
        Ok(Release {
            text: text.to_string(),
            suite: field("Suite"),
            codename: field("Codename"),
            date: field("Date"),
            valid_until: paragraph.get("Valid-Until").map(str::to_string),
            acquire_by_hash: paragraph.get("Acquire-By-Hash").is_some_and(|v| v == "yes"),
            signed_by: Vec::new(),
            sha256,
        })
    }

    /// The SHA256 and size listed for `path` (relative to `dists/SUITE/`).
    pub fn index(&self, path: &str) -> Option<&IndexEntry> {
        self.sha256.get(path)
    }

    /// The full Release text that was signed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Checks that this Release answers for `suite` (its `Suite` or `Codename`), so a mirror
    /// cannot substitute another suite's validly signed Release.
    ///
    /// # Errors
    /// [`Error::SuiteMismatch`] otherwise.
    pub fn check_suite(&self, suite: &str) -> Result<()> {
        if self.suite == suite || self.codename == suite {
            return Ok(());
        }
        Err(Error::SuiteMismatch {
            expected: suite.to_string(),
            found: format!("{}/{}", self.suite, self.codename),
        })
    }

    /// Checks that `Valid-Until`, when present, is after `now`.
    ///
    /// # Errors
    /// [`Error::ReleaseExpired`] when it has passed; [`Error::ReleaseField`] when unreadable.
    pub fn check_valid_until(&self, now: SystemTime) -> Result<()> {
        let Some(valid_until) = &self.valid_until else {
            return Ok(());
        };
        let expired = || Error::ReleaseExpired {
            suite: self.suite.clone(),
            valid_until: valid_until.clone(),
        };
        let Some(secs) = parse_date(valid_until) else {
            return Err(Error::ReleaseField {
                field: "Valid-Until",
                value: valid_until.clone(),
            });
        };
        if now >= SystemTime::UNIX_EPOCH + Duration::from_secs(secs) {
            return Err(expired());
        }
        Ok(())
    }
}

/// Verifies a clearsigned InRelease file at time `now` and returns its parsed body.
///
/// # Errors
/// [`Error::Clearsigned`] for a malformed message, [`Error::NoValidSignature`] when no
/// signature verifies with a key of `keyring` valid at `now`, [`Error::ReleaseExpired`] when
/// `Valid-Until` has passed.
pub fn verify_release(bytes: &[u8], keyring: &Keyring, now: SystemTime) -> Result<Release> {
    let release = verify_release_signature(bytes, keyring, now)?;
    release.check_valid_until(now)?;
    Ok(release)
}

/// [`verify_release`] without the `Valid-Until` check: the signature, made by a key of
/// `keyring` valid at `now`, is all that is checked.
///
/// # Errors
/// Those of [`verify_release`] but [`Error::ReleaseExpired`].
pub fn verify_release_signature(
    bytes: &[u8],
    keyring: &Keyring,
    now: SystemTime,
) -> Result<Release> {
    let text = String::from_utf8_lossy(bytes);
    let (message, _) = CleartextSignedMessage::from_string(&text)
        .map_err(|source| Error::Clearsigned { source })?;
    let signed = message.signed_text();
    let keys = keyring.signing_keys(now);
    let signed_by: Vec<String> = message
        .signatures()
        .iter()
        .filter_map(|sig| {
            let key = keys
                .iter()
                .find(|key| signature_is_good(sig, key, signed.as_bytes(), now))?;
            Some(key.fingerprint())
        })
        .collect();
    if signed_by.is_empty() {
        let issuers = message
            .signatures()
            .iter()
            .flat_map(|sig| sig.issuer_key_id().into_iter().map(|id| id.to_string()))
            .collect();
        return Err(Error::NoValidSignature { issuers });
    }
    let mut release = Release::parse(&dash_unescape(message.text()))?;
    release.signed_by = signed_by;
    Ok(release)
}

/// Whether `sig` verifies with `key`, was made after the key was created, and has not expired.
fn signature_is_good(sig: &Signature, key: &SigningKey<'_>, data: &[u8], now: SystemTime) -> bool {
    let Some(created) = sig.created() else {
        return false;
    };
    let created = u64::from(created.as_secs());
    if created < u64::from(key.created_at().as_secs()) || !key.verifies(sig, data) {
        return false;
    }
    let expires = sig
        .signature_expiration_time()
        .map(|d| d.as_secs())
        .filter(|d| *d > 0);
    let expired = expires.is_some_and(|secs| {
        now >= SystemTime::UNIX_EPOCH + Duration::from_secs(created + u64::from(secs))
    });
    debug!(issuer = ?sig.issuer_key_id(), expired, "InRelease signature verified");
    !expired
}

/// Undoes the cleartext framework's dash-escaping (`- -foo` → `-foo`, RFC 9580 §7.2).
fn dash_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        out.push_str(line.strip_prefix("- ").unwrap_or(line));
    }
    out
}

/// Parses an RFC 2822 date in UTC as Release files write it (`Sat, 06 Sep 2025 09:24:51 UTC`)
/// into seconds since the epoch.
fn parse_date(text: &str) -> Option<u64> {
    let text = text.split_once(',').map_or(text, |(_, rest)| rest);
    let mut words = text.split_whitespace();
    let day: u64 = words.next()?.parse().ok()?;
    let month = words.next()?;
    let year: i64 = words.next()?.parse().ok()?;
    let mut clock = words.next()?.split(':').map(|n| n.parse::<u64>().ok());
    let (h, m, s) = (clock.next()??, clock.next()??, clock.next()??);
    if !matches!(words.next(), Some("UTC" | "GMT" | "+0000" | "Z") | None) {
        return None;
    }
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS
        .iter()
        .position(|name| name.eq_ignore_ascii_case(month))? as i64
        + 1;
    // Days from the civil date (Howard Hinnant's algorithm), valid for the proleptic Gregorian
    // calendar.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
