//! The git source flags of `kiln build` and their validation into a [`crate::git::Source`]
//! and [`crate::git::Access`]: URL, reference and base directory are checked and the
//! credentials and CA read here, before anything touches the network.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::git::{self, Access, Credentials, Source};

/// Git source flags.
#[derive(Debug, Args)]
pub struct GitArgs {
    /// Build the Function from a git repository (Kyma's gitRepository.url), fetched by kiln
    /// itself at depth 1: an https:// URL (http:// for local servers). kiln clones over
    /// HTTPS only: SSH URLs (git@host:repo, ssh://) are refused, since SSH would need the
    /// `ssh` program, which the builder image does not have.
    #[arg(long, value_name = "URL", conflicts_with_all = ["dir", "function"])]
    pub git: Option<String>,
    /// The branch, tag or full commit SHA to build [default: the remote's HEAD].
    #[arg(long, value_name = "REF", requires = "git")]
    pub git_ref: Option<String>,
    /// The Function's directory in the repository (Kyma's baseDir, e.g.
    /// /orders-service/function) [default: the repository's root].
    #[arg(long, value_name = "DIR", requires = "git")]
    pub git_base_dir: Option<String>,
    /// A directory holding the files `username` and `password` (a Kyma git auth Secret,
    /// mounted), sent as HTTP Basic credentials when the server asks for them.
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
}

impl GitArgs {
    /// The git source and how to reach it, when `--git` is given.
    ///
    /// # Errors
    /// Bad URL (SSH included), reference or base directory; unreadable credentials or CA.
    pub fn source(&self) -> anyhow::Result<Option<(Source, Access)>> {
        let Some(url) = &self.git else {
            return Ok(None);
        };
        let source = Source::parse(url, self.git_ref.as_deref(), self.git_base_dir.as_deref())?;
        if self.git_auth_dir.is_some() && !source.url.is_https() {
            // gix would refuse at the first 401; say so before anything is sent.
            anyhow::bail!(
                "--git-auth-dir needs an https:// URL: credentials are never sent in clear text to \
                    {}",
                source.url
            );
        }
        let credentials = self
            .git_auth_dir
            .as_deref()
            .map(Credentials::read_dir)
            .transpose()
            .context("reading --git-auth-dir")?;
        let extra_ca_pem = self
            .git_ca
            .as_ref()
            .map(|path| {
                std::fs::read(path).with_context(|| format!("reading --git-ca {}", path.display()))
            })
            .transpose()?;
        let access = Access {
            credentials,
            extra_ca_pem,
            timeout: git::DEFAULT_TIMEOUT,
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
