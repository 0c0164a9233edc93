//! Kubernetes Events: what controllers record about what they did, de-duplicated by count,
//! combined when similar, and rate-limited per object so a busy controller cannot flood the API
//! server with them.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::ratelimit::WholeTokens;
use shepherd_runtime::{Client, Patch};
use tokio::time::Instant;

/// Events an object may have written at once before the spam filter holds it back. client-go's
/// `EventSourceObjectSpamFilter` allows a burst of 25 per (source, object).
const SPAM_BURST: u32 = 25;
/// How often an object that used up its burst earns another event: client-go refills the
/// spam filter's bucket at 1/300 qps, one token every five minutes.
const SPAM_REFILL_INTERVAL: Duration = Duration::from_secs(300);
/// Distinct messages with the same (object, type, reason) at which they start being combined.
/// client-go's aggregator gives the first nine their own Events and folds the tenth and later
/// ones into one.
const AGGREGATE_MAX_EVENTS: usize = 10;
/// How long similar events keep counting towards aggregation after the last of them: client-go
/// forgets them after 10 minutes without one.
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// What a combined Event's message starts with, as client-go writes it.
const COMBINED_PREFIX: &str = "(combined from similar events): ";
/// Entries each of the recorder's caches keeps, as client-go's LRU caches do (4096), so a
/// long-running controller seeing many objects stays bounded.
const CACHE_ENTRIES: usize = 4096;

/// `Normal` or `Warning`, as `kubectl describe` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Records Events about objects, correlating them the way client-go's recorder does before
/// anything is written:
///
/// - a repeat of the same (object, type, reason, message) bumps the existing Event's `count` and
///   `lastTimestamp` instead of creating another one;
/// - once an (object, type, reason) has had ten distinct messages within ten minutes, further
///   ones go into a single Event whose message is the latest one prefixed with
///   `(combined from similar events): `, bumped by count like a repeat;
/// - each object gets a burst of 25 writes and then one more every five minutes; events beyond
///   that are dropped. Without this, a ReplicaSet scaled to 10,000 replicas would write 10,000
///   `SuccessfulCreate` Events, a large share of the API server's work during the scale-out.
///
/// The state is per recorder, and a recorder has one source component, so "per object" here is
/// client-go's "per (source, object)".
#[derive(Clone)]
pub struct EventRecorder {
    client: Arc<dyn Client>,
    component: String,
    /// A node agent's events name the node of the pod as their source host, as kubelet's do.
    host_is_pod_node: bool,
    state: Arc<Mutex<Correlator>>,
}

/// What the recorder remembers about the events it has seen, all bounded by [`CACHE_ENTRIES`].
#[derive(Default)]
struct Correlator {
    /// The spam filter's token bucket per object.
    buckets: Recent<WholeTokens>,
    /// Distinct messages per (object, type, reason), for aggregation.
    similar: Recent<Similar>,
    /// Event name by de-duplication key, for events this recorder created.
    written: Recent<String>,
}

/// The distinct messages recently seen for one (object, type, reason).
struct Similar {
    /// The messages that have Events of their own; at most `AGGREGATE_MAX_EVENTS - 1`.
    messages: HashSet<String>,
    last_seen: Instant,
}

impl Similar {
    fn new(now: Instant) -> Self {
        Similar { messages: HashSet::new(), last_seen: now }
    }

    /// Whether `message` goes into the combined Event rather than one of its own. The first nine
    /// distinct messages keep their own Events (so their repeats still count on them); every
    /// other one is combined until the (object, type, reason) has been quiet for the window.
    fn is_combined(&mut self, message: &str, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_seen) > AGGREGATE_WINDOW {
            self.messages.clear();
        }
        self.last_seen = now;
        if self.messages.contains(message) {
            return false;
        }
        if self.messages.len() + 1 < AGGREGATE_MAX_EVENTS {
            self.messages.insert(message.to_string());
            return false;
        }
        true
    }
}

/// A map that forgets its least recently used entries once it holds [`CACHE_ENTRIES`]. Forgetting
/// only costs accuracy: a forgotten bucket starts full again, forgotten messages count afresh
/// towards aggregation, and a forgotten Event name means the next repeat creates a new Event.
struct Recent<V> {
    entries: HashMap<String, (u64, V)>,
    /// Increases on every access; an entry's copy says how recently it was used.
    clock: u64,
}

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Recent { entries: HashMap::new(), clock: 0 }
    }
}

impl<V> Recent<V> {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn get(&mut self, key: &str) -> Option<&V> {
        let now = self.tick();
        let (used, value) = self.entries.get_mut(key)?;
        *used = now;
        Some(value)
    }

    /// The entry for `key`, made with `new` if there is none.
    fn get_or_insert_with(&mut self, key: &str, new: impl FnOnce() -> V) -> &mut V {
        if !self.entries.contains_key(key) {
            self.make_room();
            self.entries.insert(key.to_string(), (0, new()));
        }
        let now = self.tick();
        let (used, value) = self.entries.get_mut(key).expect("present or just inserted");
        *used = now;
        value
    }

