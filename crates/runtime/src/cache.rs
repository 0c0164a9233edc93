//! The informer's local copy of one kind, indexed for the lookups controllers make.
//!
//! Guarantees:
//! - each object is held once: as an `Arc<Value>` readers get cheap clones of, or, in a compact
//!   cache (`compact_pods`), as its JSON text that each reader gets parsed back into a `Value`
//!   equal to the object that entered; the indexes hold keys, never copies of objects;
//! - the indexes (namespace, label `key=value`, controller owner uid, `spec.nodeName`) always agree
//!   with the objects: both change under the same write lock;
//! - a copy of an object older than the cached one (by `metadata.resourceVersion`) never replaces
//!   it, and a deletion older than the cached copy never removes it, so a late or replayed event
//!   cannot move the cache backwards;
//! - the digest of the cached (key, resourceVersion) pairs (`shepherd_api::digest`) is kept with
//!   every change, for the informer's anti-entropy check;
//! - `metadata.managedFields` is dropped from every object as it enters, as kube-controller-manager's
//!   and kube-scheduler's informers drop it: no controller reads it, an update without it keeps the
//!   server's, and parsed it is most of a pod (its `fieldsV1` sets are many one-key maps: ~20 KB of a
//!   ~40 KB pod, see BENCHMARKS.md section 3, 4, 5);
//! - a kind may have a projection (`set_transform`, client-go's `SetTransform`): every object of
//!   it is cached, handed to subscribers and served to readers as the projection made it;
//! - a cache of pods (`with_pod_views`, `compact_pods`) keeps beside each pod its `PodView`, read
//!   from the object once as it enters, so controllers that scan many pods read flat fields instead
//!   of the JSON; a view always belongs to the object cached with it;
//! - a compact cache hands subscribers the object the informer decoded (a change parses nothing
//!   new but the previous copy of an update, and that only once nobody holds it any more), and
//!   readers the same `Arc` while anyone still holds it; what must be parsed is parsed after the
//!   lock is released. A parsed pod is ~4 times its text and view (each JSON object is a B-tree
//!   node of several hundred bytes however few its keys): ~10 KB against ~2.3 KB in this module's
//!   memory test, so a cluster-wide pod cache is kept compact and its scanning readers read views
//!   (BENCHMARKS.md section 3, 4, 5).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use bytes::Bytes;

use serde_json::Value;
use shepherd_api::JsonPath;
use shepherd_api::digest::{SetDigest, bucket_of};
use shepherd_pack::{Packed, Packer};

use crate::view::PodView;

/// A change the cache went through, handed to informer subscribers.
#[derive(Debug, Clone)]
pub enum Change {
    Added(Arc<Value>),
    Updated { old: Arc<Value>, new: Arc<Value> },
    Deleted(Arc<Value>),
}

impl Change {
    /// The object as it stands after the change (the last known state for a deletion).
    pub fn object(&self) -> &Arc<Value> {
        match self {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        }
    }
}

/// Drops `metadata.managedFields` from an object about to be cached.
fn strip_managed_fields(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
}

/// `namespace/name` for namespaced objects, `name` for cluster-scoped ones; `None` without a name.
pub fn object_key(obj: &Value) -> Option<String> {
    let name = obj.at("/metadata/name").and_then(Value::as_str)?;
    match obj.at("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => Some(format!("{ns}/{name}")),
        _ => Some(name.to_string()),
    }
}

/// The revision in `metadata.resourceVersion`, if it is a decimal u64.
pub fn resource_version(obj: &Value) -> Option<u64> {
    obj.at("/metadata/resourceVersion").and_then(Value::as_str).and_then(|rv| rv.parse().ok())
}

/// The uid of the owner reference marked `controller: true`, with that owner's kind and name.
pub fn controller_owner(obj: &Value) -> Option<(&str, &str, &str)> {
    obj.at("/metadata/ownerReferences")?.as_array()?.iter().find_map(|r| {
        if r.get("controller").and_then(Value::as_bool) != Some(true) {
            return None;
        }
        Some((r.get("kind")?.as_str()?, r.get("name")?.as_str()?, r.get("uid")?.as_str()?))
    })
}

/// What a cache keeps of each object of its kind. It must keep `metadata` (the key, the
/// resourceVersion and the indexed fields are read from it) and every field a reader of that
/// kind's cache looks at.
pub type Transform = Arc<dyn Fn(Value) -> Value + Send + Sync>;

/// How deep a compact cache's text may nest: `serde_json` parses at most 128 levels, so an object
/// nested deeper is kept parsed rather than as text that would not parse back.
const TEXT_DEPTH: usize = 100;

/// An object store for one kind with secondary indexes. Shared by every controller of a process.
#[derive(Default)]
pub struct Cache {
    state: RwLock<State>,
    transform: OnceLock<Transform>,
    /// Whether each object gets a `PodView` as it enters.
    pod_views: bool,
    /// Which objects are kept as their JSON text.
    text: TextPolicy,
    /// Packs that text (objects of one kind pack to a few percent of it against each other).
    packer: Mutex<Packer>,
}

/// Which objects a cache keeps as their JSON text instead of parsed.
#[derive(Clone, Copy, Default)]
enum TextPolicy {
    #[default]
    None,
    /// The pods whose view this picks.
    Pods(fn(&PodView) -> bool),
    /// Every object.
    All,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("state", &self.state).field("transform", &self.transform.get().is_some())
            .field("pod_views", &self.pod_views)
            .field("compact", &!matches!(self.text, TextPolicy::None))
            .finish()
    }
}

/// How one cached object is held.
#[derive(Debug)]
enum Body {
    Parsed(Arc<Value>),
    /// The object as `serde_json::to_vec` wrote it (parsing it gives back an equal `Value`),
    /// packed, and the parsed copy handed out last, while anyone still holds it.
    Text { json: Packed, parsed: Weak<Value> },
}

