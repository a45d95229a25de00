//! The test kubelet runs Jobs for real: each container a `kiln run` of a busybox image pulled
//! from a real docker-registry on loopback, with init containers, a shared emptyDir,
//! ConfigMap and Secret files and env, the securityContext's user, the service-account
//! token, termination messages, exit codes, deadlines and the Job slot limit; and it refuses
//! what it does not implement, naming the field.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kubelet;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStateTerminated, Pod, Secret};
use kubelet::testbed::{Testbed, container, with};
use kubelet::{Objects, env};
use serde_json::{Value, json};

const SA_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
const WAIT: Duration = Duration::from_secs(60);

/// A Job `name` in namespace `fns` whose pod runs `containers` (init containers first when
/// given) with the build Job's security context; `extra` is merged into the pod spec.
fn job(name: &str, init: Value, containers: Value, extra: Value) -> Job {
    let mut spec = json!({
        "restartPolicy": "Never",
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": init,
        "containers": containers,
        "terminationGracePeriodSeconds": 1,
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "fns", "uid": format!("uid-{name}")},
        "spec": {"backoffLimit": 0, "template": {"spec": spec}},
    }))
    .unwrap()
}

fn objects() -> Objects {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "fn-src", "namespace": "fns"},
        "data": {"source": "module.exports = 1\n", "dependencies": "{}"},
    }))
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds", "namespace": "fns"},
        "data": {"token": common::base64(b"s3cret")},
        "stringData": {"user": "builder"},
    }))
    .unwrap();
    let mut objects = Objects::default();
    objects.add_config_map(&cm);
    objects.add_secret(&secret);
    objects
}

fn terminated(pod: &Pod, container: &str) -> ContainerStateTerminated {
    let status = pod.status.clone().unwrap();
    let all = status.init_container_statuses.into_iter().flatten();
    let all = all.chain(status.container_statuses.into_iter().flatten());
    let c = all.into_iter().find(|c| c.name == container).unwrap();
    c.state
        .unwrap()
        .terminated
        .unwrap_or_else(|| panic!("{container} has not terminated"))
}

fn condition(status: &JobStatus, kind: &str) -> (String, String) {
    let c = status.conditions.iter().flatten().find(|c| c.type_ == kind);
    let c = c.unwrap_or_else(|| panic!("no {kind} condition: {status:?}"));
    (c.status.clone(), c.reason.clone().unwrap_or_default())
}

#[test]
fn a_job_runs_its_init_container_then_its_container_sharing_files_env_and_user() {
    let bed = Testbed::new(5);
    bed.kubelet.set_objects(objects());
    let init = container(
        "deps",
        &bed.image,
        "busybox id -u > /work/uid; busybox id -g >> /work/uid; echo '$(GREETING)' > \
            /work/greeting; \
         busybox cp /src/handler.js /work/",
    );
    let init = with(
        init,
        json!({
            "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hello-$(POD)-$$(POD)"}],
            "volumeMounts": [{"name": "work", "mountPath": "/work"},
                             {
                                 "name": "src",
                                 "mountPath": "/src/handler.js",
                                 "subPath": "handler.js"
                             }],
        }),
    );
    let main = container(
        "publish",
        &bed.image,
        "busybox cat /work/uid /work/greeting /work/handler.js; echo \"$TOKEN $USER_NAME\"; \
         busybox grep -E '^(NoNewPrivs|CapEff)' /proc/self/status; \
         if busybox touch /x 2>/dev/null; then echo root-rw; else echo root-ro; fi; \
         busybox cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo; \
         echo -n registry/fn@sha256:abc > /dev/termination-log",
    );
    let main = with(
        main,
        json!({
            "env": [{
                "name": "TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}
            },
                    {
                        "name": "USER_NAME",
                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}
                    },
                    {
                        "name": "GONE",
                        "valueFrom": {"configMapKeyRef": {
                            "name": "nope",
                            "key": "x",
                            "optional": true
                        }}
                    }],
            "volumeMounts": [{"name": "work", "mountPath": "/work", "readOnly": true}],
        }),
    );
    let volumes = json!({"volumes": [
        {"name": "work", "emptyDir": {}},
        {
            "name": "src",
            "configMap": {"name": "fn-src", "items": [{"key": "source", "path": "handler.js"}]}
        },
    ]});
    let job = job("build", json!([init]), json!([main]), volumes);
    bed.kubelet.start_job(&job).unwrap();
    let status = bed.kubelet.wait_job("fns", "build", WAIT);
    let pod = bed.kubelet.job_pod("fns", "build").unwrap();
    let name = pod.metadata.name.clone().unwrap();
    let logs = bed.kubelet.all_logs("fns", Some(&pod));
    assert_eq!(status.succeeded, Some(1), "{status:?}\n{logs}");
    assert_eq!(
        condition(&status, "Complete"),
        ("True".into(), "CompletionsReached".into())
    );
    assert_eq!(
        condition(&status, "SuccessCriteriaMet").1,
        "CompletionsReached"
    );
    assert!(status.completion_time.is_some() && status.active.is_none());
    let expected = format!(
        "10001\n10001\nhello-{name}-$(POD)\nmodule.exports = 1\ns3cret builder\n\
         CapEff:\t0000000000000000\nNoNewPrivs:\t1\nroot-ro\n{}\n",
        bed.kubelet.service_account_token()
    );
    assert_eq!(
        bed.kubelet.logs("fns", &name, "publish"),
        expected,
        "{logs}"
    );
    let main = terminated(&pod, "publish");
    assert_eq!(
        (main.exit_code, main.reason.as_deref()),
        (0, Some("Completed"))
    );
    assert_eq!(main.message.as_deref(), Some("registry/fn@sha256:abc"));
    assert_eq!(terminated(&pod, "deps").exit_code, 0);
    let meta = &pod.metadata;
    assert!(
        name.starts_with("build-") && name.len() == "build-".len() + 5,
        "{name}"
    );
    let labels = meta.labels.clone().unwrap();
    for (k, v) in [
        ("job-name", "build"),
        ("batch.kubernetes.io/job-name", "build"),
        ("controller-uid", "uid-build"),
        ("batch.kubernetes.io/controller-uid", "uid-build"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{labels:?}");
    }
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Job", "uid-build", Some(true))
    );
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Succeeded"));
}

