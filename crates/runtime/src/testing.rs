//! An in-memory `Client` for tests and experiments: revisions, watch history, `Expired`, lost events.
//!
//! Guarantees, mirroring the API server's:
//! - one global revision; every write takes the next one and stamps `metadata.resourceVersion`;
//! - a watch from revision N first replays every retained change after N, then streams live ones,
//!   in revision order; asking for a revision older than the retained history fails with
//!   `ApiError::Expired` (the 410 a real server answers);
//! - `set_drop_watch_events(true)` silently loses live events (the watch stays open), which is the
//!   failure the seeds describe: the writer succeeds, the watcher never hears of it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{Map, Value, json};
use shepherd_api::JsonPath;
use shepherd_api::digest::{DigestDetail, ListDigest, SetDigest};
use shepherd_api::{ApiError, ResourceInfo};
use tokio::sync::mpsc;

use crate::client::{Client, DeleteParams, ListParams, ObjectList, Patch, WatchEvent};

/// A `Client` holding every object in memory. Cheap to create; one per test.
#[derive(Default)]
pub struct MemoryClient {
    state: Mutex<State>,
    digest_requests: AtomicU64,
    /// Gets and lists served: the requests that carry object bodies.
    reads: AtomicU64,
}

#[derive(Default)]
struct State {
    revision: u64,
    /// Store key (`ResourceInfo::key`) to object.
    objects: BTreeMap<String, Value>,
    /// Retained changes: revision, store key, event, and the object as it was before.
    history: VecDeque<(u64, String, WatchEvent, Option<Value>)>,
    /// `None` keeps everything.
    history_limit: Option<usize>,
    /// Changes at or before this revision may be gone from `history`.
    compacted: u64,
    watchers: Vec<Watcher>,
    drop_watch_events: bool,
    next_uid: u64,
}

struct Watcher {
    prefix: String,
    tx: mpsc::UnboundedSender<Result<WatchEvent, ApiError>>,
}

impl MemoryClient {
    /// An empty store at revision 0 keeping its whole history.
    pub fn new() -> Self {
        MemoryClient::default()
    }

    /// Keeps only the last `limit` changes, so older watches get `Expired`.
    pub fn with_history_limit(limit: usize) -> Self {
        let client = MemoryClient::default();
        client.lock().history_limit = Some(limit);
        client
    }

    /// How many digests were asked for.
    pub fn digest_requests(&self) -> u64 {
        self.digest_requests.load(Ordering::Relaxed)
    }

    /// How many gets and lists were served.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The revision of the last write.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// Forgets all history: a watch from any revision before now gets `Expired`.
    pub fn compact(&self) {
        let mut s = self.lock();
        s.history.clear();
        s.compacted = s.revision;
    }

    /// While `true`, writes succeed but open watches never see them.
    pub fn set_drop_watch_events(&self, drop: bool) {
        self.lock().drop_watch_events = drop;
    }

    /// Ends every open watch with `error` (for example `ApiError::Expired`), as a server restart would.
    pub fn break_watches(&self, error: ApiError) {
        let mut s = self.lock();
        for w in s.watchers.drain(..) {
            let _ = w.tx.send(Err(error.clone()));
        }
    }

