//! The Deployment controller: rolls a Deployment's pod template out through ReplicaSets named
//! `<deployment>-<pod-template-hash>`, with the RollingUpdate or Recreate strategy, and reports
//! progress in the status and conditions `kubectl rollout status` reads.
//!
//! Every decision is taken from the ReplicaSets' spec and status as the cache holds them, so a
//! reconcile can stop anywhere and the next one continues from what the API shows. The rolling
//! update never lets the sum of ReplicaSet `spec.replicas`, minus new pods not yet available, drop
//! below `replicas - maxUnavailable`, and never lets it rise above `replicas + maxSurge`.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use shepherd_api::JsonPath;
use shepherd_api::selector::LabelSelector;
use shepherd_api::{ApiError, kinds};
use shepherd_api::{meta, opt_str_at};
use shepherd_runtime::cache::object_key;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager, Patch, Reconciler};

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::podutil::{self, POD_TEMPLATE_HASH};

/// The annotation carrying a rollout's revision, on the Deployment and on each ReplicaSet.
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";

/// Builds the Deployment controller. It reads Deployments, ReplicaSets and pods from the
/// manager's shared caches (pods only to let a Recreate rollout wait for old pods to be gone).
pub fn deployment_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    let deployments = manager.informers().cache(&kinds::DEPLOYMENT);
    let replicasets = manager.informers().cache(&kinds::REPLICASET);
    let pods = manager.informers().cache(&kinds::POD);
    let reconciler = DeploymentReconciler {
        events: EventRecorder::new(client.clone(), "deployment-controller"),
        client,
        deployments: deployments.clone(),
        replicasets: replicasets.clone(),
        pods,
    };
    let (orphan_deployments, recreate_deployments, recreate_replicasets) = (deployments.clone(), deployments, replicasets);
    Controller::new("deployment", &kinds::DEPLOYMENT, reconciler)
        .owns(&kinds::REPLICASET)
        // An orphan ReplicaSet wakes the Deployments whose selector it matches, to be adopted.
        .watches(&kinds::REPLICASET, move |rs| {
            if meta::controller_ref(rs).is_some() {
                return Vec::new();
            }
            let Some(ns) = meta::namespace(rs) else { return Vec::new() };
            orphan_deployments
                .by_namespace(ns)
                .iter()
                .filter(|d| selector_of(d).is_ok_and(|s| s.matches_object(rs)))
                .filter_map(|d| object_key(d))
                .collect()
        })
        // A Recreate rollout waits for the old pods to be gone: their changes wake it.
        .watches(&kinds::POD, move |pod| {
            let Some(ns) = meta::namespace(pod) else { return Vec::new() };
            let Some(rs_name) = meta::controller_ref(pod).and_then(|r| r.get("name")).and_then(Value::as_str) else {
                return Vec::new();
            };
            let Some(rs) = recreate_replicasets.get(&format!("{ns}/{rs_name}")) else { return Vec::new() };
            let Some(d_name) = meta::controller_ref(&rs).and_then(|r| r.get("name")).and_then(Value::as_str) else {
                return Vec::new();
            };
            let key = format!("{ns}/{d_name}");
            match recreate_deployments.get(&key) {
                Some(d) if opt_str_at(&d, "/spec/strategy/type") == Some("Recreate") => vec![key],
                _ => Vec::new(),
            }
        })
        .workers(config.workers)
        .mode(config.mode)
}

fn selector_of(obj: &Value) -> Result<LabelSelector, ApiError> {
    LabelSelector::from_k8s(obj.at("/spec/selector").unwrap_or(&Value::Null))
}

struct DeploymentReconciler {
    client: Arc<dyn Client>,
    deployments: Arc<Cache>,
    replicasets: Arc<Cache>,
    pods: Arc<Cache>,
    events: EventRecorder,
}

#[async_trait]
impl Reconciler for DeploymentReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let Some(d) = self.deployments.get(key) else { return Ok(Action::Done) };
        self.sync(&d).await
    }
}

