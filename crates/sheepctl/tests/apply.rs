//! `apply`: created / unchanged / configured, multi-document YAML and JSON `List`s, and
//! agreement with kubectl on what gets stored.

mod common;

use common::Shepherd;
use serde_json::{Value, json};

const SEED: &str = r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#;

#[test]
fn seed_shorthand_from_stdin_is_created_then_unchanged() {
    let s = Shepherd::server();
    assert_eq!(s.sheepctl_stdin(&["apply", "-f", "-"], SEED).ok(), "deployment.apps/web created\n");
    let d = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None);
    assert_eq!(d["spec"]["selector"], json!({"matchLabels": {"app": "web"}}));
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(s.sheepctl_stdin(&["apply", "-f", "-"], SEED).ok(), "deployment.apps/web unchanged\n");
    let after = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None);
    assert_eq!(after["metadata"]["resourceVersion"], d["metadata"]["resourceVersion"], "an unchanged apply writes nothing");
}

const MULTI: &str = "apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: cart
  namespace: shop
  labels:
    tier: back
    team: carts
spec:
  replicas: 2
  selector:
    matchLabels: {app: cart}
  template:
    metadata:
      labels: {app: cart}
    spec:
      containers:
      - name: cart
        image: cart:v1
        env:
        - {name: MODE, value: fast}
---
apiVersion: v1
kind: Service
metadata:
  name: cart
  namespace: shop
spec:
  selector: {app: cart}
  ports:
  - port: 80
    targetPort: 8080
";

#[test]
fn multi_document_yaml_then_an_edit_changes_only_what_changed() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("shop.yaml");
    let path = file.to_str().expect("path");
    std::fs::write(&file, MULTI).expect("write");
    assert_eq!(s.sheepctl(&["apply", "-f", path]).ok(), "namespace/shop created\ndeployment.apps/cart created\nservice/cart created\n");
    assert_eq!(s.sheepctl(&["apply", "-f", path]).ok(), "namespace/shop unchanged\ndeployment.apps/cart unchanged\nservice/cart unchanged\n");

    // Someone else changes a field the file does not mention; the next apply keeps it.
    s.ok("PATCH", "/apis/apps/v1/namespaces/shop/deployments/cart", Some(json!({"metadata": {"labels": {"owner": "ops"}}})));
    let edited = MULTI.replace("replicas: 2", "replicas: 4").replace("    team: carts\n", "").replace("image: cart:v1", "image: cart:v2");
    std::fs::write(&file, edited).expect("write");
    assert_eq!(s.sheepctl(&["apply", "-f", path]).ok(), "namespace/shop unchanged\ndeployment.apps/cart configured\nservice/cart unchanged\n");
    let d = s.ok("GET", "/apis/apps/v1/namespaces/shop/deployments/cart", None);
    assert_eq!(d["spec"]["replicas"], 4);
    assert_eq!(d["metadata"]["labels"], json!({"tier": "back", "owner": "ops"}), "removed label gone, foreign label kept");
    let container = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "cart:v2");
    assert_eq!(container["env"], json!([{"name": "MODE", "value": "fast"}]));
    assert_eq!(s.sheepctl(&["apply", "-f", path]).ok(), "namespace/shop unchanged\ndeployment.apps/cart unchanged\nservice/cart unchanged\n");
}

#[test]
fn json_list_and_directories_apply_every_item() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}]});
    std::fs::write(dir.path().join("1-list.json"), list.to_string()).expect("write");
    std::fs::write(dir.path().join("2-pod.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec:\n  containers: [{name: c, image: minimal}]\n").expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a manifest").expect("write");
    let out = s.sheepctl(&["apply", "-f", dir.path().to_str().expect("path")]);
    assert_eq!(out.ok(), "namespace/a created\nnamespace/b created\npod/p created\n");
    s.ok("GET", "/api/v1/namespaces/a/pods/p", None);
}

/// What a spec looks like once stored, minus what differs between any two objects.
fn stored(s: &Shepherd, ns: &str) -> Value {
    let mut d = s.ok("GET", &format!("/apis/apps/v1/namespaces/{ns}/deployments/cart"), None);
    let annotation = d["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].as_str().map(|a| {
        let mut v: Value = serde_json::from_str(a).expect("last-applied is JSON");
        v["metadata"]["namespace"] = json!("X");
        v
    });
    d["metadata"] = json!({"labels": d["metadata"]["labels"].clone(), "generation": d["metadata"]["generation"].clone()});
    json!({"object": d, "lastApplied": annotation})
}

