//! Reading a Pod's state: its phase, node, readiness, ordinal and resource requests.

use std::time::Duration;

use serde_json::Value;

use crate::json::{array_at, opt_str_at};
use crate::meta::is_deleting;
use crate::quantity;

/// A mirror pod: the API's copy of a static pod a node runs from its own files
/// (`kubernetes.io/config.mirror`).
pub fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror").is_some()
}

pub fn phase(pod: &Value) -> &str {
    opt_str_at(pod, "/status/phase").unwrap_or("Pending")
}

/// Counts toward a workload's replicas: not terminating and not finished.
pub fn is_active(pod: &Value) -> bool {
    !is_deleting(pod) && !matches!(phase(pod), "Failed" | "Succeeded")
}

/// The node the pod is bound to, if any.
pub fn node_name(pod: &Value) -> Option<&str> {
    opt_str_at(pod, "/spec/nodeName").filter(|n| !n.is_empty())
}

pub fn is_scheduled(pod: &Value) -> bool {
    node_name(pod).is_some()
}

fn ready_condition(pod: &Value) -> Option<&Value> {
    array_at(pod, "/status/conditions").iter().find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
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
    ready_condition(pod).and_then(|c| c.get("lastTransitionTime")).and_then(Value::as_str).and_then(|t| t.parse().ok())
}

/// Whether a pod counts as available at `at`: ready for at least `min_ready`. `Err(wait)` when it
/// is ready but not yet long enough, with how long until it will be.
pub fn availability(pod: &Value, min_ready: Duration, at: jiff::Timestamp) -> Result<bool, Duration> {
    if !is_ready(pod) {
        return Ok(false);
    }
    if min_ready.is_zero() {
        return Ok(true);
    }
    // A ready pod without a transition time is treated as ready since forever, as Kubernetes does.
    let Some(since) = ready_since(pod) else { return Ok(true) };
    let ready_for = Duration::try_from(at.duration_since(since)).unwrap_or(Duration::ZERO);
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

/// A container's request for `resource` in thousandths of its unit (millicores, or bytes times
/// 1000 for memory), if it has a readable one.
pub fn container_request_milli(container: &Value, resource: &str) -> Option<i128> {
    let text = quantity::text(container.get("resources")?.get("requests")?.get(resource)?)?;
    quantity::milli_value(&text).ok()
}

/// A container's request for `resource` read by `parse` ([`quantity::cpu_millis`],
/// [`quantity::memory_bytes`]); a limit without a readable request is the request, as defaulting
/// makes it in Kubernetes.
pub fn container_request(container: &Value, resource: &str, parse: fn(&str) -> Result<i64, String>) -> Option<i64> {
    let resources = container.get("resources")?;
    let read = |list: &str| parse(&quantity::text(resources.get(list)?.get(resource)?)?).ok();
    read("requests").or_else(|| read("limits"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(phase: &str, ready: bool) -> Value {
        json!({"metadata": {"name": "web-0"}, "spec": {}, "status": {"phase": phase,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
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
    fn a_pod_is_available_only_after_being_ready_for_min_ready_seconds() {
        let at: jiff::Timestamp = "2025-01-01T00:00:10Z".parse().unwrap();
        let mut p = pod("Running", true);
        p["status"]["conditions"][0]["lastTransitionTime"] = json!("2025-01-01T00:00:00Z");
        assert_eq!(availability(&p, Duration::from_secs(5), at), Ok(true));
        assert_eq!(availability(&p, Duration::from_secs(15), at), Err(Duration::from_secs(5)));
        assert_eq!(availability(&pod("Pending", false), Duration::ZERO, at), Ok(false));
    }

    #[test]
    fn phase_node_and_activity_read_their_kubernetes_defaults() {
        let mut p = json!({"spec": {"nodeName": ""}});
        assert_eq!((phase(&p), node_name(&p), is_scheduled(&p), is_active(&p)), ("Pending", None, false, true));
        p["spec"]["nodeName"] = json!("n1");
        p["status"] = json!({"phase": "Succeeded"});
        assert_eq!((node_name(&p), is_active(&p)), (Some("n1"), false));
        p["metadata"] = json!({"deletionTimestamp": "2025-01-01T00:00:00Z"});
        p["status"]["phase"] = json!("Running");
        assert!(!is_active(&p), "a terminating pod no longer counts");
    }

    #[test]
    fn container_requests_read_strings_and_numbers_exactly() {
        let c = json!({"resources": {"requests": {"cpu": "1.1", "memory": 1024, "bad": "x"}}});
        assert_eq!(container_request_milli(&c, "cpu"), Some(1100));
        assert_eq!(container_request_milli(&c, "memory"), Some(1_024_000));
        assert_eq!(container_request_milli(&c, "bad"), None);
        assert_eq!(container_request_milli(&c, "gpu"), None);
        let limited = json!({"resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "1Gi"}}});
        assert_eq!(container_request(&limited, "cpu", quantity::cpu_millis), Some(250));
        assert_eq!(container_request(&limited, "memory", quantity::memory_bytes), Some(1 << 30), "the limit stands in");
        assert_eq!(container_request(&json!({}), "cpu", quantity::cpu_millis), None);
    }
}
