//! The test kubelet runs Deployments and Knative Services for real: busybox `httpd` pulled
//! from a real docker-registry, its port 8080 mapped to a free host port, probed on
//! `/healthz`; the status becomes available, a template change restarts the replica, a crash
//! makes it unavailable, deletion stops it. And the kubelet refuses fields it does not
//! implement, naming them.

#![allow(clippy::unwrap_used)]

use crate::kubelet;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kubelet::replica::Kind;
use kubelet::testbed::Testbed;
use kubelet::{Objects, TestKubelet};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// Serves /www (a ConfigMap with `healthz`) plus /tmp/www/version ($VERSION) on $(FUNC_PORT),
/// expanded by the kubelet from the spec's `FUNC_PORT=8080`, which it maps.
const SERVE: &str = "busybox mkdir -p /tmp/www && busybox cp /www/healthz /tmp/www/ && \
     echo $VERSION > /tmp/www/version && exec busybox httpd -f -p $(FUNC_PORT) -h /tmp/www";

fn function_container(image: &str, script: &str, version: &str) -> Value {
    let probe = |period: i32, failures: i32| {
        json!({
        "httpGet": {"path": "/healthz", "port": 8080},
        "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 2})
    };
    json!({
        "name": "function", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script],
        "env": [{"name": "FUNC_PORT", "value": "8080"}, {"name": "VERSION", "value": version}],
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "startupProbe": probe(5, 30), "readinessProbe": probe(5, 1), "livenessProbe": probe(5, 3),
        "resources": {"requests": {"cpu": "50m"}, "limits": {"memory": "64Mi"}},
        "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                            "privileged": false, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": "www", "mountPath": "/www", "readOnly": true}],
    })
}

fn pod_spec(container: Value) -> Value {
    json!({
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "100Mi"}},
                    {"name": "www", "configMap": {"name": "www", "defaultMode": 420}}],
        "terminationGracePeriodSeconds": 2,
    })
}

fn deployment(name: &str, generation: i64, container: Value) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "fns", "generation": generation},
        "spec": {"replicas": 1, "revisionHistoryLimit": 0,
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec(container)}},
    }))
    .unwrap()
}

fn www() -> Objects {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "www", "namespace": "fns"}, "data": {"healthz": "OK"}}))
    .unwrap();
    let mut objects = Objects::default();
    objects.add_config_map(&cm);
    objects
}

/// `GET path` on 127.0.0.1:port: (status, body), or `None` without an answer.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())?;
    Some((status, body))
}

fn condition(status: &DeploymentStatus, kind: &str) -> (String, String) {
    let c = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .unwrap();
    (c.status.clone(), c.reason.clone().unwrap_or_default())
}

/// Waits until generation `generation` of Deployment `name` is rolled out, as `kubectl
/// rollout status` decides it.
fn wait_available(kubelet: &TestKubelet, name: &str, generation: i64) -> DeploymentStatus {
    let status = kubelet.wait_for(WAIT, |k| {
        let s = k.deployment_status("fns", name)?;
        let fresh = s.observed_generation == Some(generation);
        let rolled_out = condition(&s, "Progressing").1 == "NewReplicaSetAvailable";
        (fresh && rolled_out && condition(&s, "Available").0 == "True").then_some(s)
    });
    status.unwrap_or_else(|| {
        let pods = kubelet.replica_pods(Kind::Deployment, "fns", name);
        let logs: Vec<String> = pods
            .iter()
            .map(|p| kubelet.all_logs("fns", Some(p)))
            .collect();
        let states: Vec<_> = pods
            .iter()
            .map(|p| {
                (
                    p.metadata.name.clone(),
                    p.status
                        .as_ref()
                        .map(|s| (s.pod_ip.clone(), s.container_statuses.clone())),
                )
            })
            .collect();
        panic!(
            "{name} not available: {:?}\n{states:#?}\n{}",
            kubelet.deployment_status("fns", name),
            logs.join("\n")
        )
    })
}

