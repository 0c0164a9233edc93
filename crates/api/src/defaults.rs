//! Defaulting: fills in the fields Kubernetes fills in when a client leaves them out.
//!
//! Only absent (or null) fields are filled; a value the client sent is never replaced, so
//! defaulting twice changes nothing the second time.

use serde_json::{Map, Value, json};

use crate::kinds::ResourceInfo;

/// Fills the defaults of an object of kind `res` in place. Shapes it does not expect (a string
/// where an object belongs) are left alone for validation to report.
pub fn apply_defaults(res: &ResourceInfo, obj: &mut Value) {
    match res.kind {
        "Pod" => {
            if let Some(spec) = existing_spec(obj) {
                default_pod_spec(spec);
            }
        }
        "Deployment" => {
            if let Some(spec) = existing_spec(obj) {
                default_deployment_spec(spec);
            }
            default_template(obj);
        }
        "ReplicaSet" => {
            if let Some(spec) = existing_spec(obj) {
                set_absent(spec, "replicas", json!(1));
            }
            default_template(obj);
        }
        "Service" => {
            if let Some(spec) = existing_spec(obj) {
                default_service_spec(spec);
            }
        }
        "Namespace" => {
            if let Some(status) = object_at(obj, &["status"]) {
                set_absent(status, "phase", json!("Active"));
            }
        }
        _ => {}
    }
}

/// `spec`, when the client sent one as an object; a missing spec is for validation to report.
fn existing_spec(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    obj.get_mut("spec").and_then(Value::as_object_mut)
}

/// The object at `path`, created as `{}` along the way only where the key is absent or null,
/// and only if every parent is an object.
fn object_at<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut cur = v;
    for key in path {
        let map = cur.as_object_mut()?;
        let slot = map.entry(key.to_string()).or_insert(Value::Null);
        if slot.is_null() {
            *slot = json!({});
        }
        cur = slot;
    }
    cur.as_object_mut()
}

fn set_absent(map: &mut Map<String, Value>, key: &str, value: Value) {
    let slot = map.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = value;
    }
}

fn each_object<'a>(map: &'a mut Map<String, Value>, key: &str) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    map.get_mut(key).and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut)
}

fn default_template(obj: &mut Value) {
    // Only when a template was sent: a missing template is a validation error, not a default.
    let Some(template) = obj.pointer_mut("/spec/template").filter(|t| t.is_object()) else { return };
    if let Some(spec) = object_at(template, &["spec"]) {
        default_pod_spec(spec);
    }
}

fn default_pod_spec(spec: &mut Map<String, Value>) {
    set_absent(spec, "restartPolicy", json!("Always"));
    set_absent(spec, "terminationGracePeriodSeconds", json!(30));
    set_absent(spec, "dnsPolicy", json!("ClusterFirst"));
    set_absent(spec, "schedulerName", json!("default-scheduler"));
    for container in each_object(spec, "containers") {
        default_container(container);
    }
}

fn default_container(ct: &mut Map<String, Value>) {
    set_absent(ct, "terminationMessagePath", json!("/dev/termination-log"));
    set_absent(ct, "terminationMessagePolicy", json!("File"));
    let pull = match ct.get("image").and_then(Value::as_str) {
        Some(image) if !uses_latest_tag(image) => "IfNotPresent",
        _ => "Always",
    };
    set_absent(ct, "imagePullPolicy", json!(pull));
    for port in each_object(ct, "ports") {
        set_absent(port, "protocol", json!("TCP"));
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(Value::Object(p)) = ct.get_mut(probe) {
            default_probe(p);
        }
    }
}

/// `nginx` and `nginx:latest` float; `nginx:1.27` and digests are pinned. A registry port
/// (`host:5000/app`) is not a tag.
fn uses_latest_tag(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}

fn default_probe(p: &mut Map<String, Value>) {
    set_absent(p, "periodSeconds", json!(10));
    set_absent(p, "timeoutSeconds", json!(1));
    set_absent(p, "successThreshold", json!(1));
    set_absent(p, "failureThreshold", json!(3));
    if let Some(Value::Object(http)) = p.get_mut("httpGet") {
        set_absent(http, "path", json!("/"));
        set_absent(http, "scheme", json!("HTTP"));
    }
}

fn default_deployment_spec(spec: &mut Map<String, Value>) {
    set_absent(spec, "replicas", json!(1));
    set_absent(spec, "revisionHistoryLimit", json!(10));
    set_absent(spec, "progressDeadlineSeconds", json!(600));
    let strategy = spec.entry("strategy").or_insert(Value::Null);
    if strategy.is_null() {
        *strategy = json!({});
    }
    let Value::Object(strategy) = strategy else { return };
    set_absent(strategy, "type", json!("RollingUpdate"));
    if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        let rolling = strategy.entry("rollingUpdate").or_insert(Value::Null);
        if rolling.is_null() {
            *rolling = json!({});
        }
        if let Value::Object(rolling) = rolling {
            set_absent(rolling, "maxSurge", json!("25%"));
            set_absent(rolling, "maxUnavailable", json!("25%"));
        }
    }
}

fn default_service_spec(spec: &mut Map<String, Value>) {
    set_absent(spec, "type", json!("ClusterIP"));
    set_absent(spec, "sessionAffinity", json!("None"));
    for port in each_object(spec, "ports") {
        set_absent(port, "protocol", json!("TCP"));
        if let Some(p) = port.get("port").filter(|p| p.is_number()).cloned() {
            set_absent(port, "targetPort", p);
        }
    }
}
