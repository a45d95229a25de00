//! Watches: kube's watcher sees creates, updates and deletes and relists after a 410; raw
//! watches get bookmarks and a 410 for a compacted resource version.

use crate::common;

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde_json::json;

use super::{cm, event_name, next};
use common::kube_api::KubeApi;

#[tokio::test]
async fn kubes_watcher_sees_creates_updates_and_deletes_and_relists_after_410() {
    let api = KubeApi::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client_from_kubeconfig().await);
    let pp = PostParams::default();
    cms.create(&pp, &cm("before", json!({"w": "1"}), json!({})))
        .await
        .unwrap();
    let config = watcher::Config::default().labels("w=1");
    let mut events = watcher(cms.clone(), config).boxed();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(event_name(&next(&mut events).await.unwrap()));
    }
    assert_eq!(seen, ["init", "init-apply before", "init-done"]);

    cms.create(&pp, &cm("other", json!({"w": "2"}), json!({})))
        .await
        .unwrap();
    cms.create(&pp, &cm("new", json!({"w": "1"}), json!({})))
        .await
        .unwrap();
    let data = json!({"data": {"k": "v"}});
    cms.patch("new", &PatchParams::default(), &Patch::Merge(&data))
        .await
        .unwrap();
    // Relabelled out of the selection: the watch reports it deleted, as kube-apiserver does.
    let relabel = json!({"metadata": {"labels": {"w": "3"}}});
    cms.patch("before", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    cms.delete("new", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(event_name(&next(&mut events).await.unwrap()));
    }
    assert_eq!(
        seen,
        [
            "apply new Some({})",
            "apply new Some({\"k\": \"v\"})",
            "delete before",
            "delete new",
        ]
    );

    // The history moves on: the open watch ends with 410 Gone and the watcher lists again.
    cms.create(&pp, &cm("after", json!({"w": "1"}), json!({})))
        .await
        .unwrap();
    assert_eq!(
        event_name(&next(&mut events).await.unwrap()),
        "apply after Some({})"
    );
    api.reset_requests();
    api.expire_watches();
    let gone = next(&mut events).await.unwrap_err();
    assert!(
        gone.to_string().contains("410") || format!("{gone:?}").contains("410"),
        "{gone:?}"
    );
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(event_name(&next(&mut events).await.unwrap()));
    }
    assert_eq!(seen, ["init", "init-apply after", "init-done"]);
    let relists = api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && !r.watch)
        .count();
    assert_eq!(relists, 1, "{:?}", api.requests());
}

#[tokio::test]
async fn raw_watches_get_bookmarks_and_410_for_a_compacted_resource_version() {
    let api = KubeApi::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let created = cms
        .create(&PostParams::default(), &cm("a", json!({}), json!({})))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let params = WatchParams::default().timeout(2);
    let mut stream = cms.watch(&params, &rv).await.unwrap().boxed();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let deleted = next(&mut stream).await.unwrap();
    assert!(matches!(&deleted, WatchEvent::Deleted(o) if o.metadata.name.as_deref() == Some("a")));
    let WatchEvent::Bookmark(bookmark) = next(&mut stream).await.unwrap() else {
        panic!("expected a bookmark");
    };
    let current = api.resource_version().to_string();
    assert_eq!(bookmark.metadata.resource_version, current);
    // timeoutSeconds=2 ends the stream (bookmarks come every 0.5 s until then).
    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(5), stream.collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(
        rest.iter()
            .all(|e| matches!(e, Ok(WatchEvent::Bookmark(_)))),
        "{rest:?}"
    );

    api.compact();
    let mut stream = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await.unwrap() {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    assert!(
        next_opt(&mut stream).await.is_none(),
        "the stream ends after the error"
    );
}

async fn next_opt<S: futures_util::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("within 5 s")
}
