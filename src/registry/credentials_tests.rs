//! Tests for credential lookup: docker config directories, `.dockerconfigjson` files and
//! credential helpers (fake helper scripts in a temp directory, found through an explicit
//! search path so that no test mutates `PATH`).

use std::fs;
use std::os::unix::fs::PermissionsExt;

use base64::Engine as _;
use tempfile::TempDir;

use super::*;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn config_dir(json: &str) -> TempDir {
    let dir = TempDir::new().unwrap();
    fs::write(dir.path().join("config.json"), json).unwrap();
    dir
}

/// Writes `docker-credential-<name>`: a shell script that answers for `server` only.
fn helper(dir: &Path, name: &str, server: &str, username: &str, secret: &str) {
    let script = format!(
        "#!/bin/sh\nread -r server\n[ \"$1\" = get ] || exit 3\n\
         if [ \"$server\" = '{server}' ]; then\n\
         printf '{{\"ServerURL\":\"%s\",\"Username\":\"{username}\",\"Secret\":\"{secret}\"}}' \
             \"$server\"\n\
         else echo 'credentials not found in native keychain'; exit 1; fi\n"
    );
    write_script(dir, name, &script);
}

fn write_script(dir: &Path, name: &str, script: &str) {
    let path = dir.join(format!("docker-credential-{name}"));
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test]
async fn auths_entries_match_urls_hosts_and_ports() {
    let json = format!(
        r#"{{"auths": {{
            "https://index.docker.io/v1/": {{"auth": "{hub}"}},
            "reg.example": {{"username": "u2", "password": "p2"}},
            "http://LOCAL:5000/v2/": {{"auth": "{local}"}},
            "tok.example": {{"auth": "{tokauth}", "identitytoken": "refresh-1"}},
            "empty.example": {{}}
        }}}}"#,
        hub = b64("hubuser:hub:pass"),
        local = b64("lu:lp"),
        tokauth = b64("x:"),
    );
    let dir = config_dir(&json);
    let store = CredentialStore::default().with_docker_config_dir(dir.path().into());
    assert_eq!(
        store.lookup("docker.io").await.unwrap(),
        Some(Credential::basic("hubuser", "hub:pass"))
    );
    assert_eq!(
        store.lookup("reg.example").await.unwrap(),
        Some(Credential::basic("u2", "p2"))
    );
    assert_eq!(
        store.lookup("local:5000").await.unwrap(),
        Some(Credential::basic("lu", "lp"))
    );
    assert_eq!(store.lookup("local").await.unwrap(), None);
    assert_eq!(
        store.lookup("tok.example").await.unwrap(),
        Some(Credential::IdentityToken("refresh-1".into()))
    );
    assert_eq!(store.lookup("empty.example").await.unwrap(), None);
    assert_eq!(store.lookup("other.example").await.unwrap(), None);
}

