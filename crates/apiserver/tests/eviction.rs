//! The eviction subresource over a real socket: budgets spent atomically, 429 when none is left.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};

struct Server {
    base: String,
    http: reqwest::Client,
}

async fn start() -> Server {
    let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    Server { base: format!("http://{addr}"), http: reqwest::Client::new() }
}

const PODS: &str = "/api/v1/namespaces/default/pods";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";

impl Server {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b.to_string());
        }
        let resp = req.send().await.expect("request");
        let code = resp.status();
        let text = resp.text().await.expect("body");
        (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// A running, ready pod labelled `app=APP` (not bound to a node, so it is deleted at once).
    async fn ready_pod(&self, name: &str, app: &str) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "minimal"}]}});
        let (code, body) = self.send(reqwest::Method::POST, PODS, Some(&pod)).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        let path = format!("{PODS}/{name}/status");
        let resp = self.http.patch(format!("{}{path}", self.base)).header("content-type", "application/merge-patch+json")
            .body(status.to_string()).send().await.expect("patch");
        assert!(resp.status().is_success());
    }

    async fn evict(&self, pod: &str, api_version: &str) -> (StatusCode, Value) {
        let body = json!({"apiVersion": api_version, "kind": "Eviction", "metadata": {"name": pod, "namespace": "default"}});
        self.send(reqwest::Method::POST, &format!("{PODS}/{pod}/eviction"), Some(&body)).await
    }

    /// Sets the budget's status as the disruption controller would.
    async fn budget_status(&self, observed: i64, healthy: i64, desired: i64, allowed: i64) {
        let (_, pdb) = self.get(&format!("{PDBS}/web")).await;
        let mut pdb = pdb;
        pdb["status"] = json!({"observedGeneration": observed, "currentHealthy": healthy, "desiredHealthy": desired,
            "disruptionsAllowed": allowed, "expectedPods": 3});
        let (code, body) = self.send(reqwest::Method::PUT, &format!("{PDBS}/web/status"), Some(&pdb)).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
}

#[tokio::test]
async fn evictions_spend_the_budget_and_are_refused_with_429_when_it_is_spent() {
    let s = start().await;
    for p in ["web-0", "web-1", "web-2"] {
        s.ready_pod(p, "web").await;
    }
    s.ready_pod("lonely", "db").await;
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}});
    let (code, created) = s.send(reqwest::Method::POST, PDBS, Some(&pdb)).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    assert!(created.get("status").is_none(), "a new budget starts without status: {created}");

    // Not yet observed by the disruption controller: refused.
    let (code, status) = s.evict("web-0", "policy/v1").await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS, "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "The disruption budget web is still being processed by the server.");

    s.budget_status(1, 3, 2, 1).await;
    let (code, status) = s.evict("web-0", "policy/v1").await;
    assert_eq!(code, StatusCode::CREATED, "{status}");
    assert_eq!(status["status"], "Success");
    assert_eq!(s.get(&format!("{PODS}/web-0")).await.0, StatusCode::NOT_FOUND, "the evicted pod is deleted");
    let (_, pdb) = s.get(&format!("{PDBS}/web")).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "the eviction spent the allowed disruption");
    assert!(pdb["status"]["disruptedPods"]["web-0"].is_string(), "{pdb}");

    // Older clients send policy/v1beta1; the answer is the same 429 Kubernetes gives.
    let (code, status) = s.evict("web-1", "policy/v1beta1").await;
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS, "{status}");
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["message"], "Cannot evict pod as it would violate the pod's disruption budget.");
    assert_eq!(status["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(status["details"]["causes"][0]["message"], "The disruption budget web needs 2 healthy pods and has 3 currently");
    assert_eq!(s.get(&format!("{PODS}/web-1")).await.0, StatusCode::OK, "a refused eviction deletes nothing");

    // A pod no budget covers goes at once; a pod that does not exist is 404; a body naming
    // another pod is 400.
    let (code, _) = s.evict("lonely", "policy/v1").await;
    assert_eq!(code, StatusCode::CREATED);
    assert_eq!(s.evict("ghost", "policy/v1").await.0, StatusCode::NOT_FOUND);
    let other = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-2"}});
    let (code, _) = s.send(reqwest::Method::POST, &format!("{PODS}/web-1/eviction"), Some(&other)).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn concurrent_evictions_never_spend_more_than_the_budget_allows() {
    let s = Arc::new(start().await);
    for n in 0..6 {
        s.ready_pod(&format!("web-{n}"), "web").await;
    }
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"maxUnavailable": 2, "selector": {"matchLabels": {"app": "web"}}}});
    assert_eq!(s.send(reqwest::Method::POST, PDBS, Some(&pdb)).await.0, StatusCode::CREATED);
    s.budget_status(1, 6, 4, 2).await;
    let tasks: Vec<_> = (0..6)
        .map(|n| {
            let s = s.clone();
            tokio::spawn(async move { s.evict(&format!("web-{n}"), "policy/v1").await.0 })
        })
        .collect();
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.expect("eviction task"));
    }
    let evicted = codes.iter().filter(|c| **c == StatusCode::CREATED).count();
    let refused = codes.iter().filter(|c| **c == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!((evicted, refused), (2, 4), "{codes:?}");
}

