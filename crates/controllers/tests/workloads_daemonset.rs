//! DaemonSets on the real API server with simulated nodes: one pod per eligible node, a joining
//! node served within a second, taints and tolerations, and updates rolled node by node.

mod workloads_support;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::{meta, opt_str_at, pod};
use shepherd_controllers::daemonset::daemonset_controller;
use futures::StreamExt;
use shepherd_runtime::{Client, DeleteParams, ListParams, Manager, Patch, WatchEvent};
use workloads_support::*;

/// The DaemonSet controller, and a kubelet that finishes every pod deletion after half a second
/// (daemon pods are bound, so their deletion waits for their node).
fn daemonset_controller_only(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    manager.add(daemonset_controller(client.clone(), &manager, &config()).shutdown_grace(Duration::from_millis(100)));
    let kubelet = client.clone();
    tokio::spawn(async move {
        let Ok(mut events) = kubelet.watch(&kinds::POD, &ListParams::default(), 0).await else { return };
        while let Some(Ok(event)) = events.next().await {
            let WatchEvent::Modified(pod) = event else { continue };
            if !meta::is_deleting(&pod) {
                continue;
            }
            let (client, name, uid) = (kubelet.clone(), meta::name(&pod).to_string(), meta::uid(&pod).to_string());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let now = DeleteParams { grace_period_seconds: Some(0), precondition_uid: Some(uid), ..Default::default() };
                let _ = client.delete(&kinds::POD, Some("default"), &name, &now).await;
            });
        }
    });
    manager.spawn()
}

async fn node(client: &Arc<dyn Client>, name: &str, taints: Value) {
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
    client.create(&kinds::NODE, None, node).await.expect("node created");
}

fn daemon_set(name: &str, image: &str, strategy: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "updateStrategy": strategy,
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": image}]}}}})
}

/// Active pods by node.
async fn pods_by_node(client: &Arc<dyn Client>) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for p in pods(client).await.into_iter().filter(pod::is_active) {
        out.entry(opt_str_at(&p, "/spec/nodeName").unwrap_or("").to_string()).or_default().push(p);
    }
    out
}

fn image(pod: &Value) -> &str {
    opt_str_at(pod, "/spec/containers/0/image").unwrap_or("")
}

async fn set_image(client: &Arc<dyn Client>, name: &str, image: &str) {
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": image}]}}}});
    client.patch(&kinds::DAEMONSET, Some("default"), name, Patch::Merge(patch)).await.expect("template changed");
}

async fn status(client: &Arc<dyn Client>, name: &str) -> Value {
    get(client, &kinds::DAEMONSET, name).await.map(|d| d["status"].clone()).unwrap_or(Value::Null)
}

