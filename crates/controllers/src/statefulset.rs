//! The StatefulSet controller: pods with stable names `<set>-<ordinal>` and network identity
//! (`hostname` the pod's name, `subdomain` the governing Service), started in ordinal order each
//! after the previous is Running and Ready (OrderedReady) or all at once (Parallel), removed from
//! the highest ordinal down, and updated in reverse ordinal order down to `partition`.
//!
//! Each template is recorded as a ControllerRevision `<set>-<hash>`; pods carry its name in the
//! `controller-revision-hash` label. `status.currentRevision` is the revision every pod had before
//! the update in progress, and pods below the partition that are recreated come back at it, read
//! from its ControllerRevision, as in Kubernetes.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::selector::LabelSelector;
use shepherd_api::{ApiError, kinds};
use shepherd_api::{meta, opt_str_at, pod};
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager, Patch, Reconciler};

use crate::config::ControllerConfig;
use crate::deployment::pod_template_hash;
use crate::events::{EventRecorder, EventType};
use crate::expectations::PodExpectations;
use crate::history::{History, REVISION_LABEL};
use crate::podutil;

/// The label carrying a stateful pod's own name, so a Service can select exactly one pod.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The label carrying a stateful pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// Builds the StatefulSet controller. It reads pods and StatefulSets from the manager's caches.
pub fn statefulset_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    let reconciler = StatefulSetReconciler {
        events: EventRecorder::new(client.clone(), "statefulset-controller"),
        client,
        pods: manager.informers().cache(&kinds::POD),
        sets: manager.informers().cache(&kinds::STATEFULSET),
        revisions: manager.informers().cache(&kinds::CONTROLLERREVISION),
        expectations: PodExpectations::default(),
    };
    Controller::new("statefulset", &kinds::STATEFULSET, reconciler)
        .owns(&kinds::POD)
        .owns(&kinds::CONTROLLERREVISION)
        .workers(config.workers)
        .mode(config.mode)
}

struct StatefulSetReconciler {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    sets: Arc<Cache>,
    revisions: Arc<Cache>,
    events: EventRecorder,
    /// By StatefulSet key.
    expectations: PodExpectations,
}

#[async_trait]
impl Reconciler for StatefulSetReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let Some(set) = self.sets.get(key) else {
            self.expectations.forget(key);
            return Ok(Action::Done);
        };
        self.sync(key, &set).await
    }
}

/// One ordinal's pod as this reconcile sees it.
#[derive(Clone)]
enum Slot {
    Missing,
    /// Created, and not yet in the cache.
    Creating,
    /// Being deleted (by anyone): wait for it to go before its name can be reused.
    Terminating,
    Pod(Arc<Value>),
}

/// What the rest of a reconcile needs to know about the set.
struct Plan<'a> {
    set: &'a Value,
    update_revision: String,
    current_revision: String,
    update_template: Value,
    current_template: Value,
    min_ready: Duration,
    monotonic: bool,
}

