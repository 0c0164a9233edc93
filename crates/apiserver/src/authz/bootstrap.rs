//! The default roles and bindings every cluster starts with, reconciled at each start as Kubernetes does: a
//! missing one is created; one annotated `rbac.authorization.kubernetes.io/autoupdate: "true"` gets back
//! the rules or subjects it lacks (what was added to it is kept); one annotated `"false"` is left alone.

use serde_json::{Value, json};
use shepherd_api::ApiError;
use shepherd_api::kinds::{self, ResourceInfo};

use super::node::node_rules;
use super::rbac::PolicyRule;
use crate::service::ApiService;

const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
/// The label prefix by which a ClusterRole adds its rules to `admin`, `edit` or `view`.
const AGGREGATE_TO: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// Namespaced kinds users work with, by group, as `view`, `edit` and `admin` grant them.
const WORKLOADS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "pods",
            "services",
            "endpoints",
            "configmaps",
            "serviceaccounts",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "persistentvolumeclaims",
            "events",
        ],
    ),
    (
        "apps",
        &[
            "deployments",
            "deployments/scale",
            "replicasets",
            "replicasets/scale",
            "statefulsets",
            "statefulsets/scale",
            "daemonsets",
            "controllerrevisions",
        ],
    ),
    ("batch", &["jobs", "cronjobs"]),
    ("autoscaling", &["horizontalpodautoscalers"]),
    ("policy", &["poddisruptionbudgets"]),
    ("discovery.k8s.io", &["endpointslices"]),
];

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

fn view_rules() -> Vec<PolicyRule> {
    let mut rules: Vec<PolicyRule> = WORKLOADS.iter().map(|(g, r)| PolicyRule::resources(&[g], r, READ)).collect();
    rules.push(PolicyRule::resources(
        &[""],
        &["pods/log", "pods/status", "services/status", "namespaces", "namespaces/status"],
        READ,
    ));
    rules.push(PolicyRule::resources(
        &["apps"],
        &["deployments/status", "replicasets/status", "statefulsets/status", "daemonsets/status"],
        READ,
    ));
    rules.push(PolicyRule::resources(&["batch"], &["jobs/status", "cronjobs/status"], READ));
    rules.push(PolicyRule::resources(&["autoscaling"], &["horizontalpodautoscalers/status"], READ));
    rules
}

fn edit_rules() -> Vec<PolicyRule> {
    let mut rules = view_rules();
    rules.extend(WORKLOADS.iter().map(|(g, r)| PolicyRule::resources(&[g], r, WRITE)));
    rules.push(PolicyRule::resources(
        &[""],
        &["secrets"],
        &["get", "list", "watch", "create", "delete", "deletecollection", "patch", "update"],
    ));
    rules.push(PolicyRule::resources(&[""], &["pods/exec", "pods/attach", "pods/portforward"], &["create", "get"]));
    rules.push(PolicyRule::resources(&[""], &["pods/eviction", "serviceaccounts/token"], &["create"]));
    rules.push(PolicyRule::resources(&[""], &["serviceaccounts"], &["impersonate"]));
    rules
}

fn admin_rules() -> Vec<PolicyRule> {
    let mut rules = edit_rules();
    rules.push(PolicyRule::resources(
        &["rbac.authorization.k8s.io"],
        &["roles", "rolebindings"],
        &["get", "list", "watch", "create", "delete", "deletecollection", "patch", "update"],
    ));
    rules.push(PolicyRule::resources(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]));
    rules
}

/// What the controllers read and write: every object of the groups they manage; and of any kind
/// (custom resources, RBAC objects), what the garbage collector and the namespace controller do
/// to owned objects, which creates nothing and grants nothing.
fn controller_rules() -> Vec<PolicyRule> {
    vec![
        PolicyRule::resources(
            &[
                "",
                "apps",
                "batch",
                "autoscaling",
                "policy",
                "discovery.k8s.io",
                "coordination.k8s.io",
                "events.k8s.io",
                "apiextensions.k8s.io",
                "certificates.k8s.io",
                "metrics.k8s.io",
            ],
            &["*"],
            &["*"],
        ),
        PolicyRule::resources(&["*"], &["*"], &["get", "list", "watch", "patch", "update", "delete", "deletecollection"]),
        PolicyRule::resources(&["authorization.k8s.io"], &["subjectaccessreviews"], &["create"]),
        // The clusterrole-aggregation controller writes into a role rules it need not hold.
        PolicyRule::resources(&["rbac.authorization.k8s.io"], &["clusterroles"], &["escalate"]),
    ]
}

