//! What the reconciler looks up outside the Function, each behind a small time-bounded cache
//! so a steady state costs no requests: image tags resolved to digests (the base and builder
//! images every Function of a runtime shares), "does the registry have this build's image",
//! the digest of a namespace's package-registry config, and git references resolved to
//! commits (through [`CommitResolver`], the seam to the git client).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Api;

use super::error::{Error, Result};
use crate::oci::{Digest, Hasher, Platform};
use crate::registry::{self, Reference};

/// Entries that expire.
struct Ttl<V> {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> Ttl<V> {
    fn new(ttl: Duration) -> Ttl<V> {
        Ttl {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &str) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, v)| v.clone())
    }

    fn put(&self, key: &str, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(key.to_string(), (Instant::now(), value));
    }
}

/// Image references resolved to `(repository, digest)`.
pub struct Images {
    client: registry::Client,
    cache: Ttl<(String, Digest)>,
}

impl Images {
    /// A resolver trusting a tag's digest for `ttl`.
    pub fn new(client: registry::Client, ttl: Duration) -> Images {
        Images {
            client,
            cache: Ttl::new(ttl),
        }
    }

    /// The registry client (with the controller's credentials).
    pub fn client(&self) -> &registry::Client {
        &self.client
    }

    /// The repository and manifest digest `reference` names: no request when it is pinned
    /// by digest or was resolved within the TTL.
    ///
    /// # Errors
    /// An invalid reference, a registry failure, or an image that does not exist.
    pub async fn resolve(&self, reference: &str) -> Result<(String, Digest)> {
        let parsed: Reference = reference
            .parse()
            .map_err(|e| Error::Missing(format!("invalid image reference {reference:?}: {e}")))?;
        let repository = format!("{}/{}", parsed.registry, parsed.repository);
        if let Some(digest) = &parsed.digest {
            return Ok((repository, digest.clone()));
        }
        if let Some(hit) = self.cache.get(reference) {
            return Ok(hit);
        }
        let found = self
            .client
            .head_manifest(&parsed)
            .await
            .map_err(Error::registry(format!("resolving image {reference}")))?
            .ok_or_else(|| Error::Missing(format!("image {reference} does not exist")))?;
        let value = (repository, found.digest);
        self.cache.put(reference, value.clone());
        Ok(value)
    }

    /// The digest of the manifest tagged `reference`, if the registry has it (one HEAD).
    ///
    /// # Errors
    /// A registry failure.
    pub async fn find(&self, reference: &str) -> Result<Option<Digest>> {
        let parsed: Reference = reference
            .parse()
            .map_err(|e| Error::Missing(format!("invalid image reference {reference:?}: {e}")))?;
        let found = self
            .client
            .head_manifest(&parsed)
            .await
            .map_err(Error::registry(format!("looking up image {reference}")))?;
        Ok(found.map(|d| d.digest))
    }

    /// Whether `image` (`repository@digest`) carries a signature by `key` and a provenance by
    /// it of a build pushed as `pushed_as` (the repository tagged with the controller's build
    /// key; [`crate::cosign::verify_image`]: of an image index, each image it lists):
    /// `Ok(Err(why))` when it does not.
    ///
    /// # Errors
    /// A registry failure (retried), as opposed to an answer that the image does not verify.
    pub async fn provenance(
        &self,
        image: &str,
        key: &crate::cosign::VerifyKey,
        pushed_as: &str,
    ) -> Result<std::result::Result<(), String>> {
        use crate::cosign::{VerifyError, Wanted};
        let parsed: Reference = image
            .parse()
            .map_err(|e| Error::Missing(format!("invalid image reference {image:?}: {e}")))?;
        let wanted = Wanted {
            build_key: None,
            pushed_as: Some(pushed_as),
        };
        match crate::cosign::verify_image(&self.client, &parsed, key, wanted).await {
            Ok(_) => Ok(Ok(())),
            Err(VerifyError::Registry { what, source }) => Err(Error::registry(format!(
                "checking the provenance of {what}"
            ))(source)),
            // With its causes: an index's names the platform's image, and then why.
            Err(e) => Ok(Err(format!("{:#}", anyhow::Error::from(e)))),
        }
    }
}

