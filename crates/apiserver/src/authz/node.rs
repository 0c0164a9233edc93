//! Node restriction: what a node agent's identity (`system:node:NAME`) may do. Reads follow a graph from the
//! pods bound to the node to the Secrets, ConfigMaps and ServiceAccounts they use; writes reach only the node's
//! own Node and Lease, the status of its pods, and Events (Kubernetes' Node authorizer and NodeRestriction
//! admission).

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;

use super::rbac::PolicyRule;
use super::request_info::Attributes;
use shepherd_api::JsonPath;

use shepherd_api::kinds::NODE_LEASE_NAMESPACE;

/// What a node may do at all, before the per-object checks below (Kubernetes' node rules, for the kinds
/// Shepherd serves).
pub fn node_rules() -> Vec<PolicyRule> {
    vec![
        PolicyRule::resources(&[""], &["nodes"], &["create", "get", "list", "watch", "update", "patch"]),
        PolicyRule::resources(&[""], &["nodes/status"], &["update", "patch"]),
        PolicyRule::resources(&["", "events.k8s.io"], &["events"], &["create", "update", "patch"]),
        PolicyRule::resources(&[""], &["pods"], &["get", "list", "watch", "create", "delete"]),
        PolicyRule::resources(&[""], &["pods/status"], &["update", "patch"]),
        PolicyRule::resources(&[""], &["pods/eviction"], &["create"]),
        PolicyRule::resources(&[""], &["services", "endpoints", "namespaces"], &["get", "list", "watch"]),
        PolicyRule::resources(&["discovery.k8s.io"], &["endpointslices"], &["get", "list", "watch"]),
        PolicyRule::resources(&[""], &["configmaps", "secrets", "serviceaccounts"], &["get", "list", "watch"]),
        PolicyRule::resources(&[""], &["serviceaccounts/token"], &["create"]),
        PolicyRule::resources(&["coordination.k8s.io"], &["leases"], &["get", "create", "update", "patch", "delete"]),
        // A node renews its own client certificate.
        PolicyRule::resources(&["certificates.k8s.io"], &["certificatesigningrequests"], &["create", "get", "list", "watch"]),
        // Each agent reports its node's and pods' usage (kubelet's summary API, pushed).
        PolicyRule::resources(&["metrics.k8s.io"], &["nodes"], &["create"]),
        PolicyRule::resources(
            &["authorization.k8s.io"],
            &["subjectaccessreviews", "selfsubjectaccessreviews"],
            &["create"],
        ),
    ]
}

static NODE_RULES: LazyLock<Vec<PolicyRule>> = LazyLock::new(node_rules);

/// Kinds a node may reach only through a pod bound to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Reachable {
    Secret,
    ConfigMap,
    ServiceAccount,
}

/// Pods by node and what each uses.
#[derive(Debug, Default)]
pub struct NodeGraph {
    /// `ns/name` of each pod bound to a node, with the node and what the pod refers to.
    pods: HashMap<String, (String, Vec<(Reachable, String)>)>,
    /// (node, kind, `ns/name`) to the number of the node's pods that use it.
    edges: HashMap<(String, Reachable, String), usize>,
}

