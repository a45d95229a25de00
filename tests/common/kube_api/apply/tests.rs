//! Unit tests of server-side apply: ownership, conflicts, merges by schema, fieldsV1, times.

use super::managers::rfc3339;
use super::*;

const MAIN: Scope = Scope::Main {
    status_subresource: true,
};
const APP: &str = ".spec.template.spec.containers[name=\"app\"]";

fn deployment(spec: Value) -> Value {
    let mut obj = skeleton();
    obj["spec"] = spec;
    obj
}

fn skeleton() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}})
}

/// Applies `body` as a whole object to a Deployment.
fn run(live: &Value, manager: &str, body: &Value, force: bool) -> Result<Value, Conflicts> {
    let schema = Builtin::new("Deployment");
    apply(live, body, manager, MAIN, "apps/v1", force, &schema)
}

fn apply_as(live: &Value, manager: &str, spec: Value) -> Result<Value, Conflicts> {
    run(live, manager, &deployment(spec), false)
}

fn force_as(live: &Value, manager: &str, spec: Value) -> Value {
    run(live, manager, &deployment(spec), true).unwrap()
}

/// An Update by `manager` from `live` to `edited`.
fn edit(live: &Value, edited: &Value, manager: &str) -> Value {
    update(
        Some(live),
        edited,
        manager,
        MAIN,
        "apps/v1",
        &Builtin::new("Deployment"),
    )
}

fn entry<'a>(obj: &'a Value, manager: &str) -> &'a Value {
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    entries.iter().find(|e| e["manager"] == manager).unwrap()
}

fn managers(obj: &Value) -> Vec<&str> {
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    entries
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect()
}

/// The SMD path strings `manager` owns.
fn owned(obj: &Value, manager: &str) -> Vec<String> {
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    let entry = entries.iter().find(|e| e["manager"] == manager);
    entry
        .map(|e| from_fields_v1(&e["fieldsV1"]))
        .unwrap_or_default()
}

fn containers(list: Value) -> Value {
    json!({"template": {"spec": {"containers": list}}})
}

fn live_containers(obj: &Value) -> &Value {
    &obj["spec"]["template"]["spec"]["containers"]
}

#[test]
fn two_appliers_applying_the_same_value_share_the_field() {
    let live = apply_as(&skeleton(), "a", json!({"replicas": 2})).unwrap();
    let live = apply_as(&live, "b", json!({"replicas": 2})).unwrap();
    assert_eq!(owned(&live, "a"), [".spec.replicas"]);
    assert_eq!(owned(&live, "b"), [".spec.replicas"]);
    assert_eq!(
        entry(&live, "a")["fieldsV1"],
        json!({"f:spec": {"f:replicas": {}}})
    );
}

#[test]
fn a_second_applier_changing_a_field_gets_the_kube_apiserver_conflict_message() {
    let live = apply_as(&skeleton(), "a", json!({"replicas": 2, "paused": false})).unwrap();
    let err = apply_as(&live, "b", json!({"replicas": 3})).unwrap_err();
    let message = "Apply failed with 1 conflict: conflict with \"a\": .spec.replicas";
    assert_eq!(err.message(), message);
    let cause = (
        "conflict with \"a\"".to_owned(),
        ".spec.replicas".to_owned(),
    );
    assert_eq!(err.causes(), [cause]);

    let live = apply_as(&live, "c", json!({"minReadySeconds": 1})).unwrap();
    let spec = json!({"replicas": 3, "paused": true, "minReadySeconds": 2});
    let err = apply_as(&live, "b", spec).unwrap_err();
    let message = "Apply failed with 3 conflicts: conflicts with \"a\":\n\
        - .spec.paused\n- .spec.replicas\nconflicts with \"c\":\n- .spec.minReadySeconds";
    assert_eq!(err.message(), message);
}

