//! The taint manager: deletes pods from nodes with `NoExecute` taints they do not tolerate, at
//! once, or when the shortest `tolerationSeconds` of the tolerations they use runs out (counted
//! from when this controller first saw the pod on the tainted node), as Kubernetes'
//! taint-eviction controller does. Pending evictions are engine timers (`RequeueAfter`), not polls.
//!
//! The node lifecycle controller's own taints (`node.kubernetes.io/unreachable` and
//! `node.kubernetes.io/not-ready`) are the exception: Kubernetes gives every pod 300 s tolerations
//! for them at admission, which Shepherd does not, so a pod that does not tolerate them itself is
//! left to the node lifecycle controller and its `--pod-eviction-seconds`. A pod that tolerates
//! them for a set time is deleted when that time is up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::{JsonPath, kinds};
use shepherd_api::{meta, opt_str_at};
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager};
use tokio::time::Instant;

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::nodelifecycle::UNREACHABLE_TAINT;
use crate::podutil;
use crate::scheduler::fit::{Effect, Taint, taints_of, tolerations_of};

/// The taint a node whose agent reports it not ready carries.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// Per pod key: its uid and when this controller first saw it on a node with a `NoExecute`
/// taint it tolerates only for a while.
type Scheduled = HashMap<String, (String, Instant)>;

fn lock(s: &Mutex<Scheduled>) -> MutexGuard<'_, Scheduled> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The taint manager. Pods are its primary kind; a node change enqueues the node's pods when the
/// node has a `NoExecute` taint or one of its pods has an eviction pending.
pub fn taint_manager(client: Arc<dyn Client>, manager: &Manager, config: ControllerConfig) -> Controller {
    let informers = manager.informers();
    let pods = informers.cache(&kinds::POD);
    let scheduled: Arc<Mutex<Scheduled>> = Arc::default();
    let reconciler = Arc::new(TaintManager {
        events: EventRecorder::new(client.clone(), "taint-eviction-controller"),
        client,
        pods: pods.clone(),
        nodes: informers.cache(&kinds::NODE),
        scheduled: scheduled.clone(),
    });
    Controller::new("taint-eviction", &kinds::POD, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    .watches(&kinds::NODE, move |node| {
        let name = opt_str_at(node, "/metadata/name").unwrap_or("");
        let keys: Vec<String> = pods.pod_views_by_node_name(name).iter().map(|p| p.key()).collect();
        let tainted = taints_of(node).iter().any(|t| t.effect == Effect::NoExecute);
        let pending = || {
            let s = lock(&scheduled);
            keys.iter().any(|k| s.contains_key(k))
        };
        if tainted || pending() { keys } else { Vec::new() }
    })
    .workers(config.workers)
    .mode(config.mode)
}

struct TaintManager {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    nodes: Arc<Cache>,
    events: EventRecorder,
    scheduled: Arc<Mutex<Scheduled>>,
}

fn is_lifecycle_taint(t: &Taint) -> bool {
    t.key == UNREACHABLE_TAINT || t.key == NOT_READY_TAINT
}

/// What the taints on a pod's node mean for it.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// No `NoExecute` taint applies (or all are tolerated for ever).
    Stay,
    /// Tolerated for this long.
    StayFor(Duration),
    /// A taint is not tolerated.
    Evict,
}

/// The verdict for a pod with these tolerations under these taints: per taint the first
/// toleration matching it is the one used; the shortest `tolerationSeconds` of those decides.
fn verdict(pod: &Value, taints: &[Taint]) -> Verdict {
    let tolerations = tolerations_of(pod);
    let mut shortest: Option<i64> = None;
    for taint in taints.iter().filter(|t| t.effect == Effect::NoExecute) {
        match tolerations.iter().find(|tol| tol.tolerates(taint)) {
            None if is_lifecycle_taint(taint) => {}
            None => return Verdict::Evict,
            Some(tol) => {
                if let Some(s) = tol.seconds {
                    shortest = Some(shortest.map_or(s, |m| m.min(s)));
                }
            }
        }
    }
    match shortest {
        None => Verdict::Stay,
        Some(s) if s <= 0 => Verdict::Evict,
        Some(s) => Verdict::StayFor(Duration::from_secs(s as u64)),
    }
}