#[tokio::test]
async fn discovery_lists_the_eviction_subresource_in_the_policy_group() {
    let s = start().await;
    let (_, core) = s.get("/api/v1").await;
    let eviction = core["resources"].as_array().and_then(|r| r.iter().find(|r| r["name"] == "pods/eviction")).cloned();
    let eviction = eviction.expect("pods/eviction is listed");
    assert_eq!((eviction["group"].as_str(), eviction["version"].as_str(), eviction["kind"].as_str()),
        (Some("policy"), Some("v1"), Some("Eviction")));
    let (code, policy) = s.get("/apis/policy/v1").await;
    assert_eq!(code, StatusCode::OK);
    assert!(policy["resources"].as_array().is_some_and(|r| r.iter().any(|r| r["name"] == "poddisruptionbudgets")));
    let (code, _) = s.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices").await;
    assert_eq!(code, StatusCode::OK);
}

#[tokio::test]
async fn a_budget_with_both_bounds_or_a_bad_percentage_is_rejected_naming_the_field() {
    let s = start().await;
    let both = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "both"},
        "spec": {"minAvailable": 1, "maxUnavailable": 1, "selector": {}}});
    let (code, status) = s.send(reqwest::Method::POST, PDBS, Some(&both)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    assert!(status["message"].as_str().is_some_and(|m| m.contains("minAvailable and maxUnavailable cannot be both set")), "{status}");
    let bad = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "bad"},
        "spec": {"minAvailable": "150%"}});
    let (code, status) = s.send(reqwest::Method::POST, PDBS, Some(&bad)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{status}");
    assert_eq!(status["details"]["causes"][0]["field"], "spec.minAvailable");
    assert_eq!(s.get(&format!("{PDBS}/bad")).await.0, StatusCode::NOT_FOUND, "a rejected budget is not written");
}

#[tokio::test]
async fn an_unready_pod_goes_without_spending_the_budget_when_the_budget_is_met() {
    let s = start().await;
    for p in ["web-0", "web-1", "web-2"] {
        s.ready_pod(p, "web").await;
    }
    let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let resp = s.http.patch(format!("{}{PODS}/web-2/status", s.base)).header("content-type", "application/merge-patch+json")
        .body(unready.to_string()).send().await.expect("patch");
    assert!(resp.status().is_success());
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}});
    assert_eq!(s.send(reqwest::Method::POST, PDBS, Some(&pdb)).await.0, StatusCode::CREATED);
    s.budget_status(1, 2, 2, 0).await;

    let (code, status) = s.evict("web-2", "policy/v1").await;
    assert_eq!(code, StatusCode::CREATED, "{status}");
    let (_, pdb) = s.get(&format!("{PDBS}/web")).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0);
    assert!(pdb["status"].get("disruptedPods").is_none(), "an unready pod spent a disruption: {pdb}");
    assert_eq!(s.evict("web-1", "policy/v1").await.0, StatusCode::TOO_MANY_REQUESTS, "a ready pod still may not go");
}

#[tokio::test]
async fn a_pod_on_a_node_terminates_marked_as_a_disruption_target() {
    let s = start().await;
    s.ready_pod("web-0", "web").await;
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web-0"}, "target": {"kind": "Node", "name": "n1"}});
    let (code, body) = s.send(reqwest::Method::POST, &format!("{PODS}/web-0/binding"), Some(&binding)).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(s.evict("web-0", "policy/v1").await.0, StatusCode::CREATED);
    let (code, pod) = s.get(&format!("{PODS}/web-0")).await;
    assert_eq!(code, StatusCode::OK, "a pod on a node terminates gracefully");
    assert!(pod["metadata"]["deletionTimestamp"].is_string(), "{pod}");
    let target = pod["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget")).cloned();
    assert_eq!(target.map(|t| t["reason"].clone()), Some(json!("EvictionByEvictionAPI")), "{pod}");
}
