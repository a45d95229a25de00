//! Proves the fake Kubernetes API server of the test harness (`tests/common/kube_api`) with
//! kube's own typed clients and runtime, the way the controller will use it.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams, WatchEvent, WatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::{Value, json};

use common::kube_api::KubeApi;

fn cm(name: &str, labels: Value, data: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "labels": labels }, "data": data,
    }))
    .unwrap()
}

fn names<K: kube::Resource>(list: impl IntoIterator<Item = K>) -> Vec<String> {
    list.into_iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect()
}

/// The `Status` of a failed call: (code, reason, message, causes as (field, message)).
fn status(err: kube::Error) -> (u16, String, String, Vec<(String, String)>) {
    match err {
        kube::Error::Api(s) => {
            let causes = s
                .details
                .map(|d| d.causes.into_iter().map(|c| (c.field, c.message)).collect())
                .unwrap_or_default();
            (s.code, s.reason, s.message, causes)
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn data_of(cm: &ConfigMap) -> Vec<(&str, &str)> {
    let data = cm.data.as_ref().unwrap();
    data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The `fieldsV1` of a field manager's entry in `managedFields`.
fn fields_of(cm: &ConfigMap, manager: &str) -> Option<Value> {
    let entries = cm.metadata.managed_fields.as_ref()?;
    let entry = entries
        .iter()
        .find(|e| e.manager.as_deref() == Some(manager))?;
    Some(serde_json::to_value(entry.fields_v1.as_ref()?).unwrap())
}

fn code_reason(err: kube::Error) -> (u16, String) {
    let (code, reason, _, _) = status(err);
    (code, reason)
}

fn function_api(client: kube::Client) -> (Api<DynamicObject>, ApiResource) {
    let gvk = GroupVersionKind::gvk("serverless.kyma-project.io", "v1alpha2", "Function");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "functions");
    (Api::namespaced_with(client, "default", &ar), ar)
}

/// A Kyma Function as users write it.
fn kyma_function(name: &str) -> Value {
    json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2",
        "kind": "Function",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "runtime": "nodejs22",
            "source": { "inline": {
                "source": "module.exports = { main: function (event, context) { return 'hi' } }",
                "dependencies": "{ \"name\": \"hello\", \"version\": \"1.0.0\" }",
            }},
            "env": [{ "name": "GREETING", "value": "hi" }],
            "resourceConfiguration": {
                "function": { "profile": "S" },
                "build": { "profile": "normal" },
            },
            "scaleConfig": { "minReplicas": 1, "maxReplicas": 3 },
            "labels": { "team": "a" },
        },
    })
}