impl TaintManager {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let forget = || {
            lock(&self.scheduled).remove(key);
            Ok(Action::Done)
        };
        // Every change of every pod comes here: the view answers for the pods on nodes without a
        // `NoExecute` taint, and only the others are read whole (for their tolerations).
        let Some(view) = self.pods.pod_view(key) else { return forget() };
        if view.is_deleting() || matches!(view.phase(), "Succeeded" | "Failed") {
            return forget();
        }
        let node_name = view.node_name().unwrap_or("");
        let Some(node) = self.nodes.get(node_name) else { return forget() };
        let taints = taints_of(&node);
        if !taints.iter().any(|t| t.effect == Effect::NoExecute) {
            return forget();
        }
        let Some(pod) = self.pods.get(key).filter(|p| meta::uid(p) == view.uid()) else { return forget() };
        let uid = meta::uid(&pod).to_string();
        let wait = match verdict(&pod, &taints) {
            Verdict::Stay => return forget(),
            Verdict::Evict => Duration::ZERO,
            Verdict::StayFor(limit) => {
                let now = Instant::now();
                let since = {
                    let mut s = lock(&self.scheduled);
                    let entry = s.entry(key.to_string()).or_insert_with(|| (uid.clone(), now));
                    if entry.0 != uid {
                        *entry = (uid.clone(), now);
                    }
                    entry.1
                };
                limit.saturating_sub(now.saturating_duration_since(since))
            }
        };
        if !wait.is_zero() {
            return Ok(Action::RequeueAfter(wait));
        }
        let (ns, name) = key.split_once('/').ok_or_else(|| format!("pod key {key:?} has no namespace"))?;
        if !self.mark_disruption_target(&pod, ns).await? {
            // The pod changed since the cache showed it; its newer version reconciles it again.
            return Ok(Action::Done);
        }
        self.events.record(&pod, EventType::Normal, "TaintManagerEviction", &format!("Marking for deletion Pod {key}")).await;
        let params = DeleteParams { precondition_uid: Some(uid), ..Default::default() };
        match self.client.delete(&kinds::POD, Some(ns), name, &params).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => return Err(format!("deleting pod {key} from tainted node {node_name}: {e}").into()),
        }
        forget()
    }

    /// Records why the pod is going (the `DisruptionTarget` condition Kubernetes sets), so it
    /// shows while the pod terminates. False when the pod changed since the cache showed it.
    async fn mark_disruption_target(&self, pod: &Value, ns: &str) -> Result<bool, Error> {
        let mut updated = pod.clone();
        let mut conditions: Vec<Value> = pod.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        conditions.retain(|c| opt_str_at(c, "/type") != Some("DisruptionTarget"));
        conditions.push(json!({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": podutil::format_time(podutil::now())}));
        if !updated.get("status").is_some_and(Value::is_object) {
            updated["status"] = json!({});
        }
        updated["status"]["conditions"] = Value::Array(conditions);
        match self.client.update_status(&kinds::POD, Some(ns), updated).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_conflict() || e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: Value) -> Vec<Taint> {
        taints_of(&json!({"spec": {"taints": taints}}))
    }

    fn pod(tolerations: Value) -> Value {
        json!({"spec": {"tolerations": tolerations}})
    }

    #[test]
    fn an_untolerated_no_execute_taint_evicts_and_other_effects_do_not() {
        let taints = node(json!([{"key": "k", "value": "v", "effect": "NoExecute"}]));
        assert_eq!(verdict(&pod(json!([])), &taints), Verdict::Evict);
        let no_schedule = node(json!([{"key": "k", "effect": "NoSchedule"}]));
        assert_eq!(verdict(&pod(json!([])), &no_schedule), Verdict::Stay);
    }

    #[test]
    fn the_shortest_toleration_seconds_of_the_tolerations_used_decides() {
        let taints = node(json!([{"key": "a", "effect": "NoExecute"}, {"key": "b", "effect": "NoExecute"}]));
        let tolerations = json!([
            {"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "b", "operator": "Exists", "tolerationSeconds": 10},
        ]);
        assert_eq!(verdict(&pod(tolerations), &taints), Verdict::StayFor(Duration::from_secs(10)));
        let forever = json!([{"operator": "Exists"}]);
        assert_eq!(verdict(&pod(forever), &taints), Verdict::Stay);
        let zero = json!([{"operator": "Exists", "tolerationSeconds": 0}]);
        assert_eq!(verdict(&pod(zero), &taints), Verdict::Evict);
    }

    #[test]
    fn node_lifecycle_taints_are_left_to_the_node_lifecycle_controller_unless_tolerated_for_a_time() {
        let taints = node(json!([{"key": UNREACHABLE_TAINT, "effect": "NoExecute"}]));
        assert_eq!(verdict(&pod(json!([])), &taints), Verdict::Stay);
        let brief = json!([{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]);
        assert_eq!(verdict(&pod(brief), &taints), Verdict::StayFor(Duration::from_secs(5)));
    }
}
