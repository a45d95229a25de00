//! The test kubelet against the in-memory API server: `sync` (and `spawn`, its loop) reads
//! Jobs, Deployments,
//! Knative Services, ConfigMaps and Secrets through a `kube::Client`, runs the pods for real
//! and writes Pod objects and the status subresources back; a steady state writes nothing;
//! deleting a Deployment stops its replica; an unsupported field fails the sync by name.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kubelet;

use std::time::{Duration, Instant};

use common::controller_env::{ControllerEnv, node_function};
use common::fake_builds::{FakeBuilds, FakeRollouts, Outcome};
use common::kube_api::KubeApi;
use kubelet::api::SyncError;
use kubelet::testbed::{Testbed, container, with};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// Syncs until `check` holds on the API server, panicking after [`WAIT`].
fn sync_until(api: &KubeApi, bed: &Testbed, what: &str, mut check: impl FnMut(&KubeApi) -> bool) {
    let client = api.client();
    let deadline = Instant::now() + WAIT;
    loop {
        api.block_on(bed.kubelet.sync(&client)).unwrap();
        if check(api) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn condition(object: &Value, kind: &str) -> Option<(String, String)> {
    let conditions = object["status"]["conditions"].as_array()?;
    let c = conditions.iter().find(|c| c["type"] == kind)?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Some((text(&c["status"]), text(&c["reason"])))
}

fn job(image: &str) -> Value {
    let c = with(
        container(
            "build",
            image,
            "echo -n \"$TOKEN@$(busybox cat /src/source)\" > /dev/termination-log",
        ),
        json!({
            "env": [{
                "name": "TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}
            }],
            "volumeMounts": [{"name": "src", "mountPath": "/src", "readOnly": true}],
        }),
    );
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "build-1", "namespace": "fns"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "containers": [c],
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true},
            "volumes": [{"name": "src", "configMap": {"name": "src"}}],
        }}},
    })
}

#[test]
fn sync_runs_a_job_from_the_api_and_writes_its_pod_and_status_then_nothing_more() {
    let api = KubeApi::start();
    let bed = Testbed::new(5);
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": "src", "namespace": "fns"}, "data": {"source": "v1"}}));
    api.insert(json!({"apiVersion": "v1", "kind": "Secret",
                      "metadata": {"name": "creds", "namespace": "fns"},
                      "data": {"token": common::base64(b"registry/fn")}}));
    let created = api.insert(job(&bed.image));
    sync_until(&api, &bed, "the Job completes", |api| {
        let job = api.get("Job", "fns", "build-1").unwrap();
        condition(&job, "Complete").is_some()
    });
    let job = api.get("Job", "fns", "build-1").unwrap();
    assert_eq!(
        condition(&job, "Complete"),
        Some(("True".into(), "CompletionsReached".into()))
    );
    assert_eq!(job["status"]["succeeded"], 1);
    assert!(job["status"]["completionTime"].is_string() && job["status"]["active"].is_null());
    let pods = api.list("Pod");
    assert_eq!(pods.len(), 1, "{pods:#?}");
    let pod = &pods[0];
    assert_eq!(pod["metadata"]["labels"]["job-name"], "build-1");
    assert_eq!(
        pod["metadata"]["labels"]["controller-uid"],
        created["metadata"]["uid"]
    );
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["uid"],
        created["metadata"]["uid"]
    );
    assert_eq!(pod["status"]["phase"], "Succeeded");
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["message"], "registry/fn@v1", "{pod:#}");
    assert_eq!(terminated["exitCode"], 0);

    api.reset_requests();
    let writes = api.block_on(bed.kubelet.sync(&api.client())).unwrap();
    assert_eq!(writes, 0);
    assert!(api.writes().is_empty(), "{:#?}", api.writes());

    // Deleting the Job (the API collects its Pod) makes the kubelet forget it.
    api.delete("Job", "fns", "build-1");
    api.block_on(bed.kubelet.sync(&api.client())).unwrap();
    assert!(api.list("Pod").is_empty());
    assert!(bed.kubelet.job_status("fns", "build-1").is_none());
}

fn deployment(image: &str) -> Value {
    let c = with(
        container(
            "function",
            image,
            "echo OK > /tmp/healthz; exec busybox httpd -f -p $(FUNC_PORT) -h /tmp",
        ),
        json!({
            "env": [{"name": "FUNC_PORT", "value": "8080"}],
            "ports": [{"containerPort": 8080, "name": "http"}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }),
    );
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "hello", "namespace": "fns"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "hello"}},
                 "template": {"metadata": {"labels": {"app": "hello"}}, "spec": {
                     "containers": [c], "volumes": [{"name": "tmp", "emptyDir": {}}],
                     "securityContext": {"runAsUser": 10001, "runAsGroup": 10001}}}},
    })
}