#[test]
fn without_automount_the_pod_has_no_service_account_token_anywhere() {
    let bed = Testbed::new(5);
    let script = format!(
        "if [ -e {SA_TOKEN} ]; then echo token-present; else echo token-absent; fi; \
         busybox grep -rl {} /etc /var /run /tmp /home /bin 2>/dev/null; echo searched",
        bed.kubelet.service_account_token()
    );
    let job = job(
        "nosa",
        json!([]),
        json!([container("c", &bed.image, &script)]),
        json!({"automountServiceAccountToken": false}),
    );
    bed.kubelet.start_job(&job).unwrap();
    let status = bed.kubelet.wait_job("fns", "nosa", WAIT);
    let pod = bed.kubelet.job_pod("fns", "nosa").unwrap();
    let logs = bed
        .kubelet
        .logs("fns", pod.metadata.name.as_deref().unwrap(), "c");
    assert_eq!(status.succeeded, Some(1), "{logs}");
    assert_eq!(logs, "token-absent\nsearched\n");
}

#[test]
fn a_failing_container_fails_the_job_with_its_exit_code_and_message() {
    let bed = Testbed::new(5);
    let fallback = with(
        container(
            "c",
            &bed.image,
            "echo first; echo npm ERR! 404 left-pad >&2; exit 3",
        ),
        json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
    );
    bed.kubelet
        .start_job(&job("logs", json!([]), json!([fallback]), json!({})))
        .unwrap();
    let written = container(
        "c",
        &bed.image,
        "echo -n 'build failed: no space' > /dev/termination-log; exit 1",
    );
    let written = with(
        written,
        json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
    );
    bed.kubelet
        .start_job(&job("file", json!([]), json!([written]), json!({})))
        .unwrap();
    let failing_init = container("deps", &bed.image, "exit 7");
    let never = container("publish", &bed.image, "echo must-not-run");
    bed.kubelet
        .start_job(&job(
            "init",
            json!([failing_init]),
            json!([never]),
            json!({}),
        ))
        .unwrap();

    for (name, code, message) in [
        ("logs", 3, Some("first\nnpm ERR! 404 left-pad\n")),
        ("file", 1, Some("build failed: no space")),
    ] {
        let status = bed.kubelet.wait_job("fns", name, WAIT);
        assert_eq!(status.failed, Some(1), "{status:?}");
        assert_eq!(
            condition(&status, "Failed"),
            ("True".into(), "BackoffLimitExceeded".into())
        );
        assert_eq!(
            condition(&status, "FailureTarget").1,
            "BackoffLimitExceeded"
        );
        let pod = bed.kubelet.job_pod("fns", name).unwrap();
        let c = terminated(&pod, "c");
        assert_eq!(
            (c.exit_code, c.reason.as_deref(), c.message.as_deref()),
            (code, Some("Error"), message)
        );
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Failed"));
    }
    let status = bed.kubelet.wait_job("fns", "init", WAIT);
    assert_eq!(status.failed, Some(1));
    let pod = bed.kubelet.job_pod("fns", "init").unwrap();
    assert_eq!(terminated(&pod, "deps").exit_code, 7);
    let main = &pod.status.unwrap().container_statuses.unwrap()[0];
    let waiting = main.state.clone().unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
    assert_eq!(
        bed.kubelet
            .logs("fns", pod.metadata.name.as_deref().unwrap(), "publish"),
        ""
    );
}

