//! The node lifecycle controller on tokio's paused clock: lease expiry, eviction, recovery and
//! node removal, against the real in-process API server.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_controllers::nodelifecycle::{NodeLifecycleConfig, UNREACHABLE_TAINT, node_lifecycle_controller};
use shepherd_runtime::{Client, DeleteParams, ListParams, Manager, Patch, RunningManager, WatchEvent};
use shepherd_store::{HistoryLimits, LocalStore};
use tokio::sync::oneshot;
use tokio::time::Instant;

struct Cluster {
    client: Arc<dyn Client>,
    running: Option<RunningManager>,
}

impl Cluster {
    async fn new() -> Cluster {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
        Cluster { client: Arc::new(server.client()), running: None }
    }

    /// Starts the controller with the default 40 s grace period and 60 s eviction timeout.
    fn start(&mut self) {
        let manager = Manager::new(self.client.clone());
        manager.add(node_lifecycle_controller(self.client.clone(), &manager, NodeLifecycleConfig::default()));
        self.running = Some(manager.spawn());
    }

    async fn shut_down(self) {
        if let Some(r) = self.running {
            r.stop().await;
        }
    }

    async fn node(&self, name: &str) {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}});
        self.client.create(&kinds::NODE, None, node).await.expect("node created");
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew_time(0)}});
        self.client.create(&kinds::LEASE, Some("kube-node-lease"), lease).await.expect("lease created");
    }

    async fn renew(&self, node: &str, tick: u64) {
        let patch = json!({"spec": {"renewTime": renew_time(tick)}});
        self.client.patch(&kinds::LEASE, Some("kube-node-lease"), node, Patch::Merge(patch)).await.expect("lease renewed");
    }

    async fn set_ready(&self, node: &str) {
        let n = self.client.get(&kinds::NODE, None, node).await.expect("node exists");
        let mut conditions: Vec<Value> = n["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.retain(|c| c["type"] != "Ready");
        conditions.push(json!({"type": "Ready", "status": "True", "reason": "KubeletReady"}));
        let patch = json!({"status": {"conditions": conditions}});
        self.client.patch_status(&kinds::NODE, None, node, Patch::Merge(patch)).await.expect("node status patched");
    }

    async fn pod_on(&self, name: &str, node: &str) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "app", "image": "web:1"}]}});
        self.client.create(&kinds::POD, Some("default"), pod).await.expect("pod created");
        self.client.bind_pod("default", name, node).await.expect("pod bound");
        let running = json!({"status": {"phase": "Running"}});
        self.client.patch_status(&kinds::POD, Some("default"), name, Patch::Merge(running)).await.expect("pod running");
    }

    async fn pod_exists(&self, name: &str) -> bool {
        self.client.get(&kinds::POD, Some("default"), name).await.is_ok()
    }

    async fn ready(&self, node: &str) -> String {
        let n = self.client.get(&kinds::NODE, None, node).await.expect("node exists");
        n["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }

    async fn unreachable_effects(&self, node: &str) -> Vec<String> {
        let n = self.client.get(&kinds::NODE, None, node).await.expect("node exists");
        let mut effects: Vec<String> = n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["key"] == UNREACHABLE_TAINT)
            .filter_map(|t| t["effect"].as_str().map(str::to_string))
            .collect();
        effects.sort();
        effects
    }

    async fn events(&self, reason: &str) -> Vec<Value> {
        let list = self.client.list(&kinds::EVENT, &ListParams::default()).await.expect("events listed");
        list.items.into_iter().filter(|e| e["reason"] == reason).collect()
    }

    /// Watches pods and returns, per pod, the phase and reason it had just before deletion.
    async fn record_last_pod_states(&self) -> Arc<std::sync::Mutex<Vec<(String, String, String)>>> {
        let list = self.client.list(&kinds::POD, &ListParams::default()).await.expect("pods listed");
        let mut stream = self.client.watch(&kinds::POD, &ListParams::default(), list.resource_version).await.expect("watching pods");
        let deleted: Arc<std::sync::Mutex<Vec<(String, String, String)>>> = Arc::default();
        let d = deleted.clone();
        tokio::spawn(async move {
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Deleted(p) = event {
                    let s = |ptr: &str| p.pointer(ptr).and_then(Value::as_str).unwrap_or("").to_string();
                    d.lock().unwrap().push((s("/metadata/name"), s("/status/phase"), s("/status/reason")));
                }
            }
        });
        deleted
    }
}

