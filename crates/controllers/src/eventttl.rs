//! Deletes Events once they are older than the event TTL, as kube-apiserver's `--event-ttl` does.
//!
//! Kubernetes attaches an etcd lease to every Event write, so an Event expires a TTL after its
//! last update. Shepherd's store has no leases; this controller keeps the same rule on the engine:
//! an Event's age is counted from the latest of `lastTimestamp`, `eventTime`,
//! `series.lastObservedTime` and `metadata.creationTimestamp`, each Event is requeued for the moment
//! it expires, and the delete carries the resourceVersion it judged, so an Event bumped meanwhile
//! (a repeat raising its `count`) lives on.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager};
use tracing::debug;

use crate::ControllerConfig;

/// kube-apiserver's default `--event-ttl`.
pub const DEFAULT_EVENT_TTL: Duration = Duration::from_secs(3600);

/// When the Event was last written to, by the clock of whoever wrote it.
fn last_seen(event: &Value) -> Option<Timestamp> {
    ["/lastTimestamp", "/eventTime", "/series/lastObservedTime", "/metadata/creationTimestamp"]
        .iter()
        .filter_map(|p| event.at(p).and_then(Value::as_str)?.parse::<Timestamp>().ok())
        .max()
}

/// The fields of an Event this controller reads: its metadata and the timestamps of `last_seen`.
/// The Event cache keeps only these (the involved object, source, reason and message are most of
/// a parsed Event, and a busy cluster holds several Events per pod).
fn expiry_fields(mut event: Value) -> Value {
    let Some(fields) = event.as_object_mut() else { return event };
    let mut kept = serde_json::Map::new();
    for name in ["metadata", "lastTimestamp", "eventTime"] {
        if let Some(v) = fields.remove(name) {
            kept.insert(name.to_string(), v);
        }
    }
    if let Some(seen) = fields.get_mut("series").and_then(|s| s.as_object_mut()).and_then(|s| s.remove("lastObservedTime")) {
        kept.insert("series".to_string(), serde_json::json!({ "lastObservedTime": seen }));
    }
    Value::Object(kept)
}

/// How long until `event` expires: zero once it has (an Event without any timestamp has).
fn remaining(event: &Value, ttl: Duration, now: Timestamp) -> Duration {
    let Some(seen) = last_seen(event) else { return Duration::ZERO };
    let age = now.duration_since(seen);
    let age = Duration::try_from(age).unwrap_or(Duration::ZERO);
    ttl.saturating_sub(age)
}

struct EventTtl {
    client: Arc<dyn Client>,
    events: Arc<Cache>,
    ttl: Duration,
}

impl EventTtl {
    async fn reconcile(&self, key: &str) -> Result<Action, shepherd_runtime::controller::Error> {
        let Some(event) = self.events.get(key) else { return Ok(Action::Done) };
        let left = remaining(&event, self.ttl, Timestamp::now());
        if !left.is_zero() {
            // Timestamps have whole seconds: look again just after the second it expires in.
            return Ok(Action::RequeueAfter(left + Duration::from_millis(100)));
        }
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let params = DeleteParams {
            precondition_resource_version: event.at("/metadata/resourceVersion").and_then(Value::as_str).and_then(|r| r.parse().ok()),
            ..DeleteParams::default()
        };
        match self.client.delete(&kinds::EVENT, Some(namespace), name, &params).await {
            Ok(_) => debug!(event = %key, "event expired"),
            // Gone already, or written again since: its next version is judged on its own.
            Err(e) if e.is_not_found() => {}
            Err(shepherd_api::ApiError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Action::Done)
    }
}

/// The controller that expires Events `ttl` after their last update.
pub fn event_ttl_controller(client: Arc<dyn Client>, manager: &Manager, ttl: Duration, config: ControllerConfig) -> Controller {
    // Nothing else in the controller manager reads Events from its cache; should the projection
    // already be taken (another TTL controller on the same manager), it is the same one.
    manager.informers().set_transform(&kinds::EVENT, Arc::new(expiry_fields));
    let events = manager.informers().cache(&kinds::EVENT);
    let reconciler = Arc::new(EventTtl { client, events, ttl });
    Controller::new("eventttl", &kinds::EVENT, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    .workers(config.workers)
    .mode(config.mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn an_event_expires_a_ttl_after_its_latest_timestamp() {
        let ttl = Duration::from_secs(3600);
        let bumped = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}, "lastTimestamp": "2026-01-01T00:50:00Z"});
        assert_eq!(remaining(&bumped, ttl, at("2026-01-01T01:00:00Z")), Duration::from_secs(50 * 60));
        assert_eq!(remaining(&bumped, ttl, at("2026-01-01T01:50:00Z")), Duration::ZERO);
        let series = json!({"eventTime": "2026-01-01T00:00:00.000000Z", "series": {"lastObservedTime": "2026-01-01T00:30:00.000000Z"}});
        assert_eq!(remaining(&series, ttl, at("2026-01-01T01:00:00Z")), Duration::from_secs(30 * 60));
    }

    #[test]
    fn an_event_without_timestamps_counts_as_expired() {
        assert_eq!(remaining(&json!({"reason": "x"}), Duration::from_secs(60), Timestamp::now()), Duration::ZERO);
    }

    /// A whole Event as the recorder writes it, with the optional timestamps given.
    fn whole(last: Option<&str>, event_time: Option<&str>, series: Option<&str>) -> Value {
        let mut e = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web-0.1", "namespace": "default", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-0", "uid": "p-1", "apiVersion": "v1"},
            "reason": "Scheduled", "message": "Successfully assigned default/web-0 to node-1", "type": "Normal",
            "source": {"component": "default-scheduler"}, "count": 3, "firstTimestamp": "2026-01-01T00:00:00Z",
            "reportingComponent": "default-scheduler", "reportingInstance": "shepherd",
        });
        if let Some(t) = last {
            e["lastTimestamp"] = json!(t);
        }
        if let Some(t) = event_time {
            e["eventTime"] = json!(t);
        }
        if let Some(t) = series {
            e["series"] = json!({"count": 4, "lastObservedTime": t});
        }
        e
    }

    #[test]
    fn the_cached_projection_expires_every_event_when_the_whole_event_would() {
        let ttl = Duration::from_secs(3600);
        let times = [None, Some("2026-01-01T00:10:00Z"), Some("2026-01-01T00:40:00.000000Z"), Some("not a time")];
        for last in times {
            for event_time in times {
                for series in times {
                    let e = whole(last, event_time, series);
                    let p = expiry_fields(e.clone());
                    assert_eq!(p["metadata"], e["metadata"], "the metadata is kept whole");
                    assert_eq!(last_seen(&p), last_seen(&e));
                    for now in ["2026-01-01T00:30:00Z", "2026-01-01T01:05:00Z", "2026-01-01T01:45:00Z"] {
                        assert_eq!(remaining(&p, ttl, at(now)), remaining(&e, ttl, at(now)), "{e}");
                    }
                    assert_eq!(p.get("involvedObject"), None);
                    assert_eq!(p.get("message"), None);
                }
            }
        }
        assert_eq!(expiry_fields(json!("not an object")), json!("not an object"));
    }
}
