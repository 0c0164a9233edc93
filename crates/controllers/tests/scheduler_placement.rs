//! The scheduler against the real in-process API server: where pods land, what an unschedulable
//! pod says, and that each pod is bound once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::{ApiError, kinds};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_controllers::scheduler::{SchedulerConfig, scheduler};
use shepherd_runtime::intercept::{Call, Intercepted, Interceptor, Reply};
use shepherd_runtime::{Client, DeleteParams, ListParams, Manager, Patch, RunningManager};
use shepherd_store::{HistoryLimits, LocalStore};

/// Counts `bind_pod` calls per pod, and the bindings made.
#[derive(Default)]
struct Binds {
    calls: Mutex<HashMap<String, usize>>,
    bound: AtomicUsize,
}

#[async_trait]
impl Interceptor for Binds {
    async fn before(&self, call: &Call<'_>) -> Result<(), ApiError> {
        if let Call::Bind { namespace, name, .. } = call {
            *self.calls.lock().unwrap().entry(format!("{namespace}/{name}")).or_default() += 1;
        }
        Ok(())
    }

    fn after(&self, call: &Call<'_>, outcome: Result<Reply<'_>, &ApiError>) {
        if matches!(call, Call::Bind { .. }) && outcome.is_ok() {
            self.bound.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Cluster {
    client: Arc<dyn Client>,
    counting: Arc<Intercepted<Binds>>,
    running: Option<RunningManager>,
}

impl Cluster {
    async fn new() -> Cluster {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
        let client: Arc<dyn Client> = Arc::new(server.client());
        let counting = Arc::new(Intercepted::new(client.clone(), Binds::default()));
        Cluster { client, counting, running: None }
    }

    fn start_scheduler(&mut self) {
        let c: Arc<dyn Client> = self.counting.clone();
        let manager = Manager::new(c.clone());
        manager.add(scheduler(c, &manager, SchedulerConfig::default()));
        self.running = Some(manager.spawn());
    }

    async fn shut_down(self) {
        if let Some(r) = self.running {
            r.stop().await;
        }
    }

    async fn node(&self, name: &str, cpu: &str, labels: Value, taints: Value) {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}});
        self.client.create(&kinds::NODE, None, node).await.expect("node created");
    }

    /// Creates a pod requesting `cpu`; `extra` is merged into its spec.
    async fn pod(&self, name: &str, cpu: &str, extra: Value) {
        let mut spec = json!({"containers": [{"name": "app", "image": "web:1",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec});
        self.client.create(&kinds::POD, Some("default"), pod).await.expect("pod created");
    }

    async fn owned_pod(&self, name: &str, owner_uid: &str) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": owner_uid, "controller": true}]},
            "spec": {"containers": [{"name": "app", "image": "web:1"}]}});
        self.client.create(&kinds::POD, Some("default"), pod).await.expect("pod created");
    }

    async fn node_of(&self, pod: &str) -> Option<String> {
        let p = self.client.get(&kinds::POD, Some("default"), pod).await.ok()?;
        p.pointer("/spec/nodeName").and_then(Value::as_str).map(str::to_string)
    }

    async fn wait_for_node(&self, pod: &str) -> String {
        for _ in 0..500 {
            if let Some(n) = self.node_of(pod).await {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("pod {pod} was never scheduled");
    }

    async fn pod_scheduled_condition(&self, pod: &str) -> Option<Value> {
        let p = self.client.get(&kinds::POD, Some("default"), pod).await.ok()?;
        p.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == "PodScheduled").cloned()
    }

    async fn wait_for_unschedulable(&self, pod: &str) -> String {
        for _ in 0..500 {
            if let Some(c) = self.pod_scheduled_condition(pod).await
                && c["status"] == "False"
            {
                assert_eq!(c["reason"], "Unschedulable");
                return c["message"].as_str().unwrap_or("").to_string();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("pod {pod} was never marked unschedulable");
    }

    async fn events_about(&self, pod: &str, reason: &str) -> Vec<Value> {
        let list = self.client.list(&kinds::EVENT, &ListParams::namespace("default")).await.expect("events listed");
        list.items.into_iter().filter(|e| e["involvedObject"]["name"] == pod && e["reason"] == reason).collect()
    }
}

#[tokio::test]
async fn resource_fit_counts_the_pods_already_bound_to_a_node() {
    let mut c = Cluster::new().await;
    c.node("busy", "2", json!({}), json!([])).await;
    c.node("idle", "2", json!({}), json!([])).await;
    c.pod("already-there", "1500m", json!({"nodeName": "busy"})).await;
    c.start_scheduler();

    c.pod("first", "1", json!({})).await;
    assert_eq!(c.wait_for_node("first").await, "idle", "busy has only 500m left");
    c.pod("second", "1", json!({})).await;
    assert_eq!(c.wait_for_node("second").await, "idle", "idle has exactly 1 cpu left");
    c.pod("third", "1", json!({})).await;
    assert_eq!(c.wait_for_unschedulable("third").await, "0/2 nodes are available: 2 Insufficient cpu.");

    // Deleting a bound pod frees its room and the waiting pod is retried at once.
    c.client
        .delete(&kinds::POD, Some("default"), "already-there", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .expect("pod deleted");
    assert_eq!(c.wait_for_node("third").await, "busy");
    c.shut_down().await;
}

#[tokio::test]
async fn taints_node_selectors_and_required_node_affinity_are_respected() {
    let mut c = Cluster::new().await;
    c.node("gpu", "8", json!({"zone": "a", "cores": "64"}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])).await;
    c.node("plain-a", "8", json!({"zone": "a", "cores": "8"}), json!([])).await;
    c.node("plain-b", "8", json!({"zone": "b", "cores": "8"}), json!([])).await;
    c.start_scheduler();

    c.pod("wants-b", "100m", json!({"nodeSelector": {"zone": "b"}})).await;
    c.pod("not-b", "100m", json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}]}}}})).await;
    c.pod("big-iron", "100m", json!({
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["32"]}]}]}}}})).await;
    c.pod("no-such-zone", "100m", json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]}]}}}})).await;

    assert_eq!(c.wait_for_node("wants-b").await, "plain-b");
    assert_eq!(c.wait_for_node("not-b").await, "plain-a", "the gpu node's taint is not tolerated");
    assert_eq!(c.wait_for_node("big-iron").await, "gpu");
    assert_eq!(
        c.wait_for_unschedulable("no-such-zone").await,
        "0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}."
    );
    c.shut_down().await;
}

