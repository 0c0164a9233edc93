//! The ConfigMaps and Secrets pods read (environment and volumes), and which pods read which
//! object, so that a change re-syncs exactly those pods.
//!
//! As the kubelet does, an agent follows only the objects that pods on its node name: one
//! list-and-watch per object (`metadata.name=NAME` in the pod's namespace), started when a pod
//! naming it arrives and stopped when no pod names it any more. A Secret no pod of the node
//! reads never reaches the node. A lookup is a map read, so pods make no API calls to start
//! once the object is followed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use serde_json::Value;
use shepherd_api::{ResourceInfo, kinds};
use shepherd_runtime::{Client, ListParams, WatchEvent};
use tokio::sync::watch;
use tracing::debug;

/// ConfigMap or Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SourceKind {
    ConfigMap,
    Secret,
}

impl SourceKind {
    /// The word kubelet uses in its messages (`configmap "app" not found`).
    pub fn word(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "configmap",
            SourceKind::Secret => "secret",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "ConfigMap",
            SourceKind::Secret => "Secret",
        }
    }

    fn resource(self) -> &'static ResourceInfo {
        match self {
            SourceKind::ConfigMap => &kinds::CONFIGMAP,
            SourceKind::Secret => &kinds::SECRET,
        }
    }
}

/// Why a container or volume cannot be set up yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceError {
    #[error("{} \"{name}\" not found", kind.word())]
    Missing { kind: SourceKind, name: String },
    #[error("couldn't find key {key} in {} {namespace}/{name}", kind.kind())]
    MissingKey { kind: SourceKind, namespace: String, name: String, key: String },
}

/// One followed object: `kind` and `namespace/name`.
type Key = (SourceKind, String);

/// What is known of a followed object.
#[derive(Debug, Clone)]
enum Known {
    /// Not listed yet.
    Unknown,
    Absent,
    Present(Arc<Value>),
}

/// Called with (kind, namespace, name) when a followed object changes.
type OnChange = Arc<dyn Fn(SourceKind, &str, &str) + Send + Sync>;

struct Followed {
    known: watch::Receiver<Known>,
    task: tokio::task::AbortHandle,
}

/// The per-object watches of one agent.
struct Watches {
    client: Arc<dyn Client>,
    followed: Mutex<HashMap<Key, Followed>>,
    on_change: Mutex<Option<OnChange>>,
    /// Every object that reached this agent, as (kind, `namespace/name`): what the node has seen.
    received: Arc<Mutex<HashSet<Key>>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for f in self.followed.get_mut().unwrap_or_else(|e| e.into_inner()).values() {
            f.task.abort();
        }
    }
}

pub(crate) struct Sources {
    /// `None` in tests that give a fixed list of objects instead.
    watches: Option<Arc<Watches>>,
    #[cfg(test)]
    fixed: HashMap<Key, Arc<Value>>,
}

/// Decoded contents of a ConfigMap (`data` and `binaryData`) or a Secret (`data`).
pub(crate) type Contents = BTreeMap<String, Vec<u8>>;

fn decode_map(obj: &Value, key: &str, base64: bool, out: &mut Contents) {
    for (k, v) in obj.get(key).and_then(Value::as_object).into_iter().flatten() {
        let Some(s) = v.as_str() else { continue };
        let bytes = if base64 {
            base64::engine::general_purpose::STANDARD.decode(s).unwrap_or_else(|_| s.as_bytes().to_vec())
        } else {
            s.as_bytes().to_vec()
        };
        out.insert(k.clone(), bytes);
    }
}

impl Sources {
    /// Sources read through `client`, following only the objects pods name. Needs a Tokio runtime
    /// once pods start to name objects.
    pub fn new(client: Arc<dyn Client>) -> Self {
        let watches = Watches {
            client,
            followed: Mutex::default(),
            on_change: Mutex::default(),
            received: Arc::default(),
        };
        Sources {
            watches: Some(Arc::new(watches)),
            #[cfg(test)]
            fixed: HashMap::new(),
        }
    }

