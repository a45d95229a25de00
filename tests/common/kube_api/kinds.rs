//! The resource kinds the fake API server knows — the built-in ones below, and those that
//! CustomResourceDefinitions define while the server runs ([`Kinds::register`]) — and the
//! parsing of request paths into a [`Route`] (kind, namespace, name, subresource). An unknown
//! path is a 404, as on a real server; nothing here touches stored objects.

use super::error::Error;

/// One resource kind, as its API group's discovery document would describe it.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind, e.g. `ConfigMap`.
    pub kind: &'static str,
    /// Lower-case plural used in paths, e.g. `configmaps`.
    pub plural: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether it has a `status` subresource (main writes keep `.status`, `/status` writes
    /// change only `.status`).
    pub status: bool,
    /// Whether it has a `scale` subresource over `.spec.replicas` / `.status.replicas`.
    pub scale: bool,
    /// A custom resource: a PUT must carry `metadata.resourceVersion`, as for every CRD.
    pub custom: bool,
    /// How names are validated.
    pub names: NameRule,
    /// What discovery and `kubectl` know of a custom kind (its CRD's names and printer
    /// columns); `None` for built-in kinds.
    pub crd: Option<&'static CrdNames>,
}

/// The names and columns a CRD gives its kind.
#[derive(Debug, PartialEq, Eq)]
pub struct CrdNames {
    /// `spec.names.singular`.
    pub singular: String,
    /// `spec.names.shortNames`.
    pub short_names: Vec<String>,
    /// `spec.names.categories`.
    pub categories: Vec<String>,
    /// The served version's `additionalPrinterColumns` (JSON objects as the CRD has them).
    pub columns: Vec<serde_json::Value>,
    /// `scale.specReplicasPath`, `statusReplicasPath`, `labelSelectorPath` when it has a
    /// scale subresource.
    pub scale_paths: Option<[String; 3]>,
}

/// The name rule of a kind (kube-apiserver's `ValidateObjectMeta` name functions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain: lower-case alphanumerics, `-` and `.`, at most 253 characters.
    Subdomain,
    /// RFC 1123 label: lower-case alphanumerics and `-`, at most 63 characters.
    Label,
    /// RFC 1035 label: like a 1123 label, but starting with a letter (Services).
    Label1035,
}

const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
) -> Kind {
    Kind {
        group,
        version,
        kind,
        plural,
        namespaced: true,
        status: false,
        scale: false,
        custom: false,
        names: NameRule::Subdomain,
        crd: None,
    }
}

const fn cluster(k: Kind) -> Kind {
    Kind {
        namespaced: false,
        ..k
    }
}

const fn with_status(k: Kind) -> Kind {
    Kind { status: true, ..k }
}

/// Every built-in kind served. The first entry of a kind name wins a lookup by bare kind name
/// (`Service` is the core one; `Service.serving.knative.dev` names Knative's).
pub static BUILTIN: &[Kind] = &[
    kind("", "v1", "ConfigMap", "configmaps"),
    kind("", "v1", "Secret", "secrets"),
    Kind {
        names: NameRule::Label1035,
        ..with_status(kind("", "v1", "Service", "services"))
    },
    with_status(kind("", "v1", "Pod", "pods")),
    kind("", "v1", "Event", "events"),
    Kind {
        names: NameRule::Label,
        ..cluster(with_status(kind("", "v1", "Namespace", "namespaces")))
    },
    kind("", "v1", "ServiceAccount", "serviceaccounts"),
    cluster(with_status(kind("", "v1", "Node", "nodes"))),
    with_status(kind("batch", "v1", "Job", "jobs")),
    with_status(kind("apps", "v1", "Deployment", "deployments")),
    with_status(kind(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
    )),
    kind("coordination.k8s.io", "v1", "Lease", "leases"),
    kind(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
    ),
    kind("events.k8s.io", "v1", "Event", "events"),
    kind("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
    ),
    cluster(kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
    )),
    cluster(kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
    )),
    cluster(kind(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
    )),
    cluster(kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
    )),
    cluster(with_status(kind(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    ))),
];

/// The kinds served now: the built-in ones, and those CRDs defined.
#[derive(Debug, Default)]
pub struct Kinds {
    custom: Vec<&'static Kind>,
}

impl Kinds {
    /// Every kind, built-in ones first.
    pub fn all(&self) -> impl Iterator<Item = &'static Kind> + '_ {
        BUILTIN.iter().chain(self.custom.iter().copied())
    }

