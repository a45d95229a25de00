//! Git sources, fetched by kiln itself (gix, pure Rust, over HTTP(S); over SSH through the
//! `ssh` program, see [`ssh`]): resolving a
//! reference to a commit without cloning (an ls-remote, for the controller), and fetching one
//! commit shallowly (depth 1) to write the tree at a base directory into a fresh directory,
//! entry by entry, never through a symlink. Credentials come only from [`Credentials`] or an
//! [`SshKey`] and never appear in errors or logs; no program but OpenSSH's `ssh`, configured
//! by kiln alone, is ever run (no credential helper, no user configuration).
//!
//! ```no_run
//! # fn demo() -> Result<(), kiln::git::Error> {
//! use kiln::git::{self, Access};
//! let url = "https://github.com/org/fns.git";
//! let commit = git::resolve_reference(url, "main", &Access::default())?;
//! # let _ = commit; Ok(()) }
//! ```

mod capped;
mod remote;
pub mod ssh;
mod tree;
mod url;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use ssh::SshKey;
pub use url::{BaseDir, Reference, RemoteUrl};

use crate::io_error::IoContext as _;

/// How long one network operation (connect, or a pause in a transfer) may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How much a fetch may receive by default: far above a Function's repository at depth 1,
/// and the bound on the pack a git server can write into the scratch directory (gix adds
/// its index of the pack, some 30 bytes per object).
pub const DEFAULT_MAX_FETCH: u64 = 2 << 30;

/// The most a reference listing may bring, held in memory (by the controller too, which
/// resolves every git Function's reference). With protocol v2 a server lists only the
/// references asked for; a v0 server lists all of them, some megabytes for repositories
/// with many thousands of branches, tags and pull requests.
pub const REFS_LIMIT: u64 = 64 << 20;

/// HTTP Basic credentials: the keys `username` and `password` of a Kyma git auth Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

impl Credentials {
    /// Reads the files `username` and `password` from `dir` (a mounted Secret: they may be
    /// symlinks into its `..data` directory). One trailing newline is dropped from each.
    ///
    /// # Errors
    /// [`Error::Credentials`] naming the file that is missing or unreadable.
    pub fn read_dir(dir: &Path) -> Result<Credentials, Error> {
        let read = |name: &str| {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(trim_newline(&text).to_string()),
                Err(source) => Err(Error::Credentials { path, source }),
            }
        };
        Ok(Credentials {
            username: read("username")?,
            password: read("password")?,
        })
    }
}

/// What a git auth directory (a mounted Kyma git auth Secret) holds: `username` and
/// `password` (`type: basic`), or `key`, with `password` for an encrypted key and optional
/// `knownHosts` (`type: key`, SSH).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// HTTP Basic credentials.
    Basic(Credentials),
    /// An SSH key.
    Key(SshKey),
}

impl Auth {
    /// Reads `dir`: an SSH key for an SSH URL (`ssh`), else Basic credentials. One trailing
    /// newline is dropped from each value but the key and the known hosts.
    ///
    /// # Errors
    /// [`Error::Credentials`] naming the file that is missing or unreadable.
    pub fn read_dir(dir: &Path, ssh: bool) -> Result<Auth, Error> {
        if !ssh {
            return Credentials::read_dir(dir).map(Auth::Basic);
        }
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| Error::Credentials { path, source })
        };
        let optional = |name: &str| match dir.join(name).exists() {
            true => read(name).map(Some),
            false => Ok(None),
        };
        Ok(Auth::Key(SshKey {
            key: read("key")?,
            passphrase: optional("password")?.map(|p| trim_newline(&p).to_string()),
            known_hosts: optional("knownHosts")?.filter(|k| !k.trim().is_empty()),
        }))
    }
}

/// `text` without one trailing newline (`\n` or `\r\n`), as a Secret file's value is read.
pub fn trim_newline(text: &str) -> &str {
    let text = text.strip_suffix('\n').unwrap_or(text);
    text.strip_suffix('\r').unwrap_or(text)
}

