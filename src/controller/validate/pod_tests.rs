//! Rules for what goes onto the Pod: env, secretMounts, labels, annotations.

use serde_json::{Value, json};

use super::MAX_ANNOTATIONS_BYTES;
use super::tests::{only_error, valid, verdict};

fn env(vars: Value) -> impl FnOnce(&mut Value) {
    move |f| f["spec"]["env"] = vars
}

#[test]
fn env_names_must_be_valid_unique_and_not_reserved() {
    let v = verdict(env(json!([{"name": "A"}, {"name": "B"}, {"name": "1BAD"}])));
    let msg = only_error(
        &v,
        "spec.env[2].name",
        "not a valid environment variable name",
    );
    assert!(
        msg.starts_with("spec.env[2].name: \"1BAD\" is not"),
        "{msg}"
    );
    let v = verdict(env(json!([{"name": "A"}, {"name": "A", "value": "x"}])));
    only_error(&v, "spec.env[1].name", "already set by spec.env[0]");
    let v = verdict(env(json!([{"name": "FUNC_PORT", "value": "1"}])));
    only_error(&v, "spec.env[0].name", "reserved");
    // What the runtime contract fixes in the container, beyond Kyma's own list.
    for name in ["FUNC_NAME", "SERVICE_NAMESPACE"] {
        let v = verdict(env(json!([{"name": name, "value": "x"}])));
        let msg = only_error(&v, "spec.env[0].name", "reserved: the runtime sets it");
        assert!(msg.contains("FUNC_NAME, SERVICE_NAMESPACE"), "{msg}");
    }
    // What a Function may tune stays allowed.
    valid(&verdict(env(json!([
        {"name": "FUNC_TIMEOUT", "value": "5"},
        {"name": "REQ_MB_LIMIT", "value": "2"},
        {"name": "PUBLISHER_PROXY_ADDRESS", "value": "http://p"}
    ]))));
    valid(&verdict(env(
        json!([{"name": "my.env-name", "value": "1"}]),
    )));
}

