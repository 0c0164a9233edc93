//! The disruption controller: keeps each PodDisruptionBudget's status (expected, healthy and
//! desired pods, and how many disruptions are allowed now) for the eviction subresource to judge
//! evictions by.
//!
//! Pods the eviction subresource let go are listed in `status.disruptedPods` until they are seen
//! terminating (or two minutes pass): until then they still look healthy but must not count, or
//! two quick evictions could both spend the same allowance.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use shepherd_api::{JsonPath, LabelSelector, kinds};
use shepherd_api::{meta, opt_str_at, pod};
use shepherd_runtime::cache::object_key;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, Manager};

use crate::config::ControllerConfig;
use crate::podutil;

/// How long an evicted pod may take to show its deletion before the budget stops waiting for it
/// (Kubernetes' `DeletionTimeout`).
pub const DISRUPTED_POD_TIMEOUT: Duration = Duration::from_secs(120);

/// The disruption controller. Pod changes enqueue the budgets covering the pod; scale changes of
/// ReplicaSets and Deployments enqueue the budgets of their namespace (percentages and
/// `maxUnavailable` count against the owners' replicas).
pub fn disruption_controller(client: Arc<dyn Client>, manager: &Manager, config: ControllerConfig) -> Controller {
    let informers = manager.informers();
    let pdbs = informers.cache(&kinds::PODDISRUPTIONBUDGET);
    let reconciler = Arc::new(DisruptionController {
        client,
        pdbs: pdbs.clone(),
        pods: informers.cache(&kinds::POD),
        replicasets: informers.cache(&kinds::REPLICASET),
        deployments: informers.cache(&kinds::DEPLOYMENT),
    });
    let (for_rs, for_deploy) = (pdbs.clone(), pdbs.clone());
    Controller::new("disruption", &kinds::PODDISRUPTIONBUDGET, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    .watches(&kinds::POD, move |pod| {
        let ns = opt_str_at(pod, "/metadata/namespace").unwrap_or("");
        pdbs.by_namespace(ns).iter().filter(|b| selects(b, pod)).filter_map(|b| object_key(b)).collect()
    })
    .watches(&kinds::REPLICASET, move |rs| budgets_in_namespace(&for_rs, rs))
    .watches(&kinds::DEPLOYMENT, move |d| budgets_in_namespace(&for_deploy, d))
    .workers(config.workers)
    .mode(config.mode)
}

fn budgets_in_namespace(pdbs: &Cache, obj: &Value) -> Vec<String> {
    pdbs.by_namespace(opt_str_at(obj, "/metadata/namespace").unwrap_or("")).iter().filter_map(|b| object_key(b)).collect()
}

/// The budget's selector; `None` when it has none, which in `policy/v1` selects no pods (an empty
/// selector selects every pod of the namespace).
pub fn budget_selector(pdb: &Value) -> Option<LabelSelector> {
    LabelSelector::from_k8s(pdb.at("/spec/selector").filter(|s| !s.is_null())?).ok()
}

/// Whether the budget covers `pod` (same namespace, selector matches).
pub fn selects(pdb: &Value, pod: &Value) -> bool {
    opt_str_at(pdb, "/metadata/namespace") == opt_str_at(pod, "/metadata/namespace")
        && budget_selector(pdb).is_some_and(|s| s.matches_object(pod))
}

/// An `IntOrString` of a budget resolved against `total`: a count as is, a percentage rounded up.
fn scaled(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total + 99) / 100)
        }
        _ => None,
    }
}

struct DisruptionController {
    client: Arc<dyn Client>,
    pdbs: Arc<Cache>,
    pods: Arc<Cache>,
    replicasets: Arc<Cache>,
    deployments: Arc<Cache>,
}

