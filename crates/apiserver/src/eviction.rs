//! The `pods/{name}/eviction` subresource: deletes a pod unless that would break a
//! PodDisruptionBudget covering it, spending one of the budget's allowed disruptions atomically.
//!
//! The budget's status is the ledger: the eviction decrements `disruptionsAllowed` and records
//! the pod in `disruptedPods` in one conditional write, so two evictions racing for the last
//! allowed disruption cannot both win; the disruption controller recomputes the status after.

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::selector::LabelSelector;
use shepherd_api::{ApiError, Cause, JsonPath, int_at, str_at};

use crate::codec;
use crate::service::{ApiService, DeleteOptions, ListOptions, now_rfc3339, set_condition};
use crate::write_options::WriteOptions;

/// The `Status` a successful eviction answers with (201, as Kubernetes).
pub(crate) fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

fn too_many_requests(cause: String) -> ApiError {
    ApiError::TooManyRequests {
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        causes: vec![Cause::new("DisruptionBudget", "", cause)],
    }
}

fn is_ready(pod: &Value) -> bool {
    pod.at("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| str_at(c, "/type") == "Ready" && str_at(c, "/status") == "True"))
}

const NO_DRY_RUN: &str = "dryRun is not supported on pods/eviction by Shepherd";

/// Checks an `Eviction` body (`policy/v1`, or `policy/v1beta1` as older clients send it) and
/// returns its delete options.
fn check_body(name: &str, body: &Value, delete_options: impl Fn(&[u8]) -> Result<DeleteOptions, ApiError>) -> Result<DeleteOptions, ApiError> {
    if !body.is_object() {
        return Err(ApiError::BadRequest("request body must be a JSON object".into()));
    }
    match body.get("apiVersion").and_then(Value::as_str) {
        None | Some("" | "policy/v1" | "policy/v1beta1") => {}
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({v}) does not match the expected API version (policy/v1)"
            )));
        }
    }
    match body.get("kind").and_then(Value::as_str) {
        None | Some("" | "Eviction") => {}
        Some(k) => {
            return Err(ApiError::BadRequest(format!("the kind in the data ({k}) does not match the expected kind (Eviction)")));
        }
    }
    let body_name = str_at(body, "/metadata/name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::BadRequest("name in URL does not match name in Eviction object".into()));
    }
    match body.get("deleteOptions").filter(|o| !o.is_null()) {
        None => Ok(DeleteOptions::default()),
        Some(opts) => {
            if opts.get("dryRun").and_then(Value::as_array).is_some_and(|d| !d.is_empty()) {
                return Err(ApiError::BadRequest(NO_DRY_RUN.into()));
            }
            delete_options(opts.to_string().as_bytes())
        }
    }
}

/// Evicts pod `name`: deletes it with the eviction's delete options when no budget covers it,
/// when it need not count (not running, already terminating), or when its one budget allows a
/// disruption, which it then spends. Otherwise 429, as Kubernetes answers. `dry_run`: the
/// request asked for `dryRun`, which evictions refuse rather than carry out for real.
pub(crate) async fn evict(
    svc: &ApiService,
    ns: &str,
    name: &str,
    body: &Value,
    dry_run: bool,
    delete_options: impl Fn(&[u8]) -> Result<DeleteOptions, ApiError>,
) -> Result<Value, ApiError> {
    if dry_run {
        return Err(ApiError::BadRequest(NO_DRY_RUN.into()));
    }
    let mut opts = check_body(name, body, delete_options)?;
    let pod = codec::decode(&svc.get(&kinds::POD, Some(ns), name).await?)?;
    // The pod evicted is the pod judged: a pod replaced under the same name meanwhile is not deleted.
    if opts.precondition_uid.is_none() {
        opts.precondition_uid = Some(str_at(&pod, "/metadata/uid").to_string());
    }
    let counts = matches!(str_at(&pod, "/status/phase"), "Running" | "Unknown" | "")
        && pod.at("/metadata/deletionTimestamp").is_none_or(Value::is_null);
    if counts && let Some(pdb) = covering_budget(svc, ns, &pod).await? {
        spend_disruption(svc, ns, &pdb, &pod).await?;
    }
    mark_disruption_target(svc, ns, name, &pod).await?;
    svc.delete(&kinds::POD, Some(ns), name, &opts).await?;
    Ok(success())
}

