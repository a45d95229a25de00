//! kube's runtime against the server: injected faults fail the next matching requests, a
//! `Controller` reconciles and settles without writes, and a written kubeconfig serves a
//! streaming list-watch from a plain (non-async) test.

use crate::common;

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::json;

use super::{cm, event_name, next};
use common::kube_api::KubeApi;
use common::kube_client::code_reason;

#[test]
fn injected_faults_fail_the_next_matching_requests_and_are_logged() {
    let api = KubeApi::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    api.block_on(cms.create(&PostParams::default(), &cm("f", json!({}), json!({}))))
        .unwrap();
    api.fail_next(2, "PUT", "/configmaps/f", 409);
    api.fail_next(1, "*", "/configmaps", 500);
    let current = api.block_on(cms.get("f")).unwrap_err();
    assert_eq!(code_reason(current), (500, "InternalError".into()));
    let current = api.block_on(cms.get("f")).unwrap();
    for _ in 0..2 {
        let err = api
            .block_on(cms.replace("f", &PostParams::default(), &current))
            .unwrap_err();
        assert_eq!(code_reason(err), (409, "Conflict".into()));
    }
    api.block_on(cms.replace("f", &PostParams::default(), &current))
        .unwrap();
    let changed: Vec<bool> = api.requests().iter().map(|r| r.changed).collect();
    // Only the create changed anything: the last PUT sent the object as it was.
    assert_eq!(changed, [true, false, false, false, false, false]);
    let log: Vec<String> = api.requests().iter().map(ToString::to_string).collect();
    assert_eq!(
        log,
        [
            "POST /api/v1/namespaces/default/configmaps -> 201",
            "GET /api/v1/namespaces/default/configmaps/f -> 500 (injected)",
            "GET /api/v1/namespaces/default/configmaps/f -> 200",
            "PUT /api/v1/namespaces/default/configmaps/f -> 409 (injected)",
            "PUT /api/v1/namespaces/default/configmaps/f -> 409 (injected)",
            "PUT /api/v1/namespaces/default/configmaps/f -> 200",
        ]
    );
}

/// What the test controller shares with its reconciler.
struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    reconciles: std::sync::atomic::AtomicUsize,
}

