//! Validation of DaemonSets and StatefulSets (`apps/v1`) and ReplicationControllers (`v1`), with
//! Kubernetes' field paths and messages.

use serde_json::Value;

use super::{
    Amount, NOT_SUPPORTED, check_min, check_one_of, check_unsupported_in_pod_spec, field_str, field_value,
    int_or_percent, invalid_value, is_dns1123_label, is_set, selector_of, strip_nulls, unsupported_value,
    validate_labels, validate_pod_spec,
};
use crate::error::Cause;
use crate::selector::LabelSelector;

/// Kubernetes' message for a StatefulSet update that touches a fixed part of its spec.
const STATEFUL_SET_UPDATE_RULE: &str = "updates to statefulset spec for fields other than 'replicas', 'ordinals', \
    'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden";
/// The parts of a StatefulSet's spec an update may change.
const STATEFUL_SET_MUTABLE: &[&str] =
    &["replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy", "minReadySeconds"];

pub(super) fn validate_daemon_set(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec").filter(|s| s.is_object()) else {
        c.push(Cause::required("spec"));
        return;
    };
    check_min(spec, "minReadySeconds", "spec", 0, c);
    check_min(spec, "revisionHistoryLimit", "spec", 0, c);
    validate_selector_and_template(spec, "daemonset", c);
    let Some(strategy) = field_value(spec, "updateStrategy") else { return };
    check_one_of(strategy, "type", "spec.updateStrategy", &["RollingUpdate", "OnDelete"], c);
    let rolling = field_value(strategy, "rollingUpdate");
    match (field_str(strategy, "type"), rolling) {
        (Some("RollingUpdate"), None) => c.push(Cause::required("spec.updateStrategy.rollingUpdate")),
        (Some("RollingUpdate"), Some(r)) => validate_daemon_set_rolling_update(r, c),
        (Some("OnDelete"), Some(_)) => {
            c.push(Cause::forbidden("spec.updateStrategy.rollingUpdate", "may not be specified when strategy `type` is 'OnDelete'"));
        }
        _ => {}
    }
}

fn validate_daemon_set_rolling_update(rolling: &Value, c: &mut Vec<Cause>) {
    let base = "spec.updateStrategy.rollingUpdate";
    let mut amount = |field: &str| {
        let path = format!("{base}.{field}");
        let a = int_or_percent(rolling.get(field), &path, c);
        if let Some(Amount::Percent(p)) = a
            && p > 100
        {
            c.push(Cause::invalid(&path, format!("Invalid value: \"{p}%\": must not be greater than 100%")));
        }
        a
    };
    let unavailable = amount("maxUnavailable");
    let surge = amount("maxSurge");
    let nonzero = |a: &Option<Amount>| matches!(a, Some(Amount::Count(n) | Amount::Percent(n)) if *n != 0);
    match (nonzero(&unavailable), nonzero(&surge)) {
        (true, true) => {
            let sent = rolling.get("maxSurge").cloned().unwrap_or(Value::Null);
            c.push(invalid_value(format!("{base}.maxSurge"), &sent, "may not be set when maxUnavailable is non-zero"));
        }
        (false, false) => c.push(Cause::new("FieldValueRequired", format!("{base}.maxUnavailable"), "cannot be 0 when maxSurge is 0")),
        _ => {}
    }
}

pub(super) fn validate_stateful_set(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec").filter(|s| s.is_object()) else {
        c.push(Cause::required("spec"));
        return;
    };
    check_min(spec, "replicas", "spec", 0, c);
    check_min(spec, "minReadySeconds", "spec", 0, c);
    check_min(spec, "revisionHistoryLimit", "spec", 0, c);
    check_min(spec, "ordinals.start", "spec", 0, c);
    check_one_of(spec, "podManagementPolicy", "spec", &["OrderedReady", "Parallel"], c);
    if let Some(service) = field_str(spec, "serviceName").filter(|s| !s.is_empty())
        && !is_dns1123_label(service)
    {
        c.push(invalid_value("spec.serviceName", &Value::from(service), "must be a DNS-1123 label (the headless Service's name)"));
    }
    if field_value(spec, "volumeClaimTemplates").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
        c.push(Cause::forbidden("spec.volumeClaimTemplates",
            format!("{NOT_SUPPORTED}: PersistentVolumeClaims are not served yet, so a StatefulSet cannot claim volumes")));
    }
    validate_selector_and_template(spec, "statefulset", c);
    if let Some(strategy) = field_value(spec, "updateStrategy") {
        check_one_of(strategy, "type", "spec.updateStrategy", &["RollingUpdate", "OnDelete"], c);
        if let Some(rolling) = field_value(strategy, "rollingUpdate") {
            if field_str(strategy, "type") == Some("OnDelete") {
                c.push(Cause::forbidden("spec.updateStrategy.rollingUpdate",
                    "only allowed for updateStrategy 'RollingUpdate'"));
            }
            check_min(rolling, "partition", "spec.updateStrategy.rollingUpdate", 0, c);
            if field_value(rolling, "maxUnavailable").is_some_and(is_set) {
                c.push(Cause::forbidden("spec.updateStrategy.rollingUpdate.maxUnavailable", NOT_SUPPORTED));
            }
        }
    }
    if let Some(retention) = field_value(spec, "persistentVolumeClaimRetentionPolicy") {
        for field in ["whenDeleted", "whenScaled"] {
            check_one_of(retention, field, "spec.persistentVolumeClaimRetentionPolicy", &["Retain", "Delete"], c);
        }
    }
}

