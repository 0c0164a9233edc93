//! kube-rs `Patch::Apply`, as operators use it, against a real API server: ownership, conflicts,
//! force, and removal of what an applier stops applying.

use std::sync::Arc;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore};

async fn deployments() -> Api<DynamicObject> {
    let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    let url = format!("http://{addr}").parse().expect("url");
    let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("apps", "v1", "Deployment"), "deployments");
    Api::namespaced_with(client, "default", &ar)
}

fn desired(replicas: i64, labels: Value, containers: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}}})
}

fn managed(obj: &DynamicObject) -> Vec<(String, String)> {
    obj.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| (e.manager.clone().unwrap_or_default(), e.operation.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn an_operator_applying_with_kube_owns_its_fields_conflicts_forces_and_removes_what_it_drops() {
    let api = deployments().await;
    let operator = PatchParams::apply("operator");
    let both = json!([{"name": "web", "image": "nginx"}, {"name": "sidecar", "image": "envoy"}]);
    let first = api
        .patch("web", &operator, &Patch::Apply(desired(2, json!({"app": "web", "team": "a"}), both)))
        .await
        .expect("first apply creates");
    assert_eq!(managed(&first), vec![("operator".to_string(), "Apply".to_string())]);

    // Someone else changes replicas and pauses the rollout with a merge patch.
    let human = PatchParams { field_manager: Some("human".into()), ..Default::default() };
    api.patch("web", &human, &Patch::Merge(json!({"spec": {"replicas": 5, "paused": true}}))).await.expect("merge patch");

    // The operator's next apply, without the sidecar and the team label, still says 2 replicas.
    let one = json!([{"name": "web", "image": "nginx"}]);
    let err = api
        .patch("web", &operator, &Patch::Apply(desired(2, json!({"app": "web"}), one.clone())))
        .await
        .expect_err("replicas belong to human now");
    let kube::Error::Api(status) = err else { panic!("not an API error: {err:?}") };
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert_eq!(status.message, "Apply failed with 1 conflict: conflict with \"human\" using apps/v1: .spec.replicas");

    let applied = api
        .patch("web", &operator.clone().force(), &Patch::Apply(desired(2, json!({"app": "web"}), one)))
        .await
        .expect("forced apply");
    let data = &applied.data;
    assert_eq!(data["spec"]["replicas"], 2, "force takes the field back");
    assert_eq!(data["spec"]["paused"], true, "what only the human set stays");
    let names: Vec<&str> = data["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, vec!["web"], "the dropped sidecar is removed");
    assert_eq!(applied.metadata.labels.as_ref().map(|l| l.len()), Some(1), "the dropped label is removed");
    let mut managers = managed(&applied);
    managers.sort();
    assert_eq!(managers, vec![("human".to_string(), "Update".to_string()), ("operator".to_string(), "Apply".to_string())]);
}
