//! The in-memory API server refuses what kube-apiserver refuses, with the same status and
//! message: authentication, RBAC (verbs, subresources, resourceNames, an apply that creates
//! being a create), namespaces that must exist, PodSecurity admission, and server-side
//! apply's field ownership (conflicts, force, lists merged by key).

#![allow(clippy::unwrap_used)]

use crate::common;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::kube_api::KubeApi;
use common::kube_client::refusal;

fn grant(api: &KubeApi, namespace: &str, account: &str, rules: Value) {
    api.insert(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": account, "namespace": namespace}}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": account, "namespace": namespace}, "rules": rules}),
    );
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": account, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}),
    );
}

fn deployment(name: &str, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]}}}})
}

#[tokio::test]
async fn rbac_refuses_what_a_role_does_not_grant_with_kube_apiservers_forbidden_status() {
    let api = KubeApi::start();
    api.insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}));
    // Patch without create, as deploy/rbac.yaml once granted; status separately; one name.
    grant(
        &api,
        "team",
        "deployer",
        json!([
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch", "list"]},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "verbs": ["get"],
                "resourceNames": ["allowed"]
            },
        ]),
    );
    let client = api.client_with_token(&api.service_account_token("team", "deployer"));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "team");
    deployments.list(&Default::default()).await.unwrap();
    let user = "system:serviceaccount:team:deployer";

    // A server-side apply that would create the object is a create as well as a patch.
    let apply = PatchParams::apply("kiln-controller");
    let err = deployments
        .patch("web", &apply, &Patch::Apply(deployment("web", "nginx")))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err),
        (
            403,
            "Forbidden".into(),
            format!(
                "deployments.apps \"web\" is forbidden: User \"{user}\" cannot create resource \
                 \"deployments\" in API group \"apps\" in the namespace \"team\""
            )
        )
    );
    assert!(api.get("Deployment", "team", "web").is_none());
    // Once it exists (made by someone who may), the apply is only a patch: allowed. (Forced:
    // what existed before any apply is owned by "before-first-apply".)
    api.insert(deployment("web", "nginx").tap_namespace("team"));
    deployments
        .patch(
            "web",
            &apply.clone().force(),
            &Patch::Apply(deployment("web", "nginx:2")),
        )
        .await
        .unwrap();
    // The status subresource is its own resource.
    let err = deployments
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err).2,
        format!(
            "deployments.apps \"web\" is forbidden: User \"{user}\" cannot patch resource \
             \"deployments/status\" in API group \"apps\" in the namespace \"team\""
        )
    );
    // get is not list, and another namespace is another scope.
    let err = deployments.get("web").await.unwrap_err();
    assert!(
        refusal(err)
            .2
            .contains("cannot get resource \"deployments\"")
    );
    let elsewhere: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let err = elsewhere.list(&Default::default()).await.unwrap_err();
    assert_eq!(
        refusal(err).2,
        format!(
            "deployments.apps is forbidden: User \"{user}\" cannot list resource \"deployments\" \
             in API group \"apps\" in the namespace \"default\""
        )
    );
    let everywhere: Api<Deployment> = Api::all(client.clone());
    let err = everywhere.list(&Default::default()).await.unwrap_err();
    assert!(refusal(err).2.ends_with("at the cluster scope"));
    // resourceNames: that one ConfigMap, not another, and never a list.
    api.insert(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "allowed", "namespace": "team"}
    }));
    api.insert(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "other", "namespace": "team"}
    }));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    cms.get("allowed").await.unwrap();
    assert_eq!(refusal(cms.get("other").await.unwrap_err()).0, 403);
    assert_eq!(
        refusal(cms.list(&Default::default()).await.unwrap_err()).0,
        403
    );
    // A token the server never issued is 401; so is one whose ServiceAccount is gone.
    let stranger = api.client_with_token("not-a-token");
    let err = Api::<ConfigMap>::namespaced(stranger, "team")
        .get("allowed")
        .await
        .unwrap_err();
    assert_eq!(refusal(err).0, 401);
    api.delete("ServiceAccount", "team", "deployer");
    assert_eq!(refusal(cms.get("allowed").await.unwrap_err()).0, 401);
    // The audit log has who did what, as RBAC saw it.
    let audit = api.audit();
    assert!(audit.iter().any(|e| e.user == user
        && e.attributes.verb == "patch"
        && e.attributes.resource == "deployments"
        && e.attributes.name == "web"));
}

trait TapNamespace {
    fn tap_namespace(self, ns: &str) -> Value;
}

impl TapNamespace for Value {
    fn tap_namespace(mut self, ns: &str) -> Value {
        self["metadata"]["namespace"] = json!(ns);
        self
    }
}

