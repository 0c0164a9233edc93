//! The remote client against a real API server on a loopback socket.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_client::RemoteClient;
use shepherd_runtime::{Client, DeleteParams, ListParams, Patch, WatchEvent};
use shepherd_store::{HistoryLimits, LocalStore};

async fn serve(limits: HistoryLimits) -> RemoteClient {
    let store = Arc::new(LocalStore::in_memory(limits));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    RemoteClient::connect(&format!("http://{addr}"), None).expect("client")
}

fn pod(name: &str) -> serde_json::Value {
    json!({"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "minimal"}]}})
}

#[tokio::test]
async fn the_remote_client_does_everything_a_controller_needs() {
    let c = serve(HistoryLimits::default()).await;
    let list = c.list(&kinds::POD, &ListParams::namespace("default")).await.expect("list");
    assert!(list.items.is_empty());
    let mut watch = c.watch(&kinds::POD, &ListParams::namespace("default"), list.resource_version).await.expect("watch");

    let created = c.create(&kinds::POD, Some("default"), pod("a")).await.expect("create");
    assert_eq!(created["kind"], "Pod");
    let ev = tokio::time::timeout(Duration::from_secs(5), watch.next()).await.expect("in time").expect("event").expect("ok");
    assert!(matches!(ev, WatchEvent::Added(ref o) if o["metadata"]["name"] == "a"), "{ev:?}");

    let err = c.create(&kinds::POD, Some("default"), pod("a")).await.expect_err("duplicate");
    assert!(err.is_already_exists(), "{err:?}");
    let err = c.get(&kinds::POD, Some("default"), "missing").await.expect_err("missing");
    assert!(err.is_not_found(), "{err:?}");

    let mut stale = created.clone();
    c.patch(&kinds::POD, Some("default"), "a", Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}}))).await.expect("patch");
    stale["metadata"]["labels"]["v"] = json!("3");
    let err = c.update(&kinds::POD, Some("default"), stale).await.expect_err("stale");
    assert!(err.is_conflict(), "{err:?}");

    let st = c.patch_status(&kinds::POD, Some("default"), "a", Patch::Merge(json!({"status": {"phase": "Running"}}))).await.expect("status");
    assert_eq!(st["status"]["phase"], "Running");
    c.bind_pod("default", "a", "n1").await.expect("bind");
    let err = c.bind_pod("default", "a", "n2").await.expect_err("second bind");
    assert!(err.is_conflict(), "{err:?}");

    let sel = c.list(&kinds::POD, &ListParams::default().fields("spec.nodeName=n1")).await.expect("list");
    assert_eq!(sel.items.len(), 1);
    assert_eq!(sel.items[0]["kind"], "Pod");

    let marked = c.delete(&kinds::POD, Some("default"), "a", &DeleteParams::default()).await.expect("delete");
    assert!(marked.is_some(), "a bound pod is marked, not removed");
    let gone = c.delete(&kinds::POD, Some("default"), "a", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    assert!(gone.is_none());
}

/// Who wrote each field, as `--show-managed-fields` shows it.
fn managers(obj: &serde_json::Value) -> Vec<(String, String)> {
    let entries = obj["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
    entries.iter().map(|e| (e["manager"].as_str().unwrap_or("").into(), e["subresource"].as_str().unwrap_or("").into())).collect()
}

#[tokio::test]
async fn a_components_writes_are_recorded_under_its_name() {
    let c = serve(HistoryLimits::default()).await;
    let created = c.create(&kinds::POD, Some("default"), pod("a")).await.expect("create");
    assert_eq!(managers(&created), [("shepherd".to_string(), String::new())]);
    let agent = c.clone().named("shepherd-agent");
    let st = agent.patch_status(&kinds::POD, Some("default"), "a", Patch::Merge(json!({"status": {"phase": "Running"}}))).await.expect("status");
    assert_eq!(managers(&st), [("shepherd".to_string(), String::new()), ("shepherd-agent".to_string(), "status".to_string())]);
}

#[tokio::test]
async fn an_expired_watch_is_reported_as_expired() {
    let c = serve(HistoryLimits { max_events: 2, ..HistoryLimits::default() }).await;
    for i in 0..5 {
        c.create(&kinds::POD, Some("default"), pod(&format!("p{i}"))).await.expect("create");
    }
    let mut w = c.watch(&kinds::POD, &ListParams::namespace("default"), 1).await.expect("watch starts");
    let first = tokio::time::timeout(Duration::from_secs(5), w.next()).await.expect("in time").expect("an item");
    assert!(matches!(first, Err(shepherd_api::ApiError::Expired(_))), "{first:?}");
}

#[tokio::test]
async fn a_list_for_a_cache_leaves_out_managed_fields_and_keeps_everything_else() {
    let c = serve(HistoryLimits::default()).await;
    for i in 0..3 {
        let mut p = pod(&format!("p{i}"));
        p["metadata"]["annotations"] = json!({"note": "managedFields is only a key here", "n": i.to_string()});
        c.create(&kinds::POD, Some("default"), p).await.expect("create");
    }
    let full = c.list(&kinds::POD, &ListParams::namespace("default")).await.expect("list");
    let lean = c.list(&kinds::POD, &ListParams::namespace("default").without_managed_fields()).await.expect("list");
    assert_eq!(lean.resource_version, full.resource_version);
    assert_eq!(lean.items.len(), 3);
    for (mut f, l) in full.items.into_iter().zip(lean.items) {
        assert!(f["metadata"]["managedFields"].is_array(), "the server records managed fields: {f}");
        assert!(l["metadata"].get("managedFields").is_none(), "{l}");
        f["metadata"].as_object_mut().expect("metadata").remove("managedFields");
        assert_eq!(f, l, "apart from managedFields the items are the same");
    }
}

#[tokio::test]
async fn a_watch_for_a_cache_leaves_out_managed_fields_and_keeps_everything_else() {
    let c = serve(HistoryLimits::default()).await;
    let list = c.list(&kinds::POD, &ListParams::namespace("default")).await.expect("list");
    let mut full = c.watch(&kinds::POD, &ListParams::namespace("default"), list.resource_version).await.expect("watch");
    let lean_params = ListParams::namespace("default").without_managed_fields();
    let mut lean = c.watch(&kinds::POD, &lean_params, list.resource_version).await.expect("watch");
    let mut p = pod("a");
    p["metadata"]["annotations"] = json!({"note": "managedFields is only a key here"});
    c.create(&kinds::POD, Some("default"), p).await.expect("create");
    c.patch(&kinds::POD, Some("default"), "a", Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}}))).await.expect("patch");
    for _ in 0..2 {
        let f = tokio::time::timeout(Duration::from_secs(5), full.next()).await.expect("in time").expect("event").expect("ok");
        let l = tokio::time::timeout(Duration::from_secs(5), lean.next()).await.expect("in time").expect("event").expect("ok");
        let (f, l) = match (f, l) {
            (WatchEvent::Added(f), WatchEvent::Added(l)) | (WatchEvent::Modified(f), WatchEvent::Modified(l)) => (f, l),
            other => panic!("the two watches disagree on the event type: {other:?}"),
        };
        let mut f = f;
        assert!(f["metadata"]["managedFields"].is_array(), "the server records managed fields: {f}");
        assert!(l["metadata"].get("managedFields").is_none(), "{l}");
        f["metadata"].as_object_mut().expect("metadata").remove("managedFields");
        assert_eq!(f, l, "apart from managedFields the objects are the same");
    }
}