impl NodeGraph {
    /// Takes in a stored pod (`pod` None: deleted). Pods not bound to a node add nothing.
    pub fn apply(&mut self, key: &str, pod: Option<&Value>) {
        let Some(id) = key.strip_prefix("/registry/core/pods/") else { return };
        if let Some((node, refs)) = self.pods.remove(id) {
            for (kind, name) in refs {
                let edge = (node.clone(), kind, name);
                if let Some(n) = self.edges.get_mut(&edge) {
                    *n -= 1;
                    if *n == 0 {
                        self.edges.remove(&edge);
                    }
                }
            }
        }
        let Some(pod) = pod else { return };
        let node = pod.at("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
        if node.is_empty() {
            return;
        }
        let ns = id.split_once('/').map_or("", |(ns, _)| ns);
        // A mirror pod is the node's own word: it reaches nothing (one stored before the
        // admission below refused references would otherwise open what it names).
        let refs: Vec<(Reachable, String)> = if shepherd_api::pod::is_mirror(pod) {
            Vec::new()
        } else {
            references(pod).into_iter().map(|(k, n)| (k, format!("{ns}/{n}"))).collect()
        };
        for (kind, name) in &refs {
            *self.edges.entry((node.to_string(), *kind, name.clone())).or_default() += 1;
        }
        self.pods.insert(id.to_string(), (node.to_string(), refs));
    }

    /// The node a pod is bound to.
    pub fn node_of(&self, namespace: &str, pod: &str) -> Option<&str> {
        self.pods.get(&format!("{namespace}/{pod}")).map(|(node, _)| node.as_str())
    }

    fn reaches(&self, node: &str, kind: Reachable, namespace: &str, name: &str) -> bool {
        self.edges.contains_key(&(node.to_string(), kind, format!("{namespace}/{name}")))
    }
}

/// What a mirror pod may not use, as Kubernetes' NodeRestriction refuses it: the first found, as
/// the reason's words ("a service account", "secrets", "configmaps", "persistentvolumeclaims"). A
/// projected service account token counts as a service account.
fn mirror_pod_reference(pod: &Value) -> Option<&'static str> {
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    let sa = spec.get("serviceAccountName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    let volumes: Vec<&Value> = spec.get("volumes").and_then(Value::as_array).into_iter().flatten().collect();
    let projected = || volumes.iter().flat_map(|v| v.at("/projected/sources").and_then(Value::as_array).into_iter().flatten());
    if sa || projected().any(|s| s.get("serviceAccountToken").is_some_and(|t| !t.is_null())) {
        return Some("a service account");
    }
    let refs = references(pod);
    if refs.iter().any(|(k, _)| *k == Reachable::Secret) {
        return Some("secrets");
    }
    if refs.iter().any(|(k, _)| *k == Reachable::ConfigMap) {
        return Some("configmaps");
    }
    if volumes.iter().any(|v| v.get("persistentVolumeClaim").is_some_and(|c| !c.is_null())) {
        return Some("persistentvolumeclaims");
    }
    None
}

/// The Secrets, ConfigMaps and ServiceAccount a pod uses.
fn references(pod: &Value) -> Vec<(Reachable, String)> {
    let mut out = Vec::new();
    let mut add = |kind, name: Option<&Value>| {
        if let Some(n) = name.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            out.push((kind, n.to_string()));
        }
    };
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    add(Reachable::ServiceAccount, spec.get("serviceAccountName"));
    for s in spec.get("imagePullSecrets").and_then(Value::as_array).into_iter().flatten() {
        add(Reachable::Secret, s.get("name"));
    }
    for v in spec.get("volumes").and_then(Value::as_array).into_iter().flatten() {
        add(Reachable::Secret, v.at("/secret/secretName"));
        add(Reachable::ConfigMap, v.at("/configMap/name"));
        for source in v.at("/projected/sources").and_then(Value::as_array).into_iter().flatten() {
            add(Reachable::Secret, source.at("/secret/name"));
            add(Reachable::ConfigMap, source.at("/configMap/name"));
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec.get(list).and_then(Value::as_array).into_iter().flatten() {
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                add(Reachable::Secret, e.at("/valueFrom/secretKeyRef/name"));
                add(Reachable::ConfigMap, e.at("/valueFrom/configMapKeyRef/name"));
            }
            for e in c.get("envFrom").and_then(Value::as_array).into_iter().flatten() {
                add(Reachable::Secret, e.at("/secretRef/name"));
                add(Reachable::ConfigMap, e.at("/configMapRef/name"));
            }
        }
    }
    out
}

