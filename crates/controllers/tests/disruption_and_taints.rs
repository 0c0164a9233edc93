//! PodDisruptionBudget status and NoExecute taint evictions against the real in-process API
//! server; taint timing on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_controllers::ControllerConfig;
use shepherd_controllers::disruption::disruption_controller;
use shepherd_controllers::nodelifecycle::{NodeLifecycleConfig, UNREACHABLE_TAINT, node_lifecycle_controller};
use shepherd_controllers::taintmanager::taint_manager;
use shepherd_runtime::{Client, Manager, Patch, RunningManager};
use shepherd_store::{HistoryLimits, LocalStore};
use tokio::time::Instant;

struct Cluster {
    client: Arc<dyn Client>,
    running: RunningManager,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(false).await
    }

    /// With the node lifecycle controller too (40 s grace period, 60 s eviction timeout).
    async fn start_with(node_lifecycle: bool) -> Cluster {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
        let client: Arc<dyn Client> = Arc::new(server.client());
        let manager = Manager::new(client.clone());
        manager.add(disruption_controller(client.clone(), &manager, ControllerConfig::default()));
        manager.add(taint_manager(client.clone(), &manager, ControllerConfig::default()));
        if node_lifecycle {
            manager.add(node_lifecycle_controller(client.clone(), &manager, NodeLifecycleConfig::default()));
        }
        Cluster { client, running: manager.spawn() }
    }

    async fn node(&self, name: &str) {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        self.client.create(&kinds::NODE, None, node).await.expect("node created");
    }

    /// A running, ready pod labelled `app=web` on `node`.
    async fn pod(&self, name: &str, node: &str, tolerations: Value) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "web:1"}], "tolerations": tolerations}});
        self.client.create(&kinds::POD, Some("default"), pod).await.expect("pod created");
        self.client.bind_pod("default", name, node).await.expect("pod bound");
        self.set_ready(name, true).await;
    }

    async fn set_ready(&self, name: &str, ready: bool) {
        let status = json!({"status": {"phase": "Running", "podIP": "10.1.0.1",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        self.client.patch_status(&kinds::POD, Some("default"), name, Patch::Merge(status)).await.expect("pod status patched");
    }

    async fn taint(&self, node: &str, taints: Value) {
        let patch = json!({"spec": {"taints": taints}});
        self.client.patch(&kinds::NODE, None, node, Patch::Merge(patch)).await.expect("node tainted");
    }

    /// Whether the pod is gone or being deleted.
    async fn evicted(&self, name: &str) -> bool {
        match self.client.get(&kinds::POD, Some("default"), name).await {
            Ok(p) => p["metadata"]["deletionTimestamp"].is_string(),
            Err(e) if e.is_not_found() => true,
            Err(e) => panic!("reading pod {name}: {e}"),
        }
    }

    /// Polls every 10 ms (of the paused clock, when paused) until `name` is evicted; how long it took.
    async fn wait_evicted(&self, name: &str, limit: Duration) -> Duration {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.evicted(name).await {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("pod {name} was not evicted within {limit:?}");
    }

    async fn budget_status(&self, name: &str) -> Value {
        let pdb = self.client.get(&kinds::PODDISRUPTIONBUDGET, Some("default"), name).await.expect("pdb exists");
        let s = &pdb["status"];
        let allowed = s["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"));
        json!({"expected": s["expectedPods"], "healthy": s["currentHealthy"], "desired": s["desiredHealthy"],
            "allowed": s["disruptionsAllowed"], "observed": s["observedGeneration"],
            "condition": allowed.map(|c| json!([c["status"], c["reason"]]))})
    }

    async fn wait_budget(&self, name: &str, want: Value) {
        let started = std::time::Instant::now();
        let mut last = Value::Null;
        while started.elapsed() < Duration::from_secs(10) {
            last = self.budget_status(name).await;
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("budget {name} never reached {want}; last {last}");
    }
}

#[tokio::test]
async fn a_budget_counts_healthy_pods_and_allows_what_exceeds_its_minimum() {
    let c = Cluster::start().await;
    c.node("n1").await;
    for p in ["web-0", "web-1", "web-2"] {
        c.pod(p, "n1", json!([])).await;
    }
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}});
    c.client.create(&kinds::PODDISRUPTIONBUDGET, Some("default"), pdb).await.expect("pdb created");
    c.wait_budget("web", json!({"expected": 3, "healthy": 3, "desired": 2, "allowed": 1, "observed": 1,
        "condition": ["True", "SufficientPods"]})).await;

    c.set_ready("web-1", false).await;
    c.wait_budget("web", json!({"expected": 3, "healthy": 2, "desired": 2, "allowed": 0, "observed": 1,
        "condition": ["False", "InsufficientPods"]})).await;

    // A percentage of maxUnavailable counts against the pods (no controller: one each), rounded up.
    let patch = json!({"spec": {"minAvailable": null, "maxUnavailable": "50%"}});
    c.client.patch(&kinds::PODDISRUPTIONBUDGET, Some("default"), "web", Patch::Merge(patch)).await.expect("patched");
    c.wait_budget("web", json!({"expected": 3, "healthy": 2, "desired": 1, "allowed": 1, "observed": 2,
        "condition": ["True", "SufficientPods"]})).await;
    c.running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_no_execute_taint_evicts_intolerant_pods_at_once_and_tolerant_ones_after_their_seconds() {
    let c = Cluster::start().await;
    c.node("n1").await;
    c.pod("intolerant", "n1", json!([])).await;
    c.pod("patient", "n1", json!([{"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}])).await;
    c.pod("loyal", "n1", json!([{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}])).await;
    c.pod("unbothered", "n1", json!([])).await;
    // A NoSchedule taint evicts nobody; a NoExecute one does.
    c.taint("n1", json!([{"key": "other", "effect": "NoSchedule"}])).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!c.evicted("unbothered").await, "a NoSchedule taint evicted a running pod");

    c.taint("n1", json!([{"key": "maintenance", "value": "now", "effect": "NoExecute"}])).await;
    let took = c.wait_evicted("intolerant", Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(1), "an intolerant pod waited {took:?}");
    let gone = c.client.get(&kinds::POD, Some("default"), "intolerant").await.expect("terminating, not yet gone");
    let target = gone["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget")).cloned();
    assert_eq!(target.map(|t| t["reason"].clone()), Some(json!("DeletionByTaintManager")), "{gone}");
    let took = c.wait_evicted("patient", Duration::from_secs(60)).await;
    assert!(took >= Duration::from_secs(29) && took < Duration::from_secs(31), "tolerationSeconds 30 evicted after {took:?}");
    assert!(c.evicted("unbothered").await, "every pod without a toleration goes");
    assert!(!c.evicted("loyal").await, "a toleration without seconds tolerates for ever");
    c.running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn removing_the_taint_in_time_cancels_a_pending_eviction() {
    let c = Cluster::start().await;
    c.node("n1").await;
    c.pod("patient", "n1", json!([{"key": "maintenance", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 20}])).await;
    c.pod("marker", "n1", json!([])).await;
    c.taint("n1", json!([{"key": "maintenance", "effect": "NoExecute"}])).await;
    // The intolerant marker going shows the taint was seen.
    c.wait_evicted("marker", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    c.taint("n1", json!([])).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!c.evicted("patient").await, "the eviction outlived the taint");
    c.running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_node_s_pods_go_after_their_own_toleration_or_else_the_eviction_timeout() {
    let c = Cluster::start_with(true).await;
    let started = Instant::now();
    c.node("n1").await;
    c.pod("brief", "n1", json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}])).await;
    c.pod("plain", "n1", json!([])).await;
    // The node never heartbeats: unreachable after the 40 s grace period.
    let brief = c.wait_evicted("brief", Duration::from_secs(120)).await;
    assert!(brief >= Duration::from_secs(44) && brief < Duration::from_secs(47), "brief went after {brief:?}");
    assert!(!c.evicted("plain").await, "a pod without a toleration was evicted before the eviction timeout");
    c.wait_evicted("plain", Duration::from_secs(120)).await;
    let plain = started.elapsed();
    assert!(plain >= Duration::from_secs(99) && plain < Duration::from_secs(102), "plain went after {plain:?}");
    c.running.stop().await;
}
