//! Events the agent records about its pods (kubelet's `Failed`, `FailedMount`, ...), written in
//! the background: an event is a note for humans and never holds up or fails a reconcile.

use std::sync::Arc;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::Client;
use tracing::warn;

use crate::pods::k8s_time;

/// Records a Warning event about `pod` with `reason` and `message`. Callers record a condition
/// once when it appears (not on every reconcile), so no de-duplication happens here.
pub(crate) fn warn_about(client: &Arc<dyn Client>, pod: &Value, reason: &str, message: &str) {
    let ns = pod.at("/metadata/namespace").and_then(Value::as_str).unwrap_or("default").to_string();
    let name = pod.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let now = k8s_time(jiff::Timestamp::now());
    let suffix: u64 = rand::random::<u64>() & 0xffff_ffff_ffff;
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{suffix:x}"), "namespace": ns},
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": name, "namespace": ns,
            "uid": pod.at("/metadata/uid"), "resourceVersion": pod.at("/metadata/resourceVersion")},
        "reason": reason, "message": message, "type": "Warning", "count": 1,
        "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": "kubelet", "host": pod.at("/spec/nodeName")},
        "reportingComponent": "kubelet",
    });
    let client = client.clone();
    let reason = reason.to_string();
    tokio::spawn(async move {
        if let Err(e) = client.create(&kinds::EVENT, Some(&ns), event).await {
            warn!(error = %e, reason = %reason, "could not record event");
        }
    });
}
