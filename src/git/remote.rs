//! Talking to the git server with gix: a scratch bare repository with isolated configuration
//! (no system or user git config, no credential helpers, no prompts), one connection to list
//! references, one to fetch a single commit at depth 1. HTTP goes through gix's reqwest
//! backend, configured here with the system roots plus any extra CA and kiln's timeouts, and
//! held to a limit on what each connection may receive ([`super::capped`]).

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use gix::ObjectId;
use gix::credentials::{helper::Action, protocol::Outcome};
use gix::protocol::handshake::Ref;
use gix::protocol::transport::client::blocking_io::{Transport, http, ssh};
use gix::remote::{Direction, fetch::Shallow, fetch::Tags, ref_map};

use super::capped::{Budget, Capped};
use super::ssh::SshDir;
use super::{Access, Error, Reference, RemoteUrl};

type Connection<'a, 'repo> = gix::remote::Connection<'a, 'static, 'repo, Box<dyn Transport + Send>>;

/// Creates an empty bare repository in `dir` that reads no configuration but its own.
pub(super) fn init_repo(dir: &Path) -> Result<gix::Repository, Error> {
    let agent = format!("gitoxide.userAgent=kiln/{}", env!("CARGO_PKG_VERSION"));
    let open = gix::open::Options::isolated().config_overrides([agent]);
    let repo = gix::ThreadSafeRepository::init_opts(
        dir,
        gix::create::Kind::Bare,
        gix::create::Options::default(),
        open,
    )
    .map_err(|source| Error::Repository {
        action: "creating a scratch git repository",
        source: Box::new(source),
    })?;
    Ok(repo.to_thread_local())
}

/// The commit `reference` names on the remote (one handshake and ref listing).
pub(super) fn resolve(
    repo: &gix::Repository,
    url: &RemoteUrl,
    reference: &Reference,
    access: &Access,
) -> Result<ObjectId, Error> {
    let candidates: Vec<String> = match reference {
        Reference::Commit(sha) => {
            // Only the handshake: it proves the server answers and accepts the credentials.
            list_refs(repo, url, &["HEAD".into()], access)?;
            return ObjectId::from_hex(sha.as_bytes()).map_err(|_| Error::InvalidReference {
                reference: sha.clone(),
                problem: "not a SHA-1 object id",
            });
        }
        Reference::Head => vec!["HEAD".into()],
        Reference::Name(name) if name.starts_with("refs/") => vec![name.clone()],
        // A branch first, then a tag, as `git clone --branch` looks them up.
        Reference::Name(name) => vec![format!("refs/heads/{name}"), format!("refs/tags/{name}")],
    };
    let refs = list_refs(repo, url, &candidates, access)?;
    for wanted in &candidates {
        let Some(found) = refs.iter().find(|r| r.unpack().0 == wanted.as_bytes()) else {
            continue;
        };
        let (_, target, peeled) = found.unpack();
        // An annotated tag is peeled to the object it points to.
        return match peeled.or(target) {
            Some(id) => Ok(id.to_owned()),
            None => Err(Error::NoHead {
                url: url.to_string(),
            }),
        };
    }
    Err(match reference {
        Reference::Head => Error::NoHead {
            url: url.to_string(),
        },
        _ => Error::UnknownReference {
            url: url.to_string(),
            reference: reference.to_string(),
        },
    })
}

/// The remote's references matching `specs` (ls-refs, filtered by their prefixes).
fn list_refs(
    repo: &gix::Repository,
    url: &RemoteUrl,
    specs: &[String],
    access: &Access,
) -> Result<Vec<Ref>, Error> {
    let remote = repo
        .remote_at(url.as_str())
        .map_err(|e| remote_error(url, "configuring the remote", e))?
        .with_fetch_tags(Tags::None);
    let (connection, budget, withheld, ssh) = connect(&remote, url, access, super::REFS_LIMIT)?;
    let extra_refspecs = specs
        .iter()
        .map(|spec| {
            gix::refspec::parse(spec.as_str().into(), gix::refspec::parse::Operation::Fetch)
                .map(|s| s.to_owned())
                .map_err(|_| Error::InvalidReference {
                    reference: spec.clone(),
                    problem: "not a valid reference name",
                })
        })
        .collect::<Result<_, _>>()?;
    let options = ref_map::Options {
        extra_refspecs,
        ..ref_map::Options::default()
    };
    let (map, _handshake) = connection
        .ref_map(gix::progress::Discard, options)
        .map_err(
            |e| match budget.exceeded() || ssh.as_ref().is_some_and(SshDir::exceeded) {
                true => refs_too_large(url),
                false => match &ssh {
                    Some(dir) => ssh_error(dir, url, access, "listing the references of", e),
                    None => classify(url, access, &withheld, "listing the references of", e),
                },
            },
        )?;
    Ok(map.remote_refs)
}

