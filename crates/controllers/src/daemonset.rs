//! The DaemonSet controller: one pod per eligible node, replaced node by node when the template
//! changes (RollingUpdate with `maxUnavailable` or `maxSurge`, or OnDelete), with Kubernetes' status.
//!
//! A node is eligible when it passes the template's `nodeSelector` and required node affinity and
//! the pod tolerates its NoSchedule and NoExecute taints; a pod stays on a node that gains a
//! NoSchedule taint, and leaves one that gains an untolerated NoExecute taint or stops matching.
//! Daemon pods get the tolerations Kubernetes adds to them (not-ready and unreachable NoExecute,
//! the pressure taints and unschedulable NoSchedule), so they keep running on failing or
//! cordoned nodes.
//!
//! Pods are bound by setting `spec.nodeName` at creation rather than through the scheduler, as
//! Kubernetes did before 1.12: the scheduler here refuses not-ready and cordoned nodes outright
//! (not through taints a pod could tolerate), the controller already decided which node the pod
//! belongs to, and a joining node gets its pod without a second hop. The template's hash is the
//! `controller-revision-hash` label of each pod, telling updated pods from old ones, and each
//! template is recorded as the ControllerRevision `<set>-<hash>` for `kubectl rollout history|undo`.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::selector::LabelSelector;
use shepherd_api::{ApiError, kinds};
use shepherd_api::{meta, opt_str_at, pod};
use shepherd_runtime::cache::object_key;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager, Patch, Reconciler};

use crate::config::ControllerConfig;
use crate::deployment::pod_template_hash;
use crate::events::{EventRecorder, EventType};
use crate::expectations::PodExpectations;
use crate::history::{History, REVISION_LABEL};
use crate::podutil;
use crate::scheduler::fit::{Effect, NodeSummary, PodNeeds};

/// The tolerations Kubernetes gives every daemon pod: `(key, effect)`, operator Exists.
const DAEMON_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

/// Builds the DaemonSet controller. Any node change wakes every DaemonSet: nodes change rarely
/// (heartbeats go to Leases), and a node's labels or taints can make it eligible for any of them.
pub fn daemonset_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    let daemonsets = manager.informers().cache(&kinds::DAEMONSET);
    let reconciler = DaemonSetReconciler {
        events: EventRecorder::new(client.clone(), "daemonset-controller"),
        client,
        pods: manager.informers().cache(&kinds::POD),
        nodes: manager.informers().cache(&kinds::NODE),
        daemonsets: daemonsets.clone(),
        revisions: manager.informers().cache(&kinds::CONTROLLERREVISION),
        expectations: PodExpectations::default(),
    };
    Controller::new("daemonset", &kinds::DAEMONSET, reconciler)
        .owns(&kinds::POD)
        .watches(&kinds::NODE, move |_| daemonsets.list().iter().filter_map(|ds| object_key(ds)).collect())
        .workers(config.workers)
        .mode(config.mode)
}

struct DaemonSetReconciler {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    nodes: Arc<Cache>,
    daemonsets: Arc<Cache>,
    revisions: Arc<Cache>,
    events: EventRecorder,
    /// By DaemonSet key.
    expectations: PodExpectations,
}

#[async_trait]
impl Reconciler for DaemonSetReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let Some(ds) = self.daemonsets.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::Done);
        };
        self.sync(key, &ds).await
    }
}

/// What a node means to the DaemonSet, and the pods it has there.
struct NodePlan {
    name: String,
    should_run: bool,
    should_continue: bool,
    /// Active pods (not terminating, not finished, not being deleted by us), oldest first.
    pods: Vec<Arc<Value>>,
}

impl NodePlan {
    fn updated<'a>(&'a self, hash: &str) -> Option<&'a Arc<Value>> {
        self.pods.iter().find(|p| revision(p) == Some(hash))
    }

    fn old<'a>(&'a self, hash: &str) -> Option<&'a Arc<Value>> {
        self.pods.iter().find(|p| revision(p) != Some(hash))
    }
}

fn revision(pod: &Value) -> Option<&str> {
    opt_str_at(pod, &format!("/metadata/labels/{REVISION_LABEL}"))
}