#[test]
fn force_takes_the_conflicting_fields_from_their_owner() {
    let live = apply_as(&skeleton(), "a", json!({"replicas": 2, "paused": false})).unwrap();
    let live = force_as(&live, "b", json!({"replicas": 3}));
    assert_eq!(live["spec"], json!({"replicas": 3, "paused": false}));
    assert_eq!(owned(&live, "a"), [".spec.paused"]);
    assert_eq!(owned(&live, "b"), [".spec.replicas"]);
}

#[test]
fn an_update_takes_a_field_from_its_applier_and_the_next_apply_conflicts_with_it() {
    let live = apply_as(&skeleton(), "a", json!({"replicas": 2})).unwrap();
    let mut edited = live.clone();
    edited["spec"]["replicas"] = json!(5);
    let live = edit(&live, &edited, "kubectl-edit");
    assert_eq!(managers(&live), ["kubectl-edit"]);
    assert_eq!(owned(&live, "kubectl-edit"), [".spec.replicas"]);
    assert_eq!(entry(&live, "kubectl-edit")["operation"], "Update");
    let err = apply_as(&live, "a", json!({"replicas": 2})).unwrap_err();
    let message = "Apply failed with 1 conflict: \
        conflict with \"kubectl-edit\" using apps/v1: .spec.replicas";
    assert_eq!(err.message(), message);
}

#[test]
fn containers_are_merged_by_name_so_each_manager_owns_its_own_container() {
    let app = containers(json!([{"name": "app", "image": "app:1"}]));
    let live = apply_as(&skeleton(), "a", app).unwrap();
    let sidecar = containers(json!([{"name": "proxy", "image": "proxy:1"}]));
    let live = apply_as(&live, "b", sidecar).unwrap();
    let names = live_containers(&live).as_array().unwrap().iter();
    assert_eq!(
        names.map(|c| &c["name"]).collect::<Vec<_>>(),
        ["app", "proxy"]
    );
    let key = "k:{\"name\":\"app\"}";
    let fields = json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
        key: {".": {}, "f:image": {}, "f:name": {}}}}}}});
    assert_eq!(entry(&live, "a")["fieldsV1"], fields);
    let paths = [
        APP.to_owned(),
        format!("{APP}.image"),
        format!("{APP}.name"),
    ];
    assert_eq!(owned(&live, "a"), paths);
    // Each manager changes its own container freely.
    let app = containers(json!([{"name": "app", "image": "app:2"}]));
    let live = apply_as(&live, "a", app).unwrap();
    assert_eq!(live_containers(&live)[1]["image"], "proxy:1");
}

#[test]
fn env_is_merged_by_name() {
    let env = |env: Value| containers(json!([{"name": "app", "env": env}]));
    let live = apply_as(&skeleton(), "a", env(json!([{"name": "A", "value": "1"}]))).unwrap();
    let live = apply_as(&live, "b", env(json!([{"name": "B", "value": "2"}]))).unwrap();
    let merged = json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]);
    assert_eq!(live_containers(&live)[0]["env"], merged);
    let err = apply_as(&live, "b", env(json!([{"name": "A", "value": "9"}]))).unwrap_err();
    assert_eq!(err.causes()[0].1, format!("{APP}.env[name=\"A\"].value"));
}

#[test]
fn ports_are_keyed_by_container_port_and_protocol_defaulting_to_tcp() {
    let ports = |ports: Value| containers(json!([{"name": "app", "ports": ports}]));
    let live = apply_as(&skeleton(), "a", ports(json!([{"containerPort": 80}]))).unwrap();
    let tcp = json!([{"containerPort": 80, "protocol": "TCP", "name": "http"}]);
    let live = apply_as(&live, "b", ports(tcp)).unwrap();
    let udp = json!([{"containerPort": 80, "protocol": "UDP"}]);
    let live = apply_as(&live, "c", ports(udp)).unwrap();
    let merged = json!([{"containerPort": 80, "protocol": "TCP", "name": "http"},
        {"containerPort": 80, "protocol": "UDP"}]);
    assert_eq!(live_containers(&live)[0]["ports"], merged);
    let port = format!("{APP}.ports[containerPort=80,protocol=\"TCP\"]");
    let paths = [
        APP.to_owned(),
        format!("{APP}.name"),
        port.clone(),
        port + ".containerPort",
    ];
    assert_eq!(owned(&live, "a"), paths);
    let a = &entry(&live, "a")["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"];
    let key = "k:{\"containerPort\":80,\"protocol\":\"TCP\"}";
    assert_eq!(
        a["k:{\"name\":\"app\"}"]["f:ports"][key],
        json!({".": {}, "f:containerPort": {}})
    );
}

