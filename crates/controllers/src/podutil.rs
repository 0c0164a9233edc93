//! What only the workload controllers and the garbage collector need: the clock they judge time
//! by, the owner-reference patches they adopt and release with, and the order they scale down in.
//! Reading objects and pods is `shepherd_api::meta` and `shepherd_api::pod`.

use std::cmp::Ordering;
use std::time::Duration;

use serde_json::{Map, Value, json};
use shepherd_api::ResourceInfo;
use shepherd_api::meta::{name, owner_references, resource_version, uid};
use shepherd_api::pod::ordinal;
use shepherd_runtime::PodView;

/// Label every pod and ReplicaSet of a Deployment carries, naming its template's hash.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The wall clock as controllers see it. It follows tokio's clock, so a test on the paused clock
/// that advances time ten minutes also moves this clock ten minutes (availability and progress
/// deadlines are judged by it); outside a paused runtime it is the system clock.
pub fn now() -> jiff::Timestamp {
    let wall = jiff::Timestamp::now();
    let tokio_now = tokio::time::Instant::now().into_std();
    let std_now = std::time::Instant::now();
    let shifted = match tokio_now.checked_duration_since(std_now) {
        Some(ahead) => wall.checked_add(signed(ahead)),
        None => wall.checked_sub(signed(std_now.duration_since(tokio_now))),
    };
    shifted.unwrap_or(wall)
}

fn signed(d: Duration) -> jiff::SignedDuration {
    jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::ZERO)
}

/// RFC 3339 with second precision, as Kubernetes writes timestamps.
pub fn format_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn parse_time(s: &str) -> Option<jiff::Timestamp> {
    s.parse().ok()
}

/// How long from `since` to `until`, zero if `since` is later.
pub fn elapsed(since: jiff::Timestamp, until: jiff::Timestamp) -> Duration {
    Duration::try_from(until.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// A controller owner reference to `owner` (of kind `res`), blocking the owner's foreground
/// deletion until the dependent is gone, as Kubernetes controllers write it.
pub fn owner_reference_to(owner: &Value, res: &ResourceInfo) -> Value {
    json!({
        "apiVersion": res.api_version(),
        "kind": res.kind,
        "name": name(owner),
        "uid": uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// A merge patch setting `ownerReferences` to `refs`, valid only while the object is still at
/// `resource_version` (a concurrent adoption or release makes it a conflict, never a lost write).
pub fn owner_references_patch(obj: &Value, refs: Vec<Value>) -> Value {
    let refs = if refs.is_empty() { Value::Null } else { Value::Array(refs) };
    json!({"metadata": {"ownerReferences": refs, "resourceVersion": resource_version(obj)}})
}

/// The patch that makes `owner` the controller of `obj`.
pub fn adopt_patch(obj: &Value, owner: &Value, res: &ResourceInfo) -> Value {
    let mut refs = owner_references(obj).to_vec();
    refs.push(owner_reference_to(owner, res));
    owner_references_patch(obj, refs)
}

/// The patch that removes every owner reference with `owner_uid` from `obj`.
pub fn release_patch(obj: &Value, owner_uid: &str) -> Value {
    let refs = owner_references(obj).iter().filter(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid)).cloned().collect();
    owner_references_patch(obj, refs)
}

/// Scale-down order: which of two pods to delete first. Unscheduled before scheduled, pending
/// before running, not ready before ready, then the higher ordinal (the newer name) first.
pub fn victim_order(a: &PodView, b: &PodView, prefix: &str) -> Ordering {
    let rank_phase = |p: &PodView| match p.phase() {
        "Pending" => 0,
        "Unknown" => 1,
        _ => 2,
    };
    let key = |p: &PodView| (p.is_scheduled(), rank_phase(p), p.is_ready());
    key(a).cmp(&key(b)).then_with(|| {
        let (oa, ob) = (ordinal(a.name(), prefix), ordinal(b.name(), prefix));
        ob.cmp(&oa).then_with(|| b.name().cmp(a.name()))
    })
}

/// Whether the pod carries every label of a template (`fullyLabeledReplicas`).
pub fn fully_labeled(pod: &PodView, template_labels: &Map<String, Value>) -> bool {
    template_labels.iter().all(|(k, v)| v.as_str().is_some_and(|v| pod.label(k) == Some(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, phase: &str, ready: bool) -> Value {
        let mut p = json!({"metadata": {"name": name}, "spec": {}, "status": {"phase": phase,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    #[test]
    fn scale_down_deletes_unscheduled_then_pending_then_unready_then_the_highest_ordinal() {
        let mut pods = [
            pod("web-0", Some("n"), "Running", true),
            pod("web-5", Some("n"), "Running", true),
            pod("web-1", Some("n"), "Running", false),
            pod("web-2", Some("n"), "Pending", false),
            pod("web-3", None, "Pending", false),
        ]
        .map(|p| PodView::of(&p));
        pods.sort_by(|a, b| victim_order(a, b, "web"));
        let order: Vec<&str> = pods.iter().map(PodView::name).collect();
        assert_eq!(order, ["web-3", "web-2", "web-1", "web-5", "web-0"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_controller_clock_moves_with_the_paused_tokio_clock() {
        let before = now();
        tokio::time::advance(Duration::from_secs(600)).await;
        let moved = elapsed(before, now());
        assert!(moved >= Duration::from_secs(600) && moved < Duration::from_secs(605), "{moved:?}");
    }
}
