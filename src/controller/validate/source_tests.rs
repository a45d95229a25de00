//! Rules for the source: the dependency manifest per runtime, inline code, git.

use serde_json::{Value, json};

use super::Verdict;
use super::tests::{only_error, valid, verdict};

fn deps(runtime: &str, text: &str) -> Verdict {
    verdict(|f| {
        f["spec"]["runtime"] = json!(runtime);
        f["spec"]["source"]["inline"]["dependencies"] = json!(text);
    })
}

#[test]
fn node_dependencies_must_be_a_json_object_or_blank() {
    let field = "spec.source.inline.dependencies";
    only_error(
        &deps("nodejs22", "[]"),
        field,
        "package.json line 1: must be a JSON object",
    );
    only_error(
        &deps("nodejs24", "{\n\"a\": ,}"),
        field,
        "package.json line 2: invalid JSON",
    );
    only_error(
        &deps("nodejs22", "{\"dependencies\": []}"),
        field,
        "dependencies must be an object",
    );
    valid(&deps("nodejs22", ""));
    valid(&deps("nodejs22", "  \n"));
    valid(&deps("nodejs22", "{}"));
}

#[test]
fn python_requirements_must_parse() {
    let v = deps("python313", "requests==2.32\nthis is not valid\n");
    only_error(
        &v,
        "spec.source.inline.dependencies",
        "requirements.txt line 2",
    );
    valid(&deps("python313", "requests==2.32\n# comment\n"));
    valid(&deps("python312", ""));
}

#[test]
fn dependencies_that_bypass_the_package_registry_are_refused_at_admission() {
    let field = "spec.source.inline.dependencies";
    only_error(
        &deps(
            "python313",
            "requests==2.32\n--extra-index-url https://evil.example/simple\n",
        ),
        field,
        "requirements.txt line 2: \"--extra-index-url https://evil.example/simple\" adds a package \
            index",
    );
    only_error(
        &deps("nodejs22", "{\"dependencies\": {\"x\": \"github:evil/x\"}}"),
        field,
        "dependencies.x \"github:evil/x\" is a git, hosted or workspace dependency",
    );
    // Found in the wild: an override to a URL passed admission and the build alike.
    only_error(
        &deps(
            "nodejs22",
            r#"{"dependencies": {"ms": "2"}, "overrides": {"ms": "https://evil.example/ms.tgz"}}"#,
        ),
        field,
        "overrides.ms \"https://evil.example/ms.tgz\" is a git or URL dependency",
    );
}

#[test]
fn inline_source_must_not_be_blank_and_exactly_one_source_kind_is_set() {
    let v = verdict(|f| f["spec"]["source"]["inline"]["source"] = json!("  "));
    only_error(&v, "spec.source.inline.source", "is empty");
    let v = verdict(|f| f["spec"]["source"] = json!({}));
    only_error(&v, "spec.source", "exactly one of inline and gitRepository");
}

fn git(edit: impl FnOnce(&mut Value)) -> Verdict {
    verdict(|f| {
        let mut g = json!({"url": "https://github.com/kyma-project/examples.git",
                           "baseDir": "/orders", "reference": "main",
                           "auth": {"type": "basic", "secretName": "git-creds"}});
        edit(&mut g);
        f["spec"]["source"] = json!({"gitRepository": g});
    })
}

#[test]
fn git_sources_are_https_with_basic_auth_or_ssh_with_a_key() {
    valid(&git(|_| {}));
    let url = "spec.source.gitRepository.url";
    for ssh in [
        "git@github.com:org/repo.git",
        "ssh://git@github.com/org/repo.git",
    ] {
        valid(&git(|g| {
            g["url"] = json!(ssh);
            g["auth"]["type"] = json!("key");
        }));
        let msg = only_error(&git(|g| g["url"] = json!(ssh)), url, "is an SSH URL");
        assert!(msg.contains("auth.type: key"), "{msg}");
        let v = git(|g| {
            g["url"] = json!(ssh);
            g["auth"] = Value::Null;
        });
        only_error(&v, url, "is an SSH URL");
    }
    only_error(
        &git(|g| g["auth"]["type"] = json!("key")),
        url,
        "auth.type: key authenticates over SSH only",
    );
    only_error(
        &git(|g| g["url"] = json!("git://host/repo")),
        url,
        "kiln clones over https://, http:// and ssh:// only",
    );
    only_error(&git(|g| g["url"] = json!("not a url")), url, "is not a URL");
    only_error(
        &git(|g| g["auth"]["type"] = json!("token")),
        "spec.source.gitRepository.auth.type",
        "\"token\" is not supported",
    );
    only_error(
        &git(|g| g["auth"]["secretName"] = json!(" ")),
        "spec.source.gitRepository.auth.secretName",
        "blank",
    );
    only_error(
        &git(|g| g["baseDir"] = json!(" ")),
        "spec.source.gitRepository.baseDir",
        "blank",
    );
    only_error(
        &git(|g| g["baseDir"] = json!("../x")),
        "spec.source.gitRepository.baseDir",
        "'..'",
    );
    only_error(
        &git(|g| g["reference"] = json!("")),
        "spec.source.gitRepository.reference",
        "blank",
    );
}

#[test]
fn git_urls_the_build_would_refuse_are_refused_here() {
    let url = "spec.source.gitRepository.url";
    for (bad, why) in [
        ("https://user:token@host/repo.git", "it carries credentials"),
        (
            "https://host/repo.git?x=1",
            "a query or fragment is not allowed",
        ),
        (
            "https://host/repo.git#main",
            "a query or fragment is not allowed",
        ),
        ("https://host/", "it names no repository path"),
    ] {
        let msg = only_error(&git(|g| g["url"] = json!(bad)), url, why);
        assert!(!msg.contains("token"), "no password in the message: {msg}");
    }
    only_error(
        &git(|g| g["url"] = json!("http://host/repo.git")),
        url,
        "only over https://",
    );
    valid(&git(|g| {
        g["url"] = json!("http://host/repo.git");
        g.as_object_mut().unwrap().remove("auth");
    }));
}