#[test]
fn an_atomic_list_is_replaced_whole_and_owned_as_one_field() {
    let args = |args: Value| containers(json!([{"name": "app", "args": args}]));
    let live = apply_as(&skeleton(), "a", args(json!(["x", "y"]))).unwrap();
    let err = apply_as(&live, "b", args(json!(["z"]))).unwrap_err();
    assert_eq!(err.causes()[0].1, format!("{APP}.args"));
    let live = force_as(&live, "b", args(json!(["z"])));
    assert_eq!(live_containers(&live)[0]["args"], json!(["z"]));
    assert!(owned(&live, "b").contains(&format!("{APP}.args")));
    assert_eq!(owned(&live, "a"), [APP.to_owned(), format!("{APP}.name")]);
}

#[test]
fn a_set_list_is_merged_item_by_item() {
    let fin = |manager: &str, live: &Value, finalizers: Value| {
        let mut body = skeleton();
        body["metadata"]["finalizers"] = finalizers;
        run(live, manager, &body, false).unwrap()
    };
    let live = fin("a", &skeleton(), json!(["x"]));
    let live = fin("b", &live, json!(["y"]));
    assert_eq!(live["metadata"]["finalizers"], json!(["x", "y"]));
    let fields = json!({"f:metadata": {"f:finalizers": {"v:\"x\"": {}}}});
    assert_eq!(entry(&live, "a")["fieldsV1"], fields);
    assert_eq!(owned(&live, "b"), [".metadata.finalizers[=\"y\"]"]);
    let live = fin("a", &live, json!([]));
    assert_eq!(live["metadata"]["finalizers"], json!(["y"]));
}

#[test]
fn re_applying_without_a_field_removes_it_unless_another_manager_owns_it() {
    let spec = json!({"replicas": 2, "paused": true, "minReadySeconds": 5});
    let live = apply_as(&skeleton(), "a", spec).unwrap();
    let live = apply_as(&live, "b", json!({"minReadySeconds": 5})).unwrap();
    let live = apply_as(&live, "a", json!({"replicas": 2})).unwrap();
    assert_eq!(live["spec"], json!({"replicas": 2, "minReadySeconds": 5}));
    assert_eq!(owned(&live, "a"), [".spec.replicas"]);
    // A container the applier stops sending goes with all its fields, even one an Update
    // manager owns (SMD's remove_one_with_managed_subitem_keep_one); one that another
    // applier also sends stays, without the fields only this applier owned.
    let two = json!([{"name": "app", "image": "1"}, {"name": "log", "image": "1"}]);
    let live = apply_as(&live, "a", containers(two)).unwrap();
    let live = apply_as(&live, "b", containers(json!([{"name": "log"}]))).unwrap();
    let mut edited = live.clone();
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("2");
    let live = edit(&live, &edited, "kubectl-edit");
    let live = apply_as(&live, "a", json!({"replicas": 2})).unwrap();
    assert_eq!(live_containers(&live), &json!([{"name": "log"}]));
    assert_eq!(managers(&live), ["a", "b"]);
}

