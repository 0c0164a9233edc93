//! Authorization over real HTTP: RBAC decisions with Kubernetes' 403s, escalation prevention, access
//! reviews, impersonation and node restriction. Requests carry their identity in a test header (see
//! `common::TEST_USER`); requests without one are unauthenticated and allowed everything, so the tests
//! set up their objects that way.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
const SAR: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const SSAR: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
const SSRR: &str = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews";
const NODE_GROUPS: &[&str] = &["system:nodes"];

fn binding(kind: &str, name: &str, namespace: Option<&str>, role_kind: &str, role: &str, subjects: Value) -> Value {
    let mut metadata = json!({"name": name});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}, "subjects": subjects})
}

fn user(name: &str) -> Value {
    json!([{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name}])
}

/// Binds `role` (a ClusterRole) to user `who` in `ns`.
async fn grant(s: &Server, ns: &str, role: &str, who: &str) {
    let b = binding("RoleBinding", &format!("{who}-{role}"), Some(ns), "ClusterRole", role, user(who));
    s.create(&format!("{RBAC}/namespaces/{ns}/rolebindings"), &b).await;
}

fn review(user: &str, groups: &[&str], attrs: Value) -> Value {
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attrs}})
}

/// Asks until the answer is `allowed` (the authorizer follows the store's changes as they are written).
async fn wait_until(s: &Server, user: &str, groups: &[&str], attrs: Value, allowed: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = s.post(SAR, &review(user, groups, attrs.clone())).await;
        assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
        if r.body["status"]["allowed"] == allowed {
            return;
        }
        assert!(Instant::now() < deadline, "{user} never became allowed={allowed} for {attrs}: {}", r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_view_user_reads_but_gets_kubernetes_forbidden_on_delete_and_nothing_is_deleted() {
    let s = start().await;
    s.create(PODS, &pod("x")).await;
    let bob = s.user("bob", &[]);
    let r = bob.get(&format!("{PODS}/x")).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "no binding yet: {}", r.body);
    assert_eq!(r.body["message"], "pods \"x\" is forbidden: User \"bob\" cannot get resource \"pods\" in API group \"\" \
        in the namespace \"default\"");

    grant(&s, "default", "view", "bob").await;
    wait_until(&s, "bob", &[], json!({"namespace": "default", "verb": "get", "resource": "pods"}), true).await;
    assert_eq!(bob.get(&format!("{PODS}/x")).await.code, StatusCode::OK);
    assert_eq!(bob.get(PODS).await.code, StatusCode::OK);

    let r = bob.delete(&format!("{PODS}/x")).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN);
    assert_eq!(r.body, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "pods \"x\" is forbidden: User \"bob\" cannot delete resource \"pods\" in API group \"\" in the namespace \"default\"",
        "reason": "Forbidden", "details": {"name": "x", "kind": "pods"}, "code": 403}));
    assert_eq!(s.get(&format!("{PODS}/x")).await.code, StatusCode::OK, "the pod is still there");
    let metrics = s.get("/metrics").await.body.as_str().unwrap_or("").to_string();
    assert!(metrics.contains("apiserver_request_total{verb=\"DELETE\",resource=\"pods\",code=\"403\"} 1"), "{metrics}");

    let r = bob.get("/api/v1/namespaces/other/pods").await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "view was granted in default only");
    let r = bob.get("/apis/apps/v1/deployments").await;
    assert_eq!(r.body["message"], "deployments.apps is forbidden: User \"bob\" cannot list resource \"deployments\" in API \
        group \"apps\" at the cluster scope");
    let r = bob.get("/metrics").await;
    assert_eq!(r.body["message"], "forbidden: User \"bob\" cannot get path \"/metrics\"");
    assert_eq!(bob.get("/version").await.code, StatusCode::OK, "discovery is open to every authenticated user");
    assert_eq!(bob.get("/apis").await.code, StatusCode::OK);
}

