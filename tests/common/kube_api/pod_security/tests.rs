//! Tests of the PodSecurity module: label resolution, each check's wording at both levels, and
//! the enforce and warn messages.

use super::*;
use serde_json::json;

/// The restricted-compliant container securityContext kiln writes.
fn hardened_container(name: &str) -> Value {
    json!({
        "name": name,
        "image": "registry.example/app:1",
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": true
        }
    })
}

/// A pod spec as kiln renders it: passes restricted.
fn kiln_spec() -> Value {
    json!({
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 10001,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "initContainers": [hardened_container("migrate")],
        "containers": [hardened_container("app")],
        "volumes": [
            {"name": "config", "configMap": {"name": "app-config"}},
            {"name": "creds", "secret": {"secretName": "app-creds"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "token", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}}
            ]}}
        ]
    })
}

fn bare_spec(names: &[&str]) -> Value {
    let containers: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "image": "busybox"}))
        .collect();
    json!({"containers": containers})
}

fn restricted(spec: &Value) -> Vec<String> {
    check(Level::Restricted, &json!({}), spec)
}

fn baseline(spec: &Value) -> Vec<String> {
    check(Level::Baseline, &json!({}), spec)
}

#[test]
fn a_pod_as_kiln_renders_it_passes_restricted_and_baseline() {
    let spec = kiln_spec();
    assert_eq!(restricted(&spec), Vec::<String>::new());
    assert_eq!(baseline(&spec), Vec::<String>::new());
}

#[test]
fn a_bare_pod_gets_exactly_the_four_failure_forbidden_message() {
    let failures = restricted(&bare_spec(&["c"]));
    assert_eq!(
        format!(
            "pods \"x\" is forbidden: {}",
            forbidden_detail(Level::Restricted, &failures)
        ),
        "pods \"x\" is forbidden: violates PodSecurity \"restricted:latest\": \
         allowPrivilegeEscalation != false (container \"c\" must set \
         securityContext.allowPrivilegeEscalation=false), unrestricted capabilities \
         (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), \
         runAsNonRoot != true (pod or container \"c\" must set \
         securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must \
         set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
    );
}

#[test]
fn a_bare_pod_passes_baseline_and_privileged() {
    assert!(baseline(&bare_spec(&["c"])).is_empty());
    assert!(check(Level::Privileged, &json!({}), &json!({"hostNetwork": true})).is_empty());
}

#[test]
fn a_host_path_volume_is_refused_by_both_levels_in_their_own_words() {
    let mut spec = kiln_spec();
    spec["volumes"] = json!([
        {"name": "config", "configMap": {"name": "c"}},
        {"name": "host", "hostPath": {"path": "/var/run"}}
    ]);
    assert_eq!(
        restricted(&spec),
        ["restricted volume types (volume \"host\" uses restricted volume type \"hostPath\")"]
    );
    assert_eq!(baseline(&spec), ["hostPath volumes (volume \"host\")"]);
}

#[test]
fn several_restricted_volumes_are_pluralized_with_sorted_types() {
    let mut spec = kiln_spec();
    spec["volumes"] = json!([
        {"name": "b", "nfs": {"server": "s", "path": "/"}},
        {"name": "a", "hostPath": {"path": "/"}},
        {"name": "odd"}
    ]);
    assert_eq!(
        restricted(&spec),
        [
            "restricted volume types (volumes \"b\", \"a\", \"odd\" use restricted volume \
          types \"hostPath\", \"nfs\", \"unknown\")"
        ]
    );
}

#[test]
fn host_network_is_a_forbidden_host_namespace_at_both_levels() {
    let mut spec = kiln_spec();
    spec["hostNetwork"] = json!(true);
    spec["hostIPC"] = json!(true);
    spec["hostPID"] = json!(false);
    let expected = ["host namespaces (hostNetwork=true, hostIPC=true)"];
    assert_eq!(restricted(&spec), expected);
    assert_eq!(baseline(&spec), expected);
}