#[tokio::test]
async fn objects_need_their_namespace_and_pods_their_service_account_and_pod_security() {
    let api = KubeApi::start();
    let client = api.client();
    let pp = PostParams::default();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ghost");
    let err = cms
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err),
        (
            404,
            "NotFound".into(),
            "namespaces \"ghost\" not found".into()
        )
    );

    // A namespace label PodSecurity cannot read is invalid.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let bad = json!({"metadata": {
        "name": "team",
        "labels": {"pod-security.kubernetes.io/enforce": "strict"}
    }});
    let err = namespaces
        .create(&pp, &serde_json::from_value(bad).unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err),
        (
            422,
            "Invalid".into(),
            "Namespace \"team\" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: \
             Invalid value: \"strict\": must be one of privileged, baseline, restricted"
                .into()
        )
    );
    let good = json!({"metadata": {
        "name": "team",
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}
    }});
    namespaces
        .create(&pp, &serde_json::from_value(good).unwrap())
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    let bare = json!({
        "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let err = pods
        .create(&pp, &serde_json::from_value(bare).unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err),
        (
            403,
            "Forbidden".into(),
            "pods \"bare\" is forbidden: violates PodSecurity \"restricted:latest\": \
             allowPrivilegeEscalation != false (container \"c\" must set \
             securityContext.allowPrivilegeEscalation=false), unrestricted capabilities \
             (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), \
             runAsNonRoot != true (pod or container \"c\" must set \
             securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must \
             set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
                .into()
        )
    );
    let restricted = json!({"metadata": {"name": "ok"}, "spec": {
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "serviceAccountName": "builder",
        "containers": [{"name": "c", "image": "busybox", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}});
    let err = pods
        .create(&pp, &serde_json::from_value(restricted.clone()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err),
        (
            403,
            "Forbidden".into(),
            "pods \"ok\" is forbidden: error looking up service account team/builder: \
             serviceaccount \"builder\" not found"
                .into()
        )
    );
    api.insert(json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "builder", "namespace": "team"}
    }));
    let pod = pods
        .create(&pp, &serde_json::from_value(restricted).unwrap())
        .await
        .unwrap();
    // The ServiceAccount admission plugin mounted the projected token volume.
    let spec = pod.spec.unwrap();
    let volume = spec.volumes.unwrap()[0].clone();
    assert!(volume.name.starts_with("kube-api-access-"));
    let sources = volume.projected.unwrap().sources.unwrap();
    assert!(sources[0].service_account_token.is_some());
    assert_eq!(
        spec.containers[0].volume_mounts.clone().unwrap()[0].mount_path,
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
}

#[tokio::test]
async fn server_side_apply_conflicts_with_another_managers_fields_unless_forced() {
    let api = KubeApi::start();
    let client = api.client();
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let mine = PatchParams::apply("kiln-controller");
    deployments
        .patch("web", &mine, &Patch::Apply(deployment("web", "nginx:1")))
        .await
        .unwrap();
    // Another manager changes a field kiln owns: 409 unless it forces.
    let theirs = PatchParams::apply("someone-else");
    let err = deployments
        .patch("web", &theirs, &Patch::Apply(deployment("web", "evil:1")))
        .await
        .unwrap_err();
    assert_eq!(
        refusal(err),
        (
            409,
            "Conflict".into(),
            "Apply failed with 1 conflict: conflict with \"kiln-controller\": \
             .spec.template.spec.containers[name=\"app\"].image"
                .into()
        )
    );
    // A second container is theirs alone, merged into the list by its name.
    let sidecar = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "envoy"}]}}}});
    deployments
        .patch("web", &theirs, &Patch::Apply(sidecar))
        .await
        .unwrap();
    let live = api.get("Deployment", "default", "web").unwrap();
    let names: Vec<&str> = live["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app", "sidecar"]);
    // kiln's next apply leaves the other manager's container alone.
    deployments
        .patch("web", &mine, &Patch::Apply(deployment("web", "nginx:2")))
        .await
        .unwrap();
    let live = api.get("Deployment", "default", "web").unwrap();
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Applying the value a field has shares it: no conflict.
    let same = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1}});
    deployments
        .patch("web", &theirs, &Patch::Apply(same))
        .await
        .unwrap();
    // A forced apply takes the field.
    deployments
        .patch(
            "web",
            &theirs.clone().force(),
            &Patch::Apply(deployment("web", "evil:1")),
        )
        .await
        .unwrap();
    let live = api.get("Deployment", "default", "web").unwrap();
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"][0]["image"],
        "evil:1"
    );
    // A hand edit (an Update) takes ownership too: kiln's unforced apply now conflicts with
    // it, and kiln's forced apply (what the controller sends) reverts it.
    let mut edited = deployments.get("web").await.unwrap();
    edited.spec.as_mut().unwrap().replicas = Some(5);
    deployments
        .replace(
            "web",
            &PostParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &edited,
        )
        .await
        .unwrap();
    let err = deployments
        .patch("web", &mine, &Patch::Apply(deployment("web", "evil:1")))
        .await
        .unwrap_err();
    assert!(
        refusal(err)
            .2
            .contains("conflict with \"kubectl-edit\" using apps/v1: .spec.replicas"),
        "an Update manager owns what it changed"
    );
    deployments
        .patch(
            "web",
            &mine.force(),
            &Patch::Apply(deployment("web", "nginx:2")),
        )
        .await
        .unwrap();
    let live = api.get("Deployment", "default", "web").unwrap();
    assert_eq!(live["spec"]["replicas"], 1);
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:2"
    );
}
