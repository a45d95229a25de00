//! Where registry credentials come from: explicit ones (`--registry-auth`), a docker config
//! directory (`config.json` with `auths`, `credHelpers` and `credsStore`) and Kubernetes
//! `.dockerconfigjson` secrets (the same `auths` shape). A [`Credential`] never prints its
//! secret.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;
use tracing::warn;

use super::credential::Credential;
use super::error::{Error, Result};
use super::helper;
use super::reference::DOCKER_HUB;

/// The key Docker uses for Docker Hub in config files and credential helpers.
pub const DOCKER_HUB_CONFIG_KEY: &str = "https://index.docker.io/v1/";
const DOCKER_HUB_ALIASES: [&str; 3] = ["index.docker.io", "docker.io", "registry-1.docker.io"];

/// Credential sources, asked in the order they were added; the first that knows the registry
/// wins. Files are read when a registry first asks for credentials (asynchronously), so
/// building a store never fails. The default store is empty: anonymous access everywhere.
#[derive(Clone, Debug, Default)]
pub struct CredentialStore {
    sources: Vec<Source>,
    helper_dirs: Vec<PathBuf>,
}

#[derive(Clone, Debug)]
enum Source {
    Explicit {
        registry: String,
        credential: Credential,
    },
    /// A `DOCKER_CONFIG` directory; its `config.json` may be absent.
    ConfigDir(PathBuf),
    /// A `.dockerconfigjson` file, which must exist.
    ConfigJson(PathBuf),
}

/// A parsed docker config or `.dockerconfigjson` file.
#[derive(Clone, Debug)]
struct ConfigFile {
    auths: Vec<(String, Credential)>,
    cred_helpers: Vec<(String, String)>,
    creds_store: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    auths: BTreeMap<String, RawAuth>,
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default)]
    creds_store: Option<String>,
}

#[derive(Deserialize)]
struct RawAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

impl CredentialStore {
    /// The usual store: a `.dockerconfigjson` file (`--registry-auth`, a mounted
    /// `kubernetes.io/dockerconfigjson` secret) first, then the docker config directory
    /// (`$DOCKER_CONFIG` or `~/.docker`), with credential helpers searched in `search_path`
    /// (a `PATH`-style list; empty means the process's own `PATH`).
    pub fn new(
        docker_config_dir: Option<PathBuf>,
        docker_config_json: Option<PathBuf>,
        search_path: OsString,
    ) -> CredentialStore {
        let mut store = CredentialStore::default();
        if let Some(file) = docker_config_json {
            store = store.with_docker_config_json(file);
        }
        if let Some(dir) = docker_config_dir {
            store = store.with_docker_config_dir(dir);
        }
        store.with_helper_dirs(std::env::split_paths(&search_path).collect())
    }

    /// Adds an explicit credential for `registry` (`host[:port]`, or `docker.io`).
    pub fn with_credential(mut self, registry: &str, credential: Credential) -> CredentialStore {
        self.sources.push(Source::Explicit {
            registry: registry.to_string(),
            credential,
        });
        self
    }

    /// Adds a docker config directory: its `config.json` is used when it exists.
    pub fn with_docker_config_dir(mut self, dir: PathBuf) -> CredentialStore {
        self.sources.push(Source::ConfigDir(dir));
        self
    }

    /// Adds a Kubernetes `.dockerconfigjson` file (it must exist when it is read).
    pub fn with_docker_config_json(mut self, file: PathBuf) -> CredentialStore {
        self.sources.push(Source::ConfigJson(file));
        self
    }

    /// Directories searched for `docker-credential-<name>` helpers. When empty (the default),
    /// helpers are found through the process's `PATH`.
    pub fn with_helper_dirs(mut self, dirs: Vec<PathBuf>) -> CredentialStore {
        self.helper_dirs = dirs
            .into_iter()
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        self
    }

    /// The credential for `registry` (as named in references: `host[:port]` or `docker.io`),
    /// or `None` for anonymous access. Precedence within a config file is Docker's:
    /// `credHelpers[registry]`, then `credsStore`, then `auths`.
    ///
    /// # Errors
    /// [`Error::CredentialHelper`] when a helper fails for a reason other than "credentials
    /// not found".
    pub async fn lookup(&self, registry: &str) -> Result<Option<Credential>> {
        let names = candidates(registry);
        for source in &self.sources {
            match source {
                Source::Explicit {
                    registry: r,
                    credential,
                } => {
                    if names.contains(&normalize_key(r)) {
                        return Ok(Some(credential.clone()));
                    }
                }
                Source::ConfigDir(dir) => {
                    let Some(config) = read_config(&dir.join("config.json"), true).await? else {
                        continue;
                    };
                    if let Some(found) = self.lookup_config(&config, registry, &names).await? {
                        return Ok(Some(found));
                    }
                }
                Source::ConfigJson(file) => {
                    let Some(config) = read_config(file, false).await? else {
                        continue;
                    };
                    if let Some(found) = self.lookup_config(&config, registry, &names).await? {
                        return Ok(Some(found));
                    }
                }
            }
        }
        Ok(None)
    }