#[tokio::test(start_paused = true)]
async fn a_daemon_set_runs_one_pod_per_node_skips_a_tainted_node_and_serves_a_joining_node_within_a_second() {
    let client = api().await;
    for n in ["n1", "n2", "n3"] {
        node(&client, n, json!([])).await;
    }
    node(&client, "gpu", json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])).await;
    let controllers = daemonset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_millis(200));
    client.create(&kinds::DAEMONSET, Some("default"), daemon_set("agent", "agent:1", Value::Null)).await.unwrap();

    let three = wait_until(Duration::from_secs(10), || async {
        let by_node = pods_by_node(&client).await;
        by_node.values().map(Vec::len).sum::<usize>() == 3 && status(&client, "agent").await["numberReady"] == 3
    })
    .await;
    let by_node = pods_by_node(&client).await;
    assert!(three.is_some(), "not one pod on each of three nodes: {:?}", by_node.keys().collect::<Vec<_>>());
    assert_eq!(by_node.keys().collect::<Vec<_>>(), ["n1", "n2", "n3"]);
    let pod = &by_node["n1"][0];
    let tolerated: Vec<&str> = pod["spec"]["tolerations"].as_array().unwrap().iter().filter_map(|t| t["key"].as_str()).collect();
    assert!(tolerated.contains(&"node.kubernetes.io/not-ready") && tolerated.contains(&"node.kubernetes.io/unreachable"), "{tolerated:?}");

    node(&client, "n4", json!([])).await;
    let joined = wait_until(Duration::from_secs(5), || async { pods_by_node(&client).await.contains_key("n4") }).await;
    assert!(joined.is_some_and(|t| t < Duration::from_secs(1)), "the joining node got its pod after {joined:?}");
    let settled = wait_until(Duration::from_secs(5), || async {
        let s = status(&client, "agent").await;
        s["desiredNumberScheduled"] == 4 && s["numberAvailable"] == 4
    })
    .await;
    let s = status(&client, "agent").await;
    assert!(settled.is_some(), "{s}");
    assert_eq!((s["currentNumberScheduled"].as_i64(), s["numberMisscheduled"].as_i64()), (Some(4), Some(0)), "{s}");
    assert_eq!(s["observedGeneration"], 1);
    assert!(!pods_by_node(&client).await.contains_key("gpu"), "the tainted node got a pod it does not tolerate");
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_tolerated_taint_gets_a_pod_and_an_untolerated_no_execute_taint_removes_it() {
    let client = api().await;
    node(&client, "n1", json!([])).await;
    node(&client, "gpu", json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])).await;
    let controllers = daemonset_controller_only(&client);
    let mut ds = daemon_set("agent", "agent:1", Value::Null);
    ds["spec"]["template"]["spec"]["tolerations"] = json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]);
    client.create(&kinds::DAEMONSET, Some("default"), ds).await.unwrap();
    let both = wait_until(Duration::from_secs(5), || async { pods_by_node(&client).await.len() == 2 }).await;
    assert!(both.is_some(), "{:?}", pods_by_node(&client).await.keys().collect::<Vec<_>>());

    let evict = json!({"spec": {"taints": [{"key": "drain", "effect": "NoExecute"}]}});
    client.patch(&kinds::NODE, None, "n1", Patch::Merge(evict)).await.unwrap();
    let left = wait_until(Duration::from_secs(5), || async { !pods_by_node(&client).await.contains_key("n1") }).await;
    assert!(left.is_some(), "the pod stayed on a node whose NoExecute taint it does not tolerate");
    let s = status(&client, "agent").await;
    assert_eq!(s["desiredNumberScheduled"], 1, "{s}");
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_update_rolls_one_node_at_a_time() {
    let client = api().await;
    for n in ["n1", "n2", "n3"] {
        node(&client, n, json!([])).await;
    }
    let controllers = daemonset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(2));
    client.create(&kinds::DAEMONSET, Some("default"), daemon_set("agent", "agent:1", Value::Null)).await.unwrap();
    let ready = wait_until(Duration::from_secs(10), || async { status(&client, "agent").await["numberAvailable"] == 3 }).await;
    assert!(ready.is_some(), "{}", status(&client, "agent").await);

    set_image(&client, "agent", "agent:2").await;
    let (fewest_ready, most_replaced_at_once, overlapped) = (Cell::new(3), Cell::new(0), Cell::new(false));
    let done = wait_until(Duration::from_secs(60), || async {
        let all = pods(&client).await;
        let on = |p: &Value, n: &str| opt_str_at(p, "/spec/nodeName") == Some(n);
        let leaving: Vec<&str> = all.iter().filter(|p| meta::is_deleting(p)).filter_map(|p| opt_str_at(p, "/spec/nodeName")).collect();
        overlapped.set(overlapped.get() || leaving.iter().any(|n| all.iter().any(|p| on(p, n) && pod::is_active(p))));
        let by_node = pods_by_node(&client).await;
        let ready = by_node.values().filter(|ps| ps.iter().any(pod::is_ready)).count();
        let replacing = by_node.values().filter(|ps| ps.iter().all(|p| image(p) == "agent:2" && !pod::is_ready(p))).count()
            + (3 - by_node.len());
        fewest_ready.set(fewest_ready.get().min(ready));
        most_replaced_at_once.set(most_replaced_at_once.get().max(replacing));
        let all_new = by_node.len() == 3 && by_node.values().all(|ps| ps.len() == 1 && image(&ps[0]) == "agent:2" && pod::is_ready(&ps[0]));
        all_new && status(&client, "agent").await["updatedNumberScheduled"] == 3
    })
    .await;
    assert!(done.is_some(), "the update did not finish: {}", status(&client, "agent").await);
    assert_eq!(fewest_ready.get(), 2, "more than one node was without a ready pod at once (or none ever was)");
    assert_eq!(most_replaced_at_once.get(), 1);
    assert!(!overlapped.get(), "a replacement started while the old pod on its node was still terminating");
    // Each node waited for the previous one: three starts of two seconds in sequence.
    assert!(done.is_some_and(|t| t >= Duration::from_secs(6)), "finished in {done:?}");
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_surge_update_starts_the_new_pod_before_the_old_one_goes() {
    let client = api().await;
    for n in ["n1", "n2"] {
        node(&client, n, json!([])).await;
    }
    let controllers = daemonset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    let strategy = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}});
    client.create(&kinds::DAEMONSET, Some("default"), daemon_set("agent", "agent:1", strategy)).await.unwrap();
    assert!(wait_until(Duration::from_secs(10), || async { status(&client, "agent").await["numberAvailable"] == 2 }).await.is_some());

    set_image(&client, "agent", "agent:2").await;
    let (fewest_ready, saw_two_on_a_node) = (Cell::new(2), Cell::new(false));
    let done = wait_until(Duration::from_secs(30), || async {
        let by_node = pods_by_node(&client).await;
        fewest_ready.set(fewest_ready.get().min(by_node.values().filter(|ps| ps.iter().any(pod::is_ready)).count()));
        saw_two_on_a_node.set(saw_two_on_a_node.get() || by_node.values().any(|ps| ps.len() == 2));
        by_node.values().all(|ps| ps.len() == 1 && image(&ps[0]) == "agent:2") && status(&client, "agent").await["updatedNumberScheduled"] == 2
    })
    .await;
    assert!(done.is_some(), "{}", status(&client, "agent").await);
    assert_eq!(fewest_ready.get(), 2, "a node was without a ready pod during a surge update");
    assert!(saw_two_on_a_node.get(), "the new pod never ran beside the old one");
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn on_delete_replaces_only_the_pods_a_user_deletes() {
    let client = api().await;
    for n in ["n1", "n2"] {
        node(&client, n, json!([])).await;
    }
    let controllers = daemonset_controller_only(&client);
    client.create(&kinds::DAEMONSET, Some("default"), daemon_set("agent", "agent:1", json!({"type": "OnDelete"}))).await.unwrap();
    assert!(wait_until(Duration::from_secs(5), || async { pods_by_node(&client).await.len() == 2 }).await.is_some());
    set_image(&client, "agent", "agent:2").await;
    let observed = wait_until(Duration::from_secs(5), || async { status(&client, "agent").await["observedGeneration"] == 2 }).await;
    assert!(observed.is_some());
    let victim = pods_by_node(&client).await["n1"][0].clone();
    client.delete(&kinds::POD, Some("default"), meta::name(&victim), &Default::default()).await.unwrap();
    let replaced = wait_until(Duration::from_secs(5), || async {
        pods_by_node(&client).await.get("n1").is_some_and(|ps| ps.len() == 1 && image(&ps[0]) == "agent:2")
    })
    .await;
    assert!(replaced.is_some(), "the deleted pod did not come back at the new template");
    assert_eq!(image(&pods_by_node(&client).await["n2"][0]), "agent:1", "OnDelete replaced a pod nobody deleted");
    assert_eq!(status(&client, "agent").await["updatedNumberScheduled"], 1);
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_selector_limits_the_pods_and_a_node_labelled_later_gets_one() {
    let client = api().await;
    for n in ["n1", "n2"] {
        node(&client, n, json!([])).await;
    }
    client.patch(&kinds::NODE, None, "n1", Patch::Merge(json!({"metadata": {"labels": {"disk": "ssd"}}}))).await.unwrap();
    let controllers = daemonset_controller_only(&client);
    let mut ds = daemon_set("agent", "agent:1", Value::Null);
    ds["spec"]["template"]["spec"]["nodeSelector"] = json!({"disk": "ssd"});
    client.create(&kinds::DAEMONSET, Some("default"), ds).await.unwrap();
    let one = wait_until(Duration::from_secs(5), || async { status(&client, "agent").await["currentNumberScheduled"] == 1 }).await;
    assert!(one.is_some(), "{}", status(&client, "agent").await);
    assert_eq!(pods_by_node(&client).await.keys().collect::<Vec<_>>(), ["n1"]);

    client.patch(&kinds::NODE, None, "n2", Patch::Merge(json!({"metadata": {"labels": {"disk": "ssd"}}}))).await.unwrap();
    let two = wait_until(Duration::from_secs(5), || async { pods_by_node(&client).await.contains_key("n2") }).await;
    assert!(two.is_some_and(|t| t < Duration::from_secs(1)), "the newly labelled node got its pod after {two:?}");
    controllers.stop().await;
}