#[tokio::test]
async fn a_user_cannot_grant_what_they_do_not_hold() {
    let s = start().await;
    grant(&s, "default", "edit", "eve").await;
    grant(&s, "default", "admin", "ada").await;
    wait_until(&s, "ada", &[], json!({"namespace": "default", "verb": "create", "resource": "rolebindings",
        "group": "rbac.authorization.k8s.io"}), true).await;
    wait_until(&s, "eve", &[], json!({"namespace": "default", "verb": "create", "resource": "pods"}), true).await;
    let bindings = format!("{RBAC}/namespaces/default/rolebindings");

    // edit holds no rolebindings at all.
    let to_admin = binding("RoleBinding", "mallory-admin", Some("default"), "ClusterRole", "cluster-admin", user("mallory"));
    let r = s.user("eve", &[]).post(&bindings, &to_admin).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);

    // admin may write bindings, but only to what it holds itself.
    let r = s.user("ada", &[]).post(&bindings, &to_admin).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    let message = r.body["message"].as_str().unwrap_or("");
    assert!(message.starts_with("rolebindings.rbac.authorization.k8s.io \"mallory-admin\" is forbidden: user \"ada\" \
        (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n"), "{message}");
    assert!(message.contains("{NonResourceURLs:[\"*\"], Verbs:[\"*\"]}"), "{message}");
    assert_eq!(s.get(&format!("{bindings}/mallory-admin")).await.code, StatusCode::NOT_FOUND, "nothing was written");
    let to_edit = binding("RoleBinding", "mallory-edit", Some("default"), "ClusterRole", "edit", user("mallory"));
    let r = s.user("ada", &[]).post(&bindings, &to_edit).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);

    // The same for roles: no more than held, unless allowed to escalate.
    let roles = format!("{RBAC}/namespaces/default/roles");
    let everything = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "all"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
    let r = s.user("ada", &[]).post(&roles, &everything).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    let readers = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "readers"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]});
    assert_eq!(s.user("ada", &[]).post(&roles, &readers).await.code, StatusCode::CREATED);
    // Labelling a role grants nothing, whatever it holds; widening it is checked on the result.
    let others = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "node-deleter"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}]});
    s.create(&roles, &others).await;
    let labelled = json!({"metadata": {"labels": {"team": "a"}}});
    let r = s.user("ada", &[]).patch(&format!("{roles}/node-deleter"), &labelled, MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    let widen = json!({"rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
    let r = s.user("ada", &[]).patch(&format!("{roles}/readers"), &widen, MERGE).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);

    let escalate = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "role-escalator"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]});
    s.create(&format!("{RBAC}/clusterroles"), &escalate).await;
    grant(&s, "default", "role-escalator", "ada").await;
    wait_until(&s, "ada", &[], json!({"namespace": "default", "verb": "escalate", "resource": "roles",
        "group": "rbac.authorization.k8s.io"}), true).await;
    assert_eq!(s.user("ada", &[]).post(&roles, &everything).await.code, StatusCode::CREATED);

    // Gathering other roles' rules takes holding everything.
    let writer = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cr-writer"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["create"]}]});
    s.create(&format!("{RBAC}/clusterroles"), &writer).await;
    let b = binding("ClusterRoleBinding", "cr-writers", None, "ClusterRole", "cr-writer",
        json!([{"kind": "Group", "name": "role-makers"}]));
    s.create(&format!("{RBAC}/clusterrolebindings"), &b).await;
    wait_until(&s, "ada", &["role-makers"], json!({"verb": "create", "resource": "clusterroles",
        "group": "rbac.authorization.k8s.io"}), true).await;
    let gatherer = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "gatherer"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"team": "a"}}]}, "rules": []});
    let r = s.user("ada", &["role-makers"]).post(&format!("{RBAC}/clusterroles"), &gatherer).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["message"], "clusterroles.rbac.authorization.k8s.io \"gatherer\" is forbidden: must have cluster-admin \
        privileges to use the aggregationRule");
    let mut plain = gatherer.clone();
    plain["metadata"]["name"] = json!("plain");
    plain.as_object_mut().map(|o| o.remove("aggregationRule"));
    assert_eq!(s.user("ada", &["role-makers"]).post(&format!("{RBAC}/clusterroles"), &plain).await.code, StatusCode::CREATED);

    // `bind` on one role lets a user hand out that role without holding it.
    let binder = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "admin-binder"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
            "resourceNames": ["cluster-admin"]}]});
    s.create(&format!("{RBAC}/clusterroles"), &binder).await;
    grant(&s, "default", "admin-binder", "ada").await;
    wait_until(&s, "ada", &[], json!({"namespace": "default", "verb": "bind", "resource": "clusterroles",
        "group": "rbac.authorization.k8s.io", "name": "cluster-admin"}), true).await;
    assert_eq!(s.user("ada", &[]).post(&bindings, &to_admin).await.code, StatusCode::CREATED);
    let to_view = binding("RoleBinding", "mallory-view", Some("default"), "ClusterRole", "view", user("mallory"));
    assert_eq!(s.user("eve", &[]).post(&bindings, &to_view).await.code, StatusCode::FORBIDDEN, "still no rolebindings");
}

