//! Objects through kube's typed clients: create, read, list by label and field selectors,
//! replace with optimistic concurrency, merge and server-side apply patches, the status
//! subresource with generation, and deletion with the garbage collector's owner references,
//! orphans and finalizers.

use crate::common;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{cm, function_api, kyma_function};
use common::kube_api::KubeApi;
use common::kube_client::{code_reason, status};

fn names<K: kube::Resource>(list: impl IntoIterator<Item = K>) -> Vec<String> {
    list.into_iter()
        .map(|o| o.meta().name.clone().unwrap())
        .collect()
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
    // Entries are sorted as kube-apiserver sorts them (operation, then time to the second,
    // then manager), so which comes first depends on whether a second ticked between the two
    // managers' applies: found by name.
    let ctrl = reapplied
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.manager.as_deref() == Some("ctrl"))
        .unwrap()
        .clone();
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

    // An object whose owner reference an update removed is no longer the owner's dependent
    // (the collector's index of owners follows every write).
    let owner = api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "o2", "namespace": "default"}}));
    let owner_ref = owned_by(
        "ConfigMap",
        "v1",
        "o2",
        owner["metadata"]["uid"].as_str().unwrap(),
    );
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "freed", "namespace": "default", "ownerReferences": owner_ref}}));
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "freed", "namespace": "default"}}));
    api.block_on(cms.delete("o2", &DeleteParams::background()))
        .unwrap();
    assert!(
        api.get("Secret", "default", "freed").is_some(),
        "an object no longer owned stays"
    );

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