/// Fetches `commit` and nothing of its history (depth 1) into `repo`, and checks that it is
/// a commit.
pub(super) fn fetch_commit(
    repo: &gix::Repository,
    url: &RemoteUrl,
    commit: ObjectId,
    access: &Access,
    reference: &Reference,
) -> Result<(), Error> {
    let hex = commit.to_hex().to_string();
    let remote = repo
        .remote_at(url.as_str())
        .map_err(|e| remote_error(url, "configuring the remote", e))?
        .with_fetch_tags(Tags::None)
        .with_refspecs([hex.as_str()], Direction::Fetch)
        .map_err(|e| remote_error(url, "configuring the remote", e))?;
    // The listing first, held in memory and to the listing's limit; then the pack. The
    // commit is wanted by its id, which gives gix no prefix to ask the server to list (it
    // would list every reference, pull requests and all): a prefix no reference has keeps
    // an honest server's listing empty.
    let nothing = gix::refspec::parse(
        "refs/kiln/none".into(),
        gix::refspec::parse::Operation::Fetch,
    )
    .map(|s| s.to_owned())
    .map_err(|e| remote_error(url, "configuring the remote", gix::Error::from_error(e)))?;
    let options = ref_map::Options {
        extra_refspecs: vec![nothing],
        ..ref_map::Options::default()
    };
    let (connection, budget, withheld, ssh) = connect(&remote, url, access, super::REFS_LIMIT)?;
    let fetched = match connection.prepare_fetch(gix::progress::Discard, options) {
        Err(_) if budget.exceeded() || ssh.as_ref().is_some_and(SshDir::exceeded) => {
            return Err(refs_too_large(url));
        }
        Err(e) => Err(e),
        Ok(prepare) => {
            budget.restart(access.max_fetch);
            if let Some(dir) = &ssh {
                dir.restart(access.max_fetch)?;
            }
            prepare
                .with_shallow(Shallow::DepthAtRemote(NonZeroU32::MIN))
                .receive(gix::progress::Discard, &AtomicBool::new(false))
        }
    };
    if budget.exceeded() || ssh.as_ref().is_some_and(SshDir::exceeded) {
        return Err(Error::TooLarge {
            url: url.to_string(),
            limit: access.max_fetch,
        });
    }
    if let Err(e) = fetched {
        let error = match &ssh {
            Some(dir) => ssh_error(dir, url, access, "fetching from", e),
            None => classify(url, access, &withheld, "fetching from", e),
        };
        return Err(match error {
            Error::Remote { source, .. } if matches!(reference, Reference::Commit(_)) => {
                Error::UnknownCommit {
                    url: url.to_string(),
                    commit: hex,
                    source,
                }
            }
            other => other,
        });
    }
    let object = repo.find_object(commit).map_err(|_| Error::UnknownCommit {
        url: url.to_string(),
        commit: hex.clone(),
        source: Box::new(gix::error::message("the server sent no such object").into()),
    })?;
    if object.kind != gix::object::Kind::Commit {
        return Err(Error::NotACommit {
            url: url.to_string(),
            reference: reference.to_string(),
            kind: format!("a {}", object.kind),
        });
    }
    Ok(())
}

fn refs_too_large(url: &RemoteUrl) -> Error {
    Error::RefsTooLarge {
        url: url.to_string(),
        limit: super::REFS_LIMIT,
    }
}

/// Where a redirect took the request that asked for credentials kiln kept back (redacted).
type Withheld = Arc<Mutex<Option<String>>>;

/// A connection to `remote` over gix's reqwest backend, configured by [`configure`], whose
/// responses may bring at most `limit` bytes; the budget tells whether a failure was the limit,
/// and what was withheld whether a 401 came from another origin. An SSH URL connects through
/// kiln's `ssh` (see [`super::ssh`]), held to `limit` by it; its directory comes back too, and
/// must live as long as the connection.
#[allow(clippy::type_complexity)]
fn connect<'a, 'repo>(
    remote: &'a gix::Remote<'repo>,
    url: &RemoteUrl,
    access: &Access,
    limit: u64,
) -> Result<(Connection<'a, 'repo>, Arc<Budget>, Withheld, Option<SshDir>), Error> {
    let (gix_url, version) = remote
        .sanitized_url_and_version(Direction::Fetch)
        .map_err(|e| classify(url, access, &Withheld::default(), "connecting to", e))?;
    let budget = Budget::new(limit);
    if url.is_ssh() {
        let key = access.ssh_key.as_ref().ok_or_else(|| Error::KeyRequired {
            url: url.to_string(),
        })?;
        let dir = SshDir::new(key, limit, access.timeout)?;
        let options = ssh::connect::Options {
            command: Some(dir.program().into()),
            disallow_shell: true,
            kind: Some(ssh::ProgramKind::Ssh),
        };
        let transport = ssh::connect(gix_url, version, options, false)
            .map_err(|e| remote_error(url, "connecting to", gix::Error::from_error(e)))?;
        let transport: Box<dyn Transport + Send> = Box::new(transport);
        let connection = remote.to_connection_with_transport(transport);
        return Ok((connection, budget, Withheld::default(), Some(dir)));
    }
    if access.ssh_key.is_some() {
        return Err(Error::KeyNeedsSsh {
            url: url.to_string(),
        });
    }
    let backend = Capped::new(http::reqwest::Remote::default(), Arc::clone(&budget));
    let transport: Box<dyn Transport + Send> =
        Box::new(http::Transport::new_http(backend, gix_url, version, false));
    let mut connection = remote.to_connection_with_transport(transport);
    let withheld = Withheld::default();
    configure(&mut connection, url, access, Arc::clone(&withheld))?;
    Ok((connection, budget, withheld, None))
}

