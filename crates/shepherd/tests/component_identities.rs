//! The controllers and the scheduler inside `shepherd standalone` act as `system:kube-controller-manager`
//! and `system:kube-scheduler`, held to their roles like any client: take a binding away and that
//! component is refused (and says so); give it back and the cluster converges. Each records its
//! writes under its own field manager.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

const BINDINGS: &str = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings";

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> Option<Value>) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get(http: &reqwest::Client, url: &str) -> Value {
    http.get(url).send().await.expect("get").json().await.expect("json")
}

#[tokio::test]
async fn in_process_controllers_and_scheduler_are_held_to_their_own_roles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start("standalone", dir.path(), &[]);
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", d.url);

    // The controllers are up once a Deployment gets its ReplicaSet: their informers have listed
    // everything, so what follows is refused to their reconciles, not to their first lists.
    let deployment = |name: &str, replicas: u32| json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": "busybox", "command": ["sleep", "3600"]}]}}}});
    let replica_sets = |app: &str| url(&format!("/apis/apps/v1/namespaces/default/replicasets?labelSelector=app%3D{app}"));
    let r = http.post(url("/apis/apps/v1/namespaces/default/deployments")).json(&deployment("probe", 0)).send().await.expect("create");
    assert_eq!(r.status(), 201);
    wait_for("the probe Deployment's ReplicaSet", async || {
        let rs = get(&http, &replica_sets("probe")).await;
        rs["items"].as_array().filter(|items| !items.is_empty()).map(|_| rs.clone())
    })
    .await;

    // Without its binding the controller manager may not create ReplicaSets.
    let binding = get(&http, &url(&format!("{BINDINGS}/system:kube-controller-manager"))).await;
    assert_eq!(binding["subjects"][0]["name"], "system:kube-controller-manager", "{binding}");
    let r = http.delete(url(&format!("{BINDINGS}/system:kube-controller-manager"))).send().await.expect("unbind");
    assert!(r.status().is_success(), "{}", r.status());
    let r = http.post(url("/apis/apps/v1/namespaces/default/deployments")).json(&deployment("web", 1)).send().await.expect("create");
    assert_eq!(r.status(), 201);
    let refusal = wait_for("the deployment controller's refusal", async || {
        let view = get(&http, &url("/debug/controllers")).await;
        let deployment = view["controllers"].as_array()?.iter().find(|c| c["name"] == "deployment")?.clone();
        let text = deployment.to_string();
        text.contains("system:kube-controller-manager").then_some(deployment)
    })
    .await;
    assert!(refusal.to_string().contains("cannot create resource \\\"replicasets\\\""), "{refusal}");
    let rs = get(&http, &replica_sets("web")).await;
    assert_eq!(rs["items"], json!([]), "a ReplicaSet was made without the role");

    // The binding back (as the server writes it at start): the Deployment converges. The
    // scheduler, unbound meanwhile, leaves the pod Pending until its own binding returns.
    let r = http.delete(url(&format!("{BINDINGS}/system:kube-scheduler"))).send().await.expect("unbind scheduler");
    assert!(r.status().is_success(), "{}", r.status());
    let mut restored = binding.clone();
    for field in ["resourceVersion", "uid", "creationTimestamp", "managedFields"] {
        restored["metadata"].as_object_mut().expect("metadata").remove(field);
    }
    let r = http.post(url(BINDINGS)).json(&restored).send().await.expect("rebind");
    assert_eq!(r.status(), 201);
    let pending = wait_for("a pod of the Deployment", async || {
        let pods = get(&http, &url("/api/v1/namespaces/default/pods?labelSelector=app%3Dweb")).await;
        pods["items"].as_array()?.first().cloned()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let name = pending["metadata"]["name"].as_str().expect("name").to_string();
    let pod = get(&http, &url(&format!("/api/v1/namespaces/default/pods/{name}"))).await;
    assert!(pod["spec"]["nodeName"].is_null(), "scheduled without the scheduler's role: {pod}");
    let scheduler = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:kube-scheduler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kube-scheduler"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:kube-scheduler"}]});
    let r = http.post(url(BINDINGS)).json(&scheduler).send().await.expect("rebind scheduler");
    assert_eq!(r.status(), 201);
    let running = wait_for("the pod to run", async || {
        let pod = get(&http, &url(&format!("/api/v1/namespaces/default/pods/{name}"))).await;
        (pod["status"]["phase"] == "Running").then_some(pod)
    })
    .await;

    // Each component's writes are recorded under its own field manager.
    let entries = running["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    let mut managers: Vec<(String, String)> = entries
        .iter()
        .map(|e| (e["manager"].as_str().unwrap_or("").into(), e["subresource"].as_str().unwrap_or("").into()))
        .collect();
    managers.sort();
    let expected = [("shepherd-agent", "status"), ("shepherd-controller-manager", ""), ("shepherd-scheduler", "binding")];
    assert_eq!(managers, expected.map(|(m, s)| (m.to_string(), s.to_string())), "{running}");
}
