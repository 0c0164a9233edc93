//! The pod a `logs` or `exec` means: `NAME` and `pod/NAME` name it; `TYPE/NAME` of a workload or
//! Service (`job/migrate`, `deploy/web`, `svc/web`) means one of the pods its selector picks, the
//! one kubectl would pick, with kubectl's note on stderr when there was a choice.

use std::cmp::Reverse;

use serde_json::Value;
use shepherd_api::{int_at, str_at};

use crate::connection::Cluster;
use crate::resource;

/// The pod `typed` stands for, by name.
pub async fn pod(cluster: &Cluster, typed: &str) -> anyhow::Result<String> {
    let Some((kind, name)) = typed.split_once('/') else { return Ok(typed.to_string()) };
    let res = resource::resolve(kind)?;
    if res.kind == "Pod" {
        return Ok(name.to_string());
    }
    let path = resource::object_path(res, &cluster.namespace, name);
    let obj = cluster.get(&path).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let selector = label_selector(&obj).ok_or_else(|| {
        anyhow::anyhow!("cannot select pods of {}/{name}: it has no selector", resource::type_name(res))
    })?;
    let pods = resource::collection_path(&shepherd_api::kinds::POD, Some(&cluster.namespace));
    let query = resource::query(&[("labelSelector", Some(selector))]);
    let list = cluster.get(&format!("{pods}{query}")).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut items: Vec<&Value> = list.get("items").and_then(Value::as_array).into_iter().flatten().collect();
    items.sort_by_key(|p| preference(p));
    let Some(first) = items.first() else {
        anyhow::bail!("no pods found for {}/{name}", resource::type_name(res))
    };
    let chosen = str_at(first, "/metadata/name").to_string();
    if items.len() > 1 {
        eprintln!("Found {} pods, using pod/{chosen}", items.len());
    }
    Ok(chosen)
}

/// A workload's `spec.selector` (a LabelSelector) or a Service's (a map), as a query's
/// `labelSelector`.
fn label_selector(obj: &Value) -> Option<String> {
    let selector = obj.pointer("/spec/selector")?;
    let labels = selector.get("matchLabels").unwrap_or(selector).as_object();
    let mut parts: Vec<String> =
        labels.into_iter().flatten().filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}"))).collect();
    for e in selector.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let key = str_at(e, "/key");
        parts.push(match str_at(e, "/operator") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The order kubectl prefers pods in for logs: bound to a node, then running (unknown, then
/// pending, after), ready, more restarts, and older.
fn preference(pod: &Value) -> (bool, u8, bool, Reverse<i64>, String) {
    let unbound = str_at(pod, "/spec/nodeName").is_empty();
    let phase = match str_at(pod, "/status/phase") {
        "Running" => 0,
        "Unknown" => 1,
        "Pending" => 2,
        _ => 3,
    };
    let ready = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
    let restarts: i64 = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(0, |cs| cs.iter().map(|c| int_at(c, "/restartCount")).sum());
    (unbound, phase, !ready, Reverse(restarts), str_at(pod, "/metadata/creationTimestamp").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_of_workloads_and_services_read_as_a_query() {
        let job = json!({"spec": {"selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}}}});
        assert_eq!(label_selector(&job).as_deref(), Some("batch.kubernetes.io/controller-uid=u1"));
        let svc = json!({"spec": {"selector": {"app": "web"}}});
        assert_eq!(label_selector(&svc).as_deref(), Some("app=web"));
        let expr = json!({"spec": {"selector": {"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]}, {"key": "canary", "operator": "DoesNotExist"}]}}});
        assert_eq!(label_selector(&expr).as_deref(), Some("tier in (a,b),!canary"));
        assert_eq!(label_selector(&json!({"spec": {}})), None);
    }

    #[test]
    fn a_running_ready_bound_pod_comes_first() {
        let pod = |name: &str, node: &str, phase: &str, ready: bool, created: &str| json!({
            "metadata": {"name": name, "creationTimestamp": created}, "spec": {"nodeName": node},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        let mut pods = [
            pod("pending", "", "Pending", false, "2026-01-01T00:00:00Z"),
            pod("succeeded", "n", "Succeeded", false, "2026-01-01T00:00:00Z"),
            pod("newer", "n", "Running", true, "2026-01-02T00:00:00Z"),
            pod("unready", "n", "Running", false, "2026-01-01T00:00:00Z"),
            pod("older", "n", "Running", true, "2026-01-01T00:00:00Z"),
        ];
        pods.sort_by_key(preference);
        let names: Vec<&str> = pods.iter().map(|p| str_at(p, "/metadata/name")).collect();
        assert_eq!(names, ["older", "newer", "unready", "succeeded", "pending"]);
    }
}