#[test]
fn value_from_needs_exactly_one_complete_source() {
    let two = json!([{"name": "A", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"},
        "configMapKeyRef": {"name": "c", "key": "k"}}}]);
    only_error(&verdict(env(two)), "spec.env[0].valueFrom", "exactly one");
    let none = json!([{"name": "A", "valueFrom": {}}]);
    only_error(&verdict(env(none)), "spec.env[0].valueFrom", "(it has 0)");
    let both = json!([{
        "name": "A",
        "value": "x",
        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}
    }]);
    only_error(
        &verdict(env(both)),
        "spec.env[0].valueFrom",
        "together with value",
    );
    let bad_key =
        json!([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}}]);
    only_error(
        &verdict(env(bad_key)),
        "spec.env[0].valueFrom.secretKeyRef.key",
        "not a valid key",
    );
    let no_name =
        json!([{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "", "key": "k"}}}]);
    only_error(
        &verdict(env(no_name)),
        "spec.env[0].valueFrom.configMapKeyRef.name",
        "required",
    );
    let path = json!([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]);
    only_error(
        &verdict(env(path)),
        "spec.env[0].valueFrom.fieldRef.fieldPath",
        "downward API",
    );
    let res = json!([{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]);
    only_error(
        &verdict(env(res)),
        "spec.env[0].valueFrom.resourceFieldRef.resource",
        "not supported",
    );
    valid(&verdict(env(json!([
        {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "B", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
        {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
    ]))));
}

fn mounts(list: Value) -> impl FnOnce(&mut Value) {
    move |f| f["spec"]["secretMounts"] = list
}

#[test]
fn secret_mounts_need_valid_unique_names_and_paths() {
    let m = |name: &str, path: &str| json!({"secretName": name, "mountPath": path});
    let v = verdict(mounts(json!([m("Creds", "/creds")])));
    only_error(
        &v,
        "spec.secretMounts[0].secretName",
        "not a valid Secret name",
    );
    let v = verdict(mounts(json!([m("a", "/a"), m("a", "/b")])));
    only_error(
        &v,
        "spec.secretMounts[1].secretName",
        "already mounted by spec.secretMounts[0]",
    );
    let v = verdict(mounts(json!([m("a", "creds")])));
    only_error(&v, "spec.secretMounts[0].mountPath", "not an absolute path");
    let v = verdict(mounts(json!([m("a", "/s/x"), m("b", "/s//x/")])));
    only_error(
        &v,
        "spec.secretMounts[1].mountPath",
        "already used by spec.secretMounts[0]",
    );
    let v = verdict(mounts(json!([m("a", "/s/../etc")])));
    only_error(&v, "spec.secretMounts[0].mountPath", "'..'");
    valid(&verdict(mounts(json!([
        m("a", "/secrets/a"),
        m("b", "/tmp/b")
    ]))));
}

#[test]
fn secret_mounts_must_not_cover_tmp_or_the_code() {
    let m = |path: &str| json!([{"secretName": "s", "mountPath": path}]);
    for (path, text) in [
        ("/tmp", "would hide /tmp"),
        ("/", "would hide /tmp"),
        (
            "/usr/src/app/function/lib",
            "is inside /usr/src/app/function",
        ),
        ("/usr/src", "would hide /usr/src/app/function"),
        (
            "/proc",
            "is inside /proc, which the container runtime provides",
        ),
        ("/proc/self", "is inside /proc"),
        ("/dev/shm/s", "is inside /dev"),
        ("/sys/fs/cgroup", "is inside /sys"),
        (
            "/var/run/secrets/kubernetes.io",
            "is inside /var/run/secrets",
        ),
        ("/var/run", "would hide /var/run/secrets"),
        ("/run/secrets", "is inside /run/secrets"),
    ] {
        let v = verdict(mounts(m(path)));
        only_error(&v, "spec.secretMounts[0].mountPath", text);
    }
    // Python's code lives elsewhere.
    let v = verdict(|f| {
        f["spec"]["runtime"] = json!("python313");
        f["spec"]["source"]["inline"]["dependencies"] = json!("");
        f["spec"]["secretMounts"] = m("/kubeless");
    });
    only_error(&v, "spec.secretMounts[0].mountPath", "is inside /kubeless");
}

#[test]
fn labels_follow_kubernetes_metadata_rules_and_the_reserved_prefix() {
    let labels = |l: Value| move |f: &mut Value| f["spec"]["labels"] = l;
    only_error(
        &verdict(labels(json!({"bad key": "v"}))),
        "spec.labels[bad key]",
        "qualified name",
    );
    only_error(
        &verdict(labels(json!({"serverless.kyma-project.io/x": "v"}))),
        "spec.labels[serverless.kyma-project.io/x]",
        "reserved",
    );
    only_error(
        &verdict(labels(json!({"app": "-x"}))),
        "spec.labels[app]",
        "not a valid label value",
    );
    only_error(
        &verdict(labels(json!({"app": "v".repeat(64)}))),
        "spec.labels[app]",
        "63 characters",
    );
    valid(&verdict(labels(
        json!({"app.kubernetes.io/part-of": "shop", "empty": ""}),
    )));
}

#[test]
fn annotations_follow_kubernetes_metadata_rules_and_size_limit() {
    let ann = |a: Value| move |f: &mut Value| f["spec"]["annotations"] = a;
    only_error(
        &verdict(ann(json!({"a/b/c": "v"}))),
        "spec.annotations[a/b/c]",
        "qualified name",
    );
    only_error(
        &verdict(ann(json!({"serverless.kyma-project.io/x": "v"}))),
        "spec.annotations[serverless.kyma-project.io/x]",
        "reserved",
    );
    let big = "x".repeat(MAX_ANNOTATIONS_BYTES);
    only_error(
        &verdict(ann(json!({"note": big}))),
        "spec.annotations",
        "exceed Kubernetes' limit",
    );
    valid(&verdict(ann(
        json!({"Example.com/Note": "any value at all: ✓"}),
    )));
}

#[test]
fn file_key_refs_name_an_env_file_in_the_pods_tmp_volume() {
    let file = |volume: &str, path: &str, key: &str| {
        json!([{"name": "A", "valueFrom": {"fileKeyRef": {
            "volumeName": volume, "path": path, "key": key, "optional": true}}}])
    };
    valid(&verdict(env(file("tmp", "config.env", "MODE"))));
    only_error(
        &verdict(env(file("data", "config.env", "MODE"))),
        "spec.env[0].valueFrom.fileKeyRef.volumeName",
        "not an emptyDir volume of the Function's Pod",
    );
    only_error(
        &verdict(env(file("tmp", "../etc/passwd", "MODE"))),
        "spec.env[0].valueFrom.fileKeyRef.path",
        "without '..'",
    );
    only_error(
        &verdict(env(file("tmp", "config.env", "A=B"))),
        "spec.env[0].valueFrom.fileKeyRef.key",
        "other than '='",
    );
}

fn security(pod: Value, container: Value) -> impl FnOnce(&mut Value) {
    move |f| {
        f["spec"]["podSecurityContext"] = pod;
        f["spec"]["containerSecurityContext"] = container;
    }
}

#[test]
fn security_contexts_may_tighten_but_not_leave_the_restricted_standard() {
    valid(&verdict(security(
        json!({"runAsUser": 2000, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"},
               "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}),
        json!({
            "readOnlyRootFilesystem": false,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
        }),
    )));
    let refused = [
        (
            json!({"runAsUser": 0}),
            json!({}),
            "spec.podSecurityContext.runAsUser",
            "as root",
        ),
        (
            json!({"runAsNonRoot": false}),
            json!({}),
            "spec.podSecurityContext.runAsNonRoot",
            "must be true",
        ),
        (
            json!({"seccompProfile": {"type": "Unconfined"}}),
            json!({}),
            "spec.podSecurityContext.seccompProfile.type",
            "RuntimeDefault or Localhost",
        ),
        (
            json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
            json!({}),
            "spec.podSecurityContext.sysctls[0].name",
            "not a safe sysctl",
        ),
        (
            json!({"seLinuxOptions": {"type": "spc_t"}}),
            json!({}),
            "spec.podSecurityContext.seLinuxOptions.type",
            "container_t",
        ),
        (
            json!({}),
            json!({"privileged": true}),
            "spec.containerSecurityContext.privileged",
            "reaches the node",
        ),
        (
            json!({}),
            json!({"allowPrivilegeEscalation": true}),
            "spec.containerSecurityContext.allowPrivilegeEscalation",
            "must be false",
        ),
        (
            json!({}),
            json!({"capabilities": {"drop": ["NET_RAW"]}}),
            "spec.containerSecurityContext.capabilities.drop",
            "must include ALL",
        ),
        (
            json!({}),
            json!({"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}),
            "spec.containerSecurityContext.capabilities.add[0]",
            "only NET_BIND_SERVICE",
        ),
        (
            json!({}),
            json!({"procMount": "Unmasked"}),
            "spec.containerSecurityContext.procMount",
            "must be Default",
        ),
        (
            json!({}),
            json!({"runAsUser": 0}),
            "spec.containerSecurityContext.runAsUser",
            "as root",
        ),
        (
            json!({}),
            json!({"appArmorProfile": {"type": "Unconfined"}}),
            "spec.containerSecurityContext.appArmorProfile.type",
            "RuntimeDefault or Localhost",
        ),
        (
            json!({}),
            json!({"windowsOptions": {"hostProcess": true}}),
            "spec.containerSecurityContext.windowsOptions.hostProcess",
            "must not be true",
        ),
    ];
    for (pod, container, field, text) in refused {
        only_error(&verdict(security(pod, container)), field, text);
    }
}
