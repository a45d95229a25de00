//! The git source flags of `kiln build` and their validation into a [`crate::git::Source`]
//! and [`crate::git::Access`]: URL, reference and base directory are checked and the
//! credentials and CA read here, before anything touches the network.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::git::{self, Access, Auth, Source};

/// Git source flags.
#[derive(Debug, Args)]
pub struct GitArgs {
    /// Build the Function from a git repository (Kyma's gitRepository.url), fetched by kiln
    /// itself at depth 1: an https:// URL (http:// for local servers), or an SSH URL
    /// (ssh://[user@]host[:port]/path or git@host:path) with a key in --git-auth-dir, run
    /// through OpenSSH's `ssh` with kiln's own configuration only.
    #[arg(long, value_name = "URL", conflicts_with_all = ["dir", "function"])]
    pub git: Option<String>,
    /// The branch, tag or full commit SHA to build [default: the remote's HEAD].
    #[arg(long, value_name = "REF", requires = "git")]
    pub git_ref: Option<String>,
    /// The Function's directory in the repository (Kyma's baseDir, e.g.
    /// /orders-service/function) [default: the repository's root].
    #[arg(long, value_name = "DIR", requires = "git")]
    pub git_base_dir: Option<String>,
    /// A directory holding a Kyma git auth Secret, mounted: the files `username` and
    /// `password`, sent as HTTP Basic credentials when the server asks for them; or, for an
    /// SSH URL, `key` (the private key), `password` (its passphrase, if it is encrypted) and
    /// `knownHosts` (the host keys to accept; without it any host key is accepted, with a
    /// warning).
    #[arg(long, value_name = "DIR", requires = "git")]
    pub git_auth_dir: Option<PathBuf>,
    /// A CA bundle (PEM) trusted for the git server in addition to the system's roots.
    #[arg(long, value_name = "FILE", requires = "git")]
    pub git_ca: Option<PathBuf>,
    /// The most the fetch may receive from the git server (mostly the commit's objects,
    /// written as they arrive): past it the build stops, so a server cannot fill the disk
    /// [default: 2GiB].
    #[arg(long, value_name = "SIZE", requires = "git", value_parser = super::run::parse_size)]
    pub git_max_size: Option<u64>,
    /// Seconds allowed to connect to the git server, and for any pause in its answer, before
    /// the fetch stops; over SSH a connection may also last at most ten times this in all, so
    /// a server that trickles cannot hold a build [default: 60].
    #[arg(long, value_name = "SECONDS", requires = "git",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub git_timeout: Option<u64>,
}

impl GitArgs {
    /// The git source and how to reach it, when `--git` is given.
    ///
    /// # Errors
    /// Bad URL, reference or base directory; unreadable credentials or CA; an SSH URL without
    /// a key, or a key for an HTTP URL.
    pub fn source(&self) -> anyhow::Result<Option<(Source, Access)>> {
        let Some(url) = &self.git else {
            return Ok(None);
        };
        let source = Source::parse(url, self.git_ref.as_deref(), self.git_base_dir.as_deref())?;
        let ssh = source.url.is_ssh();
        if let Some(dir) = &self.git_auth_dir
            && !ssh
            && dir.join("key").exists()
            && !dir.join("username").exists()
        {
            return Err(git::Error::KeyNeedsSsh {
                url: source.url.to_string(),
            }
            .into());
        }
        let auth = self
            .git_auth_dir
            .as_deref()
            .map(|dir| Auth::read_dir(dir, ssh))
            .transpose()
            .context("reading --git-auth-dir")?;
        let (credentials, ssh_key) = match auth {
            None => (None, None),
            Some(Auth::Basic(c)) => (Some(c), None),
            Some(Auth::Key(k)) => (None, Some(k)),
        };
        if source.url.is_ssh() {
            match &ssh_key {
                None => {
                    return Err(git::Error::KeyRequired {
                        url: source.url.to_string(),
                    }
                    .into());
                }
                Some(key) if key.known_hosts.is_none() => tracing::warn!(
                    url = %source.url,
                    "the SSH host key will not be verified: the git auth directory has no \
                        knownHosts file"
                ),
                Some(_) => {}
            }
        } else if credentials.is_some() && !source.url.is_https() {
            // gix would refuse at the first 401; say so before anything is sent.
            anyhow::bail!(
                "--git-auth-dir needs an https:// URL: credentials are never sent in clear text to \
                    {}",
                source.url
            );
        }
        let extra_ca_pem = self
            .git_ca
            .as_ref()
            .map(|path| {
                std::fs::read(path).with_context(|| format!("reading --git-ca {}", path.display()))
            })
            .transpose()?;
        let access = Access {
            credentials,
            ssh_key,
            extra_ca_pem,
            timeout: self
                .git_timeout
                .map_or(git::DEFAULT_TIMEOUT, std::time::Duration::from_secs),
            max_fetch: self.git_max_size.unwrap_or(git::DEFAULT_MAX_FETCH),
        };
        Ok(Some((source, access)))
    }

    /// The default `FUNC_NAME`: the base directory's last component, else the repository's
    /// name.
    pub fn default_name(source: &Source) -> String {
        source
            .base_dir
            .components()
            .last()
            .cloned()
            .unwrap_or_else(|| source.url.repository_name())
    }
}
