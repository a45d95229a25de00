//! Path elements and field sets: the trie of owned paths, its `fieldsV1` encoding and SMD's
//! path strings.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// A JSON value with SMD's total order (numbers, then strings, bools, lists, maps), so list
/// keys and set items can live in ordered sets.
#[derive(Clone, Debug)]
pub(super) struct Val(pub(super) Value);

impl Ord for Val {
    fn cmp(&self, other: &Self) -> Ordering {
        fn rank(v: &Value) -> u8 {
            match v {
                Value::Number(_) => 0,
                Value::String(_) => 1,
                Value::Bool(_) => 2,
                Value::Array(_) => 3,
                Value::Object(_) => 4,
                Value::Null => 5,
            }
        }
        match (&self.0, &other.0) {
            (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
                (Some(a), Some(b)) => a.cmp(&b),
                _ => a
                    .as_f64()
                    .partial_cmp(&b.as_f64())
                    .unwrap_or(Ordering::Equal),
            },
            (Value::String(a), Value::String(b)) => a.cmp(b),
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (a, b) if rank(a) == rank(b) => a.to_string().cmp(&b.to_string()),
            (a, b) => rank(a).cmp(&rank(b)),
        }
    }
}

impl PartialOrd for Val {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Val {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Val {}

/// One step of a field path. The variant order is SMD's: fields, keys, values, indexes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Pe {
    /// Struct field or map entry.
    Field(String),
    /// List-map item: its key fields, sorted by name.
    Key(Vec<(String, Val)>),
    /// Set item.
    Value(Val),
    /// List item by position (`i:`); only ever read from `fieldsV1` here.
    Index(usize),
}

impl Pe {
    /// The `fieldsV1` key: `f:name`, `k:{"name":"app"}`, `v:"x"`, `i:0`.
    fn fields_v1(&self) -> String {
        match self {
            Self::Field(name) => format!("f:{name}"),
            Self::Key(keys) => {
                let keys: Map<String, Value> =
                    keys.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
                format!("k:{}", Value::Object(keys))
            }
            Self::Value(v) => format!("v:{}", v.0),
            Self::Index(i) => format!("i:{i}"),
        }
    }

    fn from_fields_v1(key: &str) -> Option<Self> {
        let (kind, rest) = key.split_at_checked(2)?;
        match kind {
            "f:" => Some(Self::Field(rest.to_owned())),
            "k:" => {
                let Value::Object(map) = serde_json::from_str(rest).ok()? else {
                    return None;
                };
                let mut keys: Vec<_> = map.into_iter().map(|(k, v)| (k, Val(v))).collect();
                keys.sort();
                Some(Self::Key(keys))
            }
            "v:" => serde_json::from_str(rest).ok().map(|v| Self::Value(Val(v))),
            "i:" => rest.parse().ok().map(Self::Index),
            _ => None,
        }
    }
}

/// SMD's `value.ToString`, used in path strings: strings quoted, everything else bare.
fn value_string(v: &Value) -> String {
    match v {
        Value::String(_) => v.to_string(),
        Value::Array(items) => {
            let items: Vec<_> = items.iter().map(value_string).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", value_string(v)))
            .collect(),
        _ => v.to_string(),
    }
}

/// SMD's path string, as in conflict messages: `.spec.containers[name="app"].image`.
pub(super) fn path_string(path: &[Pe]) -> String {
    path.iter()
        .map(|pe| match pe {
            Pe::Field(name) => format!(".{name}"),
            Pe::Key(keys) => {
                let keys: Vec<_> = keys
                    .iter()
                    .map(|(k, v)| format!("{k}={}", value_string(&v.0)))
                    .collect();
                format!("[{}]", keys.join(","))
            }
            Pe::Value(v) => format!("[={}]", value_string(&v.0)),
            Pe::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// A set of field paths as a trie: `members` are owned paths ending here, `children` lead to
/// deeper ones (a node can be both: the `.` of `fieldsV1`). Children are never empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Set {
    /// The last elements of the owned paths that end at this node.
    pub(super) members: BTreeSet<Pe>,
    /// The subtries of the owned paths that go deeper.
    pub(super) children: BTreeMap<Pe, Set>,
}

impl Set {
    /// Adds `path` (the empty path is ignored).
    pub(super) fn insert(&mut self, path: &[Pe]) {
        match path {
            [] => {}
            [pe] => {
                self.members.insert(pe.clone());
            }
            [pe, rest @ ..] => self.children.entry(pe.clone()).or_default().insert(rest),
        }
    }

    /// Whether the set holds no path.
    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// The paths of either set.
    pub(super) fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, child) in &other.children {
            let mine = out.children.entry(pe.clone()).or_default();
            *mine = mine.union(child);
        }
        out
    }

    /// The paths of `self` that are not in `other` (a member is not removed by a descendant).
    pub(super) fn difference(&self, other: &Set) -> Set {
        let children = self.children.iter().filter_map(|(pe, child)| {
            let rest = other
                .children
                .get(pe)
                .map_or_else(|| child.clone(), |o| child.difference(o));
            (!rest.is_empty()).then(|| (pe.clone(), rest))
        });
        Set {
            members: self.members.difference(&other.members).cloned().collect(),
            children: children.collect(),
        }
    }

    /// The paths of both sets.
    pub(super) fn intersection(&self, other: &Set) -> Set {
        let children = self.children.iter().filter_map(|(pe, child)| {
            let both = child.intersection(other.children.get(pe)?);
            (!both.is_empty()).then(|| (pe.clone(), both))
        });
        Set {
            members: self.members.intersection(&other.members).cloned().collect(),
            children: children.collect(),
        }
    }

    /// Every path, in SMD's iteration order: this level's members, then each child's paths.
    pub(super) fn paths(&self) -> Vec<Vec<Pe>> {
        let mut out: Vec<Vec<Pe>> = self.members.iter().map(|pe| vec![pe.clone()]).collect();
        for (pe, child) in &self.children {
            out.extend(child.paths().into_iter().map(|mut p| {
                p.insert(0, pe.clone());
                p
            }));
        }
        out
    }

    /// The `fieldsV1` trie of the set.
    pub(super) fn to_fields_v1(&self) -> Value {
        let mut out = Map::new();
        // Members and children in one sorted walk, as SMD emits them; a member that also has
        // children is marked with "." inside its node.
        let keys: BTreeSet<&Pe> = self.members.iter().chain(self.children.keys()).collect();
        for pe in keys {
            let mut node = Map::new();
            if let Some(child) = self.children.get(pe) {
                if self.members.contains(pe) {
                    node.insert(".".to_owned(), json!({}));
                }
                if let Value::Object(inner) = child.to_fields_v1() {
                    node.extend(inner);
                }
            }
            out.insert(pe.fields_v1(), Value::Object(node));
        }
        Value::Object(out)
    }

    /// Parses a `fieldsV1` trie; keys that are not path elements are skipped.
    pub(super) fn from_fields_v1(trie: &Value) -> Set {
        let mut out = Set::default();
        for (key, node) in trie.as_object().into_iter().flatten() {
            let Some(pe) = Pe::from_fields_v1(key) else {
                continue;
            };
            let child = Set::from_fields_v1(node);
            let is_member = node.as_object().is_none_or(|n| n.contains_key("."));
            if child.is_empty() || is_member {
                out.members.insert(pe.clone());
            }
            if !child.is_empty() {
                out.children.insert(pe, child);
            }
        }
        out
    }
}
