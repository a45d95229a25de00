//! Debian packages to a root filesystem, verifiably and reproducibly: the signed InRelease of a
//! suite ([`fetch_release`]), its Packages index by hash ([`fetch_packages`]), the dependency
//! closure of some root packages ([`PackageIndex::resolve`]), .debs checked against the index
//! ([`fetch_deb`]) and unpacked without maintainer scripts ([`unpack_deb`]). Network I/O lives
//! in `fetch` only; everything else is pure or local-file work. No mirror host is built in.

mod control;
mod error;
mod fetch;
mod keyring;
mod license;
mod packages;
mod relation;
mod release;
mod resolve;
mod sources;
mod unpack;
mod version;

pub use error::{Error, Result};
pub use fetch::{fetch_deb, fetch_debs, fetch_packages, fetch_release};
pub use keyring::{Keyring, SigningKey};
pub use license::{licenses, parse_licenses};
pub use packages::{LockedPackage, Package, PackageIndex, Provider};
pub use relation::{Group, Op, Relation, parse_relations};
pub use release::{IndexEntry, Release, verify_release, verify_release_signature};
pub use sources::{
    SourceEntry, SourcesFormat, find_debian_mirror, mirror_from_dir, parse_sources,
    system_mirror_url,
};
pub use unpack::{merged_usr_links, unpack_deb};
pub use version::{Version, VersionError};

/// The default keyring of Debian's archive signing keys (package `debian-archive-keyring`).
pub const DEBIAN_ARCHIVE_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// One suite, component and architecture of a Debian mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The archive root, e.g. `http://HOST/debian` (from [`system_mirror_url`] or the caller).
    pub url: url::Url,
    /// The suite or codename, e.g. `trixie`.
    pub suite: String,
    /// The component, e.g. `main`.
    pub component: String,
    /// The Debian architecture, e.g. `amd64`.
    pub arch: String,
    /// Lock from a Release whose `Valid-Until` has passed (its signature is still checked):
    /// the user's explicit choice, for a mirror that lags behind a testing suite's weekly
    /// re-signing. The lock's hashes then pin what was resolved, as always.
    pub allow_expired_release: bool,
}

impl Mirror {
    /// `main` of `suite` for `amd64` at `url`.
    pub fn new(url: url::Url, suite: &str) -> Mirror {
        Mirror {
            url,
            suite: suite.to_string(),
            component: "main".to_string(),
            arch: "amd64".to_string(),
            allow_expired_release: false,
        }
    }
}
