//! The one error type of the Debian module. Variants carry the data needed to act on a failure
//! (paths, URLs, package names, expected and actual hashes); none is a formatted catch-all.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong between a Debian mirror and a root filesystem.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A local file operation failed.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// The keyring file holds no parsable OpenPGP certificate.
    #[error("parsing keyring {path}")]
    Keyring {
        /// The keyring file.
        path: PathBuf,
        /// Why rPGP rejected it.
        #[source]
        source: pgp::errors::Error,
    },
    /// The keyring parsed but holds no certificate.
    #[error("keyring {path} holds no certificate")]
    EmptyKeyring {
        /// The keyring file.
        path: PathBuf,
    },
    /// A mirror path does not form a valid URL under the mirror root.
    #[error("{path:?} is not a valid path under mirror {base}")]
    BadUrl {
        /// The mirror root.
        base: String,
        /// The relative path.
        path: String,
    },
    /// An HTTP request failed before a status was received, or while reading the body.
    #[error("fetching {url}")]
    Http {
        /// The URL requested.
        url: String,
        /// The transport failure.
        #[source]
        source: reqwest::Error,
    },
    /// A body from the mirror could not be read whole: longer than kiln takes for the file (or
    /// said it would be), or the transfer failed. The cause says which and names the URL.
    #[error("reading from the Debian mirror (--debian-mirror)")]
    Body {
        /// The failure, as every package-server fetch reports it.
        #[source]
        source: crate::fetch::download::Error,
    },
    /// The mirror answered with a non-success status.
    #[error("fetching {url}: HTTP status {status}")]
    HttpStatus {
        /// The URL requested.
        url: String,
        /// The status received.
        status: u16,
    },
    /// InRelease is not a well-formed clearsigned message.
    #[error("parsing clearsigned InRelease")]
    Clearsigned {
        /// Why rPGP rejected it.
        #[source]
        source: pgp::errors::Error,
    },
    /// No signature of InRelease verifies with a valid signing key from the keyring.
    #[error(
        "no valid signature on InRelease by a key in the keyring (signature issuers: {issuers:?})"
    )]
    NoValidSignature {
        /// Issuer key ids of the signatures present, in hex.
        issuers: Vec<String>,
    },
    /// The Release file is past its `Valid-Until` date.
    #[error(
        "Release of suite {suite} expired at {valid_until}: the mirror serves a stale copy. \
         Use a current mirror (--debian-mirror URL), or pass --allow-expired-release to \
         `kiln base lock` to lock from it anyway"
    )]
    ReleaseExpired {
        /// The suite requested.
        suite: String,
        /// The `Valid-Until` field as written.
        valid_until: String,
    },
    /// The signed Release names another suite than the one requested (a replay or mix-up).
    #[error("Release answers for suite {found:?}, not the requested {expected:?}")]
    SuiteMismatch {
        /// The suite requested.
        expected: String,
        /// `Suite` and `Codename` of the Release.
        found: String,
    },
    /// A Release field could not be understood.
    #[error("Release field {field} is malformed: {value:?}")]
    ReleaseField {
        /// The field name.
        field: &'static str,
        /// The offending value.
        value: String,
    },
    /// The Release lists no SHA256 entry for an index the caller needs.
    #[error("Release lists no SHA256 for {path}")]
    MissingIndex {
        /// The index path relative to `dists/SUITE/`.
        path: String,
    },
    /// Downloaded bytes differ from the size or hash promised by signed metadata.
    #[error(
        "{what} from {url} does not match: expected sha256 {expected} ({expected_size} bytes), \
         got sha256 {actual} ({actual_size} bytes)"
    )]
    HashMismatch {
        /// What was fetched: an index path or a package name.
        what: String,
        /// Where it came from.
        url: String,
        /// The SHA256 from the signed metadata.
        expected: String,
        /// The SHA256 of what arrived.
        actual: String,
        /// The size from the signed metadata.
        expected_size: u64,
        /// The size of what arrived.
        actual_size: u64,
    },
    /// A compressed stream could not be decoded.
    #[error("decompressing {what}")]
    Decompress {
        /// The file or member being decoded.
        what: String,
        /// The decoder's failure.
        #[source]
        source: io::Error,
    },
    /// A Packages stanza lacks a required field or has a malformed one.
    #[error("package {package:?} in the index has a bad {field} field: {value:?}")]
    PackageField {
        /// The package name (empty when `Package` itself is missing).
        package: String,
        /// The field name.
        field: &'static str,
        /// The offending value.
        value: String,
    },
    /// A root package is neither in the index nor provided by any package.
    #[error("package {name} is not in the index")]
    UnknownPackage {
        /// The requested name.
        name: String,
    },
    /// A dependency that no package in the index satisfies.
    #[error("no package satisfies {dependency:?}, needed by {}", chain.join(" -> "))]
    Unsatisfiable {
        /// The dependency group as written, e.g. `libfoo (>= 2) | libbar`.
        dependency: String,
        /// The packages that led to it, from a root to the one declaring it.
        chain: Vec<String>,
    },
    /// A .deb is not an ar archive with a usable data member.
    #[error("{deb} is not a usable .deb: {reason}")]
    DebFormat {
        /// The .deb file.
        deb: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A .deb member tar entry would land outside the root filesystem.
    #[error("refusing entry {entry:?} of {deb}")]
    UnsafeEntry {
        /// The .deb file.
        deb: PathBuf,
        /// The entry path as written in the tar.
        entry: String,
        /// Why.
        #[source]
        source: crate::rootpath::Error,
    },
    /// A path cannot be placed in the root because another kind of file is in the way.
    #[error("cannot unpack {entry:?} of {deb}: {reason}")]
    EntryConflict {
        /// The .deb file.
        deb: PathBuf,
        /// The entry path as written in the tar.
        entry: String,
        /// What is in the way.
        reason: &'static str,
    },
    /// A merged-/usr link cannot be made because something else is at its place.
    #[error("cannot create merged-/usr link {path}: another file is there")]
    MergedUsr {
        /// The path that should be a symlink into `usr/`.
        path: PathBuf,
    },
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| {
            Error::Io(crate::io_error::IoError {
                action,
                path,
                source,
            })
        }
    }
}

/// The Debian module's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