#[tokio::test]
async fn objects_are_created_read_and_listed_by_label_and_field_selectors() {
    let api = KubeApi::start();
    let client = api.client();
    let default: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    let pp = PostParams::default();
    // As on a real server, a namespace must exist before anything is created in it.
    let refused = other
        .create(&pp, &cm("a", json!({"app": "web"}), json!({})))
        .await
        .unwrap_err();
    assert_eq!(
        status(refused).2,
        "namespaces \"other\" not found",
        "the NamespaceLifecycle admission"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap();
    namespaces.create(&pp, &ns).await.unwrap();
    let a = default
        .create(&pp, &cm("a", json!({"app": "web", "tier": "x"}), json!({})))
        .await
        .unwrap();
    default
        .create(&pp, &cm("b", json!({"app": "db", "tier": "y"}), json!({})))
        .await
        .unwrap();
    default
        .create(&pp, &cm("c", json!({"tier": "z"}), json!({})))
        .await
        .unwrap();
    other
        .create(&pp, &cm("a", json!({"app": "web"}), json!({})))
        .await
        .unwrap();

    assert_eq!(a.metadata.generation, Some(1));
    assert_eq!(a.metadata.uid.as_ref().unwrap().len(), 36);
    assert!(a.metadata.creation_timestamp.is_some());
    let got = default.get("a").await.unwrap();
    assert_eq!(got.metadata.resource_version, a.metadata.resource_version);

    let select = |api: Api<ConfigMap>, s: &'static str| async move {
        names(api.list(&ListParams::default().labels(s)).await.unwrap())
    };
    assert_eq!(select(default.clone(), "app=web").await, ["a"]);
    assert_eq!(select(default.clone(), "app==db").await, ["b"]);
    // Every namespace also holds the cluster CA's ConfigMap, without labels.
    let root_ca = "kube-root-ca.crt";
    assert_eq!(
        select(default.clone(), "app!=web").await,
        ["b", "c", root_ca]
    );
    assert_eq!(select(default.clone(), "tier in (x, z)").await, ["a", "c"]);
    assert_eq!(
        select(default.clone(), "tier notin (x)").await,
        ["b", "c", root_ca]
    );
    assert_eq!(select(default.clone(), "app").await, ["a", "b"]);
    assert_eq!(select(default.clone(), "!app").await, ["c", root_ca]);
    assert_eq!(select(default.clone(), "app,tier in (y)").await, ["b"]);
    let all: Api<ConfigMap> = Api::all(client.clone());
    let everywhere = all
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(everywhere.items.len(), 2);
    assert!(everywhere.metadata.resource_version.is_some());
    let by_field = all
        .list(&ListParams::default().fields("metadata.namespace=other"))
        .await;
    assert_eq!(names(by_field.unwrap()), ["a", root_ca]);
    let by_name = default
        .list(&ListParams::default().fields("metadata.name!=a"))
        .await;
    assert_eq!(names(by_name.unwrap()), ["b", "c", root_ca]);

    let bad = default
        .list(&ListParams::default().labels("app in x"))
        .await
        .unwrap_err();
    assert_eq!(status(bad).0, 400);
    let dup = default
        .create(&pp, &cm("a", json!({}), json!({})))
        .await
        .unwrap_err();
    assert_eq!(code_reason(dup), (409, "AlreadyExists".into()));
    let (code, reason, message, _) = status(default.get("nope").await.unwrap_err());
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (404, "NotFound", "configmaps \"nope\" not found")
    );
    assert_eq!(default.get_opt("nope").await.unwrap(), None);

    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).unwrap();
    let generated = default.create(&pp, &generated).await.unwrap();
    let name = generated.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let unknown = client
        .request::<Value>(
            axum::http::Request::get("/apis/example.com/v1/widgets")
                .body(vec![])
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(code_reason(unknown), (404, "NotFound".into()));
    let invalid = default
        .create(&pp, &cm("Not_A_Name", json!({}), json!({})))
        .await
        .unwrap_err();
    assert_eq!(status(invalid).0, 422);
    let long = "v".repeat(64);
    let bad_label = cm("l", json!({"ok": long, "bad key": "v"}), json!({}));
    let (code, _, _, causes) = status(default.create(&pp, &bad_label).await.unwrap_err());
    let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        (code, fields),
        (422, vec!["metadata.labels[bad key]", "metadata.labels[ok]"])
    );
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_is_a_conflict_and_patches_apply() {
    let api = KubeApi::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let pp = PostParams::default();
    let first = cms
        .create(&pp, &cm("x", json!({}), json!({"a": "1"})))
        .await
        .unwrap();
    let mut second = first.clone();
    second.data = Some([("a".to_string(), "2".to_string())].into());
    let second = cms.replace("x", &pp, &second).await.unwrap();
    assert_ne!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let stale = cms.replace("x", &pp, &first).await.unwrap_err();
    assert_eq!(code_reason(stale), (409, "Conflict".into()));

    let merge = json!({"data": {"a": null, "b": "3"}, "metadata": {"labels": {"l": "v"}}});
    let merged = cms
        .patch("x", &PatchParams::default(), &Patch::Merge(&merge))
        .await
        .unwrap();
    assert_eq!(
        merged.data.unwrap(),
        [("b".to_string(), "3".to_string())].into()
    );
    let stale_merge = json!({"metadata": {"resourceVersion": first.metadata.resource_version}});
    let err = cms
        .patch("x", &PatchParams::default(), &Patch::Merge(&stale_merge))
        .await
        .unwrap_err();
    assert_eq!(code_reason(err).0, 409);

    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/b", "value": "3"},
        {"op": "add", "path": "/data/c", "value": "4"},
    ]))
    .unwrap();
    let patched = cms
        .patch("x", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["c"], "4");
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "nope"}]))
            .unwrap();
    let err = cms
        .patch("x", &PatchParams::default(), &Patch::Json::<()>(failing))
        .await
        .unwrap_err();
    assert_eq!(code_reason(err).0, 422);
    // A strategic merge patch is applied as a merge patch.
    let strategic = json!({"data": {"d": "5"}});
    let patched = cms
        .patch("x", &PatchParams::default(), &Patch::Strategic(&strategic))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap().len(), 3);
    assert_eq!(
        code_reason(
            cms.patch("nope", &PatchParams::default(), &Patch::Merge(&merge))
                .await
                .unwrap_err()
        )
        .0,
        404
    );
}