#[tokio::test]
async fn pods_of_one_owner_spread_across_nodes() {
    let mut c = Cluster::new().await;
    for n in ["n1", "n2", "n3"] {
        c.node(n, "4", json!({}), json!([])).await;
    }
    // Another owner's pods crowd n1 a little; spreading is per owner.
    c.start_scheduler();
    for i in 0..6 {
        c.owned_pod(&format!("web-{i}"), "rs-uid-1").await;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..6 {
        *per_node.entry(c.wait_for_node(&format!("web-{i}")).await).or_default() += 1;
    }
    assert_eq!(per_node, BTreeMap::from([("n1".into(), 2), ("n2".into(), 2), ("n3".into(), 2)]));
    c.shut_down().await;
}

#[tokio::test]
async fn an_unschedulable_pod_says_why_once_and_is_placed_when_a_node_joins() {
    let mut c = Cluster::new().await;
    c.node("small-1", "1", json!({}), json!([])).await;
    c.node("small-2", "1", json!({}), json!([])).await;
    c.node("reserved", "16", json!({}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])).await;
    c.start_scheduler();

    c.pod("large", "4", json!({})).await;
    let message = c.wait_for_unschedulable("large").await;
    assert_eq!(message, "0/3 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint {dedicated: gpu}.");

    // Unrelated changes retry the pod but do not repeat the event.
    c.client
        .patch(&kinds::NODE, None, "small-1", Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})))
        .await
        .expect("node patched");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let events = c.events_about("large", "FailedScheduling").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["count"], 1);
    assert_eq!(events[0]["message"], message);
    assert_eq!(c.node_of("large").await, None);

    c.node("big", "8", json!({}), json!([])).await;
    assert_eq!(c.wait_for_node("large").await, "big");
    let condition = c.pod_scheduled_condition("large").await.expect("condition set");
    assert_eq!(condition["status"], "True");
    c.shut_down().await;
}

#[tokio::test]
async fn a_cordoned_or_not_ready_node_gets_no_pods() {
    let mut c = Cluster::new().await;
    c.node("cordoned", "8", json!({}), json!([])).await;
    c.client.patch(&kinds::NODE, None, "cordoned", Patch::Merge(json!({"spec": {"unschedulable": true}}))).await.expect("cordoned");
    c.node("sick", "8", json!({}), json!([])).await;
    c.client
        .patch_status(&kinds::NODE, None, "sick", Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})))
        .await
        .expect("sick");
    c.start_scheduler();
    c.pod("p", "100m", json!({})).await;
    assert_eq!(
        c.wait_for_unschedulable("p").await,
        "0/2 nodes are available: 1 node(s) were not ready, 1 node(s) were unschedulable."
    );
    c.client.patch(&kinds::NODE, None, "cordoned", Patch::Merge(json!({"spec": {"unschedulable": false}}))).await.expect("uncordoned");
    assert_eq!(c.wait_for_node("p").await, "cordoned");
    c.shut_down().await;
}

