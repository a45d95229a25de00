//! The HTTP face of the fake API server: one axum fallback handler that logs the request,
//! injects faults, authenticates the caller (`auth.rs`), parses the path into a [`Route`]
//! and the query, authorizes the verb with RBAC, and dispatches it (get, list, watch,
//! create, replace, delete, deletecollection; PATCH and the `scale` subresource are in
//! `patching.rs`) to the store under its lock. Answers are JSON objects, lists and `Status`
//! errors as kube-apiserver sends them.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::auth::{self, Attributes, Audit, Tokens, User};
use super::discovery;
use super::error::{Cause, Error, Result};
use super::gc::DeleteOptions;
use super::kinds::{Kind, Route, parse_route};
use super::meta;
use super::observe::{Observer, Request};
use super::patch;
use super::patching;
use super::selector::Selectors;
use super::store::{Key, Store};
use super::table;
use super::watch::{self, WatchRequest};
use super::webhooks;
use super::write::{Target, Write};

/// Everything the handler shares.
pub struct Shared {
    /// The objects.
    pub store: Mutex<Store>,
    /// Request log and faults.
    pub observer: Observer,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// The bearer tokens it accepts.
    pub tokens: Tokens,
    /// Every authorized resource request.
    pub audit: Audit,
}

impl Shared {
    /// The store, locked (a panicked holder does not poison it for other tests' requests).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A request's query parameters, URL-decoded, and the admission phase a write runs in.
#[derive(Debug, Default, Clone)]
pub(super) struct Query(Vec<(String, String)>, Option<Phase>);

/// How far a write goes when admission webhooks take part (`webhooks.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Compute the object mutating webhooks see: a dry run without validation.
    Mutate,
}

impl Query {
    fn parse(query: &str) -> Self {
        Self(
            url::form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect(),
            None,
        )
    }

    /// This query in admission phase `phase`.
    pub(super) fn in_phase(&self, phase: Phase) -> Query {
        Query(self.0.clone(), Some(phase))
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }

    pub(super) fn selectors(&self, kind: &Kind) -> Result<Selectors> {
        Selectors::parse(self.get("labelSelector"), self.get("fieldSelector"), kind)
    }

    pub(super) fn write(&self, target: Target) -> Write {
        let mutate = self.1 == Some(Phase::Mutate);
        Write {
            dry_run: mutate || self.get("dryRun") == Some("All"),
            strict: self.get("fieldValidation") == Some("Strict"),
            validate: !mutate,
            ..Write::to(target)
        }
    }

    /// Whether the client asked for a dry run.
    pub(super) fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
}

/// The answer of a verb: status code and JSON body.
pub(super) type Answer = (StatusCode, Value);

/// The axum handler for every path.
pub async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let raw_query = uri.query().unwrap_or_default().to_string();
    let query = Query::parse(&raw_query);
    let write = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let watch = query.flag("watch");
    let mut record = Request {
        method: method.to_string(),
        path: path.clone(),
        query: raw_query,
        status: 0,
        write,
        changed: false,
        watch,
        injected: false,
    };
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let result = match shared.observer.take_fault(method.as_str(), &path) {
        Some(code) => {
            record.injected = true;
            Err(Error::Injected { code })
        }
        None => match authenticate(&shared, authorization) {
            Err(e) => Err(e),
            Ok(user) if discovery::is_discovery(&path) => auth::authorize_path(&user, &path)
                .and_then(|()| discovery_document(&shared, &path, &headers))
                .map(|response| (response, false)),
            Ok(user) if path == "/version" || !path.starts_with("/api") => {
                auth::authorize_path(&user, &path)
                    .and_then(|()| non_resource(&path))
                    .map(|answer| (json_response(answer), false))
            }
            Ok(user) => {
                let call = Call {
                    user: &user,
                    method: &method,
                    path: &path,
                    query: &query,
                    headers: &headers,
                    body: &body,
                };
                match webhooks::admitted(&shared, &call).await {
                    Ok(Some(done)) => Ok(done),
                    Ok(None) => dispatch(&shared, &call),
                    Err(e) => Err(e),
                }
            }
        },
    };
    let (response, changed) = match result {
        Ok(ok) => ok,
        Err(e) => (e.into_response(), false),
    };
    record.status = response.status().as_u16();
    record.changed = changed;
    shared.observer.record(record);
    response
}