pub(super) fn validate_replication_controller(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec").filter(|s| s.is_object()) else {
        c.push(Cause::required("spec"));
        return;
    };
    check_min(spec, "replicas", "spec", 0, c);
    check_min(spec, "minReadySeconds", "spec", 0, c);
    // An equality-based selector: a map of labels, all of which a pod must carry.
    let selector = field_value(spec, "selector").and_then(Value::as_object).filter(|m| !m.is_empty());
    match selector {
        None => c.push(Cause::required("spec.selector")),
        Some(_) => validate_labels(field_value(spec, "selector"), "spec.selector", c),
    }
    let Some(template) = field_value(spec, "template") else {
        c.push(Cause::required("spec.template"));
        return;
    };
    let labels = field_value(template, "metadata.labels").and_then(Value::as_object);
    let matches = selector.map(|sel| sel.iter().all(|(k, v)| labels.is_some_and(|l| l.get(k) == Some(v))));
    validate_template(template, matches, c);
}

/// The selector is required and must match the template's labels; pods restart always.
pub(super) fn validate_selector_and_template(spec: &Value, kind: &str, c: &mut Vec<Cause>) {
    let selector = match field_value(spec, "selector") {
        None => {
            c.push(Cause::required("spec.selector"));
            None
        }
        Some(sel) => selector_of(sel, "spec.selector", kind, c),
    };
    let Some(template) = field_value(spec, "template") else {
        c.push(Cause::required("spec.template"));
        return;
    };
    validate_template(template, selector.map(|sel| sel.matches_object(template)), c);
}

/// A replica controller's pod template: labels its selector matches (when it is usable), a pod
/// spec Shepherd can run, and pods that restart always.
fn validate_template(template: &Value, selector_matches: Option<bool>, c: &mut Vec<Cause>) {
    validate_labels(field_value(template, "metadata.labels"), "spec.template.metadata.labels", c);
    if selector_matches == Some(false) {
        let labels = field_value(template, "metadata.labels").cloned().unwrap_or_else(|| Value::Object(Default::default()));
        c.push(invalid_value("spec.template.metadata.labels", &labels, "`selector` does not match template `labels`"));
    }
    check_unsupported_in_pod_spec(template.get("spec"), "spec.template.spec", c);
    validate_pod_spec(template.get("spec"), "spec.template.spec", c);
    // Any other value is already refused by the pod spec's own check.
    if let Some(rp) = field_str(template, "spec.restartPolicy")
        && matches!(rp, "OnFailure" | "Never")
    {
        c.push(unsupported_value("spec.template.spec.restartPolicy", rp, &["Always"]));
    }
}

/// The selector may not change: pods selected by the old one would be left behind.
fn check_selector_unchanged(old: &Value, new: &Value, c: &mut Vec<Cause>) {
    if let (Some(o), Some(n)) = (field_value(old, "spec.selector"), field_value(new, "spec.selector")) {
        let same = match (LabelSelector::from_k8s(o), LabelSelector::from_k8s(n)) {
            (Ok(a), Ok(b)) => a == b,
            _ => strip_nulls(o) == strip_nulls(n),
        };
        if !same {
            c.push(Cause::invalid("spec.selector", format!("Invalid value: {n}: field is immutable")));
        }
    }
}

pub(super) fn validate_daemon_set_update(old: &Value, new: &Value, c: &mut Vec<Cause>) {
    check_selector_unchanged(old, new, c);
}