#[test]
fn smd_remove_one_keep_one_with_dangling_subitem_gives_the_same_object_and_owners() {
    let schema = CrdSchema::new(json!({"properties": {"listOfLists": {
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"properties": {"value": {"x-kubernetes-list-type": "set"}}}}}}));
    let obj = |list: Value| json!({"metadata": {"name": "t"}, "listOfLists": list});
    let run = |live: &Value, manager: &str, list: Value| {
        apply(live, &obj(list), manager, MAIN, "v1", false, &schema).unwrap()
    };
    let live = json!({"metadata": {"name": "t"}});
    let live = run(
        &live,
        "apply-one",
        json!([{"name": "a"}, {"name": "b", "value": ["c"]}]),
    );
    let live = run(&live, "apply-two", json!([{"name": "b", "value": ["d"]}]));
    let controller = obj(json!([{"name": "a"}, {"name": "b", "value": ["c", "d", "e"]}]));
    let live = update(Some(&live), &controller, "controller", MAIN, "v1", &schema);
    let live = run(&live, "apply-one", json!([{"name": "a"}]));
    let expected = json!([{"name": "a"}, {"name": "b", "value": ["d", "e"]}]);
    assert_eq!(live["listOfLists"], expected);
    let a = ".listOfLists[name=\"a\"]";
    assert_eq!(
        owned(&live, "apply-one"),
        [a.to_owned(), format!("{a}.name")]
    );
    let e = ".listOfLists[name=\"b\"].value[=\"e\"]";
    assert_eq!(owned(&live, "controller"), [e]);
}

#[test]
fn a_no_op_apply_returns_exactly_live() {
    let app = json!([{"name": "app", "image": "app:1", "ports": [{"containerPort": 80}]}]);
    let spec = containers(app);
    let mut live = apply_as(&skeleton(), "a", spec.clone()).unwrap();
    live["metadata"]["managedFields"][0]["time"] = json!("2000-01-01T00:00:00Z");
    live["metadata"]["uid"] = json!("u-1");
    assert_eq!(apply_as(&live, "a", spec.clone()).unwrap(), live);
    // A new co-owner changes managedFields only, with its own time.
    let shared = apply_as(&live, "b", spec).unwrap();
    assert_eq!(shared["spec"], live["spec"]);
    assert_eq!(entry(&shared, "a")["time"], "2000-01-01T00:00:00Z");
    assert_ne!(entry(&shared, "b")["time"], "2000-01-01T00:00:00Z");
}

#[test]
fn the_status_scope_touches_only_status() {
    let schema = Builtin::new("Deployment");
    let live = apply_as(&skeleton(), "a", json!({"replicas": 2})).unwrap();
    let mut body = deployment(json!({"replicas": 9}));
    body["metadata"]["labels"] = json!({"x": "y"});
    body["status"] = json!({"readyReplicas": 1});
    let live = apply(
        &live,
        &body,
        "ctrl",
        Scope::Status,
        "apps/v1",
        false,
        &schema,
    )
    .unwrap();
    assert_eq!(live["spec"], json!({"replicas": 2}));
    assert_eq!(live["status"], json!({"readyReplicas": 1}));
    assert!(live["metadata"].get("labels").is_none());
    assert_eq!(entry(&live, "ctrl")["subresource"], "status");
    assert_eq!(owned(&live, "ctrl"), [".status.readyReplicas"]);
    // The main resource ignores status when there is a status subresource.
    let live = apply(&live, &body, "a", MAIN, "apps/v1", true, &schema).unwrap();
    assert_eq!(live["status"], json!({"readyReplicas": 1}));
    assert_eq!(owned(&live, "a"), [".metadata.labels.x", ".spec.replicas"]);
    assert!(entry(&live, "a").get("subresource").is_none());
}

