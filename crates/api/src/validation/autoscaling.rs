//! Validation of HorizontalPodAutoscalers (`autoscaling/v2`), with Kubernetes' field paths.

use serde_json::Value;

use super::{check_one_of, field_int, field_str, field_value, invalid_value, unsupported_value};
use crate::error::Cause;
use crate::quantity::{self, Quantity};

/// Metric types of `autoscaling/v2`; only `Resource` has a source of values here (no custom or
/// external metrics API is served), so the others are refused rather than left never scaling.
const METRIC_TYPES: &[&str] = &["Resource"];
const TARGET_TYPES: &[&str] = &["Utilization", "Value", "AverageValue"];
/// Kubernetes' bounds on `behavior`: a window of at most an hour, a period of at most 30 minutes.
const MAX_WINDOW_SECONDS: i64 = 3600;
const MAX_PERIOD_SECONDS: i64 = 1800;

pub(super) fn validate_horizontal_pod_autoscaler(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec").filter(|s| s.is_object()) else {
        c.push(Cause::required("spec"));
        return;
    };
    match field_value(spec, "scaleTargetRef") {
        None => c.push(Cause::required("spec.scaleTargetRef")),
        Some(r) => {
            for field in ["kind", "name"] {
                match field_str(r, field) {
                    None | Some("") => c.push(Cause::required(format!("spec.scaleTargetRef.{field}"))),
                    Some(v) if v.contains('/') || v.contains('%') || v == "." || v == ".." => c.push(invalid_value(
                        format!("spec.scaleTargetRef.{field}"),
                        &Value::from(v),
                        "may not contain '/' or '%' and may not be '.' or '..'",
                    )),
                    Some(_) => {}
                }
            }
        }
    }
    let min = field_int(spec, "minReplicas");
    if let Some(m) = min
        && m < 1
    {
        c.push(invalid_value("spec.minReplicas", &Value::from(m), "must be greater than or equal to 1"));
    }
    match field_int(spec, "maxReplicas") {
        None => c.push(Cause::required("spec.maxReplicas")),
        Some(max) if max < 1 => c.push(invalid_value("spec.maxReplicas", &Value::from(max), "must be greater than 0")),
        Some(max) if min.is_some_and(|m| max < m) => {
            c.push(invalid_value("spec.maxReplicas", &Value::from(max), "must be greater than or equal to `minReplicas`"))
        }
        Some(_) => {}
    }
    if let Some(Value::Array(metrics)) = field_value(spec, "metrics") {
        for (i, m) in metrics.iter().enumerate() {
            validate_metric(m, &format!("spec.metrics[{i}]"), c);
        }
    }
    if let Some(b) = field_value(spec, "behavior") {
        for (rule, p) in [("scaleUp", "spec.behavior.scaleUp"), ("scaleDown", "spec.behavior.scaleDown")] {
            if let Some(r) = field_value(b, rule) {
                validate_rules(r, p, c);
            }
        }
    }
}

fn validate_metric(m: &Value, p: &str, c: &mut Vec<Cause>) {
    let kind = match field_str(m, "type") {
        None | Some("") => {
            c.push(Cause::required(format!("{p}.type")));
            return;
        }
        Some(t) if !METRIC_TYPES.contains(&t) => {
            c.push(unsupported_value(format!("{p}.type"), t, METRIC_TYPES));
            return;
        }
        Some(t) => t,
    };
    debug_assert_eq!(kind, "Resource");
    let Some(source) = field_value(m, "resource") else {
        c.push(Cause::required(format!("{p}.resource")));
        return;
    };
    match field_str(source, "name") {
        None | Some("") => c.push(Cause::required(format!("{p}.resource.name"))),
        Some(n) if !matches!(n, "cpu" | "memory") => {
            c.push(unsupported_value(format!("{p}.resource.name"), n, &["cpu", "memory"]))
        }
        Some(_) => {}
    }
    let tp = format!("{p}.resource.target");
    let Some(target) = field_value(source, "target") else {
        c.push(Cause::required(tp));
        return;
    };
    let target_type = match field_str(target, "type") {
        None | Some("") => {
            c.push(Cause::required(format!("{tp}.type")));
            return;
        }
        Some(t) if !TARGET_TYPES.contains(&t) => {
            c.push(unsupported_value(format!("{tp}.type"), t, TARGET_TYPES));
            return;
        }
        Some(t) => t,
    };
    match target_type {
        "Utilization" => match field_int(target, "averageUtilization") {
            None => c.push(Cause::required(format!("{tp}.averageUtilization"))),
            Some(u) if u < 1 => {
                c.push(invalid_value(format!("{tp}.averageUtilization"), &Value::from(u), "must be greater than 0"))
            }
            Some(_) => {}
        },
        "AverageValue" => positive_quantity(target, "averageValue", &tp, c),
        // A resource is averaged over the pods, as in Kubernetes: a total target is refused.
        _ => c.push(Cause::invalid(
            format!("{tp}.type"),
            "Invalid value: \"Value\": a Resource metric takes a target of type Utilization or AverageValue",
        )),
    }
}

fn positive_quantity(target: &Value, field: &str, base: &str, c: &mut Vec<Cause>) {
    let path = format!("{base}.{field}");
    let Some(v) = field_value(target, field) else {
        c.push(Cause::required(path));
        return;
    };
    let Some(text) = quantity::text(v) else {
        c.push(invalid_value(path, v, "must be a quantity"));
        return;
    };
    match Quantity::parse(&text) {
        Err(why) => c.push(invalid_value(path, v, &why)),
        Ok(q) if !q.is_positive() => c.push(invalid_value(path, v, "must be positive")),
        Ok(_) => {}
    }
}