/// The caller (the store is locked only while its ServiceAccount is looked up).
fn authenticate(shared: &Shared, authorization: Option<&str>) -> Result<User> {
    let store = shared.store();
    shared.tokens.authenticate(authorization, &store)
}

/// A resource request, as the handler has it.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    /// Who sends it.
    pub user: &'a User,
    /// The HTTP method.
    pub method: &'a Method,
    /// The path.
    pub path: &'a str,
    /// The query.
    pub query: &'a Query,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The body.
    pub body: &'a [u8],
}

fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// A JSON body with its own content type.
fn typed_response(code: StatusCode, body: &Value, content_type: &'static str) -> Response {
    let mut response = (code, body.to_string()).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(content_type),
    );
    response
}

/// A discovery or OpenAPI document (`discovery.rs`), or 404.
fn discovery_document(shared: &Shared, path: &str, headers: &HeaderMap) -> Result<Response> {
    let store = shared.store();
    match discovery::document(&store.kinds, path, accept(headers)) {
        Some((body, content_type)) => Ok(typed_response(StatusCode::OK, &body, content_type)),
        None => Err(Error::UnknownPath {
            path: path.to_string(),
        }),
    }
}

/// Requests outside `/api` and `/apis`: `/version` (discovery and OpenAPI are in
/// `discovery.rs`).
fn non_resource(path: &str) -> Result<Answer> {
    match path {
        "/version" => Ok((StatusCode::OK, version())),
        "/healthz" | "/livez" | "/readyz" => Ok((StatusCode::OK, Value::String("ok".into()))),
        _ => Err(Error::UnknownPath {
            path: path.to_string(),
        }),
    }
}

/// The field manager of a write: `fieldManager`, else the User-Agent's product
/// (`kubectl/v1.37.1 (…)` → `kubectl`), else `unknown`, as kube-apiserver picks it.
fn field_manager(query: &Query, headers: &HeaderMap) -> String {
    if let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return manager.to_string();
    }
    headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|p| !p.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// The RBAC verb of a resource request (kube-apiserver's `RequestInfo`).
fn verb(method: &Method, named: bool, watch: bool) -> &'static str {
    match (method.as_str(), named) {
        ("GET" | "HEAD", _) if watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "",
    }
}

fn json_response((code, body): Answer) -> Response {
    (code, axum::Json(body)).into_response()
}

/// What `kubectl version` and `Client::apiserver_version` read.
fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-kiln-fake",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn dispatch(shared: &Shared, call: &Call<'_>) -> Result<(Response, bool)> {
    let mut store = shared.store();
    let (route, watch) = prepare(&store, &shared.audit, call)?;
    if *call.method == Method::GET && watch {
        drop(store);
        let req = watch_request(&route, call.query)?;
        return Ok((
            watch::start(&shared.store, req, shared.bookmark_interval)?,
            false,
        ));
    }
    if *call.method == Method::GET && table::wanted(accept(call.headers)) {
        let objects = match route.name {
            Some(_) => vec![get(&store, &route)?.1],
            None => list(&store, &route, call.query)?.1["items"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        };
        let body = table::table(route.kind, &objects, &store.rv().to_string());
        return Ok((typed_response(StatusCode::OK, &body, table::TABLE), false));
    }
    if *call.method == Method::GET && table::metadata_wanted(accept(call.headers)) {
        let (body, media) = match route.name {
            Some(_) => (table::partial(&get(&store, &route)?.1), table::PARTIAL),
            None => {
                let items = list(&store, &route, call.query)?.1["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                (
                    table::partial_list(&items, &store.rv().to_string()),
                    table::PARTIAL_LIST,
                )
            }
        };
        return Ok((typed_response(StatusCode::OK, &body, media), false));
    }
    // The lock is held throughout, so a moved resourceVersion means this request changed
    // something (no-op writes, dry runs and failures leave it).
    let before = store.rv();
    let answer = execute(&mut store, &shared.audit, &shared.tokens, &route, call)?;
    Ok((json_response(answer), store.rv() != before))
}

