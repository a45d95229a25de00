//! Discovery and OpenAPI, enough for the real `kubectl` (1.37) to map kinds to resources,
//! validate server-side (`fieldValidation=Strict`) and print: aggregated discovery (`/api`,
//! `/apis` answered as `APIGroupDiscoveryList` when the client asks for it), the legacy
//! documents (`APIVersions`, `APIGroupList`, `APIResourceList` per group version), and
//! OpenAPI v3: an index and, per group version, a `patch` operation for every kind that
//! declares the `fieldValidation` parameter, which is what kubectl looks for before it sends
//! `fieldValidation=Strict`. Schemas are not served: kubectl does not need them when the
//! server validates. `/openapi/v2` is not served (kubectl asks it for protobuf only).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::kinds::{Kind, Kinds};

/// The media type of aggregated discovery.
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Short names and categories of the built-in kinds (kube-apiserver's REST storage).
fn builtin_names(kind: &Kind) -> (Vec<&'static str>, Vec<&'static str>) {
    let short: &[&str] = match (kind.group, kind.plural) {
        ("", "configmaps") => &["cm"],
        ("", "services") => &["svc"],
        ("", "pods") => &["po"],
        ("", "events") => &["ev"],
        ("", "namespaces") => &["ns"],
        ("", "serviceaccounts") => &["sa"],
        ("apps", "deployments") => &["deploy"],
        ("networking.k8s.io", "networkpolicies") => &["netpol"],
        ("autoscaling", "horizontalpodautoscalers") => &["hpa"],
        ("events.k8s.io", "events") => &["ev"],
        ("apiextensions.k8s.io", "customresourcedefinitions") => &["crd", "crds"],
        _ => &[],
    };
    let categories: &[&str] = match (kind.group, kind.plural) {
        ("", "pods" | "services") | ("apps", "deployments") | ("batch", "jobs") => &["all"],
        ("autoscaling", "horizontalpodautoscalers") => &["all"],
        _ => &[],
    };
    (short.to_vec(), categories.to_vec())
}

fn names_of(kind: &Kind) -> (Vec<String>, Vec<String>) {
    match kind.crd {
        Some(crd) => (crd.short_names.clone(), crd.categories.clone()),
        None => {
            let (s, c) = builtin_names(kind);
            (
                s.into_iter().map(str::to_string).collect(),
                c.into_iter().map(str::to_string).collect(),
            )
        }
    }
}

/// The subresources of a kind: (name, response group, version, kind, verbs).
fn subresources(kind: &Kind) -> Vec<(&'static str, String, String, String, Vec<&'static str>)> {
    let mut out = Vec::new();
    let own = || {
        (
            kind.group.to_string(),
            kind.version.to_string(),
            kind.kind.to_string(),
        )
    };
    if kind.status {
        let (g, v, k) = own();
        out.push(("status", g, v, k, vec!["get", "patch", "update"]));
    }
    if kind.scale {
        let scale = ("autoscaling".into(), "v1".into(), "Scale".into());
        out.push((
            "scale",
            scale.0,
            scale.1,
            scale.2,
            vec!["get", "patch", "update"],
        ));
    }
    if kind.group.is_empty() && kind.kind == "ServiceAccount" {
        let token = (
            "authentication.k8s.io".into(),
            "v1".into(),
            "TokenRequest".into(),
        );
        out.push(("token", token.0, token.1, token.2, vec!["create"]));
    }
    out
}

/// Group versions served, each with its kinds, in a stable order (core first).
fn group_versions(kinds: &Kinds) -> BTreeMap<(String, String), Vec<&'static Kind>> {
    let mut groups: BTreeMap<(String, String), Vec<&'static Kind>> = BTreeMap::new();
    for kind in kinds.all() {
        groups
            .entry((kind.group.to_string(), kind.version.to_string()))
            .or_default()
            .push(kind);
    }
    groups
}

fn aggregated_resource(kind: &Kind) -> Value {
    let (short, categories) = names_of(kind);
    let subs: Vec<Value> = subresources(kind)
        .into_iter()
        .map(|(name, g, v, k, verbs)| {
            json!({"subresource": name, "responseKind": {"group": g, "version": v, "kind": k},
                   "verbs": verbs})
        })
        .collect();
    let mut resource = json!({
        "resource": kind.plural,
        "responseKind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "scope": if kind.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": kind.kind.to_lowercase(),
        "verbs": VERBS,
    });
    if !short.is_empty() {
        resource["shortNames"] = json!(short);
    }
    if !categories.is_empty() {
        resource["categories"] = json!(categories);
    }
    if !subs.is_empty() {
        resource["subresources"] = json!(subs);
    }
    resource
}

