//! The garbage collector: deletes objects whose owners are gone, carries out Foreground and
//! Orphan deletion, and works only from what the API shows, so a restart mid-cascade resumes it.
//!
//! One controller per kind (`garbage-collector-<plural>`) reconciles each object of that kind:
//! - an object being deleted with the `orphan` finalizer has the owner references pointing at it
//!   removed from its dependents, then the finalizer removed;
//! - an object being deleted with the `foregroundDeletion` finalizer has its dependents deleted,
//!   and keeps the finalizer until no dependent that blocks owner deletion remains;
//! - an object all of whose owners are gone (not found, or a different uid under that name) is
//!   deleted; one whose owners are being deleted in the foreground is deleted too; dangling
//!   references next to a live owner are removed.
//!
//! Owner to dependents is looked up in a dependency graph fed by every kind's informer, so
//! deleting an owner wakes exactly its dependents; the initial list (and each resync) reconciles
//! every object, which is what collects orphans left by a crash.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::{ApiError, ResourceInfo, kinds};
use shepherd_api::meta;
use shepherd_runtime::cache::object_key;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Change, Client, Controller, DeleteParams, Manager, Patch, Propagation, Reconciler};

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::podutil;

/// How often a dependent of a custom object looks at its owner again: custom kinds come and go
/// at run time, so no informer wakes their dependents when they are deleted.
const CUSTOM_OWNER_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps an object until its dependents are deleted (`propagationPolicy: Foreground`).
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// Keeps an object until its dependents no longer reference it (`propagationPolicy: Orphan`).
pub const ORPHAN_FINALIZER: &str = "orphan";

/// The kinds the collector looks at: every kind that can own or be owned. Events are left out:
/// nothing owns them and they are the most numerous objects.
fn collected_kinds() -> Vec<ResourceInfo> {
    kinds::ALL.iter().filter(|k| k.kind != "Event").copied().collect()
}

/// Builds the garbage collector: one controller per collected kind, and one polling the custom
/// kinds, sharing one dependency graph.
/// Add every returned controller to the manager.
pub fn garbage_collector(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Vec<Controller> {
    let kinds = collected_kinds();
    let graph = Arc::new(Graph::default());
    let caches: Arc<Vec<Arc<Cache>>> = Arc::new(kinds.iter().map(|k| manager.informers().cache(k)).collect());
    // Subscribed before any controller, so the graph has seen a change before a mapper asks it.
    for (i, kind) in kinds.iter().enumerate() {
        let g = graph.clone();
        manager.informers().informer(kind).subscribe(move |change| g.apply(i, change));
    }
    let events = EventRecorder::new(client.clone(), "garbage-collector");
    let shared = Arc::new(Shared { client, kinds: kinds.clone(), caches: caches.clone(), graph: graph.clone(), events });
    let custom = Controller::new("garbage-collector-custom-kinds", &kinds::CUSTOMRESOURCEDEFINITION,
        CustomKindsReconciler { shared: shared.clone() });
    let mut controllers: Vec<Controller> = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let reconciler = GcReconciler { kind: i, shared: shared.clone() };
            let mut c = Controller::new(format!("garbage-collector-{}", kind.plural), kind, reconciler);
            for (j, other) in kinds.iter().enumerate() {
                let shared = shared.clone();
                c = c.watches(other, move |obj| shared.wake(j, obj, i));
            }
            c.workers(config.workers).mode(config.mode).primary_changes(concerns_collector)
        })
        .collect();
    controllers.push(custom.mode(config.mode));
    controllers
}

/// Whether a change of a collected object can matter to the collector, which looks only at an
/// object's owners, finalizers and deletion: its arrival or removal, or a change of one of those
/// (not a Lease renewal or a status write, ~100/s with 1,000 nodes).
fn concerns_collector(change: &Change) -> bool {
    match change {
        Change::Updated { old, new } => ["ownerReferences", "finalizers", "deletionTimestamp", "uid"]
            .iter()
            .any(|f| old.get("metadata").and_then(|m| m.get(f)) != new.get("metadata").and_then(|m| m.get(f))),
        Change::Added(_) | Change::Deleted(_) => true,
    }
}

/// A node of the dependency graph: kind index and object key.
type Node = (usize, String);

/// Owner uid to the objects that reference it, from every collected kind's informer.
#[derive(Default)]
struct Graph {
    state: RwLock<GraphState>,
}