/// What one reconcile decided to do.
#[derive(Default)]
struct Changes {
    create_on: Vec<String>,
    delete: Vec<(Arc<Value>, &'static str)>,
}

impl DaemonSetReconciler {
    async fn sync(&self, key: &str, ds: &Value) -> Result<Action, Error> {
        let selector = match LabelSelector::from_k8s(ds.at("/spec/selector").unwrap_or(&Value::Null)) {
            Ok(s) if !s.is_empty() => s,
            _ => {
                let msg = "spec.selector is empty or invalid; no pods are managed";
                self.events.record(ds, EventType::Warning, "InvalidSelector", msg).await;
                return Ok(Action::Done);
            }
        };
        let template = ds.at("/spec/template").cloned().unwrap_or_else(|| json!({}));
        let hash = pod_template_hash(&template, ds.at("/status/collisionCount").and_then(Value::as_i64));
        let mut owned: Vec<Arc<Value>> =
            self.pods.by_controller_uid(meta::uid(ds)).into_iter().filter(|p| selector.matches_object(p)).collect();
        if !meta::is_deleting(ds) {
            owned.extend(self.adopt_orphans(ds, &selector).await?);
            let history = History { client: &self.client, revisions: &self.revisions, owner: ds, owner_kind: &kinds::DAEMONSET };
            history.record(&format!("{}-{hash}", meta::name(ds)), &hash, &template, &[], &owned).await?;
        }
        let (pending, deleting) = self.expectations.settle(key, self.pods.observed_revision(), &owned);

        let probe = daemon_pod(ds, &template, &hash, "");
        let needs = PodNeeds::of(&probe);
        let mut by_node: BTreeMap<String, Vec<Arc<Value>>> = BTreeMap::new();
        let mut failed = Vec::new();
        // Nodes where a pod of ours is on its way out: pods share the node's network, so its
        // replacement waits for it to be gone, as Kubernetes' daemon pods do.
        let mut terminating: HashSet<String> = HashSet::new();
        for pod in owned {
            let node = opt_str_at(&pod, "/spec/nodeName").unwrap_or("").to_string();
            if pod::phase(&pod) == "Failed" && !meta::is_deleting(&pod) {
                terminating.insert(node);
                failed.push(pod);
            } else if meta::is_deleting(&pod) || deleting.contains(meta::uid(&pod)) {
                terminating.insert(node);
            } else if pod::is_active(&pod) {
                by_node.entry(node).or_default().push(pod);
            }
        }
        let mut plans: Vec<NodePlan> = Vec::new();
        for node in self.nodes.list() {
            let name = meta::name(&node).to_string();
            let summary = NodeSummary::of(&node);
            let fits = needs.matches_node(&name, &summary);
            let mut pods = by_node.remove(&name).unwrap_or_default();
            pods.sort_by(|a, b| creation(a).cmp(creation(b)).then_with(|| meta::name(a).cmp(meta::name(b))));
            plans.push(NodePlan {
                should_run: fits && needs.tolerates_taints(&summary, &[Effect::NoSchedule, Effect::NoExecute]),
                should_continue: fits && needs.tolerates_taints(&summary, &[Effect::NoExecute]),
                name,
                pods,
            });
        }
        // Pods on nodes that no longer exist (or on none) run nowhere: they go.
        let mut changes = Changes::default();
        for pod in by_node.into_values().flatten() {
            changes.delete.push((pod, "node is gone"));
        }
        for pod in failed {
            changes.delete.push((pod, "failed"));
        }

        let now = podutil::now();
        let min_ready = Duration::from_secs(ds.at("/spec/minReadySeconds").and_then(Value::as_u64).unwrap_or(0));
        let mut wait: Option<Duration> = None;
        let mut available = |pod: &Value| match pod::availability(pod, min_ready, now) {
            Ok(a) => a,
            Err(w) => {
                wait = Some(wait.map_or(w, |cur: Duration| cur.min(w)));
                false
            }
        };
        if !meta::is_deleting(ds) {
            let waiting: HashSet<String> = pending.union(&terminating).cloned().collect();
            plan_nodes(ds, &plans, &hash, &waiting, &mut available, &mut changes);
        }
        let status = compute_status(ds, &plans, &hash, &mut available);

        let mut errors = Vec::new();
        if let Err(e) = self.apply(key, ds, &template, &hash, changes).await {
            errors.push(e);
        }
        self.write_status(ds, status).await?;
        if !errors.is_empty() {
            return Err(errors.join("; ").into());
        }
        // Availability is judged by the clock: come back when the next pod passes minReadySeconds.
        Ok(wait.map_or(Action::Done, |w| Action::RequeueAfter(w + Duration::from_millis(500))))
    }

