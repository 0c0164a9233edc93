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
}