/// An SSH connection's failure, by what OpenSSH said.
fn ssh_error(
    dir: &SshDir,
    url: &RemoteUrl,
    access: &Access,
    action: &'static str,
    e: gix::Error,
) -> Error {
    let verified = access
        .ssh_key
        .as_ref()
        .is_some_and(|k| k.known_hosts.is_some());
    let said = dir.said();
    super::ssh::classify(&said, &url.to_string(), verified)
        .unwrap_or_else(|| remote_error(url, action, e))
}

/// Sends only our credentials (never a helper's, never a prompt), and only to `url`'s origin
/// (a redirect to another host, port or scheme that asks for credentials gets none), and
/// sets up TLS and timeouts on the HTTP client.
fn configure(
    connection: &mut Connection<'_, '_>,
    url: &RemoteUrl,
    access: &Access,
    withheld: Withheld,
) -> Result<(), Error> {
    let credentials = access.credentials.clone();
    let origin = url.origin();
    connection.set_credentials(move |action| match action {
        Action::Get(context) => {
            let asked = asked_url(&context);
            let ours = matches!((&origin, &asked), (Some(o), Some(u)) if o.admits(u));
            if !ours && credentials.is_some() {
                let asked = asked.as_ref().map(crate::redact::redact_url);
                *withheld.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(asked.unwrap_or_else(|| "an unknown URL".into()));
            }
            Ok(credentials.as_ref().filter(|_| ours).map(|c| Outcome {
                identity: gix::sec::identity::Account {
                    username: c.username.clone(),
                    password: c.password.clone(),
                    oauth_refresh_token: None,
                },
                next: context.into(),
            }))
        }
        Action::Store(_) | Action::Erase(_) => Ok(None),
    });
    let certs = match &access.extra_ca_pem {
        None => Vec::new(),
        Some(pem) => {
            let certs =
                reqwest::Certificate::from_pem_bundle(pem).map_err(|source| Error::InvalidCa {
                    source: Some(source),
                })?;
            if certs.is_empty() {
                return Err(Error::InvalidCa { source: None });
            }
            certs
        }
    };
    let timeout = access.timeout;
    let configure_client = move |builder: reqwest::blocking::ClientBuilder| {
        Ok(builder
            .tls_certs_merge(certs.clone())
            .connect_timeout(timeout)
            .timeout(timeout))
    };
    let backend = http::reqwest::Options {
        configure_client: Some(Box::new(configure_client)),
        configure_request: None,
    };
    let options = http::Options {
        connect_timeout: Some(timeout),
        user_agent: Some(format!("kiln/{}", env!("CARGO_PKG_VERSION"))),
        backend: Some(Arc::new(Mutex::new(backend))),
        ..http::Options::default()
    };
    connection.set_transport_options(Box::new(options));
    Ok(())
}

/// The URL credentials are asked for: the context's `url`, else its protocol and host.
fn asked_url(context: &gix::credentials::protocol::Context) -> Option<url::Url> {
    let text = match (&context.url, &context.protocol, &context.host) {
        (Some(url), _, _) => url.to_string(),
        (None, Some(protocol), Some(host)) => format!("{protocol}://{host}/"),
        _ => return None,
    };
    url::Url::parse(&text).ok()
}

/// Maps gix's classified errors onto ours: credentials, permissions, reachability.
fn classify(
    url: &RemoteUrl,
    access: &Access,
    withheld: &Withheld,
    action: &'static str,
    e: gix::Error,
) -> Error {
    if e.is_unauthenticated() {
        if let Some(asked) = withheld.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Error::CredentialsWithheld {
                url: url.to_string(),
                asked,
            };
        }
        return match access.credentials {
            Some(_) => Error::Unauthorized {
                url: url.to_string(),
            },
            None => Error::CredentialsRequired {
                url: url.to_string(),
            },
        };
    }
    if e.is_permission_denied() {
        return Error::Forbidden {
            url: url.to_string(),
        };
    }
    let unreachable = e.iter_errors().any(|cause| {
        cause
            .downcast_ref::<reqwest::Error>()
            .is_some_and(|r| r.is_connect() || r.is_timeout())
    });
    if unreachable {
        return Error::Unreachable {
            url: url.to_string(),
            source: Box::new(e),
        };
    }
    remote_error(url, action, e)
}

fn remote_error(url: &RemoteUrl, action: &'static str, e: gix::Error) -> Error {
    Error::Remote {
        action,
        url: url.to_string(),
        source: Box::new(e),
    }
}