#[tokio::test]
async fn every_pod_is_bound_exactly_once() {
    let mut c = Cluster::new().await;
    for i in 0..10 {
        c.node(&format!("n{i}"), "4", json!({}), json!([])).await;
    }
    c.start_scheduler();
    for i in 0..300 {
        c.pod(&format!("p{i}"), "100m", json!({})).await;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..300 {
        *per_node.entry(c.wait_for_node(&format!("p{i}")).await).or_default() += 1;
    }
    // Settle: later events (status patches, binding echoes) must not bind again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let binds = c.counting.interceptor().calls.lock().unwrap().clone();
    assert_eq!(binds.len(), 300);
    let twice: Vec<_> = binds.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "pods bound more than once: {twice:?}");
    // 300 pods of 100m on ten 4-cpu nodes: nobody is over capacity (40 pods each at most).
    assert!(per_node.values().all(|n| *n <= 40), "{per_node:?}");
    c.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_thousand_nodes_pods_spread_evenly_and_a_pinned_pod_finds_its_node() {
    // Past a hundred nodes each pod is weighed against only part of the cluster; the parts must
    // rotate so that no node is favoured, and a pod that fits one node must still find it.
    const NODES: usize = 1_000;
    const PODS: usize = 3_000;
    // After every thousandth pod, one that only this node can take.
    const PINNED_TO: [&str; 3] = ["node-0123", "node-0512", "node-0901"];
    let mut c = Cluster::new().await;
    for i in 0..NODES {
        c.node(&format!("node-{i:04}"), "32", json!({"host": format!("node-{i:04}")}), json!([])).await;
    }
    c.start_scheduler();
    for i in 0..PODS {
        c.pod(&format!("web-{i}"), "100m", json!({})).await;
        if i % 1_000 == 999 {
            c.pod(&format!("pinned-{i}"), "100m", json!({"nodeSelector": {"host": PINNED_TO[i / 1_000]}})).await;
        }
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..PODS {
        *per_node.entry(c.wait_for_node(&format!("web-{i}")).await).or_default() += 1;
        if i % 1_000 == 999 {
            assert_eq!(c.wait_for_node(&format!("pinned-{i}")).await, PINNED_TO[i / 1_000]);
        }
    }
    let most = per_node.values().max().copied().unwrap_or(0);
    assert!(per_node.len() == NODES && most <= 5, "3 pods per node on average, but {} nodes used and {most} on one", per_node.len());
    c.shut_down().await;
}

/// Throughput: 10,000 pending pods onto 1,000 nodes, timed from the scheduler's start to the last
/// successful bind. A measurement, not a check:
/// `cargo test --release -p shepherd-controllers --test scheduler_placement -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn scheduler_binds_ten_thousand_pods_on_a_thousand_nodes() {
    const NODES: usize = 1_000;
    const PODS: usize = 10_000;
    let mut c = Cluster::new().await;
    for i in 0..NODES {
        c.node(&format!("node-{i:04}"), "32", json!({"zone": format!("z{}", i % 3)}), json!([])).await;
    }
    for i in 0..PODS {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("web-{i}"), "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{}", i % 50),
                "uid": format!("uid-{}", i % 50), "controller": true}]},
            "spec": {"containers": [{"name": "app", "image": "web:1", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}});
        c.client.create(&kinds::POD, Some("default"), pod).await.expect("pod created");
    }
    let started = std::time::Instant::now();
    c.start_scheduler();
    while c.counting.interceptor().bound.load(Ordering::Relaxed) < PODS {
        assert!(started.elapsed() < Duration::from_secs(300), "only {} pods bound", c.counting.interceptor().bound.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    println!(
        "scheduler: {PODS} pods on {NODES} nodes in {:.2} s = {:.0} pods/s (includes the informers' initial list)",
        elapsed.as_secs_f64(),
        PODS as f64 / elapsed.as_secs_f64()
    );
    let binds = c.counting.interceptor().calls.lock().unwrap().clone();
    assert!(binds.values().all(|n| *n == 1), "a pod was bound twice");
    c.shut_down().await;
}
