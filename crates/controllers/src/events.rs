//! Kubernetes Events: what controllers record about what they did, de-duplicated by count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_runtime::{Client, Patch};

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

/// Records Events about objects. A repeat of the same (object, type, reason, message) bumps the
/// existing Event's `count` and `lastTimestamp` instead of creating another one.
#[derive(Clone)]
pub struct EventRecorder {
    client: Arc<dyn Client>,
    component: String,
    /// Event name by de-duplication key, for events this recorder created.
    seen: Arc<Mutex<HashMap<String, String>>>,
}

/// `<object>.<16 hex digits>`, as Kubernetes names events. A `generateName` of `<object>.` would
/// be rejected: a name prefix must itself be a valid name, and it may not end in a dot.
fn event_name(object: &str) -> String {
    static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = jiff::Timestamp::now().as_nanosecond() as u64;
    let seq = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{object}.{:016x}", nanos.wrapping_add(seq))
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl EventRecorder {
    pub fn new(client: Arc<dyn Client>, component: impl Into<String>) -> Self {
        EventRecorder { client, component: component.into(), seen: Arc::default() }
    }

    /// Records an event about `obj`. Failures are logged, never returned: an event is a note
    /// for humans and must not fail a reconcile.
    pub async fn record(&self, obj: &Value, type_: EventType, reason: &str, message: &str) {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default").to_string();
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let uid = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
        let dedupe = format!("{ns}/{kind}/{name}/{uid}/{}/{reason}/{message}", type_.as_str());
        let existing = self.seen.lock().ok().and_then(|s| s.get(&dedupe).cloned());
        if let Some(event_name) = existing {
            let bumped = async {
                let current = self.client.get(&kinds::EVENT, Some(&ns), &event_name).await?;
                let count = current.get("count").and_then(Value::as_i64).unwrap_or(1) + 1;
                let patch = json!({"count": count, "lastTimestamp": now()});
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
            "involvedObject": {"kind": kind, "name": name, "namespace": obj.pointer("/metadata/namespace"),
                "uid": uid, "apiVersion": obj.get("apiVersion"), "resourceVersion": obj.pointer("/metadata/resourceVersion")},
            "reason": reason, "message": message, "type": type_.as_str(), "count": 1,
            "firstTimestamp": t, "lastTimestamp": t,
            "source": {"component": self.component},
            "reportingComponent": self.component,
        });
        match self.client.create(&kinds::EVENT, Some(&ns), event).await {
            Ok(created) => {
                if let (Some(n), Ok(mut seen)) = (created.pointer("/metadata/name").and_then(Value::as_str), self.seen.lock()) {
                    // Bounded: a long-running controller must not grow without limit.
                    if seen.len() > 10_000 {
                        seen.clear();
                    }
                    seen.insert(dedupe, n.to_string());
                }
            }
            Err(e) => tracing::warn!(error = %e, reason, "could not record event"),
        }
    }
}
