//! Defaulting: fills in the fields Kubernetes fills in when a client leaves them out.
//!
//! Only absent (or null) fields are filled; a value the client sent is never replaced, so
//! defaulting twice changes nothing the second time.

use serde_json::{Map, Value, json};

use crate::kinds::ResourceInfo;

mod apps;
pub mod autoscaling;
pub mod batch;

/// A binding subject's `apiGroup`: RBAC's for users and groups, core for ServiceAccounts.
fn default_subjects(obj: &mut Value) {
    let Some(binding) = obj.as_object_mut() else { return };
    for subject in each_object(binding, "subjects") {
        let group = match subject.get("kind").and_then(Value::as_str) {
            Some("User" | "Group") => "rbac.authorization.k8s.io",
            Some("ServiceAccount") => "",
            _ => continue,
        };
        set_absent(subject, "apiGroup", json!(group));
    }
}

/// Fills the defaults of an object of kind `res` in place. Shapes it does not expect (a string
/// where an object belongs) are left alone for validation to report.
pub fn apply_defaults(res: &ResourceInfo, obj: &mut Value) {
    match res.kind {
        "Pod" => {
            // A mirror pod (a node's static pod) runs with no account, as Kubernetes' ServiceAccount
            // admission leaves it.
            let mirror = crate::pod::is_mirror(obj);
            if let Some(spec) = existing_spec(obj) {
                default_pod_spec(spec);
                // The ServiceAccount admission plugin's default, for pods only (not templates).
                if !mirror {
                    set_absent(spec, "serviceAccountName", json!("default"));
                }
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
            // Kubernetes serializes an empty ServiceStatus as `{loadBalancer: {}}`, and clients
            // (Helm's readiness checks, the Python client) read it without a null check.
            if let Some(status) = object_at(obj, &["status"]) {
                set_absent(status, "loadBalancer", json!({}));
            }
        }
        "Namespace" => {
            if let Some(status) = object_at(obj, &["status"]) {
                set_absent(status, "phase", json!("Active"));
            }
        }
        "Secret" => {
            if let Some(secret) = obj.as_object_mut() {
                set_absent(secret, "type", json!("Opaque"));
                fold_string_data(secret);
            }
        }
        "EndpointSlice" => {
            if let Some(slice) = obj.as_object_mut() {
                for port in each_object(slice, "ports") {
                    set_absent(port, "name", json!(""));
                    set_absent(port, "protocol", json!("TCP"));
                }
            }
        }
        "Job" => batch::default_job(obj),
        "CronJob" => batch::default_cron_job(obj),
        "DaemonSet" => apps::default_daemon_set(obj),
        "StatefulSet" => apps::default_stateful_set(obj),
        "ReplicationController" => apps::default_replication_controller(obj),
        "RoleBinding" | "ClusterRoleBinding" => default_subjects(obj),
        "HorizontalPodAutoscaler" => autoscaling::default_horizontal_pod_autoscaler(obj),
        _ => {}
    }
}

/// A Secret's `stringData` is write-only, as in Kubernetes: each entry replaces the `data` entry of
/// its key (base64-encoded) and the field itself is never stored. A non-string entry is left in
/// place for validation to refuse.
fn fold_string_data(secret: &mut Map<String, Value>) {
    use base64::Engine;
    let Some(Value::Object(strings)) = secret.get("stringData") else { return };
    if strings.values().any(|v| !v.is_string()) {
        return;
    }
    let encoded: Vec<(String, Value)> = strings
        .iter()
        .map(|(k, v)| (k.clone(), json!(base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or_default()))))
        .collect();
    secret.remove("stringData");
    if !secret.get("data").is_some_and(Value::is_object) {
        secret.insert("data".into(), json!({}));
    }
    if let Some(data) = secret.get_mut("data").and_then(Value::as_object_mut) {
        data.extend(encoded);
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
    crate::volume_validation::default_volumes(spec);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{DEPLOYMENT, NAMESPACE, NODE, POD, REPLICASET, SERVICE};
    use crate::validation::validate;

    fn seed_deployment() -> Value {
        json!({"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,
            "selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},
            "spec":{"containers":[{"name":"web","image":"minimal"}]}}}})
    }

    fn defaulted(res: &ResourceInfo, mut obj: Value) -> Value {
        apply_defaults(res, &mut obj);
        obj
    }

    #[test]
    fn the_seed_deployment_gets_what_kubernetes_would_fill_in() {
        let d = defaulted(&DEPLOYMENT, seed_deployment());
        assert_eq!(d["spec"]["replicas"], 3, "a sent value is kept");
        assert_eq!(d["spec"]["strategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}));
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
        assert!(d["spec"].get("minReadySeconds").is_none());
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["restartPolicy"], "Always");
        assert_eq!(pod["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["dnsPolicy"], "ClusterFirst");
        assert_eq!(pod["schedulerName"], "default-scheduler");
        let c = &pod["containers"][0];
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["imagePullPolicy"], "Always", "an untagged image means latest");
        assert_eq!(validate(&DEPLOYMENT, &d), Ok(()));
    }

    #[test]
    fn values_the_client_sent_are_never_overwritten_and_defaulting_twice_changes_nothing() {
        let mut d = seed_deployment();
        d["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}});
        d["spec"]["revisionHistoryLimit"] = json!(2);
        d["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
        d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(0);
        d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("Never");
        let once = defaulted(&DEPLOYMENT, d);
        assert_eq!(once["spec"]["strategy"]["rollingUpdate"], json!({"maxSurge": 0, "maxUnavailable": "25%"}));
        assert_eq!(once["spec"]["revisionHistoryLimit"], 2);
        assert_eq!(once["spec"]["template"]["spec"]["restartPolicy"], "OnFailure");
        assert_eq!(once["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 0);
        assert_eq!(once["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"], "Never");
        assert_eq!(defaulted(&DEPLOYMENT, once.clone()), once);
    }

    #[test]
    fn recreate_strategy_gets_no_rolling_update_parameters() {
        let mut d = seed_deployment();
        d["spec"]["strategy"] = json!({"type": "Recreate"});
        let d = defaulted(&DEPLOYMENT, d);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
        assert_eq!(validate(&DEPLOYMENT, &d), Ok(()));
    }

    #[test]
    fn image_pull_policy_follows_the_tag() {
        for (image, policy) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.27", "IfNotPresent"),
            ("registry.local:5000/app", "Always"),
            ("registry.local:5000/app:v2", "IfNotPresent"),
            ("nginx@sha256:0123abcd", "IfNotPresent"),
        ] {
            let p = defaulted(&POD, json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": image}]}}));
            assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], policy, "{image}");
        }
    }

    #[test]
    fn ports_and_probes_get_their_defaults() {
        let p = defaulted(&POD, json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "i:1",
            "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
            "readinessProbe": {"httpGet": {"port": 80}, "periodSeconds": 2},
            "livenessProbe": {"tcpSocket": {"port": 80}}}]}}));
        let c = &p["spec"]["containers"][0];
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(c["ports"][1]["protocol"], "UDP");
        assert_eq!(c["readinessProbe"], json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "periodSeconds": 2,
            "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}));
        assert_eq!(c["livenessProbe"]["periodSeconds"], 10);
        assert_eq!(validate(&POD, &p), Ok(()));
    }

    #[test]
    fn replica_sets_default_to_one_replica() {
        let mut rs = seed_deployment();
        rs["spec"].as_object_mut().map(|s| s.remove("replicas"));
        let rs = defaulted(&REPLICASET, rs);
        assert_eq!(rs["spec"]["replicas"], 1);
        assert!(rs["spec"].get("strategy").is_none(), "ReplicaSets have no strategy");
        assert_eq!(rs["spec"]["template"]["spec"]["restartPolicy"], "Always");
    }

    #[test]
    fn services_target_their_own_port_unless_told_otherwise() {
        let s = defaulted(&SERVICE, json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80}, {"name": "alt", "port": 81, "targetPort": "http"}]}}));
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert_eq!(s["spec"]["ports"][0], json!({"name": "http", "port": 80, "targetPort": 80, "protocol": "TCP"}));
        assert_eq!(s["spec"]["ports"][1]["targetPort"], "http");
        assert_eq!(s["status"], json!({"loadBalancer": {}}), "clients read status.loadBalancer unguarded");
    }

    #[test]
    fn namespaces_start_active_and_nodes_are_left_alone() {
        let ns = defaulted(&NAMESPACE, json!({"metadata": {"name": "team-a"}}));
        assert_eq!(ns, json!({"metadata": {"name": "team-a"}, "status": {"phase": "Active"}}));
        let terminating = json!({"metadata": {"name": "old"}, "status": {"phase": "Terminating"}});
        assert_eq!(defaulted(&NAMESPACE, terminating.clone()), terminating);
        let node = json!({"metadata": {"name": "n1"}, "spec": {}});
        assert_eq!(defaulted(&NODE, node.clone()), node);
    }

    #[test]
    fn a_shorthand_selector_is_left_for_validation_to_reject() {
        let mut d = seed_deployment();
        d["spec"]["selector"] = json!({"app": "web"});
        let d = defaulted(&DEPLOYMENT, d);
        assert_eq!(d["spec"]["selector"], json!({"app": "web"}));
        let err = validate(&DEPLOYMENT, &d).unwrap_err().to_string();
        assert!(err.contains("spec.selector.app: unknown field \"app\""), "{err}");
    }

    #[test]
    fn missing_or_malformed_specs_are_not_invented() {
        let p = defaulted(&POD, json!({"metadata": {"name": "p"}}));
        assert!(p.get("spec").is_none());
        let d = defaulted(&DEPLOYMENT, json!({"metadata": {"name": "d"}, "spec": {"template": "oops"}}));
        assert_eq!(d["spec"]["template"], "oops");
        let weird = defaulted(&POD, json!({"metadata": {"name": "p"}, "spec": {"containers": "web"}}));
        assert_eq!(weird["spec"]["containers"], "web");
    }
}