#[test]
fn a_deployment_becomes_available_on_its_mapped_port_and_restarts_on_a_template_change() {
    let bed = Testbed::new(5);
    bed.kubelet.set_objects(www());
    let v1 = deployment("hello", 1, function_container(&bed.image, SERVE, "v1"));
    bed.kubelet.apply_deployment(&v1).unwrap();
    let status = wait_available(&bed.kubelet, "hello", 1);
    assert_eq!(
        condition(&status, "Available"),
        ("True".into(), "MinimumReplicasAvailable".into())
    );
    assert_eq!(
        condition(&status, "Progressing"),
        ("True".into(), "NewReplicaSetAvailable".into())
    );
    let counts = (
        status.replicas,
        status.updated_replicas,
        status.ready_replicas,
        status.available_replicas,
    );
    assert_eq!(counts, (Some(1), Some(1), Some(1), Some(1)));
    assert_eq!(status.unavailable_replicas, None);
    let port = bed.kubelet.port("fns", "hello").unwrap();
    assert_ne!(port, 8080);
    assert_eq!(get(port, "/healthz"), Some((200, "OK".into())));
    assert_eq!(get(port, "/version"), Some((200, "v1\n".into())));
    let pod = bed
        .kubelet
        .replica_pod(Kind::Deployment, "fns", "hello")
        .unwrap();
    let labels = pod.metadata.labels.clone().unwrap();
    assert!(labels.contains_key("pod-template-hash") && labels["app"] == "hello");

    // An unchanged template (a new generation from a replicas-only edit, say) keeps the pod.
    bed.kubelet
        .apply_deployment(&deployment(
            "hello",
            2,
            function_container(&bed.image, SERVE, "v1"),
        ))
        .unwrap();
    assert_eq!(bed.kubelet.port("fns", "hello"), Some(port));
    bed.kubelet
        .apply_deployment(&deployment(
            "hello",
            3,
            function_container(&bed.image, SERVE, "v2"),
        ))
        .unwrap();
    wait_available(&bed.kubelet, "hello", 3);
    let new_port = bed.kubelet.port("fns", "hello").unwrap();
    assert_ne!(new_port, port);
    assert_eq!(get(new_port, "/version"), Some((200, "v2\n".into())));
    let old_gone = bed
        .kubelet
        .wait_for(WAIT, |_| get(port, "/version").is_none().then_some(()));
    assert!(old_gone.is_some(), "the old replica still answers");
    let new_pod = bed
        .kubelet
        .replica_pod(Kind::Deployment, "fns", "hello")
        .unwrap();
    assert_ne!(new_pod.metadata.name, pod.metadata.name);

    bed.kubelet.stop_workload(Kind::Deployment, "fns", "hello");
    let stopped = bed
        .kubelet
        .wait_for(WAIT, |_| get(new_port, "/healthz").is_none().then_some(()));
    assert!(stopped.is_some(), "deletion stops the replica");
    assert_eq!(bed.kubelet.port("fns", "hello"), None);
}

#[test]
fn a_crashing_container_makes_the_deployment_unavailable_and_is_restarted() {
    let bed = Testbed::new(5);
    bed.kubelet.set_objects(www());
    // The first run serves for a while and crashes; every later run crashes at once (the
    // emptyDir outlives the container). `$$$$` is the shell's `$$` once Kubernetes expanded it.
    let script = format!(
        "if [ -e /tmp/ran ]; then echo again; exit 1; fi; busybox touch /tmp/ran; \
         ( busybox sleep 3; echo crash; kill -9 $$$$ ) & {SERVE}"
    );
    let d = deployment("crashy", 1, function_container(&bed.image, &script, "v1"));
    bed.kubelet.apply_deployment(&d).unwrap();
    let port = wait_available(&bed.kubelet, "crashy", 1);
    assert_eq!(port.ready_replicas, Some(1));
    let down = bed.kubelet.wait_for(WAIT, |k| {
        let s = k.deployment_status("fns", "crashy")?;
        (condition(&s, "Available").0 == "False").then_some(s)
    });
    let down = down.unwrap_or_else(|| {
        let pod = bed.kubelet.replica_pod(Kind::Deployment, "fns", "crashy");
        let logs = bed.kubelet.all_logs("fns", pod.as_ref());
        panic!("the Deployment stays available after its container crashed:\n{pod:#?}\n{logs}")
    });
    assert_eq!(
        condition(&down, "Available").1,
        "MinimumReplicasUnavailable"
    );
    assert_eq!(
        (down.ready_replicas, down.unavailable_replicas),
        (None, Some(1))
    );
    let backoff = bed.kubelet.wait_for(WAIT, |k| {
        let pod = k.replica_pod(Kind::Deployment, "fns", "crashy")?;
        let c = pod.status?.container_statuses?.first()?.clone();
        let waiting = c.state.clone()?.waiting?;
        (waiting.reason.as_deref() == Some("CrashLoopBackOff")).then_some(c)
    });
    let c = backoff.expect("the restarted container goes into CrashLoopBackOff");
    assert!(c.restart_count >= 2 && !c.ready, "{c:?}");
    assert_eq!(c.last_state.unwrap().terminated.unwrap().exit_code, 1);
}

