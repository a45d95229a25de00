//! Walking values by schema: SMD's merge of an applied configuration, the diff of two objects,
//! field sets of values, removal of owned fields and the prune of a re-apply.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::fieldset::{Pe, Set, Val};
use super::managers::Entry;
use super::{ListType, Schema};

/// The walk state: the schema, the field-name path for schema questions and the full path.
pub(super) struct Ctx<'a> {
    schema: &'a dyn Schema,
    names: Vec<String>,
    path: Vec<Pe>,
}

/// How SMD walks a value: as a leaf, key by key, or item by item with the items' path elements.
enum Node<'v> {
    Leaf,
    Struct(&'v Map<String, Value>),
    List(Vec<(Pe, &'v Value)>),
}

/// How two values (either may be absent) are walked together.
enum Pair<'v> {
    Leaf,
    Struct(
        Option<&'v Map<String, Value>>,
        Option<&'v Map<String, Value>>,
    ),
    List(Vec<(Pe, &'v Value)>, Vec<(Pe, &'v Value)>),
}

impl<'a> Ctx<'a> {
    /// A walk from the object root.
    pub(super) fn new(schema: &'a dyn Schema) -> Self {
        Self {
            schema,
            names: Vec::new(),
            path: Vec::new(),
        }
    }

    fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    fn enter(&mut self, field: &str) {
        self.names.push(field.to_owned());
        self.path.push(Pe::Field(field.to_owned()));
    }

    fn leave(&mut self) {
        self.names.pop();
        self.path.pop();
    }

    fn node<'v>(&self, v: &'v Value) -> Node<'v> {
        match v {
            Value::Object(map) if !self.schema.is_atomic(&self.names()) => Node::Struct(map),
            Value::Array(items) => self.items(items).map_or(Node::Leaf, Node::List),
            _ => Node::Leaf,
        }
    }

    /// The path elements of a list's items, or `None` when the list is atomic (or has an item
    /// SMD would reject, which we treat the same way).
    fn items<'v>(&self, items: &'v [Value]) -> Option<Vec<(Pe, &'v Value)>> {
        let names = self.names();
        let list_type = self.schema.list_type(&names);
        let pe = |item: &Value| match &list_type {
            ListType::Atomic => None,
            ListType::Set => match item {
                Value::Object(_) | Value::Array(_) | Value::Null => None,
                _ => Some(Pe::Value(Val(item.clone()))),
            },
            ListType::Map(keys) => {
                let obj = item.as_object()?;
                let mut found: Vec<(String, Val)> = keys
                    .iter()
                    .filter_map(|k| {
                        let v = obj.get(k).filter(|v| !v.is_null()).cloned();
                        Some((
                            k.clone(),
                            Val(v.or_else(|| self.schema.key_default(&names, k))?),
                        ))
                    })
                    .collect();
                found.sort();
                (!found.is_empty()).then_some(Pe::Key(found))
            }
        };
        items.iter().map(|item| Some((pe(item)?, item))).collect()
    }

    /// SMD treats both sides as one leaf when either is a leaf, the shapes differ, or both are
    /// empty (which keeps `{}`/`[]` distinct from absent).
    fn pair<'v>(&self, lhs: Option<&'v Value>, rhs: Option<&'v Value>) -> Pair<'v> {
        match (lhs.map(|v| self.node(v)), rhs.map(|v| self.node(v))) {
            (Some(Node::Struct(l)), Some(Node::Struct(r))) if !(l.is_empty() && r.is_empty()) => {
                Pair::Struct(Some(l), Some(r))
            }
            (Some(Node::Struct(l)), None) if !l.is_empty() => Pair::Struct(Some(l), None),
            (None, Some(Node::Struct(r))) if !r.is_empty() => Pair::Struct(None, Some(r)),
            (Some(Node::List(l)), Some(Node::List(r))) if !(l.is_empty() && r.is_empty()) => {
                Pair::List(l, r)
            }
            (Some(Node::List(l)), None) if !l.is_empty() => Pair::List(l, Vec::new()),
            (None, Some(Node::List(r))) if !r.is_empty() => Pair::List(Vec::new(), r),
            _ => Pair::Leaf,
        }
    }

    /// SMD's `ToFieldSet`: leaves, list items, map entries, empty objects and nulls are
    /// members; a non-empty struct field is only a prefix of its children.
    pub(super) fn field_set(&mut self, v: &Value, out: &mut Set) {
        match self.node(v) {
            Node::Leaf => out.insert(&self.path),
            Node::Struct(map) => {
                let is_map = self.schema.is_map(&self.names());
                for (key, child) in map {
                    self.enter(key);
                    self.field_set(child, out);
                    if is_map || child.is_null() || child.as_object().is_some_and(Map::is_empty) {
                        out.insert(&self.path);
                    }
                    self.leave();
                }
            }
            Node::List(items) => {
                let mut count: BTreeMap<&Pe, usize> = BTreeMap::new();
                for (pe, _) in &items {
                    *count.entry(pe).or_default() += 1;
                }
                for (pe, item) in &items {
                    // Duplicated items are owned as a whole, without their fields.
                    self.path.push(pe.clone());
                    if count.get(pe).is_some_and(|&n| n == 1) {
                        self.field_set(item, out);
                    }
                    out.insert(&self.path);
                    self.path.pop();
                }
            }
        }
    }

    /// SMD's merge of an applied configuration (`rhs`) into the live object (`lhs`).
    pub(super) fn merge(&mut self, lhs: Option<&Value>, rhs: Option<&Value>) -> Option<Value> {
        let (Some(l), Some(r)) = (lhs, rhs) else {
            return rhs.or(lhs).cloned();
        };
        match self.pair(Some(l), Some(r)) {
            Pair::Struct(Some(lm), Some(rm)) => {
                let mut out = Map::new();
                for (key, lv) in lm {
                    self.enter(key);
                    out.extend(self.merge(Some(lv), rm.get(key)).map(|v| (key.clone(), v)));
                    self.leave();
                }
                for (key, rv) in rm.iter().filter(|(k, _)| !lm.contains_key(*k)) {
                    out.insert(key.clone(), rv.clone());
                }
                Some(Value::Object(out))
            }
            Pair::List(li, ri) => Some(Value::Array(self.merge_items(li, ri))),
            _ => Some(r.clone()),
        }
    }

    /// SMD's `visitListItems`: live items keep their places, applied items are merged into
    /// their live twins, and new items go where the applied order puts them.
    fn merge_items(&mut self, lhs: Vec<(Pe, &Value)>, rhs: Vec<(Pe, &Value)>) -> Vec<Value> {
        // Duplicates in the configuration are rejected by SMD; here the first one wins.
        let mut rhs_seen: BTreeMap<Pe, &Value> = BTreeMap::new();
        let mut rhs_pes = Vec::new();
        for (pe, v) in rhs {
            if !rhs_seen.contains_key(&pe) {
                rhs_seen.insert(pe.clone(), v);
                rhs_pes.push(pe);
            }
        }
        // Duplicates in the live list are allowed, but not merged with the applied item.
        let mut lhs_seen: BTreeMap<Pe, Option<&Value>> = BTreeMap::new();
        for (pe, v) in &lhs {
            lhs_seen
                .entry(pe.clone())
                .and_modify(|seen| *seen = None)
                .or_insert(Some(*v));
        }
        let mut shared = rhs_pes.iter().filter(|pe| lhs_seen.contains_key(*pe));
        let mut next_shared = shared.next();
        let mut merged_rhs = BTreeSet::new();
        let mut out = Vec::new();
        let (mut li, mut ri) = (0, 0);
        while li < lhs.len() || ri < rhs_pes.len() {
            if let (Some((pe, _)), Some(rpe)) = (lhs.get(li), rhs_pes.get(ri)) {
                if pe == rpe {
                    merged_rhs.insert(pe.clone());
                    let l = lhs_seen.get(pe).copied().flatten();
                    out.extend(self.merge(l, rhs_seen.get(pe).copied()));
                    (li, ri) = (li + 1, ri + 1);
                    next_shared = shared.next();
                    continue;
                }
                if rhs_seen.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                    // A shared item, but not the next one in the applied order: it comes later.
                    li += 1;
                    continue;
                }
            }
            if let Some((pe, v)) = lhs.get(li) {
                if !rhs_seen.contains_key(pe) {
                    out.push((*v).clone());
                    li += 1;
                    continue;
                }
                if merged_rhs.contains(pe) {
                    li += 1;
                }
            }
            if let Some(pe) = rhs_pes.get(ri) {
                merged_rhs.insert(pe.clone());
                let l = lhs_seen.get(pe).copied().flatten();
                out.extend(self.merge(l, rhs_seen.get(pe).copied()));
                ri += 1;
                if next_shared == Some(pe) {
                    next_shared = shared.next();
                }
            }
        }
        out
    }

    /// SMD's `Compare`: leaves that appear, disappear or change, plus the non-leaf nodes that
    /// appear or disappear (which is why Update entries carry "." on new objects and items).
    pub(super) fn compare(&mut self, lhs: Option<&Value>, rhs: Option<&Value>, diff: &mut Diff) {
        let pair = self.pair(lhs, rhs);
        let is_leaf = matches!(pair, Pair::Leaf);
        match pair {
            Pair::Leaf => match (lhs, rhs) {
                (None, Some(_)) => diff.added.insert(&self.path),
                (Some(_), None) => diff.removed.insert(&self.path),
                (Some(l), Some(r)) if l != r => diff.modified.insert(&self.path),
                _ => {}
            },
            Pair::Struct(lm, rm) => {
                let keys: BTreeSet<&String> =
                    lm.iter().chain(rm.iter()).flat_map(|m| m.keys()).collect();
                for key in keys {
                    self.enter(key);
                    self.compare(
                        lm.and_then(|m| m.get(key)),
                        rm.and_then(|m| m.get(key)),
                        diff,
                    );
                    self.leave();
                }
            }
            Pair::List(li, ri) => {
                let mut by_pe: BTreeMap<Pe, (Vec<&Value>, Vec<&Value>)> = BTreeMap::new();
                for (pe, v) in li {
                    by_pe.entry(pe).or_default().0.push(v);
                }
                for (pe, v) in ri {
                    by_pe.entry(pe).or_default().1.push(v);
                }
                for (pe, (l, r)) in by_pe {
                    self.path.push(pe);
                    match (l.as_slice(), r.as_slice()) {
                        ([] | [_], [] | [_]) => {
                            self.compare(l.first().copied(), r.first().copied(), diff);
                        }
                        // Duplicated keys: the item is compared as a whole.
                        (_, []) => diff.removed.insert(&self.path),
                        ([], _) => diff.added.insert(&self.path),
                        _ if l != r => diff.modified.insert(&self.path),
                        _ => {}
                    }
                    self.path.pop();
                }
            }
        }
        if !is_leaf {
            match (lhs, rhs) {
                (None, Some(_)) => diff.added.insert(&self.path),
                (Some(_), None) => diff.removed.insert(&self.path),
                _ => {}
            }
        }
    }

    /// SMD's `RemoveItems`: drops the members of `set` (with everything below them). Objects
    /// and lists emptied by the removal disappear too (SMD leaves a null that decoding drops).
    pub(super) fn remove(&mut self, v: &Value, set: &Set) -> Option<Value> {
        match self.node(v) {
            Node::Struct(map) if !map.is_empty() => {
                let mut out = Map::new();
                for (key, child) in map {
                    let pe = Pe::Field(key.clone());
                    if set.members.contains(&pe) {
                        continue;
                    }
                    let Some(sub) = set.children.get(&pe) else {
                        out.insert(key.clone(), child.clone());
                        continue;
                    };
                    self.enter(key);
                    out.extend(self.remove(child, sub).map(|v| (key.clone(), v)));
                    self.leave();
                }
                (!out.is_empty()).then_some(Value::Object(out))
            }
            Node::List(items) if !items.is_empty() => {
                let mut out = Vec::new();
                for (pe, item) in items {
                    if set.members.contains(&pe) {
                        continue;
                    }
                    match set.children.get(&pe) {
                        Some(sub) => out.extend(self.remove(item, sub)),
                        None => out.push(item.clone()),
                    }
                }
                (!out.is_empty()).then_some(Value::Array(out))
            }
            _ => Some(v.clone()),
        }
    }

    /// SMD's `EnsureNamedFieldsAreMembers`: a struct field with owned descendants counts as
    /// owned itself, so pruning keeps the structs that lead to other managers' fields.
    fn ensure(&mut self, set: &Set) -> Set {
        let mut out = Set {
            members: set.members.clone(),
            children: BTreeMap::new(),
        };
        let is_map = self.schema.is_map(&self.names());
        for (pe, child) in &set.children {
            let child = match pe {
                Pe::Field(name) => {
                    if !is_map {
                        out.members.insert(pe.clone());
                    }
                    self.enter(name);
                    let child = self.ensure(child);
                    self.leave();
                    child
                }
                _ => self.ensure(child),
            };
            out.children.insert(pe.clone(), child);
        }
        out
    }

    /// Removes the `null` fields of an applied configuration, recording their paths; objects
    /// left empty by that disappear too, so `labels: {a: null}` does not claim `labels`.
    pub(super) fn strip_nulls(&mut self, v: &mut Value, nulls: &mut Set) {
        let pes: Option<Vec<Pe>> = match &*v {
            Value::Array(items) => self
                .items(items)
                .map(|i| i.into_iter().map(|p| p.0).collect()),
            _ => None,
        };
        match v {
            Value::Object(map) if !self.schema.is_atomic(&self.names()) => {
                let mut emptied = Vec::new();
                for (key, child) in map.iter_mut() {
                    self.enter(key);
                    let was_full = child.as_object().is_some_and(|m| !m.is_empty());
                    if child.is_null() {
                        nulls.insert(&self.path);
                    }
                    self.strip_nulls(child, nulls);
                    if child.is_null() || (was_full && child.as_object().is_some_and(Map::is_empty))
                    {
                        emptied.push(key.clone());
                    }
                    self.leave();
                }
                map.retain(|key, _| !emptied.contains(key));
            }
            Value::Array(items) => {
                for (pe, item) in pes.into_iter().flatten().zip(items) {
                    self.path.push(pe);
                    self.strip_nulls(item, nulls);
                    self.path.pop();
                }
            }
            _ => {}
        }
    }
}