#[test]
fn a_crd_schema_honours_list_map_keys_and_defaults_to_atomic() {
    let schema = CrdSchema::new(json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "steps": {"type": "array", "items": {"type": "string"}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set"}}},
        "status": {"type": "object", "properties": {"conditions": {"type": "array",
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
            "items": {"type": "object", "properties": {"type": {"type": "string"}}}}}}}}));
    let run = |live: &Value, manager: &str, mut body: Value, scope| {
        body["metadata"] = json!({"name": "f"});
        apply(live, &body, manager, scope, "x.io/v1", false, &schema)
    };
    let live = json!({"apiVersion": "x.io/v1", "kind": "Fn", "metadata": {"name": "f"}});
    let spec = json!({"spec": {"steps": ["1", "2"], "tags": ["t"]}});
    let live = run(&live, "a", spec, MAIN).unwrap();
    let live = run(&live, "b", json!({"spec": {"tags": ["u"]}}), MAIN).unwrap();
    assert_eq!(live["spec"]["tags"], json!(["t", "u"]));
    let err = run(&live, "b", json!({"spec": {"steps": ["3"]}}), MAIN).unwrap_err();
    assert_eq!(err.causes()[0].1, ".spec.steps");
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let live = run(&live, "c1", ready, Scope::Status).unwrap();
    let synced = json!({"status": {"conditions": [{"type": "Synced", "status": "False"}]}});
    let live = run(&live, "c2", synced, Scope::Status).unwrap();
    assert_eq!(live["status"]["conditions"].as_array().unwrap().len(), 2);
    let ready = ".status.conditions[type=\"Ready\"]";
    let paths = [
        ready.to_owned(),
        format!("{ready}.status"),
        format!("{ready}.type"),
    ];
    assert_eq!(owned(&live, "c1"), paths);
}

#[test]
fn an_object_written_before_field_management_is_owned_by_before_first_apply() {
    let mut live = deployment(json!({"replicas": 1, "paused": false}));
    live["metadata"]["uid"] = json!("u-1");
    let err = apply_as(&live, "a", json!({"replicas": 2, "paused": false})).unwrap_err();
    let message = "Apply failed with 1 conflict: \
        conflict with \"before-first-apply\" using apps/v1: .spec.replicas";
    assert_eq!(err.message(), message);
    let live = apply_as(&live, "a", json!({"replicas": 1})).unwrap();
    let paths = [".spec", ".spec.paused", ".spec.replicas"];
    assert_eq!(owned(&live, "before-first-apply"), paths);
    assert_eq!(live["metadata"]["uid"], "u-1");
}

#[test]
fn a_create_owns_every_field_it_sent_and_updates_mark_new_objects_with_a_dot() {
    let schema = Builtin::new("Deployment");
    let mut obj = deployment(json!({"replicas": 1}));
    obj["metadata"]["labels"] = json!({"app": "web"});
    let created = update(None, &obj, "kubectl-create", MAIN, "apps/v1", &schema);
    let fields = json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
        "f:spec": {".": {}, "f:replicas": {}}});
    assert_eq!(entry(&created, "kubectl-create")["fieldsV1"], fields);
    // A PUT that changes nothing leaves managedFields as they were.
    assert_eq!(edit(&created, &created, "kubectl-replace"), created);
}

#[test]
fn null_in_an_applied_configuration_removes_the_field() {
    let live = apply_as(&skeleton(), "a", json!({"replicas": 2, "paused": true})).unwrap();
    let live = apply_as(&live, "a", json!({"replicas": 2, "paused": null})).unwrap();
    assert_eq!(live["spec"], json!({"replicas": 2}));
    assert_eq!(owned(&live, "a"), [".spec.replicas"]);
    let err = apply_as(&live, "b", json!({"replicas": null})).unwrap_err();
    assert_eq!(err.causes()[0].1, ".spec.replicas");
}

#[test]
fn an_atomic_label_selector_is_replaced_and_owned_as_one_field() {
    let sel = |labels: Value| json!({"selector": {"matchLabels": labels}});
    let live = apply_as(&skeleton(), "a", sel(json!({"app": "web", "tier": "x"}))).unwrap();
    let live = force_as(&live, "b", sel(json!({"app": "web"})));
    assert_eq!(
        live["spec"]["selector"],
        json!({"matchLabels": {"app": "web"}})
    );
    assert_eq!(owned(&live, "b"), [".spec.selector"]);
    assert_eq!(managers(&live), ["b"]);
}