#[test]
fn run_as_user_zero_is_refused_at_pod_and_container_level() {
    let mut spec = kiln_spec();
    spec["securityContext"]["runAsUser"] = json!(0);
    spec["containers"][0]["securityContext"]["runAsUser"] = json!(0);
    assert_eq!(
        restricted(&spec),
        ["runAsUser=0 (pod and container \"app\" must not set runAsUser=0)"]
    );
    assert!(baseline(&spec).is_empty());
}

#[test]
fn a_user_namespaced_pod_may_run_as_root() {
    let mut spec = kiln_spec();
    spec["hostUsers"] = json!(false);
    spec["securityContext"]["runAsUser"] = json!(0);
    spec["securityContext"]["runAsNonRoot"] = json!(false);
    assert!(restricted(&spec).is_empty());
}

#[test]
fn adding_sys_admin_is_refused_by_both_levels() {
    let mut spec = kiln_spec();
    spec["containers"][0]["securityContext"]["capabilities"]["add"] =
        json!(["SYS_ADMIN", "NET_BIND_SERVICE"]);
    assert_eq!(
        restricted(&spec),
        [
            "unrestricted capabilities (container \"app\" must not include \"SYS_ADMIN\" in \
          securityContext.capabilities.add)"
        ]
    );
    assert_eq!(
        baseline(&spec),
        [
            "non-default capabilities (container \"app\" must not include \"SYS_ADMIN\" in \
          securityContext.capabilities.add)"
        ]
    );
}

#[test]
fn baseline_allows_default_capabilities_that_restricted_refuses() {
    let mut spec = bare_spec(&["c"]);
    spec["containers"][0]["securityContext"] =
        json!({"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE"]}});
    assert!(baseline(&spec).is_empty());
    assert_eq!(
        restricted(&spec)[1],
        "unrestricted capabilities (container \"c\" must set \
         securityContext.capabilities.drop=[\"ALL\"]; container \"c\" must not include \
         \"CHOWN\" in securityContext.capabilities.add)"
    );
}

#[test]
fn two_failing_containers_are_named_together_with_plural_wording() {
    let failures = restricted(&bare_spec(&["a", "b"]));
    assert_eq!(
        failures,
        [
            "allowPrivilegeEscalation != false (containers \"a\", \"b\" must set \
             securityContext.allowPrivilegeEscalation=false)",
            "unrestricted capabilities (containers \"a\", \"b\" must set \
             securityContext.capabilities.drop=[\"ALL\"])",
            "runAsNonRoot != true (pod or containers \"a\", \"b\" must set \
             securityContext.runAsNonRoot=true)",
            "seccompProfile (pod or containers \"a\", \"b\" must set \
             securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
        ]
    );
}

#[test]
fn init_then_regular_then_ephemeral_containers_are_visited_in_that_order() {
    let spec = json!({
        "ephemeralContainers": [{"name": "debug"}],
        "containers": [{"name": "app"}],
        "initContainers": [{"name": "init"}]
    });
    assert_eq!(
        restricted(&spec)[0],
        "allowPrivilegeEscalation != false (containers \"init\", \"app\", \"debug\" must \
         set securityContext.allowPrivilegeEscalation=false)"
    );
}

#[test]
fn baseline_allows_what_restricted_refuses_but_refuses_privileged() {
    let mut spec = bare_spec(&["c"]);
    spec["volumes"] = json!([{"name": "data", "nfs": {"server": "s", "path": "/"}}]);
    spec["securityContext"] = json!({"seccompProfile": {"type": "Unconfined"}});
    assert_eq!(
        baseline(&spec),
        [
            "seccompProfile (pod must not set securityContext.seccompProfile.type to \
         \"Unconfined\")"
        ]
    );
    spec["securityContext"] = json!({"runAsUser": 0});
    assert!(baseline(&spec).is_empty());
    assert_eq!(restricted(&spec).len(), 6);

    spec["containers"][0]["securityContext"] = json!({"privileged": true});
    assert_eq!(
        baseline(&spec),
        ["privileged (container \"c\" must not set securityContext.privileged=true)"]
    );
}

