//! Who sends a request and what they may do, as kube-apiserver decides it: bearer tokens
//! (an admin in `system:masters`, and ServiceAccount tokens, valid while their ServiceAccount
//! exists), anonymous requests as `system:anonymous`, the request's verb as
//! `RequestInfo` maps it (`get`/`list`/`watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`; subresources as `resource/subresource`), and RBAC over the Roles,
//! ClusterRoles and bindings stored: verbs, API groups, resources (`*`, `*/sub`),
//! `resourceNames`, and the bootstrap policy's discovery rules for authenticated users.
//! A denial is kube-apiserver's `Forbidden` Status. Every authorized resource request is
//! recorded in an audit log (what the RBAC test derives the controller's rules from).
//!
//! Not modelled: client certificates, impersonation, aggregated ClusterRoles, RBAC's
//! escalation checks (only the admin writes RBAC objects in the tests), token expiry.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use super::error::Error;
use super::kinds::Kind;
use super::meta;
use super::store::Store;

/// An authenticated (or anonymous) user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// `system:serviceaccount:NS:NAME`, `kubernetes-admin`, `system:anonymous`.
    pub name: String,
    /// Its groups (`system:authenticated` included for every authenticated user).
    pub groups: Vec<String>,
}

impl User {
    /// The cluster admin: in `system:masters`, which every request is allowed to.
    pub fn admin() -> User {
        User {
            name: "kubernetes-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    /// A request without credentials.
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    /// The user of ServiceAccount `namespace/name`.
    pub fn service_account(namespace: &str, name: &str) -> User {
        User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// `(namespace, name)` of a ServiceAccount user.
    pub fn service_account_of(&self) -> Option<(&str, &str)> {
        self.name
            .strip_prefix("system:serviceaccount:")?
            .split_once(':')
    }

    fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// Whom a bearer token names.
#[derive(Debug, Clone)]
enum Holder {
    Admin,
    ServiceAccount { namespace: String, name: String },
}

/// The tokens the server accepts.
#[derive(Debug, Default)]
pub struct Tokens(Mutex<HashMap<String, Holder>>);

impl Tokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Holder>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new admin token.
    pub fn admin_token(&self) -> String {
        let token = format!("kiln-test-admin-{}", meta::new_uid());
        self.lock().insert(token.clone(), Holder::Admin);
        token
    }

    /// The token of ServiceAccount `namespace/name` (the same one each time: tests look for
    /// it where it must not be).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let mut tokens = self.lock();
        let existing = tokens.iter().find(|(_, h)| {
            matches!(
                h,
                Holder::ServiceAccount { namespace: n, name: m } if n == namespace && m == name,
            )
        });
        if let Some((token, _)) = existing {
            return token.clone();
        }
        let token = format!("kiln-test-sa-{}", meta::new_uid().replace('-', ""));
        tokens.insert(
            token.clone(),
            Holder::ServiceAccount {
                namespace: namespace.into(),
                name: name.into(),
            },
        );
        token
    }

    /// The user a request's `Authorization` header names: anonymous without one; a
    /// ServiceAccount's token only while its ServiceAccount exists.
    ///
    /// # Errors
    /// 401 Unauthorized for a token the server does not know.
    pub fn authenticate(&self, header: Option<&str>, store: &Store) -> Result<User, Error> {
        let Some(header) = header else {
            return Ok(User::anonymous());
        };
        let token = header.strip_prefix("Bearer ").unwrap_or_default().trim();
        let unauthorized = Error::Status {
            code: 401,
            reason: "Unauthorized",
            message: "Unauthorized".into(),
            details: None,
        };
        match self.lock().get(token) {
            Some(Holder::Admin) => Ok(User::admin()),
            Some(Holder::ServiceAccount { namespace, name }) => {
                let kind = store.kinds.by_name("ServiceAccount");
                if store.get(kind, Some(namespace), name).is_none() {
                    return Err(unauthorized);
                }
                Ok(User::service_account(namespace, name))
            }
            None => Err(unauthorized),
        }
    }
}

/// What a resource request asks: kube-apiserver's authorizer attributes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group (empty for the core group).
    pub group: String,
    /// The resource (plural).
    pub resource: String,
    /// A subresource (`status`, `scale`, `token`), empty for none.
    pub subresource: String,
    /// The namespace (empty: cluster scope, or all namespaces).
    pub namespace: String,
    /// The object's name (empty for collections).
    pub name: String,
}

impl Attributes {
    /// The attributes of a request of `verb` on `kind`.
    pub fn new(
        verb: &str,
        kind: &Kind,
        subresource: Option<&str>,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: kind.group.into(),
            resource: kind.plural.into(),
            subresource: subresource.unwrap_or_default().into(),
            namespace: namespace.unwrap_or_default().into(),
            name: name.unwrap_or_default().into(),
        }
    }

