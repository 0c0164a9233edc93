//! The scheduler's view of the cluster: a typed summary per node and what every placed pod
//! occupies there, kept current from informer events rather than recomputed per pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;
use shepherd_api::JsonPath;
use shepherd_runtime::Change;
use shepherd_runtime::cache::object_key;

use super::fit::{NodeSummary, PodNeeds, Resources, TieBreak, Usage, unschedulable_message};

/// Clusters of up to this many nodes have every node weighed for every pod; larger ones never
/// have fewer feasible nodes scored (kube-scheduler's `minFeasibleNodesToFind`).
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// The smallest share of a large cluster, in percent, whose feasible nodes are scored
/// (kube-scheduler's `minFeasibleNodesPercentageToFind`).
const MIN_FEASIBLE_NODES_PERCENTAGE: usize = 5;

/// How many feasible nodes the search collects before it stops and scores them: all of a small
/// cluster; of a larger one a share that shrinks as the cluster grows, since past a hundred or so
/// candidates a better node is rarely found but every extra node still costs a filter and a
/// score. The share is kube-scheduler's adaptive `percentageOfNodesToScore`: 50% less one point
/// per 125 nodes, at least 5%.
fn feasible_nodes_to_find(all_nodes: usize) -> usize {
    if all_nodes <= MIN_FEASIBLE_NODES_TO_FIND {
        return all_nodes;
    }
    let percentage = 50usize.saturating_sub(all_nodes / 125).max(MIN_FEASIBLE_NODES_PERCENTAGE);
    (all_nodes * percentage / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// A controlling owner's uid as a small number; see [`OwnerIds`].
type OwnerId = u64;

/// Owner uids numbered while placed pods name them, so that a node's count of one owner's pods
/// is a binary search over integers rather than hashing the uid again for every node a pod is
/// weighed against.
#[derive(Debug, Default)]
struct OwnerIds {
    /// The number and how many placements hold it.
    ids: HashMap<String, (OwnerId, usize)>,
    next: OwnerId,
}

impl OwnerIds {
    fn get(&self, uid: &str) -> Option<OwnerId> {
        self.ids.get(uid).map(|(id, _)| *id)
    }

    fn acquire(&mut self, uid: &str) -> OwnerId {
        if let Some((id, holders)) = self.ids.get_mut(uid) {
            *holders += 1;
            return *id;
        }
        let id = self.next;
        self.next += 1;
        self.ids.insert(uid.to_string(), (id, 1));
        id
    }

    fn release(&mut self, uid: &str) {
        if let Some((_, holders)) = self.ids.get_mut(uid) {
            *holders -= 1;
            if *holders == 0 {
                self.ids.remove(uid);
            }
        }
    }
}

#[derive(Debug)]
struct NodeEntry {
    name: String,
    /// `None` once the Node is deleted while pods are still accounted to it.
    summary: Option<NodeSummary>,
    requested: Resources,
    scoring: Resources,
    /// Pods per controlling owner, for spreading; sorted by owner.
    owners: Vec<(OwnerId, u32)>,
}

impl NodeEntry {
    fn new(name: &str) -> NodeEntry {
        NodeEntry {
            name: name.to_string(),
            summary: None,
            requested: Resources::default(),
            scoring: Resources::default(),
            owners: Vec::new(),
        }
    }

    fn add(&mut self, u: &Usage, owner: Option<OwnerId>) {
        self.requested.add(&u.requests);
        self.scoring.add(&u.scoring);
        if let Some(o) = owner {
            match self.owners.binary_search_by_key(&o, |(id, _)| *id) {
                Ok(i) => self.owners[i].1 += 1,
                Err(i) => self.owners.insert(i, (o, 1)),
            }
        }
    }

    fn remove(&mut self, u: &Usage, owner: Option<OwnerId>) {
        self.requested.sub(&u.requests);
        self.scoring.sub(&u.scoring);
        if let Some(o) = owner
            && let Ok(i) = self.owners.binary_search_by_key(&o, |(id, _)| *id)
        {
            self.owners[i].1 = self.owners[i].1.saturating_sub(1);
            if self.owners[i].1 == 0 {
                self.owners.remove(i);
            }
        }
    }

    /// How many pods of `owner` the node runs.
    fn pods_of(&self, owner: Option<OwnerId>) -> u32 {
        owner
            .and_then(|o| self.owners.binary_search_by_key(&o, |(id, _)| *id).ok())
            .map_or(0, |i| self.owners[i].1)
    }

    /// Neither a Node nor any pod keeps this entry.
    fn is_unused(&self) -> bool {
        self.summary.is_none() && self.requested.pods <= 0
    }
}

#[derive(Debug)]
struct Placement {
    node: String,
    usage: Usage,
    /// The number of `usage.owner`, held while the pod is placed.
    owner: Option<OwnerId>,
    /// Bound (or being bound) by this scheduler, not yet seen bound in the pod cache.
    assumed: bool,
}

/// The outcome of evaluating one pod against the nodes.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Assumed onto this node; bind it.
    Place(String),
    /// No node fits; the message says why, per group of nodes.
    Unschedulable(String),
    /// Already placed (assumed or bound): nothing to do.
    AlreadyPlaced,
}

#[derive(Debug, Default)]
pub(crate) struct ClusterState {
    /// Every Node, and every deleted one that pods are still accounted to, in the order the
    /// feasibility search walks them.
    nodes: Vec<NodeEntry>,
    /// Where each node is in `nodes`.
    slots: HashMap<String, usize>,
    /// How many entries of `nodes` have a summary: the cluster size the search is sized by.
    live_nodes: usize,
    /// Where the next feasibility search starts: just past the last node the previous one looked
    /// at (kube-scheduler's `nextStartNodeIndex`), so that when a large cluster is searched only
    /// in part, successive pods see different nodes and every node gets its turn.
    next_start: usize,
    owner_ids: OwnerIds,
    placements: HashMap<String, Placement>,
    /// Unschedulable pods waiting for a node or pod change that might make room.
    pub pending: BTreeSet<String>,
    /// The last FailedScheduling message recorded per pod, so a retry with the same outcome does
    /// not record it again.
    pub reported: HashMap<String, String>,
}

fn is_terminal(pod: &Value) -> bool {
    matches!(pod.at("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"))
}

impl ClusterState {
    /// The node's entry, added (without a summary) if it has none yet.
    fn node_entry(&mut self, name: &str) -> &mut NodeEntry {
        let slot = match self.slots.get(name) {
            Some(&slot) => slot,
            None => {
                self.nodes.push(NodeEntry::new(name));
                self.slots.insert(name.to_string(), self.nodes.len() - 1);
                self.nodes.len() - 1
            }
        };
        &mut self.nodes[slot]
    }

    /// Drops the node's entry once neither its Node nor any pod keeps it. The last entry takes its
    /// place, which moves one node in the search order and nothing else.
    fn drop_node_if_unused(&mut self, name: &str) {
        let Some(&slot) = self.slots.get(name) else { return };
        if !self.nodes[slot].is_unused() {
            return;
        }
        self.slots.remove(name);
        self.nodes.swap_remove(slot);
        if let Some(moved) = self.nodes.get(slot) {
            self.slots.insert(moved.name.clone(), slot);
        }
    }

    fn place(&mut self, key: &str, node: &str, usage: Usage, assumed: bool) {
        self.unplace(key);
        let owner = usage.owner.as_deref().map(|o| self.owner_ids.acquire(o));
        self.node_entry(node).add(&usage, owner);
        self.placements.insert(key.to_string(), Placement { node: node.to_string(), usage, owner, assumed });
    }

    /// Removes a pod's accounting; true if it occupied a node.
    fn unplace(&mut self, key: &str) -> bool {
        let Some(p) = self.placements.remove(key) else { return false };
        if let Some(&slot) = self.slots.get(&p.node) {
            self.nodes[slot].remove(&p.usage, p.owner);
            self.drop_node_if_unused(&p.node);
        }
        if let Some(o) = &p.usage.owner {
            self.owner_ids.release(o);
        }
        true
    }

    /// Applies a pod change; true when it freed room on a node (pending pods may now fit).
    pub fn on_pod(&mut self, change: &Change) -> bool {
        let obj = change.object();
        let Some(key) = object_key(obj) else { return false };
        match change {
            Change::Deleted(_) => {
                self.pending.remove(&key);
                self.reported.remove(&key);
                self.unplace(&key)
            }
            Change::Added(_) | Change::Updated { .. } => {
                if is_terminal(obj) {
                    return self.unplace(&key);
                }
                let node = obj.at("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
                if node.is_empty() {
                    // An older copy of a pod this scheduler just bound: keep the assumption.
                    return false;
                }
                let same = self.placements.get(&key).is_some_and(|p| p.node == node);
                if same {
                    if let Some(p) = self.placements.get_mut(&key) {
                        p.assumed = false;
                    }
                } else {
                    self.place(&key, node, Usage::of(obj), false);
                }
                false
            }
        }
    }

    /// Applies a node change; true when the node's scheduling-relevant state changed.
    pub fn on_node(&mut self, change: &Change) -> bool {
        let obj = change.object();
        let Some(name) = object_key(obj) else { return false };
        match change {
            Change::Deleted(_) => {
                if let Some(&slot) = self.slots.get(&name)
                    && self.nodes[slot].summary.take().is_some()
                {
                    self.live_nodes -= 1;
                }
                self.drop_node_if_unused(&name);
                false
            }
            Change::Added(_) | Change::Updated { .. } => {
                let summary = NodeSummary::of(obj);
                let entry = self.node_entry(&name);
                if entry.summary.as_ref() == Some(&summary) {
                    return false;
                }
                if entry.summary.replace(summary).is_none() {
                    self.live_nodes += 1;
                }
                true
            }
        }
    }

    /// Whether this pod is accounted only as an assumption (bound by us, not yet seen bound).
    pub fn forget_assumed(&mut self, key: &str) {
        if self.placements.get(key).is_some_and(|p| p.assumed) {
            self.unplace(key);
        }
    }

    pub fn is_placed(&self, key: &str) -> bool {
        self.placements.contains_key(key)
    }

    /// Filters the nodes for `pod`, starting where the previous search stopped, until enough are
    /// feasible (see [`feasible_nodes_to_find`]; every node in a cluster of up to a hundred), and
    /// scores those. On success assumes the pod onto the best node before returning, so the next
    /// pod evaluated already sees it there. A pod that fits nowhere was checked against every
    /// node, so its message accounts for all of them.
    pub fn decide(&mut self, key: &str, pod: &PodNeeds) -> Decision {
        if self.is_placed(key) {
            return Decision::AlreadyPlaced;
        }
        let owner = pod.usage.owner.as_deref().and_then(|o| self.owner_ids.get(o));
        let wanted = feasible_nodes_to_find(self.live_nodes);
        let start = if self.nodes.is_empty() { 0 } else { self.next_start % self.nodes.len() };
        let mut reasons = BTreeMap::new();
        let mut feasible: Vec<(&NodeEntry, i64, u32)> = Vec::with_capacity(wanted);
        let mut looked_at = 0;
        for entry in self.nodes[start..].iter().chain(&self.nodes[..start]) {
            looked_at += 1;
            let Some(summary) = &entry.summary else { continue };
            if pod.filter(&entry.name, summary, &entry.requested, |r| *reasons.entry(r).or_default() += 1) {
                feasible.push((entry, pod.resource_score(summary, &entry.scoring), entry.pods_of(owner)));
                if feasible.len() >= wanted {
                    break;
                }
            }
        }
        self.next_start = start + looked_at;
        if feasible.is_empty() {
            let message = unschedulable_message(self.live_nodes, &reasons);
            self.pending.insert(key.to_string());
            return Decision::Unschedulable(message);
        }
        // Spreading: fewer pods of the same owner scores higher, weighted above the resource
        // scores so that replicas land on distinct nodes while there are any.
        let most = feasible.iter().map(|f| f.2).max().unwrap_or(0);
        let tie_break = TieBreak::new(&pod.name);
        let mut best: Option<(i64, u64, &str)> = None;
        for &(entry, resources, same) in &feasible {
            let spread = if most == 0 { 100 } else { i64::from(most - same) * 100 / i64::from(most) };
            let score = resources + 3 * spread;
            // The tie-break is hashed only for a node that can still win.
            if best.is_some_and(|(top, _, _)| score < top) {
                continue;
            }
            let candidate = (score, tie_break.node(&entry.name), entry.name.as_str());
            if best.is_none_or(|b| candidate > b) {
                best = Some(candidate);
            }
        }
        let Some((_, _, node)) = best else {
            return Decision::Unschedulable(unschedulable_message(self.live_nodes, &reasons));
        };
        let node = node.to_string();
        self.pending.remove(key);
        self.place(key, &node, pod.usage.clone(), true);
        Decision::Place(node)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn add_node(state: &mut ClusterState, name: &str, labels: Value) {
        state.on_node(&Change::Added(Arc::new(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "32", "memory": "64Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]},
        }))));
    }

    fn cluster(nodes: usize) -> ClusterState {
        let mut state = ClusterState::default();
        for i in 0..nodes {
            add_node(&mut state, &format!("node-{i:04}"), json!({"host": format!("node-{i:04}")}));
        }
        state
    }

    /// A pod requesting 100m and 128Mi, controlled by `owner`, with `extra` merged into its spec.
    fn pod(name: &str, owner: &str, extra: Value) -> PodNeeds {
        let mut spec = json!({"containers": [{"name": "app", "image": "web:1",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        PodNeeds::of(&json!({"metadata": {"name": name, "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": owner, "controller": true}]},
            "spec": spec}))
    }

    fn place(state: &mut ClusterState, name: &str, pod: &PodNeeds) -> String {
        match state.decide(&format!("default/{name}"), pod) {
            Decision::Place(node) => node,
            other => panic!("pod {name} was not placed: {other:?}"),
        }
    }

    #[test]
    fn the_share_of_nodes_searched_shrinks_with_the_cluster_but_never_below_a_hundred() {
        let cases = [(0, 0), (3, 3), (100, 100), (101, 100), (250, 120), (1_000, 420), (5_000, 500), (6_000, 300), (20_000, 1_000)];
        for (all, wanted) in cases {
            assert_eq!(feasible_nodes_to_find(all), wanted, "{all} nodes");
        }
    }

    #[test]
    fn pods_spread_evenly_over_a_thousand_nodes_though_each_sees_only_some() {
        let mut state = cluster(1_000);
        let mut per_node: HashMap<String, usize> = HashMap::new();
        for i in 0..10_000 {
            let name = format!("web-{i}");
            *per_node.entry(place(&mut state, &name, &pod(&name, &format!("rs-{}", i % 50), json!({})))).or_default() += 1;
        }
        let (fewest, most) = (per_node.values().min().copied(), per_node.values().max().copied());
        assert_eq!(per_node.len(), 1_000, "every node got pods");
        assert!(fewest >= Some(8) && most <= Some(12), "10 pods per node on average, but {fewest:?}..={most:?}");
    }

    #[test]
    fn a_pod_that_fits_one_node_of_a_thousand_finds_it_wherever_the_search_starts() {
        let mut state = cluster(1_000);
        for i in 0..25 {
            // Ordinary pods move the start; the selective pod wants the node looked at last.
            let name = format!("web-{i}");
            place(&mut state, &name, &pod(&name, "rs-web", json!({})));
            let last = state.nodes[(state.next_start + state.nodes.len() - 1) % state.nodes.len()].name.clone();
            let name = format!("pinned-{i}");
            let pinned = pod(&name, "rs-pinned", json!({"nodeSelector": {"host": last}}));
            assert_eq!(place(&mut state, &name, &pinned), last);
        }
    }

    #[test]
    fn a_cluster_of_a_hundred_nodes_weighs_every_node_for_every_pod() {
        let mut state = cluster(100);
        // One busy pod on every node but one: the idle node is the best for any next pod, and
        // must be found whatever node the search starts at.
        for i in 0..99 {
            let name = format!("busy-{i}");
            let busy = pod(&name, "rs-busy", json!({"nodeSelector": {"host": format!("node-{:04}", (i + 38) % 100)}}));
            place(&mut state, &name, &busy);
        }
        for start in (0..100).step_by(17) {
            state.next_start = start;
            let name = format!("web-{start}");
            let web = pod(&name, "rs-web", json!({}));
            assert_eq!(place(&mut state, &name, &web), "node-0037", "starting at node {start}");
            state.forget_assumed(&format!("default/{name}"));
        }
    }

    #[test]
    fn an_unschedulable_pod_is_checked_against_every_node() {
        let mut state = cluster(1_000);
        let nowhere = pod("nowhere", "rs-x", json!({"nodeSelector": {"host": "none"}}));
        match state.decide("default/nowhere", &nowhere) {
            Decision::Unschedulable(message) => {
                assert_eq!(message, "0/1000 nodes are available: 1000 node(s) didn't match Pod's node affinity/selector.")
            }
            other => panic!("{other:?}"),
        }
    }
}