    /// Objects from a fixed list (`kind`, `namespace/name`, object), for tests.
    #[cfg(test)]
    pub fn fixed(objects: Vec<(SourceKind, &str, Value)>) -> Self {
        let map = objects.into_iter().map(|(k, key, v)| ((k, key.to_string()), Arc::new(v))).collect();
        Sources { watches: None, fixed: map }
    }

    /// Calls `f` with (kind, namespace, name) whenever a followed object changes (or is first seen).
    pub fn on_change(&self, f: impl Fn(SourceKind, &str, &str) + Send + Sync + 'static) {
        if let Some(w) = &self.watches {
            *w.on_change.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(f));
        }
    }

    /// Follows what `pod` names and waits (at most `limit`) until each has been listed once, so
    /// that a pod is not told an object is missing that simply has not been read yet.
    pub async fn wait_synced_for(&self, pod: &Value, limit: Duration) {
        let Some(w) = &self.watches else { return };
        let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
        let mut pending = Vec::new();
        for (kind, name) in referenced(pod) {
            pending.push(w.follow((kind, format!("{ns}/{name}"))));
        }
        let all = futures::future::join_all(pending.into_iter().map(|mut rx| async move {
            let _ = rx.wait_for(|k| !matches!(k, Known::Unknown)).await;
        }));
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// Stops following what `gone`, a pod that left the node, named and no other pod of its
    /// namespace on the node names; `others` gives those pods for a namespace. What a pod names
    /// cannot change (its containers' env and its volumes are immutable), so a pod leaving is the
    /// only moment an object can lose its last reader, and only the leaving pod's objects need a
    /// look: a pod that names nothing costs nothing. (A pass over every pod of the node per
    /// deletion kept an agent of 30,000 simulated pods at a full core under 20 deletions a second,
    /// and its pods' start seconds late.)
    pub fn release(&self, gone: &Value, others: impl FnOnce(&str) -> Vec<Arc<Value>>) {
        let Some(w) = &self.watches else { return };
        let named = referenced(gone);
        if named.is_empty() {
            return;
        }
        let ns = gone.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
        let others = others(ns);
        let mut followed = w.followed.lock().unwrap_or_else(|e| e.into_inner());
        for (kind, name) in named {
            if others.iter().any(|pod| references(pod, kind, &name)) {
                continue;
            }
            let key = (kind, format!("{ns}/{name}"));
            if let Some(f) = followed.remove(&key) {
                debug!(kind = kind.kind(), object = %key.1, "no pod names it any more: unwatching");
                f.task.abort();
            }
        }
    }

    /// The objects being followed, as (kind, `namespace/name`).
    #[cfg(test)]
    fn followed(&self) -> HashSet<Key> {
        let w = self.watches.as_ref().expect("watched sources");
        w.followed.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    /// Every object that has reached this agent through its client.
    #[cfg(test)]
    fn received(&self) -> HashSet<Key> {
        let w = self.watches.as_ref().expect("watched sources");
        w.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn lookup(&self, kind: SourceKind, key: &str) -> Option<Arc<Value>> {
        let Some(w) = &self.watches else {
            #[cfg(test)]
            return self.fixed.get(&(kind, key.to_string())).cloned();
            #[cfg(not(test))]
            return None;
        };
        let followed = w.followed.lock().unwrap_or_else(|e| e.into_inner());
        match &*followed.get(&(kind, key.to_string()))?.known.borrow() {
            Known::Present(v) => Some(v.clone()),
            Known::Unknown | Known::Absent => None,
        }
    }

    /// The contents of `namespace/name`, or `None` when it does not exist (yet).
    pub fn contents(&self, kind: SourceKind, namespace: &str, name: &str) -> Option<Contents> {
        let key = format!("{namespace}/{name}");
        let mut out = Contents::new();
        match kind {
            SourceKind::ConfigMap => {
                let obj = self.lookup(kind, &key)?;
                decode_map(&obj, "data", false, &mut out);
                decode_map(&obj, "binaryData", true, &mut out);
            }
            SourceKind::Secret => {
                let obj = self.lookup(kind, &key)?;
                decode_map(&obj, "data", true, &mut out);
            }
        }
        Some(out)
    }

    /// Like `contents`, with a missing object an error unless `optional` (then empty).
    pub fn require(&self, kind: SourceKind, ns: &str, name: &str, optional: bool) -> Result<Contents, SourceError> {
        match self.contents(kind, ns, name) {
            Some(c) => Ok(c),
            None if optional => Ok(Contents::new()),
            None => Err(SourceError::Missing { kind, name: name.to_string() }),
        }
    }

    /// One key of `namespace/name`: `Ok(None)` when optional and missing.
    pub fn key(&self, kind: SourceKind, namespace: &str, r: &Value) -> Result<Option<Vec<u8>>, SourceError> {
        let name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let key = r.get("key").and_then(Value::as_str).unwrap_or("");
        let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
        match self.contents(kind, namespace, name) {
            None if optional => Ok(None),
            None => Err(SourceError::Missing { kind, name: name.to_string() }),
            Some(c) => match c.get(key) {
                Some(v) => Ok(Some(v.clone())),
                None if optional => Ok(None),
                None => Err(SourceError::MissingKey {
                    kind,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    key: key.to_string(),
                }),
            },
        }
    }
}

impl Watches {
    /// Starts following `key` unless it is followed already; what is known of it.
    fn follow(self: &Arc<Self>, key: Key) -> watch::Receiver<Known> {
        let mut followed = self.followed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = followed.get(&key) {
            return f.known.clone();
        }
        let (tx, rx) = watch::channel(Known::Unknown);
        let task = tokio::spawn(follow(Arc::downgrade(self), key.clone(), tx)).abort_handle();
        followed.insert(key, Followed { known: rx.clone(), task });
        rx
    }

    /// Notes what the client handed over, whatever this agent then makes of it.
    fn saw(&self, kind: SourceKind, obj: &Value) {
        let at = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        let key = (kind, format!("{}/{}", at("/metadata/namespace"), at("/metadata/name")));
        self.received.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
    }

    fn record(&self, key: &Key, known: Known, tx: &watch::Sender<Known>) {
        tx.send_replace(known);
        let on_change = self.on_change.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(f), Some((ns, name))) = (on_change, key.1.split_once('/')) {
            f(key.0, ns, name);
        }
    }
}

/// How long a follow waits before it lists again after its first failed list.
const FIRST_RETRY: Duration = Duration::from_millis(5);
/// How long it waits before listing again after a watch ended.
const RELIST_AFTER_WATCH: Duration = Duration::from_millis(100);

/// Lists and watches one object (by name, in its namespace) until aborted, listing again after
/// a watch ends or fails.
async fn follow(watches: std::sync::Weak<Watches>, key: Key, tx: watch::Sender<Known>) {
    let (kind, full) = (key.0, key.1.clone());
    let Some((ns, name)) = full.split_once('/') else { return };
    let params = ListParams::namespace(ns).fields(format!("metadata.name={name}"));
    let res = kind.resource();
    // A list refused at first is usually a race, not a rule: the node authorizer learns that the
    // pod naming the object is bound here a moment after this agent does. So the first retry comes
    // soon, then each waits twice as long.
    let mut pause = FIRST_RETRY;
    loop {
        let Some(client) = watches.upgrade().map(|w| w.client.clone()) else { return };
        match client.list(res, &params).await {
            Ok(list) => {
                let Some(w) = watches.upgrade() else { return };
                for o in &list.items {
                    w.saw(kind, o);
                }
                let obj = list.items.into_iter().find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name));
                w.record(&key, obj.map_or(Known::Absent, |o| Known::Present(Arc::new(o))), &tx);
                drop(w);
                if let Ok(mut events) = client.watch(res, &params, list.resource_version).await {
                    pause = RELIST_AFTER_WATCH;
                    while let Some(Ok(event)) = events.next().await {
                        let Some(w) = watches.upgrade() else { return };
                        if let WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) = &event {
                            w.saw(kind, o);
                        }
                        match event {
                            WatchEvent::Added(o) | WatchEvent::Modified(o) => w.record(&key, Known::Present(Arc::new(o)), &tx),
                            WatchEvent::Deleted(_) => w.record(&key, Known::Absent, &tx),
                            WatchEvent::Bookmark(_) => {}
                        }
                    }
                }
            }
            Err(e) => debug!(kind = kind.kind(), object = %full, error = %e, "listing failed; trying again"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// The ConfigMaps and Secrets `pod` reads (in its own namespace): env, envFrom, volumes,
/// projected sources.
pub(crate) fn referenced(pod: &Value) -> Vec<(SourceKind, String)> {
    let mut out = Vec::new();
    let mut add = |kind: SourceKind, v: Option<&Value>, field: &str| {
        if let Some(name) = v.and_then(|r| r.get(field)).and_then(Value::as_str)
            && !out.iter().any(|(k, n)| *k == kind && n == name)
        {
            out.push((kind, name.to_string()));
        }
    };
    let spec = &pod["spec"];
    let containers = ["initContainers", "containers"].into_iter().flat_map(|f| spec.get(f).and_then(Value::as_array));
    for ct in containers.flatten() {
        for e in ct.get("env").and_then(Value::as_array).into_iter().flatten() {
            let from = e.get("valueFrom");
            add(SourceKind::ConfigMap, from.and_then(|f| f.get("configMapKeyRef")), "name");
            add(SourceKind::Secret, from.and_then(|f| f.get("secretKeyRef")), "name");
        }
        for e in ct.get("envFrom").and_then(Value::as_array).into_iter().flatten() {
            add(SourceKind::ConfigMap, e.get("configMapRef"), "name");
            add(SourceKind::Secret, e.get("secretRef"), "name");
        }
    }
    for v in spec.get("volumes").and_then(Value::as_array).into_iter().flatten() {
        add(SourceKind::ConfigMap, v.get("configMap"), "name");
        add(SourceKind::Secret, v.get("secret"), "secretName");
        for s in v.pointer("/projected/sources").and_then(Value::as_array).into_iter().flatten() {
            add(SourceKind::ConfigMap, s.get("configMap"), "name");
            add(SourceKind::Secret, s.get("secret"), "name");
        }
    }
    out
}

/// Whether `pod` reads ConfigMap or Secret `name` (in its own namespace) anywhere: env, envFrom,
/// volumes, projected sources.
pub(crate) fn references(pod: &Value, kind: SourceKind, name: &str) -> bool {
    let is = |v: Option<&Value>, field: &str| v.and_then(|r| r.get(field)).and_then(Value::as_str) == Some(name);
    let (key_ref, env_ref, volume, volume_field) = match kind {
        SourceKind::ConfigMap => ("configMapKeyRef", "configMapRef", "configMap", "name"),
        SourceKind::Secret => ("secretKeyRef", "secretRef", "secret", "secretName"),
    };
    let spec = &pod["spec"];
    let containers = spec.get("containers").and_then(Value::as_array).into_iter().flatten();
    for ct in containers {
        let env = ct.get("env").and_then(Value::as_array).into_iter().flatten();
        if env.into_iter().any(|e| is(e.get("valueFrom").and_then(|f| f.get(key_ref)), "name")) {
            return true;
        }
        let env_from = ct.get("envFrom").and_then(Value::as_array).into_iter().flatten();
        if env_from.into_iter().any(|e| is(e.get(env_ref), "name")) {
            return true;
        }
    }
    spec.get("volumes").and_then(Value::as_array).into_iter().flatten().any(|v| {
        is(v.get(volume), volume_field)
            || v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|s| is(s.get(volume), "name"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pod_references_the_objects_its_env_and_volumes_name() {
        let pod = json!({"spec": {
            "containers": [{"name": "c", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
                "envFrom": [{"configMapRef": {"name": "app"}}]}],
            "volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "extra"}}]}},
                {"name": "s", "secret": {"secretName": "tls"}}]}});
        assert!(references(&pod, SourceKind::Secret, "db"));
        assert!(references(&pod, SourceKind::Secret, "tls"));
        assert!(references(&pod, SourceKind::ConfigMap, "app"));
        assert!(references(&pod, SourceKind::ConfigMap, "extra"));
        assert!(!references(&pod, SourceKind::ConfigMap, "db"), "a Secret's name is not a ConfigMap's");
        assert!(!references(&pod, SourceKind::Secret, "app"));
        let mut all = referenced(&pod);
        all.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(all, [
            (SourceKind::ConfigMap, "app".to_string()),
            (SourceKind::Secret, "db".to_string()),
            (SourceKind::ConfigMap, "extra".to_string()),
            (SourceKind::Secret, "tls".to_string()),
        ]);
    }

    fn object(kind: &str, ns: &str, name: &str, value: &str) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": ns}, "data": {"k": value}})
    }

    #[tokio::test]
    async fn only_the_objects_pods_name_reach_the_agent_and_they_are_unwatched_with_their_pods() {
        use shepherd_runtime::testing::MemoryClient;
        let client = Arc::new(MemoryClient::new());
        let secret = base64::engine::general_purpose::STANDARD.encode("pw");
        for (kind, res, name) in [
            ("Secret", &kinds::SECRET, "db"),
            ("Secret", &kinds::SECRET, "someone-elses"),
            ("ConfigMap", &kinds::CONFIGMAP, "app"),
        ] {
            client.create(res, Some("ns"), object(kind, "ns", name, &secret)).await.expect("create");
        }
        client.create(&kinds::SECRET, Some("other"), object("Secret", "other", "db", &secret)).await.expect("create");
        let sources = Sources::new(client.clone());
        let changed = Arc::new(Mutex::new(Vec::new()));
        let seen = changed.clone();
        sources.on_change(move |kind, ns, name| seen.lock().expect("lock").push(format!("{}:{ns}/{name}", kind.word())));

        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {
            "containers": [{"name": "c", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}],
            "volumes": [{"name": "v", "configMap": {"name": "app"}}]}});
        sources.wait_synced_for(&pod, Duration::from_secs(10)).await;
        assert_eq!(sources.contents(SourceKind::Secret, "ns", "db").and_then(|c| c.get("k").cloned()), Some(b"pw".to_vec()));
        assert!(sources.contents(SourceKind::ConfigMap, "ns", "app").is_some());
        let want: HashSet<Key> = [(SourceKind::Secret, "ns/db".to_string()), (SourceKind::ConfigMap, "ns/app".to_string())].into();
        assert_eq!(sources.received(), want, "a Secret no pod on the node names never reaches it");
        assert_eq!(sources.followed(), want);

        // An edit reaches the cache and is announced.
        let mut edited = object("Secret", "ns", "db", &base64::engine::general_purpose::STANDARD.encode("new"));
        edited["metadata"]["resourceVersion"] = json!(null);
        client.update(&kinds::SECRET, Some("ns"), edited).await.expect("update");
        for _ in 0..100 {
            if sources.contents(SourceKind::Secret, "ns", "db").and_then(|c| c.get("k").cloned()) == Some(b"new".to_vec()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(sources.contents(SourceKind::Secret, "ns", "db").and_then(|c| c.get("k").cloned()), Some(b"new".to_vec()));
        assert!(changed.lock().expect("lock").iter().any(|c| c == "secret:ns/db"));

        // While another pod of the namespace names the Secret, it stays followed when the first goes.
        let reader = Arc::new(json!({"metadata": {"name": "q", "namespace": "ns"}, "spec": {
            "containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "db"}}]}]}}));
        sources.release(&pod, |ns| if ns == "ns" { vec![reader.clone()] } else { Vec::new() });
        assert_eq!(sources.followed(), [(SourceKind::Secret, "ns/db".to_string())].into(), "the ConfigMap only the gone pod named is unwatched");
        assert!(sources.contents(SourceKind::Secret, "ns", "db").is_some());
        assert!(sources.contents(SourceKind::ConfigMap, "ns", "app").is_none());

        // Once no pod names them, the watches stop and the objects are forgotten.
        sources.release(&reader, |_| Vec::new());
        assert!(sources.followed().is_empty());
        assert!(sources.contents(SourceKind::Secret, "ns", "db").is_none());
        for _ in 0..100 {
            if client.open_watches() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(client.open_watches(), 0, "no watch is left open");
    }
}
