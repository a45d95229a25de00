//! What the registry client logs: at debug level every request, never credentials, tokens
//! or upload state.

use crate::common;

use std::sync::Arc;

use super::{config, push_image, reference, test_image};
use common::registry::{PASSWORD, Registry, RegistryKind, USER};
use kiln::registry::{Client, CredentialStore};

/// A `tracing` writer that keeps everything in memory.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn debug_logs_show_requests_but_never_credentials_tokens_or_upload_state() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // tracing caches each callsite's interest globally; while only one dispatcher is
    // registered, a callsite first hit by another test's thread asks that thread's (empty)
    // default and is cached as "never". An idle second dispatcher makes it ask all of them.
    let _idle = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _guard = tracing::subscriber::set_default(subscriber);

    let reg = Registry::start(RegistryKind::Token);
    let host = reg.host();
    let mut cfg = config(&[&host]);
    cfg.credentials = CredentialStore::default().with_docker_config_dir(reg.docker_config_dir());
    let client = Client::new(cfg).unwrap();
    let target = reference(&format!("{host}/team/logged:v1"));
    push_image(&client, &target, &test_image(21)).await;

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("registry request") && logs.contains("status=201"),
        "{logs}"
    );
    assert!(logs.contains("_state=REDACTED"), "{logs}");
    let basic = common::base64(format!("{USER}:{PASSWORD}").as_bytes());
    for secret in [PASSWORD, basic.as_str(), "eyJ", "Bearer ", "Basic "] {
        assert!(
            !logs.contains(secret),
            "{secret:?} leaked into the logs:\n{logs}"
        );
    }
}