#[tokio::test]
async fn access_reviews_answer_for_any_subject_and_for_the_caller_and_are_not_stored() {
    let s = start().await;
    grant(&s, "default", "view", "bob").await;
    let get_pods = json!({"namespace": "default", "verb": "get", "resource": "pods"});
    wait_until(&s, "bob", &[], get_pods.clone(), true).await;
    let r = s.post(SAR, &review("bob", &[], json!({"namespace": "default", "verb": "delete", "resource": "pods"}))).await;
    assert_eq!(r.code, StatusCode::CREATED);
    assert_eq!(r.body["status"]["allowed"], false);
    assert_eq!(r.body["kind"], "SubjectAccessReview");
    let r = s.post(SAR, &review("anyone", &["system:masters"], json!({"verb": "delete", "resource": "nodes"}))).await;
    assert_eq!(r.body["status"]["allowed"], true);

    let ask = |attrs: Value| json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs}});
    let bob = s.user("bob", &[]);
    let r = bob.post(SSAR, &ask(get_pods.clone())).await;
    assert_eq!((r.code, &r.body["status"]["allowed"]), (StatusCode::CREATED, &json!(true)), "{}", r.body);
    let r = bob.post(SSAR, &ask(json!({"namespace": "default", "verb": "create", "resource": "deployments", "group": "apps"}))).await;
    assert_eq!(r.body["status"]["allowed"], false);

    let r = bob.post(SSRR, &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": "default"}})).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let rules = r.body["status"]["resourceRules"].as_array().expect("rules");
    assert!(rules.iter().any(|r| r["resources"].as_array().is_some_and(|l| l.contains(&json!("pods")))
        && r["verbs"] == json!(["get", "list", "watch"])), "{rules:?}");
    assert!(r.body["status"]["nonResourceRules"].as_array().is_some_and(|l| !l.is_empty()));

    let r = s.post(SAR, &json!({"spec": {"user": "bob", "groups": ["system:authenticated"],
        "nonResourceAttributes": {"path": "/version", "verb": "get"}}})).await;
    assert_eq!(r.body["status"]["allowed"], true, "{}", r.body);
    let local = |ns: &str| json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
        "metadata": {"namespace": "default"},
        "spec": {"user": "bob", "resourceAttributes": {"namespace": ns, "verb": "list", "resource": "pods"}}});
    let r = s.post("/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews", &local("default")).await;
    assert_eq!((r.code, &r.body["status"]["allowed"]), (StatusCode::CREATED, &json!(true)), "{}", r.body);
    let r = s.post("/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews", &local("other")).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "a local review stays in its namespace: {}", r.body);

    // ServiceAccounts are users `system:serviceaccount:NS:NAME`, in the groups of all and of their namespace's.
    let sa_binding = binding("RoleBinding", "sa-view", Some("default"), "ClusterRole", "view",
        json!([{"kind": "ServiceAccount", "name": "robot"}, {"kind": "Group", "name": "system:serviceaccounts:ci"}]));
    s.create(&format!("{RBAC}/namespaces/default/rolebindings"), &sa_binding).await;
    let list_pods = json!({"namespace": "default", "verb": "list", "resource": "pods"});
    wait_until(&s, "system:serviceaccount:default:robot", &["system:serviceaccounts"], list_pods.clone(), true).await;
    let ci_bot = s.user("system:serviceaccount:ci:builder", &[]);
    assert_eq!(ci_bot.get(PODS).await.code, StatusCode::OK, "through the namespace's ServiceAccount group");
    assert_eq!(s.user("system:serviceaccount:prod:robot", &[]).get(PODS).await.code, StatusCode::FORBIDDEN);

    assert_eq!(s.get(SAR).await.code, StatusCode::METHOD_NOT_ALLOWED, "reviews are only created");
    let r = s.post(SAR, &json!({"spec": {"user": "bob"}})).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
}

