//! Golden output of `get` (every table kind, `-o wide|yaml|json|name`, `-A`, `-l`) and
//! `describe`, against a real `shepherd server`.

mod common;

use common::{Shepherd, redact};
use serde_json::json;

/// One object of every kind the server serves, with status filled in where the table shows it.
fn populate(s: &Shepherd) {
    s.ok("POST", "/api/v1/namespaces", Some(json!({"metadata": {"name": "shop"}})));
    s.ok("POST", "/api/v1/nodes", Some(json!({"metadata": {"name": "node-1", "labels": {"node-role.kubernetes.io/control-plane": ""}}})));
    s.ok("PATCH", "/api/v1/nodes/node-1/status", Some(json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "AgentReady"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "nodeInfo": {"kubeletVersion": "v1.33.0-shepherd", "osImage": "Debian", "machineID": "", "systemUUID": "", "bootID": "",
            "kernelVersion": "", "containerRuntimeVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}})));
    s.ok("POST", "/apis/apps/v1/namespaces/default/deployments", Some(json!({"metadata": {"name": "web"}, "spec": {"replicas": 3,
        "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}})));
    s.ok("PATCH", "/apis/apps/v1/namespaces/default/deployments/web/status", Some(json!({"status": {"observedGeneration": 1,
        "replicas": 3, "updatedReplicas": 3, "readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": 1,
        "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                       {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]}})));
    s.ok("POST", "/apis/apps/v1/namespaces/default/replicasets", Some(json!({"metadata": {"name": "web-5d8f"}, "spec": {"replicas": 3,
        "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}})));
    s.ok("PATCH", "/apis/apps/v1/namespaces/default/replicasets/web-5d8f/status", Some(json!({"status": {"replicas": 3, "readyReplicas": 2}})));
    for (name, phase, ready) in [("web-0", "Running", true), ("web-1", "Running", true), ("web-2", "Pending", false)] {
        s.ok("POST", "/api/v1/namespaces/default/pods", Some(json!({"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "minimal"}]}})));
        if phase == "Running" {
            s.ok("POST", &format!("/api/v1/namespaces/default/pods/{name}/binding"), Some(json!({"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name}, "target": {"kind": "Node", "name": "node-1"}})));
            s.ok("PATCH", &format!("/api/v1/namespaces/default/pods/{name}/status"), Some(json!({"status": {"phase": phase,
                "podIP": format!("10.1.0.{}", &name[4..]), "hostIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": "web", "image": "minimal", "imageID": "", "ready": ready, "restartCount": 1,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}})));
        }
    }
    s.ok("POST", "/api/v1/namespaces/shop/pods", Some(json!({"metadata": {"name": "cart-0"}, "spec": {"containers": [{"name": "cart", "image": "minimal"}]}})));
    s.ok("POST", "/api/v1/namespaces/default/services", Some(json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"},
        "ports": [{"port": 80, "targetPort": 8080}]}})));
    s.ok("POST", "/api/v1/namespaces/default/endpoints", Some(json!({"metadata": {"name": "web"}, "subsets": [{"addresses":
        [{"ip": "10.1.0.0"}, {"ip": "10.1.0.1"}], "ports": [{"port": 8080}]}]})));
    s.ok("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", Some(json!({"metadata": {"name": "node-1"},
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40}})));
    event(s, "web-0.1", "Pod", "web-0", "Scheduled", "Successfully assigned default/web-0 to node-1", "default-scheduler");
    event(s, "web.1", "Deployment", "web", "ScalingReplicaSet", "Scaled up replica set web-5d8f from 0 to 3", "deployment-controller");
}

fn event(s: &Shepherd, name: &str, kind: &str, object: &str, reason: &str, message: &str, from: &str) {
    let api_version = if kind == "Deployment" { "apps/v1" } else { "v1" };
    let uid = s.ok("GET", &format!("{}/namespaces/default/{}/{object}", if kind == "Deployment" { "/apis/apps/v1" } else { "/api/v1" },
        if kind == "Deployment" { "deployments" } else { "pods" }), None)["metadata"]["uid"].clone();
    s.ok("POST", "/api/v1/namespaces/default/events", Some(json!({"metadata": {"name": name},
        "involvedObject": {"kind": kind, "apiVersion": api_version, "name": object, "namespace": "default", "uid": uid},
        "reason": reason, "message": message, "type": "Normal", "source": {"component": from}, "count": 1})));
}

#[test]
fn every_table_kind_prints_kubectl_columns() {
    let s = Shepherd::server();
    populate(&s);
    let mut all = String::new();
    for kind in ["pods", "deploy", "rs", "nodes", "svc", "ep", "ns", "ev", "leases -n kube-node-lease"] {
        let args: Vec<&str> = std::iter::once("get").chain(kind.split(' ')).collect();
        let out = s.sheepctl(&args);
        all.push_str(&format!("$ sheepctl {}\n{}", args.join(" "), out.ok()));
    }
    insta::assert_snapshot!(redact(&all));
}

#[test]
fn wide_all_namespaces_and_selectors() {
    let s = Shepherd::server();
    populate(&s);
    let mut all = String::new();
    for args in [&["get", "pods", "-o", "wide"][..], &["get", "deploy", "-o", "wide"], &["get", "pods", "-A"], &["get", "po", "-l", "app=web", "-A"],
        &["get", "pods", "--field-selector", "status.phase=Pending"], &["get", "pods", "web-0", "web-1"], &["get", "pod/web-2"],
        &["get", "nodes", "-o", "wide"], &["nodes"], &["events"]] {
        all.push_str(&format!("$ sheepctl {}\n{}", args.join(" "), s.sheepctl(args).ok()));
    }
    insta::assert_snapshot!(redact(&all));
}

#[test]
fn output_name_json_and_yaml() {
    let s = Shepherd::server();
    populate(&s);
    insta::assert_snapshot!("name", redact(s.sheepctl(&["get", "pods", "-o", "name"]).ok()));
    insta::assert_snapshot!("deploy_json", redact(s.sheepctl(&["get", "deploy", "web", "-o", "json"]).ok()));
    insta::assert_snapshot!("deploy_yaml", redact(s.sheepctl(&["get", "deployment", "web", "-o", "yaml"]).ok()));
    insta::assert_snapshot!("ns_list_yaml", redact(s.sheepctl(&["get", "pods", "-n", "shop", "-o", "yaml"]).ok()));
    let list: serde_json::Value = serde_json::from_str(s.sheepctl(&["get", "pods", "-o", "json"]).ok()).expect("JSON list");
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3));
    assert_eq!(list["items"][0]["kind"], "Pod");
}

#[test]
fn empty_lists_say_so_on_stderr() {
    let s = Shepherd::server();
    let out = s.sheepctl(&["get", "pods"]);
    assert_eq!(out.code, 0);
    assert_eq!(out.stdout, "");
    assert_eq!(out.stderr, "No resources found in default namespace.\n");
}

#[test]
fn describe_pod_and_deployment_with_their_events() {
    let s = Shepherd::server();
    populate(&s);
    insta::assert_snapshot!("describe_pod", redact(s.sheepctl(&["describe", "pod", "web-0"]).ok()));
    insta::assert_snapshot!("describe_deployment", redact(s.sheepctl(&["describe", "deploy/web"]).ok()));
    insta::assert_snapshot!("describe_service", redact(s.sheepctl(&["describe", "svc", "web"]).ok()));
}

#[test]
fn jobs_and_cronjobs_print_kubectl_columns_and_describe() {
    let s = Shepherd::server();
    let template = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "pi", "image": "busybox", "command": ["sh", "-c", "echo 3.14"]}]}});
    s.ok("POST", "/apis/batch/v1/namespaces/default/jobs", Some(json!({"metadata": {"name": "pi"},
        "spec": {"completions": 5, "parallelism": 2, "completionMode": "Indexed", "template": template}})));
    s.ok("PATCH", "/apis/batch/v1/namespaces/default/jobs/pi/status", Some(json!({"status": {"active": 0, "ready": 0,
        "succeeded": 5, "failed": 1, "completedIndexes": "0-4", "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:05Z",
        "conditions": [{"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached"},
                       {"type": "Complete", "status": "True"}]}})));
    s.ok("POST", "/apis/batch/v1/namespaces/default/jobs", Some(json!({"metadata": {"name": "queue"},
        "spec": {"parallelism": 3, "template": template}})));
    s.ok("POST", "/apis/batch/v1/namespaces/default/cronjobs", Some(json!({"metadata": {"name": "tick"},
        "spec": {"schedule": "*/5 * * * *", "timeZone": "Europe/Paris", "jobTemplate": {"spec": {"template": template}}}})));
    let mut all = String::new();
    for args in [&["get", "jobs"][..], &["get", "jobs", "-o", "wide"], &["get", "cj"], &["describe", "job", "pi"], &["describe", "cronjob/tick"]] {
        all.push_str(&format!("$ sheepctl {}\n{}", args.join(" "), s.sheepctl(args).ok()));
    }
    insta::assert_snapshot!(redact(&all));
}

#[test]
fn daemon_sets_and_stateful_sets_print_kubectl_columns_and_describe() {
    let s = Shepherd::server();
    let template = |app: &str| json!({"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    s.ok("POST", "/apis/apps/v1/namespaces/default/daemonsets", Some(json!({"metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent")}})));
    s.ok("PATCH", "/apis/apps/v1/namespaces/default/daemonsets/agent/status", Some(json!({"status": {"desiredNumberScheduled": 3,
        "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2, "numberMisscheduled": 0}})));
    s.ok("POST", "/apis/apps/v1/namespaces/default/statefulsets", Some(json!({"metadata": {"name": "web"},
        "spec": {"replicas": 3, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}}, "template": template("web")}})));
    s.ok("PATCH", "/apis/apps/v1/namespaces/default/statefulsets/web/status", Some(json!({"status": {"replicas": 3,
        "readyReplicas": 2, "currentRevision": "web-abc", "updateRevision": "web-abc"}})));
    let mut all = String::new();
    for args in [&["get", "ds"][..], &["get", "ds", "-o", "wide"], &["get", "sts"], &["get", "sts", "-o", "wide"],
        &["describe", "ds", "agent"], &["describe", "sts/web"]] {
        all.push_str(&format!("$ sheepctl {}\n{}", args.join(" "), s.sheepctl(args).ok()));
    }
    insta::assert_snapshot!(redact(&all));
}
