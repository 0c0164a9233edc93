//! Validation of Jobs and CronJobs (`batch/v1`), with Kubernetes' field paths and messages.

use serde_json::Value;

use super::{
    NOT_SUPPORTED, check_min, check_one_of, check_unsupported_in_pod_spec, field_int, field_str, field_value,
    invalid_value, is_set, selector_of, strip_nulls, unsupported_value, validate_labels, validate_pod_spec,
};
use crate::cron;
use crate::error::Cause;

/// Job fields of Kubernetes the Job controller does not implement (yet): a 422, not a silently
/// ignored wish.
const UNSUPPORTED_JOB_FIELDS: &[&str] = &["backoffLimitPerIndex", "maxFailedIndexes", "successPolicy"];
/// The controller that runs Jobs unless `managedBy` names another.
const JOB_CONTROLLER: &str = "kubernetes.io/job-controller";

/// A CronJob's name leaves room for the 11 characters of its Jobs' `-<minutes>` suffix.
const CRON_JOB_NAME_MAX: usize = 52;

pub(super) fn validate_job(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec") else {
        c.push(Cause::required("spec"));
        return;
    };
    if spec.is_object() {
        validate_job_spec(spec, "spec", true, c);
    }
}

pub(super) fn validate_cron_job(obj: &Value, c: &mut Vec<Cause>) {
    if let Some(name) = field_str(obj, "metadata.name")
        && name.len() > CRON_JOB_NAME_MAX
    {
        c.push(invalid_value("metadata.name", &Value::from(name), &format!("must be no more than {CRON_JOB_NAME_MAX} characters")));
    }
    let Some(spec) = field_value(obj, "spec").filter(|s| s.is_object()) else {
        c.push(Cause::required("spec"));
        return;
    };
    match field_str(spec, "schedule") {
        None | Some("") => c.push(Cause::required("spec.schedule")),
        Some(s) => {
            if let Err(why) = cron::Schedule::parse(s) {
                c.push(invalid_value("spec.schedule", &Value::from(s), &why));
            }
        }
    }
    if let Some(tz) = field_str(spec, "timeZone")
        && let Err(why) = cron::time_zone(Some(tz))
    {
        c.push(invalid_value("spec.timeZone", &Value::from(tz), &why));
    }
    check_one_of(spec, "concurrencyPolicy", "spec", &["Allow", "Forbid", "Replace"], c);
    check_min(spec, "startingDeadlineSeconds", "spec", 0, c);
    check_min(spec, "successfulJobsHistoryLimit", "spec", 0, c);
    check_min(spec, "failedJobsHistoryLimit", "spec", 0, c);
    match field_value(spec, "jobTemplate") {
        None => c.push(Cause::required("spec.jobTemplate")),
        Some(t) => {
            validate_labels(field_value(t, "metadata.labels"), "spec.jobTemplate.metadata.labels", c);
            match field_value(t, "spec").filter(|s| s.is_object()) {
                Some(js) => validate_job_spec(js, "spec.jobTemplate.spec", false, c),
                None => c.push(Cause::required("spec.jobTemplate.spec")),
            }
        }
    }
}

fn path(base: &str, rest: &str) -> String {
    format!("{base}.{rest}")
}