fn validate_rules(r: &Value, p: &str, c: &mut Vec<Cause>) {
    if let Some(w) = field_int(r, "stabilizationWindowSeconds")
        && !(0..=MAX_WINDOW_SECONDS).contains(&w)
    {
        c.push(invalid_value(
            format!("{p}.stabilizationWindowSeconds"),
            &Value::from(w),
            &format!("must be between 0 and {MAX_WINDOW_SECONDS} seconds"),
        ));
    }
    check_one_of(r, "selectPolicy", p, &["Max", "Min", "Disabled"], c);
    let Some(Value::Array(policies)) = field_value(r, "policies") else { return };
    for (i, policy) in policies.iter().enumerate() {
        let pp = format!("{p}.policies[{i}]");
        match field_str(policy, "type") {
            None | Some("") => c.push(Cause::required(format!("{pp}.type"))),
            Some(t) if !matches!(t, "Pods" | "Percent") => {
                c.push(unsupported_value(format!("{pp}.type"), t, &["Pods", "Percent"]))
            }
            Some(_) => {}
        }
        match field_int(policy, "value") {
            None => c.push(Cause::required(format!("{pp}.value"))),
            Some(v) if v < 1 => c.push(invalid_value(format!("{pp}.value"), &Value::from(v), "must be greater than zero")),
            Some(_) => {}
        }
        match field_int(policy, "periodSeconds") {
            None => c.push(Cause::required(format!("{pp}.periodSeconds"))),
            Some(s) if !(1..=MAX_PERIOD_SECONDS).contains(&s) => c.push(invalid_value(
                format!("{pp}.periodSeconds"),
                &Value::from(s),
                &format!("must be greater than zero and less than or equal to {MAX_PERIOD_SECONDS}"),
            )),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::ApiError;
    use crate::defaults::apply_defaults;
    use crate::kinds::HORIZONTALPODAUTOSCALER as HPA;
    use crate::validation::validate;

    fn hpa(spec: serde_json::Value) -> serde_json::Value {
        let mut o = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default"}, "spec": spec});
        apply_defaults(&HPA, &mut o);
        o
    }

    fn fields(r: Result<(), ApiError>) -> Vec<String> {
        match r {
            Err(ApiError::Invalid { causes, .. }) => causes.into_iter().map(|c| c.field).collect(),
            other => panic!("expected 422, got {other:?}"),
        }
    }

    const TARGET: &str = r#"{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}"#;

    fn target() -> serde_json::Value {
        serde_json::from_str(TARGET).expect("json")
    }

    #[test]
    fn a_defaulted_autoscaler_is_valid_and_targets_80_percent_cpu() {
        let o = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 5}));
        assert_eq!(validate(&HPA, &o), Ok(()));
        assert_eq!(o["spec"]["minReplicas"], 1);
        assert_eq!(o["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 80);
    }

    #[test]
    fn replica_bounds_are_refused_naming_the_field() {
        let o = hpa(json!({"scaleTargetRef": target(), "minReplicas": 0, "maxReplicas": 5}));
        assert_eq!(fields(validate(&HPA, &o)), ["spec.minReplicas"]);
        let o = hpa(json!({"scaleTargetRef": target(), "minReplicas": 4, "maxReplicas": 2}));
        assert_eq!(fields(validate(&HPA, &o)), ["spec.maxReplicas"]);
        let o = hpa(json!({"scaleTargetRef": {"kind": "Deployment"}, "maxReplicas": 2}));
        assert_eq!(fields(validate(&HPA, &o)), ["spec.scaleTargetRef.name"]);
    }

    #[test]
    fn a_resource_metric_needs_a_target_and_a_known_resource() {
        let o = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu"}}]}));
        assert_eq!(fields(validate(&HPA, &o)), ["spec.metrics[0].resource.target"]);
        let o = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "gpu", "target": {"type": "Utilization"}}}]}));
        assert_eq!(
            fields(validate(&HPA, &o)),
            ["spec.metrics[0].resource.name", "spec.metrics[0].resource.target.averageUtilization"]
        );
        let o = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "-1Mi"}}}]}));
        assert_eq!(fields(validate(&HPA, &o)), ["spec.metrics[0].resource.target.averageValue"]);
        let o = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 3,
            "metrics": [{"type": "External", "external": {}}]}));
        assert_eq!(fields(validate(&HPA, &o)), ["spec.metrics[0].type"]);
    }

    #[test]
    fn behavior_policies_are_checked_field_by_field() {
        let o = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 3, "behavior": {"scaleDown": {
            "stabilizationWindowSeconds": 4000, "selectPolicy": "Sometimes",
            "policies": [{"type": "Pods", "value": 0, "periodSeconds": 15}, {"type": "Share", "value": 1, "periodSeconds": 0}]}}}));
        assert_eq!(
            fields(validate(&HPA, &o)),
            [
                "spec.behavior.scaleDown.stabilizationWindowSeconds",
                "spec.behavior.scaleDown.selectPolicy",
                "spec.behavior.scaleDown.policies[0].value",
                "spec.behavior.scaleDown.policies[1].type",
                "spec.behavior.scaleDown.policies[1].periodSeconds",
            ]
        );
    }
}