fn renew_time(tick: u64) -> String {
    format!("2025-01-01T00:{:02}:{:02}.000000Z", (tick / 60) % 60, tick % 60)
}

/// Keeps `node`'s lease fresh every 10 s until the returned sender is dropped.
fn keep_renewing(client: Arc<dyn Client>, node: &'static str) -> oneshot::Sender<()> {
    let (tx, mut rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut tick = 0;
        loop {
            tokio::select! {
                _ = &mut rx => return,
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
            tick += 10;
            let patch = json!({"spec": {"renewTime": renew_time(tick)}});
            let _ = client.patch(&kinds::LEASE, Some("kube-node-lease"), node, Patch::Merge(patch)).await;
        }
    });
    tx
}

/// Sleeps on the paused clock until `at` (seconds after `start`).
async fn until(start: Instant, at: f64) {
    tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_makes_the_node_unknown_and_tainted_and_its_pods_failed_and_deleted() {
    let mut c = Cluster::new().await;
    c.node("lost").await;
    c.node("healthy").await;
    c.pod_on("lost-pod-1", "lost").await;
    c.pod_on("lost-pod-2", "lost").await;
    c.pod_on("healthy-pod", "healthy").await;
    let deleted = c.record_last_pod_states().await;
    let _renewing = keep_renewing(c.client.clone(), "healthy");
    c.start();
    let start = Instant::now();

    // The lost node renews twice more, then falls silent at t = 20 s.
    until(start, 10.0).await;
    c.renew("lost", 10).await;
    until(start, 20.0).await;
    c.renew("lost", 20).await;

    until(start, 59.0).await;
    assert_eq!(c.ready("lost").await, "True", "39 s of silence is within the 40 s grace period");
    assert!(c.unreachable_effects("lost").await.is_empty());

    until(start, 61.0).await;
    assert_eq!(c.ready("lost").await, "Unknown");
    let node = c.client.get(&kinds::NODE, None, "lost").await.expect("node exists");
    let ready = node["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).cloned().unwrap_or_default();
    assert_eq!(ready["reason"], "NodeStatusUnknown");
    assert_eq!(ready["message"], "Kubelet stopped posting node status.");
    assert_eq!(c.unreachable_effects("lost").await, ["NoExecute", "NoSchedule"]);
    let not_ready = c.events("NodeNotReady").await;
    assert_eq!(not_ready.len(), 1, "{not_ready:?}");
    assert_eq!(not_ready[0]["involvedObject"]["name"], "lost");
    assert!(c.pod_exists("lost-pod-1").await, "pods stay until the eviction timeout");

    until(start, 119.0).await;
    assert!(c.pod_exists("lost-pod-1").await && c.pod_exists("lost-pod-2").await, "59 s unknown is within the 60 s eviction timeout");

    until(start, 122.0).await;
    assert!(!c.pod_exists("lost-pod-1").await && !c.pod_exists("lost-pod-2").await, "the lost node's pods are deleted");
    let mut gone = deleted.lock().unwrap().clone();
    gone.sort();
    assert_eq!(
        gone,
        [
            ("lost-pod-1".to_string(), "Failed".to_string(), "NodeLost".to_string()),
            ("lost-pod-2".to_string(), "Failed".to_string(), "NodeLost".to_string()),
        ]
    );

    assert!(c.pod_exists("healthy-pod").await);
    assert_eq!(c.ready("healthy").await, "True");
    assert!(c.unreachable_effects("healthy").await.is_empty());
    c.shut_down().await;
}

/// Reconciles the node lifecycle controller has run so far, whatever their result.
fn reconciles(c: &Cluster) -> u64 {
    let snapshot = c.running.as_ref().expect("controller running").manager().snapshot();
    let nl = snapshot.controllers.iter().find(|s| s.name == "nodelifecycle").expect("nodelifecycle runs");
    nl.reconciles.success + nl.reconciles.error + nl.reconciles.requeue
}

#[tokio::test(start_paused = true)]
async fn a_healthy_nodes_renewals_are_not_reconciled_one_by_one() {
    let mut c = Cluster::new().await;
    c.node("steady").await;
    let _renewing = keep_renewing(c.client.clone(), "steady");
    c.start();
    let start = Instant::now();
    until(start, 1.0).await;
    let first = reconciles(&c);
    assert!(first >= 1, "the node is reconciled when first seen");

    // 20 renewals in 200 s: the node is looked at when its lease would have expired (every 40 s
    // at most), not at each renewal.
    until(start, 201.0).await;
    let during = reconciles(&c) - first;
    assert!((3..=6).contains(&during), "{during} reconciles for 20 renewals");
    assert_eq!(c.ready("steady").await, "True");
    assert!(c.unreachable_effects("steady").await.is_empty());
    c.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_that_comes_back_is_ready_and_untainted() {
    let mut c = Cluster::new().await;
    c.node("flaky").await;
    c.start();
    let start = Instant::now();
    until(start, 45.0).await;
    assert_eq!(c.ready("flaky").await, "Unknown");
    assert_eq!(c.unreachable_effects("flaky").await, ["NoExecute", "NoSchedule"]);

    // The agent returns: it renews its lease and reports Ready itself.
    c.renew("flaky", 45).await;
    c.set_ready("flaky").await;
    until(start, 46.0).await;
    assert_eq!(c.ready("flaky").await, "True");
    assert!(c.unreachable_effects("flaky").await.is_empty(), "the unreachable taints are removed");
    assert_eq!(c.events("NodeReady").await.len(), 1);

    // And it is judged afresh: silent again, it goes unknown again one grace period later.
    until(start, 84.0).await;
    assert_eq!(c.ready("flaky").await, "True");
    until(start, 86.0).await;
    assert_eq!(c.ready("flaky").await, "Unknown");
    c.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_removed_nodes_pods_are_failed_and_deleted() {
    let mut c = Cluster::new().await;
    c.node("doomed").await;
    c.pod_on("orphan-1", "doomed").await;
    c.pod_on("orphan-2", "doomed").await;
    let deleted = c.record_last_pod_states().await;
    let _renewing = keep_renewing(c.client.clone(), "doomed");
    c.start();
    let start = Instant::now();
    until(start, 1.0).await;
    assert!(c.pod_exists("orphan-1").await);

    c.client.delete(&kinds::NODE, None, "doomed", &DeleteParams::default()).await.expect("node deleted");
    until(start, 2.0).await;
    assert!(!c.pod_exists("orphan-1").await && !c.pod_exists("orphan-2").await);
    let mut gone = deleted.lock().unwrap().clone();
    gone.sort();
    assert_eq!(gone.iter().map(|(n, phase, reason)| format!("{n} {phase} {reason}")).collect::<Vec<_>>(), [
        "orphan-1 Failed NodeLost",
        "orphan-2 Failed NodeLost"
    ]);
    c.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_nodes_replicaset_pods_are_replaced_on_another_node() {
    use shepherd_controllers::scheduler::{SchedulerConfig, scheduler};
    use shepherd_controllers::{ControllerConfig, replicaset_controller};

    let mut c = Cluster::new().await;
    c.node("a").await;
    c.node("b").await;
    let manager = Manager::new(c.client.clone());
    manager.add(node_lifecycle_controller(c.client.clone(), &manager, NodeLifecycleConfig::default()));
    manager.add(scheduler(c.client.clone(), &manager, SchedulerConfig::default()));
    manager.add(replicaset_controller(c.client.clone(), &manager, &ControllerConfig::default()));
    c.running = Some(manager.spawn());
    let _renewing = keep_renewing(c.client.clone(), "b");
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "web:1"}]}}}});
    c.client.create(&kinds::REPLICASET, Some("default"), rs).await.expect("replicaset created");
    let start = Instant::now();

    let placement = || async {
        let pods = c.client.list(&kinds::POD, &ListParams::namespace("default")).await.expect("pods listed");
        let mut nodes: Vec<String> = pods
            .items
            .iter()
            .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
            .map(|p| p.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("-").to_string())
            .collect();
        nodes.sort();
        nodes
    };
    until(start, 5.0).await;
    assert_eq!(placement().await, ["a", "a", "b", "b"], "replicas spread over both nodes");

    // Node a never renews: unknown at 40 s, its pods evicted at 100 s and replaced on b.
    until(start, 102.0).await;
    assert_eq!(placement().await, ["b", "b", "b", "b"]);
    c.shut_down().await;
}
