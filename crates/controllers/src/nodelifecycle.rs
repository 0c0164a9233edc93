//! The node lifecycle controller: notices nodes whose agent stopped heartbeating, marks them
//! `Ready=Unknown` and unreachable, and after the eviction timeout fails and deletes their pods so
//! their owners replace them elsewhere. A deleted Node's pods go the same way.
//!
//! Freshness is judged by when this controller last *saw* a node's Lease change, on its own
//! monotonic clock, not by the `renewTime` the agent wrote: a node whose clock is skewed is
//! neither evicted early nor kept forever, and the paused test clock drives it exactly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::{JsonPath, str_at};
use shepherd_api::kinds;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Change, Client, Controller, DeleteParams, Manager, Patch};
use tokio::time::Instant;

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};

/// The taint an unreachable node carries; NoSchedule keeps new pods off it, NoExecute records
/// that its pods are being evicted.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// How the node lifecycle controller runs.
#[derive(Debug, Clone)]
pub struct NodeLifecycleConfig {
    pub run: ControllerConfig,
    /// A node whose lease has not changed for this long is `Ready=Unknown` (`--node-monitor-grace-period`).
    pub grace_period: Duration,
    /// How long a node stays unknown before its pods are failed and deleted (`--pod-eviction-timeout`).
    pub eviction_timeout: Duration,
    /// Where node agents keep their leases, one named after each node.
    pub lease_namespace: String,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            run: ControllerConfig::default(),
            grace_period: Duration::from_secs(40),
            eviction_timeout: Duration::from_secs(60),
            lease_namespace: "kube-node-lease".into(),
        }
    }
}

#[derive(Default)]
struct Heartbeats {
    /// Per node: the lease's last `renewTime` (and holder) and when this controller saw it change.
    lease_seen: HashMap<String, (String, Instant)>,
    /// Per node: when this controller first judged it unknown.
    unknown_since: HashMap<String, Instant>,
}

struct NodeLifecycle {
    client: Arc<dyn Client>,
    nodes: Arc<Cache>,
    pods: Arc<Cache>,
    events: EventRecorder,
    heartbeats: Arc<Mutex<Heartbeats>>,
    grace_period: Duration,
    eviction_timeout: Duration,
}

fn lock(h: &Mutex<Heartbeats>) -> MutexGuard<'_, Heartbeats> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}


fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The node lifecycle controller. Lease changes are recorded (with the time they were seen) by a
/// subscription made here, ahead of the controller's own, so the reconcile a lease change causes
/// already counts it.
pub fn node_lifecycle_controller(client: Arc<dyn Client>, manager: &Manager, config: NodeLifecycleConfig) -> Controller {
    let informers = manager.informers();
    let heartbeats: Arc<Mutex<Heartbeats>> = Arc::default();
    let lease_ns = config.lease_namespace.clone();
    {
        let (h, ns) = (heartbeats.clone(), lease_ns.clone());
        informers.informer(&kinds::LEASE).subscribe(move |change| {
            let lease = change.object();
            if matches!(change, Change::Deleted(_)) || str_at(lease, "/metadata/namespace") != ns {
                return;
            }
            let node = str_at(lease, "/metadata/name").to_string();
            let marker = format!("{}|{}", str_at(lease, "/spec/renewTime"), str_at(lease, "/spec/holderIdentity"));
            let mut h = lock(&h);
            if h.lease_seen.get(&node).is_none_or(|(m, _)| *m != marker) {
                h.lease_seen.insert(node, (marker, Instant::now()));
            }
        });
    }
    let nodes = informers.cache(&kinds::NODE);
    let watched = heartbeats.clone();
    let reconciler = Arc::new(NodeLifecycle {
        events: EventRecorder::new(client.clone(), "node-controller"),
        client,
        nodes: nodes.clone(),
        pods: informers.cache(&kinds::POD),
        heartbeats,
        grace_period: config.grace_period,
        eviction_timeout: config.eviction_timeout,
    });
    Controller::new("nodelifecycle", &kinds::NODE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    // A renewal of a node's Lease only moves the moment its node would expire, and each node's key
    // is already due then (its last reconcile asked to be requeued at that moment): reconciling
    // every renewal (all nodes, every 10 s) would change nothing. The reconcile a Lease still
    // needs is that of a node judged unknown, whose renewal may bring it back.
    .watches(&kinds::LEASE, move |lease| {
        let node = str_at(lease, "/metadata/name");
        if str_at(lease, "/metadata/namespace") == lease_ns && lock(&watched).unknown_since.contains_key(node) {
            vec![node.to_string()]
        } else {
            Vec::new()
        }
    })
    // A pod bound to a node that does not exist (any more) is that node's business too.
    .watches(&kinds::POD, move |pod| {
        let node = str_at(pod, "/spec/nodeName");
        if !node.is_empty() && nodes.get(node).is_none() { vec![node.to_string()] } else { Vec::new() }
    })
    .workers(config.run.workers)
    .mode(config.run.mode)
}

fn ready_status(node: &Value) -> &str {
    node.at("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| str_at(c, "/type") == "Ready"))
        .map(|c| str_at(c, "/status"))
        .unwrap_or("")
}

fn is_unreachable_taint(t: &Value) -> bool {
    str_at(t, "/key") == UNREACHABLE_TAINT
}

fn has_unreachable_taints(node: &Value) -> (bool, bool) {
    let taints = node.at("/spec/taints").and_then(Value::as_array);
    let has = |effect: &str| taints.is_some_and(|ts| ts.iter().any(|t| is_unreachable_taint(t) && str_at(t, "/effect") == effect));
    (has("NoSchedule"), has("NoExecute"))
}

impl NodeLifecycle {
    async fn reconcile(&self, name: &str) -> Result<Action, Error> {
        let now = Instant::now();
        let Some(node) = self.nodes.get(name) else {
            {
                let mut h = lock(&self.heartbeats);
                h.lease_seen.remove(name);
                h.unknown_since.remove(name);
            }
            self.evict_pods(name, &format!("Node {name} was deleted")).await?;
            return Ok(Action::Done);
        };
        // A node never seen heartbeating gets a full grace period from when it was first seen.
        let seen = {
            let mut h = lock(&self.heartbeats);
            h.lease_seen.entry(name.to_string()).or_insert_with(|| (String::new(), now)).1
        };
        let silent = now.saturating_duration_since(seen);
        if silent < self.grace_period {
            lock(&self.heartbeats).unknown_since.remove(name);
            let (no_schedule, no_execute) = has_unreachable_taints(&node);
            if ready_status(&node) == "True" && (no_schedule || no_execute) {
                self.set_unreachable_taints(&node, false).await?;
                self.events.record(&node, EventType::Normal, "NodeReady", &format!("Node {name} status is now: NodeReady")).await;
            }
            // Check again the moment the lease would expire.
            return Ok(Action::RequeueAfter(self.grace_period - silent + Duration::from_millis(1)));
        }

        let node = if ready_status(&node) != "Unknown" { self.mark_unknown(&node).await? } else { (*node).clone() };
        let (no_schedule, no_execute) = has_unreachable_taints(&node);
        if !(no_schedule && no_execute) {
            self.set_unreachable_taints(&node, true).await?;
        }
        let since = *lock(&self.heartbeats).unknown_since.entry(name.to_string()).or_insert(now);
        let unknown_for = now.saturating_duration_since(since);
        if unknown_for < self.eviction_timeout {
            return Ok(Action::RequeueAfter(self.eviction_timeout - unknown_for + Duration::from_millis(1)));
        }
        if !self.pods.pod_views_by_node_name(name).is_empty() {
            self.events.record(&node, EventType::Normal, "DeletingAllPods", &format!("Deleting all Pods from Node {name}.")).await;
        }
        self.evict_pods(name, &format!("Node {name} which was running the pod is unresponsive")).await?;
        Ok(Action::Done)
    }

    /// Sets the Ready condition to Unknown and records NodeNotReady; returns the node as written.
    async fn mark_unknown(&self, node: &Value) -> Result<Value, Error> {
        let name = str_at(node, "/metadata/name");
        let mut updated = node.clone();
        let now = now_rfc3339();
        let unknown = |previous: Option<&Value>| {
            json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.", "lastTransitionTime": now,
                "lastHeartbeatTime": previous.and_then(|p| p.get("lastHeartbeatTime")).cloned().unwrap_or(Value::Null)})
        };
        let mut conditions: Vec<Value> = node.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        match conditions.iter_mut().find(|c| str_at(c, "/type") == "Ready") {
            Some(c) => *c = unknown(Some(c)),
            None => conditions.push(unknown(None)),
        }
        if !updated.get("status").is_some_and(Value::is_object) {
            updated["status"] = json!({});
        }
        updated["status"]["conditions"] = Value::Array(conditions);
        let written = self.client.update_status(&kinds::NODE, None, updated).await?;
        self.events.record(&written, EventType::Normal, "NodeNotReady", &format!("Node {name} status is now: NodeNotReady")).await;
        Ok(written)
    }

    /// Adds (or removes) the unreachable NoSchedule and NoExecute taints, preserving all others.
    async fn set_unreachable_taints(&self, node: &Value, present: bool) -> Result<(), Error> {
        let mut taints: Vec<Value> =
            node.at("/spec/taints").and_then(Value::as_array).cloned().unwrap_or_default().into_iter().filter(|t| !is_unreachable_taint(t)).collect();
        if present {
            let now = now_rfc3339();
            taints.push(json!({"key": UNREACHABLE_TAINT, "effect": "NoSchedule", "timeAdded": now}));
            taints.push(json!({"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": now}));
        }
        let mut updated = node.clone();
        if !updated.get("spec").is_some_and(Value::is_object) {
            updated["spec"] = json!({});
        }
        updated["spec"]["taints"] = Value::Array(taints);
        self.client.update(&kinds::NODE, None, updated).await?;
        Ok(())
    }

    /// Marks every pod bound to `node` Failed (reason NodeLost) and deletes it at once, so its
    /// owner replaces it on another node.
    async fn evict_pods(&self, node: &str, message: &str) -> Result<(), Error> {
        let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
        for pod in self.pods.pod_views_by_node_name(node) {
            let key = pod.key();
            let Some((ns, name)) = key.split_once('/') else { continue };
            if !matches!(pod.phase(), "Failed" | "Succeeded") {
                let status = json!({"status": {"phase": "Failed", "reason": "NodeLost", "message": message}});
                match self.client.patch_status(&kinds::POD, Some(ns), name, Patch::Merge(status)).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(format!("marking pod {key} failed: {e}").into()),
                }
            }
            match self.client.delete(&kinds::POD, Some(ns), name, &now).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(format!("deleting pod {key} from lost node {node}: {e}").into()),
            }
        }
        Ok(())
    }
}