fn scheduler_rules() -> Vec<PolicyRule> {
    vec![
        PolicyRule::resources(&[""], &["pods", "nodes", "namespaces", "services", "replicationcontrollers"], READ),
        PolicyRule::resources(&[""], &["pods/binding", "bindings"], &["create"]),
        PolicyRule::resources(&[""], &["pods/status"], &["patch", "update"]),
        PolicyRule::resources(&[""], &["pods"], &["delete"]),
        PolicyRule::resources(&["apps"], &["replicasets", "statefulsets"], READ),
        PolicyRule::resources(&["policy"], &["poddisruptionbudgets"], READ),
        PolicyRule::resources(&["", "events.k8s.io"], &["events"], &["create", "patch", "update"]),
        PolicyRule::resources(&["coordination.k8s.io"], &["leases"], &["get", "list", "watch", "create", "update"]),
    ]
}

/// Each default ClusterRole with its rules.
fn cluster_roles() -> Vec<(&'static str, Vec<PolicyRule>)> {
    vec![
        ("cluster-admin", vec![PolicyRule::resources(&["*"], &["*"], &["*"]), PolicyRule::urls(&["*"], &["*"])]),
        ("admin", admin_rules()),
        ("edit", edit_rules()),
        ("view", view_rules()),
        // What admin, edit and view aggregate (their own rules are the aggregation controller's).
        ("system:aggregate-to-admin", admin_rules()),
        ("system:aggregate-to-edit", edit_rules()),
        ("system:aggregate-to-view", view_rules()),
        (
            "system:basic-user",
            vec![PolicyRule::resources(
                &["authorization.k8s.io"],
                &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                &["create"],
            )],
        ),
        (
            "system:discovery",
            vec![PolicyRule::urls(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/openapi",
                    "/openapi/*",
                    "/version",
                    "/version/",
                    "/healthz",
                    "/livez",
                    "/readyz",
                ],
                &["get"],
            )],
        ),
        (
            "system:public-info-viewer",
            vec![PolicyRule::urls(&["/healthz", "/livez", "/readyz", "/version", "/version/"], &["get"])],
        ),
        // The dashboard's assets hold no cluster data; its calls for data are authorized one by one.
        ("system:shepherd-dashboard-assets", vec![PolicyRule::urls(&["/dashboard", "/dashboard/*"], &["get"])]),
        ("system:node", node_rules()),
        // What a bootstrap token may do: ask for a node's client certificate, and see the answer.
        (
            "system:node-bootstrapper",
            vec![PolicyRule::resources(
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
                &["create", "get", "list", "watch"],
            )],
        ),
        ("system:kube-scheduler", scheduler_rules()),
        ("system:kube-controller-manager", controller_rules()),
    ]
}

/// A default ClusterRoleBinding: name, role, subjects as (kind, name).
type DefaultBinding = (&'static str, &'static str, Vec<(&'static str, &'static str)>);

/// Each default ClusterRoleBinding. `system:node` is not bound:
/// the node authorizer grants nodes its rules, object by object.
fn cluster_role_bindings() -> Vec<DefaultBinding> {
    vec![
        ("cluster-admin", "cluster-admin", vec![("Group", "system:masters")]),
        ("system:basic-user", "system:basic-user", vec![("Group", "system:authenticated")]),
        ("system:discovery", "system:discovery", vec![("Group", "system:authenticated")]),
        (
            "system:public-info-viewer",
            "system:public-info-viewer",
            vec![("Group", "system:authenticated"), ("Group", "system:unauthenticated")],
        ),
        (
            "system:shepherd-dashboard-assets",
            "system:shepherd-dashboard-assets",
            vec![("Group", "system:authenticated")],
        ),
        ("system:node-bootstrapper", "system:node-bootstrapper", vec![("Group", "system:bootstrappers")]),
        ("system:kube-scheduler", "system:kube-scheduler", vec![("User", "system:kube-scheduler")]),
        (
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            vec![("User", "system:kube-controller-manager")],
        ),
    ]
}