    async fn adopt_orphans(&self, ds: &Value, selector: &LabelSelector) -> Result<Vec<Arc<Value>>, ApiError> {
        let ns = meta::namespace(ds).unwrap_or("default");
        let orphans: Vec<Arc<Value>> = self
            .pods
            .unowned_in_namespace(ns)
            .into_iter()
            .filter(|p| selector.matches_object(p) && !meta::is_deleting(p))
            .collect();
        let mut adopted = Vec::new();
        for pod in orphans {
            let patch = podutil::adopt_patch(&pod, ds, &kinds::DAEMONSET);
            match self.client.patch(&kinds::POD, meta::namespace(&pod), meta::name(&pod), Patch::Merge(patch)).await {
                Ok(p) => adopted.push(Arc::new(p)),
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(adopted)
    }

    async fn apply(&self, key: &str, ds: &Value, template: &Value, hash: &str, changes: Changes) -> Result<(), String> {
        let deletes = futures::future::join_all(changes.delete.iter().map(|(pod, _)| self.delete_pod(key, pod))).await;
        let mut failure = None;
        for ((pod, why), r) in changes.delete.iter().zip(deletes) {
            match r {
                Ok(()) => {
                    let msg = format!("Deleted pod: {} ({why})", meta::name(pod));
                    self.events.record(ds, EventType::Normal, "SuccessfulDelete", &msg).await;
                }
                Err(e) => {
                    self.events.record(ds, EventType::Warning, "FailedDelete", &e.to_string()).await;
                    failure = Some(format!("deleting {}: {e}", meta::name(pod)));
                }
            }
        }
        let ns = meta::namespace(ds);
        let creates = futures::future::join_all(changes.create_on.iter().map(|node| {
            self.client.create(&kinds::POD, ns, daemon_pod(ds, template, hash, node))
        }))
        .await;
        for (node, r) in changes.create_on.iter().zip(creates) {
            match r {
                Ok(pod) => {
                    let rev = shepherd_runtime::cache::resource_version(&pod).unwrap_or(u64::MAX);
                    self.expectations.created(key, node, rev);
                    let msg = format!("Created pod: {}", meta::name(&pod));
                    self.events.record(ds, EventType::Normal, "SuccessfulCreate", &msg).await;
                }
                Err(e) => {
                    self.events.record(ds, EventType::Warning, "FailedCreate", &e.to_string()).await;
                    failure = Some(format!("creating a pod on {node}: {e}"));
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    async fn delete_pod(&self, key: &str, pod: &Value) -> Result<(), ApiError> {
        let params = DeleteParams { precondition_uid: Some(meta::uid(pod).to_string()), ..Default::default() };
        match self.client.delete(&kinds::POD, meta::namespace(pod), meta::name(pod), &params).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => return Err(e),
        }
        self.expectations.deleted(key, meta::uid(pod));
        Ok(())
    }

    async fn write_status(&self, ds: &Value, status: Value) -> Result<(), ApiError> {
        let current = ds.get("status").cloned().unwrap_or_else(|| json!({}));
        let num = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).unwrap_or(0);
        let fields = status.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        if fields.iter().all(|f| num(&current, f) == num(&status, f)) {
            return Ok(());
        }
        let patch = json!({"status": status});
        match self.client.patch_status(&kinds::DAEMONSET, meta::namespace(ds), meta::name(ds), Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn creation(pod: &Value) -> &str {
    opt_str_at(pod, "/metadata/creationTimestamp").unwrap_or("")
}

/// An amount of `maxUnavailable`/`maxSurge` against `total` nodes, percentages rounded up.
fn scaled(v: Option<&Value>, total: usize) -> usize {
    match v {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0) as usize,
        Some(Value::String(s)) => {
            let pct: usize = s.trim_end_matches('%').parse().unwrap_or(0);
            (pct * total).div_ceil(100)
        }
        _ => 0,
    }
}

/// Decides the creates and deletes: missing pods, misscheduled and duplicate pods, and the
/// rolling update's next step. Nodes in `pending` (a create not yet seen, or an old pod still
/// terminating) get nothing new now and count as unavailable.
fn plan_nodes(
    ds: &Value,
    plans: &[NodePlan],
    hash: &str,
    pending: &HashSet<String>,
    available: &mut impl FnMut(&Value) -> bool,
    changes: &mut Changes,
) {
    let rolling = ds.at("/spec/updateStrategy/type").and_then(Value::as_str).unwrap_or("RollingUpdate") == "RollingUpdate";
    let desired = plans.iter().filter(|p| p.should_run).count();
    let (max_unavailable, max_surge) = if rolling {
        let r = ds.at("/spec/updateStrategy/rollingUpdate");
        let surge = scaled(r.and_then(|r| r.get("maxSurge")), desired);
        let unavailable = scaled(r.and_then(|r| r.get("maxUnavailable")), desired);
        if surge == 0 && unavailable == 0 { (1, 0) } else { (unavailable, surge) }
    } else {
        (0, 0)
    };
    let surging = rolling && max_surge > 0;

    for plan in plans {
        if pending.contains(&plan.name) {
            continue;
        }
        if !plan.should_continue {
            for pod in &plan.pods {
                changes.delete.push((pod.clone(), "node is not eligible"));
            }
            continue;
        }
        if plan.pods.is_empty() {
            if plan.should_run {
                changes.create_on.push(plan.name.clone());
            }
            continue;
        }
        // One pod per node; while surging an old pod may stay beside its replacement.
        let keep_old = surging && plan.updated(hash).is_some();
        let mut kept_new = false;
        let mut kept_old = false;
        for pod in &plan.pods {
            let is_new = revision(pod) == Some(hash);
            let keep = if is_new {
                !std::mem::replace(&mut kept_new, true)
            } else if plan.updated(hash).is_some() {
                keep_old && !std::mem::replace(&mut kept_old, true)
            } else {
                !std::mem::replace(&mut kept_old, true)
            };
            if !keep {
                changes.delete.push((pod.clone(), "more than one pod on the node"));
            }
        }
    }
    if !rolling {
        return;
    }

    let live = |plan: &NodePlan| plan.should_continue && !pending.contains(&plan.name);
    if !surging {
        let mut unavailable = 0usize;
        let mut replace_now = Vec::new();
        let mut candidates = Vec::new();
        for plan in plans.iter().filter(|p| p.should_run) {
            if pending.contains(&plan.name) {
                unavailable += 1;
                continue;
            }
            match (plan.updated(hash), plan.old(hash)) {
                (None, None) | (Some(_), Some(_)) => unavailable += 1,
                (Some(new), None) => unavailable += usize::from(!available(new)),
                (None, Some(old)) => {
                    if !available(old) {
                        replace_now.push(old.clone());
                    } else {
                        candidates.push(old.clone());
                    }
                }
            }
        }
        let room = max_unavailable.saturating_sub(unavailable).min(candidates.len());
        for pod in replace_now.into_iter().chain(candidates.into_iter().take(room)) {
            changes.delete.push((pod, "rolling update"));
        }
        return;
    }

    let mut surge = 0usize;
    let mut create_now = Vec::new();
    let mut candidates = Vec::new();
    for plan in plans.iter().filter(|p| p.should_run && live(p)) {
        match (plan.updated(hash), plan.old(hash)) {
            (_, None) => {}
            (None, Some(old)) => {
                if !available(old) {
                    create_now.push(plan.name.clone());
                } else {
                    candidates.push(plan.name.clone());
                }
            }
            (Some(new), Some(old)) => {
                if available(new) {
                    changes.delete.push((old.clone(), "rolling update"));
                } else {
                    surge += 1;
                }
            }
        }
    }
    let room = max_surge.saturating_sub(surge).min(candidates.len());
    changes.create_on.extend(create_now.into_iter().chain(candidates.into_iter().take(room)));
}

/// The status `kubectl get ds` and `kubectl rollout status ds` read.
fn compute_status(ds: &Value, plans: &[NodePlan], hash: &str, available: &mut impl FnMut(&Value) -> bool) -> Value {
    let (mut desired, mut current, mut misscheduled, mut ready, mut avail, mut updated) = (0, 0, 0, 0, 0, 0);
    for plan in plans {
        match (plan.should_run, plan.pods.first()) {
            (true, Some(oldest)) => {
                desired += 1;
                current += 1;
                ready += i64::from(pod::is_ready(oldest));
                avail += i64::from(available(oldest));
                updated += i64::from(plan.updated(hash).is_some());
            }
            (true, None) => desired += 1,
            (false, Some(_)) => misscheduled += 1,
            (false, None) => {}
        }
    }
    json!({
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "numberReady": ready,
        "updatedNumberScheduled": updated,
        "numberAvailable": avail,
        "numberUnavailable": desired - avail,
        "observedGeneration": meta::generation(ds),
    })
}

/// A pod of `ds` for `node`: the template with the revision label, the daemon tolerations and
/// the node already chosen.
fn daemon_pod(ds: &Value, template: &Value, hash: &str, node: &str) -> Value {
    let mut labels = template.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), json!(hash));
    let mut metadata = json!({
        "generateName": format!("{}-", meta::name(ds)),
        "labels": labels,
        "ownerReferences": [podutil::owner_reference_to(ds, &kinds::DAEMONSET)],
    });
    if let Some(ns) = meta::namespace(ds) {
        metadata["namespace"] = json!(ns);
    }
    if let Some(a) = template.at("/metadata/annotations").filter(|a| a.is_object()) {
        metadata["annotations"] = a.clone();
    }
    let mut spec = template.get("spec").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
    let mut tolerations = spec.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    for (key, effect) in DAEMON_TOLERATIONS {
        let present = tolerations.iter().any(|t| t.get("key").and_then(Value::as_str) == Some(key)
            && t.get("effect").and_then(Value::as_str) == Some(effect));
        if !present {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
        }
    }
    spec["tolerations"] = json!(tolerations);
    if !node.is_empty() {
        spec["nodeName"] = json!(node);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, taints: Value) -> Value {
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    }

    fn ds() -> Value {
        json!({"metadata": {"name": "agent", "namespace": "default", "uid": "u"},
            "spec": {"template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "a", "image": "i"}]}}}})
    }

    #[test]
    fn daemon_pods_tolerate_not_ready_unreachable_and_cordoned_nodes_but_not_other_taints() {
        let ds = ds();
        let template = ds["spec"]["template"].clone();
        let needs = PodNeeds::of(&daemon_pod(&ds, &template, "h", "n1"));
        let eligible = |taints: Value| {
            let summary = NodeSummary::of(&node("n1", taints));
            needs.tolerates_taints(&summary, &[Effect::NoSchedule, Effect::NoExecute])
        };
        assert!(eligible(json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}])));
        assert!(eligible(json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])));
        assert!(eligible(json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])));
        assert!(!eligible(json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])));
    }

    #[test]
    fn a_daemon_pod_is_bound_to_its_node_and_labelled_with_the_revision() {
        let ds = ds();
        let pod = daemon_pod(&ds, &ds["spec"]["template"], "abc", "n2");
        assert_eq!(pod["spec"]["nodeName"], "n2");
        assert_eq!(pod["metadata"]["labels"], json!({"app": "agent", REVISION_LABEL: "abc"}));
        assert_eq!(pod["metadata"]["generateName"], "agent-");
        assert_eq!(pod["spec"]["tolerations"].as_array().map(Vec::len), Some(DAEMON_TOLERATIONS.len()));
    }

    #[test]
    fn percentages_of_nodes_round_up() {
        assert_eq!(scaled(Some(&json!("10%")), 3), 1);
        assert_eq!(scaled(Some(&json!("50%")), 5), 3);
        assert_eq!(scaled(Some(&json!(2)), 5), 2);
        assert_eq!(scaled(None, 5), 0);
    }
}
