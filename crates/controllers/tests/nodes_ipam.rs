//! The node IPAM controller against the real in-process API server: every Node gets its own pod
//! CIDR, a restarted controller reuses none, a deleted Node's block is freed, and an exhausted
//! cluster CIDR is reported on the Node.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_controllers::nodeipam::{ClusterCidr, NodeIpamConfig, node_ipam_controller};
use shepherd_runtime::{Client, DeleteParams, ListParams, Manager, RunningManager};
use shepherd_store::{HistoryLimits, LocalStore};

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

    fn start(&mut self, cidr: ClusterCidr) {
        let manager = Manager::new(self.client.clone());
        manager.add(node_ipam_controller(self.client.clone(), &manager, NodeIpamConfig { cidr, ..Default::default() }));
        self.running = Some(manager.spawn());
    }

    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }

    async fn node(&self, name: &str) {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        self.client.create(&kinds::NODE, None, node).await.expect("node created");
    }

    async fn delete_node(&self, name: &str) {
        self.client.delete(&kinds::NODE, None, name, &DeleteParams::default()).await.expect("node deleted");
    }

    async fn pod_cidr(&self, name: &str) -> String {
        let n = self.client.get(&kinds::NODE, None, name).await.expect("node exists");
        n["spec"]["podCIDR"].as_str().unwrap_or("").to_string()
    }

    /// Waits (on the paused clock) until `name` has a pod CIDR and returns it.
    async fn wait_pod_cidr(&self, name: &str) -> String {
        for _ in 0..1000 {
            let c = self.pod_cidr(name).await;
            if !c.is_empty() {
                let n = self.client.get(&kinds::NODE, None, name).await.expect("node exists");
                assert_eq!(n["spec"]["podCIDRs"], json!([c]), "podCIDRs carries the same block");
                return c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("node {name} never got a pod CIDR");
    }

    async fn events(&self, reason: &str, node: &str) -> Vec<Value> {
        let list = self.client.list(&kinds::EVENT, &ListParams::default()).await.expect("events listed");
        list.items.into_iter().filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == node).collect()
    }
}

#[tokio::test(start_paused = true)]
async fn every_node_gets_its_own_block_of_the_cluster_cidr() {
    let mut c = Cluster::new().await;
    for i in 0..5 {
        c.node(&format!("node-{i}")).await;
    }
    c.start(ClusterCidr::default());
    let mut seen = HashSet::new();
    for i in 0..5 {
        let cidr = c.wait_pod_cidr(&format!("node-{i}")).await;
        assert!(cidr.starts_with("10.244.") && cidr.ends_with(".0/24"), "{cidr}");
        assert!(seen.insert(cidr.clone()), "{cidr} handed out twice");
    }
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_controller_hands_out_no_block_a_node_already_has() {
    let mut c = Cluster::new().await;
    let cidr = ClusterCidr::new("10.244.0.0/22", 24).expect("valid");
    c.node("a").await;
    c.node("b").await;
    c.start(cidr);
    let a = c.wait_pod_cidr("a").await;
    let b = c.wait_pod_cidr("b").await;
    c.stop().await;

    // The new controller starts its search at the first block again; only the Nodes tell it
    // which blocks are taken.
    c.node("c").await;
    c.node("d").await;
    c.start(cidr);
    let got: HashSet<String> = [a, b, c.wait_pod_cidr("c").await, c.wait_pod_cidr("d").await].into();
    assert_eq!(got.len(), 4, "four nodes, four distinct blocks: {got:?}");
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_cluster_cidr_is_reported_and_a_deleted_node_frees_its_block() {
    let mut c = Cluster::new().await;
    let cidr = ClusterCidr::new("10.244.0.0/23", 24).expect("valid");
    c.node("a").await;
    c.node("b").await;
    c.start(cidr);
    let a = c.wait_pod_cidr("a").await;
    c.wait_pod_cidr("b").await;

    c.node("late").await;
    let mut events = Vec::new();
    for _ in 0..1000 {
        events = c.events("CIDRNotAvailable", "late").await;
        if !events.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(events.len(), 1, "one CIDRNotAvailable event for the node that found no block");
    assert_eq!(events[0]["type"], "Warning");
    let message = events[0]["message"].as_str().unwrap_or("");
    assert!(message.contains("all 2 /24 blocks") && message.contains("--cluster-cidr"), "{message}");
    assert_eq!(c.pod_cidr("late").await, "");

    c.delete_node("a").await;
    assert_eq!(c.wait_pod_cidr("late").await, a, "the deleted node's block goes to the node that waited");
    c.stop().await;
}
