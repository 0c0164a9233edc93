//! Services of type NodePort over a real socket: node ports allocated from the range, explicit
//! ones checked, kept across updates, released on delete and type change, never given twice,
//! also by an API server started again on the same store.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig, NodePortRange};
use shepherd_store::{HistoryLimits, LocalStore, Store};

const SERVICES: &str = "/api/v1/namespaces/default/services";

struct Server {
    base: String,
    http: reqwest::Client,
}

async fn serve(store: Arc<dyn Store>, range: &str) -> Server {
    let range: NodePortRange = range.parse().expect("range");
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("server").with_node_port_range(range);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    Server { base: format!("http://{addr}"), http: reqwest::Client::new() }
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
}

fn service(name: &str, ty: &str, ports: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"type": ty, "selector": {"app": name}, "ports": ports}})
}

fn node_ports(svc: &Value) -> Vec<i64> {
    svc["spec"]["ports"].as_array().into_iter().flatten().filter_map(|p| p["nodePort"].as_i64()).collect()
}

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("store");
    (dir, Arc::new(store))
}

#[tokio::test]
async fn node_ports_come_from_the_range_explicit_ones_are_checked_and_updates_keep_them() {
    let (_dir, store) = store();
    let s = serve(store, "30000-32767").await;
    use reqwest::Method;
    let two = json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]);
    let (code, web) = s.send(Method::POST, SERVICES, Some(&service("web", "NodePort", two.clone()))).await;
    assert_eq!(code, StatusCode::CREATED, "{web}");
    let ports = node_ports(&web);
    assert_eq!(ports.len(), 2, "{web}");
    assert!(ports.iter().all(|p| (30000..=32767).contains(p)) && ports[0] != ports[1], "{ports:?}");

    let (code, err) =
        s.send(Method::POST, SERVICES, Some(&service("taken", "NodePort", json!([{"port": 80, "nodePort": ports[0]}])))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(err["details"]["causes"][0]["field"], "spec.ports[0].nodePort");
    let message = err["message"].as_str().unwrap_or("");
    assert!(message.contains("provided port is already allocated"), "{message}");

    let (code, err) =
        s.send(Method::POST, SERVICES, Some(&service("far", "NodePort", json!([{"port": 80, "nodePort": 40000}])))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert_eq!(err["details"]["causes"][0]["field"], "spec.ports[0].nodePort");
    assert!(err["message"].as_str().unwrap_or("").contains("The range of valid ports is 30000-32767"), "{err}");
    let (code, _) = s.send(Method::GET, &format!("{SERVICES}/far"), None).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "a refused Service is not written");

    let (code, lb) = s.send(Method::POST, SERVICES, Some(&service("lb", "LoadBalancer", json!([{"port": 80, "nodePort": 30123}])))).await;
    assert_eq!((code, node_ports(&lb)), (StatusCode::CREATED, vec![30123]), "{lb}");

    // A replace that leaves the node ports out keeps them.
    let mut replace = service("web", "NodePort", two);
    replace["spec"]["sessionAffinity"] = json!("ClientIP");
    let (code, replaced) = s.send(Method::PUT, &format!("{SERVICES}/web"), Some(&replace)).await;
    assert_eq!((code, node_ports(&replaced)), (StatusCode::OK, ports.clone()), "{replaced}");

    // Back to ClusterIP: the ports are dropped and free for another Service.
    let (code, plain) = s.send(Method::PUT, &format!("{SERVICES}/web"), Some(&service("web", "ClusterIP", json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}])))).await;
    assert_eq!((code, node_ports(&plain)), (StatusCode::OK, vec![]), "{plain}");
    let (code, reuse) =
        s.send(Method::POST, SERVICES, Some(&service("reuse", "NodePort", json!([{"port": 80, "nodePort": ports[0]}])))).await;
    assert_eq!((code, node_ports(&reuse)), (StatusCode::CREATED, vec![ports[0]]), "{reuse}");

    // Deleted: free again.
    let (code, _) = s.send(Method::DELETE, &format!("{SERVICES}/lb"), None).await;
    assert_eq!(code, StatusCode::OK);
    let (code, again) = s.send(Method::POST, SERVICES, Some(&service("again", "NodePort", json!([{"port": 80, "nodePort": 30123}])))).await;
    assert_eq!((code, node_ports(&again)), (StatusCode::CREATED, vec![30123]), "{again}");
}

#[tokio::test]
async fn a_server_started_again_on_the_same_store_never_hands_out_a_port_in_use() {
    let (_dir, store) = store();
    use reqwest::Method;
    let first = serve(store.clone(), "30000-30001").await;
    let mut taken = Vec::new();
    for name in ["a", "b"] {
        let (code, svc) = first.send(Method::POST, SERVICES, Some(&service(name, "NodePort", json!([{"port": 80}])))).await;
        assert_eq!(code, StatusCode::CREATED, "{svc}");
        taken.extend(node_ports(&svc));
    }
    taken.sort();
    assert_eq!(taken, vec![30000, 30001]);

    // A new server (as after a restart) knows the allocations from the stored Services.
    let second = serve(store, "30000-30001").await;
    let (code, err) = second.send(Method::POST, SERVICES, Some(&service("c", "NodePort", json!([{"port": 80}])))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(err["message"].as_str().unwrap_or("").contains("range 30000-30001 is full"), "{err}");
    let (_, a) = second.send(Method::GET, &format!("{SERVICES}/a"), None).await;
    let (code, _) = second.send(Method::DELETE, &format!("{SERVICES}/a"), None).await;
    assert_eq!(code, StatusCode::OK);
    let (code, c) = second.send(Method::POST, SERVICES, Some(&service("c", "NodePort", json!([{"port": 80}])))).await;
    assert_eq!((code, node_ports(&c)), (StatusCode::CREATED, node_ports(&a)), "{c}");
}