/// How to reach a git server.
#[derive(Clone, Debug)]
pub struct Access {
    /// Basic credentials, sent when the server asks for them (HTTP 401).
    pub credentials: Option<Credentials>,
    /// The SSH key, for `ssh://` and `host:path` URLs (which need one).
    pub ssh_key: Option<SshKey>,
    /// Extra CA certificates (PEM) trusted besides the system roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Time allowed to connect, and for any pause while waiting for or reading a response.
    pub timeout: Duration,
    /// The most a fetch may receive from the server (mostly the pack, which is written to
    /// disk as it arrives); past it, the fetch stops.
    pub max_fetch: u64,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            credentials: None,
            ssh_key: None,
            extra_ca_pem: None,
            timeout: DEFAULT_TIMEOUT,
            max_fetch: DEFAULT_MAX_FETCH,
        }
    }
}

/// A Function in a git repository: Kyma's `gitRepository{url, reference, baseDir}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The repository.
    pub url: RemoteUrl,
    /// What to build.
    pub reference: Reference,
    /// The Function's directory inside the repository.
    pub base_dir: BaseDir,
}

impl Source {
    /// Parses the three parts; nothing is fetched.
    ///
    /// # Errors
    /// [`Error::is_input_error`] errors: unsupported URLs, bad references,
    /// base directories that climb out of the repository.
    pub fn parse(
        url: &str,
        reference: Option<&str>,
        base_dir: Option<&str>,
    ) -> Result<Source, Error> {
        Ok(Source {
            url: RemoteUrl::parse(url)?,
            reference: Reference::parse(reference.unwrap_or(""))?,
            base_dir: BaseDir::parse(base_dir.unwrap_or(""))?,
        })
    }
}

/// A fetched source tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The commit built: 40 hex digits.
    pub commit: String,
    /// Regular files written.
    pub files: usize,
    /// Submodules skipped (kiln does not fetch them), by path.
    pub skipped_submodules: Vec<String>,
}

/// Resolves `reference` (a branch, a tag, `HEAD` or empty for the remote's HEAD, or a full
/// commit SHA) to the commit it names, with one handshake and ref listing: no objects are
/// fetched. Blocking: call it from a blocking thread.
///
/// A full 40-hex SHA is returned as is once the server answered (reachable, credentials
/// accepted): checking that the server has the commit would need a fetch; a clone of a commit
/// the server lacks fails with [`Error::UnknownCommit`].
///
/// # Errors
/// Invalid input, unreachable server, rejected credentials, unknown reference.
pub fn resolve_reference(url: &str, reference: &str, access: &Access) -> Result<String, Error> {
    let url = RemoteUrl::parse(url)?;
    let reference = Reference::parse(reference)?;
    let scratch = tempfile::tempdir().map_err(|source| {
        Error::Io(crate::io_error::IoError {
            action: "creating a scratch directory in",
            path: std::env::temp_dir(),
            source,
        })
    })?;
    let repo = remote::init_repo(scratch.path())?;
    let resolved = remote::resolve(&repo, &url, &reference, access)?;
    Ok(resolved.to_string())
}

/// Fetches the commit `source` names (depth 1) into a scratch repository under `scratch`, and
/// writes the tree at its base directory into `dest`, which must not exist yet: regular files
/// with their executable bit, symlinks as symlinks (whether they stay inside the Function is
/// for the caller's source walk to check), submodules skipped. Blocking.
///
/// # Errors
/// See [`Error`]; `dest` may be left half-written.
pub fn fetch_tree(
    source: &Source,
    access: &Access,
    scratch: &Path,
    dest: &Path,
) -> Result<Fetched, Error> {
    let repo_dir = tempfile::tempdir_in(scratch).at("creating a scratch directory in", scratch)?;
    let repo = remote::init_repo(repo_dir.path())?;
    let commit = remote::resolve(&repo, &source.url, &source.reference, access)?;
    remote::fetch_commit(&repo, &source.url, commit, access, &source.reference)?;
    tree::write_base_dir(&repo, &source.url, commit, &source.base_dir, dest)
}