/// Parses a resource request's path and authorizes it; the flag says whether it is a watch.
///
/// # Errors
/// 404 for an unknown resource or subresource, 403 when RBAC refuses.
pub(super) fn prepare(store: &Store, audit: &Audit, call: &Call<'_>) -> Result<(Route, bool)> {
    let (method, path, query) = (call.method, call.path, call.query);
    let (route, watch_path) = parse_route(&store.kinds, path)?;
    let sub = route.subresource.as_deref();
    let supported = match sub {
        None => true,
        Some("status") => route.kind.status,
        Some("scale") => route.kind.scale,
        Some("token") => route.kind.kind == "ServiceAccount" && route.kind.group.is_empty(),
        Some(_) => false,
    };
    if !supported {
        return Err(Error::UnknownPath {
            path: path.to_string(),
        });
    }
    let watch = watch_path || query.flag("watch");
    let attrs = Attributes::new(
        verb(method, route.name.is_some(), watch),
        route.kind,
        sub,
        route.namespace.as_deref(),
        route.name.as_deref(),
    );
    auth::authorize(store, audit, call.user, &attrs)?;
    Ok((route, watch))
}

/// Runs a prepared request that is no watch.
pub(super) fn execute(
    store: &mut Store,
    audit: &Audit,
    tokens: &Tokens,
    route: &Route,
    call: &Call<'_>,
) -> Result<Answer> {
    let (method, query) = (call.method, call.query);
    let sub = route.subresource.as_deref();
    let manager = field_manager(query, call.headers);
    match (method.clone(), route.name.is_some()) {
        (Method::GET, true) => get(store, route),
        (Method::GET, false) => list(store, route, query),
        (Method::POST, true) if sub == Some("token") => {
            super::lifecycle::token_request(store, tokens, route, call.body)
        }
        (Method::POST, false) => {
            let object = request_object(call)?;
            create(store, route, query, object, &manager)
        }
        (Method::PUT, true) => replace(store, route, query, call.body, &manager),
        (Method::PATCH, true) => {
            let context = patching::Context {
                audit,
                user: call.user,
                manager,
            };
            patching::patch(store, route, query, call.headers, call.body, &context)
        }
        (Method::DELETE, true) => delete(store, route, call.body),
        (Method::DELETE, false) => {
            let opts = DeleteOptions::parse(call.body)?;
            let ns = route.namespace.as_deref();
            let items =
                store.delete_collection(route.kind, ns, &query.selectors(route.kind)?, &opts);
            Ok((StatusCode::OK, list_body(route, store.rv(), items)))
        }
        _ => Err(Error::MethodNotAllowed {
            method: method.to_string(),
        }),
    }
}

fn watch_request(route: &Route, query: &Query) -> Result<WatchRequest> {
    let timeout = match query.get("timeoutSeconds") {
        Some(s) => s.parse().map_err(|_| Error::BadRequest {
            message: format!("invalid timeoutSeconds {s:?}"),
        })?,
        None => 1800, // kube-apiserver's default --min-request-timeout range
    };
    Ok(WatchRequest {
        kind: route.kind,
        namespace: route.namespace.clone(),
        selectors: query.selectors(route.kind)?,
        resource_version: query.get("resourceVersion").map(str::to_string),
        bookmarks: query.flag("allowWatchBookmarks"),
        send_initial_events: query.flag("sendInitialEvents"),
        timeout: Duration::from_secs(timeout),
    })
}

