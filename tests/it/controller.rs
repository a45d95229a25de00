//! `kiln controller` against the stateful in-memory API server and a real registry, builds
//! ended by a stand-in (tests/common/fake_builds.rs) where the scenario is about the
//! controller's decisions; tests/controller_e2e.rs builds and runs for real.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::controller_env::{BUILDS, ControllerEnv, SYSTEM, node_function, write_yaml};
use common::fake_builds::{FakeBuilds, FakeRollouts, Outcome, job_arg};
use serde_json::{Value, json};

const HELLO: &str = "module.exports = { main: () => 'hello' }";

fn push(env: &ControllerEnv) -> Outcome {
    Outcome::Push {
        layout: env.tiny.layout.clone(),
        tag: "base".into(),
        digest: env.tiny.digest.clone(),
        creds: None,
    }
}

/// Waits until Function `name` in `team` is refused as invalid; the message.
fn refused(env: &ControllerEnv, name: &str) -> String {
    let invalid = Some("InvalidFunctionSpec");
    env.wait_condition("team", name, "ConfigurationReady", "False", invalid);
    env.condition("team", name, "ConfigurationReady").unwrap().2
}

fn containers(job: &Value) -> Vec<Value> {
    let spec = &job["spec"]["template"]["spec"];
    let mut all = spec["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    all.extend(spec["containers"].as_array().cloned().unwrap_or_default());
    all
}

fn mount_paths(c: &Value) -> Vec<String> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["mountPath"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_new_function_gets_its_source_config_map_and_a_restricted_split_build_job() {
    let env = ControllerEnv::start(&[]);
    env.create_function("team", &node_function("hello", HELLO, None));
    // JobCreated, then JobRunning once the Job is seen: either says the build is on.
    env.wait("the build Job", Duration::from_secs(60), || {
        env.condition("team", "hello", "BuildReady")
            .is_some_and(|(s, r, _)| s == "Unknown" && (r == "JobCreated" || r == "JobRunning"))
    });
    env.wait_condition("team", "hello", "ConfigurationReady", "True", None);
    let cms = env.build_objects("ConfigMap", "team", "hello");
    assert_eq!(cms.len(), 1);
    assert_eq!(cms[0]["data"]["source"], HELLO);
    assert_eq!(
        cms[0]["data"]["dependencies"], "{}",
        "an empty Node.js dependency list becomes {{}}"
    );
    let jobs = env.build_objects("Job", "team", "hello");
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert!(job["spec"]["activeDeadlineSeconds"].as_i64().is_some());
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let all = containers(job);
    assert_eq!(all.len(), 3, "lookup, deps, build");
    for c in &all {
        let s = &c["securityContext"];
        assert_eq!(
            (
                s["readOnlyRootFilesystem"].as_bool(),
                s["allowPrivilegeEscalation"].as_bool(),
                s["privileged"].as_bool()
            ),
            (Some(true), Some(false), Some(false)),
            "{c}"
        );
        assert_eq!(s["capabilities"]["drop"], json!(["ALL"]));
        assert!(
            c["image"].as_str().unwrap().ends_with(&env.tiny.digest),
            "the builder by digest: {}",
            c["image"]
        );
    }
    let (lookup, deps, build) = (&all[0], &all[1], &all[2]);
    let args = |c: &Value| {
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(args(deps).contains("--stage deps") && !args(deps).contains("--registry-auth"));
    assert!(
        !mount_paths(deps)
            .iter()
            .any(|p| p.starts_with("/kiln/registry")),
        "the install never sees the push credentials"
    );
    assert!(args(build).contains("--stage publish") && args(build).contains("--registry-auth"));
    // The shared dependency cache: the lookup (credentials, no install) writes what the
    // install and publish only read, and the key names the builder by digest.
    let cache = format!("{}/functions/kiln-cache", env.registry.host());
    assert!(
        args(lookup).contains("--stage lookup")
            && args(lookup).contains(&format!("--cache-repo {cache}"))
            && args(lookup).contains("--registry-auth"),
        "{}",
        args(lookup)
    );
    assert!(args(build).contains(&format!("--cache-repo {cache}")));
    assert!(!args(deps).contains("--cache-repo"));
    assert!(args(deps).contains(&format!(
        "--builder-image {}",
        lookup["image"].as_str().unwrap()
    )));
    let lookup_mount = |c: &Value| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "lookup")
            .map(|m| m["readOnly"].clone())
    };
    assert_eq!(lookup_mount(lookup), Some(json!(false)));
    assert_eq!(
        lookup_mount(deps),
        Some(json!(true)),
        "the install cannot write the lookup"
    );
    assert_eq!(lookup_mount(build), Some(json!(true)));
    let image = job_arg(&serde_json::from_value(job.clone()).unwrap(), "--image").unwrap();
    assert!(
        image.starts_with(&format!("{}/functions/team/hello:", env.registry.host())),
        "{image}"
    );
    // The Job runs in the build namespace, where the push Secret was copied for it to
    // mount; the Function's namespace never gets it.
    assert_eq!(job["metadata"]["namespace"], "kiln-builds");
    assert!(
        env.api
            .get("Secret", "kiln-builds", "kiln-registry")
            .is_some()
    );
    assert!(env.api.get("Secret", "team", "kiln-registry").is_none());
    let dir = tempfile::tempdir().unwrap();
    let file = write_yaml(dir.path(), "build.yaml", &[job.clone(), cms[0].clone()]);
    common::k8s_validate::validate_file(&file).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_finished_build_runs_by_digest_with_service_and_hpa_and_an_existing_image_is_not_rebuilt() {
    let env = ControllerEnv::start(&[]);
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(100), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    let yaml = node_function("hello", HELLO, None)
        + "  scaleConfig: {minReplicas: 1, maxReplicas: 3}\n  env: [{name: GREETING, value: hi}]\n";
    env.create_function("team", &yaml);
    env.wait_condition("team", "hello", "Running", "True", Some("DeploymentReady"));
    let f = env.function("team", "hello");
    let status = &f["status"];
    assert_eq!(status["digest"], env.tiny.digest.as_str());
    let repo = format!("{}/functions/team/hello", env.registry.host());
    assert_eq!(status["image"], format!("{repo}@{}", env.tiny.digest));
    assert_eq!(
        env.condition("team", "hello", "BuildReady").unwrap().1,
        "JobFinished"
    );
    assert_eq!(status["runtime"], "nodejs22");
    assert_eq!(status["functionResourceProfile"], "L");
    assert_eq!(status["buildResourceProfile"], "normal");
    assert!(
        status["podSelector"]
            .as_str()
            .unwrap()
            .contains("serverless.kyma-project.io/function-name=hello")
    );
    let deployment = env
        .api
        .get("Deployment", "team", "hello")
        .expect("a Deployment");
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], format!("{repo}@{}", env.tiny.digest));
    assert!(
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "GREETING" && e["value"] == "hi")
    );
    let service = env.api.get("Service", "team", "hello").expect("a Service");
    assert_eq!(
        service["spec"]["ports"][0],
        json!({"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"})
    );
    let hpa = env
        .api
        .get("HorizontalPodAutoscaler", "team", "hello")
        .expect("an HPA");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Function");
    // The Event of the last change may be written just after the condition.
    let reasons = || -> Vec<String> {
        env.api
            .list("Event.events.k8s.io")
            .into_iter()
            .filter(|e| e["regarding"]["name"] == "hello")
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect()
    };
    let wanted = ["JobCreated", "JobFinished", "DeploymentReady"];
    env.wait(
        "an Event per condition change",
        Duration::from_secs(10),
        || {
            let got = reasons();
            wanted.iter().all(|w| got.iter().any(|r| r == w))
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let file = write_yaml(dir.path(), "run.yaml", &[deployment, service, hpa]);
    common::k8s_validate::validate_file(&file).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(builds.stats().ended.len(), 1);

    // The same Function again: the controller's record has its image. (What the build
    // namespace held for it is swept; no owner reference can reach there.)
    env.api.delete("Function", "team", "hello");
    env.wait(
        "the children garbage-collected and the build swept",
        Duration::from_secs(20),
        || {
            env.api.get("Deployment", "team", "hello").is_none()
                && env.build_objects("Job", "team", "hello").is_empty()
                && env.build_objects("ConfigMap", "team", "hello").is_empty()
        },
    );
    assert!(
        env.api.get("ConfigMap", BUILDS, "team.hello").is_some(),
        "the record outlives the Function"
    );
    env.create_function("team", &yaml);
    env.wait_condition("team", "hello", "BuildReady", "True", Some("ImageFound"));
    env.wait_condition("team", "hello", "Running", "True", None);
    assert!(
        env.build_objects("Job", "team", "hello").is_empty(),
        "no Job for an image that exists"
    );
    assert_eq!(builds.stats().ended.len(), 1);
    // JSON logs: every line parses, each condition change is logged, and every line of
    // kiln's own that is not about the process itself names the Function.
    let log = std::fs::read_to_string(&env.log).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let changes: Vec<&str> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "condition changed")
        .filter_map(|l| l["fields"]["reason"].as_str())
        .collect();
    assert!(changes.contains(&"JobCreated") && changes.contains(&"DeploymentReady"));
    let process = ["kiln::controller::server", "kiln::controller::leader"];
    for line in lines.iter().filter(|l| {
        l["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("kiln::"))
            && !process.contains(&l["target"].as_str().unwrap())
            && l["fields"]["message"] != "SIGHUP: reconciling every Function"
    }) {
        let names = |o: &Value| o["namespace"] == "team" && o["function"] == "hello";
        assert!(names(&line["span"]) || names(&line["fields"]), "{line}");
    }
}

#[test]
fn a_failed_build_reports_why_and_runs_again_after_a_backoff() {
    let env = ControllerEnv::start(&[]);
    let failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(100), {
        let (outcome, failures) = (push(&env), failures.clone());
        move |_| {
            if failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                Outcome::Fail(
                    "installing dependencies: `npm install` failed (exit status: 1); \
                    last lines of its output:\nnpm error 404 Not Found - GET \
                    https://registry.npmjs.org/left-pad-nope"
                        .into(),
                )
            } else {
                outcome.clone()
            }
        }
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    env.create_function("team", &node_function("flaky", HELLO, None));
    env.wait_condition("team", "flaky", "BuildReady", "False", Some("JobFailed"));
    let (_, _, message) = env.condition("team", "flaky", "BuildReady").unwrap();
    assert!(
        message.contains("npm error 404 Not Found") && message.contains("re-run in 1s"),
        "{message}"
    );
    assert_eq!(env.function("team", "flaky")["status"]["failedBuilds"], 1);
    env.wait_condition("team", "flaky", "Running", "True", None);
    let ended = builds.stats().ended;
    assert_eq!(ended.len(), 2, "the failed build ran once more: {ended:?}");
    assert_eq!(ended[0], ended[1], "the same build key, the same Job name");
    assert!(
        env.function("team", "flaky")["status"]
            .get("failedBuilds")
            .is_none()
    );
}

#[test]
fn an_env_change_updates_the_deployment_and_a_source_change_builds_again() {
    let env = ControllerEnv::start(&[]);
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    env.create_function("team", &node_function("hello", HELLO, None));
    env.wait_condition("team", "hello", "Running", "True", None);
    let key = env.function("team", "hello")["status"]["buildKey"].clone();
    let first_job = env.build_objects("Job", "team", "hello")[0]["metadata"]["name"].clone();

    let mut f = env.function("team", "hello");
    f["spec"]["env"] = json!([{"name": "MODE", "value": "fast"}]);
    env.api.insert(f);
    env.wait(
        "the Deployment to get the new env",
        Duration::from_secs(30),
        || {
            env.api.get("Deployment", "team", "hello").is_some_and(|d| {
                d["spec"]["template"]["spec"]["containers"][0]["env"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|v| v["name"] == "MODE"))
            })
        },
    );
    env.wait_condition("team", "hello", "Running", "True", None);
    assert_eq!(
        env.function("team", "hello")["status"]["buildKey"],
        key,
        "env is not a build input"
    );
    assert_eq!(builds.stats().ended.len(), 1, "no build for an env change");

    let mut f = env.function("team", "hello");
    f["spec"]["source"]["inline"]["source"] = json!("module.exports = { main: () => 'bye' }");
    env.api.insert(f);
    env.wait("a second build", Duration::from_secs(30), || {
        builds.stats().ended.len() == 2
    });
    env.wait_condition("team", "hello", "Running", "True", None);
    assert_ne!(env.function("team", "hello")["status"]["buildKey"], key);
    let jobs = env.build_objects("Job", "team", "hello");
    assert_eq!(jobs.len(), 1, "the superseded Job is deleted");
    assert_ne!(jobs[0]["metadata"]["name"], first_job);
    assert_eq!(
        env.build_objects("ConfigMap", "team", "hello").len(),
        1,
        "and its ConfigMap"
    );
}