fn replicas_of(obj: &Value) -> i64 {
    obj.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)
}

fn status_i64(obj: &Value, field: &str) -> i64 {
    obj.at(&format!("/status/{field}")).and_then(Value::as_i64).unwrap_or(0)
}

fn revision_of(rs: &Value) -> i64 {
    opt_str_at(rs, "/metadata/annotations/deployment.kubernetes.io~1revision").and_then(|r| r.parse().ok()).unwrap_or(0)
}

/// Oldest first, by creation time then name, so scale-downs start from the oldest ReplicaSet.
fn oldest_first(a: &Value, b: &Value) -> Ordering {
    let created = |o: &Value| opt_str_at(o, "/metadata/creationTimestamp").unwrap_or("").to_string();
    created(a).cmp(&created(b)).then_with(|| meta::name(a).cmp(meta::name(b)))
}

/// `maxSurge` rounded up and `maxUnavailable` rounded down against `replicas`; when both come to
/// zero one pod may be unavailable, or no rollout could ever make progress.
fn fenceposts(d: &Value) -> (i64, i64) {
    let replicas = replicas_of(d);
    let rolling = d.at("/spec/strategy/rollingUpdate");
    let field = |f: &str| rolling.and_then(|r| r.get(f)).filter(|v| !v.is_null()).cloned().unwrap_or_else(|| json!("25%"));
    let surge = scaled_value(&field("maxSurge"), replicas, true);
    let unavailable = scaled_value(&field("maxUnavailable"), replicas, false);
    if surge == 0 && unavailable == 0 { (0, 1) } else { (surge, unavailable) }
}

/// An int-or-percent against `total`: percentages round up or down as asked.
fn scaled_value(v: &Value, total: i64, round_up: bool) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().unwrap_or(0).max(0),
        Value::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let product = pct.max(0) * total.max(0);
            if round_up { (product + 99) / 100 } else { product / 100 }
        }
        _ => 0,
    }
}

/// Writes `v` as JSON with object keys sorted, whatever order the map keeps them in.
fn canonical_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            out.push('{');
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                canonical_json(&m[*k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The pod-template-hash: FNV-1a (32 bit) of the template's canonical JSON and the collision
/// count, written in the alphabet Kubernetes uses for generated names (no vowels, no look-alikes).
pub fn pod_template_hash(template: &Value, collision_count: Option<i64>) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut text = String::new();
    canonical_json(template, &mut text);
    if let Some(c) = collision_count {
        text.push_str(&format!("#{c}"));
    }
    let mut hash: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let mut out = String::new();
    loop {
        out.push(ALPHABET[(hash % ALPHABET.len() as u32) as usize] as char);
        hash /= ALPHABET.len() as u32;
        if hash == 0 {
            break;
        }
    }
    out
}

/// A ReplicaSet's template without the pod-template-hash label, to compare with a Deployment's.
fn template_without_hash(rs: &Value) -> Value {
    let mut t = rs.at("/spec/template").cloned().unwrap_or(Value::Null);
    if let Some(labels) = t.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        labels.remove(POD_TEMPLATE_HASH);
    }
    t
}

fn condition<'a>(d: &'a Value, type_: &str) -> Option<&'a Value> {
    d.at("/status/conditions")?.as_array()?.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// A condition, keeping `lastTransitionTime` while its status stays the same and
/// `lastUpdateTime` while nothing about it changes.
fn make_condition(previous: Option<&Value>, type_: &str, status: &str, reason: &str, message: &str, touch: bool) -> Value {
    let now = json!(podutil::format_time(podutil::now()));
    let same_status = previous.is_some_and(|p| p.get("status").and_then(Value::as_str) == Some(status));
    let same_all = same_status
        && previous.is_some_and(|p| {
            p.get("reason").and_then(Value::as_str) == Some(reason) && p.get("message").and_then(Value::as_str) == Some(message)
        });
    let kept = |field: &str| previous.and_then(|p| p.get(field)).cloned().unwrap_or_else(|| now.clone());
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastUpdateTime": if same_all && !touch { kept("lastUpdateTime") } else { now.clone() },
        "lastTransitionTime": if same_status { kept("lastTransitionTime") } else { now },
    })
}