#[test]
fn fields_v1_round_trips_keys_values_and_dots() {
    let trie = json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"a\"": {}}},
        "f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {
            ".": {}, "f:port": {}}}}});
    assert_eq!(Set::from_fields_v1(&trie).to_fields_v1(), trie);
    let port = ".spec.ports[port=80,protocol=\"TCP\"]";
    let paths = [".metadata.finalizers", ".metadata.finalizers[=\"a\"]", port];
    assert_eq!(from_fields_v1(&trie)[..3], paths);
    assert_eq!(from_fields_v1(&trie)[3], format!("{port}.port"));
}

#[test]
fn set_merges_keep_smd_item_order() {
    // (live, applied, merged) triplets from SMD's typed/merge_test.go.
    let cases = [
        ("abc", "ab", "abc"),
        ("abc", "", "abc"),
        ("ab", "ba", "ba"),
        ("abcgf", "cdef", "abcgdef"),
        ("cdef", "ace", "acdef"),
        ("abcxyz", "defxyz", "abcdefxyz"),
        ("cagf", "cfag", "cfag"),
        ("abcd", "defa", "bcdefa"),
        ("cdefghij", "2h3e4kl", "cdfg2hij3e4kl"),
        ("abcdefghij", "1b2h3e4kl", "a1bcdfg2hij3e4kl"),
        ("abb", "b", "ab"),
        ("abcdec", "1b2ed", "a1bc2ecd"),
        ("aabb", "bcd", "aabcd"),
    ];
    let schema = CrdSchema::new(json!({"properties": {"s": {"x-kubernetes-list-type": "set"}}}));
    let mut ctx = Ctx::new(&schema);
    let list = |s: &str| json!({"s": s.chars().map(String::from).collect::<Vec<_>>()});
    for (live, applied, merged) in cases {
        let out = ctx.merge(Some(&list(live)), Some(&list(applied)));
        assert_eq!(out, Some(list(merged)), "{live} + {applied}");
    }
    let numbers = ctx.merge(
        Some(&json!({"s": [1, 2, 3.5]})),
        Some(&json!({"s": [1, 2, 3]})),
    );
    assert_eq!(numbers, Some(json!({"s": [1, 2, 3.5, 3]})));
}

#[test]
fn the_builtin_table_finds_pod_specs_and_service_ports_in_their_kinds() {
    let keys = |keys: &[&str]| ListType::Map(keys.iter().map(|k| (*k).to_owned()).collect());
    let env = [
        "spec",
        "jobTemplate",
        "spec",
        "template",
        "spec",
        "containers",
        "env",
    ];
    assert_eq!(Builtin::new("CronJob").list_type(&env), keys(&["name"]));
    assert_eq!(
        Builtin::new("Pod").list_type(&["spec", "volumes"]),
        keys(&["name"])
    );
    assert_eq!(
        Builtin::new("Pod").list_type(&["spec", "tolerations"]),
        ListType::Atomic
    );
    let service = Builtin::new("Service");
    assert_eq!(
        service.list_type(&["spec", "ports"]),
        keys(&["port", "protocol"])
    );
    assert_eq!(
        service.key_default(&["spec", "ports"], "protocol"),
        Some(json!("TCP"))
    );
    assert!(!service.is_atomic(&["spec", "selector"]));
    assert_eq!(
        Builtin::new("Job").list_type(&["status", "conditions"]),
        ListType::Atomic
    );
    let finalizers = Builtin::new("Namespace").list_type(&["metadata", "finalizers"]);
    assert_eq!(finalizers, ListType::Set);
}

#[test]
fn times_are_rfc3339_seconds_in_utc() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_795_777_200), "2026-11-27T11:00:00Z");
    assert_eq!(now().len(), 20);
}