/// The public key of the image signing Secret (`--image-signing-secret`, in `namespace`):
/// what `--require-provenance` checks images against.
///
/// # Errors
/// The Secret or its public key is missing or unreadable, or an API failure.
pub async fn image_verify_key(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
) -> Result<crate::cosign::VerifyKey> {
    use super::config::IMAGE_VERIFY_KEY;
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let found = api
        .get_opt(secret)
        .await
        .map_err(Error::kube(format!("reading Secret {namespace}/{secret}")))?
        .ok_or_else(|| {
            Error::Missing(format!(
                "the image signing Secret {namespace}/{secret} does not exist: \
                 --require-provenance checks images against its {IMAGE_VERIFY_KEY}"
            ))
        })?;
    let pem = found
        .data
        .and_then(|d| d.get(IMAGE_VERIFY_KEY).map(|b| b.0.clone()))
        .ok_or_else(|| {
            Error::Missing(format!(
                "the image signing Secret {namespace}/{secret} has no {IMAGE_VERIFY_KEY}: add \
                 the public key (cosign public-key --key cosign.key) under that key"
            ))
        })?;
    verify_key(&pem).map_err(|e| {
        Error::Missing(format!(
            "the {IMAGE_VERIFY_KEY} of the image signing Secret {namespace}/{secret}: {e}"
        ))
    })
}

/// The public key of an image signing Secret's `cosign.pub` bytes, or why not.
pub fn verify_key(pem: &[u8]) -> std::result::Result<crate::cosign::VerifyKey, String> {
    let text = std::str::from_utf8(pem).map_err(|_| "not text".to_string())?;
    crate::cosign::VerifyKey::from_pem(text).map_err(|e| e.to_string())
}

/// Digests of namespaces' package-registry config Secrets.
pub struct RegistryConfigs {
    secret: String,
    cache: Ttl<Option<Digest>>,
}

impl RegistryConfigs {
    /// Looks up Secret `secret` in each namespace, trusting an answer for `ttl`.
    pub fn new(secret: String, ttl: Duration) -> RegistryConfigs {
        RegistryConfigs {
            secret,
            cache: Ttl::new(ttl),
        }
    }

    /// The digest of `namespace`'s package-registry config, `None` when it has none. The
    /// Secret's contents never leave this function: only a digest over them does.
    ///
    /// # Errors
    /// An API failure other than "not found".
    pub async fn digest(&self, client: &kube::Client, namespace: &str) -> Result<Option<Digest>> {
        if let Some(hit) = self.cache.get(namespace) {
            return Ok(hit);
        }
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let secret = api
            .get_opt(&self.secret)
            .await
            .map_err(Error::kube(format!(
                "reading Secret {namespace}/{}",
                self.secret
            )))?;
        let digest = secret.map(|s| {
            let mut h = Hasher::new();
            h.update(b"kiln-package-registry-config-v1\n");
            for (key, value) in s.data.unwrap_or_default() {
                h.update(format!("{}:{key}\n{}:", key.len(), value.0.len()).as_bytes());
                h.update(&value.0);
            }
            h.finish().0
        });
        self.cache.put(namespace, digest.clone());
        Ok(digest)
    }
}

/// The platforms of the cluster's Nodes (their `kubernetes.io/os` and `kubernetes.io/arch`
/// labels, which every kubelet sets): what a Function is built for unless it or the
/// controller's flag names its platforms. One list of every Node per TTL.
pub struct NodePlatforms {
    cache: Ttl<Vec<Platform>>,
}

/// The Node labels a platform is read from (the kubelet's well-known labels).
pub const NODE_OS: &str = "kubernetes.io/os";
/// See [`NODE_OS`].
pub const NODE_ARCH: &str = "kubernetes.io/arch";

impl NodePlatforms {
    /// Lists the Nodes again after `ttl`.
    pub fn new(ttl: Duration) -> NodePlatforms {
        NodePlatforms {
            cache: Ttl::new(ttl),
        }
    }

    /// The Nodes' platforms, sorted, each once; this controller's own when no Node has the
    /// labels (it runs on one of them).
    ///
    /// # Errors
    /// The list failed.
    pub async fn platforms(&self, client: &kube::Client) -> Result<Vec<Platform>> {
        if let Some(hit) = self.cache.get("") {
            return Ok(hit);
        }
        let api: Api<Node> = Api::all(client.clone());
        let nodes = api
            .list_metadata(&kube::api::ListParams::default())
            .await
            .map_err(Error::kube("listing Nodes (for their architectures)"))?;
        let found = node_platforms(nodes.items.iter().map(|n| &n.metadata));
        self.cache.put("", found.clone());
        Ok(found)
    }
}