#[derive(Default)]
struct GraphState {
    dependents: HashMap<String, BTreeSet<Node>>,
    owners_of: HashMap<Node, Vec<String>>,
}

fn owner_uids(obj: &Value) -> Vec<String> {
    meta::owner_references(obj).iter().filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string)).collect()
}

impl Graph {
    fn apply(&self, kind: usize, change: &Change) {
        let Some(key) = object_key(change.object()) else { return };
        let node = (kind, key);
        let deleted = matches!(change, Change::Deleted(_));
        let uids = if deleted { Vec::new() } else { owner_uids(change.object()) };
        let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
        // Most changes (status updates) keep the owners: nothing to move.
        if s.owners_of.get(&node).map_or(uids.is_empty(), |old| *old == uids) {
            return;
        }
        if let Some(old) = s.owners_of.remove(&node) {
            for uid in old {
                if let Some(deps) = s.dependents.get_mut(&uid) {
                    deps.remove(&node);
                    if deps.is_empty() {
                        s.dependents.remove(&uid);
                    }
                }
            }
        }
        if uids.is_empty() {
            return;
        }
        for uid in &uids {
            s.dependents.entry(uid.clone()).or_default().insert(node.clone());
        }
        s.owners_of.insert(node, uids);
    }

    fn dependents(&self, owner_uid: &str) -> Vec<Node> {
        let s = self.state.read().unwrap_or_else(|e| e.into_inner());
        s.dependents.get(owner_uid).map(|d| d.iter().cloned().collect()).unwrap_or_default()
    }

    fn has_dependents(&self, owner_uid: &str) -> bool {
        let s = self.state.read().unwrap_or_else(|e| e.into_inner());
        s.dependents.get(owner_uid).is_some_and(|d| !d.is_empty())
    }
}

struct Shared {
    client: Arc<dyn Client>,
    kinds: Vec<ResourceInfo>,
    caches: Arc<Vec<Arc<Cache>>>,
    graph: Arc<Graph>,
    events: EventRecorder,
}

/// Where an owner reference points.
enum OwnerState {
    /// The owner exists and is not being deleted in the foreground.
    Solid,
    /// The owner exists and waits, in foreground deletion, for its dependents to go.
    WaitingForDependents,
    /// No object with that uid exists under that name.
    Gone,
}

impl Shared {
    /// Keys of kind `target` to reconcile after an object of kind `source` changed: its
    /// dependents when it is gone or being deleted, and its owners waiting for it in foreground
    /// deletion.
    fn wake(&self, source: usize, obj: &Value, target: usize) -> Vec<String> {
        let mut keys = Vec::new();
        let uid = meta::uid(obj);
        // Most objects own nothing; only then is the cache consulted.
        let still_there = || {
            object_key(obj)
                .and_then(|k| self.caches[source].get(&k))
                .is_some_and(|cached| meta::uid(&cached) == uid && !meta::is_deleting(&cached))
        };
        if !uid.is_empty() && self.graph.has_dependents(uid) && !still_there() {
            keys.extend(self.graph.dependents(uid).into_iter().filter(|(k, _)| *k == target).map(|(_, key)| key));
        }
        let target_kind = &self.kinds[target];
        for r in meta::owner_references(obj) {
            if r.get("kind").and_then(Value::as_str) != Some(target_kind.kind) {
                continue;
            }
            let Some(name) = r.get("name").and_then(Value::as_str) else { continue };
            let key = self.owner_key(target_kind, obj, name);
            if self.caches[target].get(&key).is_some_and(|o| meta::has_finalizer(&o, FOREGROUND_FINALIZER)) {
                keys.push(key);
            }
        }
        keys
    }

    fn owner_key(&self, owner_kind: &ResourceInfo, dependent: &Value, name: &str) -> String {
        match (owner_kind.namespaced, meta::namespace(dependent)) {
            (true, Some(ns)) => format!("{ns}/{name}"),
            _ => name.to_string(),
        }
    }

    fn kind_index(&self, api_version: Option<&str>, kind: &str) -> Option<usize> {
        self.kinds.iter().position(|k| k.kind == kind && api_version.is_none_or(|v| v == k.api_version()))
    }