impl StatefulSetReconciler {
    async fn sync(&self, key: &str, set: &Value) -> Result<Action, Error> {
        let name = meta::name(set).to_string();
        let selector = match LabelSelector::from_k8s(set.at("/spec/selector").unwrap_or(&Value::Null)) {
            Ok(s) if !s.is_empty() => s,
            _ => {
                let msg = "spec.selector is empty or invalid; no pods are managed";
                self.events.record(set, EventType::Warning, "InvalidSelector", msg).await;
                return Ok(Action::Done);
            }
        };
        let update_template = set.at("/spec/template").cloned().unwrap_or_else(|| json!({}));
        let update_revision = format!("{name}-{}", pod_template_hash(&update_template, None));
        let current_revision = opt_str_at(set, "/status/currentRevision")
            .filter(|r| !r.is_empty())
            .unwrap_or(&update_revision)
            .to_string();
        let history = History { client: &self.client, revisions: &self.revisions, owner: set, owner_kind: &kinds::STATEFULSET };
        if !meta::is_deleting(set) {
            let hash = update_revision.rsplit('-').next().unwrap_or("");
            let keep = [current_revision.as_str()];
            history.record(&update_revision, hash, &update_template, &keep, &self.pods.by_controller_uid(meta::uid(set))).await?;
        }
        let current_template = if current_revision == update_revision {
            update_template.clone()
        } else {
            match history.get(&current_revision) {
                Some(rev) => rev.at("/data/spec/template").cloned().unwrap_or_else(|| update_template.clone()),
                // Its record is gone: nothing to go back to, so everything moves to the update.
                None => update_template.clone(),
            }
        };
        let plan = Plan {
            set,
            min_ready: Duration::from_secs(set.at("/spec/minReadySeconds").and_then(Value::as_u64).unwrap_or(0)),
            monotonic: set.at("/spec/podManagementPolicy").and_then(Value::as_str) != Some("Parallel"),
            update_revision,
            current_revision,
            update_template,
            current_template,
        };

        let pods: Vec<Arc<Value>> = self
            .pods
            .by_controller_uid(meta::uid(set))
            .into_iter()
            .filter(|p| selector.matches_object(p) && pod::ordinal(meta::name(p), &name).is_some())
            .collect();
        let (creating, deleting) = self.expectations.settle(key, self.pods.observed_revision(), &pods);
        let mut slots: BTreeMap<u64, Slot> = BTreeMap::new();
        for pod in &pods {
            let Some(ord) = pod::ordinal(meta::name(pod), &name) else { continue };
            let slot = if meta::is_deleting(pod) || deleting.contains(meta::uid(pod)) {
                Slot::Terminating
            } else {
                Slot::Pod(pod.clone())
            };
            slots.insert(ord, slot);
        }
        for pod_name in &creating {
            if let Some(ord) = pod::ordinal(pod_name, &name) {
                slots.entry(ord).or_insert(Slot::Creating);
            }
        }

        let start = set.at("/spec/ordinals/start").and_then(Value::as_u64).unwrap_or(0);
        let replicas = set.at("/spec/replicas").and_then(Value::as_u64).unwrap_or(1);
        let mut wait = None;
        let result = if meta::is_deleting(set) { Ok(()) } else { self.step(key, &plan, &slots, start, replicas, &mut wait).await };
        let status = compute_status(&plan, &pods, &deleting, replicas, &mut wait);
        self.write_status(set, status).await?;
        result?;
        Ok(wait.map_or(Action::Done, |w: Duration| Action::RequeueAfter(w + Duration::from_millis(500))))
    }

