//! The PATCH verb (merge, strategic-as-merge and JSON patches; server-side apply with its
//! `fieldManager` requirement and resourceVersion precondition) and the `scale` subresource
//! (an `autoscaling/v1` Scale over `.spec.replicas`, `.status.replicas`,
//! `.status.podSelector`), on top of the store's update path.

use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};

use super::apply::{self, Scope};
use super::auth::{self, Attributes, Audit, User};
use super::error::{Cause, Error, Result};
use super::kinds::Route;
use super::meta;
use super::patch::{self, PatchKind};
use super::server::{Answer, Query, key, stored};
use super::store::Store;
use super::write::{Target, Write};

/// Who patches: an apply that creates an object is authorized as `create` too; other
/// patches are recorded as the manager's `Update`.
pub(super) struct Context<'a> {
    /// Where authorized requests are recorded.
    pub audit: &'a Audit,
    /// The caller.
    pub user: &'a User,
    /// The field manager of a non-apply write (`fieldManager`, else the User-Agent's
    /// product, as kube-apiserver takes it).
    pub manager: String,
}

/// PATCH of an object, its status or its scale.
pub(super) fn patch(
    store: &mut Store,
    route: &Route,
    query: &Query,
    headers: &HeaderMap,
    body: &[u8],
    context: &Context<'_>,
) -> Result<Answer> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kind = PatchKind::from_content_type(content_type)?;
    let target = if route.subresource.as_deref() == Some("status") {
        Target::Status
    } else {
        Target::Main
    };
    if kind == PatchKind::Apply {
        return server_side_apply(store, route, query, body, target, context);
    }
    let name = route.name.clone().unwrap_or_default();
    let invalid = |message: String| Error::Invalid {
        kind: route.kind,
        name: name.clone(),
        causes: vec![Cause::new("FieldValueInvalid", "", message)],
    };
    let current = stored(store, route)?;
    if route.subresource.as_deref() == Some("scale") {
        let scale = patch::apply_patch(kind, &scale_view(&current), body, invalid)?;
        return write_scale(store, route, query, scale);
    }
    let new = patch::apply_patch(kind, &current, body, invalid)?;
    let new = store.record_update(route, Some(&current), new, target, &context.manager);
    let how = Write {
        managed_fields: true,
        ..query.write(target)
    };
    let (obj, _) = store.update(route.kind, &key(route), new, how)?;
    Ok((StatusCode::OK, obj))
}

/// A server-side apply's conflicts as kube-apiserver's 409 Status.
fn conflict_status(conflicts: &apply::Conflicts) -> Error {
    let causes: Vec<serde_json::Value> = conflicts
        .causes()
        .into_iter()
        .map(|(message, field)| {
            json!({"reason": "FieldManagerConflict", "message": message, "field": field})
        })
        .collect();
    Error::Status {
        code: 409,
        reason: "Conflict",
        message: conflicts.message(),
        details: Some(json!({ "causes": causes })),
    }
}

fn server_side_apply(
    store: &mut Store,
    route: &Route,
    query: &Query,
    body: &[u8],
    target: Target,
    context: &Context<'_>,
) -> Result<Answer> {
    let name = route.name.clone().unwrap_or_default();
    let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(Error::Invalid {
            kind: route.kind,
            name,
            causes: vec![Cause::new(
                "FieldValueRequired",
                "fieldManager",
                "Required value: is required for apply patch",
            )],
        });
    };
    let applied = patch::parse_apply(body)?;
    let sent_name = meta::name_of(&applied);
    if !sent_name.is_empty() && sent_name != name {
        return Err(Error::BadRequest {
            message: format!(
                "the name of the object ({sent_name}) does not match the name on the URL ({name})"
            ),
        });
    }
    let scope = match target {
        Target::Status => Scope::Status,
        _ => Scope::Main {
            status_subresource: route.kind.status,
        },
    };
    let how = Write {
        managed_fields: true,
        ..query.write(target)
    };
    let api_version = route.kind.api_version();
    let sent_rv = meta::meta_str(&applied, "resourceVersion");
    let schema = store.field_schema(route.kind);
    let apply_onto = |live: &serde_json::Value| {
        let force = query.flag("force");
        apply::apply(
            live,
            &applied,
            manager,
            scope,
            &api_version,
            force,
            schema.as_ref(),
        )
        .map_err(|c| conflict_status(&c))
    };
    match store
        .get(route.kind, route.namespace.as_deref(), &name)
        .cloned()
    {
        None if target == Target::Status => Err(Error::NotFound {
            kind: route.kind,
            name,
        }),
        None if sent_rv.is_some() => Err(Error::Conflict {
            kind: route.kind,
            name,
        }),
        None => {
            let skeleton = json!({
                "apiVersion": api_version,
                "kind": route.kind.kind,
                "metadata": { "name": name },
            });
            let new = apply_onto(&skeleton)?;
            // An apply that creates is a create too (k8s.io/apiserver endpoints/handlers/
            // patch.go, createAuthorizerAttributes), checked once the object is valid.
            store.create(
                route.kind,
                route.namespace.as_deref(),
                new.clone(),
                Write {
                    dry_run: true,
                    ..how
                },
            )?;
            let attrs = Attributes::new(
                "create",
                route.kind,
                route.subresource.as_deref(),
                route.namespace.as_deref(),
                Some(&name),
            );
            auth::authorize(store, context.audit, context.user, &attrs)?;
            let obj = store.create(route.kind, route.namespace.as_deref(), new, how)?;
            Ok((StatusCode::CREATED, obj))
        }
        Some(live) => {
            if sent_rv.is_some_and(|rv| Some(rv) != meta::meta_str(&live, "resourceVersion")) {
                return Err(Error::Conflict {
                    kind: route.kind,
                    name,
                });
            }
            let new = apply_onto(&live)?;
            let (obj, _) = store.update(route.kind, &key(route), new, how)?;
            Ok((StatusCode::OK, obj))
        }
    }
}

/// The `autoscaling/v1` Scale of an object (`.spec.replicas`, `.status.replicas`,
/// `.status.podSelector` — the Function CRD's scale paths).
pub fn scale_view(obj: &Value) -> Value {
    let metadata = &obj["metadata"];
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
            "resourceVersion": metadata["resourceVersion"],
            "creationTimestamp": metadata["creationTimestamp"],
        },
        "spec": { "replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0)) },
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": obj.pointer("/status/podSelector").cloned().unwrap_or(json!("")),
        },
    })
}

/// Writes a Scale's `spec.replicas` back into the object (with its resourceVersion as a
/// precondition) and answers the new Scale.
pub(super) fn write_scale(
    store: &mut Store,
    route: &Route,
    query: &Query,
    scale: Value,
) -> Result<Answer> {
    let mut obj = stored(store, route)?;
    let replicas = scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0));
    obj["spec"]["replicas"] = replicas;
    let rv = meta::meta_str(&scale, "resourceVersion").map(str::to_string);
    let metadata = meta::metadata_mut(&mut obj);
    match rv {
        Some(rv) => metadata.insert("resourceVersion".into(), json!(rv)),
        None => metadata.remove("resourceVersion"),
    };
    let (obj, _) = store.update(route.kind, &key(route), obj, query.write(Target::Main))?;
    Ok((StatusCode::OK, scale_view(&obj)))
}