#[test]
fn hand_edits_to_what_kiln_sets_are_reverted_and_a_steady_state_writes_nothing() {
    let env = ControllerEnv::start(&[]);
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    env.create_function("team", &node_function("hello", HELLO, None));
    env.wait_condition("team", "hello", "Running", "True", None);
    let rendered = env.api.get("Deployment", "team", "hello").unwrap();
    let image = rendered["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    let label = "serverless.kyma-project.io/function-name";
    assert_eq!(rendered["metadata"]["labels"][label], "hello");

    // By hand, as `kubectl edit` would (a PUT: its manager takes over what it changed):
    // another image, more replicas, a label kiln sets removed, and another label added
    // (someone else's: it stays).
    let mut edited = rendered.clone();
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil.example.com/x:1");
    edited["spec"]["replicas"] = json!(7);
    let labels = edited["metadata"]["labels"].as_object_mut().unwrap();
    labels.remove(label);
    labels.insert("team.example.com/owner".into(), json!("ops"));
    // Unconditional (no resourceVersion): the rollout stand-in writes the status meanwhile.
    edited["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let by_hand = kube::api::PostParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(env.api.client(), "team");
    env.api.block_on(async {
        let edited = serde_json::from_value(edited).unwrap();
        deployments
            .replace("hello", &by_hand, &edited)
            .await
            .unwrap();
    });
    let mut service = env.api.get("Service", "team", "hello").unwrap();
    service["spec"]["ports"][0]["targetPort"] = json!(9090);
    service["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(env.api.client(), "team");
    env.api.block_on(async {
        let service = serde_json::from_value(service).unwrap();
        services.replace("hello", &by_hand, &service).await.unwrap();
    });
    let edited = env.api.get("Deployment", "team", "hello").unwrap();
    let owners: Vec<&str> = edited["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(owners.contains(&"kubectl-edit"), "{owners:?}");

    env.wait("the hand edits reverted", Duration::from_secs(30), || {
        let d = env.api.get("Deployment", "team", "hello").unwrap();
        let s = env.api.get("Service", "team", "hello").unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["image"] == image
            && d["spec"]["replicas"] == 1
            && d["metadata"]["labels"][label] == "hello"
            && s["spec"]["ports"][0]["targetPort"] == 8080
    });
    let d = env.api.get("Deployment", "team", "hello").unwrap();
    assert_eq!(d["metadata"]["labels"]["team.example.com/owner"], "ops");
    env.wait_condition("team", "hello", "Running", "True", None);

    // Settled: a pass over every Function writes nothing of kiln's.
    std::thread::sleep(Duration::from_millis(500));
    env.api.reset_requests();
    let before = env.metric("kiln_reconciles_total");
    env.hangup();
    env.wait("a reconcile after SIGHUP", Duration::from_secs(10), || {
        env.metric("kiln_reconciles_total") > before
    });
    std::thread::sleep(Duration::from_millis(500));
    let writes: Vec<String> = env
        .api
        .writes()
        .into_iter()
        .filter(|w| !w.path.ends_with("/status"))
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    assert!(
        writes.is_empty(),
        "a steady state writes nothing: {writes:?}"
    );
}

#[test]
fn builds_beyond_the_cap_wait_in_line() {
    let env = ControllerEnv::start(&["--max-build-jobs", "2"]);
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    // No build ends until the queue has been looked at, however slow the machine.
    builds.hold();
    let _rollouts = FakeRollouts::start(env.api.client());
    for name in ["one", "two", "three"] {
        env.create_function(
            "team",
            &node_function(
                name,
                &format!("module.exports = {{ main: () => '{name}' }}"),
                None,
            ),
        );
    }
    env.wait("one Function queued", Duration::from_secs(30), || {
        ["one", "two", "three"].iter().any(|n| {
            env.condition("team", n, "BuildReady")
                .is_some_and(|(_, r, _)| r == "JobQueued")
        })
    });
    // The second build's Job may still be on its way (its slot is reserved first).
    env.wait("two build Jobs", Duration::from_secs(30), || {
        env.api.list("Job").len() == 2
    });
    let queued = ["one", "two", "three"]
        .into_iter()
        .find(|n| {
            env.condition("team", n, "BuildReady")
                .is_some_and(|(_, r, _)| r == "JobQueued")
        })
        .unwrap();
    let (_, _, message) = env.condition("team", queued, "BuildReady").unwrap();
    assert!(message.contains("at most 2 builds"), "{message}");
    env.wait(
        "the queue depth in /metrics",
        Duration::from_secs(10),
        || env.metric("kiln_build_queue_depth") == 1.0,
    );
    assert_eq!(env.api.list("Job").len(), 2, "no third Job while two run");
    builds.release();
    for name in ["one", "two", "three"] {
        env.wait_condition("team", name, "Running", "True", None);
    }
    assert_eq!(builds.stats().max_active, 2);
}

#[test]
fn functions_deleted_or_made_invalid_while_queued_leave_the_queue_and_hold_no_build_back() {
    let env = ControllerEnv::start(&["--max-build-jobs", "2"]);
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    builds.hold();
    let _rollouts = FakeRollouts::start(env.api.client());
    let source = |name: &str| format!("module.exports = {{ main: () => '{name}' }}");
    for name in ["one", "two"] {
        env.create_function("team", &node_function(name, &source(name), None));
    }
    env.wait("two build Jobs", Duration::from_secs(30), || {
        env.api.list("Job").len() == 2
    });
    // More ghosts than build slots: queued, then deleted or made invalid.
    let ghosts = ["ghost-a", "ghost-b", "ghost-c"];
    for name in ghosts {
        env.create_function("team", &node_function(name, &source(name), None));
    }
    for name in ghosts {
        env.wait_condition("team", name, "BuildReady", "Unknown", Some("JobQueued"));
    }
    env.wait("three Functions queued", Duration::from_secs(10), || {
        env.metric("kiln_build_queue_depth") == 3.0
    });
    env.api.delete("Function", "team", "ghost-a");
    env.api.delete("Function", "team", "ghost-b");
    let mut invalid = env.function("team", "ghost-c");
    invalid["spec"]["runtime"] = json!("ruby3");
    env.api.insert(invalid);
    env.wait_condition(
        "team",
        "ghost-c",
        "ConfigurationReady",
        "False",
        Some("InvalidFunctionSpec"),
    );
    env.wait(
        "the ghosts to leave the queue",
        Duration::from_secs(10),
        || env.metric("kiln_build_queue_depth") == 0.0,
    );
    builds.release();
    for name in ["one", "two"] {
        env.wait_condition("team", name, "Running", "True", None);
    }
    // A newcomer builds: nobody is counted ahead of it.
    env.create_function("team", &node_function("late", &source("late"), None));
    env.wait_condition("team", "late", "Running", "True", None);
    assert!(
        env.api.list("Job").iter().all(|j| !j["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("ghost-")),
        "no ghost was built"
    );
}

#[test]
fn functions_are_built_for_the_nodes_platforms_or_those_their_annotation_names() {
    let env = ControllerEnv::start(&[]);
    // Two Nodes, as their kubelets label them: the controller lists them (RBAC: nodes list).
    for (name, arch) in [
        ("node-a", "arm64"),
        ("node-b", "amd64"),
        ("node-c", "arm64"),
    ] {
        env.api.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch, "kubernetes.io/hostname": name}},
        }));
    }
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let push = push(&env);
        move |_| push.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    let annotated = |name: &str, platforms: &str| {
        node_function(name, HELLO, None).replace(
            "metadata:\n",
            &format!("metadata:\n  annotations:\n    kiln.io/platforms: {platforms:?}\n"),
        )
    };
    env.create_function("team", &node_function("both", HELLO, None));
    env.create_function("team", &annotated("arm", "linux/arm64"));
    env.create_function("team", &annotated("bad", "linux/amd64,windows/amd64"));
    for name in ["both", "arm"] {
        env.wait_condition("team", name, "Running", "True", None);
    }
    let job = |name: &str| env.build_objects("Job", "team", name).remove(0);
    let platform_arg = |job: &Value| {
        let build = containers(job)
            .into_iter()
            .find(|c| c["name"] == "build")
            .unwrap();
        let args = build["args"].as_array().unwrap().clone();
        let at = args.iter().position(|a| a == "--platform").unwrap();
        args[at + 1].as_str().unwrap().to_string()
    };
    let selector = |pod: &Value| pod["nodeSelector"].clone();
    // By default, every Node's platform, sorted and each once: an index runs anywhere.
    let both = job("both");
    assert_eq!(platform_arg(&both), "linux/amd64,linux/arm64");
    // The build runs on a Node of the controller's platform, whose builder carries its kiln.
    let host = kiln::oci::Platform::host();
    assert_eq!(
        selector(&both["spec"]["template"]["spec"]),
        json!({"kubernetes.io/arch": host.architecture, "kubernetes.io/os": "linux"})
    );
    let deployment = env.api.get("Deployment", "team", "both").unwrap();
    assert_eq!(
        selector(&deployment["spec"]["template"]["spec"]),
        Value::Null
    );
    // One platform: the build and the Function run on its Nodes.
    let arm = job("arm");
    assert_eq!(platform_arg(&arm), "linux/arm64");
    let on_arm = json!({"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux"});
    assert_eq!(selector(&arm["spec"]["template"]["spec"]), on_arm);
    let deployment = env.api.get("Deployment", "team", "arm").unwrap();
    assert_eq!(selector(&deployment["spec"]["template"]["spec"]), on_arm);
    // The platforms are in the build key: the same code for other platforms is another image.
    let key =
        |job: &Value| job["metadata"]["labels"]["serverless.kyma-project.io/build-key"].clone();
    assert_ne!(key(&both), key(&arm));
    // An annotation that is no list of Linux platforms is refused, naming it.
    let message = refused(&env, "bad");
    assert!(
        message.contains("metadata.annotations[kiln.io/platforms]")
            && message.contains("windows/amd64 is not a Linux platform"),
        "{message}"
    );
}

#[test]
fn an_invalid_function_is_refused_with_the_field_named_and_never_built() {
    let env = ControllerEnv::start(&[]);
    let yaml = node_function("bad", HELLO, None).replace("runtime: nodejs22", "runtime: ruby3");
    env.create_function("team", &yaml);
    let message = refused(&env, "bad");
    assert!(
        message.contains("spec.runtime") && message.contains("nodejs22"),
        "{message}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(env.api.list("Job").is_empty());
}

/// A `runtimeImageOverride` on the platform's own registry that is not the namespace's own
/// image (another tenant's, here) is not built on: build Jobs would pull it with the
/// platform's credentials.
#[test]
fn an_override_naming_another_namespaces_image_on_the_platforms_registry_is_not_built() {
    let env = ControllerEnv::start(&[]);
    let victim = format!("{}/functions/victim/hello:1", env.registry.host());
    let yaml = node_function("thief", HELLO, None).replace(
        "runtime: nodejs22",
        &format!("runtime: nodejs22\n  runtimeImageOverride: {victim}"),
    );
    env.create_function("team", &yaml);
    env.wait_condition(
        "team",
        "thief",
        "BuildReady",
        "False",
        Some("ImageUnresolved"),
    );
    let message = env.condition("team", "thief", "BuildReady").unwrap().2;
    assert!(message.contains("platform's credentials"), "{message}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(env.api.list("Job").is_empty());
}

#[test]
fn with_knative_serving_a_cluster_local_knative_service_runs_the_image() {
    let env = ControllerEnv::start(&["--serving", "knative"]);
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    env.create_function("team", &node_function("kn", HELLO, None));
    env.wait("a Knative Service", Duration::from_secs(30), || {
        env.api
            .get("Service.serving.knative.dev", "team", "kn")
            .is_some()
    });
    let service = env
        .api
        .get("Service.serving.knative.dev", "team", "kn")
        .unwrap();
    assert_eq!(
        service["metadata"]["labels"]["networking.knative.dev/visibility"],
        "cluster-local"
    );
    let c = &service["spec"]["template"]["spec"]["containers"][0];
    assert!(c["image"].as_str().unwrap().ends_with(&env.tiny.digest));
    assert!(env.api.get("Deployment", "team", "kn").is_none());
    common::crd_schema::validate(
        &common::kiln::fixtures().join("knative/service-crd.yaml"),
        std::slice::from_ref(&service),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut ready = service;
    ready["status"] = json!({
        "conditions": [{"type": "Ready", "status": "True"}],
        "url": "http://kn.team.svc.cluster.local"
    });
    env.api.insert(ready);
    env.wait_condition("team", "kn", "Running", "True", Some("ServiceReady"));
    // The permissions of deploy/rbac.yaml that the end-to-end run (Deployments) leaves out.
    crate::controller_rbac::assert_used(&env.api, &crate::controller_rbac::elsewhere());
}

#[test]
fn five_hundred_functions_build_five_at_a_time_and_a_restart_and_a_resync_write_nothing() {
    let mut env = ControllerEnv::start(&["--resync", "0", "--workers", "16"]);
    let digest = env.tiny.digest.clone();
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(100), move |_| {
        Outcome::Report(digest.clone())
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    // Builds end only once five run: the limit is then seen whatever the machine's speed
    // (with builds ending as they come, a slow controller never has five out at once).
    builds.hold();
    for i in 0..500 {
        env.create_function(
            "bulk",
            &node_function(
                &format!("f{i:03}"),
                &format!("module.exports = {{ main: () => {i} }}"),
                None,
            ),
        );
    }
    env.wait("five build Jobs", Duration::from_secs(120), || {
        builds.stats().max_active >= 5
    });
    // Time for a sixth, were the limit not kept.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(builds.stats().max_active, 5, "five build Jobs at a time");
    builds.release();
    // Counting the builds first keeps the poll cheap until they are all done.
    env.wait("500 Functions running", Duration::from_secs(480), || {
        builds.stats().ended.len() == 500 && env.running() == 500
    });
    let stats = builds.stats();
    assert_eq!(stats.ended.len(), 500);
    assert_eq!(
        stats.max_active, 5,
        "never more than five build Jobs at a time"
    );
    // Steady state: a restarted controller reconciles every Function once (each of its 16
    // workers waiting for the caches to fill), again on SIGHUP, and writes nothing.
    std::thread::sleep(Duration::from_millis(500));
    env.spawn(&["--resync", "0", "--workers", "16"]);
    env.api.reset_requests();
    env.wait(
        "every Function reconciled after a restart",
        Duration::from_secs(120),
        || env.metric("kiln_reconciles_total") >= 500.0,
    );
    env.hangup();
    env.wait(
        "every Function reconciled again on SIGHUP",
        Duration::from_secs(120),
        || env.metric("kiln_reconciles_total") >= 1000.0,
    );
    let writes = env.api.writes();
    assert!(
        writes.is_empty(),
        "a steady-state resync wrote: {:?}",
        writes
            .iter()
            .take(5)
            .map(|w| format!("{} {}", w.method, w.path))
            .collect::<Vec<_>>()
    );
    assert_eq!(env.running(), 500);
}

#[test]
fn a_git_function_builds_its_resolved_commit_and_a_new_commit_builds_again() {
    use common::git::{GitServer, GitServerKind, Repo};
    let env = ControllerEnv::start(&[]);
    let server = GitServer::start(GitServerKind::Plain);
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    repo.write("fn/handler.js", b"module.exports = { main: () => 'v1' };\n");
    repo.write("fn/package.json", b"{}\n");
    let first = repo.commit("v1");
    let branch = repo
        .git(&["rev-parse", "--abbrev-ref", "HEAD"])
        .trim()
        .to_string();
    repo.publish(&server.root(), "fns");
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    let manifest = json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
        "metadata": {
            "name": "from-git",
            "annotations": {"serverless.kyma-project.io/continuousGitCheckout": "true"}
        },
        "spec": {
            "runtime": "nodejs22",
            "source": {"gitRepository": {
                "url": server.url("fns"),
                "baseDir": "/fn",
                "reference": branch
            }}
        },
    });
    env.create_function("team", &serde_yaml::to_string(&manifest).unwrap());
    env.wait_condition("team", "from-git", "Running", "True", None);
    let status = env.function("team", "from-git")["status"].clone();
    assert_eq!(status["commit"], first.as_str());
    assert_eq!(
        (status["baseDir"].as_str(), status["reference"].as_str()),
        (Some("/fn"), Some(branch.as_str()))
    );
    // The first init container fetches the commit; the others build what it fetched.
    let source_arg = |job: &Value, flag: &str| {
        let inits = job["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .unwrap();
        assert_eq!(inits[0]["name"], "source");
        let args = inits[0]["args"].as_array().unwrap();
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1).and_then(Value::as_str).map(str::to_string)
    };
    let job = env.build_objects("Job", "team", "from-git")[0].clone();
    assert_eq!(
        source_arg(&job, "--git").as_deref(),
        Some(server.url("fns").as_str())
    );
    assert_eq!(
        source_arg(&job, "--git-ref").as_deref(),
        Some(first.as_str()),
        "the Job builds the commit, not the branch"
    );
    assert_eq!(source_arg(&job, "--git-base-dir").as_deref(), Some("/fn"));
    let typed: k8s_openapi::api::batch::v1::Job = serde_json::from_value(job).unwrap();
    assert_eq!(job_arg(&typed, "--git"), None, "only `source` fetches");

    repo.write("fn/handler.js", b"module.exports = { main: () => 'v2' };\n");
    let second = repo.commit("v2");
    repo.git(&[
        "push",
        "-q",
        "--mirror",
        server.root().join("fns.git").to_str().unwrap(),
    ]);
    env.wait("the new commit", Duration::from_secs(30), || {
        env.function("team", "from-git")["status"]["commit"] == second.as_str()
    });
    env.wait_condition("team", "from-git", "Running", "True", None);
    let jobs = env.build_objects("Job", "team", "from-git");
    assert_eq!(
        source_arg(&jobs[0], "--git-ref").as_deref(),
        Some(second.as_str())
    );
}

/// Kyma's `auth.type: key`: the controller resolves the reference over SSH with the Secret's
/// key (through OpenSSH's `ssh`, as the build Job's `source` container fetches), the Job gets
/// the Secret's copy, the status says when the host key was not verified, and a key the server
/// refuses fails the source with OpenSSH's words and no key material.
#[test]
fn an_ssh_git_function_resolves_with_the_secrets_key_and_says_when_the_host_is_unverified() {
    use base64::Engine as _;
    use common::git::Repo;
    use common::sshd::SshServer;
    let env = ControllerEnv::start(&[]);
    let sshd = SshServer::start();
    let work = tempfile::tempdir().unwrap();
    let repo = Repo::init(&work.path().join("src"));
    repo.write(
        "fn/handler.js",
        b"module.exports = { main: () => 'ssh' };\n",
    );
    let commit = repo.commit("ssh");
    repo.publish(work.path(), "fns");
    let url = sshd.url(&work.path().join("fns.git"));
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    for (name, key) in [("git-key", sshd.key()), ("git-wrong-key", sshd.other_key())] {
        env.api.insert(
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": "team"},
            "data": {"key": b64(&key)}}),
        );
    }
    let function = |name: &str, secret: &str| {
        let doc = json!({
            "apiVersion": "serverless.kyma-project.io/v1alpha2", "kind": "Function",
            "metadata": {"name": name},
            "spec": {"runtime": "nodejs22", "source": {"gitRepository": {
                "url": url, "baseDir": "/fn", "reference": "HEAD",
                "auth": {"type": "key", "secretName": secret}}}},
        });
        serde_yaml::to_string(&doc).unwrap()
    };
    env.create_function("team", &function("over-ssh", "git-key"));
    env.wait_condition("team", "over-ssh", "Running", "True", None);
    let status = env.function("team", "over-ssh")["status"].clone();
    assert_eq!(status["commit"], commit.as_str(), "{}", sshd.log());
    let (_, reason, message) = env
        .condition("team", "over-ssh", "ConfigurationReady")
        .unwrap();
    assert_eq!(reason, "SourceUpdated");
    assert!(
        message.contains("the SSH host key was not verified") && message.contains("git-key"),
        "{message}"
    );
    let job = env.build_objects("Job", "team", "over-ssh")[0].clone();
    let source = &job["spec"]["template"]["spec"]["initContainers"][0];
    let args = source["args"].to_string();
    assert!(
        args.contains(&url) && args.contains("--git-auth-dir"),
        "{args}"
    );
    let copies = env.build_objects("Secret", "team", "over-ssh");
    assert!(
        copies.iter().any(|s| s["data"]["key"] == b64(&sshd.key())),
        "the Job's copy of the Secret holds the key"
    );

    env.create_function("team", &function("wrong-key", "git-wrong-key"));
    env.wait_condition("team", "wrong-key", "ConfigurationReady", "False", None);
    let (_, reason, message) = env
        .condition("team", "wrong-key", "ConfigurationReady")
        .unwrap();
    assert_eq!(reason, "SourceUpdateFailed");
    assert!(
        message.contains("refused the SSH key") && message.contains("Permission denied"),
        "{message}"
    );
    let status = env.function("team", "wrong-key")["status"].to_string();
    let secret_line = sshd.other_key().lines().nth(1).unwrap().to_string();
    assert!(!status.contains(&secret_line), "{status}");
}

#[test]
fn of_two_replicas_one_leads_and_the_other_takes_over_when_it_stops() {
    let lease = [
        "--leader-lease",
        "kiln-controller",
        "--leader-lease-duration",
        "2",
    ];
    let mut env = ControllerEnv::start(&lease);
    let holder = |env: &ControllerEnv| {
        let lease = env.api.get("Lease", SYSTEM, "kiln-controller")?;
        Some((
            lease["spec"]["holderIdentity"].as_str()?.to_string(),
            lease["spec"]["leaseTransitions"].as_i64()?,
        ))
    };
    env.wait("controller-a to lead", Duration::from_secs(30), || {
        holder(&env).is_some_and(|(who, _)| who == "controller-a")
    });
    let second = env.spawn_second(&lease);
    env.wait(
        "the second replica to serve",
        Duration::from_secs(30),
        || second.readyz() != 0,
    );
    let _builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let outcome = push(&env);
        move |_| outcome.clone()
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    env.create_function("team", &node_function("one", HELLO, None));
    env.wait_condition("team", "one", "Running", "True", None);
    // The standby waits for the Lease, ready to take over: Ready (so that a Deployment of
    // two replicas becomes Available and rolls out), not leading, and it has reconciled
    // nothing.
    assert_eq!(second.readyz(), 200, "{}", second.log());
    assert_eq!(second.metric("kiln_leader"), 0.0);
    assert_eq!(env.metric("kiln_leader"), 1.0);
    assert_eq!(second.metric("kiln_reconciles_total"), 0.0);
    assert_eq!(holder(&env), Some(("controller-a".into(), 0)));

    // The leader dies without giving the Lease back; once it expires the standby leads.
    env.stop();
    env.wait("controller-b to take over", Duration::from_secs(30), || {
        holder(&env).is_some_and(|(who, _)| who == "controller-b")
    });
    assert_eq!(holder(&env), Some(("controller-b".into(), 1)));
    env.wait("the new leader to lead", Duration::from_secs(30), || {
        second.metric("kiln_leader") == 1.0
    });
    assert_eq!(second.readyz(), 200);
    env.create_function(
        "team",
        &node_function("two", "module.exports = { main: () => 2 }", None),
    );
    env.wait_condition("team", "two", "Running", "True", None);
    assert!(second.metric("kiln_reconciles_total") > 0.0);
}

#[tokio::test]
async fn a_pass_that_races_its_own_previous_status_write_leaves_one_condition_of_each_type() {
    use kiln::controller::conditions::{Kind, State};
    use kiln::controller::crd::Function;
    use kiln::controller::status::{Working, Written};
    use kube::runtime::events::{Recorder, Reporter};

    let api = common::kube_api::KubeApi::start();
    let mut f: Value = serde_yaml::from_str(&node_function("hello", HELLO, None)).unwrap();
    f["metadata"]["namespace"] = json!("team");
    f["status"] = json!({"conditions": [{
        "type": "ConfigurationReady",
        "status": "True",
        "reason": "ConfigMapCreated"
    }]});
    api.insert(f);
    let client = api.client();
    let functions: kube::Api<Function> = kube::Api::namespaced(client.clone(), "team");
    let cached = functions.get("hello").await.unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test".into(),
            instance: None,
        },
    );
    let pass = || {
        let mut st = Working::new(&cached);
        st.set(
            Kind::BuildReady,
            State::Unknown,
            "JobCreated",
            "Job created",
        );
        st
    };
    let first = pass().write(&client, &recorder, &cached).await.unwrap();
    assert_eq!(first, Written::Written);
    // The next pass still reads the Function as it was before that write.
    let second = pass().write(&client, &recorder, &cached).await.unwrap();
    assert_eq!(second, Written::Stale);
    let live = api.get("Function", "team", "hello").unwrap();
    let types: Vec<&str> = live["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["ConfigurationReady", "BuildReady"], "{live}");
    // On the fresh Function the same pass changes nothing, so it writes nothing.
    let fresh = functions.get("hello").await.unwrap();
    let mut st = Working::new(&fresh);
    st.set(
        Kind::BuildReady,
        State::Unknown,
        "JobCreated",
        "Job created",
    );
    assert_eq!(
        st.write(&client, &recorder, &fresh).await.unwrap(),
        Written::Unchanged
    );
}