#[test]
fn kubectl_and_sheepctl_store_the_same_spec_and_apply_over_each_other() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let docs: Vec<&str> = MULTI.split("---\n").collect();
    for ns in ["by-kubectl", "by-sheepctl"] {
        s.ok("POST", "/api/v1/namespaces", Some(json!({"metadata": {"name": ns}})));
        std::fs::write(dir.path().join(format!("{ns}.yaml")), docs[1].replace("namespace: shop", &format!("namespace: {ns}"))).expect("write");
    }
    let kubectl = std::process::Command::new("kubectl")
        .args(["--server", &s.url, "apply", "--validate=false", "-f"])
        .arg(dir.path().join("by-kubectl.yaml"))
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("kubectl is installed");
    assert!(kubectl.status.success(), "kubectl apply failed: {}", String::from_utf8_lossy(&kubectl.stderr));
    let file = dir.path().join("by-sheepctl.yaml");
    s.sheepctl(&["apply", "-f", file.to_str().expect("path")]).ok();
    let (by_kubectl, by_sheepctl) = (stored(&s, "by-kubectl"), stored(&s, "by-sheepctl"));
    assert_eq!(by_kubectl["object"], by_sheepctl["object"]);
    assert_eq!(by_kubectl["lastApplied"], by_sheepctl["lastApplied"]);
    // sheepctl reads kubectl's last-applied annotation: applying the same file changes nothing.
    let same = dir.path().join("by-kubectl.yaml");
    assert_eq!(s.sheepctl(&["apply", "-f", same.to_str().expect("path")]).ok(), "deployment.apps/cart unchanged\n");
}

#[test]
fn server_side_apply_owns_fields_conflicts_with_another_manager_and_takes_them_when_forced() {
    let s = Shepherd::server();
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    let run = s.sheepctl_stdin(&["apply", "--server-side", "-f", "-"], SEED);
    assert_eq!(run.ok(), "deployment.apps/web serverside-applied\n");
    let d = s.ok("GET", path, None);
    let entry = &d["metadata"]["managedFields"][0];
    assert_eq!((entry["manager"].as_str(), entry["operation"].as_str()), (Some("kubectl"), Some("Apply")), "{d}");
    assert!(entry["fieldsV1"]["f:spec"]["f:replicas"].is_object());

    // Another manager takes spec.replicas; applying 3 again conflicts, naming it and the field.
    s.ok("PATCH", &format!("{path}?fieldManager=autoscaler"), Some(json!({"spec": {"replicas": 7}})));
    let run = s.sheepctl_stdin(&["apply", "--server-side", "-f", "-"], SEED);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("conflict with \"autoscaler\" using apps/v1: .spec.replicas"), "{}", run.stderr);
    assert!(run.stderr.contains("--force-conflicts"), "{}", run.stderr);
    assert_eq!(s.ok("GET", path, None)["spec"]["replicas"], 7);

    let run = s.sheepctl_stdin(&["apply", "--server-side", "--force-conflicts", "--field-manager", "deployer", "-f", "-"], SEED);
    assert_eq!(run.ok(), "deployment.apps/web serverside-applied\n");
    let d = s.ok("GET", path, None);
    assert_eq!(d["spec"]["replicas"], 3);
    let managers: Vec<&str> =
        d["metadata"]["managedFields"].as_array().into_iter().flatten().filter_map(|e| e["manager"].as_str()).collect();
    assert!(managers.contains(&"deployer"), "{managers:?}");
    let yaml = s.sheepctl(&["get", "deploy", "web", "-o", "yaml"]);
    assert!(!yaml.ok().contains("managedFields"), "printed as kubectl prints it, without managedFields");
}

#[test]
fn client_side_apply_records_kubectls_client_side_manager() {
    let s = Shepherd::server();
    s.sheepctl_stdin(&["apply", "-f", "-"], SEED).ok();
    let d = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None);
    assert_eq!(d["metadata"]["managedFields"][0]["manager"], "kubectl-client-side-apply", "{d}");
}
