//! Label selectors (the full string syntax of `k8s.io/apimachinery/pkg/labels`: `k=v`,
//! `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, comma-joined) and field selectors
//! (`metadata.name`, `metadata.namespace` with `=`, `==`, `!=`). A selector that does not
//! parse is a 400, as on a real server.

use serde_json::Value;

use super::error::Error;
use super::kinds::Kind;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    /// `k` — the label exists.
    Exists(String),
    /// `!k` — the label does not exist.
    Absent(String),
    /// `k=v`, `k==v`, `k in (a,b)` — the label exists with one of the values.
    In(String, Vec<String>),
    /// `k!=v`, `k notin (a,b)` — the label is absent or has none of the values.
    NotIn(String, Vec<String>),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

fn bad_selector(selector: &str, why: &str) -> Error {
    Error::BadRequest {
        message: format!("unable to parse requirement: {why} (in selector {selector:?})"),
    }
}

/// Splits on commas outside parentheses.
fn split_requirements(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `(a, b)` → `["a", "b"]`.
fn parse_set(selector: &str, set: &str) -> Result<Vec<String>, Error> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| bad_selector(selector, "expected a parenthesised set of values"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(|v| !valid_value(v)) {
        return Err(bad_selector(selector, "invalid value in set"));
    }
    Ok(values)
}

fn parse_requirement(selector: &str, req: &str) -> Result<Requirement, Error> {
    let req = req.trim();
    let key_value = |key: &str, value: &str| -> Result<(String, String), Error> {
        let (key, value) = (key.trim(), value.trim());
        if !valid_key(key) || !valid_value(value) {
            return Err(bad_selector(selector, "invalid key or value"));
        }
        Ok((key.to_string(), value.to_string()))
    };
    if let Some((key, value)) = req.split_once("!=") {
        let (key, value) = key_value(key, value)?;
        return Ok(Requirement::NotIn(key, vec![value]));
    }
    if let Some((key, value)) = req.split_once("==").or_else(|| req.split_once('=')) {
        let (key, value) = key_value(key, value)?;
        return Ok(Requirement::In(key, vec![value]));
    }
    let words: Vec<&str> = req.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words.as_slice() {
        let rest = rest.trim_start();
        let (op, set) = rest.split_at(rest.find('(').unwrap_or(rest.len()));
        let key = key.to_string();
        if !valid_key(&key) {
            return Err(bad_selector(selector, "invalid key"));
        }
        return match op.trim() {
            "in" => Ok(Requirement::In(key, parse_set(selector, set)?)),
            "notin" => Ok(Requirement::NotIn(key, parse_set(selector, set)?)),
            other => Err(bad_selector(
                selector,
                &format!("unknown operator {other:?}"),
            )),
        };
    }
    match req.strip_prefix('!') {
        Some(key) if valid_key(key.trim()) => Ok(Requirement::Absent(key.trim().to_string())),
        None if valid_key(req) => Ok(Requirement::Exists(req.to_string())),
        _ => Err(bad_selector(selector, "invalid requirement")),
    }
}

impl LabelSelector {
    /// Parses a `labelSelector` query value.
    ///
    /// # Errors
    /// [`Error::BadRequest`] for a malformed selector.
    /// A `metav1.LabelSelector` object (`matchLabels`, `matchExpressions` with `In`,
    /// `NotIn`, `Exists`, `DoesNotExist`); `null` or `{}` selects everything.
    ///
    /// # Errors
    /// A description of an operator it does not know.
    pub fn from_json(selector: &Value) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for (k, v) in selector["matchLabels"].as_object().into_iter().flatten() {
            reqs.push(Requirement::In(
                k.clone(),
                vec![v.as_str().unwrap_or_default().into()],
            ));
        }
        for expr in selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = expr["key"].as_str().unwrap_or_default().to_string();
            let values: Vec<String> = expr["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            reqs.push(match expr["operator"].as_str() {
                Some("In") => Requirement::In(key, values),
                Some("NotIn") => Requirement::NotIn(key, values),
                Some("Exists") => Requirement::Exists(key),
                Some("DoesNotExist") => Requirement::Absent(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            });
        }
        Ok(Self(reqs))
    }

    /// Parses a `labelSelector` query value.
    pub fn parse(selector: &str) -> Result<Self, Error> {
        if selector.trim().is_empty() {
            return Ok(Self::default());
        }
        split_requirements(selector)
            .into_iter()
            .map(|req| parse_requirement(selector, req))
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let label = |key: &str| {
            obj.pointer("/metadata/labels")
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|req| match req {
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::Absent(k) => label(k).is_none(),
            Requirement::In(k, values) => label(k).is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(k, values) => label(k).is_none_or(|v| values.iter().all(|x| x != v)),
        })
    }
}

/// A parsed field selector: `metadata.name` and `metadata.namespace` for every kind, and the
/// fields kube-apiserver indexes for some kinds (an Event's `involvedObject.*`, a Pod's
/// `spec.nodeName`, a Secret's `type`, …).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The selectable fields of a kind besides `metadata.name` and `metadata.namespace`.
fn selectable(kind: &Kind) -> &'static [&'static str] {
    match (kind.group, kind.kind) {
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "Event") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
        ],
        ("", "Secret") => &["type"],
        ("batch", "Job") => &["status.successful"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses a `fieldSelector` query value for objects of `kind`.
    ///
    /// # Errors
    /// [`Error::BadRequest`] for a malformed selector or a field the kind does not index
    /// ("field label not supported").
    pub fn parse(selector: &str, kind: &Kind) -> Result<Self, Error> {
        let mut terms = Vec::new();
        for term in selector.split(',').filter(|t| !t.trim().is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(Error::BadRequest {
                    message: format!("invalid selector: '{selector}'; can't understand '{term}'"),
                });
            };
            let field = field.trim();
            let known = field == "metadata.name"
                || field == "metadata.namespace"
                || selectable(kind).contains(&field);
            if !known {
                return Err(Error::BadRequest {
                    message: format!("field label not supported: {field}"),
                });
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    /// Whether the object's fields satisfy every term (an absent field is empty; a
    /// `source` is its component).
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let found = if field == "source" {
                obj.pointer("/source/component")
            } else {
                obj.pointer(&pointer)
            };
            let actual = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (actual == *value) == *equal
        })
    }
}

/// A label and a field selector together, from a request's query.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Parses both selectors (each optional).
    ///
    /// # Errors
    /// [`Error::BadRequest`] when either does not parse.
    pub fn parse(labels: Option<&str>, fields: Option<&str>, kind: &Kind) -> Result<Self, Error> {
        Ok(Self {
            labels: LabelSelector::parse(labels.unwrap_or_default())?,
            fields: FieldSelector::parse(fields.unwrap_or_default(), kind)?,
        })
    }

    /// Whether an object matches both.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}
