//! The registry client against real registries that want credentials: Bearer token auth
//! (one token for a cross-repository mount's two scopes; a wrong password is not retried)
//! and Basic auth over TLS with the test CA.

use crate::common;

use super::{blob, config, pseudo_random, push_image, reference, test_image, uploaded};
use common::registry::{PASSWORD, Registry, RegistryKind, USER};
use kiln::registry::{
    BlobOutcome, Client, ClientConfig, Credential, CredentialStore, Error, Hint, Scope,
    TransportKind,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_cross_repository_mount_works_with_token_auth_using_one_token_with_both_scopes() {
    let reg = Registry::start(RegistryKind::Token);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default().with_docker_config_dir(reg.docker_config_dir());

    // The base image's layer lives in `base/node`.
    let base_client = Client::new(cfg.clone()).unwrap();
    let base = reference(&format!("{host}/base/node"));
    let (layer, src) = blob(&pseudo_random(80_000, 42));
    uploaded(
        base_client
            .push_blob(&base, &layer, src.clone(), None)
            .await
            .unwrap(),
    );
    let before = reg.token_requests().len();

    // A build pushing to `team/fn` authorizes once, with the mount source's pull scope.
    let client = Client::new(cfg.clone()).unwrap();
    let target = reference(&format!("{host}/team/fn:v1"));
    client
        .authorize(
            &target.registry,
            &[Scope::push(&target.repository), Scope::pull("base/node")],
        )
        .await
        .unwrap();
    let outcome = client
        .push_blob(&target, &layer, src.clone(), Some("base/node"))
        .await
        .unwrap();
    assert_eq!(outcome, BlobOutcome::Mounted);
    let image = test_image(7);
    let digest = push_image(&client, &target, &image).await;
    assert_eq!(
        client.get_manifest(&target, &[]).await.unwrap().digest,
        digest
    );

    let requests = reg.token_requests()[before..].to_vec();
    assert_eq!(
        requests.len(),
        1,
        "one token for the whole push: {requests:?}"
    );
    let scopes: Vec<&str> = requests[0].split(' ').collect();
    assert!(
        scopes.contains(&"repository:team/fn:pull,push"),
        "{requests:?}"
    );
    assert!(
        scopes.contains(&"repository:base/node:pull"),
        "{requests:?}"
    );

    // Without authorize: the mount request itself asks for both scopes in one token.
    let lazy = Client::new(cfg).unwrap();
    let second = reference(&format!("{host}/team/fn2"));
    let before = reg.token_requests().len();
    let outcome = lazy
        .push_blob(&second, &layer, src, Some("base/node"))
        .await
        .unwrap();
    assert_eq!(outcome, BlobOutcome::Mounted);
    let requests = reg.token_requests()[before..].to_vec();
    let last = requests.last().unwrap();
    assert!(
        last.contains("repository:team/fn2:pull,push")
            && last.contains("repository:base/node:pull"),
        "{requests:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn token_auth_with_a_wrong_password_is_unauthorized_without_retry() {
    let reg = Registry::start(RegistryKind::Token);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default()
        .with_credential(&host, Credential::basic(USER, "not-the-password"));
    let client = Client::new(cfg).unwrap();
    let err = client
        .authorize(&host, &[Scope::push("team/fn")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("not-the-password"));
    assert_eq!(
        reg.token_requests().len(),
        1,
        "no retry of a rejected credential"
    );

    // Anonymous: the token service refuses too, and the message says credentials are missing.
    let anonymous = Client::new(config(&[&host])).unwrap();
    let err = anonymous
        .head_manifest(&reference(&format!("{host}/team/fn:v1")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: false,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_over_tls_works_with_the_test_ca() {
    let reg = Registry::start(RegistryKind::BasicTls);
    let host = reg.host();
    let ca = std::fs::read(reg.ca_pem().unwrap()).unwrap();
    let cfg = ClientConfig {
        extra_ca_pem: vec![ca],
        credentials: CredentialStore::new(Some(reg.docker_config_dir()), None, "".into()),
        ..config(&[])
    };
    let client = Client::new(cfg.clone()).unwrap();
    let target = reference(&format!("{host}/team/secure:v1"));
    client
        .authorize(&host, &[Scope::push(&target.repository)])
        .await
        .unwrap();
    let image = test_image(11);
    let digest = push_image(&client, &target, &image).await;
    let got = client.get_manifest(&target, &[]).await.unwrap();
    assert_eq!(got.digest, digest);
    let dir = tempfile::tempdir().unwrap();
    client
        .get_blob_to_file(&target, &image.layer.0, &dir.path().join("l"))
        .await
        .unwrap();

    // No CA: the certificate is not trusted, and the error says what to do.
    let untrusting = Client::new(ClientConfig {
        extra_ca_pem: vec![],
        ..cfg.clone()
    })
    .unwrap();
    let err = untrusting.head_manifest(&target).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                kind: TransportKind::Tls,
                hint: Hint::RegistryCa,
                ..
            }
        ),
        "{err:?}"
    );

    // No credentials, or wrong ones: Unauthorized.
    let anonymous = Client::new(ClientConfig {
        credentials: CredentialStore::default(),
        ..cfg.clone()
    })
    .unwrap();
    let err = anonymous.head_manifest(&target).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: false,
                ..
            }
        ),
        "{err}"
    );
    let wrong = CredentialStore::default()
        .with_credential(&host, Credential::basic(USER, format!("{PASSWORD}x")));
    let wrong = Client::new(ClientConfig {
        credentials: wrong,
        ..cfg
    })
    .unwrap();
    let err = wrong
        .authorize(&host, &[Scope::pull(&target.repository)])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unauthorized {
                had_credentials: true,
                ..
            }
        ),
        "{err}"
    );
}

/// A registry whose `GET /v2/` (the question of how to authenticate to it) redirects to
/// another host, which answers with a challenge naming its own token service: that answer is
/// not the registry's, and the registry's credentials go nowhere near that service.
#[tokio::test(flavor = "multi_thread")]
async fn a_probe_redirected_to_another_host_does_not_take_its_challenge() {
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Answers each request with `answer(own host)`, recording its head.
    async fn serve(
        answer: impl Fn(&str) -> String + Send + 'static,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (seen, own) = (Arc::new(Mutex::new(Vec::new())), host.clone());
        let kept = seen.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s.write_all(answer(&own).as_bytes()).await;
            }
        });
        (host, seen)
    }
    fn reply(status: &str, headers: &str) -> String {
        format!("HTTP/1.1 {status}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n")
    }
    let (evil, evil_seen) = serve(|own| {
        let challenge = format!("Bearer realm=\"http://{own}/token\",service=\"e\"");
        reply(
            "401 Unauthorized",
            &format!("WWW-Authenticate: {challenge}\r\n"),
        )
    })
    .await;
    let to_evil = format!("Location: http://{evil}/v2/\r\n");
    let (host, _) = serve(move |_| reply("307 Temporary Redirect", &to_evil)).await;
    let mut cfg = config(&[&host]);
    cfg.credentials =
        CredentialStore::default().with_credential(&host, Credential::basic(USER, PASSWORD));
    let client = Client::new(cfg).unwrap();
    let err = client
        .authorize(&host, &[Scope::push("team/fn")])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RedirectRefused { .. }), "{err}");
    let seen = evil_seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the redirect was followed");
    for head in &seen {
        assert!(
            !head.to_ascii_lowercase().contains("authorization"),
            "{head}"
        );
        assert!(!head.contains("/token"), "{head}");
    }
}