#[test]
fn a_knative_service_runs_its_template_and_reports_ready_with_its_url() {
    let bed = Testbed::new(5);
    bed.kubelet.set_objects(www());
    let mut container =
        function_container(&bed.image, &SERVE.replace("$(FUNC_PORT)", "$PORT"), "v1");
    container.as_object_mut().unwrap().remove("name");
    container["readinessProbe"]["httpGet"]
        .as_object_mut()
        .unwrap()
        .remove("port");
    let service = json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "kfn", "namespace": "fns", "generation": 1,
                     "labels": {"networking.knative.dev/visibility": "cluster-local"}},
        "spec": {"template": {
            "metadata": {"annotations": {"autoscaling.knative.dev/min-scale": "1"}},
                              "spec": pod_spec(container)}},
    });
    bed.kubelet.apply_knative_service(&service).unwrap();
    let status = bed.kubelet.wait_for(WAIT, |k| {
        let s = k.knative_status("fns", "kfn")?;
        (s["conditions"][1]["status"] == "True").then_some(s)
    });
    let status = status.expect("the Knative Service becomes ready");
    for (i, kind) in ["ConfigurationsReady", "Ready", "RoutesReady"]
        .iter()
        .enumerate()
    {
        assert_eq!(
            (
                &status["conditions"][i]["type"],
                &status["conditions"][i]["status"]
            ),
            (&json!(kind), &json!("True"))
        );
    }
    assert_eq!(status["url"], "http://kfn.fns.svc.cluster.local");
    assert_eq!(status["latestReadyRevisionName"], "kfn-00001");
    let port = bed.kubelet.port("fns", "kfn").unwrap();
    assert_eq!(get(port, "/version"), Some((200, "v1\n".into())));
}

/// Sets the JSON value at `pointer` (parents created), as a test edits an object.
fn set(value: &mut Value, pointer: &str, new: Value) {
    let mut at = value;
    for part in pointer.trim_start_matches('/').split('/') {
        at = match part.parse::<usize>() {
            Ok(i) if at.is_array() => &mut at[i],
            _ => &mut at[part],
        };
    }
    *at = new;
}

#[test]
fn fields_the_kubelet_does_not_implement_are_refused_by_name() {
    let scratch = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::new(kubelet::Config::new("kiln", "/nonexistent", scratch.path()));
    let c = "/spec/template/spec/containers/0";
    let sc = format!("{c}/securityContext");
    let cases = [
        (format!("{c}/workingDir"), json!("/w")),
        ("/spec/template/spec/hostPID".into(), json!(true)),
        (
            format!("{c}/envFrom"),
            json!([{"configMapRef": {"name": "x"}}]),
        ),
        (
            format!("{c}/livenessProbe/exec"),
            json!({"command": ["true"]}),
        ),
        (format!("{sc}/readOnlyRootFilesystem"), json!(false)),
        (format!("{sc}/privileged"), json!(true)),
        (format!("{sc}/capabilities/add"), json!(["NET_ADMIN"])),
        (
            format!("{c}/readinessProbe/httpGet/port"),
            json!("no-such-port"),
        ),
        (
            format!("{c}/env/0/valueFrom"),
            json!({"resourceFieldRef": {"resource": "limits.cpu"}}),
        ),
        ("/spec/template/spec/restartPolicy".into(), json!("Never")),
        (
            "/spec/template/spec/securityContext/runAsUser".into(),
            Value::Null,
        ),
        ("/spec/paused".into(), json!(true)),
    ];
    let expected = [
        "spec.template.spec.containers[0].workingDir",
        "spec.template.spec.hostPID",
        "spec.template.spec.containers[0].envFrom",
        "spec.template.spec.containers[0].livenessProbe.exec",
        "spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem",
        "spec.template.spec.containers[0].securityContext.privileged",
        "spec.template.spec.containers[0].securityContext.capabilities.add",
        "spec.template.spec.containers[0].readinessProbe.httpGet.port",
        "spec.template.spec.containers[0].env[0].valueFrom.resourceFieldRef",
        "spec.template.spec.restartPolicy",
        "spec.template.spec.securityContext.runAsNonRoot",
        "spec.paused",
    ];
    let valid = deployment("x", 1, function_container("img", SERVE, "v1"));
    assert!(kubelet.apply_deployment(&valid).is_ok());
    kubelet.stop_workload(Kind::Deployment, "fns", "x");
    for ((pointer, value), field) in cases.into_iter().zip(expected) {
        let mut d = serde_json::to_value(&valid).unwrap();
        set(&mut d, &pointer, value);
        let d: Deployment = serde_json::from_value(d).unwrap();
        let err = kubelet.apply_deployment(&d).unwrap_err();
        assert_eq!(err.field, field, "{pointer}: {err}");
    }

    // A Job may not retry, run probes or use a Job field outside the subset.
    let job = |spec: Value| -> Job {
        serde_json::from_value(json!({"metadata": {"name": "j", "namespace": "fns"}, "spec": spec}))
            .unwrap()
    };
    let pod = json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "i",
        "securityContext": {"readOnlyRootFilesystem": true}}]});
    let template = json!({"spec": pod});
    let err = kubelet
        .start_job(&job(json!({"backoffLimit": 6, "template": template})))
        .unwrap_err();
    assert_eq!(err.field, "spec.backoffLimit");
    let spec = json!({"backoffLimit": 0, "podFailurePolicy": {"rules": []}, "template": template});
    assert_eq!(
        kubelet.start_job(&job(spec)).unwrap_err().field,
        "spec.podFailurePolicy"
    );
    let mut spec = json!({"backoffLimit": 0, "template": template});
    set(
        &mut spec,
        "/template/spec/containers/0/readinessProbe",
        json!({"httpGet": {"port": 8080}}),
    );
    let err = kubelet.start_job(&job(spec)).unwrap_err();
    assert_eq!(err.field, "spec.template.spec.containers[0].readinessProbe");
    let text = err.to_string();
    assert!(
        text.contains("does not implement spec.template.spec.containers[0].readinessProbe"),
        "{text}"
    );
}