/// Why a git source could not be resolved or fetched. URLs in messages carry no credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An SSH URL without a key.
    #[error(
        "{url} is an SSH URL: pass --git-auth-dir DIR holding the private key in a file `key` \
            (and `password` for an encrypted key, `knownHosts` to verify the host), as a Kyma \
            git auth Secret of type key has them"
    )]
    KeyRequired {
        /// The repository.
        url: String,
    },
    /// An SSH key for an HTTP(S) URL.
    #[error(
        "the git auth directory holds an SSH key (a file `key`), but {url} is not an SSH URL: \
            use the repository's ssh:// or git@host:path URL, or username and password files"
    )]
    KeyNeedsSsh {
        /// The repository.
        url: String,
    },
    /// No `ssh` program to connect with.
    #[error(
        "git over SSH needs the `ssh` program (Debian's openssh-client), and there is none on \
            PATH"
    )]
    NoSsh,
    /// The host's key was not the one `knownHosts` names.
    #[error(
        "the SSH host key of {url} is not one of the Secret's knownHosts{}: {said}",
        if *verified { "" } else { " (none were given)" }
    )]
    HostKeyMismatch {
        /// The repository.
        url: String,
        /// What OpenSSH said.
        said: String,
        /// Whether known hosts were given.
        verified: bool,
    },
    /// The server refused the key (or the passphrase did not open it).
    #[error(
        "{url} refused the SSH key: check the key (and password, for an encrypted key) in the \
            git auth Secret, and that the key may read the repository: {said}"
    )]
    KeyRejected {
        /// The repository.
        url: String,
        /// What OpenSSH said.
        said: String,
    },
    /// Connecting over SSH failed.
    #[error("cannot reach the SSH server of {url}: {said}")]
    SshUnreachable {
        /// The repository.
        url: String,
        /// What OpenSSH said.
        said: String,
    },
    /// A URL kiln does not clone from.
    #[error("unsupported git URL {url}: {problem}")]
    UnsupportedUrl {
        /// The URL as given, password masked.
        url: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A reference git would not accept.
    #[error("invalid git reference {reference:?}: {problem}")]
    InvalidReference {
        /// As given.
        reference: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A base directory outside the repository.
    #[error("invalid git base directory {base_dir:?}: {problem}")]
    InvalidBaseDir {
        /// As given.
        base_dir: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A credentials file is missing or unreadable.
    #[error(
        "reading {path}: the git auth directory must hold the files `username` and `password`, \
            or `key` (SSH)"
    )]
    Credentials {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The extra CA bundle holds no usable certificate.
    #[error("the git CA bundle holds no valid PEM certificate")]
    InvalidCa {
        /// The cause, when the PEM did not parse.
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The server sent more than the fetch may receive.
    #[error(
        "fetching from {url} received more than {limit} bytes, the limit (--git-max-size): \
         a Function's commit at depth 1 should not need that much; raise the limit if it does"
    )]
    TooLarge {
        /// The repository.
        url: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The server's reference listing was larger than kiln reads.
    #[error(
        "the git server of {url} sent more than {limit} bytes while listing its references, \
         the most kiln reads: the listing does not end, or the repository has far more \
         references than a Function's repository needs"
    )]
    RefsTooLarge {
        /// The repository.
        url: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// Connecting failed (DNS, refused, TLS, timeout).
    #[error("cannot reach the git server of {url}")]
    Unreachable {
        /// The repository.
        url: String,
        /// The cause.
        #[source]
        source: Box<gix::Error>,
    },
    /// The server asked for credentials and none were given.
    #[error(
        "{url} needs credentials (HTTP 401): pass --git-auth-dir DIR holding the files username \
            and password"
    )]
    CredentialsRequired {
        /// The repository.
        url: String,
    },
    /// The server redirected to another origin (scheme, host or port), which asked for
    /// credentials: they go only to the URL's own.
    #[error(
        "{url} redirected to {asked}, which asks for credentials (HTTP 401); kiln sends the \
            --git-auth-dir credentials only to the scheme, host and port of the Function's URL: \
            use the URL the server redirects to, if you trust it"
    )]
    CredentialsWithheld {
        /// The repository.
        url: String,
        /// Where the request went, redacted.
        asked: String,
    },
    /// The credentials were rejected (HTTP 401).
    #[error(
        "{url} rejected the credentials (HTTP 401): check the username and password files in \
            --git-auth-dir"
    )]
    Unauthorized {
        /// The repository.
        url: String,
    },
    /// Access was denied (HTTP 403).
    #[error(
        "{url} denied access (HTTP 403): check the username and password files in --git-auth-dir, \
            and that the user may read the repository"
    )]
    Forbidden {
        /// The repository.
        url: String,
    },
    /// No branch or tag of that name.
    #[error("{url} has no branch or tag named {reference:?}")]
    UnknownReference {
        /// The repository.
        url: String,
        /// The name asked for.
        reference: String,
    },
    /// The remote HEAD is unborn (an empty repository).
    #[error("{url} has no HEAD commit (an empty repository?): pass --git-ref")]
    NoHead {
        /// The repository.
        url: String,
    },
    /// The server did not send the commit asked for by SHA.
    #[error("{url} did not serve commit {commit}: is it in the repository?")]
    UnknownCommit {
        /// The repository.
        url: String,
        /// The SHA.
        commit: String,
        /// The cause.
        #[source]
        source: Box<gix::Error>,
    },
    /// The reference names something other than a commit.
    #[error("{reference} of {url} is not a commit but {kind}")]
    NotACommit {
        /// The repository.
        url: String,
        /// The reference.
        reference: String,
        /// What it is.
        kind: String,
    },
    /// The base directory does not exist at the commit.
    #[error("commit {commit} of {url} has no directory {base_dir}")]
    MissingBaseDir {
        /// The repository.
        url: String,
        /// The commit.
        commit: String,
        /// The directory.
        base_dir: String,
    },
    /// A tree entry kiln will not write.
    #[error("refusing {path} in commit {commit} of {url}: {problem}")]
    UnsafeEntry {
        /// The repository.
        url: String,
        /// The commit.
        commit: String,
        /// The entry's path inside the repository.
        path: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// Any other failure talking to the server.
    #[error("{action} {url}")]
    Remote {
        /// What was being done.
        action: &'static str,
        /// The repository.
        url: String,
        /// The cause.
        #[source]
        source: Box<gix::Error>,
    },
    /// The scratch repository or its objects.
    #[error("{action}")]
    Repository {
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: Box<gix::Error>,
    },
    /// Writing the tree or scratch space.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

impl Error {
    /// Whether the input is at fault (exit code 2): the URL, reference or base directory
    /// given, or the Function's tree at that commit, rather than the server or the network.
    pub fn is_input_error(&self) -> bool {
        matches!(
            self,
            Error::KeyRequired { .. }
                | Error::KeyNeedsSsh { .. }
                | Error::UnsupportedUrl { .. }
                | Error::InvalidReference { .. }
                | Error::InvalidBaseDir { .. }
                | Error::Credentials { .. }
                | Error::InvalidCa { .. }
                | Error::UnknownReference { .. }
                | Error::NoHead { .. }
                | Error::UnknownCommit { .. }
                | Error::NotACommit { .. }
                | Error::MissingBaseDir { .. }
                | Error::UnsafeEntry { .. }
        )
    }
}
