//! Async OCI distribution client: image references, authentication (anonymous, Basic, Bearer
//! tokens; docker `config.json`, credential helpers and `.dockerconfigjson` secrets), manifests,
//! blobs (HEAD, verified download, cross-repository mount, upload), structured redacted errors
//! and a retry policy.
//!
//! The push protocol it implements: per blob `HEAD` → mount → upload, the manifest last (the
//! caller's job), with ONE token per registry carrying every scope of the build. It uses only
//! `oci::{Digest, Descriptor, Document, MediaType, Hasher, sniff_media_type}` from the crate.
//!
//! ```no_run
//! # async fn demo() -> kiln::registry::Result<()> {
//! use kiln::registry::{Client, ClientConfig, Reference, Scope};
//! let client = Client::new(ClientConfig::default())?;
//! let target: Reference = "reg.example/team/app:v1".parse()?;
//! let scopes = [Scope::push(&target.repository), Scope::pull("base/node")];
//! client.authorize(&target.registry, &scopes).await?;
//! let base = client.get_manifest(&"reg.example/base/node:22".parse()?, &[]).await?;
//! # let _ = base; Ok(()) }
//! ```
//!
//! # Files
//!
//! Files, lowest first: a file uses (`super::…`, `crate::registry::…`, re-exports traced to
//! where they are defined) only files on the lines above its own. `tests/it/structure.rs`
//! reads this list and fails on an arrow it does not allow, so the files never form a loop.
//!
//! - `failure`, `challenge`, `credential`, `scope`, `policy`, `documents`: the leaves.
//! - `error`: [`Error`], built on `failure`'s classification.
//! - `reference`, `retry`, `http`, `helper`: references, backoff, the HTTP clients, helpers.
//! - `credentials`: where credentials come from.
//! - `transport`: one HTTP exchange and reading its answer.
//! - `auth`: the token protocol.
//! - `session`: one registry's authentication state.
//! - `client`: [`Client`], its shared state and the send pipeline.
//! - `blobs`, `manifests`: reads and manifest pushes, as methods of [`Client`].
//! - `referrers`: the OCI 1.1 referrers API and its tag schema, as methods of [`Client`].
//! - `upload_steps`: one upload attempt.
//! - `upload`: blob pushes (exists, mount, upload).

mod auth;
mod blobs;
mod challenge;
mod client;
mod credential;
mod credentials;
mod documents;
mod error;
mod failure;
mod helper;
mod http;
mod manifests;
mod policy;
mod reference;
mod referrers;
mod retry;
mod scope;
mod session;
mod transport;
mod upload;
mod upload_steps;

pub use crate::redact::redact_url;
pub use blobs::{IN_MEMORY_BLOB_LIMIT, TEMP_PREFIX as BLOB_TEMP_PREFIX};
pub use client::{Client, ClientConfig};
pub use credential::Credential;
pub use credentials::{CredentialStore, DOCKER_HUB_CONFIG_KEY};
pub use error::{Error, ErrorInfo, Hint, Result, TransportKind};
pub use manifests::{DEFAULT_MANIFEST_TYPES, MANIFEST_LIMIT};
pub use reference::{DOCKER_HUB, DOCKER_HUB_API, Reference, check_registry};
pub use retry::RetryPolicy;
pub use scope::Scope;
pub use transport::Traffic;

/// For the fuzz targets: whether `headers` hold a challenge kiln would answer.
#[doc(hidden)]
pub fn challenge_from_headers(headers: &reqwest::header::HeaderMap) -> bool {
    challenge::from_headers(headers).is_some()
}
pub use policy::UploadPolicy;
pub use upload::BlobOutcome;
pub use upload_steps::BlobSource;