/// One cached object, with what the indexes and revision checks read of it and its view when the
/// cache keeps views.
#[derive(Debug)]
struct Entry {
    body: Body,
    rv: Option<u64>,
    index: IndexValues,
    view: Option<Arc<PodView>>,
}

impl Entry {
    /// The view kept with the object, or one read from it now in a cache that keeps none.
    fn view(&self) -> Option<Arc<PodView>> {
        self.view.clone().or_else(|| self.handle().value().map(|o| Arc::new(PodView::of(&o))))
    }

    /// What a reader needs to get the object without holding the cache's lock while parsing.
    fn handle(&self) -> Handle {
        match &self.body {
            Body::Parsed(obj) => Handle::Parsed(obj.clone()),
            Body::Text { json, parsed } => Handle::Text(json.clone(), parsed.clone()),
        }
    }

    /// Whether `obj` is the very object this entry holds or last handed out.
    fn holds(&self, obj: &Arc<Value>) -> bool {
        match &self.body {
            Body::Parsed(o) => Arc::ptr_eq(o, obj),
            Body::Text { parsed, .. } => std::ptr::eq(parsed.as_ptr(), Arc::as_ptr(obj)),
        }
    }
}

/// An object taken out of the cache, to parse (if it must be) after the lock is released.
enum Handle {
    Parsed(Arc<Value>),
    Text(Packed, Weak<Value>),
}

impl Handle {
    /// The object. `None` only if the text did not parse, which `Cache::admit` rules out.
    fn value(self) -> Option<Arc<Value>> {
        match self {
            Handle::Parsed(obj) => Some(obj),
            Handle::Text(json, parsed) => parsed.upgrade().or_else(|| serde_json::from_slice(&json.unpack()).ok().map(Arc::new)),
        }
    }
}

/// A change whose previous object may still have to be parsed, which is done once the cache's
/// lock is released.
enum Pending {
    Added(Arc<Value>),
    Updated { old: Handle, new: Arc<Value> },
    Deleted(Handle),
}

impl Pending {
    fn change(self) -> Change {
        // The text always parses (`Cache::admit`); an empty object stands in should it not.
        let parse = |h: Handle| h.value().unwrap_or_else(|| Arc::new(Value::Object(serde_json::Map::new())));
        match self {
            Pending::Added(obj) => Change::Added(obj),
            Pending::Updated { old, new } => Change::Updated { old: parse(old), new },
            Pending::Deleted(obj) => Change::Deleted(parse(obj)),
        }
    }
}

fn values(handles: Vec<Handle>) -> Vec<Arc<Value>> {
    handles.into_iter().filter_map(Handle::value).collect()
}

/// Whether `v` nests no deeper than `limit` arrays and objects.
fn depth_at_most(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(items) => limit > 0 && items.iter().all(|i| depth_at_most(i, limit - 1)),
        Value::Object(map) => limit > 0 && map.values().all(|i| depth_at_most(i, limit - 1)),
        _ => true,
    }
}

#[derive(Debug, Default)]
struct State {
    objects: HashMap<String, Entry>,
    by_namespace: Index,
    by_label: Index,
    by_owner: Index,
    /// Objects without a controlling owner, by namespace (`""` for cluster-scoped ones).
    unowned: Index,
    by_node: Index,
    /// The highest resourceVersion of any event applied: every write up to it has been seen.
    high_water: u64,
    /// A revision the cache is known to agree with the server at, from an anti-entropy check or
    /// a repair; unlike `high_water`, it does not mean every event up to it was delivered.
    verified: u64,
    digest: SetDigest,
}

/// Index value to the keys of the objects carrying it. `BTreeSet` keeps lookups in key order.
type Index = HashMap<String, BTreeSet<String>>;

/// The index values one object contributes.
#[derive(Debug, PartialEq, Eq)]
struct IndexValues {
    namespace: Option<Box<str>>,
    labels: Box<[Box<str>]>,
    owner: Option<Box<str>>,
    node: Option<Box<str>>,
}

impl IndexValues {
    fn of(obj: &Value) -> Self {
        let str_at = |p: &str| obj.at(p).and_then(Value::as_str).filter(|s| !s.is_empty()).map(Box::from);
        let labels = obj
            .at("/metadata/labels")
            .and_then(Value::as_object)
            .map(|l| l.iter().filter_map(|(k, v)| Some(format!("{k}={}", v.as_str()?).into_boxed_str())).collect())
            .unwrap_or_default();
        IndexValues {
            namespace: str_at("/metadata/namespace"),
            labels,
            owner: controller_owner(obj).map(|(_, _, uid)| Box::from(uid)),
            node: str_at("/spec/nodeName"),
        }
    }

    /// The `unowned` index value: the namespace of an object without a controller.
    fn unowned(&self) -> Option<Box<str>> {
        self.owner.is_none().then(|| self.namespace.clone().unwrap_or_default())
    }
}

fn index_insert(index: &mut Index, value: Option<&str>, key: &str) {
    if let Some(v) = value {
        match index.get_mut(v) {
            Some(keys) => {
                keys.insert(key.to_string());
            }
            None => {
                index.insert(v.to_string(), BTreeSet::from([key.to_string()]));
            }
        }
    }
}

fn index_remove(index: &mut Index, value: Option<&str>, key: &str) {
    if let Some(v) = value
        && let Some(keys) = index.get_mut(v)
    {
        keys.remove(key);
        if keys.is_empty() {
            index.remove(v);
        }
    }
}

/// Moves `key` from `old` to `new` in one index; nothing to do when they are equal, which is the
/// common case (a status update changes none of the indexed fields).
fn index_move(index: &mut Index, old: Option<&str>, new: Option<&str>, key: &str) {
    if old != new {
        index_remove(index, old, key);
        index_insert(index, new, key);
    }
}