#[test]
fn an_explicit_false_run_as_non_root_is_reported_instead_of_the_missing_one() {
    let mut spec = kiln_spec();
    spec["securityContext"]["runAsNonRoot"] = json!(false);
    spec["containers"][0]["securityContext"]["runAsNonRoot"] = json!(false);
    assert_eq!(
        restricted(&spec),
        [
            "runAsNonRoot != true (pod and container \"app\" must not set \
          securityContext.runAsNonRoot=false)"
        ]
    );
}

#[test]
fn container_level_settings_satisfy_run_as_non_root_and_seccomp_without_a_pod_level() {
    let mut spec = kiln_spec();
    spec["securityContext"] = json!({});
    for list in ["initContainers", "containers"] {
        spec[list][0]["securityContext"]["runAsNonRoot"] = json!(true);
        spec[list][0]["securityContext"]["seccompProfile"] = json!({"type": "Localhost"});
    }
    assert!(restricted(&spec).is_empty());
    spec["containers"][0]["securityContext"]["seccompProfile"] = json!({"type": "Unconfined"});
    assert_eq!(
        restricted(&spec),
        [
            "seccompProfile (container \"app\" must not set securityContext.seccompProfile.type \
          to \"Unconfined\")"
        ]
    );
}

#[test]
fn a_windows_pod_skips_the_linux_only_restricted_checks() {
    let mut spec = bare_spec(&["c"]);
    spec["os"] = json!({"name": "windows"});
    assert_eq!(
        restricted(&spec),
        ["runAsNonRoot != true (pod or container \"c\" must set \
          securityContext.runAsNonRoot=true)"]
    );
}