#[tokio::test]
async fn apply_removes_what_the_manager_dropped_and_keeps_other_managers_fields() {
    let api = KubeApi::start();
    let cms: Api<ConfigMap> = Api::default_namespaced(api.client());
    let apply = |manager: &'static str, data: Value| {
        let cms = cms.clone();
        async move {
            let obj = json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "data": data,
            });
            cms.patch(
                "s",
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&obj),
            )
            .await
        }
    };
    let created = apply("ctrl", json!({"a": "1", "b": "2"})).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // "other" sets c, and applies b with the value it has: b is then owned by both, and
    // stays while either still applies it.
    apply("other", json!({"b": "2", "c": "3"})).await.unwrap();
    let other = apply("other", json!({"c": "3"})).await.unwrap();
    assert_eq!(data_of(&other), [("a", "1"), ("b", "2"), ("c", "3")]);
    assert_eq!(
        fields_of(&other, "other"),
        Some(json!({"f:data": {"f:c": {}}}))
    );
    let reapplied = apply("ctrl", json!({"a": "10"})).await.unwrap();
    assert_eq!(
        data_of(&reapplied),
        [("a", "10"), ("c", "3")],
        "b went with its last owner"
    );
    assert_eq!(
        fields_of(&reapplied, "ctrl"),
        Some(json!({"f:data": {"f:a": {}}}))
    );
    let ctrl = reapplied.metadata.managed_fields.as_ref().unwrap()[0].clone();
    assert_eq!(ctrl.manager.as_deref(), Some("ctrl"));
    assert_eq!(ctrl.operation.as_deref(), Some("Apply"));
    assert_eq!(ctrl.fields_type.as_deref(), Some("FieldsV1"));
    assert_eq!(ctrl.api_version.as_deref(), Some("v1"));
    assert!(ctrl.time.is_some());

    // Changing a field another manager owns takes it over (force semantics).
    let taken = apply("ctrl", json!({"a": "10", "c": "4"})).await.unwrap();
    assert_eq!(
        fields_of(&taken, "ctrl"),
        Some(json!({"f:data": {"f:a": {}, "f:c": {}}}))
    );
    assert_eq!(
        fields_of(&taken, "other"),
        None,
        "a manager owning nothing has no entry"
    );
    let reapplied = apply("ctrl", json!({"a": "10"})).await.unwrap();
    assert_eq!(data_of(&reapplied), [("a", "10")]);

    // Re-applying the same configuration changes nothing, not even the resourceVersion.
    api.reset_requests();
    let again = apply("ctrl", json!({"a": "10"})).await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        reapplied.metadata.resource_version
    );
    let writes = api.writes();
    assert_eq!(writes.len(), 1);
    assert!(
        !writes[0].changed && writes[0].has_query("fieldManager", "ctrl"),
        "{}",
        writes[0]
    );

    // Without a field manager an apply is invalid.
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}});
    let err = cms
        .patch("s", &PatchParams::default(), &Patch::Apply(&obj))
        .await
        .unwrap_err();
    assert_eq!(code_reason(err), (422, "Invalid".into()));
}