/// An object ready to enter the cache: parsed (as subscribers get it) and as the cache keeps it.
struct Admitted {
    obj: Arc<Value>,
    key: String,
    rv: Option<u64>,
    index: IndexValues,
    view: Option<PodView>,
    json: Option<Packed>,
}

impl Admitted {
    /// The cache's entry, and the key and object for the change it makes.
    fn into_entry(self) -> (Entry, String, Arc<Value>) {
        let body = match self.json {
            Some(json) => Body::Text { json, parsed: Arc::downgrade(&self.obj) },
            None => Body::Parsed(self.obj.clone()),
        };
        (Entry { body, rv: self.rv, index: self.index, view: self.view.map(Arc::new) }, self.key, self.obj)
    }
}

impl State {
    /// Updates every index for `key` going from `old` (absent when new) to `new` (absent when
    /// deleted), touching only the entries that differ.
    fn reindex(&mut self, key: &str, old: Option<&IndexValues>, new: Option<&IndexValues>) {
        if old.is_some() && old == new {
            return;
        }
        let (o, n) = (old, new);
        index_move(&mut self.by_namespace, o.and_then(|v| v.namespace.as_deref()), n.and_then(|v| v.namespace.as_deref()), key);
        index_move(&mut self.by_owner, o.and_then(|v| v.owner.as_deref()), n.and_then(|v| v.owner.as_deref()), key);
        let (o_unowned, n_unowned) = (o.and_then(IndexValues::unowned), n.and_then(IndexValues::unowned));
        index_move(&mut self.unowned, o_unowned.as_deref(), n_unowned.as_deref(), key);
        index_move(&mut self.by_node, o.and_then(|v| v.node.as_deref()), n.and_then(|v| v.node.as_deref()), key);
        let no_labels: &[Box<str>] = &[];
        let old_labels = o.map_or(no_labels, |v| &v.labels);
        let new_labels = n.map_or(no_labels, |v| &v.labels);
        for l in old_labels.iter().filter(|l| !new_labels.contains(l)) {
            index_remove(&mut self.by_label, Some(l), key);
        }
        for l in new_labels.iter().filter(|l| !old_labels.contains(l)) {
            index_insert(&mut self.by_label, Some(l), key);
        }
    }

    /// `delivered`: the object came from the watch or a list (it moves `high_water`), not from
    /// a repair that fetched it out of order.
    fn upsert(&mut self, new: Admitted, delivered: bool) -> Option<Pending> {
        let rv = new.rv.unwrap_or(0);
        if delivered {
            self.high_water = self.high_water.max(rv);
        }
        if let Some(old) = self.objects.get(&new.key)
            && let (Some(have), Some(got)) = (old.rv, new.rv)
            && got <= have
        {
            return None;
        }
        let (entry, key, obj) = new.into_entry();
        let change = match self.objects.remove(&key) {
            Some(old) => {
                self.reindex(&key, Some(&old.index), Some(&entry.index));
                self.digest.remove(&key, old.rv.unwrap_or(0));
                Pending::Updated { old: old.handle(), new: obj }
            }
            None => {
                self.reindex(&key, None, Some(&entry.index));
                Pending::Added(obj)
            }
        };
        self.digest.insert(&key, rv);
        self.objects.insert(key, entry);
        Some(change)
    }

    fn remove(&mut self, key: &str, last_known: Option<Value>) -> Option<Pending> {
        let deleted_at = last_known.as_ref().and_then(resource_version);
        self.high_water = self.high_water.max(deleted_at.unwrap_or(0));
        let had = self.objects.get(key)?.rv.unwrap_or(0);
        if deleted_at.is_some_and(|at| at < had) {
            // A deletion of an older incarnation, arriving after a newer one was cached.
            return None;
        }
        let old = self.objects.remove(key)?;
        self.reindex(key, Some(&old.index), None);
        self.digest.remove(key, had);
        // The deletion event carries the final state; fall back to what was cached.
        Some(Pending::Deleted(match last_known {
            Some(obj) => Handle::Parsed(Arc::new(obj)),
            None => old.handle(),
        }))
    }

    fn lookup(&self, index: &Index, value: &str) -> Vec<Handle> {
        self.entries(index, value).map(Entry::handle).collect()
    }

    fn lookup_views(&self, index: &Index, value: &str) -> Vec<Arc<PodView>> {
        self.entries(index, value).filter_map(Entry::view).collect()
    }

    fn entries<'a>(&'a self, index: &'a Index, value: &str) -> impl Iterator<Item = &'a Entry> + 'a {
        index.get(value).into_iter().flat_map(|keys| keys.iter().filter_map(|k| self.objects.get(k)))
    }
}

impl Cache {
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The object stored under `key` (`namespace/name` or `name`).
    pub fn get(&self, key: &str) -> Option<Arc<Value>> {
        let handle = self.read().objects.get(key).map(Entry::handle);
        handle?.value()
    }

