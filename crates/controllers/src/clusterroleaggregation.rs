//! Writes into each ClusterRole with an `aggregationRule` the rules of the ClusterRoles its
//! `clusterRoleSelectors` select, as Kubernetes' clusterrole-aggregation controller does, so that
//! `kubectl get clusterrole admin -o yaml` shows what the role grants.
//!
//! An aggregating role's `rules` are this controller's: the union of the selected roles' rules, in
//! the order of the roles' names, without duplicates; rules written there by hand are replaced.
//! Aggregation chains through the labels of aggregating roles (`edit` is labelled to add to `admin`):
//! once `edit` is written, `admin`'s selection of it changes, and `admin` is written in turn.

use std::sync::Arc;

use serde_json::Value;
use shepherd_api::kinds;
use shepherd_api::{JsonPath, LabelSelector};
use shepherd_runtime::{Action, Cache, Client, Controller, Manager};

use crate::ControllerConfig;

struct Aggregator {
    client: Arc<dyn Client>,
    roles: Arc<Cache>,
}

/// The selectors of an aggregating role; None for a role that aggregates nothing. A selector that
/// cannot be read selects nothing, rather than everything.
fn selectors(role: &Value) -> Option<Vec<LabelSelector>> {
    let list = role.at("/aggregationRule/clusterRoleSelectors")?.as_array()?;
    Some(list.iter().filter_map(|s| LabelSelector::from_k8s(s).ok()).collect())
}

fn name_of(role: &Value) -> &str {
    role.at("/metadata/name").and_then(Value::as_str).unwrap_or_default()
}

/// The rules `name` aggregates from `roles` through `selectors`.
fn aggregated_rules(name: &str, selectors: &[LabelSelector], roles: &[Arc<Value>]) -> Vec<Value> {
    let mut selected: Vec<&Arc<Value>> = roles
        .iter()
        .filter(|r| name_of(r) != name && selectors.iter().any(|s| s.matches_object(r)))
        .collect();
    selected.sort_by(|a, b| name_of(a).cmp(name_of(b)));
    let mut rules: Vec<Value> = Vec::new();
    for role in selected {
        for rule in role.get("rules").and_then(Value::as_array).into_iter().flatten() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
    }
    rules
}

impl Aggregator {
    async fn reconcile(&self, name: &str) -> Result<Action, shepherd_runtime::controller::Error> {
        let Some(role) = self.roles.get(name) else { return Ok(Action::Done) };
        let Some(selectors) = selectors(&role) else { return Ok(Action::Done) };
        let rules = aggregated_rules(name, &selectors, &self.roles.list());
        let current = role.get("rules").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        if current == rules.as_slice() {
            return Ok(Action::Done);
        }
        let mut updated = (*role).clone();
        updated["rules"] = Value::Array(rules);
        match self.client.update(&kinds::CLUSTERROLE, None, updated).await {
            Ok(_) => {
                tracing::info!(clusterrole = name, "aggregated rules written");
                Ok(Action::Done)
            }
            // A newer version or a deletion is on its way through the cache; it brings us back.
            Err(e) if e.is_not_found() || matches!(e, shepherd_api::ApiError::Conflict { .. }) => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// The controller that keeps every aggregating ClusterRole's `rules` the union of those it selects.
pub fn clusterrole_aggregation_controller(client: Arc<dyn Client>, manager: &Manager, config: ControllerConfig) -> Controller {
    let roles = manager.informers().cache(&kinds::CLUSTERROLE);
    let reconciler = Arc::new(Aggregator { client, roles: roles.clone() });
    Controller::new("clusterrole-aggregation", &kinds::CLUSTERROLE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    // Any ClusterRole may be selected by any aggregating one: a change reconsiders them all.
    .watches(&kinds::CLUSTERROLE, move |_| {
        roles.list().iter().filter(|r| r.at("/aggregationRule").is_some_and(|a| !a.is_null())).map(|r| name_of(r).to_string()).collect()
    })
    .workers(config.workers)
    .mode(config.mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role(name: &str, labels: Value, rules: Value) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "labels": labels}, "rules": rules}))
    }

    #[test]
    fn the_selected_roles_rules_join_in_name_order_without_duplicates() {
        let to_edit = json!({"rbac.authorization.k8s.io/aggregate-to-edit": "true"});
        let pods = json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]});
        let widgets = json!({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["*"]});
        let roles = vec![
            role("z-widgets", to_edit.clone(), json!([widgets, pods])),
            role("a-pods", to_edit.clone(), json!([pods])),
            role("unrelated", json!({}), json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])),
            role("edit", to_edit, json!([{"apiGroups": ["x"], "resources": ["self"], "verbs": ["get"]}])),
        ];
        let sel = LabelSelector::from_k8s(&json!({"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}))
            .expect("selector");
        assert_eq!(aggregated_rules("edit", &[sel], &roles), vec![pods.clone(), widgets.clone()]);
        assert!(aggregated_rules("edit", &[], &roles).is_empty(), "no selectors select nothing");
    }
}