/// The node authorizer's answer: `Ok(())` allowed, `Err(reason)` not by this authorizer (RBAC may
/// still allow it).
pub fn authorize(node: &str, graph: &NodeGraph, a: &Attributes) -> Result<(), String> {
    let no_relationship = || format!("no relationship found between node '{node}' and this object");
    if !a.resource_request || !NODE_RULES.iter().any(|r| r.allows(a)) {
        return Err(String::new());
    }
    if a.api_group.is_empty() {
        match (a.resource.as_str(), a.subresource.as_str()) {
            (resource @ ("secrets" | "configmaps" | "serviceaccounts"), _) => {
                let kind = match resource {
                    "secrets" => Reachable::Secret,
                    "configmaps" => Reachable::ConfigMap,
                    _ => Reachable::ServiceAccount,
                };
                // Only one object at a time: a list or watch must name it (`metadata.name=`).
                if a.name.is_empty() || !graph.reaches(node, kind, &a.namespace, &a.name) {
                    return Err(no_relationship());
                }
            }
            ("nodes", _) if !matches!(a.verb.as_str(), "get" | "list" | "watch" | "create") && a.name != node => {
                return Err(format!("node '{node}' cannot modify node '{}'", a.name));
            }
            ("pods", "status" | "eviction") | ("pods", "")
                if (a.verb == "delete" || !a.subresource.is_empty())
                    && graph.node_of(&a.namespace, &a.name) != Some(node) =>
            {
                return Err(no_relationship());
            }
            _ => {}
        }
    }
    if a.api_group == "coordination.k8s.io" && a.resource == "leases" {
        let own = a.namespace == NODE_LEASE_NAMESPACE && (a.verb == "create" || a.name == node);
        if !own {
            return Err("can only access node lease with the same name as the requesting node".to_string());
        }
    }
    Ok(())
}

