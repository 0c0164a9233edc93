//! `metrics.k8s.io` and HorizontalPodAutoscalers over a real socket: an agent's report served as
//! NodeMetrics and PodMetrics and never stored, `autoscaling/v1` as a view of `autoscaling/v2`,
//! and the 422 that names the field.

mod common;

use common::{Reply, start};
use reqwest::StatusCode;
use serde_json::{Value, json};

const METRICS: &str = "/apis/metrics.k8s.io/v1beta1";

fn names(list: &Value) -> Vec<&str> {
    list["items"].as_array().into_iter().flatten().filter_map(|i| i["metadata"]["name"].as_str()).collect()
}

#[tokio::test]
async fn a_node_report_is_served_as_node_and_pod_metrics_without_touching_the_store() {
    let s = start().await;
    let before = s.store.revision().await.expect("revision");
    let pod = |name: &str, app: &str| {
        json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app}}, "timestamp": "2026-01-01T00:00:00Z",
            "window": "5s", "containers": [{"name": "main", "usage": {"cpu": "250000000n", "memory": "2048Ki"}}]})
    };
    let report = json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics", "metadata": {"name": "n1"},
        "timestamp": "2026-01-01T00:00:00Z", "window": "5s", "usage": {"cpu": "1", "memory": "1Gi"},
        "pods": [pod("web-1", "web"), pod("db-1", "db")]});
    let Reply { code, body: node, .. } = s.post(&format!("{METRICS}/nodes"), &report).await;
    assert_eq!(code, StatusCode::CREATED, "{node}");

    let Reply { body: nodes, .. } = s.get(&format!("{METRICS}/nodes")).await;
    assert_eq!((nodes["kind"].as_str(), names(&nodes)), (Some("NodeMetricsList"), vec!["n1"]));
    let Reply { body: web, .. } = s.get(&format!("{METRICS}/namespaces/default/pods?labelSelector=app%3Dweb")).await;
    assert_eq!(names(&web), ["web-1"]);
    assert_eq!(web["items"][0]["containers"][0]["usage"]["cpu"], "250000000n");
    let Reply { code, body: one, .. } = s.get(&format!("{METRICS}/namespaces/default/pods/db-1")).await;
    assert_eq!((code, one["kind"].as_str()), (StatusCode::OK, Some("PodMetrics")));
    let Reply { code, .. } = s.get(&format!("{METRICS}/namespaces/other/pods/db-1")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let Reply { code, body: st, .. } = s.delete(&format!("{METRICS}/nodes/n1")).await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED, "{st}");
    let Reply { code, body: st, .. } = s.post(&format!("{METRICS}/nodes"), &json!({"metadata": {}})).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{st}");
    assert_eq!(s.store.revision().await.expect("revision"), before, "metrics are never written to the store");

    let Reply { body: discovery, .. } = s.get(METRICS).await;
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
    let Reply { code, body: created, .. } = s.post("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers", &v1).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    assert_eq!((created["apiVersion"].as_str(), created["spec"]["targetCPUUtilizationPercentage"].as_i64()), (Some("autoscaling/v1"), Some(60)));
    let Reply { body: v2, .. } = s.get("/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/web").await;
    assert_eq!(v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 60);
    let Reply { body: list, .. } = s.get("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers").await;
    assert_eq!(list["items"][0]["apiVersion"], "autoscaling/v1");

    let mut bad = v1.clone();
    bad["metadata"]["name"] = json!("bad");
    bad["spec"]["maxReplicas"] = json!(0);
    let Reply { code, body: st, .. } = s.post("/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers", &bad).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(st["details"]["causes"][0]["field"], "spec.maxReplicas");
    let Reply { body: group, .. } = s.get("/apis/autoscaling").await;
    assert_eq!(group["preferredVersion"]["version"], "v2");
}