/// `needs_selector`: a Job carries its selector (generated or manual); a CronJob's template
/// gets one when each Job is created.
fn validate_job_spec(spec: &Value, p: &str, needs_selector: bool, c: &mut Vec<Cause>) {
    check_min(spec, "parallelism", p, 0, c);
    check_min(spec, "completions", p, 0, c);
    check_min(spec, "backoffLimit", p, 0, c);
    check_min(spec, "ttlSecondsAfterFinished", p, 0, c);
    check_min(spec, "backoffLimitPerIndex", p, 0, c);
    if let Some(n) = field_int(spec, "activeDeadlineSeconds")
        && n <= 0
    {
        c.push(invalid_value(path(p, "activeDeadlineSeconds"), &Value::from(n), "must be greater than 0"));
    }
    check_one_of(spec, "completionMode", p, &["NonIndexed", "Indexed"], c);
    if field_str(spec, "completionMode") == Some("Indexed") && field_int(spec, "completions").is_none() {
        c.push(Cause::new("FieldValueRequired", path(p, "completions"), "Required value: when completion mode is Indexed"));
    }
    for field in UNSUPPORTED_JOB_FIELDS {
        if field_value(spec, field).is_some_and(is_set) {
            c.push(Cause::forbidden(path(p, field), NOT_SUPPORTED));
        }
    }
    if let Some(m) = field_str(spec, "managedBy").filter(|m| *m != JOB_CONTROLLER) {
        c.push(unsupported_value(path(p, "managedBy"), m, &[JOB_CONTROLLER]));
    }
    check_one_of(spec, "podReplacementPolicy", p, &["TerminatingOrFailed", "Failed"], c);

    let manual = field_value(spec, "manualSelector").and_then(Value::as_bool) == Some(true);
    let selector = match field_value(spec, "selector") {
        None if needs_selector => {
            c.push(Cause::required(path(p, "selector")));
            None
        }
        None => None,
        Some(sel) => selector_of(sel, &path(p, "selector"), "job", c),
    };
    if !needs_selector && field_value(spec, "selector").is_some() && !manual {
        c.push(Cause::invalid(path(p, "selector"),
            "Invalid value: `selector` will be auto-generated unless `manualSelector` is true"));
    }

    let Some(template) = field_value(spec, "template") else {
        c.push(Cause::required(path(p, "template")));
        return;
    };
    let tp = path(p, "template");
    validate_labels(field_value(template, "metadata.labels"), &path(&tp, "metadata.labels"), c);
    if let Some(sel) = selector
        && !sel.matches_object(template)
    {
        let labels = field_value(template, "metadata.labels").cloned().unwrap_or_else(|| Value::Object(Default::default()));
        c.push(invalid_value(path(&tp, "metadata.labels"), &labels, "`selector` does not match template `labels`"));
    }
    let sp = path(&tp, "spec");
    check_unsupported_in_pod_spec(template.get("spec"), &sp, c);
    validate_pod_spec(template.get("spec"), &sp, c);
    let restart = field_str(template, "spec.restartPolicy");
    if let Some(rp) = restart
        && !matches!(rp, "OnFailure" | "Never")
    {
        c.push(unsupported_value(path(&sp, "restartPolicy"), rp, &["OnFailure", "Never"]));
    }
    if let Some(policy) = field_value(spec, "podFailurePolicy") {
        if let Some(rp) = restart.filter(|r| *r != "Never") {
            c.push(invalid_value(path(&sp, "restartPolicy"), &Value::from(rp),
                "only \"Never\" is supported when podFailurePolicy is specified"));
        }
        validate_pod_failure_policy(policy, &path(p, "podFailurePolicy"), c);
    }
}