#[test]
fn active_deadline_seconds_kills_the_pod_and_fails_the_job_with_deadline_exceeded() {
    let bed = Testbed::new(5);
    let mut job = job(
        "slow",
        json!([]),
        json!([container("c", &bed.image, "busybox sleep 60")]),
        json!({}),
    );
    job.spec.as_mut().unwrap().active_deadline_seconds = Some(2);
    let started = Instant::now();
    bed.kubelet.start_job(&job).unwrap();
    let status = bed.kubelet.wait_job("fns", "slow", WAIT);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(
        condition(&status, "Failed"),
        ("True".into(), "DeadlineExceeded".into())
    );
    let pod = bed.kubelet.job_pod("fns", "slow").unwrap();
    assert_ne!(terminated(&pod, "c").exit_code, 0);
    assert_eq!(
        pod.status.unwrap().reason.as_deref(),
        Some("DeadlineExceeded")
    );
}

#[test]
fn a_missing_config_map_keeps_the_container_waiting_until_it_exists() {
    let bed = Testbed::new(5);
    let c = with(
        container("c", &bed.image, "echo $V"),
        json!({"env": [
        {"name": "V", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "v"}}}]}),
    );
    bed.kubelet
        .start_job(&job("waits", json!([]), json!([c]), json!({})))
        .unwrap();
    let waiting = bed.kubelet.wait_for(WAIT, |k| {
        let pod = k.job_pod("fns", "waits")?;
        let state = pod.status?.container_statuses?.first()?.state.clone()?;
        state
            .waiting
            .filter(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
    });
    assert_eq!(
        waiting.unwrap().message.as_deref(),
        Some("configmap \"late\" not found")
    );
    assert!(bed.kubelet.job_status("fns", "waits").unwrap().active == Some(1));
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "late", "namespace": "fns"}, "data": {"v": "arrived"}}))
    .unwrap();
    let mut objects = Objects::default();
    objects.add_config_map(&cm);
    bed.kubelet.set_objects(objects);
    assert_eq!(
        bed.kubelet.wait_job("fns", "waits", WAIT).succeeded,
        Some(1)
    );
    let pod = bed.kubelet.job_pod("fns", "waits").unwrap();
    assert_eq!(
        bed.kubelet
            .logs("fns", pod.metadata.name.as_deref().unwrap(), "c"),
        "arrived\n"
    );
}

#[test]
fn run_as_non_root_with_uid_0_never_starts_the_container() {
    let bed = Testbed::new(5);
    let c = with(
        container("c", &bed.image, "echo ran"),
        json!({"securityContext": {
        "runAsUser": 0, "runAsNonRoot": true, "readOnlyRootFilesystem": true}}),
    );
    bed.kubelet
        .start_job(&job("root", json!([]), json!([c]), json!({})))
        .unwrap();
    let waiting = bed.kubelet.wait_for(WAIT, |k| {
        let state = k
            .job_pod("fns", "root")?
            .status?
            .container_statuses?
            .first()?
            .state
            .clone()?;
        state
            .waiting
            .filter(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
    });
    let message = waiting.unwrap().message.unwrap();
    assert!(
        message.contains("runAsUser breaks non-root policy"),
        "{message}"
    );
}

#[test]
fn jobs_beyond_the_slot_limit_stay_pending_until_a_slot_frees() {
    let bed = Testbed::new(1);
    for name in ["first", "second"] {
        let c = container("c", &bed.image, "busybox sleep 1");
        bed.kubelet
            .start_job(&job(name, json!([]), json!([c]), json!({})))
            .unwrap();
    }
    let pending = bed.kubelet.wait_for(WAIT, |k| {
        let running: Vec<&str> = ["first", "second"]
            .into_iter()
            .filter(|n| {
                k.job_pod("fns", n).and_then(|p| p.status?.phase).as_deref() == Some("Running")
            })
            .collect();
        (running.len() == 1).then(|| {
            if running[0] == "first" {
                "second"
            } else {
                "first"
            }
        })
    });
    let pod = bed.kubelet.job_pod("fns", pending.unwrap()).unwrap();
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let scheduled = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        (scheduled.status.as_str(), scheduled.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    for name in ["first", "second"] {
        assert_eq!(bed.kubelet.wait_job("fns", name, WAIT).succeeded, Some(1));
    }
}

#[test]
fn env_values_expand_like_kubernetes() {
    let vars = [("A", "1"), ("B", "two")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
    let cases = [
        ("$(A)-$(B)", "1-two"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("$A $", "$A $"),
        ("x$(A", "x$(A"),
        ("$$$(A)", "$1"),
    ];
    for (input, want) in cases {
        assert_eq!(env::expand(input, &vars), want, "{input}");
    }
}