    /// How many watches are open (closed ones are counted until the next write notices them).
    pub fn open_watches(&self) -> usize {
        self.lock().watchers.iter().filter(|w| !w.tx.is_closed()).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Stores `obj` under `key` (or removes it for `Deleted`) at the next revision and tells watchers.
    fn commit(&mut self, key: String, mut obj: Value, deleted: bool, added: bool) -> Value {
        self.revision += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        let before = self.objects.get(&key).cloned();
        let event = if deleted {
            self.objects.remove(&key);
            WatchEvent::Deleted(obj.clone())
        } else {
            self.objects.insert(key.clone(), obj.clone());
            if added { WatchEvent::Added(obj.clone()) } else { WatchEvent::Modified(obj.clone()) }
        };
        if !self.drop_watch_events {
            self.watchers.retain(|w| !w.prefix_matches(&key) || w.tx.send(Ok(event.clone())).is_ok());
        }
        self.history.push_back((self.revision, key, event, before));
        if let Some(limit) = self.history_limit {
            while self.history.len() > limit {
                if let Some((rev, ..)) = self.history.pop_front() {
                    self.compacted = rev;
                }
            }
        }
        obj
    }
}

impl Watcher {
    fn prefix_matches(&self, key: &str) -> bool {
        key.starts_with(&self.prefix)
    }
}

fn prefix(res: &ResourceInfo, params: &ListParams) -> String {
    match (&params.namespace, res.namespaced) {
        (Some(ns), true) => res.namespace_prefix(ns),
        _ => res.key_prefix(),
    }
}

fn name_of(obj: &Value) -> Result<String, ApiError> {
    obj.at("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ApiError::BadRequest("metadata.name: Required value".into()))
}

/// The namespace an object lands in: the argument, else its own, else `default`.
fn namespace_for(res: &ResourceInfo, namespace: Option<&str>, obj: &Value) -> Option<String> {
    if !res.namespaced {
        return None;
    }
    namespace
        .map(str::to_string)
        .or_else(|| obj.at("/metadata/namespace").and_then(Value::as_str).map(str::to_string))
        .or_else(|| Some("default".to_string()))
}

/// Equality-based label selector terms: `a=b`, `a==b`, `a!=b`.
fn parse_selector(selector: &str) -> Result<Vec<(String, String, bool)>, ApiError> {
    let mut terms = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (k, v, eq) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, false)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once('=') {
            (k, v, true)
        } else {
            return Err(ApiError::BadRequest(format!("MemoryClient supports only = and != selectors, got {term:?}")));
        };
        terms.push((k.trim().to_string(), v.trim().to_string(), eq));
    }
    Ok(terms)
}