#[tokio::test]
async fn the_status_subresource_and_generation_follow_the_api_server() {
    let api = KubeApi::start();
    let deployments: Api<Deployment> = Api::default_namespaced(api.client());
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
                 "template": {
                     "metadata": {"labels": {"app": "d"}},
                     "spec": {"containers": [{"name": "c", "image": "i"}]},
                 }},
        "status": {"replicas": 5},
    }))
    .unwrap();
    let created = deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    assert_eq!(created.status, None, "a create carries no status");

    let status = json!({"status": {"availableReplicas": 1, "replicas": 1}});
    let pp = PatchParams::default();
    let with_status = deployments
        .patch_status("d", &pp, &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        with_status.status.as_ref().unwrap().available_replicas,
        Some(1)
    );
    assert_eq!(
        with_status.metadata.generation,
        Some(1),
        "status writes keep the generation"
    );

    let sneaky = json!({"spec": {"replicas": 3}, "status": {"availableReplicas": 9}});
    let main = deployments
        .patch("d", &pp, &Patch::Merge(&sneaky))
        .await
        .unwrap();
    assert_eq!(
        main.status.as_ref().unwrap().available_replicas,
        Some(1),
        "main writes keep status"
    );
    assert_eq!(
        main.metadata.generation,
        Some(2),
        "a spec change bumps the generation"
    );
    let via_status = json!({"spec": {"replicas": 7}, "status": {"availableReplicas": 2}});
    let after = deployments
        .patch_status("d", &pp, &Patch::Merge(&via_status))
        .await
        .unwrap();
    assert_eq!(
        after.spec.unwrap().replicas,
        Some(3),
        "status writes keep spec"
    );
    assert_eq!(after.status.unwrap().available_replicas, Some(2));
    let labels = json!({"metadata": {"labels": {"x": "y"}}});
    let relabelled = deployments
        .patch("d", &pp, &Patch::Merge(&labels))
        .await
        .unwrap();
    assert_eq!(
        relabelled.metadata.generation,
        Some(2),
        "metadata changes keep the generation"
    );

    // Server-side apply of status: only .status changes, recorded for the status subresource.
    let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 9}, "status": {"readyReplicas": 1}});
    let ssa = PatchParams::apply("ctrl").force();
    let after = deployments
        .patch_status("d", &ssa, &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(after.status.as_ref().unwrap().ready_replicas, Some(1));
    let entry = after
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some("ctrl"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    assert_eq!(
        serde_json::to_value(entry.fields_v1.unwrap()).unwrap(),
        json!({"f:status": {"f:readyReplicas": {}}})
    );
    let relabelled = deployments.get("d").await.unwrap();

    // A write that changes nothing keeps the resourceVersion; the log says it changed nothing.
    api.reset_requests();
    let same = deployments
        .replace("d", &PostParams::default(), &relabelled)
        .await
        .unwrap();
    let unchanged = deployments
        .patch("d", &pp, &Patch::Merge(&labels))
        .await
        .unwrap();
    assert_eq!(
        same.metadata.resource_version,
        relabelled.metadata.resource_version
    );
    assert_eq!(
        unchanged.metadata.resource_version,
        relabelled.metadata.resource_version
    );
    assert!(
        api.writes().iter().all(|w| !w.changed),
        "{:?}",
        api.writes()
    );
}

fn owned_by(kind: &str, api_version: &str, name: &str, uid: &str) -> Value {
    json!([{
        "apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true,
    }])
}

#[test]
fn deleting_an_owner_collects_its_dependents_as_the_garbage_collector_does() {
    let api = KubeApi::start();
    let function = api.insert(kyma_function("f"));
    let uid = function["metadata"]["uid"].as_str().unwrap().to_string();
    let fn_owner = owned_by("Function", "serverless.kyma-project.io/v1alpha2", "f", &uid);
    let job = api.insert(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "f-build", "namespace": "default", "ownerReferences": fn_owner}}));
    let job_uid = job["metadata"]["uid"].as_str().unwrap();
    api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "f-build-pod", "namespace": "default",
                     "ownerReferences": owned_by("Job", "batch/v1", "f-build", job_uid)}}));
    let keeper = api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "keeper", "namespace": "default"}}));
    let mut two_owners = fn_owner.clone();
    two_owners
        .as_array_mut()
        .unwrap()
        .push(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "name": "keeper", "uid": keeper["metadata"]["uid"]}));
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "namespace": "default", "ownerReferences": two_owners}}));

    let client = api.client();
    let (functions, _) = function_api(client.clone());
    api.block_on(functions.delete("f", &DeleteParams::background()))
        .unwrap();
    assert_eq!(api.get("Function", "default", "f"), None);
    assert_eq!(
        api.get("Job", "default", "f-build"),
        None,
        "the dependent goes"
    );
    assert_eq!(
        api.get("Pod", "default", "f-build-pod"),
        None,
        "and its own dependent"
    );
    let shared = api
        .get("ConfigMap", "default", "shared")
        .expect("another owner keeps it");
    assert_eq!(
        shared["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Orphan: the dependent stays without its owner reference.
    let owner = api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "o", "namespace": "default"}}));
    let owner_ref = owned_by(
        "ConfigMap",
        "v1",
        "o",
        owner["metadata"]["uid"].as_str().unwrap(),
    );
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "dep", "namespace": "default", "ownerReferences": owner_ref}}));
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.block_on(cms.delete("o", &DeleteParams::orphan()))
        .unwrap();
    let orphan = api
        .get("Secret", "default", "dep")
        .expect("orphaned, not deleted");
    assert_eq!(orphan["metadata"]["ownerReferences"], json!([]));

    // Finalizers hold a deletion until they are removed.
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "held", "namespace": "default", "finalizers": ["kiln.dev/cleanup"]}}));
    api.block_on(cms.delete("held", &DeleteParams::default()))
        .unwrap();
    let held = api
        .get("ConfigMap", "default", "held")
        .expect("held by its finalizer");
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    let release = json!({"metadata": {"finalizers": null}});
    api.block_on(cms.patch("held", &PatchParams::default(), &Patch::Merge(&release)))
        .unwrap();
    assert_eq!(api.get("ConfigMap", "default", "held"), None);
}