#[test]
fn with_require_provenance_only_an_image_whose_signed_provenance_names_its_build_runs() {
    use base64::Engine as _;
    let env = ControllerEnv::start(&[
        "--image-signing-secret",
        "kiln-image-signing",
        "--require-provenance",
    ]);
    let work = tempfile::tempdir().unwrap();
    let keys = work.path();
    let script = common::kiln::fixtures().join("cosign/check.py");
    let made = std::process::Command::new("python3")
        .arg(script)
        .args(["keys", keys.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(made.success());
    let read = |name: &str| std::fs::read_to_string(keys.join(name)).unwrap();
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    env.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "kiln-image-signing", "namespace": SYSTEM},
        "data": {"cosign.key": b64(&read("a.key")), "cosign.pub": b64(&read("a.pub")),
                 "cosign.password": ""},
    }));
    let registry = env.registry.host();
    // The honest build signs with the platform's key; one signs with another key; one's
    // provenance is the platform key's, but for another Function's build.
    let builds = FakeBuilds::start(env.api.client(), Duration::from_millis(50), {
        let push = push(&env);
        let keys = keys.to_path_buf();
        move |job| {
            let name =
                job.metadata.labels.as_ref().unwrap()["serverless.kyma-project.io/function-name"]
                    .clone();
            let (key, pushed_as) = match name.as_str() {
                "honest" => ("a.key", None),
                "other-key" => ("b.key", None),
                _ => ("a.key", Some(format!("{registry}/functions/team/honest:1"))),
            };
            Outcome::Signed {
                push: Box::new(push.clone()),
                key: keys.join(key),
                pushed_as,
            }
        }
    });
    let _rollouts = FakeRollouts::start(env.api.client());
    for name in ["honest", "other-key", "borrowed"] {
        env.create_function("team", &node_function(name, HELLO, None));
    }
    env.wait_condition("team", "honest", "Running", "True", None);
    let jobs = env.build_objects("Job", "team", "honest");
    let all = containers(&jobs[0]);
    for c in &all {
        let signs = c["name"] == "build";
        assert_eq!(
            mount_paths(c).contains(&"/kiln/image-key".to_string()),
            signs,
            "only the pushing container mounts the signing key: {c}"
        );
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            args.windows(2)
                .any(|w| w == ["--sign-key", "/kiln/image-key/cosign.key"]),
            signs
        );
    }
    let build = all.iter().find(|c| c["name"] == "build").unwrap();
    assert_eq!(
        build["env"][0],
        json!({"name": "COSIGN_PASSWORD", "valueFrom": {"secretKeyRef":
            {"name": "kiln-image-signing", "key": "cosign.password", "optional": true}}})
    );
    let volume = jobs[0]["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "image-sign")
        .unwrap()
        .clone();
    assert_eq!(
        volume["secret"]["items"],
        json!([{"key": "cosign.key", "path": "cosign.key"}]),
        "the private key alone: {volume}"
    );
    assert!(
        env.api
            .get("Secret", BUILDS, "kiln-image-signing")
            .is_some(),
        "the signing Secret is copied where the Jobs run"
    );
    for (name, why) in [
        ("other-key", "no signature of"),
        ("borrowed", "a provenance of a build pushed as"),
    ] {
        env.wait_condition(
            "team",
            name,
            "BuildReady",
            "False",
            Some("ProvenanceInvalid"),
        );
        let (_, _, message) = env.condition("team", name, "BuildReady").unwrap();
        assert!(message.contains(why), "{name}: {message}");
        assert!(
            env.api.get("Deployment", "team", name).is_none(),
            "{name} is not deployed"
        );
    }
    // An image built before is checked again when it is taken again: an edit, its attestations
    // emptied meanwhile, and the revert. The revert's image is not deployed as recorded but
    // built again, and that build's provenance lets it run.
    let jobs_ended = || {
        builds
            .stats()
            .ended
            .iter()
            .filter(|j| j.contains("honest"))
            .count()
    };
    let before = jobs_ended();
    let first = env.function("team", "honest")["status"].clone();
    let edit = |source: &str| {
        let mut f = env.function("team", "honest");
        f["spec"]["source"]["inline"]["source"] = json!(source);
        env.api.insert(f);
    };
    edit("module.exports = { main: () => 'edited' }");
    env.wait("the edit's build", Duration::from_secs(60), || {
        jobs_ended() == before + 1
            && env.function("team", "honest")["status"]["buildKey"] != first["buildKey"]
    });
    env.wait_condition("team", "honest", "Running", "True", None);
    let repo = "functions/team/honest";
    let digest = first["digest"].as_str().unwrap();
    let stripped = std::process::Command::new("python3")
        .arg(common::kiln::fixtures().join("cosign/check.py"))
        .args(["strip", &env.registry.host(), repo, digest])
        .status()
        .unwrap();
    assert!(stripped.success());
    edit(HELLO);
    env.wait("the revert's build", Duration::from_secs(60), || {
        jobs_ended() == before + 2
    });
    // The revert's image was refused as recorded, built again, and then runs: the rebuild's
    // provenance (the build found its image and added one) is what lets it.
    env.wait(
        "the revert built and running",
        Duration::from_secs(60),
        || {
            env.condition("team", "honest", "BuildReady")
                .is_some_and(|(s, _, _)| s == "True")
                && env
                    .condition("team", "honest", "Running")
                    .is_some_and(|(s, _, _)| s == "True")
                && env.function("team", "honest")["status"]["buildKey"] == first["buildKey"]
        },
    );
    let log = std::fs::read_to_string(&env.log).unwrap();
    assert!(
        log.contains("not deploying the image built before"),
        "the recorded image was deployed without its provenance"
    );
    let status = env.function("team", "honest")["status"].clone();
    assert_eq!(status["buildKey"], first["buildKey"]);
}
