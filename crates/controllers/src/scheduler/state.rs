//! The scheduler's view of the cluster: a typed summary per node and what every placed pod
//! occupies there, kept current from informer events rather than recomputed per pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;
use shepherd_runtime::Change;
use shepherd_runtime::cache::object_key;

use super::fit::{NodeSummary, PodNeeds, Resources, Unfit, Usage, tie_break, unschedulable_message};

#[derive(Debug, Default)]
struct NodeEntry {
    /// `None` once the Node is deleted while pods are still accounted to it.
    summary: Option<NodeSummary>,
    requested: Resources,
    scoring: Resources,
    /// Pods per controlling owner uid, for spreading.
    owners: HashMap<String, u32>,
}

impl NodeEntry {
    fn add(&mut self, u: &Usage) {
        self.requested.add(&u.requests);
        self.scoring.add(&u.scoring);
        if let Some(o) = &u.owner {
            *self.owners.entry(o.clone()).or_default() += 1;
        }
    }

    fn remove(&mut self, u: &Usage) {
        self.requested.sub(&u.requests);
        self.scoring.sub(&u.scoring);
        if let Some(o) = &u.owner
            && let Some(n) = self.owners.get_mut(o)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.owners.remove(o);
            }
        }
    }
}

#[derive(Debug)]
struct Placement {
    node: String,
    usage: Usage,
    /// Bound (or being bound) by this scheduler, not yet seen bound in the pod cache.
    assumed: bool,
}

/// The outcome of evaluating one pod against every node.
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
    nodes: HashMap<String, NodeEntry>,
    placements: HashMap<String, Placement>,
    /// Unschedulable pods waiting for a node or pod change that might make room.
    pub pending: BTreeSet<String>,
    /// The last FailedScheduling message recorded per pod, so a retry with the same outcome does
    /// not record it again.
    pub reported: HashMap<String, String>,
}

fn is_terminal(pod: &Value) -> bool {
    matches!(pod.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"))
}

impl ClusterState {
    fn place(&mut self, key: &str, node: &str, usage: Usage, assumed: bool) {
        self.unplace(key);
        self.nodes.entry(node.to_string()).or_default().add(&usage);
        self.placements.insert(key.to_string(), Placement { node: node.to_string(), usage, assumed });
    }

    /// Removes a pod's accounting; true if it occupied a node.
    fn unplace(&mut self, key: &str) -> bool {
        let Some(p) = self.placements.remove(key) else { return false };
        if let Some(entry) = self.nodes.get_mut(&p.node) {
            entry.remove(&p.usage);
            if entry.summary.is_none() && entry.requested.pods <= 0 {
                self.nodes.remove(&p.node);
            }
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
                let node = obj.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
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
                if let Some(entry) = self.nodes.get_mut(&name) {
                    entry.summary = None;
                    if entry.requested.pods <= 0 {
                        self.nodes.remove(&name);
                    }
                }
                false
            }
            Change::Added(_) | Change::Updated { .. } => {
                let summary = NodeSummary::of(obj);
                let entry = self.nodes.entry(name).or_default();
                if entry.summary.as_ref() == Some(&summary) {
                    return false;
                }
                entry.summary = Some(summary);
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

    /// Filters and scores every node for `pod`; on success assumes the pod onto the best node
    /// before returning, so the next pod evaluated already sees it there.
    pub fn decide(&mut self, key: &str, pod: &PodNeeds) -> Decision {
        if self.is_placed(key) {
            return Decision::AlreadyPlaced;
        }
        let mut reasons: BTreeMap<Unfit, usize> = BTreeMap::new();
        let mut feasible: Vec<(&str, i64, u32)> = Vec::new();
        let mut total = 0;
        let owner = pod.usage.owner.as_deref();
        for (name, entry) in &self.nodes {
            let Some(summary) = &entry.summary else { continue };
            total += 1;
            match pod.filter(name, summary, &entry.requested) {
                Ok(()) => {
                    let same_owner = owner.and_then(|o| entry.owners.get(o)).copied().unwrap_or(0);
                    feasible.push((name, pod.resource_score(summary, &entry.scoring), same_owner));
                }
                Err(why) => why.into_iter().for_each(|r| *reasons.entry(r).or_default() += 1),
            }
        }
        if feasible.is_empty() {
            self.pending.insert(key.to_string());
            return Decision::Unschedulable(unschedulable_message(total, &reasons));
        }
        // Spreading: fewer pods of the same owner scores higher, weighted above the resource
        // scores so that replicas land on distinct nodes while there are any.
        let most = feasible.iter().map(|f| f.2).max().unwrap_or(0);
        let best = feasible
            .iter()
            .map(|(name, resources, same)| {
                let spread = if most == 0 { 100 } else { i64::from(most - same) * 100 / i64::from(most) };
                (resources + 3 * spread, tie_break(&pod.name, name), *name)
            })
            .max()
            .map(|(_, _, name)| name.to_string());
        let Some(node) = best else {
            return Decision::Unschedulable(unschedulable_message(total, &reasons));
        };
        self.pending.remove(key);
        self.place(key, &node, pod.usage.clone(), true);
        Decision::Place(node)
    }
}
