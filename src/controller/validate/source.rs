//! `spec.source`: exactly one kind; inline code present and its dependency manifest
//! well-formed for the runtime (package.json a JSON object, blank allowed; requirements.txt
//! parses); a git repository reachable the way kiln clones: over HTTP(S), anonymous or with
//! Basic credentials, or over SSH with a key (`auth.type: key`).

use std::path::{Component, Path};

use super::{Verdict, dns1123_subdomain};
use crate::controller::crd::{GitRepositorySource, InlineSource, Source};
use crate::runtime::{Language, RuntimeSpec, check_registry_only, validate_manifest};

pub(super) fn check(source: &Source, runtime: Option<&RuntimeSpec>, verdict: &mut Verdict) {
    match (&source.inline, &source.git_repository) {
        (Some(inline), None) => check_inline(inline, runtime, verdict),
        (None, Some(git)) => check_git(git, verdict),
        _ => verdict.error(
            "spec.source",
            "needs exactly one of inline and gitRepository",
        ),
    }
}

fn check_inline(inline: &InlineSource, runtime: Option<&RuntimeSpec>, verdict: &mut Verdict) {
    if inline.source.trim().is_empty() {
        verdict.error(
            "spec.source.inline.source",
            "is empty; put the handler's code here",
        );
    }
    let (Some(runtime), Some(deps)) = (runtime, inline.dependencies.as_deref()) else {
        return;
    };
    // Kyma turned an empty Node.js dependency list into `{}`; an empty requirements.txt is
    // simply empty.
    if deps.trim().is_empty() {
        return;
    }
    let file = runtime.dependencies.manifest.as_str();
    if let Err(e) = validate_manifest(runtime.language, file, deps) {
        let hint = match runtime.language {
            Language::Nodejs => {
                "give a package.json object such as {\"dependencies\": {…}}, or leave it empty"
            }
            Language::Python => {
                "give one requirement per line (NAME, NAME==VERSION, …), or leave it empty"
            }
        };
        verdict.error("spec.source.inline.dependencies", format!("{e}; {hint}"));
    } else if let Err(e) = check_registry_only(runtime.language, file, deps) {
        // Build Jobs do not pass --allow-direct-deps: say so at admission, not in a failed Job.
        verdict.error("spec.source.inline.dependencies", e.to_string());
    }
}

fn check_git(git: &GitRepositorySource, verdict: &mut Verdict) {
    check_url(git, verdict);
    if let Some(auth) = &git.auth {
        match auth.type_.as_str() {
            "basic" | "key" => {}
            other => verdict.error(
                "spec.source.gitRepository.auth.type",
                format!(
                    "{other:?} is not supported; use basic (username and password over https://) \
                     or key (an SSH key over ssh://)"
                ),
            ),
        }
        let name = auth.secret_name.trim();
        if name.is_empty() {
            verdict.error(
                "spec.source.gitRepository.auth.secretName",
                "is blank; name the Secret holding username and password (basic) or key (SSH)",
            );
        } else if let Err(e) = dns1123_subdomain(name) {
            verdict.error(
                "spec.source.gitRepository.auth.secretName",
                format!("{name:?} is not a valid Secret name ({e})"),
            );
        }
    }
    if git.base_dir.trim().is_empty() {
        verdict.error(
            "spec.source.gitRepository.baseDir",
            "is blank; give the Function's directory in the repository (/ for its root)",
        );
    } else if Path::new(&git.base_dir)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        verdict.error(
            "spec.source.gitRepository.baseDir",
            format!(
                "{:?} must stay inside the repository: remove '..'",
                git.base_dir
            ),
        );
    }
    if git.reference.trim().is_empty() {
        verdict.error(
            "spec.source.gitRepository.reference",
            "is blank; give a branch, tag or commit",
        );
    }
}

fn check_url(git: &GitRepositorySource, verdict: &mut Verdict) {
    const FIELD: &str = "spec.source.gitRepository.url";
    let raw = git.url.trim();
    let auth_type = git.auth.as_ref().map(|a| a.type_.as_str());
    // The build's own rule first: what it would refuse is refused here, before a build is
    // scheduled.
    let remote = match crate::git::RemoteUrl::parse(raw) {
        Ok(remote) => remote,
        Err(e) => {
            let hint = match url::Url::parse(raw) {
                Err(_) => "; use https://HOST/PATH or an SSH URL (git@HOST:PATH)",
                Ok(_) => "",
            };
            verdict.error(FIELD, format!("{e}{hint}"));
            return;
        }
    };
    if remote.is_ssh() {
        if auth_type != Some("key") {
            verdict.error(
                FIELD,
                format!(
                    "{raw:?} is an SSH URL, which needs auth.type: key with a Secret holding the \
                     private key (key; password for an encrypted key; knownHosts to verify the \
                     host); or use the repository's https:// URL"
                ),
            );
        }
        return;
    }
    if auth_type == Some("key") {
        verdict.error(
            FIELD,
            format!(
                "{raw:?} is not an SSH URL, and auth.type: key authenticates over SSH only; use \
                 the repository's ssh:// or git@HOST:PATH URL, or auth.type: basic"
            ),
        );
    }
    if !remote.is_https() && git.auth.is_some() {
        verdict.error(
            FIELD,
            format!(
                "{raw:?} is plain http://, and the build sends the credentials of \
                 auth.secretName only over https://; use the https:// URL"
            ),
        );
    }
}