    fn insert(&mut self, key: String, value: V) {
        if !self.entries.contains_key(&key) {
            self.make_room();
        }
        let now = self.tick();
        self.entries.insert(key, (now, value));
    }

    /// Evicts the least recently used quarter when full, so the scan is paid once per
    /// `CACHE_ENTRIES / 4` insertions rather than on each.
    fn make_room(&mut self) {
        if self.entries.len() < CACHE_ENTRIES {
            return;
        }
        let mut uses: Vec<u64> = self.entries.values().map(|(used, _)| *used).collect();
        let (_, &mut cutoff, _) = uses.select_nth_unstable(CACHE_ENTRIES / 4);
        self.entries.retain(|_, (used, _)| *used > cutoff);
    }
}

/// `<object>.<16 hex digits>`, as Kubernetes names events. A `generateName` of `<object>.` would
/// be rejected: a name prefix must itself be a valid name, and it may not end in a dot.
fn event_name(object: &str) -> String {
    static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = jiff::Timestamp::now().as_nanosecond() as u64;
    let seq = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{object}.{:016x}", nanos.wrapping_add(seq))
}

/// The fields of `obj` an Event about it is made from: `apiVersion`, `kind`, the namespace, name,
/// uid and resourceVersion, and `spec.nodeName` (a node agent's Events name it as their host).
/// [`EventRecorder::record`] makes the same Event from this as from the whole object; a write
/// that waits in the background keeps this rather than a copy of, say, a whole pod.
pub fn subject(obj: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for field in ["apiVersion", "kind"] {
        if let Some(v) = obj.get(field) {
            out.insert(field.to_string(), v.clone());
        }
    }
    if let Some(m) = obj.get("metadata").and_then(Value::as_object) {
        let kept: serde_json::Map<String, Value> = ["namespace", "name", "uid", "resourceVersion"]
            .iter()
            .filter_map(|f| m.get(*f).map(|v| (f.to_string(), v.clone())))
            .collect();
        out.insert("metadata".to_string(), Value::Object(kept));
    }
    if let Some(node) = obj.at("/spec/nodeName") {
        out.insert("spec".to_string(), json!({ "nodeName": node }));
    }
    Value::Object(out)
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl EventRecorder {
    pub fn new(client: Arc<dyn Client>, component: impl Into<String>) -> Self {
        EventRecorder { client, component: component.into(), host_is_pod_node: false, state: Arc::default() }
    }

    /// The recorder of a node agent: component `kubelet`, and each event's source host the node
    /// its pod is bound to.
    pub fn for_node_agent(client: Arc<dyn Client>) -> Self {
        EventRecorder { host_is_pod_node: true, ..EventRecorder::new(client, "kubelet") }
    }

    /// As [`EventRecorder::record`], without waiting: for code that cannot await, and callers
    /// that must not be held up by the write. Only the [`subject`] of `obj` waits with the write.
    pub fn record_in_background(&self, obj: &Value, type_: EventType, reason: &str, message: &str) {
        let (recorder, obj, reason, message) = (self.clone(), subject(obj), reason.to_string(), message.to_string());
        tokio::spawn(async move { recorder.record(&obj, type_, &reason, &message).await });
    }

    /// Records an event about `obj`, or drops it if the object has used up its share (see
    /// [`EventRecorder`]). Failures are logged, never returned: an event is a note for humans and
    /// must not fail a reconcile.
    pub async fn record(&self, obj: &Value, type_: EventType, reason: &str, message: &str) {
        let ns = obj.at("/metadata/namespace").and_then(Value::as_str).unwrap_or("default").to_string();
        let name = obj.at("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let uid = obj.at("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
        let object = format!("{ns}/{kind}/{name}/{uid}");
        let Some((dedupe, message)) = self.correlate(&object, type_, reason, message) else {
            tracing::debug!(object = %object, reason, "event dropped by the spam filter");
            return;
        };
        let existing = self.lock().written.get(&dedupe).cloned();
        if let Some(event_name) = existing {
            let bumped = async {
                let current = self.client.get(&kinds::EVENT, Some(&ns), &event_name).await?;
                let count = current.get("count").and_then(Value::as_i64).unwrap_or(1) + 1;
                // The message only changes for a combined Event, which shows the latest one.
                let patch = json!({"count": count, "lastTimestamp": now(), "message": message});
                self.client.patch(&kinds::EVENT, Some(&ns), &event_name, Patch::Merge(patch)).await
            };
            match bumped.await {
                Ok(_) => return,
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(error = %e, reason, "could not update event");
                    return;
                }
            }
        }
        let t = now();
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": event_name(&name), "namespace": ns},
            "involvedObject": {"kind": kind, "name": name, "namespace": obj.at("/metadata/namespace"),
                "uid": uid, "apiVersion": obj.get("apiVersion"), "resourceVersion": obj.at("/metadata/resourceVersion")},
            "reason": reason, "message": message, "type": type_.as_str(), "count": 1,
            "firstTimestamp": t, "lastTimestamp": t,
            "source": match (self.host_is_pod_node, obj.at("/spec/nodeName")) {
                (true, Some(host)) => json!({"component": self.component, "host": host}),
                _ => json!({"component": self.component}),
            },
            "reportingComponent": self.component,
        });
        match self.client.create(&kinds::EVENT, Some(&ns), event).await {
            Ok(created) => {
                if let Some(n) = created.at("/metadata/name").and_then(Value::as_str) {
                    self.lock().written.insert(dedupe, n.to_string());
                }
            }
            Err(e) => tracing::warn!(error = %e, reason, "could not record event"),
        }
    }

    /// Decides, before any request, what an event becomes: the key its Event is de-duplicated by
    /// and the message to write, or `None` if the spam filter drops it. As in client-go,
    /// aggregation comes first and the filter judges what it produced, so bumping a combined
    /// Event spends a token like any other write.
    fn correlate<'m>(&self, object: &str, type_: EventType, reason: &str, message: &'m str) -> Option<(String, Cow<'m, str>)> {
        let now = Instant::now();
        let similar = format!("{object}/{}/{reason}", type_.as_str());
        let mut state = self.lock();
        let combined = state.similar.get_or_insert_with(&similar, || Similar::new(now)).is_combined(message, now);
        if state.buckets.get_or_insert_with(object, || WholeTokens::full(SPAM_BURST, SPAM_REFILL_INTERVAL, now)).take(now).is_err() {
            return None;
        }
        Some(if combined {
            // Keyed without the message, so every combined message lands on the same Event.
            (similar, Cow::Owned(format!("{COMBINED_PREFIX}{message}")))
        } else {
            (format!("{similar}/{message}"), Cow::Borrowed(message))
        })
    }

    /// The state is only touched between requests and nothing in it can panic half-way, so a
    /// poisoned lock still holds consistent data.
    fn lock(&self) -> std::sync::MutexGuard<'_, Correlator> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_runtime::testing::MemoryClient;

    /// The Events in `client`, without what differs between two recordings of the same one
    /// (their names and times).
    async fn recorded(client: &MemoryClient) -> Vec<Value> {
        let list = client.list(&kinds::EVENT, &Default::default()).await.expect("list events");
        list.items
            .into_iter()
            .map(|mut e| {
                let o = e.as_object_mut().expect("an event is an object");
                for volatile in ["metadata", "firstTimestamp", "lastTimestamp"] {
                    o.remove(volatile);
                }
                e
            })
            .collect()
    }

    #[tokio::test]
    async fn an_event_made_from_the_subject_is_the_event_made_from_the_whole_object() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                "labels": {"app": "web"}, "annotations": {"note": "x"}, "ownerReferences": [{"kind": "ReplicaSet", "name": "web"}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "minimal"}]},
            "status": {"phase": "Running"}});
        let unbound = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "shop"},
            "spec": {"containers": []}});
        for recorder in [EventRecorder::new as fn(Arc<dyn Client>, &'static str) -> EventRecorder, |c, _| EventRecorder::for_node_agent(c)] {
            for obj in [&pod, &unbound] {
                let (whole, slim) = (Arc::new(MemoryClient::new()), Arc::new(MemoryClient::new()));
                recorder(whole.clone(), "default-scheduler").record(obj, EventType::Normal, "Scheduled", "assigned").await;
                recorder(slim.clone(), "default-scheduler").record(&subject(obj), EventType::Normal, "Scheduled", "assigned").await;
                let (a, b) = (recorded(&whole).await, recorded(&slim).await);
                assert_eq!(a.len(), 1, "one Event recorded");
                assert_eq!(a, b);
            }
        }
        let kept = subject(&pod);
        assert!(kept["metadata"].get("labels").is_none() && kept.get("status").is_none(), "only what an Event reads: {kept}");
    }

    #[test]
    fn the_tenth_distinct_message_is_combined_until_a_quiet_window() {
        let start = Instant::now();
        let mut similar = Similar::new(start);
        let combined: Vec<bool> = (0..12).map(|i| similar.is_combined(&format!("m{i}"), start)).collect();
        assert_eq!(combined, [vec![false; 9], vec![true; 3]].concat());
        assert!(!similar.is_combined("m3", start), "a message with its own Event keeps it");
        let quiet = start + AGGREGATE_WINDOW + Duration::from_secs(1);
        assert!(!similar.is_combined("m11", quiet), "after a quiet window messages count afresh");
    }

    #[test]
    fn recent_keeps_the_most_recently_used_entries() {
        let mut recent = Recent::default();
        for i in 0..CACHE_ENTRIES {
            recent.insert(format!("k{i}"), i);
        }
        assert!(recent.get("k0").is_some(), "touching k0 makes it recent");
        recent.insert("new".to_string(), 0);
        assert!(recent.entries.len() <= CACHE_ENTRIES);
        assert!(recent.get("k0").is_some() && recent.get("new").is_some());
        assert!(recent.get("k1").is_none(), "the least recently used went");
        assert!(recent.get(&format!("k{}", CACHE_ENTRIES - 1)).is_some());
    }
}