/// Where a Deployment's ReplicaSets stand, as the computation of one reconcile sees them.
struct Sets {
    new: Option<Arc<Value>>,
    old: Vec<Arc<Value>>,
}

impl Sets {
    fn all(&self) -> impl Iterator<Item = &Arc<Value>> {
        self.new.iter().chain(self.old.iter())
    }

    fn spec_total(&self) -> i64 {
        self.all().map(|rs| replicas_of(rs)).sum()
    }

    fn replace(&mut self, updated: Value) {
        let updated = Arc::new(updated);
        if self.new.as_ref().is_some_and(|n| meta::uid(n) == meta::uid(&updated)) {
            self.new = Some(updated);
        } else if let Some(slot) = self.old.iter_mut().find(|o| meta::uid(o) == meta::uid(&updated)) {
            *slot = updated;
        }
    }
}

impl DeploymentReconciler {
    async fn sync(&self, d: &Value) -> Result<Action, Error> {
        let ns = meta::namespace(d).unwrap_or("default");
        let selector = match selector_of(d) {
            Ok(s) if !s.is_empty() => s,
            _ => {
                let msg = "spec.selector is empty or invalid; no ReplicaSets are managed";
                self.events.record(d, EventType::Warning, "InvalidSelector", msg).await;
                return Ok(Action::Done);
            }
        };
        let owned = self.claim_replicasets(d, ns, &selector).await?;
        let template = d.at("/spec/template").cloned().unwrap_or(Value::Null);
        let (new, old): (Vec<Arc<Value>>, Vec<Arc<Value>>) = owned.into_iter().partition(|rs| template_without_hash(rs) == template);
        // Two ReplicaSets with the same template cannot both be created by us (same hash, same
        // name); if a user made one, the newest revision is the one rolled out.
        let mut new_iter = new.into_iter();
        let mut sets = Sets { new: new_iter.next(), old };
        sets.old.extend(new_iter);
        sets.old.sort_by(|a, b| oldest_first(a, b));

        let mut created_new: Option<String> = None;
        if meta::is_deleting(d) {
            return self.write_status(d, &sets, None).await;
        }
        if d.at("/spec/paused").and_then(Value::as_bool) == Some(true) {
            self.scale_paused(d, &mut sets).await?;
            return self.write_status(d, &sets, None).await;
        }

        let recreate = opt_str_at(d, "/spec/strategy/type") == Some("Recreate");
        if recreate {
            if self.rollout_recreate(d, &mut sets, &mut created_new).await? {
                return self.write_status(d, &sets, created_new.as_deref()).await;
            }
        } else if self.rollout_rolling(d, &mut sets, &mut created_new).await? {
            return self.write_status(d, &sets, created_new.as_deref()).await;
        }
        if is_complete(d, &sets) {
            self.cleanup_history(d, &sets).await?;
        }
        self.write_status(d, &sets, created_new.as_deref()).await
    }