/// The next event of a watcher stream, failing the test after a few seconds.
async fn next<S, T>(stream: &mut S) -> T
where
    S: futures_util::Stream<Item = T> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream goes on")
}

fn event_name(event: &watcher::Event<ConfigMap>) -> String {
    match event {
        watcher::Event::Init => "init".into(),
        watcher::Event::InitApply(o) => format!("init-apply {}", o.metadata.name.as_ref().unwrap()),
        watcher::Event::InitDone => "init-done".into(),
        watcher::Event::Apply(o) => {
            format!("apply {} {:?}", o.metadata.name.as_ref().unwrap(), o.data)
        }
        watcher::Event::Delete(o) => format!("delete {}", o.metadata.name.as_ref().unwrap()),
    }
}

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

/// Creates a Function changed by `edit` and returns the 422's causes (field, message).
async fn rejected(
    functions: &Api<DynamicObject>,
    edit: impl FnOnce(&mut Value),
) -> Vec<(String, String)> {
    let mut function = kyma_function("bad");
    edit(&mut function);
    let object: DynamicObject = serde_json::from_value(function).unwrap();
    let err = functions
        .create(&PostParams::default(), &object)
        .await
        .unwrap_err();
    let (code, reason, message, causes) = status(err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    assert!(
        message.starts_with("Function.serverless.kyma-project.io \"bad\" is invalid: "),
        "{message}"
    );
    causes
}

#[tokio::test]
async fn functions_are_validated_against_the_crd_schema_and_its_cel_rules() {
    let api = KubeApi::start();
    let (functions, _) = function_api(api.client());
    let valid: DynamicObject = serde_json::from_value(kyma_function("hello")).unwrap();
    let created = functions
        .create(&PostParams::default(), &valid)
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["replicas"], 1,
        "the CRD default is applied"
    );

    let causes = rejected(&functions, |f| {
        f["spec"]["source"]["gitRepository"] =
            json!({"url": "https://git.example/r", "baseDir": "/", "reference": "main"});
    })
    .await;
    assert_eq!(
        causes,
        [(
            "spec.source".to_string(),
            "Invalid value: \"object\": spec.source needs exactly one of inline and gitRepository"
                .to_string()
        )]
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["scaleConfig"] = json!({"minReplicas": 4, "maxReplicas": 2})
    })
    .await;
    assert_eq!(
        causes,
        [(
            "spec.scaleConfig".to_string(),
            "Invalid value: \"object\": minReplicas must not exceed maxReplicas".to_string()
        )]
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["env"] = json!([{"name": "FUNC_PORT", "value": "1"}])
    })
    .await;
    assert_eq!(causes[0].0, "spec.env");
    assert!(
        causes[0].1.contains(
            "FUNC_RUNTIME, FUNC_HANDLER, FUNC_PORT, MOD_NAME, NODE_PATH and PYTHONPATH are reserved"
        ),
        "{causes:?}"
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["labels"] = json!({"serverless.kyma-project.io/x": "y"})
    })
    .await;
    assert_eq!(causes[0].0, "spec.labels");
    assert!(
        causes[0]
            .1
            .ends_with("labels with the prefix serverless.kyma-project.io/ are reserved"),
        "{causes:?}"
    );
    let causes = rejected(&functions, |f| {
        f["spec"]["resourceConfiguration"]["function"]["profile"] = json!("XXL")
    })
    .await;
    assert_eq!(
        causes,
        [(
            "spec.resourceConfiguration.function.profile".to_string(),
            "Unsupported value: \"XXL\": supported values: \"XS\", \"S\", \"M\", \"L\", \"XL\""
                .to_string()
        )]
    );
    // Structural rules: required fields, types, minimum.
    let causes = rejected(&functions, |f| {
        f["spec"].as_object_mut().unwrap().remove("runtime");
        f["spec"]["replicas"] = json!("two");
        f["spec"]["scaleConfig"]["minReplicas"] = json!(0);
    })
    .await;
    let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        fields.contains(&"spec.runtime")
            && fields.contains(&"spec.replicas")
            && fields.contains(&"spec.scaleConfig.minReplicas"),
        "{causes:?}"
    );

    // Updates are validated too, and unknown fields are pruned as kube-apiserver does.
    let bad_update = json!({"spec": {"scaleConfig": {"minReplicas": 9}}, "unknownField": 1});
    let err = functions
        .patch("hello", &PatchParams::default(), &Patch::Merge(&bad_update))
        .await
        .unwrap_err();
    assert_eq!(code_reason(err).0, 422);
    let pruned = json!({"spec": {"bogus": true}});
    let patched = functions
        .patch("hello", &PatchParams::default(), &Patch::Merge(&pruned))
        .await
        .unwrap();
    assert!(patched.data["spec"].get("bogus").is_none());
}