fn matches(obj: &Value, labels: &[(String, String, bool)], fields: &[(String, String, bool)]) -> bool {
    let label_ok = labels.iter().all(|(k, v, eq)| {
        let actual = obj.at("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str);
        (actual == Some(v.as_str())) == *eq
    });
    let field_ok = fields.iter().all(|(path, v, eq)| {
        let pointer = format!("/{}", path.replace('.', "/"));
        let actual = obj.at(&pointer).and_then(Value::as_str).unwrap_or("");
        (actual == v) == *eq
    });
    label_ok && field_ok
}

/// RFC 7386 merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[async_trait]
impl Client for MemoryClient {
    async fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let s = self.lock();
        s.objects.get(&res.key(namespace, name)).cloned().ok_or_else(|| ApiError::not_found(res.plural, name))
    }

    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let labels = parse_selector(params.label_selector.as_deref().unwrap_or(""))?;
        let fields = parse_selector(params.field_selector.as_deref().unwrap_or(""))?;
        let s = self.lock();
        let prefix = prefix(res, params);
        let items = s
            .objects
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(_, o)| matches(o, &labels, &fields))
            .map(|(_, o)| o.clone())
            .collect();
        Ok(ObjectList { items, resource_version: s.revision })
    }

    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        resource_version: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError> {
        let labels = parse_selector(params.label_selector.as_deref().unwrap_or(""))?;
        let fields = parse_selector(params.field_selector.as_deref().unwrap_or(""))?;
        let mut s = self.lock();
        if resource_version < s.compacted {
            return Err(ApiError::Expired(format!(
                "too old resource version: {resource_version} ({})",
                s.compacted
            )));
        }
        let prefix = prefix(res, params);
        let (tx, rx) = mpsc::unbounded_channel();
        for (rev, key, event, _) in &s.history {
            if *rev > resource_version && key.starts_with(&prefix) {
                let _ = tx.send(Ok(event.clone()));
            }
        }
        s.watchers.push(Watcher { prefix, tx });
        let filtered = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) }).filter(
            move |event| {
                let keep = match event {
                    Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
                        matches(o, &labels, &fields)
                    }
                    _ => true,
                };
                futures::future::ready(keep)
            },
        );
        Ok(filtered.boxed())
    }

    async fn create(&self, res: &ResourceInfo, namespace: Option<&str>, mut obj: Value) -> Result<Value, ApiError> {
        let name = name_of(&obj)?;
        let ns = namespace_for(res, namespace, &obj);
        let key = res.key(ns.as_deref(), &name);
        let mut s = self.lock();
        if s.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res.plural, &name));
        }
        s.next_uid += 1;
        let uid = format!("uid-{}", s.next_uid);
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        obj["metadata"]["uid"] = json!(uid);
        if let Some(ns) = ns {
            obj["metadata"]["namespace"] = json!(ns);
        }
        Ok(s.commit(key, obj, false, true))
    }

    async fn update(&self, res: &ResourceInfo, namespace: Option<&str>, mut obj: Value) -> Result<Value, ApiError> {
        let name = name_of(&obj)?;
        let ns = namespace_for(res, namespace, &obj);
        let key = res.key(ns.as_deref(), &name);
        let mut s = self.lock();
        let current = s.objects.get(&key).ok_or_else(|| ApiError::not_found(res.plural, &name))?;
        let wanted = obj.at("/metadata/resourceVersion").and_then(Value::as_str);
        let have = current.at("/metadata/resourceVersion").and_then(Value::as_str);
        if wanted.is_some_and(|w| Some(w) != have) {
            return Err(ApiError::conflict(res.plural, &name, "the object has been modified"));
        }
        obj["metadata"]["uid"] = current["metadata"]["uid"].clone();
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        if let Some(ns) = ns {
            obj["metadata"]["namespace"] = json!(ns);
        }
        Ok(s.commit(key, obj, false, false))
    }

    async fn update_status(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let name = name_of(&obj)?;
        let status = obj.get("status").cloned().unwrap_or(Value::Null);
        self.patch_status(res, namespace, &name, Patch::Merge(json!({ "status": status }))).await
    }

    async fn patch(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch)
    -> Result<Value, ApiError> {
        let Patch::Merge(patch) = patch else {
            return Err(ApiError::UnsupportedMediaType("MemoryClient applies merge patches only".into()));
        };
        let key = res.key(namespace.or(res.namespaced.then_some("default")), name);
        let mut s = self.lock();
        let mut obj = s.objects.get(&key).cloned().ok_or_else(|| ApiError::not_found(res.plural, name))?;
        merge_patch(&mut obj, &patch);
        Ok(s.commit(key, obj, false, false))
    }

    async fn patch_status(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch)
    -> Result<Value, ApiError> {
        self.patch(res, namespace, name, patch).await
    }

    async fn delete(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, params: &DeleteParams)
    -> Result<Option<Value>, ApiError> {
        let key = res.key(namespace.or(res.namespaced.then_some("default")), name);
        let mut s = self.lock();
        let obj = s.objects.get(&key).cloned().ok_or_else(|| ApiError::not_found(res.plural, name))?;
        if let Some(uid) = &params.precondition_uid
            && obj.at("/metadata/uid").and_then(Value::as_str) != Some(uid.as_str())
        {
            return Err(ApiError::conflict(res.plural, name, "the UID in the precondition does not match"));
        }
        s.commit(key, obj, true, false);
        Ok(None)
    }

    /// The server's Scale view: replicas, and the selector in the string syntax.
    async fn get_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        if !res.has_scale {
            return Err(ApiError::not_found(&format!("{}/scale", res.plural), name));
        }
        let obj = self.get(res, namespace, name).await?;
        let mut selector = obj.at("/spec/selector").cloned().unwrap_or(Value::Null);
        if res.kind == "ReplicationController" {
            selector = json!({ "matchLabels": selector });
        }
        let selector = shepherd_api::LabelSelector::from_k8s(&selector)?.to_string();
        Ok(json!({ "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": { "name": name, "namespace": obj.at("/metadata/namespace"),
                "resourceVersion": obj.at("/metadata/resourceVersion") },
            "spec": { "replicas": obj.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(0) },
            "status": { "replicas": obj.at("/status/replicas").and_then(Value::as_i64).unwrap_or(0), "selector": selector } }))
    }

    async fn update_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, scale: Value)
    -> Result<Value, ApiError> {
        let current = self.get_scale(res, namespace, name).await?;
        let wanted = scale.at("/metadata/resourceVersion").and_then(Value::as_str);
        if wanted.is_some_and(|w| Some(w) != current.at("/metadata/resourceVersion").and_then(Value::as_str)) {
            return Err(ApiError::conflict(res.plural, name, "the object has been modified"));
        }
        let replicas = scale.at("/spec/replicas").cloned().unwrap_or(Value::Null);
        self.patch(res, namespace, name, Patch::Merge(json!({ "spec": { "replicas": replicas } }))).await?;
        self.get_scale(res, namespace, name).await
    }

    async fn bind_pod(&self, namespace: &str, name: &str, node_name: &str) -> Result<(), ApiError> {
        let patch = json!({ "spec": { "nodeName": node_name } });
        self.patch(&shepherd_api::kinds::POD, Some(namespace), name, Patch::Merge(patch)).await.map(|_| ())
    }

    /// As the API server computes it: the current set, moved back through the history.
    async fn digest(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        revision: u64,
        detail: DigestDetail,
    ) -> Result<ListDigest, ApiError> {
        let labels = parse_selector(params.label_selector.as_deref().unwrap_or(""))?;
        let fields = parse_selector(params.field_selector.as_deref().unwrap_or(""))?;
        self.digest_requests.fetch_add(1, Ordering::Relaxed);
        let s = self.lock();
        let at = if revision == 0 { s.revision } else { revision.min(s.revision) };
        if at < s.compacted {
            return Err(ApiError::Expired(format!("too old resource version: {at} ({})", s.compacted)));
        }
        let prefix = prefix(res, params);
        let key_prefix = res.key_prefix();
        let mut members: BTreeMap<String, u64> = s
            .objects
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(_, o)| matches(o, &labels, &fields))
            .map(|(k, o)| (k[key_prefix.len()..].to_string(), rv_of(o)))
            .collect();
        for (rev, key, _, before) in s.history.iter().rev() {
            if *rev <= at {
                break;
            }
            if !key.starts_with(&prefix) {
                continue;
            }
            let short = &key[key_prefix.len()..];
            members.remove(short);
            if let Some(b) = before.as_ref().filter(|b| matches(b, &labels, &fields)) {
                members.insert(short.to_string(), rv_of(b));
            }
        }
        let mut set = SetDigest::default();
        members.iter().for_each(|(k, rv)| set.insert(k, *rv));
        Ok(ListDigest::of(at, &set, detail, members))
    }
}