#[tokio::test]
async fn impersonation_needs_the_impersonate_verb_and_then_acts_as_the_impersonated_user() {
    let s = start().await;
    s.create(PODS, &pod("x")).await;
    grant(&s, "default", "view", "bob").await;
    wait_until(&s, "bob", &[], json!({"namespace": "default", "verb": "get", "resource": "pods"}), true).await;
    let as_bob = |req: reqwest::RequestBuilder| req.header(TEST_USER, "root").header(TEST_GROUPS, "system:masters")
        .header("impersonate-user", "bob");
    let r = as_bob(s.http.delete(s.url(&format!("{PODS}/x")))).send().await.expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: Value = r.json().await.expect("json");
    assert!(body["message"].as_str().is_some_and(|m| m.contains("User \"bob\" cannot delete")), "{body}");

    let r = s.http.get(s.url(PODS)).header(TEST_USER, "bob").header("impersonate-user", "root")
        .header("impersonate-group", "system:masters").send().await.expect("send");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["message"], "users \"root\" is forbidden: User \"bob\" cannot impersonate resource \"users\" in API \
        group \"\" at the cluster scope");
}

fn bound_pod(name: &str, node: &str, secret: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "minimal",
            "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]}]}})
}

#[tokio::test]
async fn a_node_writes_only_its_own_node_lease_and_pods_and_reads_only_its_pods_secrets() {
    let s = start().await;
    for secret in ["mine", "theirs"] {
        s.create("/api/v1/namespaces/default/secrets", &json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret}, "stringData": {"k": "v"}})).await;
    }
    s.create(PODS, &bound_pod("on-n1", "n1", "mine")).await;
    s.create(PODS, &bound_pod("on-n2", "n2", "theirs")).await;
    s.create(PODS, &pod("pending")).await;
    let n1 = s.user("system:node:n1", NODE_GROUPS);

    // Its own Node, with labels a kubelet reports, but none that steer workloads to it.
    let node = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}});
    let r = n1.post("/api/v1/nodes", &node("n1", json!({"kubernetes.io/hostname": "n1"}))).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let r = n1.post("/api/v1/nodes", &node("n2", json!({}))).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["message"], "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\"");
    let steer = json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "secure"}}});
    let r = n1.patch("/api/v1/nodes/n1", &steer, MERGE).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.ends_with("is not allowed to modify labels: node-restriction.kubernetes.io/pool")));
    let r = n1.patch("/api/v1/nodes/n1", &json!({"metadata": {"labels": {"team": "a"}}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    let r = n1.patch("/api/v1/nodes/n1/status", &json!({"status": {"phase": "Running"}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);

    // Usage reports for its own node only.
    let usage = |name: &str| json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics", "metadata": {"name": name},
        "timestamp": "2026-01-01T00:00:00Z", "window": "5s", "usage": {"cpu": "10m", "memory": "1Mi"}, "pods": []});
    let r = n1.post("/apis/metrics.k8s.io/v1beta1/nodes", &usage("n1")).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let r = n1.post("/apis/metrics.k8s.io/v1beta1/nodes", &usage("n2")).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    let list = |items: Vec<Value>| json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetricsList", "items": items});
    let r = n1.post("/apis/metrics.k8s.io/v1beta1/nodes", &list(vec![usage("n1")])).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let r = n1.post("/apis/metrics.k8s.io/v1beta1/nodes", &list(vec![usage("n1"), usage("n2")])).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "a list that speaks for another node: {}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("\"n2\"")), "{}", r.body);

    // Its own Lease only.
    let lease = |name: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
        "spec": {"holderIdentity": name}});
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    assert_eq!(n1.post(leases, &lease("n1")).await.code, StatusCode::CREATED);
    assert_eq!(n1.post(leases, &lease("n2")).await.code, StatusCode::FORBIDDEN);
    assert_eq!(n1.put(&format!("{leases}/n1"), &lease("n1")).await.code, StatusCode::OK);

    // The status of its own pods; not another node's, not a binding, not a Deployment.
    wait_until(&s, "system:node:n1", NODE_GROUPS, json!({"namespace": "default", "verb": "get", "resource": "secrets",
        "name": "mine"}), true).await;
    let status = json!({"status": {"phase": "Running"}});
    let r = n1.patch(&format!("{PODS}/on-n1/status"), &status, MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    let r = n1.patch(&format!("{PODS}/on-n2/status"), &status, MERGE).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["message"], "pods \"on-n2\" is forbidden: User \"system:node:n1\" cannot patch resource \"pods/status\" \
        in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object");
    assert_eq!(s.get(&format!("{PODS}/on-n2")).await.body["status"]["phase"], "Pending", "nothing was written");
    let bind = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pending"}, "target": {"kind": "Node", "name": "n1"}});
    let r = n1.post(&format!("{PODS}/pending/binding"), &bind).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    let r = n1.post(DEPLOYMENTS, &deployment("web")).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(r.body["message"], "deployments.apps is forbidden: User \"system:node:n1\" cannot create resource \
        \"deployments\" in API group \"apps\" in the namespace \"default\"");
    assert_eq!(n1.post(PODS, &pod("made-up")).await.code, StatusCode::FORBIDDEN, "only mirror pods");

    // Secrets of its own pods only.
    assert_eq!(n1.get("/api/v1/namespaces/default/secrets/mine").await.code, StatusCode::OK);
    let r = n1.get("/api/v1/namespaces/default/secrets/theirs").await;
    assert_eq!(r.code, StatusCode::FORBIDDEN);
    assert_eq!(n1.get("/api/v1/namespaces/default/secrets").await.code, StatusCode::FORBIDDEN);
    // Events it may write.
    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"}, "reason": "Started",
        "involvedObject": {"kind": "Pod", "name": "on-n1", "namespace": "default"}});
    let r = n1.post("/api/v1/namespaces/default/events", &event).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn rbac_objects_are_served_with_tables_and_validated_with_named_fields() {
    let s = start().await;
    let r = s.get(&format!("{RBAC}/clusterroles/view")).await;
    assert_eq!(r.code, StatusCode::OK, "default roles exist");
    let bad = binding("RoleBinding", "b", Some("default"), "ClusterRole", "view",
        json!([{"kind": "Robot", "name": "r2d2"}]));
    let r = s.post(&format!("{RBAC}/namespaces/default/rolebindings"), &bad).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["details"]["causes"][0]["field"], "subjects[0].kind");
    let ok = binding("RoleBinding", "b", Some("default"), "ClusterRole", "view", json!([{"kind": "User", "name": "bob"}]));
    let created = s.create(&format!("{RBAC}/namespaces/default/rolebindings"), &ok).await;
    assert_eq!(created["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io", "defaulted");
    let r = s.patch(&format!("{RBAC}/namespaces/default/rolebindings/b"), &json!({"roleRef": {"name": "edit"}}), MERGE).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.body["details"]["causes"][0]["field"], "roleRef");

    let table = s.http.get(s.url(&format!("{RBAC}/namespaces/default/rolebindings")))
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io").send().await.expect("send");
    let table: Value = table.json().await.expect("json");
    assert_eq!(table["rows"][0]["cells"][1], "ClusterRole/view");
    assert_eq!(table["rows"][0]["cells"][3], "bob");
}

