//! The object store: every object as JSON keyed by kind, namespace and name; one global
//! resourceVersion counter; the event history watches resume from; and the broadcast that
//! live watches follow. Creates and updates are in `write.rs`, deletes and garbage
//! collection in `gc.rs`. Callers hold the lock around read-modify-write.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::kinds::{Kind, Kinds};
use super::meta;
use super::schema::Crd;
use super::selector::Selectors;

/// Identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    group: &'static str,
    plural: &'static str,
    /// Empty for cluster-scoped kinds.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl Key {
    /// The key of `name` of `kind` in `namespace` (ignored for cluster-scoped kinds).
    pub fn new(kind: &Kind, namespace: Option<&str>, name: &str) -> Self {
        let namespace = if kind.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        Self {
            group: kind.group,
            plural: kind.plural,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// A change, as watches see it.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion the change made.
    pub rv: u64,
    /// The object's kind.
    pub kind: &'static Kind,
    /// Its namespace (empty when cluster-scoped).
    pub namespace: String,
    /// What happened.
    pub event_type: EventType,
    /// The object after the change (before it, for a deletion, with the deletion's rv).
    pub object: Value,
    /// For a modification, the object before it (watches with a label selector turn a
    /// change into or out of the selection into ADDED or DELETED, as kube-apiserver does).
    pub previous: Option<Value>,
}

/// What live watches receive.
#[derive(Debug, Clone)]
pub enum Signal {
    /// A change.
    Event(Arc<Event>),
    /// End every watch with a 410 Gone error (history was compacted).
    Expire,
}

/// A CRD installed when the server starts, as if a user had applied it.
#[derive(Debug, Clone)]
pub enum CrdSource {
    /// Run this `kiln` binary's `kiln crd`, on first use.
    KilnBinary(PathBuf),
    /// A CRD manifest (YAML), e.g. Knative Serving's for `serving.knative.dev` Services.
    Yaml(String),
}

/// The state behind the server.
pub struct Store {
    pub(super) objects: BTreeMap<Key, Value>,
    /// The objects each uid owns (`ownerReferences`), and the uids stored: the garbage
    /// collector's lookups on a delete, which scanned every object before (among a fleet's
    /// thousands of objects, most of the server's time).
    owned: HashMap<String, BTreeSet<Key>>,
    uids: HashSet<String>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    compacted: u64,
    history_limit: usize,
    signals: broadcast::Sender<Signal>,
    /// The kinds served: built-in ones and those of the CRDs stored.
    pub kinds: Kinds,
    /// The validators of the custom kinds.
    pub(super) crds: Vec<Crd>,
    /// The cluster CA (PEM), published in every namespace's `kube-root-ca.crt`.
    pub root_ca: String,
}

impl Store {
    /// An empty store keeping at most `history_limit` events for watches to resume from.
    pub fn new(history_limit: usize) -> Self {
        Self {
            objects: BTreeMap::new(),
            owned: HashMap::new(),
            uids: HashSet::new(),
            rv: 1,
            history: VecDeque::new(),
            compacted: 0,
            history_limit,
            signals: broadcast::channel(16 * 1024).0,
            kinds: Kinds::default(),
            crds: Vec::new(),
            root_ca: String::new(),
        }
    }

    /// The current (latest) resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// A stored object.
    pub fn get(&self, kind: &Kind, namespace: Option<&str>, name: &str) -> Option<&Value> {
        self.objects.get(&Key::new(kind, namespace, name))
    }

    /// Objects of `kind` (in `namespace`, or all) matching `selectors`, in key order. The
    /// Events of either Event API are listed by both (`events.rs`).
    pub fn list(&self, kind: &Kind, namespace: Option<&str>, selectors: &Selectors) -> Vec<Value> {
        let other_events = match (kind.group, kind.kind) {
            ("", "Event") => Some((
                "events.k8s.io",
                super::events::to_core as fn(&Value) -> Value,
            )),
            ("events.k8s.io", "Event") => {
                Some(("", super::events::to_events as fn(&Value) -> Value))
            }
            _ => None,
        };
        // A range of the key order (kind, namespace, name), not a scan of every object: a
        // controller's LISTs stay cheap among thousands of objects.
        let namespace = namespace.filter(|_| kind.namespaced);
        let mut items: Vec<(&Key, Value)> = self
            .of_kind(kind.group, kind.plural, namespace)
            .map(|(k, v)| (k, v.clone()))
            .chain(other_events.into_iter().flat_map(|(group, convert)| {
                self.of_kind(group, "events", namespace)
                    .map(move |(k, v)| (k, convert(v)))
            }))
            .filter(|(_, v)| selectors.matches(v))
            .collect();
        items.sort_by(|a, b| (&a.0.namespace, &a.0.name).cmp(&(&b.0.namespace, &b.0.name)));
        items.into_iter().map(|(_, v)| v).collect()
    }

    /// The objects of the kind `group`/`plural` (in `namespace`, or all), in key order.
    fn of_kind<'a>(
        &'a self,
        group: &'static str,
        plural: &'static str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let from = Key {
            group,
            plural,
            namespace: namespace.unwrap_or_default().to_string(),
            name: String::new(),
        };
        self.objects.range(from..).take_while(move |(k, _)| {
            k.group == group && k.plural == plural && namespace.is_none_or(|ns| k.namespace == ns)
        })
    }

    /// Live watch signals from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.signals.subscribe()
    }

    /// Events after `rv`, or `None` when history before them was compacted (410 Gone).
    pub fn events_after(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        // The history is in resourceVersion order.
        let from = self.history.partition_point(|e| e.rv <= rv);
        (rv >= self.compacted).then(|| self.history.range(from..).cloned().collect())
    }

    /// Drops the whole event history: watches from an older resourceVersion get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Compacts and ends every open watch with a 410 Gone error, so watchers relist.
    pub fn expire_watches(&mut self) {
        self.compact();
        // No receivers is fine: then nobody is watching.
        let _ = self.signals.send(Signal::Expire);
    }

    /// The objects whose `ownerReferences` name `uid`.
    pub(super) fn owned_by(&self, uid: &str) -> Vec<Key> {
        self.owned
            .get(uid)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether an object with `uid` is stored.
    pub(super) fn has_uid(&self, uid: &str) -> bool {
        self.uids.contains(uid)
    }

    /// Keeps the owner and uid indexes in step with a change of `kind`'s `object` from
    /// `previous` (for a deletion, `object` is what goes).
    fn index(
        &mut self,
        kind: &'static Kind,
        event_type: EventType,
        object: &Value,
        previous: Option<&Value>,
    ) {
        let key = Key::new(
            kind,
            meta::meta_str(object, "namespace"),
            meta::meta_str(object, "name").unwrap_or_default(),
        );
        let gone = match event_type {
            EventType::Deleted => Some(object),
            _ => previous,
        };
        for uid in gone.map(owner_uids).unwrap_or_default() {
            if let Some(keys) = self.owned.get_mut(&uid) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.owned.remove(&uid);
                }
            }
        }
        let uid = meta::meta_str(object, "uid")
            .unwrap_or_default()
            .to_string();
        if event_type == EventType::Deleted {
            self.uids.remove(&uid);
            return;
        }
        for owner in owner_uids(object) {
            self.owned.entry(owner).or_default().insert(key.clone());
        }
        self.uids.insert(uid);
    }

    /// Records a change: bumps the resourceVersion, stamps it on `object`, keeps the event.
    pub(super) fn commit(
        &mut self,
        kind: &'static Kind,
        event_type: EventType,
        object: &mut Value,
        previous: Option<&Value>,
    ) {
        self.index(kind, event_type, object, previous);
        self.rv += 1;
        meta::metadata_mut(object).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let event = Arc::new(Event {
            rv: self.rv,
            kind,
            namespace: meta::meta_str(object, "namespace")
                .unwrap_or_default()
                .to_string(),
            event_type,
            object: object.clone(),
            previous: previous.cloned(),
        });
        self.history.push_back(Arc::clone(&event));
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        let _ = self.signals.send(Signal::Event(event));
    }
}

/// The uids `obj`'s `ownerReferences` name.
pub(super) fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str().map(str::to_string))
        .collect()
}