    /// Checks an owner reference against the cache, and against the API before concluding the
    /// owner is gone (the cache may simply not have seen a new owner yet).
    async fn owner_state(&self, dependent: &Value, r: &Value) -> Result<OwnerState, ApiError> {
        let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
        let api_version = r.get("apiVersion").and_then(Value::as_str);
        if self.kind_index(api_version, kind).is_none()
            && let Some(res) = api_version.and_then(|v| kinds::by_api_version_kind(v, kind))
        {
            return self.custom_owner_state(res, dependent, r).await;
        }
        let (Some(i), Some(name), Some(uid)) = (
            self.kind_index(r.get("apiVersion").and_then(Value::as_str), kind),
            r.get("name").and_then(Value::as_str),
            r.get("uid").and_then(Value::as_str),
        ) else {
            // A kind Shepherd does not serve cannot be checked: never delete on a guess.
            return Ok(OwnerState::Solid);
        };
        let res = &self.kinds[i];
        if res.namespaced && meta::namespace(dependent).is_none() {
            return Ok(OwnerState::Solid);
        }
        let classify = |owner: &Value| {
            if meta::is_deleting(owner) && meta::has_finalizer(owner, FOREGROUND_FINALIZER) {
                OwnerState::WaitingForDependents
            } else {
                OwnerState::Solid
            }
        };
        let key = self.owner_key(res, dependent, name);
        if let Some(cached) = self.caches[i].get(&key)
            && meta::uid(&cached) == uid
        {
            return Ok(classify(&cached));
        }
        let ns = if res.namespaced { meta::namespace(dependent) } else { None };
        match self.client.get(res, ns, name).await {
            Ok(live) if meta::uid(&live) == uid => Ok(classify(&live)),
            Ok(_) => Ok(OwnerState::Gone),
            Err(e) if e.is_not_found() => Ok(OwnerState::Gone),
            Err(e) => Err(e),
        }
    }

    /// An owner of a custom kind, read from the API (no informer follows custom kinds).
    async fn custom_owner_state(&self, res: &ResourceInfo, dependent: &Value, r: &Value) -> Result<OwnerState, ApiError> {
        let (Some(name), Some(uid)) = (r.get("name").and_then(Value::as_str), r.get("uid").and_then(Value::as_str)) else {
            return Ok(OwnerState::Solid);
        };
        let ns = if res.namespaced {
            match meta::namespace(dependent) {
                Some(ns) => Some(ns),
                None => return Ok(OwnerState::Solid),
            }
        } else {
            None
        };
        match self.client.get(res, ns, name).await {
            Ok(live) if meta::uid(&live) == uid => {
                if meta::is_deleting(&live) && meta::has_finalizer(&live, FOREGROUND_FINALIZER) {
                    Ok(OwnerState::WaitingForDependents)
                } else {
                    Ok(OwnerState::Solid)
                }
            }
            Ok(_) => Ok(OwnerState::Gone),
            Err(e) if e.is_not_found() => Ok(OwnerState::Gone),
            Err(e) => Err(e),
        }
    }

    /// Whether an owner reference points at a custom kind, which no informer here follows.
    fn is_unwatched(&self, r: &Value) -> bool {
        let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
        let api_version = r.get("apiVersion").and_then(Value::as_str);
        self.kind_index(api_version, kind).is_none() && api_version.and_then(|v| kinds::by_api_version_kind(v, kind)).is_some()
    }

    /// Deletes `obj` if it is still the object we saw; in the foreground when it has dependents
    /// of its own, so a chain of owners is taken down from the bottom. `true` once it is gone.
    async fn delete(&self, res: &ResourceInfo, obj: &Value, foreground: bool) -> Result<bool, ApiError> {
        let propagation = if foreground && self.graph.has_dependents(meta::uid(obj)) {
            Propagation::Foreground
        } else {
            Propagation::Background
        };
        let params = DeleteParams {
            propagation: Some(propagation),
            precondition_uid: Some(meta::uid(obj).to_string()),
            ..Default::default()
        };
        match self.client.delete(res, meta::namespace(obj), meta::name(obj), &params).await {
            Ok(remaining) => Ok(remaining.is_none()),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(true),
            Err(e) => Err(e),
        }
    }