#[test]
fn host_ports_are_listed_sorted_as_strings() {
    let mut spec = kiln_spec();
    spec["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}]);
    spec["initContainers"][0]["ports"] = json!([{"containerPort": 1, "hostPort": 443}]);
    assert_eq!(
        restricted(&spec),
        ["hostPort (containers \"migrate\", \"app\" use hostPorts 443, 80)"]
    );
    spec["initContainers"][0]["ports"] = json!([{"containerPort": 1}]);
    assert_eq!(
        baseline(&spec),
        ["hostPort (container \"app\" uses hostPort 80)"]
    );
}

#[test]
fn probe_and_lifecycle_hosts_are_refused() {
    let mut spec = kiln_spec();
    spec["containers"][0]["livenessProbe"] = json!({"httpGet": {"host": "localhost"}});
    spec["containers"][0]["lifecycle"] = json!({"preStop": {"tcpSocket": {"host": "::1"}}});
    assert_eq!(
        restricted(&spec),
        [
            "probe or lifecycle host (container \"app\" uses probe or lifecycle hosts \"::1\", \
          \"localhost\")"
        ]
    );
}

#[test]
fn apparmor_unconfined_is_refused_in_fields_and_annotations() {
    let mut spec = kiln_spec();
    spec["securityContext"]["appArmorProfile"] = json!({"type": "Unconfined"});
    let metadata = json!({"annotations": {
        "container.apparmor.security.beta.kubernetes.io/app": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/migrate": "runtime/default",
        "unrelated": "unconfined"
    }});
    assert_eq!(
        check(Level::Baseline, &metadata, &spec),
        [
            "forbidden AppArmor profiles (pod and annotation must not set AppArmor profile \
          type to \"Unconfined\", \
          \"container.apparmor.security.beta.kubernetes.io/app=\"unconfined\"\")"
        ]
    );
}

#[test]
fn selinux_sysctls_proc_mount_and_host_process_are_refused() {
    let mut spec = kiln_spec();
    spec["securityContext"]["seLinuxOptions"] = json!({"type": "spc_t", "user": "u"});
    spec["securityContext"]["sysctls"] = json!([
        {"name": "kernel.msgmax", "value": "1"},
        {"name": "net.ipv4.tcp_syncookies", "value": "1"}
    ]);
    spec["containers"][0]["securityContext"]["procMount"] = json!("Unmasked");
    spec["containers"][0]["securityContext"]["windowsOptions"] = json!({"hostProcess": true});
    assert_eq!(
        restricted(&spec),
        [
            "seLinuxOptions (pod set forbidden securityContext.seLinuxOptions: type \
             \"spc_t\"; user may not be set)",
            "forbidden sysctls (kernel.msgmax)",
            "hostProcess (container \"app\" must not set \
             securityContext.windowsOptions.hostProcess=true)",
            "procMount (container \"app\" must not set securityContext.procMount to \
             \"Unmasked\")",
        ]
    );
    // Baseline tolerates an unmasked /proc in a user namespace; restricted does not.
    spec["hostUsers"] = json!(false);
    assert_eq!(baseline(&spec).len(), 3);
    assert_eq!(restricted(&spec).len(), 4);
}

#[test]
fn the_warning_names_the_level_and_latest_version() {
    let failures = vec!["host namespaces (hostPID=true)".to_owned()];
    assert_eq!(
        warning(Level::Baseline, &failures),
        "would violate PodSecurity \"baseline:latest\": host namespaces (hostPID=true)"
    );
}

#[test]
fn labels_resolve_enforce_and_default_warn_to_a_stricter_enforce() {
    assert_eq!(Policy::from_labels(&Value::Null), Ok(Policy::default()));
    assert_eq!(
        Policy::from_labels(&json!({"app": "x"})),
        Ok(Policy::default())
    );
    assert_eq!(
        Policy::from_labels(&json!({ENFORCE_LABEL: "restricted"})),
        Ok(Policy {
            enforce: Level::Restricted,
            warn: Level::Restricted
        })
    );
    assert_eq!(
        Policy::from_labels(&json!({
            ENFORCE_LABEL: "baseline",
            ENFORCE_VERSION_LABEL: "v1.30",
            WARN_LABEL: "restricted",
            WARN_VERSION_LABEL: "latest",
            AUDIT_LABEL: "restricted"
        })),
        Ok(Policy {
            enforce: Level::Baseline,
            warn: Level::Restricted
        })
    );
    // An explicit warn label wins even when it is laxer than enforce.
    assert_eq!(
        Policy::from_labels(&json!({ENFORCE_LABEL: "restricted", WARN_LABEL: "privileged"})),
        Ok(Policy {
            enforce: Level::Restricted,
            warn: Level::Privileged
        })
    );
}

#[test]
fn invalid_labels_are_refused_with_the_namespace_validation_message() {
    assert_eq!(
        Policy::from_labels(&json!({ENFORCE_LABEL: "foo"})),
        Err(
            "metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"foo\": \
             must be one of privileged, baseline, restricted"
                .to_owned()
        )
    );
    assert_eq!(
        Policy::from_labels(&json!({WARN_LABEL: "Baseline", ENFORCE_VERSION_LABEL: "v1.05"})),
        Err(
            "[metadata.labels[pod-security.kubernetes.io/enforce-version]: Invalid value: \
             \"v1.05\": must be \"latest\" or \"v1.x\", \
             metadata.labels[pod-security.kubernetes.io/warn]: Invalid value: \"Baseline\": \
             must be one of privileged, baseline, restricted]"
                .to_owned()
        )
    );
}

#[test]
fn version_labels_accept_latest_and_v1_minor_only() {
    for ok in ["latest", "v1.0", "v1.9", "v1.36", "v1.100"] {
        assert!(
            Policy::from_labels(&json!({AUDIT_VERSION_LABEL: ok})).is_ok(),
            "{ok}"
        );
    }
    for bad in [
        "",
        "v1",
        "v1.",
        "1.30",
        "v2.0",
        "v1.030",
        "v1.x",
        "v1.99999999999999999999",
    ] {
        assert!(
            Policy::from_labels(&json!({AUDIT_VERSION_LABEL: bad})).is_err(),
            "{bad}"
        );
    }
}