/// Records on a pod that stays while it terminates (it is on a node) why it is going, as
/// Kubernetes does with the `DisruptionTarget` condition.
async fn mark_disruption_target(svc: &ApiService, ns: &str, name: &str, pod: &Value) -> Result<(), ApiError> {
    let on_node = !str_at(pod, "/spec/nodeName").is_empty();
    let terminating = pod.at("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null());
    if !on_node || terminating || matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed") {
        return Ok(());
    }
    let uid = str_at(pod, "/metadata/uid").to_string();
    let write = WriteOptions::default();
    let marked = svc.mutate(&kinds::POD, Some(ns), name, None, "eviction", &write, |current| {
        if str_at(current, "/metadata/uid") != uid {
            return Err(ApiError::conflict("pods", name, "the pod was replaced during its eviction"));
        }
        let mut new = current.clone();
        set_condition(&mut new, "DisruptionTarget", "True", Some("EvictionByEvictionAPI"), Some("Eviction API: evicting"));
        Ok(new)
    });
    match marked.await {
        Ok(_) => Ok(()),
        // Gone meanwhile: the delete that follows answers for it.
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// The one budget covering `pod`, if any; more than one is an error, as in Kubernetes.
async fn covering_budget(svc: &ApiService, ns: &str, pod: &Value) -> Result<Option<Value>, ApiError> {
    let page = svc.list(&kinds::PODDISRUPTIONBUDGET, Some(ns), &ListOptions::default()).await?;
    let mut covering = Vec::new();
    for kv in &page.items {
        let pdb = codec::decode_listed(kv)?;
        let Some(selector) = pdb.at("/spec/selector").filter(|s| !s.is_null()) else { continue };
        if LabelSelector::from_k8s(selector).is_ok_and(|s| s.matches_object(pod)) {
            covering.push(pdb);
        }
    }
    if covering.len() > 1 {
        return Err(ApiError::Internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
        ));
    }
    Ok(covering.pop())
}

/// Spends one allowed disruption of `pdb` on `pod`, or refuses. An unready pod may go without
/// spending one when the budget is met anyway (`IfHealthyBudget`) or the budget says so
/// (`AlwaysAllow`).
async fn spend_disruption(svc: &ApiService, ns: &str, pdb: &Value, pod: &Value) -> Result<(), ApiError> {
    let pdb_name = str_at(pdb, "/metadata/name").to_string();
    let pod_name = str_at(pod, "/metadata/name").to_string();
    let pod_ready = is_ready(pod);
    svc.mutate(&kinds::PODDISRUPTIONBUDGET, Some(ns), &pdb_name, None, "status", &WriteOptions::default(), |current| {
        let observed = int_at(current, "/status/observedGeneration");
        let generation = int_at(current, "/metadata/generation");
        if observed < generation {
            return Err(too_many_requests(format!("The disruption budget {pdb_name} is still being processed by the server.")));
        }
        let (healthy, desired) = (int_at(current, "/status/currentHealthy"), int_at(current, "/status/desiredHealthy"));
        if !pod_ready {
            let policy = str_at(current, "/spec/unhealthyPodEvictionPolicy");
            if policy == "AlwaysAllow" || (healthy >= desired && desired > 0) {
                // Unchanged: nothing is written.
                return Ok(current.clone());
            }
        }
        let allowed = int_at(current, "/status/disruptionsAllowed");
        if allowed < 0 {
            return Err(ApiError::Forbidden("pdb disruptions allowed is negative".into()));
        }
        if allowed == 0 {
            return Err(too_many_requests(format!(
                "The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"
            )));
        }
        let mut new = current.clone();
        new["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if !new["status"]["disruptedPods"].is_object() {
            new["status"]["disruptedPods"] = json!({});
        }
        new["status"]["disruptedPods"][pod_name.as_str()] = json!(now_rfc3339());
        Ok(new)
    })
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_options(_: &[u8]) -> Result<DeleteOptions, ApiError> {
        Ok(DeleteOptions::default())
    }

    #[test]
    fn an_eviction_naming_another_pod_or_of_another_kind_is_a_bad_request() {
        let other = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "b"}});
        assert!(matches!(check_body("a", &other, no_options), Err(ApiError::BadRequest(m)) if m.contains("does not match")));
        let wrong_kind = json!({"apiVersion": "policy/v1", "kind": "Pod", "metadata": {"name": "a"}});
        assert!(matches!(check_body("a", &wrong_kind, no_options), Err(ApiError::BadRequest(_))));
        let old_client = json!({"apiVersion": "policy/v1beta1", "kind": "Eviction", "metadata": {"name": "a"}});
        assert!(check_body("a", &old_client, no_options).is_ok());
    }
}