#[tokio::test]
async fn the_authorizer_decides_in_microseconds_with_a_thousand_bindings() {
    let s = start().await;
    for i in 0..1000 {
        let b = binding("RoleBinding", &format!("b{i}"), Some(&format!("ns{}", i % 50)), "ClusterRole", "view", user(&format!("user{i}")));
        s.store.create(&format!("/registry/rbac.authorization.k8s.io/rolebindings/ns{}/b{i}", i % 50),
            serde_json::to_vec(&b).expect("json").into()).await.expect("create");
    }
    wait_until(&s, "user999", &[], json!({"namespace": "ns49", "verb": "get", "resource": "pods"}), true).await;
    // Through HTTP the cost is dominated by HTTP itself: time the decision alone.
    let server = shepherd_apiserver::ApiServer::new(s.store.clone(), shepherd_apiserver::HttpConfig::default()).await.expect("server");
    let authz = server.authorizer();
    assert!(authz.binding_count() > 1000, "the thousand and the defaults");
    let user = shepherd_apiserver::auth::UserInfo::new("user999", ["team-a"]);
    let allowed = shepherd_apiserver::authz::Attributes::of(&axum::http::Method::GET, "/api/v1/namespaces/ns49/pods/x", None);
    let denied = shepherd_apiserver::authz::Attributes::of(&axum::http::Method::DELETE, "/api/v1/namespaces/ns49/pods/x", None);
    assert!(authz.authorize(&user, &allowed).is_ok());
    assert!(authz.authorize(&user, &denied).is_err());
    let n = 20_000;
    let started = Instant::now();
    for i in 0..n {
        let a = if i % 2 == 0 { &allowed } else { &denied };
        std::hint::black_box(authz.authorize(&user, a).is_ok());
    }
    let per = started.elapsed() / n;
    println!("authorization decision with 1000 RoleBindings: {per:?} per request (debug build, half allowed, half denied)");
}

