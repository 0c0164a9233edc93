//! `metrics.k8s.io` and HorizontalPodAutoscalers over a real socket: an agent's report served as
//! NodeMetrics and PodMetrics and never stored, `autoscaling/v1` as a view of `autoscaling/v2`,
//! and the 422 that names the field.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};

struct Server {
    base: String,
    http: reqwest::Client,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn start() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> =
        Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("store"));
    let server = ApiServer::new(store.clone(), HttpConfig::default()).await.expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    Server { base: format!("http://{addr}"), http: reqwest::Client::new(), store, _dir: dir }
}

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
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }
}

const METRICS: &str = "/apis/metrics.k8s.io/v1beta1";

fn names(list: &Value) -> Vec<&str> {
    list["items"].as_array().into_iter().flatten().filter_map(|i| i["metadata"]["name"].as_str()).collect()
}

#[tokio::test]
async fn a_node_report_is_served_as_node_and_pod_metrics_without_touching_the_store() {
    let s = start().await;
    let before = s.store.revision();
    let pod = |name: &str, app: &str| {
        json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app}}, "timestamp": "2026-01-01T00:00:00Z",
            "window": "5s", "containers": [{"name": "main", "usage": {"cpu": "250000000n", "memory": "2048Ki"}}]})
    };
    let report = json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics", "metadata": {"name": "n1"},
        "timestamp": "2026-01-01T00:00:00Z", "window": "5s", "usage": {"cpu": "1", "memory": "1Gi"},
        "pods": [pod("web-1", "web"), pod("db-1", "db")]});
    let (code, node) = s.post(&format!("{METRICS}/nodes"), &report).await;
    assert_eq!(code, StatusCode::CREATED, "{node}");

    let (_, nodes) = s.get(&format!("{METRICS}/nodes")).await;
    assert_eq!((nodes["kind"].as_str(), names(&nodes)), (Some("NodeMetricsList"), vec!["n1"]));
    let (_, web) = s.get(&format!("{METRICS}/namespaces/default/pods?labelSelector=app%3Dweb")).await;
    assert_eq!(names(&web), ["web-1"]);
    assert_eq!(web["items"][0]["containers"][0]["usage"]["cpu"], "250000000n");
    let (code, one) = s.get(&format!("{METRICS}/namespaces/default/pods/db-1")).await;
    assert_eq!((code, one["kind"].as_str()), (StatusCode::OK, Some("PodMetrics")));
    let (code, _) = s.get(&format!("{METRICS}/namespaces/other/pods/db-1")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (code, st) = s.send(reqwest::Method::DELETE, &format!("{METRICS}/nodes/n1"), None).await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED, "{st}");
    let (code, st) = s.post(&format!("{METRICS}/nodes"), &json!({"metadata": {}})).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{st}");
    assert_eq!(s.store.revision(), before, "metrics are never written to the store");

    let (_, discovery) = s.get(METRICS).await;
    let served: Vec<&str> = discovery["resources"].as_array().into_iter().flatten().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(served, ["nodes", "pods"]);
    assert_eq!(discovery["resources"][1]["verbs"], json!(["get", "list"]));
}

#[tokio::test]
async fn an_autoscaler_written_in_v1_is_stored_in_v2_and_read_back_in_either() {
    let s = start().await;
    let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1, "maxReplicas": 4, "targetCPUUtilizationPercentage": 60}});
    let (code, created) = s.post("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers", &v1).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    assert_eq!((created["apiVersion"].as_str(), created["spec"]["targetCPUUtilizationPercentage"].as_i64()), (Some("autoscaling/v1"), Some(60)));
    let (_, v2) = s.get("/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/web").await;
    assert_eq!(v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 60);
    let (_, list) = s.get("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers").await;
    assert_eq!(list["items"][0]["apiVersion"], "autoscaling/v1");

    let mut bad = v1.clone();
    bad["metadata"]["name"] = json!("bad");
    bad["spec"]["maxReplicas"] = json!(0);
    let (code, st) = s.post("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers", &bad).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(st["details"]["causes"][0]["field"], "spec.maxReplicas");
    let (_, group) = s.get("/apis/autoscaling").await;
    assert_eq!(group["preferredVersion"]["version"], "v2");
}
