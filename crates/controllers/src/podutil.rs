//! What the workload controllers and the garbage collector read off objects: pod activity,
//! readiness and availability, owner references, ordinals, and the clock they judge time by.

use std::cmp::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::ResourceInfo;

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

pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.at(pointer).and_then(Value::as_str)
}

pub fn name(obj: &Value) -> &str {
    str_at(obj, "/metadata/name").unwrap_or("")
}

pub fn namespace(obj: &Value) -> Option<&str> {
    str_at(obj, "/metadata/namespace").filter(|ns| !ns.is_empty())
}

pub fn uid(obj: &Value) -> &str {
    str_at(obj, "/metadata/uid").unwrap_or("")
}

pub fn generation(obj: &Value) -> i64 {
    obj.at("/metadata/generation").and_then(Value::as_i64).unwrap_or(0)
}

pub fn resource_version(obj: &Value) -> &str {
    str_at(obj, "/metadata/resourceVersion").unwrap_or("")
}

/// Marked for deletion (`deletionTimestamp` set): on its way out, whatever still holds it.
pub fn is_deleting(obj: &Value) -> bool {
    obj.at("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null())
}

pub fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    finalizers(obj).contains(&finalizer)
}

pub fn finalizers(obj: &Value) -> Vec<&str> {
    obj.at("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub fn owner_references(obj: &Value) -> &[Value] {
    obj.at("/metadata/ownerReferences").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// The owner reference marked `controller: true`.
pub fn controller_ref(obj: &Value) -> Option<&Value> {
    owner_references(obj).iter().find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The uid of the controlling owner, if any.
pub fn controller_uid(obj: &Value) -> Option<&str> {
    controller_ref(obj).and_then(|r| r.get("uid")).and_then(Value::as_str)
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

pub fn phase(pod: &Value) -> &str {
    str_at(pod, "/status/phase").unwrap_or("Pending")
}

/// Counts toward a workload's replicas: not terminating and not finished.
pub fn is_active(pod: &Value) -> bool {
    !is_deleting(pod) && !matches!(phase(pod), "Failed" | "Succeeded")
}

pub fn is_scheduled(pod: &Value) -> bool {
    str_at(pod, "/spec/nodeName").is_some_and(|n| !n.is_empty())
}

fn ready_condition(pod: &Value) -> Option<&Value> {
    pod.at("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
}

/// Condition `Ready` is `True`.
pub fn is_ready(pod: &Value) -> bool {
    ready_condition(pod).and_then(|c| c.get("status")).and_then(Value::as_str) == Some("True")
}

/// When the pod last became ready (the Ready condition's `lastTransitionTime`).
pub fn ready_since(pod: &Value) -> Option<jiff::Timestamp> {
    if !is_ready(pod) {
        return None;
    }
    ready_condition(pod).and_then(|c| c.get("lastTransitionTime")).and_then(Value::as_str).and_then(parse_time)
}

/// Whether a pod counts as available: ready for at least `min_ready`. `Err(wait)` when it is ready
/// but not yet long enough, with how long until it will be.
pub fn availability(pod: &Value, min_ready: Duration, at: jiff::Timestamp) -> Result<bool, Duration> {
    if !is_ready(pod) {
        return Ok(false);
    }
    if min_ready.is_zero() {
        return Ok(true);
    }
    // A ready pod without a transition time is treated as ready since forever, as Kubernetes does.
    let Some(since) = ready_since(pod) else { return Ok(true) };
    let ready_for = elapsed(since, at);
    if ready_for >= min_ready { Ok(true) } else { Err(min_ready - ready_for) }
}

/// The ordinal of a pod named `<prefix>-<n>`; `None` for any other name.
pub fn ordinal(pod_name: &str, prefix: &str) -> Option<u64> {
    let digits = pod_name.strip_prefix(prefix)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

/// Scale-down order: which of two pods to delete first. Unscheduled before scheduled, pending
/// before running, not ready before ready, then the higher ordinal (the newer name) first.
pub fn victim_order(a: &Value, b: &Value, prefix: &str) -> Ordering {
    let rank_phase = |p: &Value| match phase(p) {
        "Pending" => 0,
        "Unknown" => 1,
        _ => 2,
    };
    let key = |p: &Value| (is_scheduled(p), rank_phase(p), is_ready(p));
    key(a).cmp(&key(b)).then_with(|| {
        let (oa, ob) = (ordinal(name(a), prefix), ordinal(name(b), prefix));
        ob.cmp(&oa).then_with(|| name(b).cmp(name(a)))
    })
}

/// Labels of `obj` as a map of strings.
pub fn labels(obj: &Value) -> serde_json::Map<String, Value> {
    obj.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default()
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
    fn ordinals_are_read_only_from_owner_dash_number_names() {
        assert_eq!(ordinal("web-0", "web"), Some(0));
        assert_eq!(ordinal("web-12", "web"), Some(12));
        assert_eq!(ordinal("web-1-0", "web"), None);
        assert_eq!(ordinal("web-01", "web"), None);
        assert_eq!(ordinal("webby-1", "web"), None);
        assert_eq!(ordinal("web-", "web"), None);
    }

    #[test]
    fn scale_down_deletes_unscheduled_then_pending_then_unready_then_the_highest_ordinal() {
        let mut pods = [
            pod("web-0", Some("n"), "Running", true),
            pod("web-5", Some("n"), "Running", true),
            pod("web-1", Some("n"), "Running", false),
            pod("web-2", Some("n"), "Pending", false),
            pod("web-3", None, "Pending", false),
        ];
        pods.sort_by(|a, b| victim_order(a, b, "web"));
        let order: Vec<&str> = pods.iter().map(name).collect();
        assert_eq!(order, ["web-3", "web-2", "web-1", "web-5", "web-0"]);
    }

    #[test]
    fn a_pod_is_available_only_after_being_ready_for_min_ready_seconds() {
        let at: jiff::Timestamp = "2025-01-01T00:00:10Z".parse().unwrap();
        let mut p = pod("web-0", Some("n"), "Running", true);
        p["status"]["conditions"][0]["lastTransitionTime"] = json!("2025-01-01T00:00:00Z");
        assert_eq!(availability(&p, Duration::from_secs(5), at), Ok(true));
        assert_eq!(availability(&p, Duration::from_secs(15), at), Err(Duration::from_secs(5)));
        assert_eq!(availability(&pod("x", None, "Pending", false), Duration::ZERO, at), Ok(false));
    }

    #[tokio::test(start_paused = true)]
    async fn the_controller_clock_moves_with_the_paused_tokio_clock() {
        let before = now();
        tokio::time::advance(Duration::from_secs(600)).await;
        let moved = elapsed(before, now());
        assert!(moved >= Duration::from_secs(600) && moved < Duration::from_secs(605), "{moved:?}");
    }
}