#[tokio::test]
async fn a_missing_config_json_means_no_credentials_and_a_broken_one_is_an_error() {
    let empty = TempDir::new().unwrap();
    let store = CredentialStore::default().with_docker_config_dir(empty.path().into());
    assert_eq!(store.lookup("reg.example").await.unwrap(), None);

    let broken = config_dir("{not json");
    let store = CredentialStore::default().with_docker_config_dir(broken.path().into());
    let err = store.lookup("reg.example").await.unwrap_err();
    assert!(matches!(err, Error::CredentialsParse { .. }), "{err}");
    // A value of the wrong type is named by place, never quoted: serde's own message would
    // put the secret in the error.
    let secret = "dXNlcjpodW50ZXIy";
    for text in [
        format!(r#"{{"auths": {{"r.example": "{secret}"}}}}"#),
        format!(r#"{{"auths": {{"r.example": {{"auth": ["{secret}"]}}}}}}"#),
    ] {
        let wrong = config_dir(&text);
        let store = CredentialStore::default().with_docker_config_dir(wrong.path().into());
        let err = store.lookup("r.example").await.unwrap_err();
        let shown = format!("{:#}", anyhow::Error::new(err));
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("line 1, column"), "{shown}");
    }

    let bad_auth =
        config_dir(r#"{"auths": {"r.example": {"auth": "c2VjcmV0LXdpdGhvdXQtY29sb24="}}}"#);
    let store = CredentialStore::default().with_docker_config_dir(bad_auth.path().into());
    let text = store.lookup("r.example").await.unwrap_err().to_string();
    assert!(
        text.contains("r.example") && text.contains("user:password"),
        "{text}"
    );
    assert!(
        !text.contains("secret-without-colon") && !text.contains("c2VjcmV0"),
        "{text}"
    );
}

#[tokio::test]
async fn dockerconfigjson_secrets_are_read_and_come_before_the_config_dir() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join(".dockerconfigjson");
    fs::write(
        &file,
        format!(
            r#"{{"auths":{{"127.0.0.1:5000":{{"auth":"{}"}}}}}}"#,
            b64("k:v")
        ),
    )
    .unwrap();
    let config = config_dir(&format!(
        r#"{{"auths":{{"127.0.0.1:5000":{{"auth":"{}"}}}}}}"#,
        b64("d:d")
    ));
    let store = CredentialStore::new(Some(config.path().into()), Some(file), "".into());
    assert_eq!(
        store.lookup("127.0.0.1:5000").await.unwrap(),
        Some(Credential::basic("k", "v"))
    );
    let missing = CredentialStore::default().with_docker_config_json(dir.path().join("nope"));
    assert!(matches!(
        missing.lookup("x").await,
        Err(Error::CredentialsRead { .. })
    ));
}

#[tokio::test]
async fn helpers_are_found_through_a_path_style_search_list() {
    let bin = TempDir::new().unwrap();
    helper(bin.path(), "test", "reg.example", "pu", "ps");
    let config = config_dir(r#"{"credHelpers": {"reg.example": "test"}}"#);
    let search =
        std::env::join_paths(["/nonexistent-kiln-dir", bin.path().to_str().unwrap()]).unwrap();
    let store = CredentialStore::new(Some(config.path().into()), None, search);
    assert_eq!(
        store.lookup("reg.example").await.unwrap(),
        Some(Credential::basic("pu", "ps"))
    );
}

#[tokio::test]
async fn cred_helpers_win_over_creds_store_which_wins_over_auths() {
    let bin = TempDir::new().unwrap();
    helper(
        bin.path(),
        "test",
        "reg.example:5000",
        "helper-user",
        "helper-secret",
    );
    helper(
        bin.path(),
        "store",
        "https://index.docker.io/v1/",
        "<token>",
        "hub-refresh",
    );
    let json = format!(
        r#"{{"auths": {{"reg.example:5000": {{"auth": "{a}"}}, "plain.example": {{"auth": "{b}"}}}},
            "credHelpers": {{"reg.example:5000": "test"}}, "credsStore": "store"}}"#,
        a = b64("file-user:file-pass"),
        b = b64("pu:pp"),
    );
    let dir = config_dir(&json);
    let store = CredentialStore::default()
        .with_docker_config_dir(dir.path().into())
        .with_helper_dirs(vec![bin.path().to_path_buf()]);
    assert_eq!(
        store.lookup("reg.example:5000").await.unwrap(),
        Some(Credential::basic("helper-user", "helper-secret"))
    );
    assert_eq!(
        store.lookup("docker.io").await.unwrap(),
        Some(Credential::IdentityToken("hub-refresh".into()))
    );
    // The default store answers "credentials not found": the auths entry is used.
    assert_eq!(
        store.lookup("plain.example").await.unwrap(),
        Some(Credential::basic("pu", "pp"))
    );
    assert_eq!(store.lookup("nothing.example").await.unwrap(), None);
}

#[tokio::test]
async fn a_missing_default_store_is_skipped_but_a_missing_specific_helper_fails() {
    let bin = TempDir::new().unwrap();
    let json = format!(
        r#"{{"auths": {{"a.example": {{"auth": "{}"}}}}, "credsStore": "desktop",
            "credHelpers": {{"b.example": "gone"}}}}"#,
        b64("au:ap")
    );
    let dir = config_dir(&json);
    let store = CredentialStore::default()
        .with_docker_config_dir(dir.path().into())
        .with_helper_dirs(vec![bin.path().to_path_buf()]);
    assert_eq!(
        store.lookup("a.example").await.unwrap(),
        Some(Credential::basic("au", "ap"))
    );
    let err = store.lookup("b.example").await.unwrap_err();
    assert!(matches!(err, Error::CredentialHelper { .. }), "{err}");
    assert!(err.to_string().contains("docker-credential-gone"), "{err}");
}