    /// `resource` or `resource/subresource`, as RBAC rules and messages name it.
    pub fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The `Forbidden` Status kube-apiserver answers when `user` may not do this.
    pub fn forbidden(&self, user: &User) -> Error {
        let body = if self.namespace.is_empty() {
            format!(
                "User {:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
                user.name,
                self.verb,
                self.resource_path(),
                self.group
            )
        } else {
            format!(
                "User {:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
                user.name,
                self.verb,
                self.resource_path(),
                self.group,
                self.namespace
            )
        };
        let qualified = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        forbidden(&qualified, &self.group, &self.resource, &self.name, &body)
    }
}

/// kube-apiserver's `NewForbidden`: `RES.GROUP "NAME" is forbidden: BODY`.
pub fn forbidden(qualified: &str, group: &str, resource: &str, name: &str, body: &str) -> Error {
    let message = if name.is_empty() {
        format!("{qualified} is forbidden: {body}")
    } else {
        format!("{qualified} {name:?} is forbidden: {body}")
    };
    let mut details = serde_json::json!({ "kind": resource });
    if !group.is_empty() {
        details["group"] = group.into();
    }
    if !name.is_empty() {
        details["name"] = name.into();
    }
    Error::Status {
        code: 403,
        reason: "Forbidden",
        message,
        details: Some(details),
    }
}

/// Paths every authenticated user may GET (`system:discovery`, `system:public-info-viewer`);
/// a trailing `*` is a prefix.
const DISCOVERY: [&str; 11] = [
    "/livez",
    "/readyz",
    "/healthz",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
];
/// What anonymous users may GET (`system:public-info-viewer`).
const PUBLIC: [&str; 5] = ["/livez", "/readyz", "/healthz", "/version", "/version/"];

fn url_matches(rule: &str, path: &str) -> bool {
    match rule.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => rule == path,
    }
}

/// Authorizes a GET of a non-resource path.
///
/// # Errors
/// 403 `forbidden: User "…" cannot get path "…"`.
pub fn authorize_path(user: &User, path: &str) -> Result<(), Error> {
    let allowed = user.in_group("system:masters")
        || PUBLIC.iter().any(|r| url_matches(r, path))
        || (user.in_group("system:authenticated")
            && DISCOVERY.iter().any(|r| url_matches(r, path)));
    if allowed {
        return Ok(());
    }
    Err(Error::Status {
        code: 403,
        reason: "Forbidden",
        message: format!("forbidden: User {:?} cannot get path {path:?}", user.name),
        details: None,
    })
}

