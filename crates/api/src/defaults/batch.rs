//! Defaults of Jobs and CronJobs (`batch/v1`), including the selector and labels the server
//! generates for a Job that does not set `manualSelector`.

use serde_json::{Map, Value, json};

use super::{default_pod_spec, existing_spec, object_at, set_absent};

/// The label that ties a Job's pods to it by uid, and the selector the server generates from it.
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// The label carrying the Job's name on its pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The older spellings of both labels, which Kubernetes still sets for clients that select on them.
const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
const LEGACY_JOB_NAME_LABEL: &str = "job-name";

pub(super) fn default_job(obj: &mut Value) {
    if let Some(spec) = existing_spec(obj) {
        default_job_spec(spec);
    }
    let manual = obj.pointer("/spec/manualSelector").and_then(Value::as_bool) == Some(true);
    let uid = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_string();
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
    if !manual && !uid.is_empty() && obj.pointer("/spec/template").is_some_and(Value::is_object) {
        generate_selector(obj, &uid, &name);
    }
    default_job_template(obj, "/spec/template");
}

fn default_job_spec(spec: &mut Map<String, Value>) {
    // A work queue Job sets only `parallelism`; then `completions` stays unset.
    if spec.get("completions").is_none_or(Value::is_null) && spec.get("parallelism").is_none_or(Value::is_null) {
        spec.insert("completions".into(), json!(1));
    }
    set_absent(spec, "parallelism", json!(1));
    if spec.get("backoffLimitPerIndex").is_none_or(Value::is_null) {
        set_absent(spec, "backoffLimit", json!(6));
    }
    set_absent(spec, "completionMode", json!("NonIndexed"));
    set_absent(spec, "suspend", json!(false));
    let replacement = if spec.get("podFailurePolicy").is_some_and(Value::is_object) { "Failed" } else { "TerminatingOrFailed" };
    set_absent(spec, "podReplacementPolicy", json!(replacement));
    if let Some(rules) = spec.get_mut("podFailurePolicy").and_then(|p| p.get_mut("rules")).and_then(Value::as_array_mut) {
        for rule in rules.iter_mut().filter_map(Value::as_object_mut) {
            for pattern in rule.get_mut("onPodConditions").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(p) = pattern.as_object_mut() {
                    set_absent(p, "status", json!("True"));
                }
            }
        }
    }
}

/// The selector `batch.kubernetes.io/controller-uid=<uid>`, and the four labels on the template.
fn generate_selector(obj: &mut Value, uid: &str, name: &str) {
    if let Some(labels) = obj.pointer_mut("/spec/template").and_then(|t| object_at(t, &["metadata", "labels"])) {
        set_absent(labels, CONTROLLER_UID_LABEL, json!(uid));
        set_absent(labels, LEGACY_CONTROLLER_UID_LABEL, json!(uid));
        set_absent(labels, JOB_NAME_LABEL, json!(name));
        set_absent(labels, LEGACY_JOB_NAME_LABEL, json!(name));
    }
    if let Some(spec) = existing_spec(obj) {
        set_absent(spec, "selector", json!({"matchLabels": {CONTROLLER_UID_LABEL: uid}}));
    }
}

fn default_job_template(obj: &mut Value, pointer: &str) {
    let Some(template) = obj.pointer_mut(pointer).filter(|t| t.is_object()) else { return };
    if let Some(spec) = object_at(template, &["spec"]) {
        default_pod_spec(spec);
    }
}

pub(super) fn default_cron_job(obj: &mut Value) {
    if let Some(spec) = existing_spec(obj) {
        set_absent(spec, "concurrencyPolicy", json!("Allow"));
        set_absent(spec, "suspend", json!(false));
        set_absent(spec, "successfulJobsHistoryLimit", json!(3));
        set_absent(spec, "failedJobsHistoryLimit", json!(1));
    }
    default_job_template(obj, "/spec/jobTemplate/spec/template");
}