    /// Whether an object is stored under `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.read().objects.contains_key(key)
    }

    /// Every cached object, in no particular order.
    pub fn list(&self) -> Vec<Arc<Value>> {
        let handles: Vec<Handle> = self.read().objects.values().map(Entry::handle).collect();
        values(handles)
    }

    /// Every cached key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.read().objects.keys().cloned().collect();
        keys.sort();
        keys
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().objects.is_empty()
    }

    /// Runs `lookup` under the read lock and parses what it found after releasing it.
    fn found(&self, lookup: impl FnOnce(&State) -> Vec<Handle>) -> Vec<Arc<Value>> {
        let handles = lookup(&self.read());
        values(handles)
    }

    /// Objects in one namespace.
    pub fn by_namespace(&self, namespace: &str) -> Vec<Arc<Value>> {
        self.found(|s| s.lookup(&s.by_namespace, namespace))
    }

    /// Objects carrying the label `key=value`.
    pub fn by_label(&self, key: &str, value: &str) -> Vec<Arc<Value>> {
        self.found(|s| s.lookup(&s.by_label, &format!("{key}={value}")))
    }

    /// Objects whose controlling owner reference has this uid.
    pub fn by_controller_uid(&self, uid: &str) -> Vec<Arc<Value>> {
        self.found(|s| s.lookup(&s.by_owner, uid))
    }

    /// Objects in one namespace (`""`: cluster-scoped) that no controller owns: the candidates
    /// for adoption.
    pub fn unowned_in_namespace(&self, namespace: &str) -> Vec<Arc<Value>> {
        self.found(|s| s.lookup(&s.unowned, namespace))
    }

    /// The highest resourceVersion among the events applied so far. A watch delivers events in
    /// revision order without gaps, so a write at or below it has been seen: an object created at
    /// such a revision and absent now was seen and deleted, not yet to come.
    pub fn observed_revision(&self) -> u64 {
        self.read().high_water
    }

    /// Pods bound to a node (`spec.nodeName`).
    pub fn by_node_name(&self, node: &str) -> Vec<Arc<Value>> {
        self.found(|s| s.lookup(&s.by_node, node))
    }

    /// A cache that keeps a `PodView` beside each object: for pods only.
    pub fn with_pod_views() -> Cache {
        Cache { pod_views: true, ..Cache::default() }
    }

    /// A cache of pods that keeps the pods `text` picks as their JSON text beside their views,
    /// the others parsed (see the module documentation): for a process that holds many pods and
    /// reads most of them through views.
    pub fn compact_pods(text: fn(&PodView) -> bool) -> Cache {
        Cache { pod_views: true, text: TextPolicy::Pods(text), ..Cache::default() }
    }

    /// A cache that keeps every object as its JSON text: for a kind of many objects that are read
    /// one at a time, if at all (Events: one read when each expires).
    pub fn compact() -> Cache {
        Cache { text: TextPolicy::All, ..Cache::default() }
    }

    /// The view of the pod stored under `key`. The `pod_view*` readers answer from the views a
    /// cache `with_pod_views` keeps; in any other cache they read a view from the object per call.
    pub fn pod_view(&self, key: &str) -> Option<Arc<PodView>> {
        self.read().objects.get(key).and_then(Entry::view)
    }

    /// The view kept with `obj` when it is the object cached under `key` (as it is while a
    /// subscriber handles the change that cached it); `None` otherwise.
    pub fn pod_view_of(&self, key: &str, obj: &Arc<Value>) -> Option<Arc<PodView>> {
        self.read().objects.get(key).filter(|e| e.holds(obj)).and_then(|e| e.view.clone())
    }

    /// Views of the pods whose controlling owner reference has this uid.
    pub fn pod_views_by_controller_uid(&self, uid: &str) -> Vec<Arc<PodView>> {
        let s = self.read();
        s.lookup_views(&s.by_owner, uid)
    }

    /// Views of the pods in a namespace that no controller owns.
    pub fn pod_views_unowned_in_namespace(&self, namespace: &str) -> Vec<Arc<PodView>> {
        let s = self.read();
        s.lookup_views(&s.unowned, namespace)
    }

    /// Views of the pods bound to a node.
    pub fn pod_views_by_node_name(&self, node: &str) -> Vec<Arc<PodView>> {
        let s = self.read();
        s.lookup_views(&s.by_node, node)
    }

    /// Views of the pods carrying the label `key=value`.
    pub fn pod_views_by_label(&self, key: &str, value: &str) -> Vec<Arc<PodView>> {
        let s = self.read();
        s.lookup_views(&s.by_label, &format!("{key}={value}"))
    }

    /// Views of the pods in one namespace.
    pub fn pod_views_by_namespace(&self, namespace: &str) -> Vec<Arc<PodView>> {
        let s = self.read();
        s.lookup_views(&s.by_namespace, namespace)
    }

    /// The pods of one namespace whose views pass `keep`: a scan that reads each pod's view and
    /// only the objects it keeps.
    pub fn by_namespace_where(&self, namespace: &str, keep: impl Fn(&PodView) -> bool) -> Vec<Arc<Value>> {
        let handles: Vec<Handle> = {
            let s = self.read();
            s.entries(&s.by_namespace, namespace)
                .filter(|e| match &e.view {
                    Some(v) => keep(v),
                    None => e.view().is_some_and(|v| keep(&v)),
                })
                .map(Entry::handle)
                .collect()
        };
        values(handles)
    }

    /// Makes the cache keep `transform(object)` of every object from now on. Only an empty cache
    /// takes one, and only once: the objects it holds all went through the same projection.
    /// Returns whether it was set.
    pub fn set_transform(&self, transform: Transform) -> bool {
        let s = self.write();
        s.objects.is_empty() && s.high_water == 0 && self.transform.set(transform).is_ok()
    }

    /// The object as this cache keeps it: without `managedFields`, projected if the kind has one,
    /// with its view if the cache keeps views and its text if the cache is compact. `None`
    /// without a name.
    fn admit(&self, obj: Value) -> Option<Admitted> {
        let obj = self.project(obj);
        let key = object_key(&obj)?;
        let view = self.pod_views.then(|| PodView::of(&obj));
        // Writing a `Value` cannot fail (its keys are strings, its numbers finite); should it, or
        // should the text be too deep to parse back, the object is kept parsed.
        let text = match self.text {
            TextPolicy::None => false,
            TextPolicy::Pods(text) => view.as_ref().is_some_and(text),
            TextPolicy::All => true,
        };
        let json = if text && depth_at_most(&obj, TEXT_DEPTH) {
            let text = serde_json::to_vec(&obj).ok().map(Bytes::from);
            text.map(|t| self.packer.lock().unwrap_or_else(|e| e.into_inner()).pack("", &t))
        } else {
            None
        };
        Some(Admitted { rv: resource_version(&obj), index: IndexValues::of(&obj), key, view, json, obj: Arc::new(obj) })
    }

    /// The object without `managedFields`, projected if the kind has one.
    fn project(&self, mut obj: Value) -> Value {
        strip_managed_fields(&mut obj);
        match self.transform.get() {
            Some(t) => t(obj),
            None => obj,
        }
    }

    /// Applies an added or modified object; `None` when it was not newer than the cached copy.
    pub(crate) fn apply_upsert(&self, obj: Value) -> Option<Change> {
        let admitted = self.admit(obj)?;
        let pending = self.write().upsert(admitted, true);
        pending.map(Pending::change)
    }

    /// Applies an object an anti-entropy repair fetched: like `apply_upsert`, but it says nothing
    /// about which events were delivered, so `observed_revision` stays where it is.
    pub(crate) fn apply_repair(&self, obj: Value) -> Option<Change> {
        let admitted = self.admit(obj)?;
        let mut s = self.write();
        s.verified = s.verified.max(admitted.rv.unwrap_or(0));
        let pending = s.upsert(admitted, false);
        drop(s);
        pending.map(Pending::change)
    }

    /// Removes an object a repair found gone, unless the cached copy is newer than `revision`.
    pub(crate) fn apply_repair_delete(&self, key: &str, revision: u64) -> Option<Change> {
        let mut s = self.write();
        if s.objects.get(key)?.rv.unwrap_or(0) > revision {
            return None;
        }
        let pending = s.remove(key, None);
        drop(s);
        pending.map(Pending::change)
    }

    /// Records that the server's digest at `revision` matched (or was repaired to match).
    pub(crate) fn mark_verified(&self, revision: u64) {
        let mut s = self.write();
        s.verified = s.verified.max(revision);
    }

    /// The revision the cache stands at for an anti-entropy check (the newest of the delivered
    /// events and the verified revision), with its digest's count and sum.
    pub fn digest(&self) -> (u64, u64, u64) {
        let s = self.read();
        (s.high_water.max(s.verified), s.digest.count(), s.digest.sum())
    }

    /// The per-bucket sums of the cache's digest.
    pub fn digest_buckets(&self) -> Vec<u64> {
        self.read().digest.buckets().to_vec()
    }

    /// The (key, resourceVersion) pairs cached in one digest bucket.
    pub fn bucket_members(&self, bucket: usize) -> Vec<(String, u64)> {
        let s = self.read();
        s.objects.iter().filter(|(k, _)| bucket_of(k) == bucket).map(|(k, e)| (k.clone(), e.rv.unwrap_or(0))).collect()
    }

    /// Applies a deletion; `None` when the object was not cached.
    pub(crate) fn apply_delete(&self, obj: Value) -> Option<Change> {
        let obj = self.project(obj);
        let key = object_key(&obj)?;
        let pending = self.write().remove(&key, Some(obj));
        pending.map(Pending::change)
    }

    /// Makes the cache equal to a fresh list and returns what differed: objects the list has and
    /// the cache lacked or held an older copy of, and cached objects the list no longer has.
    pub(crate) fn replace(&self, items: Vec<Value>) -> Vec<Change> {
        let mut s = self.write();
        let mut changes: Vec<Pending> = Vec::new();
        let mut listed = std::collections::HashSet::with_capacity(items.len());
        for obj in items {
            let Some(admitted) = self.admit(obj) else { continue };
            listed.insert(admitted.key.clone());
            // `upsert` ignores equal or older revisions, so unchanged objects emit nothing.
            changes.extend(s.upsert(admitted, true));
        }
        let gone: Vec<String> = s.objects.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for key in gone {
            changes.extend(s.remove(&key, None));
        }
        drop(s);
        changes.into_iter().map(Pending::change).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_observed_revision_follows_every_event_deletions_included() {
        let c = Cache::default();
        assert_eq!(c.observed_revision(), 0);
        c.apply_upsert(pod("a", 3, "n1", "u1"));
        c.apply_upsert(pod("a", 2, "n1", "u1"));
        assert_eq!(c.observed_revision(), 3, "an older copy does not move it back");
        c.apply_delete(pod("a", 8, "n1", "u1"));
        assert_eq!(c.observed_revision(), 8);
    }

    fn pod(name: &str, rv: u64, node: &str, owner_uid: &str) -> Value {
        json!({
            "metadata": {
                "name": name, "namespace": "ns", "resourceVersion": rv.to_string(),
                "labels": { "app": "web" },
                "ownerReferences": [{ "kind": "ReplicaSet", "name": "rs", "uid": owner_uid, "controller": true }],
            },
            "spec": { "nodeName": node },
        })
    }

    fn names(objs: Vec<Arc<Value>>) -> Vec<String> {
        objs.iter().filter_map(|o| object_key(o)).collect()
    }

    #[test]
    fn indexes_follow_an_object_as_it_moves_between_nodes() {
        for c in [Cache::default(), Cache::with_pod_views(), Cache::compact_pods(|_| true), Cache::compact()] {
            indexes_follow_an_object_as_it_moves_between_nodes_in(c);
        }
    }

    fn indexes_follow_an_object_as_it_moves_between_nodes_in(c: Cache) {
        c.apply_upsert(pod("a", 1, "n1", "u1"));
        c.apply_upsert(pod("b", 2, "n1", "u1"));
        assert_eq!(names(c.by_node_name("n1")), ["ns/a", "ns/b"]);
        c.apply_upsert(pod("a", 3, "n2", "u2"));
        assert_eq!(names(c.by_node_name("n1")), ["ns/b"]);
        assert_eq!(names(c.by_node_name("n2")), ["ns/a"]);
        assert_eq!(names(c.by_controller_uid("u1")), ["ns/b"]);
        assert_eq!(names(c.by_label("app", "web")), ["ns/a", "ns/b"]);
        c.apply_delete(pod("b", 4, "n1", "u1"));
        assert!(c.by_node_name("n1").is_empty());
        assert!(c.by_controller_uid("u1").is_empty());
        assert_eq!(names(c.by_namespace("ns")), ["ns/a"]);
    }

    #[test]
    fn unowned_objects_are_indexed_until_a_controller_adopts_them() {
        for c in [Cache::default(), Cache::with_pod_views(), Cache::compact_pods(|_| true), Cache::compact()] {
            unowned_objects_are_indexed_until_a_controller_adopts_them_in(c);
        }
    }

    fn unowned_objects_are_indexed_until_a_controller_adopts_them_in(c: Cache) {
        let mut orphan = pod("o", 1, "n1", "u1");
        orphan["metadata"]["ownerReferences"] = json!([]);
        c.apply_upsert(orphan.clone());
        c.apply_upsert(pod("owned", 2, "n1", "u1"));
        assert_eq!(names(c.unowned_in_namespace("ns")), ["ns/o"]);
        let mut labelled = orphan.clone();
        labelled["metadata"]["resourceVersion"] = json!("3");
        labelled["metadata"]["labels"] = json!({"app": "db", "tier": "x"});
        c.apply_upsert(labelled);
        assert!(c.by_label("app", "web").iter().all(|p| p["metadata"]["name"] != "o"));
        assert_eq!(names(c.by_label("tier", "x")), ["ns/o"]);
        c.apply_upsert(pod("o", 4, "n1", "u9"));
        assert!(c.unowned_in_namespace("ns").is_empty());
        assert_eq!(names(c.by_controller_uid("u9")), ["ns/o"]);
        assert!(c.by_label("tier", "x").is_empty());
    }

    #[test]
    fn an_older_copy_never_replaces_a_newer_one() {
        for c in [Cache::default(), Cache::with_pod_views(), Cache::compact_pods(|_| true), Cache::compact()] {
            an_older_copy_never_replaces_a_newer_one_in(c);
        }
    }

    fn an_older_copy_never_replaces_a_newer_one_in(c: Cache) {
        c.apply_upsert(pod("a", 5, "n2", "u"));
        assert!(c.apply_upsert(pod("a", 4, "n1", "u")).is_none());
        assert_eq!(c.get("ns/a").map(|o| o["spec"]["nodeName"].clone()), Some(json!("n2")));
    }

    #[test]
    fn replace_reports_exactly_the_missed_adds_updates_and_deletes() {
        for c in [Cache::default(), Cache::with_pod_views(), Cache::compact_pods(|_| true), Cache::compact()] {
            replace_reports_exactly_the_missed_adds_updates_and_deletes_in(c);
        }
    }

    fn replace_reports_exactly_the_missed_adds_updates_and_deletes_in(c: Cache) {
        c.apply_upsert(pod("same", 1, "n", "u"));
        c.apply_upsert(pod("changed", 2, "n", "u"));
        c.apply_upsert(pod("gone", 3, "n", "u"));
        let changes = c.replace(vec![pod("same", 1, "n", "u"), pod("changed", 7, "n", "u"), pod("new", 8, "n", "u")]);
        let mut seen: Vec<String> = changes
            .iter()
            .map(|ch| match ch {
                Change::Added(o) => format!("added {}", o["metadata"]["name"]),
                Change::Updated { new, .. } => format!("updated {}", new["metadata"]["name"]),
                Change::Deleted(o) => format!("deleted {}", o["metadata"]["name"]),
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [r#"added "new""#, r#"deleted "gone""#, r#"updated "changed""#]);
        assert_eq!(c.keys(), ["ns/changed", "ns/new", "ns/same"]);
    }

    /// A pod as the API server returns it: with the `managedFields` its writers left.
    fn pod_with_owners(name: &str, rv: u64) -> Value {
        let mut p = pod(name, rv, "n", "u");
        p["metadata"]["managedFields"] = json!([
            { "manager": "shepherd", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
              "fieldsV1": { "f:metadata": { "f:labels": { ".": {}, "f:app": {} } }, "f:spec": { "f:nodeName": {} } } },
            { "manager": "agent", "operation": "Update", "apiVersion": "v1", "subresource": "status",
              "fieldsType": "FieldsV1", "fieldsV1": { "f:status": { "f:phase": {} } } },
        ]);
        p
    }

    #[test]
    fn cached_objects_and_changes_carry_no_managed_fields_and_keep_the_rest() {
        for c in [Cache::default(), Cache::with_pod_views(), Cache::compact_pods(|_| true), Cache::compact()] {
            cached_objects_and_changes_carry_no_managed_fields_and_keep_the_rest_in(c);
        }
    }

    fn cached_objects_and_changes_carry_no_managed_fields_and_keep_the_rest_in(c: Cache) {
        let added = c.apply_upsert(pod_with_owners("a", 1)).expect("added");
        let updated = c.apply_upsert(pod_with_owners("a", 2)).expect("updated");
        let listed = c.replace(vec![pod_with_owners("a", 3), pod_with_owners("b", 4)]);
        let deleted = c.apply_delete(pod_with_owners("b", 5)).expect("deleted");
        let mut seen: Vec<Arc<Value>> =
            vec![added.object().clone(), updated.object().clone(), deleted.object().clone()];
        if let Change::Updated { old, .. } = &updated {
            seen.push(old.clone());
        }
        seen.extend(listed.iter().map(|ch| ch.object().clone()));
        seen.extend(c.list());
        assert_eq!(seen.len(), 7);
        for o in &seen {
            assert_eq!(o["metadata"].get("managedFields"), None, "cached with its managedFields: {o}");
            assert_eq!(o["metadata"]["labels"]["app"], "web");
            assert_eq!(o["spec"]["nodeName"], "n");
        }
        assert_eq!(c.get("ns/a").and_then(|o| resource_version(&o)), Some(3));
        assert_eq!(c.by_label("app", "web").len(), 1);
    }

    /// Objects with every kind of JSON value the API carries: integers at the edges of i64 and
    /// u64, floats, unicode and escapes, empty and nested containers, nulls.
    fn odd_pod(name: &str, rv: u64) -> Value {
        let mut p = pod(name, rv, "n", "u");
        p["metadata"]["annotations"] = json!({"note": "ünï \"quoted\" \\ \n\t\u{1F600}", "empty": ""});
        p["spec"]["numbers"] = json!([0, -1, i64::MIN, i64::MAX, u64::MAX, 0.1, -2.5e-300, 1e300, 1.0, 3.0e10]);
        p["spec"]["nested"] = json!({"a": {"b": {"c": [[], {}, [null, true, false]]}}, "z": null});
        p["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        p
    }

    #[test]
    fn objects_come_out_of_the_cache_equal_to_what_went_in() {
        // The fourth keeps one pod parsed among pods kept as text.
        let caches = [
            Cache::default(),
            Cache::with_pod_views(),
            Cache::compact_pods(|_| true),
            Cache::compact_pods(|v| v.name() != "b"),
            Cache::compact(),
        ];
        for c in caches {
            objects_come_out_of_the_cache_equal_to_what_went_in_in(c);
        }
    }

    fn objects_come_out_of_the_cache_equal_to_what_went_in_in(c: Cache) {
        let first = odd_pod("a", 1);
        let added = c.apply_upsert(first.clone()).expect("added");
        assert_eq!(**added.object(), first);
        let mut second = odd_pod("a", 2);
        second["status"]["phase"] = json!("Succeeded");
        let updated = c.apply_upsert(second.clone()).expect("updated");
        drop(added);
        match &updated {
            Change::Updated { old, new } => {
                assert_eq!(**old, first, "the old object is the one cached before, parsed back");
                assert_eq!(**new, second);
            }
            other => panic!("expected an update, got {other:?}"),
        }
        let held = updated.object().clone();
        drop(updated);
        let got = c.get("ns/a").expect("cached");
        assert!(Arc::ptr_eq(&got, &held), "the cached object itself is handed out");
        drop((got, held));
        assert_eq!(*c.get("ns/a").expect("cached"), second);
        let listed = c.replace(vec![odd_pod("a", 2), odd_pod("b", 3)]);
        assert_eq!(listed.len(), 1, "an unchanged object emits nothing");
        for got in [c.list(), c.by_namespace("ns"), c.by_label("app", "web"), c.by_controller_uid("u"), c.by_node_name("n")] {
            let mut got: Vec<Value> = got.iter().map(|o| (**o).clone()).collect();
            got.sort_by_key(object_key);
            assert_eq!(got, [second.clone(), odd_pod("b", 3)]);
        }
        // Deeper than a parser takes back from text: such an object is kept as it came.
        let mut deep = odd_pod("d", 4);
        let mut nested = json!("bottom");
        for i in 0..200 {
            nested = if i % 2 == 0 { json!([nested]) } else { json!({ "k": nested }) };
        }
        deep["spec"]["deep"] = nested;
        deep["metadata"]["ownerReferences"] = json!([]);
        assert!(c.apply_repair(deep.clone()).is_some());
        assert_eq!(*c.get("ns/d").expect("cached"), deep);
        assert_eq!(names(c.unowned_in_namespace("ns")), ["ns/d"]);
        assert_eq!(names(c.by_namespace_where("ns", |v| v.name() != "b")), ["ns/a", "ns/d"]);
        for key in c.keys() {
            let obj = c.get(&key).expect("cached");
            assert_eq!(c.pod_view(&key).as_deref(), Some(&PodView::of(&obj)), "the view of {key} is the view of its object");
        }
        let deleted = c.replace(Vec::new());
        let mut gone: Vec<Value> = deleted.iter().map(|ch| (**ch.object()).clone()).collect();
        gone.sort_by_key(object_key);
        assert_eq!(gone, [second, odd_pod("b", 3), deep], "a deletion without a final state hands out the cached object");
        assert!(!c.contains("ns/a") && c.get("ns/a").is_none());
    }

    /// Keeps the metadata and `spec.nodeName` only.
    fn node_only(obj: Value) -> Value {
        json!({"metadata": obj["metadata"].clone(), "spec": {"nodeName": obj["spec"]["nodeName"].clone()}})
    }

    #[test]
    fn a_projection_is_what_every_reader_and_change_sees_and_only_an_empty_cache_takes_one() {
        let whole = |name: &str, rv: u64| {
            let mut p = pod_with_owners(name, rv);
            p["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
            p
        };
        let c = Cache::default();
        assert!(c.set_transform(Arc::new(node_only)));
        assert!(!c.set_transform(Arc::new(|o| o)), "a second projection would leave the objects inconsistent");
        let added = c.apply_upsert(whole("a", 1)).expect("added");
        let updated = c.apply_upsert(whole("a", 2)).expect("updated");
        let listed = c.replace(vec![whole("a", 3), whole("b", 4)]);
        let repaired = c.apply_repair(whole("c", 5)).expect("repaired");
        let deleted = c.apply_delete(whole("b", 6)).expect("deleted");
        let mut seen: Vec<Arc<Value>> =
            vec![added.object().clone(), updated.object().clone(), repaired.object().clone(), deleted.object().clone()];
        if let Change::Updated { old, .. } = &updated {
            seen.push(old.clone());
        }
        seen.extend(listed.iter().map(|ch| ch.object().clone()));
        seen.extend(c.list());
        assert_eq!(seen.len(), 9);
        for o in &seen {
            let mut expected = node_only(whole("x", 0));
            expected["metadata"] = o["metadata"].clone();
            assert_eq!(**o, expected);
            assert_eq!(o.get("status"), None, "projected away");
            assert_eq!(o["metadata"].get("managedFields"), None);
            assert_eq!(o["metadata"]["labels"]["app"], "web", "the metadata is kept whole");
        }
        // The indexes and revisions read the projected objects as they would the whole ones.
        assert_eq!(c.keys(), ["ns/a", "ns/c"]);
        assert_eq!(c.get("ns/a").and_then(|o| resource_version(&o)), Some(3));
        assert_eq!(names(c.by_node_name("n")), ["ns/a", "ns/c"]);
        assert_eq!(names(c.by_label("app", "web")), ["ns/a", "ns/c"]);
        assert_eq!(c.observed_revision(), 6);

        let filled = Cache::default();
        filled.apply_upsert(whole("a", 1));
        assert!(!filled.set_transform(Arc::new(node_only)), "objects already cached were not projected");
        assert_eq!(filled.get("ns/a").map(|o| o["metadata"]["ownerReferences"].is_array()), Some(true));
    }

    #[test]
    fn a_pod_cache_keeps_each_pods_view_in_step_with_the_pod_it_holds() {
        for c in [Cache::with_pod_views(), Cache::compact_pods(|_| true)] {
            a_pod_cache_keeps_each_pods_view_in_step_with_the_pod_it_holds_in(c);
        }
    }

    fn a_pod_cache_keeps_each_pods_view_in_step_with_the_pod_it_holds_in(c: Cache) {
        let view_names = |views: Vec<Arc<PodView>>| views.iter().map(|v| v.key()).collect::<Vec<_>>();
        let added = c.apply_upsert(pod("a", 1, "n1", "u1")).expect("added");
        assert_eq!(c.pod_view_of("ns/a", added.object()).as_deref(), Some(&PodView::of(added.object())));
        let mut ready = pod("a", 2, "n2", "u2");
        ready["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        let updated = c.apply_upsert(ready.clone()).expect("updated");
        assert_eq!(c.pod_view_of("ns/a", added.object()), None, "not the object cached now");
        let now = c.pod_view("ns/a").expect("cached");
        assert_eq!(*now, PodView::of(&ready));
        assert!(Arc::ptr_eq(&now, &c.pod_view_of("ns/a", updated.object()).expect("current")), "the kept view, not a new one");
        assert!(now.is_ready() && now.node_name() == Some("n2"));
        assert!(c.apply_upsert(pod("a", 1, "n1", "u1")).is_none());
        assert_eq!(*c.pod_view("ns/a").expect("cached"), PodView::of(&ready), "an older copy leaves the view too");
        c.apply_repair(pod("b", 3, "n1", "u2"));
        let mut orphan = pod("o", 4, "n1", "u2");
        orphan["metadata"]["ownerReferences"] = json!([]);
        c.replace(vec![ready.clone(), pod("b", 3, "n1", "u2"), orphan]);
        assert_eq!(view_names(c.pod_views_by_controller_uid("u2")), ["ns/a", "ns/b"]);
        assert_eq!(view_names(c.pod_views_unowned_in_namespace("ns")), ["ns/o"]);
        let on_n1 = c.by_namespace_where("ns", |v| v.node_name() == Some("n1"));
        assert_eq!(names(on_n1), ["ns/b", "ns/o"]);
        c.apply_delete(pod("b", 5, "n1", "u2"));
        assert!(c.pod_view("ns/b").is_none());
        assert_eq!(view_names(c.pod_views_by_controller_uid("u2")), ["ns/a"]);

        // A cache without views answers the same, reading a view per call.
        let plain = Cache::default();
        plain.apply_upsert(ready.clone());
        assert_eq!(plain.pod_view("ns/a").as_deref(), Some(&PodView::of(&ready)));
        assert_eq!(view_names(plain.pod_views_by_controller_uid("u2")), ["ns/a"]);
    }

    fn resident_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }

    /// Memory per cached pod (object, key and four indexes), from the resident-set growth while
    /// 10,000 realistic pods are cached, without and then with pod views, then compact. A measurement:
    /// `cargo test --release -p shepherd-runtime -- --ignored --nocapture memory_per_cached`.
    #[test]
    #[ignore]
    fn memory_per_cached_pod_for_ten_thousand_pods() {
        const PODS: u64 = 10_000;
        let mut kept = Vec::new();
        let caches =
            [("cache", Cache::default()), ("cache with pod views", Cache::with_pod_views()), ("compact pod cache", Cache::compact_pods(|_| true))];
        for (what, c) in caches {
            let before = resident_bytes().unwrap_or(0);
            for i in 0..PODS {
                let mut p = pod(&format!("web-{i}"), i + 1, &format!("node-{}", i % 100), &format!("rs-uid-{}", i % 500));
                p["metadata"]["uid"] = json!(format!("6f1c2d9e-0000-4000-8000-{i:012}"));
                p["metadata"]["labels"]["pod-template-hash"] = json!("7c9f8d5b6");
                p["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
                p["spec"]["containers"] = json!([{
                    "name": "web", "image": "registry.example/web:1.2.3",
                    "ports": [{ "containerPort": 8080, "protocol": "TCP" }],
                    "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } },
                }]);
                p["status"] = json!({ "phase": "Running", "podIP": format!("10.0.{}.{}", i / 250, i % 250),
                    "conditions": [{ "type": "Ready", "status": "True" }] });
                c.apply_upsert(p);
            }
            let after = resident_bytes().unwrap_or(0);
            let sample = serde_json::to_string(&*c.get("ns/web-1").unwrap()).map(|s| s.len()).unwrap_or(0);
            println!(
                "{what}: {PODS} pods ({sample} bytes of JSON each) grew the resident set by {} KiB = {} bytes per pod",
                after.saturating_sub(before) / 1024,
                after.saturating_sub(before) / PODS
            );
            assert_eq!(c.len() as u64, PODS);
            // Kept, so the second cache's growth is its own rather than the first one's freed pages.
            kept.push(c);
        }
    }
}
