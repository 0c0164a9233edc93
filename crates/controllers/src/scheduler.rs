//! The scheduler: binds each pod without a node to the best node that can run it.
//!
//! Filters (a node must pass all): Ready and not cordoned; every NoSchedule/NoExecute taint
//! tolerated; `nodeSelector` and required node affinity; cpu, memory and pod count against
//! allocatable minus what placed pods request. Scores: least allocated, balanced cpu/memory,
//! spreading pods of one owner; ties broken by a hash of pod and node names. Past a hundred
//! nodes, as in kube-scheduler, the search stops once a share of the cluster has been found
//! feasible (50% less a point per 125 nodes, at least 5% and at least 100 nodes) and only those
//! are scored; each search starts where the last one stopped, so every node gets its turn.
//!
//! Pods that fit nowhere get `PodScheduled=False` with the reasons per group of nodes and one
//! FailedScheduling event, and wait in a pending set that node changes and freed room re-enqueue
//! (never a timer).

pub(crate) mod fit;
mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use shepherd_api::{JsonPath, str_at};
use shepherd_api::kinds;
use shepherd_runtime::{Action, Cache, Client, Controller, Manager, Patch, PodView};

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use state::{ClusterState, Decision};

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Workers and trigger mode. Placement itself is serialized; more workers overlap the binds.
    pub run: ControllerConfig,
    /// Pods whose `spec.schedulerName` names another scheduler are left alone.
    pub scheduler_name: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { run: ControllerConfig::default(), scheduler_name: "default-scheduler".into() }
    }
}

struct Scheduler {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    events: EventRecorder,
    state: Arc<Shared>,
    scheduler_name: String,
}

struct Shared {
    cluster: Mutex<ClusterState>,
    /// Set by the informer handlers when a change may let pending pods fit; the next mapper call
    /// takes it and re-enqueues the pending set.
    wake: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.cluster.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_pending_if_woken(&self) -> Vec<String> {
        if self.wake.swap(false, Ordering::AcqRel) { self.lock().pending.iter().cloned().collect() } else { Vec::new() }
    }
}

/// The scheduler controller. Its node and pod bookkeeping subscribes to the manager's shared
/// informers at once, ahead of the controller's own subscriptions, so every reconcile and every
/// re-enqueue sees the change that caused it.
pub fn scheduler(client: Arc<dyn Client>, manager: &Manager, config: SchedulerConfig) -> Controller {
    let shared = Arc::new(Shared { cluster: Mutex::default(), wake: AtomicBool::new(false) });
    let informers = manager.informers();
    {
        let s = shared.clone();
        informers.informer(&kinds::NODE).subscribe(move |change| {
            if s.lock().on_node(change) {
                s.wake.store(true, Ordering::Release);
            }
        });
    }
    {
        let s = shared.clone();
        informers.informer(&kinds::POD).subscribe(move |change| {
            if s.lock().on_pod(change) {
                s.wake.store(true, Ordering::Release);
            }
        });
    }
    let reconciler = Arc::new(Scheduler {
        events: EventRecorder::new(client.clone(), "default-scheduler"),
        client,
        pods: informers.cache(&kinds::POD),
        state: shared.clone(),
        scheduler_name: config.scheduler_name,
    });
    let (on_node, on_pod) = (shared.clone(), shared);
    Controller::new("scheduler", &kinds::POD, move |key: String| {
        let r = reconciler.clone();
        async move { r.schedule(&key).await }
    })
    .watches(&kinds::NODE, move |_| on_node.take_pending_if_woken())
    .watches(&kinds::POD, move |_| on_pod.take_pending_if_woken())
    .workers(config.run.workers)
    .mode(config.run.mode)
}


impl Scheduler {
    fn wants(&self, pod: &Value) -> bool {
        let scheduler = str_at(pod, "/spec/schedulerName");
        str_at(pod, "/spec/nodeName").is_empty()
            && pod.at("/metadata/deletionTimestamp").is_none()
            && !matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed")
            && (scheduler.is_empty() || scheduler == self.scheduler_name)
    }

    async fn schedule(&self, key: &str) -> Result<Action, shepherd_runtime::controller::Error> {
        // Every change of every pod comes here; the view turns away the bound, finished and
        // terminating ones without reading the pod whole.
        let settled = |v: &PodView| v.is_scheduled() || v.is_deleting() || matches!(v.phase(), "Succeeded" | "Failed");
        if self.pods.pod_view(key).is_some_and(|v| settled(&v)) {
            self.state.lock().pending.remove(key);
            return Ok(Action::Done);
        }
        let Some(pod) = self.pods.get(key) else {
            let mut s = self.state.lock();
            s.pending.remove(key);
            s.reported.remove(key);
            return Ok(Action::Done);
        };
        if !self.wants(&pod) {
            self.state.lock().pending.remove(key);
            return Ok(Action::Done);
        }
        let (ns, name) = key.split_once('/').ok_or_else(|| format!("pod key {key:?} has no namespace"))?;
        let needs = fit::PodNeeds::of(&pod);
        let decision = self.state.lock().decide(key, &needs);
        match decision {
            Decision::AlreadyPlaced => Ok(Action::Done),
            Decision::Place(node) => match self.client.bind_pod(ns, name, &node).await {
                Ok(()) => {
                    self.state.lock().reported.remove(key);
                    let message = format!("Successfully assigned {ns}/{name} to {node}");
                    self.events.record(&pod, EventType::Normal, "Scheduled", &message).await;
                    Ok(Action::Done)
                }
                // Bound already (by an earlier attempt or another scheduler) or being deleted:
                // the pod's next event tells where it really is.
                Err(e) if e.is_conflict() || e.is_not_found() => {
                    self.state.lock().forget_assumed(key);
                    Ok(Action::Done)
                }
                Err(e) => {
                    self.state.lock().forget_assumed(key);
                    Err(format!("binding pod {key} to node {node}: {e}").into())
                }
            },
            Decision::Unschedulable(message) => {
                self.mark_unschedulable(&pod, ns, name, &message).await?;
                let first_time = {
                    let mut s = self.state.lock();
                    let seen = s.reported.get(key) == Some(&message);
                    if !seen {
                        s.reported.insert(key.to_string(), message.clone());
                    }
                    !seen
                };
                if first_time {
                    self.events.record(&pod, EventType::Warning, "FailedScheduling", &message).await;
                }
                Ok(Action::Done)
            }
        }
    }

    /// Sets `PodScheduled=False, reason Unschedulable` with `message`, unless it already says so.
    async fn mark_unschedulable(&self, pod: &Value, ns: &str, name: &str, message: &str) -> Result<(), shepherd_api::ApiError> {
        let mut conditions: Vec<Value> = pod.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let existing = conditions.iter().position(|c| c.get("type").and_then(Value::as_str) == Some("PodScheduled"));
        if let Some(i) = existing {
            let c = &conditions[i];
            if str_at(c, "/status") == "False" && str_at(c, "/reason") == "Unschedulable" && str_at(c, "/message") == message {
                return Ok(());
            }
        }
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let transition = existing
            .map(|i| &conditions[i])
            .filter(|c| str_at(c, "/status") == "False")
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        let condition = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastProbeTime": null, "lastTransitionTime": transition});
        match existing {
            Some(i) => conditions[i] = condition,
            None => conditions.push(condition),
        }
        let patch = json!({"status": {"conditions": conditions}});
        match self.client.patch_status(&kinds::POD, Some(ns), name, Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}
