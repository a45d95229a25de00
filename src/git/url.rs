//! What kiln accepts as a git source: an `https://` (or, for local servers, `http://`) URL
//! without credentials in it, a reference (branch, tag, full commit SHA or the remote's HEAD)
//! and a directory inside the repository. Everything is parsed here, before any network
//! access, so bad input is a usage error that names the flag.

use super::Error;

/// A repository URL kiln can clone: `https` or `http`, or SSH (`ssh://` or git's scp-like
/// `[user@]host:path`); no password, query or fragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteUrl {
    /// What gix connects to: the URL as given (scp-like paths stay relative to the SSH
    /// user's home, as git reads them), `git+ssh://` spelled `ssh://`.
    text: String,
    /// The same as a URL (scp-like as `ssh://user@host/path`), for the host and the name.
    url: url::Url,
}

impl RemoteUrl {
    /// Parses and checks `text`.
    ///
    /// # Errors
    /// [`Error::UnsupportedUrl`] for anything that is not a plain `http(s)://host/path` or SSH
    /// URL.
    pub fn parse(text: &str) -> Result<RemoteUrl, Error> {
        let shown = || shown_url(text);
        let unsupported = |problem: &'static str| Error::UnsupportedUrl {
            url: shown(),
            problem,
        };
        let (text, as_url) = match ssh_form(text) {
            Some(SshForm::Url(rest)) => (format!("ssh://{rest}"), format!("ssh://{rest}")),
            Some(SshForm::Scp { user_host, path }) => {
                if user_host.starts_with('-') || path.starts_with('-') {
                    return Err(unsupported("it could be mistaken for an ssh option"));
                }
                let slash = if path.starts_with('/') { "" } else { "/" };
                (text.to_string(), format!("ssh://{user_host}{slash}{path}"))
            }
            None => (text.to_string(), text.to_string()),
        };
        let url = url::Url::parse(&as_url).map_err(|_| unsupported("it is not a URL"))?;
        match url.scheme() {
            "https" | "http" => {
                if !url.username().is_empty() || url.password().is_some() {
                    return Err(unsupported(
                        "it carries credentials, which would show in the Job's arguments; put \
                            them in the username and password files of --git-auth-dir",
                    ));
                }
            }
            "ssh" => {
                let host = url.host_str().unwrap_or_default();
                if url.username().starts_with('-') || host.starts_with('-') {
                    return Err(unsupported("it could be mistaken for an ssh option"));
                }
                if url.password().is_some() {
                    return Err(unsupported(
                        "it carries a password; SSH sources authenticate with the key file of \
                            --git-auth-dir",
                    ));
                }
            }
            _ => {
                return Err(unsupported(
                    "kiln clones over https://, http:// and ssh:// only",
                ));
            }
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(unsupported("it names no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(unsupported("a query or fragment is not allowed"));
        }
        if url.path().trim_matches('/').is_empty() {
            return Err(unsupported("it names no repository path"));
        }
        Ok(RemoteUrl { text, url })
    }

    /// Whether the connection is encrypted HTTP (Basic credentials are only ever sent so).
    pub fn is_https(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// Whether the connection is SSH (authenticated with a key).
    pub fn is_ssh(&self) -> bool {
        self.url.scheme() == "ssh"
    }

    /// Who the credentials for this URL may go to: its scheme, host and port.
    pub fn origin(&self) -> Option<crate::origin::Origin> {
        crate::origin::Origin::of(&self.url)
    }

    /// The URL to connect to.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The repository's name: the last path segment without `.git`.
    pub fn repository_name(&self) -> String {
        let path = self.url.path().trim_end_matches('/');
        let last = path.rsplit('/').next().unwrap_or(path);
        last.strip_suffix(".git").unwrap_or(last).to_string()
    }
}

impl std::fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Parsing refused passwords and queries, so the URL holds nothing secret.
        f.write_str(&self.text)
    }
}

/// The two ways git spells an SSH remote.
enum SshForm<'a> {
    /// `ssh://`, `git+ssh://` or `ssh+git://`: what follows the scheme.
    Url(&'a str),
    /// `[user@]host:path`.
    Scp { user_host: &'a str, path: &'a str },
}

/// Whether `text` is an SSH remote, and in which form.
fn ssh_form(text: &str) -> Option<SshForm<'_>> {
    let lower = text.to_ascii_lowercase();
    for prefix in ["ssh://", "git+ssh://", "ssh+git://"] {
        if lower.starts_with(prefix) {
            return Some(SshForm::Url(&text[prefix.len()..]));
        }
    }
    // scp-like syntax: a colon before any slash, and no "://".
    match (text.find(':'), text.find('/')) {
        _ if text.contains("://") => None,
        // `transport::address` is git's remote-helper syntax, not SSH.
        (Some(colon), _) if text[colon + 1..].starts_with(':') => None,
        (Some(colon), slash) if colon > 0 && slash.is_none_or(|s| colon < s) => {
            Some(SshForm::Scp {
                user_host: &text[..colon],
                path: &text[colon + 1..],
            })
        }
        _ => None,
    }
}

/// `text` for an error message, without a password should it hold one.
fn shown_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(url) => crate::redact::redact_url(&url),
        // scp-like `user@host:path` holds no password; anything else unparsable is shown
        // only up to an `@`, which could follow one.
        Err(_) => match text.rfind('@') {
            Some(at) if text[..at].contains(':') => format!("***{}", &text[at..]),
            _ => text.to_string(),
        },
    }
}

/// What to fetch: the remote's HEAD, a branch or tag name, or a full commit SHA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reference {
    /// The remote's default branch.
    Head,
    /// A branch or tag (`main`, `v1.2.0`), or a full ref name (`refs/heads/main`).
    Name(String),
    /// A full 40-hex commit SHA, lower case.
    Commit(String),
}

