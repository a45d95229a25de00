//! Registry access flags shared by every command that talks to a registry, and the client
//! config they make (credentials, extra CAs, plain-HTTP hosts).

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;

use crate::registry::{ClientConfig, CredentialStore};

/// How to reach registries.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Registry credentials from a Kubernetes .dockerconfigjson file (tried before the docker
    /// config in $DOCKER_CONFIG or ~/.docker).
    #[arg(long, value_name = "FILE", env = "KILN_REGISTRY_AUTH")]
    pub registry_auth: Option<PathBuf>,
    /// Extra CA certificate (PEM) to trust for registries; repeatable.
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Vec<PathBuf>,
    /// Use plain HTTP for this registry host[:port]; repeatable (the environment variable
    /// takes a comma-separated list; empty means none).
    #[arg(
        long,
        value_name = "HOST[:PORT]",
        env = "KILN_INSECURE_REGISTRY",
        value_delimiter = ','
    )]
    pub insecure_registry: Vec<String>,
    /// Time allowed for one registry request (a transfer gets more in proportion to its size,
    /// and fails sooner when no byte moves for this long), in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=3600),
        env = "KILN_REGISTRY_TIMEOUT",
    )]
    pub registry_timeout: u64,
    /// How often a failed registry request is retried (503, 429, resets, timeouts; never
    /// 4xx answers), with capped exponential backoff and the registry's Retry-After.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(0..=20),
        env = "KILN_REGISTRY_RETRIES",
    )]
    pub registry_retries: u32,
}

impl RegistryArgs {
    /// The plain-HTTP registries: empty entries dropped (`KILN_INSECURE_REGISTRY` set to
    /// nothing, as an empty ConfigMap key gives it, means none).
    pub fn insecure_hosts(&self) -> Vec<String> {
        self.insecure_registry
            .iter()
            .filter(|h| !h.trim().is_empty())
            .cloned()
            .collect()
    }

    /// The client config: the flags plus the docker config directory and `PATH` (for
    /// credential helpers) from the environment.
    ///
    /// # Errors
    /// An unreadable CA file or a missing `--registry-auth` file.
    pub fn client_config(&self) -> anyhow::Result<ClientConfig> {
        let mut extra_ca_pem = Vec::new();
        for path in &self.registry_ca {
            let pem = std::fs::read(path)
                .with_context(|| format!("reading --registry-ca {}", path.display()))?;
            extra_ca_pem.push(pem);
        }
        if let Some(path) = &self.registry_auth
            && !path.is_file()
        {
            return Err(anyhow!(
                "--registry-auth {} does not exist: pass the path of a Docker config.json, or \
                    leave the flag out to use $DOCKER_CONFIG/config.json",
                path.display()
            ));
        }
        for host in &self.insecure_hosts() {
            if let Some((_, rest)) = host.split_once("://") {
                return Err(anyhow!(
                    "--insecure-registry {host:?} has a URL scheme; give HOST[:PORT] only, e.g. \
                        --insecure-registry {}",
                    rest.trim_end_matches('/'),
                ));
            }
            crate::registry::check_registry(host)
                .map_err(|problem| anyhow!("--insecure-registry {host:?}: {problem}"))?;
        }
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let docker_config = var("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".docker")));
        let path = var("PATH").unwrap_or_default();
        let credentials = CredentialStore::new(docker_config, self.registry_auth.clone(), path);
        Ok(ClientConfig {
            insecure_hosts: self.insecure_hosts(),
            extra_ca_pem,
            credentials,
            user_agent: format!("kiln/{}", env!("CARGO_PKG_VERSION")),
            request_timeout: std::time::Duration::from_secs(self.registry_timeout),
            retry: crate::registry::RetryPolicy {
                max_retries: self.registry_retries,
                ..crate::registry::RetryPolicy::default()
            },
            ..ClientConfig::default()
        })
    }
}