    async fn lookup_config(
        &self,
        config: &ConfigFile,
        registry: &str,
        names: &[String],
    ) -> Result<Option<Credential>> {
        let specific = names.iter().find_map(|n| {
            config
                .cred_helpers
                .iter()
                .find(|(k, _)| normalize_key(k) == *n)
                .map(|(_, h)| h)
        });
        let helper = specific
            .or(config.creds_store.as_ref())
            .filter(|h| !h.is_empty());
        if let Some(helper) = helper {
            let server = helper_server(registry);
            match helper::get(helper, &server, &self.helper_dirs).await {
                Ok(Some(c)) => return Ok(Some(c)),
                Ok(None) => {}
                // A default store that is not installed (a desktop config copied into CI) is
                // skipped, as the `auths` entries may still hold what is needed.
                Err(f) if f.missing && specific.is_none() => {
                    warn!(
                        helper = %helper,
                        registry,
                        "credential store helper not installed; skipping",
                    );
                }
                Err(f) => {
                    return Err(Error::CredentialHelper {
                        helper: helper.clone(),
                        registry: registry.to_string(),
                        problem: f.problem,
                    });
                }
            }
        }
        let found = names.iter().find_map(|n| {
            config
                .auths
                .iter()
                .find(|(k, _)| normalize_key(k) == *n)
                .map(|(_, c)| c.clone())
        });
        Ok(found)
    }
}

/// Reads and parses a config file; `None` when it is absent and `optional`.
async fn read_config(path: &Path, optional: bool) -> Result<Option<ConfigFile>> {
    match tokio::fs::read(path).await {
        Ok(text) => parse_config(path, &text).map(Some),
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::CredentialsRead {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_config(path: &Path, text: &[u8]) -> Result<ConfigFile> {
    let raw: RawConfig = serde_json::from_slice(text).map_err(|e| Error::CredentialsParse {
        path: path.to_path_buf(),
        // Where, and what kind of fault; not serde's message, which quotes the value it
        // choked on (a base64 `auth`, a password).
        line: e.line(),
        column: e.column(),
        kind: match e.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "JSON of the wrong shape",
            serde_json::error::Category::Eof => "cut short",
        },
    })?;
    let mut auths = Vec::new();
    for (key, entry) in raw.auths {
        let bad = |problem| Error::CredentialsEntry {
            path: path.to_path_buf(),
            key: key.clone(),
            problem,
        };
        if let Some(token) = entry.identitytoken.filter(|t| !t.is_empty()) {
            auths.push((key, Credential::IdentityToken(token)));
        } else if let Some(auth) = entry.auth.filter(|a| !a.is_empty()) {
            let engine = base64::engine::general_purpose::STANDARD;
            let decoded = engine
                .decode(auth.trim())
                .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(auth.trim()))
                .map_err(|_| bad("`auth` is not valid base64"))?;
            let text = String::from_utf8(decoded).map_err(|_| bad("`auth` is not UTF-8"))?;
            let (user, pass) = text
                .split_once(':')
                .ok_or_else(|| bad("`auth` is not user:password"))?;
            auths.push((key, Credential::basic(user, pass)));
        } else if let (Some(user), Some(pass)) = (entry.username, entry.password) {
            auths.push((key, Credential::basic(user, pass)));
        }
    }
    Ok(ConfigFile {
        auths,
        cred_helpers: raw.cred_helpers.into_iter().collect(),
        creds_store: raw.creds_store,
    })
}

/// `https://host/v1/`, `host`, `HOST:port` → `host[:port]` in lowercase.
fn normalize_key(key: &str) -> String {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key).to_ascii_lowercase()
}

/// The normalised names a registry may be stored under.
fn candidates(registry: &str) -> Vec<String> {
    let norm = normalize_key(registry);
    if norm == DOCKER_HUB || DOCKER_HUB_ALIASES.contains(&norm.as_str()) {
        DOCKER_HUB_ALIASES.iter().map(|s| s.to_string()).collect()
    } else {
        vec![norm]
    }
}

/// The server name handed to a credential helper (what `docker login` stored).
fn helper_server(registry: &str) -> String {
    if candidates(registry).len() > 1 {
        DOCKER_HUB_CONFIG_KEY.to_string()
    } else {
        registry.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "credentials_tests.rs"]
mod tests;