    async fn remove_finalizer(&self, res: &ResourceInfo, obj: &Value, finalizer: &str) -> Result<(), ApiError> {
        let remaining: Vec<&str> = meta::finalizers(obj).into_iter().filter(|f| *f != finalizer).collect();
        let list = if remaining.is_empty() { Value::Null } else { json!(remaining) };
        let patch = json!({"metadata": {"finalizers": list, "resourceVersion": meta::resource_version(obj)}});
        match self.client.patch(res, meta::namespace(obj), meta::name(obj), Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The dependents of `owner_uid` as cached, each with its reference to that owner.
    fn dependents_of(&self, owner_uid: &str) -> Vec<(usize, Arc<Value>, Value)> {
        self.graph
            .dependents(owner_uid)
            .into_iter()
            .filter_map(|(kind, key)| {
                let obj = self.caches[kind].get(&key)?;
                let r = meta::owner_references(&obj).iter().find(|r| r.get("uid").and_then(Value::as_str) == Some(owner_uid))?.clone();
                Some((kind, obj, r))
            })
            .collect()
    }

    async fn orphan_dependents(&self, owner_kind: &ResourceInfo, owner: &Value) -> Result<(), ApiError> {
        let uid = meta::uid(owner);
        for (dep_kind, dep, _) in self.dependents_of(uid) {
            let patch = podutil::release_patch(&dep, uid);
            let res = &self.kinds[dep_kind];
            match self.client.patch(res, meta::namespace(&dep), meta::name(&dep), Patch::Merge(patch)).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let msg = format!("Orphaned the dependents of {} {}", owner_kind.kind, meta::name(owner));
        self.events.record(owner, EventType::Normal, "OrphanedDependents", &msg).await;
        self.remove_finalizer(owner_kind, owner, ORPHAN_FINALIZER).await
    }

    /// Deletes the dependents of an owner in foreground deletion; removes its finalizer once
    /// no dependent blocking owner deletion is left.
    async fn delete_dependents(&self, owner_kind: &ResourceInfo, owner: &Value) -> Result<(), ApiError> {
        let uid = meta::uid(owner);
        let mut blocking = 0;
        for (dep_kind, dep, r) in self.dependents_of(uid) {
            let blocks = r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true);
            let gone = if meta::is_deleting(&dep) { false } else { self.delete(&self.kinds[dep_kind], &dep, true).await? };
            if blocks && !gone {
                blocking += 1;
            }
        }
        if blocking == 0 {
            self.remove_finalizer(owner_kind, owner, FOREGROUND_FINALIZER).await?;
        }
        Ok(())
    }
}

struct GcReconciler {
    kind: usize,
    shared: Arc<Shared>,
}

#[async_trait]
impl Reconciler for GcReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let s = &self.shared;
        let Some(obj) = s.caches[self.kind].get(key) else { return Ok(Action::Done) };
        s.collect(&s.kinds[self.kind], &obj).await
    }
}