#[test]
fn a_deployment_from_the_api_becomes_available_and_stops_when_deleted() {
    let api = KubeApi::start();
    let bed = Testbed::new(5);
    api.insert(deployment(&bed.image));
    let handle = bed.kubelet.spawn(api.client());
    let deadline = Instant::now() + WAIT;
    let available = |d: &Value| condition(d, "Available").is_some_and(|c| c.0 == "True");
    while !available(&api.get("Deployment", "fns", "hello").unwrap()) {
        assert!(
            Instant::now() < deadline,
            "not available: {:#?}",
            api.list("Pod")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(handle);
    // The loop's last sync may have written the Pods just before a probe turned them ready
    // and the Deployment just after: one sync catches up, and then nothing changes.
    api.block_on(bed.kubelet.sync(&api.client())).unwrap();
    api.reset_requests();
    assert_eq!(api.block_on(bed.kubelet.sync(&api.client())).unwrap(), 0);
    assert!(api.writes().is_empty(), "{:#?}", api.writes());
    let d = api.get("Deployment", "fns", "hello").unwrap();
    assert_eq!(
        d["status"]["observedGeneration"],
        d["metadata"]["generation"]
    );
    assert_eq!(
        (
            &d["status"]["readyReplicas"],
            &d["status"]["availableReplicas"]
        ),
        (&json!(1), &json!(1))
    );
    let pod = &api.list("Pod")[0];
    assert_eq!(pod["metadata"]["labels"]["app"], "hello");
    assert_eq!(pod["status"]["containerStatuses"][0]["ready"], true);
    let port = bed.kubelet.port("fns", "hello").unwrap();
    assert!(kubelet_get(port));

    api.delete("Deployment", "fns", "hello");
    sync_until(&api, &bed, "the replica's Pod is deleted", |api| {
        api.list("Pod").is_empty()
    });
    assert_eq!(bed.kubelet.port("fns", "hello"), None);
    let deadline = Instant::now() + WAIT;
    while kubelet_get(port) {
        assert!(Instant::now() < deadline, "the replica still answers");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kubelet_get(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = write!(s, "GET /healthz HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.") && out.contains(" 200 ") && out.ends_with("OK\n")
}

#[test]
fn an_unsupported_field_in_an_api_object_fails_the_sync_naming_it() {
    let api = KubeApi::start();
    let bed = Testbed::new(5);
    let mut d = deployment(&bed.image);
    d["spec"]["template"]["spec"]["containers"][0]["workingDir"] = json!("/srv");
    api.insert(d);
    let err = api.block_on(bed.kubelet.sync(&api.client())).unwrap_err();
    let SyncError::Unsupported(lines) = &err else {
        panic!("{err}")
    };
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].contains("Deployment fns/hello") && lines[0].contains("containers[0].workingDir"),
        "{err}"
    );
    assert_eq!(bed.kubelet.failures(), *lines);
    assert!(api.list("Pod").is_empty());
}

/// What `kiln controller` renders today (build Job, Deployment, Knative Service).
fn rendered(serving: &[&str]) -> (Value, Value) {
    let env = ControllerEnv::start(serving);
    let outcome = Outcome::Push {
        layout: env.tiny.layout.clone(),
        tag: "base".into(),
        digest: env.tiny.digest.clone(),
        creds: None,
    };
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(300), move |_| {
        outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    let yaml = node_function("hello", "module.exports = { main: () => 'hi' }", Some("{}"))
        + "  secretMounts: [{secretName: extra, mountPath: /etc/extra}]\n";
    env.create_function("team", &yaml);
    let kind = if serving.is_empty() {
        "Deployment"
    } else {
        "Service.serving.knative.dev"
    };
    let mut job = None;
    env.wait("the build Job, then what runs the image", WAIT, || {
        job = job
            .take()
            .or_else(|| env.build_objects("Job", "team", "hello").into_iter().next());
        job.is_some() && env.api.get(kind, "team", "hello").is_some()
    });
    (job.unwrap(), env.api.get(kind, "team", "hello").unwrap())
}

#[test]
fn what_the_controller_renders_is_within_what_the_kubelet_implements() {
    let (job, deployment) = rendered(&[]);
    kubelet::job::check(&serde_json::from_value(job).unwrap()).unwrap();
    kubelet::replica::check_deployment(&serde_json::from_value(deployment).unwrap()).unwrap();
    let (_, service) = rendered(&["--serving", "knative"]);
    kubelet::replica::check_knative_service(&service).unwrap();
}

#[test]
fn a_status_patch_sets_fields_that_went_away_to_null() {
    let current = json!({"readyReplicas": 1, "replicas": 1, "conditions": [{"type": "Available"}],
                         "nested": {"keep": 1, "gone": 2}});
    let desired = json!({"replicas": 1, "conditions": [], "nested": {"keep": 1}});
    let patch = kubelet::api::merge_patch(&current, &desired);
    assert_eq!(
        patch,
        json!({
            "readyReplicas": null,
            "replicas": 1,
            "conditions": [],
            "nested": {"keep": 1, "gone": null}
        })
    );
    assert_eq!(kubelet::api::merge_patch(&Value::Null, &desired), desired);
}