impl Reference {
    /// Parses `--git-ref`: empty or `HEAD` is the remote's HEAD, 40 hex digits a commit.
    ///
    /// # Errors
    /// [`Error::InvalidReference`] for a name git would not accept.
    pub fn parse(text: &str) -> Result<Reference, Error> {
        let text = text.trim();
        if text.is_empty() || text == "HEAD" {
            return Ok(Reference::Head);
        }
        if text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Reference::Commit(text.to_ascii_lowercase()));
        }
        let bad = |problem: &'static str| Error::InvalidReference {
            reference: text.to_string(),
            problem,
        };
        if text.starts_with('-') || text.starts_with('/') || text.ends_with('/') {
            return Err(bad("it must not start with - or / or end with /"));
        }
        if text.contains("..") || text.contains("//") || text.contains("@{") {
            return Err(bad("it must not contain .., // or @{"));
        }
        if text
            .chars()
            .any(|c| c.is_control() || " ~^:?*[\\".contains(c))
        {
            return Err(bad(
                "it must not contain spaces, control characters or ~^:?*[\\",
            ));
        }
        if text.ends_with(".lock") || text.ends_with('.') {
            return Err(bad("it must not end with .lock or ."));
        }
        Ok(Reference::Name(text.to_string()))
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reference::Head => f.write_str("HEAD"),
            Reference::Name(name) | Reference::Commit(name) => f.write_str(name),
        }
    }
}

/// The Function's directory inside the repository (Kyma's `baseDir`): `/`-separated
/// components, none of them `..`; leading and trailing `/` are allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BaseDir {
    components: Vec<String>,
}

impl BaseDir {
    /// Parses `--git-base-dir`.
    ///
    /// # Errors
    /// [`Error::InvalidBaseDir`] for a `..` component or a control character.
    pub fn parse(text: &str) -> Result<BaseDir, Error> {
        let bad = |problem: &'static str| Error::InvalidBaseDir {
            base_dir: text.to_string(),
            problem,
        };
        if text.chars().any(char::is_control) {
            return Err(bad("it contains a control character"));
        }
        let mut components = Vec::new();
        for part in text.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(bad("it must stay inside the repository (no ..)")),
                name => components.push(name.to_string()),
            }
        }
        Ok(BaseDir { components })
    }

    /// The components, root first.
    pub fn components(&self) -> &[String] {
        &self.components
    }
}

impl std::fmt::Display for BaseDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.components.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_urls_in_every_spelling_are_ssh_and_keep_their_path() {
        for (given, connect, name) in [
            (
                "git@github.com:kyma-project/serverless.git",
                "git@github.com:kyma-project/serverless.git",
                "serverless",
            ),
            ("github.com:org/repo", "github.com:org/repo", "repo"),
            (
                "ssh://git@github.com/org/repo.git",
                "ssh://git@github.com/org/repo.git",
                "repo",
            ),
            ("SSH://host/repo", "ssh://host/repo", "repo"),
            (
                "git+ssh://host:2222/srv/repo",
                "ssh://host:2222/srv/repo",
                "repo",
            ),
        ] {
            let url = RemoteUrl::parse(given).unwrap();
            assert!(url.is_ssh() && !url.is_https(), "{given}");
            assert_eq!(
                (url.as_str(), url.repository_name().as_str()),
                (connect, name)
            );
        }
        for bad in [
            "ssh://git:hunter2@host/repo",
            "-oProxyCommand=x:repo",
            "host:-repo",
            "ssh://-oProxyCommand=x/repo",
            "ssh://-u@host/repo",
            "ssh://host",
        ] {
            let err = RemoteUrl::parse(bad).unwrap_err();
            assert!(matches!(err, Error::UnsupportedUrl { .. }), "{bad}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn only_plain_http_urls_without_credentials_are_accepted() {
        let url = RemoteUrl::parse("https://github.com/org/functions.git").unwrap();
        assert_eq!(url.repository_name(), "functions");
        RemoteUrl::parse("http://127.0.0.1:8080/repo").unwrap();
        for bad in [
            "file:///srv/repo.git",
            "git://host/repo",
            "ext::sh -c touch% /tmp/pwned",
            "https://host",
            "https://host/repo?token=abc",
            "/srv/repo",
        ] {
            assert!(
                matches!(RemoteUrl::parse(bad), Err(Error::UnsupportedUrl { .. })),
                "{bad}"
            );
        }
        let err = RemoteUrl::parse("https://user:hunter2@host/repo").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("--git-auth-dir"), "{err}");
    }

    #[test]
    fn references_are_head_names_or_commits() {
        assert_eq!(Reference::parse("").unwrap(), Reference::Head);
        assert_eq!(
            Reference::parse("release/1.x").unwrap(),
            Reference::Name("release/1.x".into())
        );
        let sha = "0CCC1416170EB61E75D23223298DF03A67A9BCE8";
        assert_eq!(
            Reference::parse(sha).unwrap(),
            Reference::Commit(sha.to_ascii_lowercase())
        );
        for bad in ["-x", "a..b", "a b", "x.lock", "a:b"] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn base_dirs_may_start_with_a_slash_but_never_climb_out() {
        let dir = BaseDir::parse("/orders-service/function/").unwrap();
        assert_eq!(dir.components(), ["orders-service", "function"]);
        assert_eq!(dir.to_string(), "/orders-service/function");
        assert!(BaseDir::parse("").unwrap().components().is_empty());
        assert!(BaseDir::parse("a/../../etc").is_err());
    }
}