/// Kubernetes' NodeRestriction admission: the written object (`new`; `old` for an update) by
/// `node`. `Err` is the reason of a 403.
pub fn admit(node: &str, kind: &str, old: Option<&Value>, new: &Value) -> Result<(), String> {
    let name = new.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
    match kind {
        "Node" => {
            if name != node {
                return Err(format!("node {node:?} is not allowed to modify node {name:?}"));
            }
            let labels = |o: &Value| o.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
            let new_labels = labels(new);
            let forbidden: Vec<String> = match old {
                None => new_labels.keys().filter(|k| forbidden_label(k)).cloned().collect(),
                Some(old) => {
                    if old.at("/spec/taints") != new.at("/spec/taints") {
                        return Err(format!("node {node:?} is not allowed to modify taints"));
                    }
                    let old_labels = labels(old);
                    let mut changed: Vec<String> = new_labels
                        .iter()
                        .filter(|(k, v)| old_labels.get(*k) != Some(*v))
                        .map(|(k, _)| k.clone())
                        .chain(old_labels.keys().filter(|k| !new_labels.contains_key(*k)).cloned())
                        .filter(|k| forbidden_label(k))
                        .collect();
                    changed.sort();
                    changed
                }
            };
            if !forbidden.is_empty() {
                return Err(match old {
                    None => {
                        format!("node {node:?} is not allowed to set the following labels: {}", forbidden.join(", "))
                    }
                    Some(_) => format!("is not allowed to modify labels: {}", forbidden.join(", ")),
                });
            }
        }
        "Pod" => {
            let bound = |o: &Value| o.at("/spec/nodeName").and_then(Value::as_str) == Some(node);
            match old {
                Some(old) if !bound(old) => {
                    return Err(format!(
                        "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                    ));
                }
                Some(_) => {}
                None => {
                    if !shepherd_api::pod::is_mirror(new) {
                        return Err(format!(
                            "pod does not have \"kubernetes.io/config.mirror\" annotation, node {node:?} \
                            can only create mirror pods"
                        ));
                    }
                    if !bound(new) {
                        return Err(format!("node {node:?} can only create pods with spec.nodeName set to itself"));
                    }
                    if let Some(what) = mirror_pod_reference(new) {
                        return Err(format!("node {node:?} can not create pods that reference {what}"));
                    }
                }
            }
        }
        "Lease" if name != node => {
            return Err("can only access node lease with the same name as the requesting node".to_string());
        }
        _ => {}
    }
    Ok(())
}

/// Labels a node may not set on itself: those that steer workloads to it (`node-restriction.kubernetes.io/`),
/// and Kubernetes' own (`kubernetes.io`, `k8s.io`) beyond the ones a kubelet reports.
fn forbidden_label(key: &str) -> bool {
    const KUBELET_LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let Some((prefix, _)) = key.split_once('/') else { return false };
    let under = |domain: &str| prefix == domain || prefix.ends_with(&format!(".{domain}"));
    if under("node-restriction.kubernetes.io") {
        return true;
    }
    if KUBELET_LABELS.contains(&key) || under("kubelet.kubernetes.io") || under("node.kubernetes.io") {
        return false;
    }
    under("kubernetes.io") || under("k8s.io")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;
    use serde_json::json;

    fn attrs(method: Method, path: &str) -> Attributes {
        let (p, q) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
        Attributes::of(&method, p, q)
    }

    fn graph() -> NodeGraph {
        let mut g = NodeGraph::default();
        g.apply(
            "/registry/core/pods/default/web",
            Some(&json!({"spec": {"nodeName": "n1", "serviceAccountName": "default",
            "volumes": [{"name": "v", "secret": {"secretName": "tls"}}],
            "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "settings"}}]}]}})),
        );
        g.apply("/registry/core/pods/default/db", Some(&json!({"spec": {"nodeName": "n2",
            "containers": [{"name": "c", "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "p"}}}]}]}})));
        g
    }

    /// Kubernetes' NodeRestriction rules for pods a node creates, one row each: a node creates
    /// only mirror pods, bound to itself, that reference no other API object.
    #[test]
    fn a_node_creates_only_mirror_pods_of_its_own_that_reference_nothing() {
        let mirror = |spec: Value| {
            let mut spec = spec;
            spec["nodeName"] = json!("n1");
            spec["containers"] = spec.get("containers").cloned().unwrap_or(json!([{"name": "c", "image": "minimal"}]));
            json!({"metadata": {"name": "p", "annotations": {"kubernetes.io/config.mirror": "x"}}, "spec": spec})
        };
        let container = |extra: Value| {
            let mut c = json!({"name": "c", "image": "minimal"});
            c.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
            json!([c])
        };
        let rows: Vec<(&str, Value, Option<&str>)> = vec![
            ("a plain mirror pod", mirror(json!({})), None),
            (
                "not a mirror pod",
                json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "minimal"}]}}),
                Some("pod does not have \"kubernetes.io/config.mirror\" annotation, node \"n1\" can only create mirror pods"),
            ),
            ("bound to another node", {
                let mut p = mirror(json!({}));
                p["spec"]["nodeName"] = json!("n2");
                p
            }, Some("node \"n1\" can only create pods with spec.nodeName set to itself")),
            ("a service account", mirror(json!({"serviceAccountName": "admin"})), Some("a service account")),
            ("a projected token", mirror(json!({"volumes": [{"name": "t", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}}]}}]})), Some("a service account")),
            ("a secret volume", mirror(json!({"volumes": [{"name": "s", "secret": {"secretName": "x"}}]})), Some("secrets")),
            ("a projected secret", mirror(json!({"volumes": [{"name": "s", "projected": {"sources": [{"secret": {"name": "x"}}]}}]})), Some("secrets")),
            ("an image pull secret", mirror(json!({"imagePullSecrets": [{"name": "x"}]})), Some("secrets")),
            ("a secretKeyRef", mirror(json!({"containers": container(json!({"env": [{"name": "P",
                "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}]}))})), Some("secrets")),
            ("a secretRef", mirror(json!({"containers": container(json!({"envFrom": [{"secretRef": {"name": "x"}}]}))})), Some("secrets")),
            ("a configMap volume", mirror(json!({"volumes": [{"name": "c", "configMap": {"name": "x"}}]})), Some("configmaps")),
            ("a configMapKeyRef", mirror(json!({"containers": container(json!({"env": [{"name": "P",
                "valueFrom": {"configMapKeyRef": {"name": "x", "key": "k"}}}]}))})), Some("configmaps")),
            ("a claim", mirror(json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}]})), Some("persistentvolumeclaims")),
        ];
        for (what, pod, refused) in rows {
            let got = admit("n1", "Pod", None, &pod);
            match refused {
                None => assert_eq!(got, Ok(()), "{what}"),
                Some(why) if why.starts_with("pod ") || why.starts_with("node ") => assert_eq!(got, Err(why.to_string()), "{what}"),
                Some(what_kind) => assert_eq!(got, Err(format!("node \"n1\" can not create pods that reference {what_kind}")), "{what}"),
            }
        }
    }

    #[test]
    fn a_mirror_pod_opens_nothing_to_its_node() {
        let mut g = NodeGraph::default();
        g.apply("/registry/core/pods/kube-system/static", Some(&json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
            "spec": {"nodeName": "evil", "serviceAccountName": "admin",
            "containers": [{"name": "c", "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "root-secret", "key": "k"}}}]}]}})));
        for path in ["/api/v1/namespaces/kube-system/secrets/root-secret", "/api/v1/namespaces/kube-system/serviceaccounts/admin"] {
            assert!(authorize("evil", &g, &attrs(Method::GET, path)).is_err(), "{path}");
        }
        assert!(authorize("evil", &g, &attrs(Method::POST, "/api/v1/namespaces/kube-system/serviceaccounts/admin/token")).is_err());
        assert_eq!(g.node_of("kube-system", "static"), Some("evil"), "the node still owns its mirror pod's status");
    }

    #[test]
    fn a_node_reads_only_the_secrets_and_config_maps_of_its_own_pods() {
        let g = graph();
        assert!(authorize("n1", &g, &attrs(Method::GET, "/api/v1/namespaces/default/secrets/tls")).is_ok());
        assert!(
            authorize(
                "n1",
                &g,
                &attrs(
                    Method::GET,
                    "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dsettings&watch=1"
                )
            )
            .is_ok()
        );
        let err =
            authorize("n1", &g, &attrs(Method::GET, "/api/v1/namespaces/default/secrets/db-password")).unwrap_err();
        assert_eq!(err, "no relationship found between node 'n1' and this object");
        assert!(
            authorize("n1", &g, &attrs(Method::GET, "/api/v1/namespaces/default/secrets")).is_err(),
            "no listing all"
        );
        assert!(authorize("n2", &g, &attrs(Method::GET, "/api/v1/namespaces/default/secrets/db-password")).is_ok());
        let mut g = g;
        g.apply("/registry/core/pods/default/db", None);
        assert!(authorize("n2", &g, &attrs(Method::GET, "/api/v1/namespaces/default/secrets/db-password")).is_err());
    }

    #[test]
    fn a_node_writes_its_own_node_lease_and_pod_statuses_but_binds_nothing() {
        let g = graph();
        assert!(authorize("n1", &g, &attrs(Method::PATCH, "/api/v1/nodes/n1/status")).is_ok());
        assert!(authorize("n1", &g, &attrs(Method::PATCH, "/api/v1/nodes/n2/status")).is_err());
        assert!(authorize("n1", &g, &attrs(Method::PUT, "/api/v1/namespaces/default/pods/web/status")).is_ok());
        assert!(authorize("n1", &g, &attrs(Method::PUT, "/api/v1/namespaces/default/pods/db/status")).is_err());
        assert!(authorize("n1", &g, &attrs(Method::POST, "/api/v1/namespaces/default/pods/web/binding")).is_err());
        assert!(authorize("n1", &g, &attrs(Method::POST, "/apis/apps/v1/namespaces/default/deployments")).is_err());
        assert!(
            authorize(
                "n1",
                &g,
                &attrs(Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1")
            )
            .is_ok()
        );
        assert!(
            authorize(
                "n1",
                &g,
                &attrs(Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n2")
            )
            .is_err()
        );
        assert!(authorize("n1", &g, &attrs(Method::DELETE, "/api/v1/namespaces/default/pods/db")).is_err());
    }

    #[test]
    fn a_node_cannot_steer_workloads_to_itself_with_labels_or_taints() {
        let node = |labels: Value| json!({"metadata": {"name": "n1", "labels": labels}});
        assert!(admit("n1", "Node", None, &node(json!({"kubernetes.io/hostname": "n1", "team": "a"}))).is_ok());
        assert_eq!(
            admit("n1", "Node", None, &node(json!({"node-restriction.kubernetes.io/gpu": "yes"}))).unwrap_err(),
            "node \"n1\" is not allowed to set the following labels: node-restriction.kubernetes.io/gpu"
        );
        let old = node(json!({"kubernetes.io/hostname": "n1"}));
        assert_eq!(
            admit(
                "n1",
                "Node",
                Some(&old),
                &node(json!({"kubernetes.io/hostname": "n1",
            "node-role.kubernetes.io/control-plane": ""}))
            )
            .unwrap_err(),
            "is not allowed to modify labels: node-role.kubernetes.io/control-plane"
        );
        let mut untainted = old.clone();
        untainted["spec"] = json!({"taints": []});
        let mut tainted = old.clone();
        tainted["spec"] = json!({"taints": [{"key": "k", "effect": "NoSchedule"}]});
        assert!(admit("n1", "Node", Some(&tainted), &untainted).unwrap_err().contains("not allowed to modify taints"));
        assert!(admit("n1", "Node", None, &json!({"metadata": {"name": "n2"}})).is_err());
    }
}