impl DisruptionController {
    /// The replicas the pods' controllers want, each controller counted once; a pod without a
    /// controller counts for itself. A ReplicaSet owned by a Deployment counts as the Deployment.
    fn expected_scale(&self, ns: &str, pods: &[Arc<Value>]) -> i64 {
        let mut seen = HashSet::new();
        let mut total = 0;
        for pod in pods {
            let Some((kind, name, uid)) = shepherd_runtime::cache::controller_owner(pod) else {
                total += 1;
                continue;
            };
            let (kind, name, uid) = match (kind, self.replicasets.get(&format!("{ns}/{name}"))) {
                ("ReplicaSet", Some(rs)) => match shepherd_runtime::cache::controller_owner(&rs) {
                    Some(("Deployment", d, duid)) => ("Deployment", d.to_string(), duid.to_string()),
                    _ => (kind, name.to_string(), uid.to_string()),
                },
                _ => (kind, name.to_string(), uid.to_string()),
            };
            if !seen.insert(uid) {
                continue;
            }
            let owner = match kind {
                "Deployment" => self.deployments.get(&format!("{ns}/{name}")),
                "ReplicaSet" => self.replicasets.get(&format!("{ns}/{name}")),
                _ => None,
            };
            total += owner.and_then(|o| o.at("/spec/replicas").and_then(Value::as_i64)).unwrap_or(1);
        }
        total
    }

    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let Some(pdb) = self.pdbs.get(key) else { return Ok(Action::Done) };
        let ns = opt_str_at(&pdb, "/metadata/namespace").unwrap_or("");
        let pods: Vec<Arc<Value>> = match budget_selector(&pdb) {
            Some(sel) => self.pods.by_namespace_where(ns, |p| p.matches(&sel)),
            None => Vec::new(),
        };
        let spec = |f: &str| pdb.at(&format!("/spec/{f}")).filter(|v| !v.is_null());
        let (expected, desired) = match (spec("minAvailable"), spec("maxUnavailable")) {
            (Some(min @ Value::Number(_)), _) => (pods.len() as i64, scaled(min, 0).unwrap_or(0)),
            (Some(min), _) => {
                let expected = self.expected_scale(ns, &pods);
                (expected, scaled(min, expected).unwrap_or(0))
            }
            (None, Some(max)) => {
                let expected = self.expected_scale(ns, &pods);
                (expected, (expected - scaled(max, expected).unwrap_or(0)).max(0))
            }
            (None, None) => (pods.len() as i64, 0),
        };

        // Evicted pods stay counted as disrupted until they show their deletion or time out.
        let now = podutil::now();
        let present: HashSet<&str> =
            pods.iter().filter(|p| !meta::is_deleting(p)).map(|p| meta::name(p)).collect();
        let mut disrupted = Map::new();
        let mut next_expiry: Option<Duration> = None;
        for (name, at) in pdb.at("/status/disruptedPods").and_then(Value::as_object).into_iter().flatten() {
            let Some(since) = at.as_str().and_then(podutil::parse_time) else { continue };
            let age = podutil::elapsed(since, now);
            if present.contains(name.as_str()) && age < DISRUPTED_POD_TIMEOUT {
                let left = DISRUPTED_POD_TIMEOUT - age;
                next_expiry = Some(next_expiry.map_or(left, |n| n.min(left)));
                disrupted.insert(name.clone(), at.clone());
            }
        }
        let healthy = pods
            .iter()
            .filter(|p| pod::is_ready(p) && !meta::is_deleting(p) && !disrupted.contains_key(meta::name(p)))
            .count() as i64;
        let allowed = if expected <= 0 { 0 } else { (healthy - desired).max(0) };

        let mut status = json!({
            "observedGeneration": meta::generation(&pdb),
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": allowed,
            "expectedPods": expected,
        });
        if !disrupted.is_empty() {
            status["disruptedPods"] = Value::Object(disrupted);
        }
        let (cond_status, reason) = if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
        let previous = pdb.at("/status/conditions").and_then(Value::as_array).and_then(|cs| {
            cs.iter().find(|c| opt_str_at(c, "/type") == Some("DisruptionAllowed"))
        });
        let since = previous
            .filter(|c| opt_str_at(c, "/status") == Some(cond_status))
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(podutil::format_time(now)));
        status["conditions"] = json!([{"type": "DisruptionAllowed", "status": cond_status, "reason": reason,
            "message": "", "observedGeneration": meta::generation(&pdb), "lastTransitionTime": since}]);

        let requeue = next_expiry.map_or(Action::Done, |d| Action::RequeueAfter(d + Duration::from_millis(1)));
        if pdb.get("status") == Some(&status) {
            return Ok(requeue);
        }
        let mut updated = (*pdb).clone();
        updated["status"] = status;
        // The cached resourceVersion is the precondition. A conflict means a newer budget (an
        // eviction's, or this controller's own last write) is on its way to the cache, and its
        // arrival reconciles the budget again.
        match self.client.update_status(&kinds::PODDISRUPTIONBUDGET, Some(ns), updated).await {
            Ok(_) => Ok(requeue),
            Err(e) if e.is_conflict() || e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_up_as_kubernetes_does() {
        assert_eq!(scaled(&json!("50%"), 3), Some(2));
        assert_eq!(scaled(&json!("100%"), 3), Some(3));
        assert_eq!(scaled(&json!(2), 10), Some(2));
        assert_eq!(scaled(&json!("x"), 3), None);
    }

    #[test]
    fn a_budget_without_a_selector_covers_no_pod_and_an_empty_one_covers_all() {
        let pod = json!({"metadata": {"namespace": "a", "labels": {"app": "web"}}});
        assert!(!selects(&json!({"metadata": {"namespace": "a"}, "spec": {}}), &pod));
        assert!(selects(&json!({"metadata": {"namespace": "a"}, "spec": {"selector": {}}}), &pod));
        assert!(!selects(&json!({"metadata": {"namespace": "b"}, "spec": {"selector": {}}}), &pod));
    }
}
