//! Defaults of HorizontalPodAutoscalers (`autoscaling/v2`), as Kubernetes fills them in.

use serde_json::{Value, json};

use super::{existing_spec, set_absent};

/// `minReplicas` 1 and, without metrics, 80% average CPU utilization; a `behavior` that is set
/// gets its missing rules and fields (an absent one stays absent, read as the defaults).
pub fn default_horizontal_pod_autoscaler(obj: &mut Value) {
    let Some(spec) = existing_spec(obj) else { return };
    set_absent(spec, "minReplicas", json!(1));
    if spec.get("metrics").is_none_or(|m| m.is_null() || m.as_array().is_some_and(Vec::is_empty)) {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]),
        );
    }
    if let Some(b) = spec.get("behavior").filter(|b| b.is_object()) {
        let filled = behavior_with_defaults(Some(b));
        spec.insert("behavior".into(), filled);
    }
}

/// A behavior with Kubernetes' defaults for whatever it leaves out: scaling up at once by the
/// larger of 4 pods or 100% per 15 s, scaling down after a 300 s window by up to 100% per 15 s.
pub fn behavior_with_defaults(behavior: Option<&Value>) -> Value {
    let mut out = behavior.filter(|b| b.is_object()).cloned().unwrap_or_else(|| json!({}));
    let defaults = [
        ("scaleUp", 0, json!([{"type": "Pods", "value": 4, "periodSeconds": 15}, {"type": "Percent", "value": 100, "periodSeconds": 15}])),
        ("scaleDown", 300, json!([{"type": "Percent", "value": 100, "periodSeconds": 15}])),
    ];
    for (rule, window, policies) in defaults {
        let Some(b) = out.as_object_mut() else { break };
        let r = b.entry(rule).or_insert_with(|| json!({}));
        if !r.is_object() {
            *r = json!({});
        }
        if let Some(r) = r.as_object_mut() {
            set_absent(r, "stabilizationWindowSeconds", json!(window));
            set_absent(r, "selectPolicy", json!("Max"));
            set_absent(r, "policies", policies);
        }
    }
    out
}