#[tokio::test]
async fn functions_have_a_scale_subresource_over_spec_replicas() {
    let api = KubeApi::start();
    let (functions, _) = function_api(api.client());
    let valid: DynamicObject = serde_json::from_value(kyma_function("s")).unwrap();
    functions
        .create(&PostParams::default(), &valid)
        .await
        .unwrap();
    let status = json!({"status": {"replicas": 1, "podSelector": "app=s"}});
    functions
        .patch_status("s", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let scale = functions.get_scale("s").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    assert_eq!(
        scale.status.as_ref().unwrap().selector.as_deref(),
        Some("app=s")
    );
    let up = json!({"spec": {"replicas": 3}});
    functions
        .patch_scale("s", &PatchParams::default(), &Patch::Merge(&up))
        .await
        .unwrap();
    assert_eq!(
        api.get("Function", "default", "s").unwrap()["spec"]["replicas"],
        3
    );
}

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

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..100 {
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
    eventually("the apply was sent", || secret_writes().count() == 1).await;
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

#[tokio::test]
async fn knative_services_are_validated_against_knative_servings_published_crd() {
    use common::kube_api::{CrdSource, Options};
    let crd = std::fs::read_to_string(common::kiln::fixtures().join("knative/service-crd.yaml"));
    let options = Options {
        crds: vec![CrdSource::Yaml(crd.unwrap())],
        ..Options::default()
    };
    let api = KubeApi::with_options(options);
    let gvk = GroupVersionKind::gvk("serving.knative.dev", "v1", "Service");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "services");
    let ksvcs: Api<DynamicObject> = Api::namespaced_with(api.client(), "default", &ar);
    let ksvc = |port: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": "hello"},
            "spec": {"template": {"spec": {"containers": [{
                "image": "registry.example/hello@sha256:0000",
                "ports": [{"containerPort": port, "name": "http1"}],
            }]}}},
        }))
        .unwrap()
    };
    let err = ksvcs
        .create(&PostParams::default(), &ksvc(json!("8080")))
        .await
        .unwrap_err();
    let (code, _, message, causes) = status(err);
    assert_eq!(code, 422, "{message}");
    let field = "spec.template.spec.containers[0].ports[0].containerPort";
    assert!(causes.iter().any(|(f, _)| f == field), "{causes:?}");
    let created = ksvcs
        .create(&PostParams::default(), &ksvc(json!(8080)))
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"],
        8080
    );
}