/// The outcome of comparing two objects.
#[derive(Default)]
pub(super) struct Diff {
    /// Paths only the new object has.
    pub(super) added: Set,
    /// Leaves whose values differ.
    pub(super) modified: Set,
    /// Paths only the old object has.
    pub(super) removed: Set,
}

/// SMD's `prune`: removes what the applier owned last time and no longer applies, unless a
/// manager (including the applier's new configuration) owns it, in three passes.
pub(super) fn prune(ctx: &mut Ctx, merged: &Value, entries: &[Entry], last: &Set) -> Value {
    let last = ctx.ensure(last);
    let mut managed = entries
        .iter()
        .fold(Set::default(), |all, e| all.union(&e.set));
    // A real configuration always carries metadata.name, so `metadata` is always owned.
    managed.members.insert(Pe::Field("metadata".to_owned()));
    let managed = ctx.ensure(&managed);
    let all = |ctx: &mut Ctx, v: &Value| {
        let mut set = Set::default();
        ctx.field_set(v, &mut set);
        ctx.ensure(&set)
    };
    let remove = |ctx: &mut Ctx, set: &Set| ctx.remove(merged, set).unwrap_or_else(|| json!({}));
    let merged_set = all(ctx, merged);
    let pruned = remove(ctx, &last);
    // Add back what someone owns.
    let pruned_set = all(ctx, &pruned);
    let pruned = remove(ctx, &merged_set.difference(&pruned_set.union(&managed)));
    // Add back what the applier never owned.
    let pruned_set = all(ctx, &pruned);
    remove(ctx, &merged_set.difference(&pruned_set).intersection(&last))
}