pub(super) fn validate_stateful_set_update(old: &Value, new: &Value, c: &mut Vec<Cause>) {
    check_selector_unchanged(old, new, c);
    let fixed = |v: &Value| -> Value {
        let mut spec = field_value(v, "spec").map(strip_nulls).unwrap_or(Value::Null);
        if let Some(m) = spec.as_object_mut() {
            for f in STATEFUL_SET_MUTABLE.iter().chain(&["selector"]) {
                m.remove(*f);
            }
            // An empty list and none are the same claim on volumes.
            if m.get("volumeClaimTemplates").and_then(Value::as_array).is_some_and(Vec::is_empty) {
                m.remove("volumeClaimTemplates");
            }
        }
        spec
    };
    if fixed(old) != fixed(new) {
        c.push(Cause::forbidden("spec", STATEFUL_SET_UPDATE_RULE));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::defaults::apply_defaults;
    use crate::kinds::{DAEMONSET, REPLICATIONCONTROLLER, STATEFULSET};
    use crate::validation::{validate, validate_update};

    fn stateful_set() -> serde_json::Value {
        let mut sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
        apply_defaults(&STATEFULSET, &mut sts);
        sts
    }

    fn daemon_set() -> serde_json::Value {
        let mut ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "a", "image": "minimal"}]}}}});
        apply_defaults(&DAEMONSET, &mut ds);
        ds
    }

    fn causes(err: crate::error::ApiError) -> Vec<(String, String)> {
        match err {
            crate::error::ApiError::Invalid { causes, .. } => causes.into_iter().map(|c| (c.field, c.message)).collect(),
            other => panic!("not a 422: {other:?}"),
        }
    }

    #[test]
    fn defaults_give_a_stateful_set_ordered_ready_rolling_updates_from_partition_zero() {
        let sts = stateful_set();
        assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(sts["spec"]["updateStrategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}));
        assert!(validate(&STATEFULSET, &sts).is_ok());
    }

    #[test]
    fn defaults_give_a_daemon_set_one_unavailable_and_no_surge() {
        let ds = daemon_set();
        assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"], json!({"maxUnavailable": 1, "maxSurge": 0}));
        assert!(validate(&DAEMONSET, &ds).is_ok());
    }

    #[test]
    fn a_stateful_set_with_volume_claim_templates_is_refused_naming_the_field() {
        let mut sts = stateful_set();
        sts["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]);
        let found = causes(validate(&STATEFULSET, &sts).unwrap_err());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "spec.volumeClaimTemplates");
        assert!(found[0].1.contains("PersistentVolumeClaims"), "{found:?}");
    }

    #[test]
    fn a_stateful_set_may_change_replicas_and_template_but_not_its_selector_or_service() {
        let old = stateful_set();
        let mut scaled = old.clone();
        scaled["spec"]["replicas"] = json!(5);
        scaled["spec"]["template"]["spec"]["containers"][0]["image"] = json!("other");
        assert!(validate_update(&STATEFULSET, &old, &scaled).is_ok());

        let mut reselected = old.clone();
        reselected["spec"]["selector"] = json!({"matchLabels": {"app": "db"}});
        reselected["spec"]["template"]["metadata"]["labels"] = json!({"app": "db"});
        let found = causes(validate_update(&STATEFULSET, &old, &reselected).unwrap_err());
        assert_eq!(found.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["spec.selector"]);
        assert!(found[0].1.ends_with("field is immutable"), "{found:?}");

        let mut renamed = old.clone();
        renamed["spec"]["serviceName"] = json!("other");
        let found = causes(validate_update(&STATEFULSET, &old, &renamed).unwrap_err());
        assert_eq!(found[0].0, "spec");
        assert!(found[0].1.starts_with("updates to statefulset spec for fields other than"), "{found:?}");
    }

    #[test]
    fn a_daemon_set_rolling_update_takes_either_surge_or_unavailability() {
        let mut ds = daemon_set();
        ds["spec"]["updateStrategy"]["rollingUpdate"] = json!({"maxUnavailable": 1, "maxSurge": 1});
        let found = causes(validate(&DAEMONSET, &ds).unwrap_err());
        assert_eq!(found[0].0, "spec.updateStrategy.rollingUpdate.maxSurge");
        ds["spec"]["updateStrategy"]["rollingUpdate"] = json!({"maxUnavailable": 0, "maxSurge": 0});
        let found = causes(validate(&DAEMONSET, &ds).unwrap_err());
        assert_eq!(found[0], ("spec.updateStrategy.rollingUpdate.maxUnavailable".into(), "cannot be 0 when maxSurge is 0".into()));
        ds["spec"]["updateStrategy"]["rollingUpdate"] = json!({"maxUnavailable": 0, "maxSurge": "50%"});
        assert!(validate(&DAEMONSET, &ds).is_ok());
    }

    #[test]
    fn a_daemon_set_selector_must_match_its_template_and_never_change() {
        let mut ds = daemon_set();
        ds["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
        let found = causes(validate(&DAEMONSET, &ds).unwrap_err());
        assert_eq!(found[0].0, "spec.template.metadata.labels");
        let old = daemon_set();
        let mut new = old.clone();
        new["spec"]["selector"]["matchLabels"]["tier"] = json!("x");
        new["spec"]["template"]["metadata"]["labels"]["tier"] = json!("x");
        assert_eq!(causes(validate_update(&DAEMONSET, &old, &new).unwrap_err())[0].0, "spec.selector");
    }

    #[test]
    fn a_replication_controller_selects_its_template_labels_unless_told_otherwise() {
        let mut rc = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "web"},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "w", "image": "i"}]}}}});
        apply_defaults(&REPLICATIONCONTROLLER, &mut rc);
        assert_eq!((&rc["spec"]["selector"], &rc["metadata"]["labels"], &rc["spec"]["replicas"]),
            (&json!({"app": "web"}), &json!({"app": "web"}), &json!(1)));
        assert!(validate(&REPLICATIONCONTROLLER, &rc).is_ok());
        rc["spec"]["selector"] = json!({"app": "db"});
        assert_eq!(causes(validate(&REPLICATIONCONTROLLER, &rc).unwrap_err())[0].0, "spec.template.metadata.labels");
    }
}
