//! The node IPAM controller: gives every Node a `spec.podCIDR` (and `podCIDRs`), one block of the
//! cluster CIDR each, as kube-controller-manager's range allocator does.
//!
//! The blocks in use are the ones the Nodes that exist carry, so a restarted controller knows them
//! without state of its own, and a deleted Node's block is free again once it is gone from the
//! cache. Allocations are serialized (one worker, one lock) and those written but not yet seen in
//! the cache are remembered, so no block is ever given to two Nodes.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, Manager, Patch};

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};

/// A `--cluster-cidr` / `--node-cidr-mask-size` pair that cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("invalid cluster CIDR {cidr:?} with node mask /{mask}: {why}")]
pub struct InvalidClusterCidr {
    cidr: String,
    mask: u32,
    why: &'static str,
}

/// The cluster CIDR cut into equal per-node blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterCidr {
    base: u32,
    prefix: u32,
    node_mask: u32,
}

impl ClusterCidr {
    /// Parses `cidr` (IPv4, e.g. `10.244.0.0/16`) into blocks of `/node_mask`.
    pub fn new(cidr: &str, node_mask: u32) -> Result<Self, InvalidClusterCidr> {
        let bad = |why| InvalidClusterCidr { cidr: cidr.to_string(), mask: node_mask, why };
        let (ip, len) = cidr.split_once('/').ok_or_else(|| bad("expected an IPv4 CIDR such as 10.244.0.0/16"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad("the address is not an IPv4 address"))?;
        let prefix: u32 = len.parse().map_err(|_| bad("the prefix length is not a number"))?;
        if !(8..=30).contains(&prefix) {
            return Err(bad("the prefix length must be between 8 and 30"));
        }
        // A /31 or /32 per node leaves no address for a pod besides the bridge's.
        if node_mask < prefix || node_mask > 30 {
            return Err(bad("the node mask must be at least the cluster prefix and at most 30"));
        }
        if node_mask - prefix > 20 {
            return Err(bad("more than 2^20 node blocks; use a larger node mask"));
        }
        let base = u32::from(ip) & mask_bits(prefix);
        Ok(ClusterCidr { base, prefix, node_mask })
    }

    /// How many node blocks the cluster CIDR holds.
    pub fn blocks(&self) -> u32 {
        1 << (self.node_mask - self.prefix)
    }

    /// The `i`th block as `a.b.c.d/mask`.
    pub fn block(&self, i: u32) -> String {
        format!("{}/{}", Ipv4Addr::from(self.base + (i << (32 - self.node_mask))), self.node_mask)
    }

    /// Which block `cidr` is, if it is exactly one of this range's blocks.
    pub fn index_of(&self, cidr: &str) -> Option<u32> {
        let (ip, len) = cidr.split_once('/')?;
        let ip = u32::from(ip.parse::<Ipv4Addr>().ok()?);
        if len.parse::<u32>().ok()? != self.node_mask || ip & mask_bits(self.prefix) != self.base {
            return None;
        }
        let offset = ip - self.base;
        (offset & !mask_bits(self.node_mask) == 0).then_some(offset >> (32 - self.node_mask))
    }

    /// Whether this range and the IPv4 CIDR `other` share an address.
    pub fn overlaps(&self, other: &str) -> bool {
        let Some((ip, len)) = other.split_once('/') else { return false };
        let (Ok(ip), Ok(len)) = (ip.parse::<Ipv4Addr>(), len.parse::<u32>()) else { return false };
        let shorter = len.min(self.prefix).min(32);
        u32::from(ip) & mask_bits(shorter) == self.base & mask_bits(shorter)
    }

    /// The first free block at or after `from` (wrapping), skipping `used`.
    fn next_free(&self, from: u32, used: &HashSet<u32>) -> Option<u32> {
        let n = self.blocks();
        (0..n).map(|i| (from + i) % n).find(|b| !used.contains(b))
    }
}

fn mask_bits(len: u32) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

impl Default for ClusterCidr {
    /// 10.244.0.0/16 in /24 blocks: 256 nodes of 254 addresses.
    fn default() -> Self {
        ClusterCidr { base: u32::from(Ipv4Addr::new(10, 244, 0, 0)), prefix: 16, node_mask: 24 }
    }
}

/// How the node IPAM controller runs and what it hands out.
#[derive(Debug, Clone, Default)]
pub struct NodeIpamConfig {
    /// The trigger mode applies; allocations are serialized, so it runs one worker.
    pub run: ControllerConfig,
    pub cidr: ClusterCidr,
}

#[derive(Default)]
struct Allocation {
    /// Where the next search starts, so a released block is not handed out again at once.
    cursor: u32,
    /// Blocks written but perhaps not yet in the node cache, by node name.
    in_flight: HashMap<String, u32>,
}

struct NodeIpam {
    client: Arc<dyn Client>,
    nodes: Arc<Cache>,
    cidr: ClusterCidr,
    events: EventRecorder,
    /// Held across choosing a block and writing it, so two nodes never get the same one.
    allocation: tokio::sync::Mutex<Allocation>,
    /// Nodes that found the cluster CIDR exhausted, woken when a node is deleted.
    waiting: Arc<Mutex<BTreeSet<String>>>,
}

fn pod_cidr(node: &Value) -> &str {
    node.at("/spec/podCIDR").and_then(Value::as_str).unwrap_or("")
}

/// The node IPAM controller. Nodes that already have a podCIDR keep it (one outside the cluster
/// CIDR too); when every block is taken, the Node gets a `CIDRNotAvailable` Warning Event and
/// waits until a Node is deleted.
pub fn node_ipam_controller(client: Arc<dyn Client>, manager: &Manager, config: NodeIpamConfig) -> Controller {
    let nodes = manager.informers().cache(&kinds::NODE);
    let waiting: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let reconciler = Arc::new(NodeIpam {
        events: EventRecorder::new(client.clone(), "node-ipam-controller"),
        client,
        nodes: nodes.clone(),
        cidr: config.cidr,
        allocation: tokio::sync::Mutex::default(),
        waiting: waiting.clone(),
    });
    Controller::new("nodeipam", &kinds::NODE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    // A node no longer in the cache was deleted: its block is free for those waiting.
    .watches(&kinds::NODE, move |node| {
        let name = node.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
        if nodes.get(name).is_none() {
            std::mem::take(&mut *waiting.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
        } else {
            Vec::new()
        }
    })
    .workers(1)
    .mode(config.run.mode)
}

impl NodeIpam {
    /// The blocks the cached Nodes carry and those written but not yet seen. Runs once per
    /// allocation over every Node, so it reads the cached objects in place.
    fn used(&self, alloc: &Allocation) -> HashSet<u32> {
        let nodes = self.nodes.list();
        let mut used = HashSet::with_capacity(nodes.len() + alloc.in_flight.len());
        for n in &nodes {
            let listed = n.at("/spec/podCIDRs").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
            used.extend(listed.chain([pod_cidr(n)]).filter_map(|c| self.cidr.index_of(c)));
        }
        used.extend(alloc.in_flight.values().copied());
        used
    }

    async fn reconcile(&self, name: &str) -> Result<Action, Error> {
        let Some(node) = self.nodes.get(name) else { return Ok(Action::Done) };
        if !pod_cidr(&node).is_empty() {
            return Ok(Action::Done);
        }
        let mut alloc = self.allocation.lock().await;
        // Forget in-flight blocks the cache now shows (or whose node is gone).
        let nodes = &self.nodes;
        alloc.in_flight.retain(|n, _| nodes.get(n).is_some_and(|node| pod_cidr(&node).is_empty()));
        // This node's block is written and the cache has not caught up (another event of the
        // node came first): its next event shows the block; a second one would be refused.
        if alloc.in_flight.contains_key(name) {
            return Ok(Action::Done);
        }
        let Some(block) = self.cidr.next_free(alloc.cursor, &self.used(&alloc)) else {
            let message = format!(
                "Node {name} status is now: CIDRNotAvailable (all {} /{} blocks of the cluster CIDR are in use; \
                 delete a Node or widen --cluster-cidr)",
                self.cidr.blocks(),
                self.cidr.node_mask
            );
            tracing::warn!(node = name, "{message}");
            self.events.record(&node, EventType::Warning, "CIDRNotAvailable", &message).await;
            self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
            // A deletion between the count above and joining the waiting set woke nobody.
            if self.cidr.next_free(alloc.cursor, &self.used(&alloc)).is_some() {
                return Err(format!("a pod CIDR was released while node {name} was queued; retrying").into());
            }
            return Ok(Action::Done);
        };
        let cidr = self.cidr.block(block);
        // A patch, not an update of the cached Node: the agent's status writes while nodes
        // register made every update from the cache a conflict to retry. The API server refuses
        // to replace a pod CIDR once set, so a patch cannot overwrite one assigned meanwhile.
        let patch = Patch::Merge(json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}));
        match self.client.patch(&kinds::NODE, None, name, patch).await {
            Ok(_) => {
                alloc.in_flight.insert(name.to_string(), block);
                alloc.cursor = (block + 1) % self.cidr.blocks();
                tracing::info!(node = name, pod_cidr = %cidr, "allocated the node's pod CIDR");
                Ok(Action::Done)
            }
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(format!("assigning pod CIDR {cidr} to node {name}: {e}").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cluster_cidr_has_256_blocks_of_a_24() {
        let c = ClusterCidr::default();
        assert_eq!(c.blocks(), 256);
        assert_eq!(c.block(0), "10.244.0.0/24");
        assert_eq!(c.block(255), "10.244.255.0/24");
        assert_eq!(c.index_of("10.244.7.0/24"), Some(7));
    }

    #[test]
    fn cidrs_that_are_not_blocks_of_the_range_are_not_counted() {
        let c = ClusterCidr::default();
        assert_eq!(c.index_of("10.245.7.0/24"), None, "outside the range");
        assert_eq!(c.index_of("10.244.7.0/25"), None, "another mask");
        assert_eq!(c.index_of("10.244.7.5/24"), None, "not a block boundary");
        assert_eq!(c.index_of("garbage"), None);
    }

    #[test]
    fn a_full_range_has_nothing_free_and_a_freed_block_is_found_after_wrapping() {
        let c = ClusterCidr::new("10.0.0.0/22", 24).expect("valid");
        let used: HashSet<u32> = (0..4).collect();
        assert_eq!(c.next_free(2, &used), None);
        let some: HashSet<u32> = [0, 2, 3].into();
        assert_eq!(c.next_free(2, &some), Some(1));
    }

    #[test]
    fn bad_cluster_cidrs_are_rejected_with_the_reason() {
        let e = ClusterCidr::new("10.244.0.0", 24).expect_err("no prefix");
        assert!(e.to_string().contains("10.244.0.0/16"), "{e}");
        assert!(ClusterCidr::new("10.244.0.0/16", 12).is_err(), "node mask wider than the range");
        assert!(ClusterCidr::new("10.244.0.0/16", 31).is_err(), "no room for pods");
        assert!(ClusterCidr::new("fd00::/48", 64).is_err());
    }

    #[test]
    fn the_service_range_is_told_apart_from_the_cluster_cidr() {
        let c = ClusterCidr::default();
        assert!(!c.overlaps("10.96.0.0/16"));
        assert!(c.overlaps("10.244.3.0/24"));
        assert!(c.overlaps("10.0.0.0/8"));
    }
}