/// Whether RBAC (or `system:masters`) allows `attrs` to `user`, by the objects in `store`.
pub fn allows(store: &Store, user: &User, attrs: &Attributes) -> bool {
    if user.in_group("system:masters") {
        return true;
    }
    let list = |kind: &str| store.list(store.kinds.by_name(kind), None, &Default::default());
    let role_rules = |kind: &str, namespace: &str, name: &str| -> Vec<Value> {
        let kind = store.kinds.by_name(kind);
        let ns = (!namespace.is_empty()).then_some(namespace);
        store
            .get(kind, ns, name)
            .and_then(|r| r["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    let mut rules = Vec::new();
    for binding in list("ClusterRoleBinding") {
        if binds(&binding, user, "") && binding["roleRef"]["kind"] == "ClusterRole" {
            let role = binding["roleRef"]["name"].as_str().unwrap_or_default();
            rules.extend(role_rules("ClusterRole", "", role));
        }
    }
    if !attrs.namespace.is_empty() {
        for binding in list("RoleBinding") {
            if meta::meta_str(&binding, "namespace") != Some(attrs.namespace.as_str())
                || !binds(&binding, user, &attrs.namespace)
            {
                continue;
            }
            let role = binding["roleRef"]["name"].as_str().unwrap_or_default();
            match binding["roleRef"]["kind"].as_str() {
                Some("ClusterRole") => rules.extend(role_rules("ClusterRole", "", role)),
                Some("Role") => rules.extend(role_rules("Role", &attrs.namespace, role)),
                _ => {}
            }
        }
    }
    rules.iter().any(|rule| rule_allows(rule, attrs))
}

/// Whether a binding (in `namespace`, empty for a ClusterRoleBinding) names `user`.
fn binds(binding: &Value, user: &User, namespace: &str) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str() {
                Some("User") => user.name == name,
                Some("Group") => user.in_group(name),
                Some("ServiceAccount") => {
                    let ns = s["namespace"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(namespace);
                    !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            }
        })
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

/// RBAC's `RuleAllows` for a resource request.
fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    let verb = strings(&rule["verbs"]).any(|v| v == "*" || v == attrs.verb);
    let group = strings(&rule["apiGroups"]).any(|g| g == "*" || g == attrs.group);
    let combined = attrs.resource_path();
    let resource = strings(&rule["resources"]).any(|r| {
        r == "*"
            || r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    let mut names = strings(&rule["resourceNames"]).peekable();
    let name = names.peek().is_none() || names.any(|n| !attrs.name.is_empty() && n == attrs.name);
    verb && group && resource && name
}

/// One authorized request, as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditEntry {
    /// Who.
    pub user: String,
    /// What.
    pub attributes: Attributes,
}

/// The audit log.
#[derive(Debug, Default)]
pub struct Audit(Mutex<Vec<AuditEntry>>);

impl Audit {
    /// Records an authorized request.
    pub fn record(&self, user: &User, attributes: &Attributes) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(AuditEntry {
                user: user.name.clone(),
                attributes: attributes.clone(),
            });
    }

    /// Everything recorded so far.
    pub fn entries(&self) -> Vec<AuditEntry> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Authorizes `attrs` for `user`, recording it when allowed.
///
/// # Errors
/// kube-apiserver's 403 Forbidden Status.
pub fn authorize(
    store: &Store,
    audit: &Audit,
    user: &User,
    attrs: &Attributes,
) -> Result<(), Error> {
    if allows(store, user, attrs) {
        audit.record(user, attrs);
        Ok(())
    } else {
        Err(attrs.forbidden(user))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: "apps".into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: "team".into(),
            name: name.into(),
        }
    }

    #[test]
    fn rbac_rules_match_verbs_resources_subresources_and_names_as_kube_apiserver_does() {
        let rule = json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]});
        assert!(rule_allows(&rule, &attrs("patch", "deployments", "", "a")));
        assert!(!rule_allows(
            &rule,
            &attrs("create", "deployments", "", "a")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("patch", "deployments", "status", "a")
        ));
        let sub = json!({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]});
        assert!(rule_allows(
            &sub,
            &attrs("update", "deployments", "status", "a")
        ));
        assert!(!rule_allows(&sub, &attrs("update", "deployments", "", "a")));
        let named = json!({
            "apiGroups": ["apps"],
            "resources": ["deployments"],
            "verbs": ["get", "list"],
            "resourceNames": ["a"]
        });
        assert!(rule_allows(&named, &attrs("get", "deployments", "", "a")));
        assert!(!rule_allows(&named, &attrs("get", "deployments", "", "b")));
        assert!(!rule_allows(&named, &attrs("list", "deployments", "", "")));
    }

    #[test]
    fn a_denial_reads_as_kube_apiservers_forbidden_status() {
        let user = User::service_account("kiln-system", "kiln-controller");
        let status = attrs("create", "deployments", "", "hello")
            .forbidden(&user)
            .to_status();
        assert_eq!(
            status["message"],
            "deployments.apps \"hello\" is forbidden: User \
             \"system:serviceaccount:kiln-system:kiln-controller\" cannot create resource \
             \"deployments\" in API group \"apps\" in the namespace \"team\""
        );
        assert_eq!(status["reason"], "Forbidden");
        assert_eq!(status["code"], 403);
        assert_eq!(
            status["details"],
            json!({"name": "hello", "group": "apps", "kind": "deployments"})
        );
    }
}