fn validate_pod_failure_policy(policy: &Value, p: &str, c: &mut Vec<Cause>) {
    let rules = field_value(policy, "rules").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    for (i, rule) in rules.iter().enumerate() {
        let rp = format!("{p}.rules[{i}]");
        if field_str(rule, "action").is_none() {
            c.push(Cause::required(path(&rp, "action")));
        }
        if field_str(rule, "action") == Some("FailIndex") {
            c.push(Cause::forbidden(path(&rp, "action"), NOT_SUPPORTED));
        } else {
            check_one_of(rule, "action", &rp, &["FailJob", "FailIndex", "Ignore", "Count"], c);
        }
        let exit = field_value(rule, "onExitCodes");
        let conditions = field_value(rule, "onPodConditions").and_then(Value::as_array).filter(|a| !a.is_empty());
        // Pods here never carry the DisruptionTarget condition such rules are written for.
        if conditions.is_some() {
            c.push(Cause::forbidden(path(&rp, "onPodConditions"), NOT_SUPPORTED));
        }
        match (exit, conditions) {
            (Some(_), Some(_)) => c.push(Cause::invalid(rp.clone(),
                "Invalid value: specifying both OnExitCodes and OnPodConditions is not supported")),
            (None, None) => c.push(Cause::invalid(rp.clone(),
                "Invalid value: specifying one of OnExitCodes and OnPodConditions is required")),
            _ => {}
        }
        if let Some(e) = exit {
            let ep = path(&rp, "onExitCodes");
            check_one_of(e, "operator", &ep, &["In", "NotIn"], c);
            if field_str(e, "operator").is_none() {
                c.push(Cause::required(path(&ep, "operator")));
            }
            let values: Vec<i64> =
                field_value(e, "values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_i64).collect();
            if values.is_empty() {
                c.push(Cause::required(path(&ep, "values")));
            }
            for (n, v) in values.iter().enumerate() {
                if values[..n].contains(v) {
                    c.push(Cause::new("FieldValueDuplicate", format!("{ep}.values[{n}]"), format!("Duplicate value: {v}")));
                }
                if *v == 0 && field_str(e, "operator") == Some("In") {
                    c.push(invalid_value(format!("{ep}.values[{n}]"), &Value::from(0), "must not be 0 for the In operator"));
                }
            }
        }
    }
}

/// The fields of a Job that may not change after creation.
pub(super) fn validate_job_update(old: &Value, new: &Value, c: &mut Vec<Cause>) {
    for field in ["selector", "template", "completionMode", "completions", "podFailurePolicy", "manualSelector"] {
        let (o, n) = (field_value(old, &format!("spec.{field}")), field_value(new, &format!("spec.{field}")));
        if o.map(strip_nulls) != n.map(strip_nulls) {
            let shown = n.cloned().unwrap_or(Value::Null);
            c.push(invalid_value(format!("spec.{field}"), &shown, "field is immutable"));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::defaults::apply_defaults;
    use crate::kinds::{CRONJOB, JOB};
    use crate::validation::{validate, validate_update};

    fn job(spec: serde_json::Value) -> serde_json::Value {
        let mut j = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi", "namespace": "default", "uid": "u-1"},
            "spec": spec});
        apply_defaults(&JOB, &mut j);
        j
    }

    fn template(restart: &str) -> serde_json::Value {
        json!({"spec": {"restartPolicy": restart, "containers": [{"name": "c", "image": "busybox"}]}})
    }

    fn fields(e: crate::ApiError) -> Vec<String> {
        match e {
            crate::ApiError::Invalid { causes, .. } => causes.into_iter().map(|c| c.field).collect(),
            other => panic!("not a 422: {other}"),
        }
    }

    #[test]
    fn a_job_gets_kubernetes_defaults_and_a_selector_on_its_uid() {
        let j = job(json!({"template": template("Never")}));
        assert_eq!(validate(&JOB, &j), Ok(()));
        assert_eq!((j["spec"]["completions"].clone(), j["spec"]["parallelism"].clone(), j["spec"]["backoffLimit"].clone()),
            (json!(1), json!(1), json!(6)));
        assert_eq!(j["spec"]["completionMode"], "NonIndexed");
        assert_eq!(j["spec"]["selector"], json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}}));
        assert_eq!(j["spec"]["template"]["metadata"]["labels"]["job-name"], "pi");
        let queue = job(json!({"parallelism": 3, "template": template("Never")}));
        assert!(queue["spec"].get("completions").is_none(), "a work queue Job has no completions");
    }

    #[test]
    fn negative_completions_and_restart_always_name_their_fields() {
        let e = validate(&JOB, &job(json!({"completions": -1, "template": template("Always")}))).unwrap_err();
        assert_eq!(e.code(), 422);
        assert_eq!(fields(e), ["spec.completions", "spec.template.spec.restartPolicy"]);
        let e = validate(&JOB, &job(json!({"completionMode": "Indexed", "parallelism": 2, "template": template("Never")})));
        assert_eq!(fields(e.unwrap_err()), ["spec.completions"]);
    }

    #[test]
    fn a_pod_failure_policy_needs_restart_never_and_well_formed_rules() {
        let policy = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0, 3, 3]}}]});
        let e = validate(&JOB, &job(json!({"podFailurePolicy": policy, "template": template("OnFailure")}))).unwrap_err();
        assert_eq!(fields(e), ["spec.template.spec.restartPolicy", "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
            "spec.podFailurePolicy.rules[0].onExitCodes.values[2]"]);
    }

    #[test]
    fn job_features_not_implemented_are_refused_rather_than_ignored() {
        let j = job(json!({"completionMode": "Indexed", "completions": 3, "backoffLimitPerIndex": 1, "template": template("Never"),
            "podFailurePolicy": {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [2]}}]}}));
        assert_eq!(fields(validate(&JOB, &j).unwrap_err()), ["spec.backoffLimitPerIndex", "spec.podFailurePolicy.rules[0].action"]);
    }

    #[test]
    fn a_jobs_selector_and_template_are_immutable() {
        let old = job(json!({"template": template("Never")}));
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("alpine");
        new["spec"]["parallelism"] = json!(4);
        assert_eq!(fields(validate_update(&JOB, &old, &new).unwrap_err()), ["spec.template"]);
    }

    #[test]
    fn a_bad_schedule_or_time_zone_is_a_422_naming_the_field() {
        let mut cj = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
            "spec": {"schedule": "61 * * * *", "timeZone": "Nowhere/Atlantis",
                "jobTemplate": {"spec": {"template": template("OnFailure")}}}});
        apply_defaults(&CRONJOB, &mut cj);
        assert_eq!(cj["spec"]["concurrencyPolicy"], "Allow");
        let e = validate(&CRONJOB, &cj).unwrap_err();
        assert_eq!(e.code(), 422);
        assert!(e.to_string().contains("end of range (61) above maximum (59)"), "{e}");
        assert_eq!(fields(e), ["spec.schedule", "spec.timeZone"]);
        cj["spec"]["schedule"] = json!("@hourly");
        cj["spec"]["timeZone"] = json!("Europe/Paris");
        assert_eq!(validate(&CRONJOB, &cj), Ok(()));
    }
}