fn rv_of(obj: &Value) -> u64 {
    obj.at("/metadata/resourceVersion").and_then(Value::as_str).and_then(|r| r.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_api::kinds::{POD, SERVICE};

    fn pod(name: &str) -> Value {
        json!({ "metadata": { "name": name, "namespace": "default", "labels": { "app": "web" } } })
    }

    #[tokio::test]
    async fn a_watch_replays_history_after_its_revision_then_streams_live_changes() {
        let c = MemoryClient::new();
        c.create(&POD, None, pod("a")).await.unwrap();
        let after_a = c.revision();
        c.create(&POD, None, pod("b")).await.unwrap();
        c.create(&SERVICE, None, pod("svc")).await.unwrap();
        let mut w = c.watch(&POD, &ListParams::default(), after_a).await.unwrap();
        c.delete(&POD, Some("default"), "a", &DeleteParams::default()).await.unwrap();
        let first = w.next().await.unwrap().unwrap();
        assert!(matches!(first, WatchEvent::Added(ref o) if o["metadata"]["name"] == "b"));
        let second = w.next().await.unwrap().unwrap();
        assert!(matches!(second, WatchEvent::Deleted(ref o) if o["metadata"]["name"] == "a"));
    }

    #[tokio::test]
    async fn a_watch_older_than_the_retained_history_is_expired() {
        let c = MemoryClient::with_history_limit(2);
        for n in ["a", "b", "c", "d"] {
            c.create(&POD, None, pod(n)).await.unwrap();
        }
        let err = c.watch(&POD, &ListParams::default(), 1).await.err();
        assert!(matches!(err, Some(ApiError::Expired(_))));
        assert!(c.watch(&POD, &ListParams::default(), 2).await.is_ok());
    }

    #[tokio::test]
    async fn an_update_with_a_stale_resource_version_conflicts() {
        let c = MemoryClient::new();
        let a = c.create(&POD, None, pod("a")).await.unwrap();
        c.patch(&POD, Some("default"), "a", Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}}))).await.unwrap();
        let err = c.update(&POD, None, a).await.err();
        assert!(err.is_some_and(|e| e.is_conflict()));
    }
}