    /// The ReplicaSets this Deployment controls after adopting matching orphans and releasing
    /// its ReplicaSets whose labels stopped matching.
    async fn claim_replicasets(&self, d: &Value, ns: &str, selector: &LabelSelector) -> Result<Vec<Arc<Value>>, ApiError> {
        let d_uid = meta::uid(d);
        let mut owned = Vec::new();
        let mut orphans = Vec::new();
        for rs in self.replicasets.by_namespace(ns) {
            match meta::controller_uid(&rs) {
                Some(u) if u == d_uid => {
                    if selector.matches_object(&rs) || meta::is_deleting(&rs) {
                        owned.push(rs);
                    } else {
                        let patch = podutil::release_patch(&rs, d_uid);
                        match self.client.patch(&kinds::REPLICASET, Some(ns), meta::name(&rs), Patch::Merge(patch)).await {
                            Ok(_) => {}
                            Err(e) if e.is_not_found() => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                None if selector.matches_object(&rs) && !meta::is_deleting(&rs) => orphans.push(rs),
                _ => {}
            }
        }
        if !orphans.is_empty() && !meta::is_deleting(d) {
            let fresh = self.client.get(&kinds::DEPLOYMENT, Some(ns), meta::name(d)).await?;
            if meta::uid(&fresh) == d_uid && !meta::is_deleting(&fresh) {
                for rs in orphans {
                    let patch = podutil::adopt_patch(&rs, d, &kinds::DEPLOYMENT);
                    match self.client.patch(&kinds::REPLICASET, Some(ns), meta::name(&rs), Patch::Merge(patch)).await {
                        Ok(adopted) => {
                            let msg = format!("Adopted replica set {}", meta::name(&rs));
                            self.events.record(d, EventType::Normal, "Adopted", &msg).await;
                            owned.push(Arc::new(adopted));
                        }
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(owned)
    }

    /// One step of a rolling update; `true` when it scaled something (status is written and the
    /// ReplicaSet's change brings the Deployment back).
    async fn rollout_rolling(&self, d: &Value, sets: &mut Sets, created: &mut Option<String>) -> Result<bool, Error> {
        let replicas = replicas_of(d);
        let (surge, unavailable) = fenceposts(d);
        if sets.new.is_none() {
            let room = (replicas + surge - sets.spec_total()).max(0);
            let rs = self.create_new_replicaset(d, sets, room.min(replicas)).await?;
            *created = Some(meta::name(&rs).to_string());
            sets.new = Some(Arc::new(rs));
        }
        self.sync_new_revision(d, sets).await?;
        let Some(new) = sets.new.clone() else { return Ok(false) };

        // Scale the new ReplicaSet up within the surge (or down to `replicas`).
        let new_replicas = replicas_of(&new);
        let target = if new_replicas > replicas {
            replicas
        } else {
            let room = replicas + surge - sets.spec_total();
            new_replicas + room.max(0).min(replicas - new_replicas)
        };
        if target != new_replicas {
            let updated = self.scale(d, &new, target).await?;
            sets.replace(updated);
            return Ok(true);
        }

        // Scale old ReplicaSets down while enough pods stay available.
        if sets.old.iter().all(|rs| replicas_of(rs) == 0) {
            return Ok(false);
        }
        let min_available = replicas - unavailable;
        let new_unavailable = (replicas_of(&new) - status_i64(&new, "availableReplicas")).max(0);
        let max_scaled_down = sets.spec_total() - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        let mut budget = max_scaled_down;
        let mut scaled = false;
        // Pods that are not available cost no availability: remove those first.
        for rs in sets.old.clone() {
            let unhealthy = (replicas_of(&rs) - status_i64(&rs, "availableReplicas")).max(0).min(replicas_of(&rs));
            if budget == 0 || unhealthy == 0 {
                continue;
            }
            let down = unhealthy.min(budget);
            let updated = self.scale(d, &rs, replicas_of(&rs) - down).await?;
            sets.replace(updated);
            budget -= down;
            scaled = true;
        }
        let available: i64 = sets.all().map(|rs| status_i64(rs, "availableReplicas").min(replicas_of(rs))).sum();
        let mut excess = (available - min_available).min(budget);
        for rs in sets.old.clone() {
            if excess <= 0 {
                break;
            }
            let current = replicas_of(&rs);
            if current == 0 {
                continue;
            }
            let down = current.min(excess);
            let updated = self.scale(d, &rs, current - down).await?;
            sets.replace(updated);
            excess -= down;
            scaled = true;
        }
        Ok(scaled)
    }

    /// Recreate: every old ReplicaSet to zero, wait for their pods to be gone, then the new one up.
    async fn rollout_recreate(&self, d: &Value, sets: &mut Sets, created: &mut Option<String>) -> Result<bool, Error> {
        let mut scaled = false;
        for rs in sets.old.clone() {
            if replicas_of(&rs) != 0 {
                let updated = self.scale(d, &rs, 0).await?;
                sets.replace(updated);
                scaled = true;
            }
        }
        if scaled {
            return Ok(true);
        }
        let old_pods_remain = sets.old.iter().any(|rs| {
            self.pods.pod_views_by_controller_uid(meta::uid(rs)).iter().any(|p| !matches!(p.phase(), "Failed" | "Succeeded"))
        });
        if old_pods_remain {
            return Ok(true);
        }
        let replicas = replicas_of(d);
        if sets.new.is_none() {
            let rs = self.create_new_replicaset(d, sets, replicas).await?;
            *created = Some(meta::name(&rs).to_string());
            sets.new = Some(Arc::new(rs));
        }
        self.sync_new_revision(d, sets).await?;
        if let Some(new) = sets.new.clone()
            && replicas_of(&new) != replicas
        {
            let updated = self.scale(d, &new, replicas).await?;
            sets.replace(updated);
            return Ok(true);
        }
        Ok(false)
    }

    /// A paused Deployment still scales: the one ReplicaSet with pods (or the new one) follows
    /// `replicas`; nothing else moves until it is resumed.
    async fn scale_paused(&self, d: &Value, sets: &mut Sets) -> Result<(), Error> {
        let active: Vec<Arc<Value>> = sets.all().filter(|rs| replicas_of(rs) > 0).cloned().collect();
        let target = match (active.as_slice(), &sets.new) {
            ([only], _) => Some(only.clone()),
            ([], Some(new)) => Some(new.clone()),
            _ => None,
        };
        if let Some(rs) = target
            && replicas_of(&rs) != replicas_of(d)
        {
            let updated = self.scale(d, &rs, replicas_of(d)).await?;
            sets.replace(updated);
        }
        Ok(())
    }

    /// Creates `<deployment>-<hash>`. A name already taken by a ReplicaSet with another template
    /// is a hash collision: the collision count goes up and the next reconcile tries a new name.
    async fn create_new_replicaset(&self, d: &Value, sets: &Sets, replicas: i64) -> Result<Value, Error> {
        let ns = meta::namespace(d);
        let collisions = d.at("/status/collisionCount").and_then(Value::as_i64);
        let template = d.at("/spec/template").cloned().unwrap_or(Value::Null);
        let hash = pod_template_hash(&template, collisions);
        let name = format!("{}-{hash}", meta::name(d));
        let revision = sets.old.iter().map(|rs| revision_of(rs)).max().unwrap_or(0) + 1;

        let mut rs_template = template.clone();
        if !rs_template.at("/metadata/labels").is_some_and(Value::is_object) {
            rs_template["metadata"]["labels"] = json!({});
        }
        rs_template["metadata"]["labels"][POD_TEMPLATE_HASH] = json!(hash);
        let mut selector = d.at("/spec/selector").cloned().unwrap_or_else(|| json!({}));
        if !selector.get("matchLabels").is_some_and(Value::is_object) {
            selector["matchLabels"] = json!({});
        }
        selector["matchLabels"][POD_TEMPLATE_HASH] = json!(hash);
        let mut labels = template.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
        labels.insert(POD_TEMPLATE_HASH.into(), json!(hash));
        let mut spec = json!({"replicas": replicas, "selector": selector, "template": rs_template});
        if let Some(m) = d.at("/spec/minReadySeconds") {
            spec["minReadySeconds"] = m.clone();
        }
        let rs = json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                "annotations": {REVISION_ANNOTATION: revision.to_string()},
                "ownerReferences": [podutil::owner_reference_to(d, &kinds::DEPLOYMENT)]},
            "spec": spec,
        });
        match self.client.create(&kinds::REPLICASET, ns, rs).await {
            Ok(created) => {
                let msg = format!("Scaled up replica set {name} from 0 to {replicas}");
                self.events.record(d, EventType::Normal, "ScalingReplicaSet", &msg).await;
                Ok(created)
            }
            Err(e) if e.is_already_exists() => {
                let existing = self.client.get(&kinds::REPLICASET, ns, &name).await?;
                if meta::controller_uid(&existing) == Some(meta::uid(d)) && template_without_hash(&existing) == template {
                    return Ok(existing);
                }
                let count = collisions.unwrap_or(0) + 1;
                let patch = json!({"status": {"collisionCount": count}});
                self.client.patch_status(&kinds::DEPLOYMENT, ns, meta::name(d), Patch::Merge(patch)).await?;
                Err(format!("replica set {name} exists with another template; collision count is now {count}").into())
            }
            Err(e) => {
                let msg = format!("Failed to create new replica set {name}: {e}");
                self.events.record(d, EventType::Warning, "FailedCreate", &msg).await;
                Err(e.into())
            }
        }
    }

    /// The new ReplicaSet carries the highest revision (a rollback revives an old one) and the
    /// Deployment's `minReadySeconds`; the Deployment carries the same revision.
    async fn sync_new_revision(&self, d: &Value, sets: &mut Sets) -> Result<(), Error> {
        let Some(new) = sets.new.clone() else { return Ok(()) };
        let max_old = sets.old.iter().map(|rs| revision_of(rs)).max().unwrap_or(0);
        let mut revision = revision_of(&new);
        let min_ready = d.at("/spec/minReadySeconds").cloned().unwrap_or(json!(0));
        let rs_min_ready = new.at("/spec/minReadySeconds").cloned().unwrap_or(json!(0));
        if revision <= max_old || min_ready != rs_min_ready {
            revision = revision.max(max_old + 1);
            let patch = json!({"metadata": {"annotations": {REVISION_ANNOTATION: revision.to_string()}},
                "spec": {"minReadySeconds": min_ready}});
            let updated = self.client.patch(&kinds::REPLICASET, meta::namespace(&new), meta::name(&new), Patch::Merge(patch)).await?;
            sets.replace(updated);
        }
        let want = revision.to_string();
        if opt_str_at(d, "/metadata/annotations/deployment.kubernetes.io~1revision") != Some(want.as_str()) {
            let patch = json!({"metadata": {"annotations": {REVISION_ANNOTATION: want}}});
            self.client.patch(&kinds::DEPLOYMENT, meta::namespace(d), meta::name(d), Patch::Merge(patch)).await?;
        }
        Ok(())
    }

    async fn scale(&self, d: &Value, rs: &Value, replicas: i64) -> Result<Value, ApiError> {
        let from = replicas_of(rs);
        let patch = json!({"spec": {"replicas": replicas}});
        let updated = self.client.patch(&kinds::REPLICASET, meta::namespace(rs), meta::name(rs), Patch::Merge(patch)).await?;
        let direction = if replicas > from { "up" } else { "down" };
        let msg = format!("Scaled {direction} replica set {} from {from} to {replicas}", meta::name(rs));
        self.events.record(d, EventType::Normal, "ScalingReplicaSet", &msg).await;
        Ok(updated)
    }

    /// Deletes the oldest ReplicaSets at zero replicas beyond `revisionHistoryLimit`.
    async fn cleanup_history(&self, d: &Value, sets: &Sets) -> Result<(), Error> {
        let limit = d.at("/spec/revisionHistoryLimit").and_then(Value::as_i64).unwrap_or(10).max(0) as usize;
        let mut idle: Vec<&Arc<Value>> = sets
            .old
            .iter()
            .filter(|rs| replicas_of(rs) == 0 && status_i64(rs, "replicas") == 0 && !meta::is_deleting(rs))
            .collect();
        if idle.len() <= limit {
            return Ok(());
        }
        idle.sort_by(|a, b| revision_of(a).cmp(&revision_of(b)).then_with(|| oldest_first(a, b)));
        let excess = idle.len() - limit;
        for rs in idle.into_iter().take(excess) {
            let params = DeleteParams { precondition_uid: Some(meta::uid(rs).to_string()), ..Default::default() };
            match self.client.delete(&kinds::REPLICASET, meta::namespace(rs), meta::name(rs), &params).await {
                Ok(_) => {
                    let msg = format!("Deleted old replica set {} (revision history limit {limit})", meta::name(rs));
                    self.events.record(d, EventType::Normal, "SuccessfulDelete", &msg).await;
                }
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes status and conditions; requeues to notice a missed progress deadline.
    async fn write_status(&self, d: &Value, sets: &Sets, created_new: Option<&str>) -> Result<Action, Error> {
        let (status, wait) = compute_status(d, sets, created_new);
        let current = d.get("status").cloned().unwrap_or_else(|| json!({}));
        if current != status {
            let patch = Patch::Merge(json!({"status": status}));
            match self.client.patch_status(&kinds::DEPLOYMENT, meta::namespace(d), meta::name(d), patch).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(wait.map_or(Action::Done, Action::RequeueAfter))
    }
}

/// All replicas updated, present and available, for the current generation.
fn is_complete(d: &Value, sets: &Sets) -> bool {
    let replicas = replicas_of(d);
    let Some(new) = &sets.new else { return false };
    let total: i64 = sets.all().map(|rs| status_i64(rs, "replicas")).sum();
    let available: i64 = sets.all().map(|rs| status_i64(rs, "availableReplicas")).sum();
    status_i64(new, "replicas") == replicas && total == replicas && available >= replicas
}

fn compute_status(d: &Value, sets: &Sets, created_new: Option<&str>) -> (Value, Option<Duration>) {
    let replicas = replicas_of(d);
    let sum = |f: &str| -> i64 { sets.all().map(|rs| status_i64(rs, f)).sum() };
    let total = sum("replicas");
    let updated = sets.new.as_ref().map_or(0, |n| status_i64(n, "replicas"));
    let ready = sum("readyReplicas");
    let available = sum("availableReplicas");
    let unavailable = (sets.spec_total().max(replicas) - available).max(0);
    let (_, max_unavailable) = fenceposts(d);

    let mut status = Map::new();
    status.insert("observedGeneration".into(), json!(meta::generation(d)));
    status.insert("replicas".into(), json!(total));
    status.insert("updatedReplicas".into(), json!(updated));
    status.insert("readyReplicas".into(), json!(ready));
    status.insert("availableReplicas".into(), json!(available));
    status.insert("unavailableReplicas".into(), json!(unavailable));
    if let Some(c) = d.at("/status/collisionCount") {
        status.insert("collisionCount".into(), c.clone());
    }

    let available_cond = if available >= replicas - max_unavailable {
        make_condition(condition(d, "Available"), "Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.", false)
    } else {
        make_condition(condition(d, "Available"), "Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.", false)
    };

    let previous = condition(d, "Progressing");
    let new_name = sets.new.as_ref().map(|n| meta::name(n).to_string()).unwrap_or_default();
    let deadline = d.at("/spec/progressDeadlineSeconds").and_then(Value::as_u64).map(Duration::from_secs);
    let paused = d.at("/spec/paused").and_then(Value::as_bool) == Some(true);
    let complete = is_complete(d, sets);
    let old_status = d.get("status").cloned().unwrap_or_else(|| json!({}));
    let num = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).unwrap_or(0);
    let progressed = updated > num(&old_status, "updatedReplicas")
        || total - updated < num(&old_status, "replicas") - num(&old_status, "updatedReplicas")
        || ready > num(&old_status, "readyReplicas")
        || available > num(&old_status, "availableReplicas");
    let reason_of = |c: Option<&Value>| c.and_then(|c| c.get("reason")).and_then(Value::as_str).map(str::to_string);
    let mut wait = None;
    let progressing = if paused {
        Some(make_condition(previous, "Progressing", "Unknown", "DeploymentPaused", "Deployment is paused", false))
    } else if let Some(name) = created_new {
        Some(make_condition(previous, "Progressing", "True", "NewReplicaSetCreated", &format!("Created new replica set \"{name}\""), true))
    } else if complete {
        let msg = format!("ReplicaSet \"{new_name}\" has successfully progressed.");
        Some(make_condition(previous, "Progressing", "True", "NewReplicaSetAvailable", &msg, false))
    } else if progressed || previous.is_none() || reason_of(previous).as_deref() == Some("DeploymentPaused") {
        let msg = format!("ReplicaSet \"{new_name}\" is progressing.");
        Some(make_condition(previous, "Progressing", "True", "ReplicaSetUpdated", &msg, true))
    } else {
        previous.cloned()
    };
    // Past the deadline without progress: the rollout has failed, as `kubectl rollout status` reports.
    // A condition still saying the last rollout completed measures no rollout: a scale (or a
    // resync that sees new work before its progress) must not be timed out against the time
    // that rollout finished, which may be long ago. As in Kubernetes, the condition catches up
    // (ReplicaSetUpdated) once the new replicas progress, and the deadline runs from there.
    let progressing = match (progressing, deadline) {
        (Some(cond), Some(deadline)) if !paused && !complete => {
            let reason = reason_of(Some(&cond)).unwrap_or_default();
            let since = cond.get("lastUpdateTime").and_then(Value::as_str).and_then(podutil::parse_time);
            match since {
                _ if reason == "ProgressDeadlineExceeded" || reason == "NewReplicaSetAvailable" => Some(cond),
                Some(since) => {
                    let waited = podutil::elapsed(since, podutil::now());
                    if waited > deadline {
                        let msg = format!("ReplicaSet \"{new_name}\" has timed out progressing.");
                        Some(make_condition(Some(&cond), "Progressing", "False", "ProgressDeadlineExceeded", &msg, false))
                    } else {
                        wait = Some(deadline - waited + Duration::from_secs(1));
                        Some(cond)
                    }
                }
                None => Some(cond),
            }
        }
        (cond, _) => cond,
    };
    let mut conditions = vec![available_cond];
    conditions.extend(progressing);
    status.insert("conditions".into(), Value::Array(conditions));
    (Value::Object(status), wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_template_hash_is_stable_whatever_the_key_order_and_changes_with_the_template() {
        let a = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}, "spec": {"containers": [{"name": "web", "image": "a"}]}});
        let b = json!({"spec": {"containers": [{"image": "a", "name": "web"}]}, "metadata": {"labels": {"tier": "fe", "app": "web"}}});
        let c = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}, "spec": {"containers": [{"name": "web", "image": "b"}]}});
        assert_eq!(pod_template_hash(&a, None), pod_template_hash(&b, None));
        assert_ne!(pod_template_hash(&a, None), pod_template_hash(&c, None));
        assert_ne!(pod_template_hash(&a, None), pod_template_hash(&a, Some(1)));
        assert!(pod_template_hash(&a, None).bytes().all(|ch| b"bcdfghjklmnpqrstvwxz2456789".contains(&ch)));
    }

    #[test]
    fn surge_rounds_up_unavailable_rounds_down_and_both_zero_allows_one_unavailable() {
        let d = |surge: Value, unavailable: Value, replicas: i64| {
            json!({"spec": {"replicas": replicas, "strategy": {"type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}}})
        };
        assert_eq!(fenceposts(&d(json!("25%"), json!("25%"), 10)), (3, 2));
        assert_eq!(fenceposts(&d(json!(1), json!(0), 3)), (1, 0));
        assert_eq!(fenceposts(&d(json!("10%"), json!("10%"), 3)), (1, 0));
        assert_eq!(fenceposts(&d(json!("0%"), json!("10%"), 3)), (0, 1));
        assert_eq!(fenceposts(&json!({"spec": {"replicas": 4}})), (1, 1));
    }
}
