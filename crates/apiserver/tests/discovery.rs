//! Discovery and the shapes clients read, over a real socket: trailing slashes, 404s for what is
//! not served, aggregated discovery, a Service's status and the details of an error.

use std::sync::Arc;

use futures::StreamExt;
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
    /// Status, `Content-Type` and body (JSON when it parses).
    async fn call(&self, method: reqwest::Method, path: &str, accept: &str, body: Option<&Value>) -> (StatusCode, String, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if !accept.is_empty() {
            req = req.header("accept", accept);
        }
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b.to_string());
        }
        let resp = req.send().await.expect("request");
        let code = resp.status();
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let text = resp.text().await.expect("body");
        (code, ct, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (code, _, v) = self.call(reqwest::Method::GET, path, "", None).await;
        (code, v)
    }
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (code, _, v) = self.call(reqwest::Method::POST, path, "", Some(body)).await;
        (code, v)
    }
}

const KUBECTL_1_33_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,\
    application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
const KUBECTL_1_27_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

fn assert_kubernetes_404(code: StatusCode, body: &Value, what: &str) {
    assert_eq!(code, StatusCode::NOT_FOUND, "{what}: {body}");
    assert_eq!(body["kind"], "Status", "{what}");
    assert_eq!(body["reason"], "NotFound", "{what}");
    assert_eq!(body["message"], "the server could not find the requested resource", "{what}");
    assert_eq!(body["details"], json!({}), "{what}");
}

#[tokio::test]
async fn discovery_paths_answer_with_or_without_a_trailing_slash() {
    let s = start().await;
    for path in ["/version", "/version/", "/api", "/api/", "/apis", "/apis/", "/api/v1/", "/apis/apps/", "/apis/apps/v1/"] {
        let (code, body) = s.get(path).await;
        assert_eq!(code, StatusCode::OK, "{path}: {body}");
    }
    assert_eq!(s.get("/version/").await.1["major"], "1");
    assert_eq!(s.get("/apis/").await.1["kind"], "APIGroupList");
    assert_eq!(s.get("/api/").await.1["versions"], json!(["v1"]));
    assert_eq!(s.get("/apis/apps/v1/").await.1["groupVersion"], "apps/v1");
    assert_eq!(s.get("/api/v1/namespaces/default/pods/").await.1["kind"], "PodList");
}

#[tokio::test]
async fn what_is_not_served_answers_404_not_found_and_writes_nothing() {
    let s = start().await;
    let before = s.store.revision().await.expect("revision");
    let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"}, "spec": {}});
    let (code, body) = s.post("/api/v1/namespaces/default/persistentvolumeclaims", &pvc).await;
    assert_kubernetes_404(code, &body, "an unserved core resource in a namespace");
    for path in [
        "/api/v1/persistentvolumeclaims",
        "/api/v2/pods",
        "/api/v2",
        "/apis/widgets.example.com",
        "/apis/widgets.example.com/v1",
        "/apis/widgets.example.com/v1/namespaces/default/widgets",
        "/apis/apps/v2/deployments",
        "/apis/apps/v1/namespaces/default/replicationcontrollers",
        "/api/v1/namespaces/default/pods/web/bogus",
        "/api/v1/namespaces/default/nodes",
        "/nonsense",
    ] {
        let (code, body) = s.get(path).await;
        assert_kubernetes_404(code, &body, path);
    }
    assert_eq!(s.store.revision().await.expect("revision"), before, "nothing was written");
    // The namespace's own subresource is still the namespace's, not a resource called `status`.
    let (code, ns) = s.get("/api/v1/namespaces/default/status").await;
    assert_eq!((code, &ns["kind"]), (StatusCode::OK, &json!("Namespace")), "{ns}");
}

#[tokio::test]
async fn aggregated_discovery_is_served_to_clients_that_ask_and_the_legacy_lists_to_the_others() {
    let s = start().await;
    for (accept, version) in [(KUBECTL_1_33_ACCEPT, "v2"), (KUBECTL_1_27_ACCEPT, "v2beta1")] {
        let (code, ct, groups) = s.call(reqwest::Method::GET, "/apis", accept, None).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(ct, format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"));
        assert_eq!(groups["kind"], "APIGroupDiscoveryList");
        assert_eq!(groups["apiVersion"], format!("apidiscovery.k8s.io/{version}"));
        let apps = groups["items"].as_array().unwrap().iter().find(|g| g["metadata"]["name"] == "apps").expect("apps");
        let deploy = apps["versions"][0]["resources"].as_array().unwrap().iter().find(|r| r["resource"] == "deployments").unwrap();
        assert_eq!(deploy["responseKind"], json!({"group": "apps", "version": "v1", "kind": "Deployment"}));
        assert_eq!((&deploy["scope"], &deploy["shortNames"], &deploy["categories"]),
            (&json!("Namespaced"), &json!(["deploy"]), &json!(["all"])));
        assert!(deploy["verbs"].as_array().unwrap().contains(&json!("watch")));

        let (_, ct, core) = s.call(reqwest::Method::GET, "/api", accept, None).await;
        assert!(ct.contains(&format!("v={version};as=APIGroupDiscoveryList")), "{ct}");
        let resources = core["items"][0]["versions"][0]["resources"].as_array().unwrap();
        let pods = resources.iter().find(|r| r["resource"] == "pods").unwrap();
        let subs: Vec<&str> = pods["subresources"].as_array().unwrap().iter().filter_map(|s| s["subresource"].as_str()).collect();
        assert!(subs.contains(&"log") && subs.contains(&"status"), "{subs:?}");
        let nodes = resources.iter().find(|r| r["resource"] == "nodes").unwrap();
        assert_eq!(nodes["scope"], "Cluster");
    }
    let (_, ct, legacy) = s.call(reqwest::Method::GET, "/apis", "application/json", None).await;
    assert_eq!((ct.as_str(), &legacy["kind"]), ("application/json", &json!("APIGroupList")));
    let (_, _, legacy) = s.call(reqwest::Method::GET, "/api/", "", None).await;
    assert_eq!(legacy["kind"], "APIVersions");
}

#[tokio::test]
async fn a_service_always_carries_an_empty_load_balancer_status() {
    let s = start().await;
    let watch = s.http.get(format!("{}/api/v1/namespaces/default/services?watch=true", s.base)).send().await.expect("watch");
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}, "status": {"bogus": true}});
    let (code, created) = s.post("/api/v1/namespaces/default/services", &svc).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    assert_eq!(created["status"], json!({"loadBalancer": {}}));
    assert_eq!(s.get("/api/v1/namespaces/default/services/web").await.1["status"], json!({"loadBalancer": {}}));
    assert_eq!(s.get("/api/v1/services").await.1["items"][0]["status"], json!({"loadBalancer": {}}));
    let mut lines = watch.bytes_stream();
    let chunk = lines.next().await.expect("a watch event").expect("bytes");
    let event: Value = serde_json::from_slice(chunk.split(|b| *b == b'\n').next().unwrap_or(&[])).expect("event");
    assert_eq!(event["object"]["status"], json!({"loadBalancer": {}}));
}

#[tokio::test]
async fn errors_name_the_resource_and_its_group_separately() {
    let s = start().await;
    let (code, body) = s.get("/apis/apps/v1/namespaces/default/deployments/missing").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(body["details"], json!({"name": "missing", "group": "apps", "kind": "deployments"}));
    assert_eq!(body["message"], "deployments.apps \"missing\" not found");
    let (_, body) = s.get("/api/v1/namespaces/default/pods/missing").await;
    assert_eq!(body["details"], json!({"name": "missing", "kind": "pods"}));
}