/// Runs kubectl against `s`: exit success, stdout, stderr.
async fn kubectl(s: &Server, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new("kubectl");
    cmd.arg("--server").arg(&s.base).env("KUBECONFIG", "/dev/null").args(args);
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        let mut input = child.stdin.take().expect("stdin");
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).expect("write stdin");
        }
        drop(input);
        let out = child.wait_with_output().expect("kubectl output");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .await
    .expect("kubectl task")
}

const READERS_ROLE: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: config-reader
  namespace: default
rules:
- apiGroups: [\"\"]
  resources: [configmaps]
  resourceNames: [settings]
  verbs: [get]
";

#[tokio::test]
async fn kubectl_creates_and_applies_rbac_objects_and_auth_can_i_answers_as_kubernetes_does() {
    let s = start().await;
    s.create(PODS, &pod("x")).await;
    for (args, expected) in [
        (vec!["create", "clusterrole", "pod-reader", "--verb=get,list,watch", "--resource=pods,pods/log"],
            "clusterrole.rbac.authorization.k8s.io/pod-reader created"),
        (vec!["create", "role", "cm-reader", "-n", "default", "--verb=get", "--resource=configmaps", "--resource-name=settings"],
            "role.rbac.authorization.k8s.io/cm-reader created"),
        (vec!["create", "rolebinding", "bob-reads", "-n", "default", "--clusterrole=pod-reader", "--user=bob"],
            "rolebinding.rbac.authorization.k8s.io/bob-reads created"),
        (vec!["create", "clusterrolebinding", "ops-view", "--clusterrole=view", "--group=ops", "--serviceaccount=default:robot"],
            "clusterrolebinding.rbac.authorization.k8s.io/ops-view created"),
    ] {
        let (ok, out, err) = kubectl(&s, &args, None).await;
        assert!(ok, "kubectl {args:?}: {err}");
        assert_eq!(out.trim(), expected);
    }
    let (ok, out, err) = kubectl(&s, &["apply", "-f", "-"], Some(READERS_ROLE)).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "role.rbac.authorization.k8s.io/config-reader created");
    let (ok, out, _) = kubectl(&s, &["apply", "-f", "-"], Some(READERS_ROLE)).await;
    assert!(ok && out.trim() == "role.rbac.authorization.k8s.io/config-reader unchanged", "{out}");
    let (ok, out, err) = kubectl(&s, &["get", "rolebindings", "-n", "default", "-o", "wide"], None).await;
    assert!(ok, "{err}");
    assert!(out.contains("bob-reads") && out.contains("ClusterRole/pod-reader") && out.contains("bob"), "{out}");

    wait_until(&s, "bob", &[], json!({"namespace": "default", "verb": "get", "resource": "pods"}), true).await;
    let (ok, out, err) = kubectl(&s, &["auth", "can-i", "get", "pods/log", "-n", "default", "--as", "bob"], None).await;
    assert!(ok, "{out} {err}");
    assert_eq!(out.trim(), "yes");
    let (ok, out, _) = kubectl(&s, &["auth", "can-i", "delete", "pods", "-n", "default", "--as", "bob"], None).await;
    assert!(!ok);
    assert_eq!(out.trim(), "no");
    let (ok, _, err) = kubectl(&s, &["delete", "pod", "x", "-n", "default", "--as", "bob"], None).await;
    assert!(!ok);
    assert_eq!(err.trim(), "Error from server (Forbidden): pods \"x\" is forbidden: User \"bob\" cannot delete resource \
        \"pods\" in API group \"\" in the namespace \"default\"");
    let (ok, out, err) = kubectl(&s, &["auth", "can-i", "--list", "-n", "default", "--as", "bob"], None).await;
    assert!(ok, "{err}");
    assert!(out.lines().any(|l| l.starts_with("pods/log") && l.contains("[get list watch]")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("selfsubjectaccessreviews.authorization.k8s.io")), "{out}");
}