/// The platforms `nodes` are labelled with, sorted and each once; [`Platform::host`] when
/// none is.
pub fn node_platforms<'a>(
    nodes: impl Iterator<Item = &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
) -> Vec<Platform> {
    let mut found: Vec<Platform> = nodes
        .filter_map(|meta| {
            let labels = meta.labels.as_ref()?;
            let (os, arch) = (labels.get(NODE_OS)?, labels.get(NODE_ARCH)?);
            Platform::parse(&format!("{os}/{arch}"))
        })
        .collect();
    found.sort_by_key(ToString::to_string);
    found.dedup();
    if found.is_empty() {
        found.push(Platform::host());
    }
    found
}

/// Resolves a git reference (branch, tag or commit) to a commit without cloning.
pub trait CommitResolver: Send + Sync {
    /// The 40-hex commit `reference` names at `url`.
    ///
    /// # Errors
    /// A message for the Function's condition: unreachable, unauthorized, unknown reference.
    fn resolve(
        &self,
        url: &str,
        reference: &str,
        access: &crate::git::Access,
    ) -> std::result::Result<String, String>;
}

/// The CA bundle ConfigMap `name` in `namespace` (the controller's `--ca-bundle-configmap`).
///
/// # Errors
/// The ConfigMap is missing, or the API request failed.
pub async fn ca_bundle_config_map(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<k8s_openapi::api::core::v1::ConfigMap> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    api.get_opt(name)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {namespace}/{name}")))?
        .ok_or_else(|| {
            Error::Missing(format!(
                "the CA bundle ConfigMap {namespace}/{name} does not exist"
            ))
        })
}

/// The CA certificates (PEM) of the CA bundle ConfigMap's key `ca.crt`: what build Jobs
/// trust besides the system roots, so the controller trusts them too when it resolves a git
/// reference.
///
/// # Errors
/// The ConfigMap is missing or has no `ca.crt`, or the API request failed.
pub async fn ca_bundle(client: &kube::Client, namespace: &str, name: &str) -> Result<Vec<u8>> {
    ca_bundle_config_map(client, namespace, name)
        .await?
        .data
        .and_then(|mut d| d.remove("ca.crt"))
        .map(String::into_bytes)
        .ok_or_else(|| {
            Error::Missing(format!(
                "the CA bundle ConfigMap {namespace}/{name} has no key \"ca.crt\""
            ))
        })
}

/// Reads a git auth Secret: `username` and `password` (`type: basic`), or, with `ssh_key`
/// (`type: key`), `key`, with `password` for an encrypted key and optional `knownHosts`.
/// Values lose one trailing newline, as `kiln build --git-auth-dir` reads them.
///
/// # Errors
/// The Secret is missing or lacks a key.
pub async fn git_auth(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
    ssh_key: bool,
) -> Result<crate::git::Auth> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let s = api
        .get_opt(secret)
        .await
        .map_err(Error::kube(format!("reading Secret {namespace}/{secret}")))?
        .ok_or_else(|| {
            Error::Missing(format!(
                "the git auth Secret {namespace}/{secret} does not exist"
            ))
        })?;
    let data = s.data.unwrap_or_default();
    let text = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let key = |k: &str| {
        text(k)
            .map(|v| crate::git::trim_newline(&v).to_string())
            .ok_or_else(|| {
                Error::Missing(format!(
                    "the git auth Secret {namespace}/{secret} has no key {k:?}"
                ))
            })
    };
    if ssh_key {
        return Ok(crate::git::Auth::Key(crate::git::SshKey {
            key: text("key").ok_or_else(|| {
                Error::Missing(format!(
                    "the git auth Secret {namespace}/{secret} has no key \"key\" (auth.type: \
                     key needs the private key there)"
                ))
            })?,
            passphrase: key("password").ok(),
            known_hosts: text("knownHosts").filter(|k| !k.trim().is_empty()),
        }));
    }
    Ok(crate::git::Auth::Basic(crate::git::Credentials {
        username: key("username")?,
        password: key("password")?,
    }))
}