impl Shared {
    /// Carries out what the collector does for one object of kind `res` (see the module header).
    async fn collect(&self, res: &ResourceInfo, obj: &Value) -> Result<Action, Error> {
        let s = self;
        if meta::is_deleting(obj) {
            if meta::has_finalizer(obj, ORPHAN_FINALIZER) {
                s.orphan_dependents(res, obj).await?;
            } else if meta::has_finalizer(obj, FOREGROUND_FINALIZER) {
                s.delete_dependents(res, obj).await?;
            }
            return Ok(Action::Done);
        }
        let refs = meta::owner_references(obj).to_vec();
        if refs.is_empty() {
            return Ok(Action::Done);
        }
        let mut solid = 0;
        let mut waiting = 0;
        let mut dangling = Vec::new();
        let mut unwatched_owner = false;
        for r in &refs {
            match s.owner_state(obj, r).await? {
                OwnerState::Solid => {
                    solid += 1;
                    unwatched_owner |= s.is_unwatched(r);
                }
                OwnerState::WaitingForDependents => waiting += 1,
                OwnerState::Gone => dangling.extend(r.get("uid").and_then(Value::as_str).map(str::to_string)),
            }
        }
        if solid > 0 {
            if !dangling.is_empty() {
                let kept: Vec<Value> = refs
                    .iter()
                    .filter(|r| r.get("uid").and_then(Value::as_str).is_none_or(|u| !dangling.iter().any(|d| d == u)))
                    .cloned()
                    .collect();
                let patch = podutil::owner_references_patch(obj, kept);
                match s.client.patch(res, meta::namespace(obj), meta::name(obj), Patch::Merge(patch)).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if unwatched_owner {
                return Ok(Action::RequeueAfter(CUSTOM_OWNER_POLL));
            }
            return Ok(Action::Done);
        }
        s.delete(res, obj, waiting > 0).await?;
        let why = if waiting > 0 { "its owner is being deleted in the foreground" } else { "its owners are gone" };
        let msg = format!("Deleted {} {}: {why}", res.kind, meta::name(obj));
        s.events.record(obj, EventType::Normal, "GarbageCollected", &msg).await;
        Ok(Action::Done)
    }
}

/// How often the objects of each custom kind are looked at: custom kinds come and go at run time,
/// so no informer follows them; the collector polls them instead, per definition.
const CUSTOM_KIND_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Collects the objects of the custom kinds one CustomResourceDefinition (the key) defines:
/// dependents whose owners are gone, and owners deleted in the foreground or with orphaning.
struct CustomKindsReconciler {
    shared: Arc<Shared>,
}

#[async_trait]
impl Reconciler for CustomKindsReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let s = &self.shared;
        let Some(res) = kinds::all().into_iter().find(|r| kinds::custom(r).is_some_and(|c| c.storage && c.definition == key))
        else {
            // A definition is announced by its informer before its kinds are served, and goes
            // before its objects: keep polling while it exists.
            return match s.client.get(&kinds::CUSTOMRESOURCEDEFINITION, None, key).await {
                Ok(_) => Ok(Action::RequeueAfter(CUSTOM_KIND_POLL)),
                Err(e) if e.is_not_found() => Ok(Action::Done),
                Err(e) => Err(e.into()),
            };
        };
        let list = match s.client.list(res, &shepherd_runtime::ListParams::default()).await {
            Ok(l) => l,
            Err(e) if e.is_not_found() => return Ok(Action::Done),
            Err(e) => return Err(e.into()),
        };
        for obj in &list.items {
            let interesting = !meta::owner_references(obj).is_empty()
                || meta::has_finalizer(obj, ORPHAN_FINALIZER)
                || meta::has_finalizer(obj, FOREGROUND_FINALIZER);
            if interesting {
                s.collect(res, obj).await?;
            }
        }
        Ok(Action::RequeueAfter(CUSTOM_KIND_POLL))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str, uid: &str, owners: &[&str]) -> Arc<Value> {
        let refs: Vec<Value> = owners.iter().map(|o| json!({"kind": "ReplicaSet", "name": "rs", "uid": o})).collect();
        Arc::new(json!({"metadata": {"name": name, "namespace": "ns", "uid": uid, "ownerReferences": refs}}))
    }

    #[test]
    fn only_changes_of_owners_finalizers_or_deletion_wake_the_collector() {
        let lease = |renew: &str| Arc::new(json!({"metadata": {"name": "n1", "uid": "u", "ownerReferences": [{"uid": "node"}]},
            "spec": {"renewTime": renew}}));
        let updated = |old: Arc<Value>, new: Arc<Value>| Change::Updated { old, new };
        assert!(!concerns_collector(&updated(lease("t1"), lease("t2"))), "a renewal");
        let mut deleting = (*lease("t2")).clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        assert!(concerns_collector(&updated(lease("t2"), Arc::new(deleting.clone()))));
        let mut held = deleting.clone();
        held["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
        assert!(concerns_collector(&updated(Arc::new(deleting), Arc::new(held))));
        assert!(concerns_collector(&updated(obj("a", "1", &["o1"]), obj("a", "1", &[]))));
        assert!(concerns_collector(&Change::Added(lease("t1"))) && concerns_collector(&Change::Deleted(lease("t1"))));
    }

    #[test]
    fn the_graph_follows_owner_references_as_they_change_and_forgets_deleted_objects() {
        let g = Graph::default();
        g.apply(2, &Change::Added(obj("a", "1", &["o1"])));
        g.apply(2, &Change::Added(obj("b", "2", &["o1", "o2"])));
        assert_eq!(g.dependents("o1"), vec![(2, "ns/a".to_string()), (2, "ns/b".to_string())]);
        g.apply(2, &Change::Updated { old: obj("a", "1", &["o1"]), new: obj("a", "1", &[]) });
        assert_eq!(g.dependents("o1"), vec![(2, "ns/b".to_string())]);
        g.apply(2, &Change::Deleted(obj("b", "2", &["o1", "o2"])));
        assert!(!g.has_dependents("o1") && !g.has_dependents("o2"));
    }
}