#[tokio::test]
async fn default_roles_are_restored_at_start_unless_their_auto_update_is_turned_off() {
    use shepherd_apiserver::{ApiServer, HttpConfig};
    use shepherd_store::{HistoryLimits, LocalStore, Store};
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(LocalStore::in_memory(HistoryLimits::default()));
    let server = ApiServer::new(store.clone(), HttpConfig::default()).await.expect("server");
    let svc = server.service();
    let view = &shepherd_api::kinds::CLUSTERROLE;
    let rules = |name: &'static str| async move {
        let kv = svc.get(view, None, name).await.expect("role");
        let obj: Value = serde_json::from_slice(&kv.value).expect("json");
        obj["rules"].as_array().map_or(0, Vec::len)
    };
    let (view_rules, edit_rules) = (rules("view").await, rules("edit").await);
    assert!(view_rules > 1 && edit_rules > view_rules);
    let extra = json!({"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]});
    for (name, auto) in [("view", "true"), ("edit", "false")] {
        let kv = svc.get(view, None, name).await.expect("role");
        let mut obj: Value = serde_json::from_slice(&kv.value).expect("json");
        obj["rules"] = json!([extra]);
        obj["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] = json!(auto);
        svc.update(view, None, name, obj, shepherd_apiserver::Part::Main).await.expect("edit");
    }
    let restarted = ApiServer::new(store.clone(), HttpConfig::default()).await.expect("restart");
    let svc = restarted.service();
    let rules = |name: &'static str| async move {
        let kv = svc.get(view, None, name).await.expect("role");
        serde_json::from_slice::<Value>(&kv.value).expect("json")["rules"].clone()
    };
    let view_now = rules("view").await;
    assert_eq!(view_now.as_array().map(Vec::len), Some(view_rules + 1), "restored, and the added rule kept");
    assert_eq!(view_now[0], extra);
    assert_eq!(rules("edit").await, json!([extra]), "left as edited");
}