fn bootstrap_metadata(name: &str) -> Value {
    json!({"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}, "annotations": {AUTOUPDATE: "true"}})
}

/// Creates the default roles and bindings, or gives back to auto-updated ones what they lack.
pub async fn reconcile_default_roles(svc: &ApiService) -> Result<(), ApiError> {
    for (name, rules) in cluster_roles() {
        let rules: Vec<Value> = rules.iter().map(PolicyRule::to_json).collect();
        let mut role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": bootstrap_metadata(name), "rules": rules});
        if ["admin", "edit", "view"].contains(&name) {
            // ClusterRoles labelled so (those of custom resources) add to these.
            role["aggregationRule"] = json!({"clusterRoleSelectors": [
                {"matchLabels": {format!("{AGGREGATE_TO}{name}"): "true"}}]});
        }
        // As in Kubernetes, view adds to edit and edit to admin, so what is added to view reaches all three.
        let adds_to = match name {
            "view" | "system:aggregate-to-edit" => Some("edit"),
            "edit" | "system:aggregate-to-admin" => Some("admin"),
            "system:aggregate-to-view" => Some("view"),
            _ => None,
        };
        if let Some(target) = adds_to {
            role["metadata"]["labels"][format!("{AGGREGATE_TO}{target}")] = json!("true");
        }
        reconcile(svc, &kinds::CLUSTERROLE, name, role, "rules", |current, wanted| {
            let held: Vec<PolicyRule> = current.iter().map(PolicyRule::from_json).collect();
            wanted.iter().filter(|w| !held.iter().any(|h| h.covers(&PolicyRule::from_json(w)))).cloned().collect()
        })
        .await?;
    }
    for (name, role, subjects) in cluster_role_bindings() {
        let subjects: Vec<Value> = subjects
            .iter()
            .map(|(kind, n)| {
                json!({"kind": kind, "name": n,
            "apiGroup": "rbac.authorization.k8s.io"})
            })
            .collect();
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": bootstrap_metadata(name), "subjects": subjects,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}});
        reconcile(svc, &kinds::CLUSTERROLEBINDING, name, binding, "subjects", |current, wanted| {
            let same = |a: &Value, b: &Value| a.get("kind") == b.get("kind") && a.get("name") == b.get("name");
            wanted.iter().filter(|w| !current.iter().any(|c| same(c, w))).cloned().collect()
        })
        .await?;
    }
    Ok(())
}

/// Creates `wanted` or appends to the stored object's `list` what `missing` finds lacking.
async fn reconcile(
    svc: &ApiService,
    res: &ResourceInfo,
    name: &str,
    wanted: Value,
    list: &str,
    missing: impl Fn(&[Value], &[Value]) -> Vec<Value>,
) -> Result<(), ApiError> {
    let current = match svc.get(res, None, name).await {
        Ok(kv) => crate::codec::decode(&kv)?,
        Err(e) if e.is_not_found() => {
            return match svc.create(res, None, wanted).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    let auto =
        current.pointer(&format!("/metadata/annotations/{}", AUTOUPDATE.replace('/', "~1"))).and_then(Value::as_str);
    if auto == Some("false") {
        return Ok(());
    }
    let empty = Vec::new();
    let held = current.get(list).and_then(Value::as_array).unwrap_or(&empty);
    let lacking = missing(held, wanted.get(list).and_then(Value::as_array).unwrap_or(&empty));
    if lacking.is_empty() {
        return Ok(());
    }
    tracing::info!(kind = res.kind, name, added = lacking.len(), "default RBAC object reconciled");
    let mut updated = current.clone();
    let mut all = held.clone();
    all.extend(lacking);
    updated[list] = Value::Array(all);
    svc.update(res, None, name, updated, crate::service::Part::Main).await?;
    Ok(())
}