    /// Serves `kind` (a CRD's version) from now on; the same group, version and plural
    /// again replaces the earlier definition (a CRD updated). Kinds are leaked: a test's
    /// server defines a handful.
    pub fn register(&mut self, kind: Kind) -> &'static Kind {
        self.custom.retain(|k| {
            !(k.group == kind.group && k.version == kind.version && k.plural == kind.plural)
        });
        let kind: &'static Kind = Box::leak(Box::new(kind));
        self.custom.push(kind);
        kind
    }

    /// Stops serving the custom kinds of `group`/`plural` (their CRD was deleted).
    pub fn unregister(&mut self, group: &str, plural: &str) {
        self.custom
            .retain(|k| !(k.group == group && k.plural == plural));
    }

    /// The kind served at `group`/`version`/`plural`.
    pub fn by_path(&self, group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
        self.all()
            .find(|k| k.group == group && k.version == version && k.plural == plural)
    }

    /// The kind of an object's `apiVersion` and `kind`.
    pub fn by_type(&self, api_version: &str, kind: &str) -> Option<&'static Kind> {
        self.all()
            .find(|k| k.kind == kind && k.api_version() == api_version)
    }

    /// A kind by name for the test handle: `ConfigMap`, `Function`, or `Kind.group` to pick
    /// among kinds of the same name (`Service.serving.knative.dev`, `Event.events.k8s.io`).
    ///
    /// # Panics
    /// When no kind has that name: a typo in a test should fail loudly.
    pub fn by_name(&self, name: &str) -> &'static Kind {
        let (kind, group) = match name.split_once('.') {
            Some((kind, group)) => (kind, Some(group)),
            None => (name, None),
        };
        self.all()
            .find(|k| k.kind == kind && group.is_none_or(|g| g == k.group))
            .unwrap_or_else(|| {
                let known: Vec<String> = self.all().map(Kind::qualified_kind).collect();
                panic!("the fake API server has no kind {name:?}; known: {known:?}")
            })
    }
}

impl Kind {
    /// `apiVersion` of its objects: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The kind of its lists, e.g. `ConfigMapList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `kind.group` as kube-apiserver names a resource in messages (`Function.serverless…`),
    /// the bare kind for the core group.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// `plural.group` as used in NotFound/Conflict messages (`jobs.batch`), the plural for
    /// the core group.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// What a request path addresses.
#[derive(Debug, Clone)]
pub struct Route {
    /// The resource kind.
    pub kind: &'static Kind,
    /// The namespace in the path (`None`: all namespaces, or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// The object's name (`None`: the collection).
    pub name: Option<String>,
    /// A subresource such as `status` or `scale`.
    pub subresource: Option<String>,
}

/// Parses `/api/v1/…` and `/apis/{group}/{version}/…` paths (`/watch/` after the version
/// included, as old clients send watches) into a route of a kind of `kinds`; the flag says
/// whether the path named the `watch` verb.
///
/// # Errors
/// [`Error::UnknownPath`] for anything that is not a known resource URL.
pub fn parse_route(kinds: &Kinds, path: &str) -> Result<(Route, bool), Error> {
    let unknown = || Error::UnknownPath {
        path: path.to_string(),
    };
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(unknown()),
    };
    let (rest, watch) = match rest {
        ["watch", rest @ ..] => (rest, true),
        _ => (rest, false),
    };
    let route = |plural: &str, namespace: Option<&str>, name: Option<&&str>, sub: Option<&&str>| {
        let kind = kinds.by_path(group, version, plural).ok_or_else(unknown)?;
        // A namespaced object needs its namespace; a cluster-scoped kind has none. Only the
        // collection of a namespaced kind may be listed across namespaces.
        let misplaced = match (kind.namespaced, namespace.is_some()) {
            (true, false) => name.is_some(),
            (false, true) => true,
            _ => false,
        };
        if misplaced {
            return Err(unknown());
        }
        Ok(Route {
            kind,
            namespace: namespace.map(str::to_string),
            name: name.map(|n| (*n).to_string()),
            subresource: sub.map(|s| (*s).to_string()),
        })
    };
    let route = match rest {
        // A Namespace object and its subresources live under the same prefix as the
        // namespaced resources: /api/v1/namespaces/{name}[/status|/finalize].
        ["namespaces", name] if group.is_empty() => route("namespaces", None, Some(name), None),
        ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
            route("namespaces", None, Some(name), Some(sub))
        }
        ["namespaces", ns, plural, tail @ ..] if tail.len() <= 2 => {
            route(plural, Some(ns), tail.first(), tail.get(1))
        }
        [plural, tail @ ..] if tail.len() <= 2 => route(plural, None, tail.first(), tail.get(1)),
        _ => Err(unknown()),
    }?;
    Ok((route, watch))
}