#[test]
fn a_rolling_update_keeps_its_minimum_ready_within_its_surge_and_stalls_on_unready_pods() {
    let bed = Testbed::new(5);
    bed.kubelet.set_objects(www());
    let two = |generation: i64, container: Value, deadline: i64| {
        let mut d = serde_json::to_value(deployment("web", generation, container)).unwrap();
        d["spec"]["replicas"] = json!(2);
        d["spec"]["progressDeadlineSeconds"] = json!(deadline);
        serde_json::from_value::<Deployment>(d).unwrap()
    };
    bed.kubelet
        .apply_deployment(&two(1, function_container(&bed.image, SERVE, "v1"), 600))
        .unwrap();
    let status = wait_available(&bed.kubelet, "web", 1);
    assert_eq!((status.replicas, status.ready_replicas), (Some(2), Some(2)));
    let pods = |k: &TestKubelet| k.replica_pods(Kind::Deployment, "fns", "web");
    let v1: Vec<_> = pods(&bed.kubelet)
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    // Two replicas, each with its own IP, each answering on its own mapped port.
    let ips: Vec<_> = pods(&bed.kubelet)
        .into_iter()
        .map(|p| p.status.unwrap().pod_ip.unwrap())
        .collect();
    assert_ne!(ips[0], ips[1]);

    // A template whose pods never become ready: the default strategy (25%: a surge of 1, none
    // unavailable, for 2 replicas) starts one new pod and keeps both old ones.
    let mut never = function_container(&bed.image, SERVE, "v2");
    never["readinessProbe"]["httpGet"]["path"] = json!("/not-there");
    bed.kubelet.apply_deployment(&two(2, never, 2)).unwrap();
    let stalled = bed.kubelet.wait_for(WAIT, |k| {
        let s = k.deployment_status("fns", "web")?;
        (condition(&s, "Progressing").1 == "ProgressDeadlineExceeded").then_some(s)
    });
    let stalled = stalled.expect("the rollout exceeds its progress deadline");
    assert_eq!(
        condition(&stalled, "Available").0,
        "True",
        "the old pods serve"
    );
    assert_eq!(
        (
            stalled.replicas,
            stalled.updated_replicas,
            stalled.available_replicas
        ),
        (Some(3), Some(1), Some(2))
    );
    let now: Vec<_> = pods(&bed.kubelet)
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert!(v1.iter().all(|p| now.contains(p)), "{v1:?} kept in {now:?}");

    // A template that becomes ready rolls out all the way, one pod at a time.
    bed.kubelet
        .apply_deployment(&two(3, function_container(&bed.image, SERVE, "v3"), 600))
        .unwrap();
    let mut most = 0;
    let done = bed.kubelet.wait_for(WAIT, |k| {
        let s = k.deployment_status("fns", "web")?;
        most = most.max(s.replicas.unwrap_or(0));
        let complete = condition(&s, "Progressing").1 == "NewReplicaSetAvailable"
            && s.observed_generation == Some(3);
        complete.then_some(s)
    });
    let done = done.expect("the rollout completes");
    assert_eq!(
        (
            done.replicas,
            done.updated_replicas,
            done.available_replicas
        ),
        (Some(2), Some(2), Some(2))
    );
    assert!(
        most <= 3,
        "never more than replicas + maxSurge pods: {most}"
    );
    let port = bed.kubelet.port("fns", "web").unwrap();
    assert_eq!(get(port, "/version"), Some((200, "v3\n".into())));
}