/// A tiny controller: every ConfigMap gets an owned Secret `<name>-copy` with its data,
/// written with server-side apply, and an Event says so.
async fn copy_to_secret(
    cm: std::sync::Arc<ConfigMap>,
    ctx: std::sync::Arc<Ctx>,
) -> Result<Action, kube::Error> {
    use kube::{Resource, ResourceExt};
    ctx.reconciles
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap());
    let name = format!("{}-copy", cm.name_any());
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "ownerReferences": [cm.controller_owner_ref(&()).unwrap()] },
        "stringData": cm.data.clone().unwrap_or_default(),
    });
    secrets
        .patch(
            &name,
            &PatchParams::apply("copier").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    let event = RecorderEvent {
        type_: EventType::Normal,
        reason: "Copied".into(),
        note: Some(format!("copied into {name}")),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.recorder.publish(&event, &cm.object_ref(&())).await?;
    Ok(Action::await_change())
}

/// Waits up to 10 s: a loaded 2-core machine took over 2 s to see one apply.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_runtime_controller_reconciles_against_the_server_and_settles_without_writes() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    let api = KubeApi::start();
    let client = api.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(
        &PostParams::default(),
        &cm("src", json!({"copy": "yes"}), json!({"k": "v"})),
    )
    .await
    .unwrap();
    let reporter = Reporter {
        controller: "copier".into(),
        instance: None,
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        reconciles: 0.into(),
    });
    // Only its own ConfigMaps: every namespace also has the cluster's kube-root-ca.crt.
    let controller = Controller::new(cms.clone(), watcher::Config::default().labels("copy=yes"))
        .owns(
            Api::<Secret>::default_namespaced(client.clone()),
            watcher::Config::default(),
        )
        .run(
            copy_to_secret,
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            Arc::clone(&ctx),
        )
        .for_each(|_| async {});
    let running = tokio::spawn(controller);

    eventually("the Secret exists", || {
        api.get("Secret", "default", "src-copy").is_some()
    })
    .await;
    let secret = api.get("Secret", "default", "src-copy").unwrap();
    assert_eq!(
        secret["data"],
        json!({"k": "dg=="}),
        "stringData is stored as data"
    );
    assert_eq!(secret["metadata"]["ownerReferences"][0]["name"], "src");

    // The Secret is owned: deleting it wakes the controller, which puts it back.
    api.delete("Secret", "default", "src-copy");
    eventually("the Secret is back", || {
        api.get("Secret", "default", "src-copy").is_some()
    })
    .await;

    // The Secret's re-creation is itself a watch event of an owned object: the reconcile it
    // wakes must be over before the writes are counted. Settled: no reconcile for 500 ms.
    let mut last = (
        ctx.reconciles.load(Ordering::SeqCst),
        std::time::Instant::now(),
    );
    eventually("the controller settled", || {
        let now = ctx.reconciles.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, std::time::Instant::now());
        }
        last.1.elapsed() >= Duration::from_millis(500)
    })
    .await;

    // A change to the ConfigMap that leaves the Secret as it is: one reconcile, one apply,
    // and that apply changes nothing.
    let before = ctx.reconciles.load(Ordering::SeqCst);
    let secret_rv =
        api.get("Secret", "default", "src-copy").unwrap()["metadata"]["resourceVersion"].clone();
    api.reset_requests();
    let note = json!({"metadata": {"annotations": {"note": "x"}}});
    cms.patch("src", &PatchParams::default(), &Patch::Merge(&note))
        .await
        .unwrap();
    eventually("the controller reconciled", || {
        ctx.reconciles.load(Ordering::SeqCst) > before
    })
    .await;
    let secret_writes = || {
        api.writes()
            .into_iter()
            .filter(|w| w.path.contains("/secrets/"))
    };
    // At least one: a second one (which must not come) then shows in the assertion below,
    // with every write, rather than as a time-out.
    eventually("the apply was sent", || secret_writes().count() >= 1).await;
    let applies: Vec<_> = api
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/secrets/"))
        .collect();
    assert_eq!(applies.len(), 1, "{:?}", api.writes());
    assert!(
        !applies[0].changed,
        "a steady-state apply is a no-op: {}",
        applies[0]
    );
    assert_eq!(
        api.get("Secret", "default", "src-copy").unwrap()["metadata"]["resourceVersion"],
        secret_rv
    );

    // The Events kube's Recorder published: created once, then patched as a series.
    eventually("the event series is patched", || {
        api.writes().iter().any(|w| {
            w.method == "PATCH"
                && w.path
                    .contains("/apis/events.k8s.io/v1/namespaces/default/events/")
        })
    })
    .await;
    let events = api.list("Event.events.k8s.io");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "Copied");
    assert_eq!(events[0]["regarding"]["name"], "src");
    assert!(
        events[0]["series"]["count"].as_i64().unwrap() >= 2,
        "{}",
        events[0]
    );
    running.abort();
}

#[test]
fn a_written_kubeconfig_and_a_streaming_list_watcher_work_from_a_plain_test() {
    let api = KubeApi::start();
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "seed", "namespace": "default", "labels": {"seeded": "yes"}}}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig(&path);
    let seen = api.block_on(async {
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .unwrap();
        assert_eq!(config.cluster_url.to_string(), format!("{}/", api.url()));
        let cms: Api<ConfigMap> = Api::default_namespaced(kube::Client::try_from(config).unwrap());
        let config = watcher::Config::default()
            .labels("seeded=yes")
            .streaming_lists();
        let mut events = watcher(cms, config).boxed();
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(event_name(&next(&mut events).await.unwrap()));
        }
        seen
    });
    assert_eq!(seen, ["init", "init-apply seed", "init-done"]);
    let watch = api.requests().into_iter().find(|r| r.watch).unwrap();
    assert!(watch.has_query("sendInitialEvents", "true"), "{watch}");
}