    /// The next moves: create or replace missing pods in order, remove condemned ones from the
    /// top, then roll one pod to the update revision. Returns early wherever the policy says to wait.
    async fn step(
        &self,
        key: &str,
        plan: &Plan<'_>,
        slots: &BTreeMap<u64, Slot>,
        start: u64,
        replicas: u64,
        wait: &mut Option<Duration>,
    ) -> Result<(), Error> {
        let end = start + replicas;
        let partition = match plan.set.at("/spec/updateStrategy/type").and_then(Value::as_str) {
            Some("OnDelete") => None,
            _ => Some(plan.set.at("/spec/updateStrategy/rollingUpdate/partition").and_then(Value::as_u64).unwrap_or(0)),
        };
        let mut healthy = |pod: &Value| self.is_available(plan, pod, wait);

        for ord in start..end {
            match slots.get(&ord).cloned().unwrap_or(Slot::Missing) {
                Slot::Missing => {
                    // Below the partition a pod comes back as it was; elsewhere at the update.
                    let at_current = partition.is_some_and(|p| ord < start + p);
                    let (template, revision) = if at_current {
                        (&plan.current_template, &plan.current_revision)
                    } else {
                        (&plan.update_template, &plan.update_revision)
                    };
                    self.create_pod(key, plan.set, ord, template, revision).await?;
                    if plan.monotonic {
                        return Ok(());
                    }
                }
                Slot::Creating | Slot::Terminating => {
                    if plan.monotonic {
                        return Ok(());
                    }
                }
                Slot::Pod(pod) => {
                    if matches!(pod::phase(&pod), "Failed" | "Succeeded") {
                        self.delete_pod(key, plan.set, &pod).await?;
                        if plan.monotonic {
                            return Ok(());
                        }
                    } else if plan.monotonic && !healthy(&pod) {
                        return Ok(());
                    }
                }
            }
        }

        // Condemned pods go from the highest ordinal down; in order, one at a time, each after
        // the one above it is gone.
        let condemned: Vec<(u64, &Slot)> = slots.iter().filter(|(o, _)| **o < start || **o >= end).map(|(o, s)| (*o, s)).rev().collect();
        for (_, slot) in condemned {
            match slot {
                Slot::Pod(pod) => {
                    self.delete_pod(key, plan.set, pod).await?;
                    if plan.monotonic {
                        return Ok(());
                    }
                }
                Slot::Creating | Slot::Terminating | Slot::Missing => {
                    if plan.monotonic {
                        return Ok(());
                    }
                }
            }
        }

        // The rolling update: from the top down to the partition, one pod at a time, each
        // replacement healthy before the next goes.
        let Some(partition) = partition else { return Ok(()) };
        let lowest = start + partition.min(replicas);
        for ord in (lowest..end).rev() {
            match slots.get(&ord) {
                Some(Slot::Pod(pod)) => {
                    if revision(pod) != Some(plan.update_revision.as_str()) {
                        self.delete_pod(key, plan.set, pod).await?;
                        return Ok(());
                    }
                    if !healthy(pod) {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    fn is_available(&self, plan: &Plan<'_>, pod: &Value, wait: &mut Option<Duration>) -> bool {
        if pod::phase(pod) != "Running" {
            return false;
        }
        match pod::availability(pod, plan.min_ready, podutil::now()) {
            Ok(a) => a,
            Err(w) => {
                *wait = Some(wait.map_or(w, |cur| cur.min(w)));
                false
            }
        }
    }

    async fn create_pod(&self, key: &str, set: &Value, ord: u64, template: &Value, revision: &str) -> Result<(), Error> {
        let pod = stateful_pod(set, ord, template, revision);
        let pod_name = meta::name(&pod).to_string();
        let set_name = meta::name(set);
        match self.client.create(&kinds::POD, meta::namespace(set), pod).await {
            Ok(created) => {
                let rev = shepherd_runtime::cache::resource_version(&created).unwrap_or(u64::MAX);
                self.expectations.created(key, &pod_name, rev);
                let msg = format!("create Pod {pod_name} in StatefulSet {set_name} successful");
                self.events.record(set, EventType::Normal, "SuccessfulCreate", &msg).await;
                Ok(())
            }
            // The name is still held (by a pod on its way out, or one the cache has not shown):
            // its change brings this key back.
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => {
                let msg = format!("create Pod {pod_name} in StatefulSet {set_name} failed error: {e}");
                self.events.record(set, EventType::Warning, "FailedCreate", &msg).await;
                Err(e.into())
            }
        }
    }

    async fn delete_pod(&self, key: &str, set: &Value, pod: &Value) -> Result<(), Error> {
        let params = DeleteParams { precondition_uid: Some(meta::uid(pod).to_string()), ..Default::default() };
        let (pod_name, set_name) = (meta::name(pod), meta::name(set));
        match self.client.delete(&kinds::POD, meta::namespace(pod), pod_name, &params).await {
            Ok(_) => {
                let msg = format!("delete Pod {pod_name} in StatefulSet {set_name} successful");
                self.events.record(set, EventType::Normal, "SuccessfulDelete", &msg).await;
            }
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => {
                let msg = format!("delete Pod {pod_name} in StatefulSet {set_name} failed error: {e}");
                self.events.record(set, EventType::Warning, "FailedDelete", &msg).await;
                return Err(e.into());
            }
        }
        self.expectations.deleted(key, meta::uid(pod));
        Ok(())
    }

    async fn write_status(&self, set: &Value, status: Value) -> Result<(), ApiError> {
        let current = set.get("status").cloned().unwrap_or_else(|| json!({}));
        let same = status.as_object().is_some_and(|m| {
            m.iter().all(|(k, v)| current.get(k).unwrap_or(&Value::Null) == v || (v == &json!(0) && current.get(k).is_none()))
        });
        if same {
            return Ok(());
        }
        let patch = json!({"status": status});
        match self.client.patch_status(&kinds::STATEFULSET, meta::namespace(set), meta::name(set), Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn revision(pod: &Value) -> Option<&str> {
    opt_str_at(pod, &format!("/metadata/labels/{REVISION_LABEL}"))
}

/// The status `kubectl get sts` and `kubectl rollout status sts` read.
fn compute_status(plan: &Plan<'_>, pods: &[Arc<Value>], deleting: &HashSet<String>, replicas: u64, wait: &mut Option<Duration>) -> Value {
    let (mut count, mut ready, mut available, mut current, mut updated) = (0i64, 0i64, 0i64, 0i64, 0i64);
    let now = podutil::now();
    for pod in pods {
        count += 1;
        let running_ready = pod::phase(pod) == "Running" && pod::is_ready(pod);
        if running_ready {
            ready += 1;
            match pod::availability(pod, plan.min_ready, now) {
                Ok(true) => available += 1,
                Ok(false) => {}
                Err(w) => *wait = Some(wait.map_or(w, |cur: Duration| cur.min(w))),
            }
        }
        if !meta::is_deleting(pod) && !deleting.contains(meta::uid(pod)) {
            current += i64::from(revision(pod) == Some(plan.current_revision.as_str()));
            updated += i64::from(revision(pod) == Some(plan.update_revision.as_str()));
        }
    }
    let mut current_revision = plan.current_revision.clone();
    // A finished rolling update: every pod is at the update revision and ready.
    let rolling = plan.set.at("/spec/updateStrategy/type").and_then(Value::as_str) != Some("OnDelete");
    let all_updated = updated == replicas as i64 && ready == replicas as i64 && count == replicas as i64;
    if current_revision != plan.update_revision && (all_updated || (rolling && count == 0)) {
        current_revision = plan.update_revision.clone();
        current = updated;
    }
    json!({
        "observedGeneration": meta::generation(plan.set),
        "replicas": count,
        "readyReplicas": ready,
        "availableReplicas": available,
        "currentReplicas": current,
        "updatedReplicas": updated,
        "currentRevision": current_revision,
        "updateRevision": plan.update_revision,
        "collisionCount": 0,
    })
}

/// The pod at `ord`: `<set>-<ord>` from `template`, its hostname its name and its subdomain the
/// governing Service, so `<pod>.<service>` names it in DNS.
fn stateful_pod(set: &Value, ord: u64, template: &Value, revision: &str) -> Value {
    let set_name = meta::name(set);
    let name = format!("{set_name}-{ord}");
    let mut labels = template.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), json!(revision));
    labels.insert(POD_NAME_LABEL.into(), json!(name));
    labels.insert(POD_INDEX_LABEL.into(), json!(ord.to_string()));
    let mut metadata = json!({
        "name": name,
        "labels": labels,
        "ownerReferences": [podutil::owner_reference_to(set, &kinds::STATEFULSET)],
    });
    if let Some(ns) = meta::namespace(set) {
        metadata["namespace"] = json!(ns);
    }
    if let Some(a) = template.at("/metadata/annotations").filter(|a| a.is_object()) {
        metadata["annotations"] = a.clone();
    }
    let mut spec = template.get("spec").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
    spec["hostname"] = json!(name);
    if let Some(service) = opt_str_at(set, "/spec/serviceName").filter(|s| !s.is_empty()) {
        spec["subdomain"] = json!(service);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stateful_pod_is_named_by_ordinal_and_reachable_through_its_service() {
        let set = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"serviceName": "nginx", "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}});
        let pod = stateful_pod(&set, 2, &set["spec"]["template"], "web-abc");
        assert_eq!(pod["metadata"]["name"], "web-2");
        assert_eq!((pod["spec"]["hostname"].as_str(), pod["spec"]["subdomain"].as_str()), (Some("web-2"), Some("nginx")));
        assert_eq!(pod["metadata"]["labels"][REVISION_LABEL], "web-abc");
        assert_eq!(pod["metadata"]["labels"][POD_NAME_LABEL], "web-2");
        assert_eq!(pod["metadata"]["labels"][POD_INDEX_LABEL], "2");
    }
}