#[tokio::test]
async fn a_failing_helper_is_an_error_that_names_it() {
    let bin = TempDir::new().unwrap();
    write_script(
        bin.path(),
        "broken",
        "#!/bin/sh\necho 'keychain locked' >&2\nexit 2\n",
    );
    write_script(bin.path(), "garbage", "#!/bin/sh\necho 'not json'\n");
    let dir = config_dir(r#"{"credHelpers": {"x.example": "broken", "y.example": "garbage"}}"#);
    let store = CredentialStore::default()
        .with_docker_config_dir(dir.path().into())
        .with_helper_dirs(vec![bin.path().to_path_buf()]);
    let err = store.lookup("x.example").await.unwrap_err().to_string();
    assert!(
        err.contains("docker-credential-broken") && err.contains("keychain locked"),
        "{err}"
    );
    let err = store.lookup("y.example").await.unwrap_err().to_string();
    assert!(err.contains("docker-credential-garbage"), "{err}");
    let bad_name = config_dir(r#"{"credHelpers": {"z.example": "../../bin/sh"}}"#);
    let store = CredentialStore::default().with_docker_config_dir(bad_name.path().into());
    assert!(store.lookup("z.example").await.is_err());
}

/// A helper that prints 2 MiB and exits: read up to 1 MiB, an error, no more held.
#[tokio::test]
async fn a_helper_that_prints_without_end_is_an_error() {
    let bin = TempDir::new().unwrap();
    write_script(
        bin.path(),
        "chatty",
        "#!/bin/sh\nhead -c 2097152 /dev/zero | tr '\\0' x\n",
    );
    let dir = config_dir(r#"{"credHelpers": {"x.example": "chatty"}}"#);
    let store = CredentialStore::default()
        .with_docker_config_dir(dir.path().into())
        .with_helper_dirs(vec![bin.path().to_path_buf()]);
    let err = store.lookup("x.example").await.unwrap_err().to_string();
    assert!(
        err.contains("docker-credential-chatty") && err.contains("over 1 MiB"),
        "{err}"
    );
}

#[tokio::test]
async fn explicit_credentials_come_first() {
    let dir = config_dir(&format!(
        r#"{{"auths": {{"r.example": {{"auth": "{}"}}}}}}"#,
        b64("f:f")
    ));
    let store = CredentialStore::default()
        .with_credential("r.example", Credential::basic("cli", "flag"))
        .with_docker_config_dir(dir.path().into());
    assert_eq!(
        store.lookup("r.example").await.unwrap(),
        Some(Credential::basic("cli", "flag"))
    );
}

#[test]
fn debug_output_never_shows_secrets() {
    let basic = format!("{:?}", Credential::basic("alice", "s3cret-pw"));
    assert!(
        basic.contains("alice") && !basic.contains("s3cret-pw"),
        "{basic}"
    );
    let token = format!("{:?}", Credential::IdentityToken("refresh-s3cret".into()));
    assert!(!token.contains("refresh-s3cret"), "{token}");
    let store =
        CredentialStore::default().with_credential("r", Credential::basic("bob", "hunter2"));
    assert!(!format!("{store:?}").contains("hunter2"));
}

#[test]
fn keys_normalise_to_host_and_port() {
    assert_eq!(
        normalize_key("https://index.docker.io/v1/"),
        "index.docker.io"
    );
    assert_eq!(
        normalize_key("http://Reg.Example:5000/v2/"),
        "reg.example:5000"
    );
    assert_eq!(normalize_key("reg.example"), "reg.example");
    assert_eq!(candidates("docker.io").len(), 3);
    assert_eq!(helper_server("docker.io"), DOCKER_HUB_CONFIG_KEY);
    assert_eq!(helper_server("127.0.0.1:5000"), "127.0.0.1:5000");
}