/// `APIGroupDiscoveryList` for `/api` (core) or `/apis` (every other group).
fn aggregated(kinds: &Kinds, core: bool) -> Value {
    let mut groups: BTreeMap<String, Vec<(String, Vec<Value>)>> = BTreeMap::new();
    for ((group, version), members) in group_versions(kinds) {
        if group.is_empty() != core {
            continue;
        }
        let resources = members.iter().map(|k| aggregated_resource(k)).collect();
        groups.entry(group).or_default().push((version, resources));
    }
    let items: Vec<Value> = groups
        .into_iter()
        .map(|(group, versions)| {
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(v, r)| json!({"version": v, "resources": r, "freshness": "Current"}))
                .collect();
            json!({"metadata": {"name": group}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
           "metadata": {}, "items": items})
}

/// The legacy `APIResourceList` of `group`/`version`.
fn resource_list(kinds: &Kinds, group: &str, version: &str) -> Option<Value> {
    let members = group_versions(kinds).remove(&(group.to_string(), version.to_string()))?;
    let mut resources = Vec::new();
    for kind in members {
        let (short, categories) = names_of(kind);
        let mut resource = json!({"name": kind.plural, "singularName": kind.kind.to_lowercase(),
            "namespaced": kind.namespaced, "kind": kind.kind, "verbs": VERBS});
        if !short.is_empty() {
            resource["shortNames"] = json!(short);
        }
        if !categories.is_empty() {
            resource["categories"] = json!(categories);
        }
        resources.push(resource);
        for (name, g, v, k, verbs) in subresources(kind) {
            resources.push(
                json!({"name": format!("{}/{name}", kind.plural), "singularName": "",
                "namespaced": kind.namespaced, "group": g, "version": v, "kind": k,
                "verbs": verbs}),
            );
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": group_version, "resources": resources}))
}

fn legacy_groups(kinds: &Kinds) -> Value {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (group, version) in group_versions(kinds).into_keys() {
        if !group.is_empty() {
            groups.entry(group).or_default().push(version);
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            let preferred = versions[0].clone();
            json!({"name": name, "versions": versions, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The OpenAPI v3 index.
fn openapi_index(kinds: &Kinds) -> Value {
    let paths: serde_json::Map<String, Value> = group_versions(kinds)
        .into_keys()
        .map(|(group, version)| {
            let key = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            let url = json!({"serverRelativeURL": format!("/openapi/v3/{key}")});
            (key, url)
        })
        .collect();
    json!({"paths": paths})
}

/// The OpenAPI v3 document of a group version: a `patch` per kind, taking `fieldValidation`.
fn openapi_group(kinds: &Kinds, group: &str, version: &str) -> Option<Value> {
    let members = group_versions(kinds).remove(&(group.to_string(), version.to_string()))?;
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = serde_json::Map::new();
    for kind in members {
        let path = if kind.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", kind.plural)
        } else {
            format!("{prefix}/{}/{{name}}", kind.plural)
        };
        let gvk = json!({"group": kind.group, "version": kind.version, "kind": kind.kind});
        let parameters = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "force", "in": "query", "schema": {"type": "boolean"}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
        ]);
        paths.insert(
            path,
            json!({"patch": {"parameters": parameters, "x-kubernetes-group-version-kind": gvk,
                             "x-kubernetes-action": "patch"}}),
        );
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
                "paths": paths}),
    )
}

/// The discovery or OpenAPI document at `path`, with its content type; `None` when `path`
/// is none of them.
pub fn document(kinds: &Kinds, path: &str, accept: &str) -> Option<(Value, &'static str)> {
    let wants_aggregated = accept.contains("as=APIGroupDiscoveryList");
    let json = "application/json";
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["api"] if wants_aggregated => Some((aggregated(kinds, true), AGGREGATED)),
        ["apis"] if wants_aggregated => Some((aggregated(kinds, false), AGGREGATED)),
        ["api"] => Some((
            json!({"kind": "APIVersions", "versions": ["v1"],
                   "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                   "serverAddress": "127.0.0.1"}]}),
            json,
        )),
        ["apis"] => Some((legacy_groups(kinds), json)),
        ["api", version] => resource_list(kinds, "", version).map(|d| (d, json)),
        ["apis", group, version] => resource_list(kinds, group, version).map(|d| (d, json)),
        ["openapi", "v3"] => Some((openapi_index(kinds), json)),
        ["openapi", "v3", "api", version] => openapi_group(kinds, "", version).map(|d| (d, json)),
        ["openapi", "v3", "apis", group, version] => {
            openapi_group(kinds, group, version).map(|d| (d, json))
        }
        _ => None,
    }
}

/// Whether `path` is a discovery or OpenAPI path (answered by [`document`] or 404).
pub fn is_discovery(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    matches!(
        segments.as_slice(),
        ["api"] | ["apis"] | ["api", _] | ["apis", _, _] | ["openapi", ..]
    )
}