pub(super) fn key(route: &Route) -> Key {
    Key::new(
        route.kind,
        route.namespace.as_deref(),
        route.name.as_deref().unwrap_or_default(),
    )
}

pub(super) fn stored(store: &Store, route: &Route) -> Result<Value> {
    let name = route.name.clone().unwrap_or_default();
    store
        .get(route.kind, route.namespace.as_deref(), &name)
        .cloned()
        .ok_or(Error::NotFound {
            kind: route.kind,
            name,
        })
}

fn get(store: &Store, route: &Route) -> Result<Answer> {
    let obj = stored(store, route)?;
    let body = if route.subresource.as_deref() == Some("scale") {
        patching::scale_view(&obj)
    } else {
        obj
    };
    Ok((StatusCode::OK, body))
}

fn list_body(route: &Route, rv: u64, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": route.kind.api_version(),
        "kind": route.kind.list_kind(),
        "metadata": { "resourceVersion": rv.to_string() },
        "items": items,
    })
}

/// LIST: everything in one page (`limit` and `continue` are accepted; no `continue` token is
/// ever returned), always the latest state whatever `resourceVersion` asks.
fn list(store: &Store, route: &Route, query: &Query) -> Result<Answer> {
    let items = store.list(
        route.kind,
        route.namespace.as_deref(),
        &query.selectors(route.kind)?,
    );
    Ok((StatusCode::OK, list_body(route, store.rv(), items)))
}

/// A POST body: JSON, or the protobuf `kubectl create` sends for some kinds.
fn request_object(call: &Call<'_>) -> Result<Value> {
    let content_type = call
        .headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type.starts_with(super::protobuf::MEDIA_TYPE) {
        super::protobuf::decode(call.body)
    } else {
        patch::parse_json(call.body)
    }
}

fn create(
    store: &mut Store,
    route: &Route,
    query: &Query,
    object: Value,
    manager: &str,
) -> Result<Answer> {
    if route.subresource.is_some() {
        return Err(Error::MethodNotAllowed {
            method: "POST".into(),
        });
    }
    let how = Write {
        managed_fields: true,
        ..query.write(Target::Main)
    };
    let new = store.record_update(route, None, object, Target::Main, manager);
    let obj = store.create(route.kind, route.namespace.as_deref(), new, how)?;
    Ok((StatusCode::CREATED, obj))
}

fn replace(
    store: &mut Store,
    route: &Route,
    query: &Query,
    body: &[u8],
    manager: &str,
) -> Result<Answer> {
    let new = patch::parse_json(body)?;
    if route.subresource.as_deref() == Some("scale") {
        return patching::write_scale(store, route, query, new);
    }
    let target = if route.subresource.is_some() {
        Target::Status
    } else {
        Target::Main
    };
    // Custom resources need optimistic concurrency on PUT, of the object and of its status
    // (the CRD strategies do not allow unconditional updates); built-in kinds allow one.
    if route.kind.custom && meta::meta_str(&new, "resourceVersion").is_none() {
        return Err(Error::Invalid {
            kind: route.kind,
            name: route.name.clone().unwrap_or_default(),
            causes: vec![Cause::new(
                "FieldValueInvalid",
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )],
        });
    }
    let old = stored(store, route)?;
    let new = store.record_update(route, Some(&old), new, target, manager);
    let how = Write {
        managed_fields: true,
        ..query.write(target)
    };
    let (obj, _) = store.update(route.kind, &key(route), new, how)?;
    Ok((StatusCode::OK, obj))
}

fn delete(store: &mut Store, route: &Route, body: &[u8]) -> Result<Answer> {
    if route.subresource.is_some() {
        return Err(Error::MethodNotAllowed {
            method: "DELETE".into(),
        });
    }
    let opts = DeleteOptions::parse(body)?;
    let obj = store.delete(route.kind, &key(route), &opts)?;
    Ok((StatusCode::OK, obj))
}
