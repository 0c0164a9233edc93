//! The protobuf encoding over a real socket: bodies in, negotiated answers out, watch frames, and
//! the refusal of bodies that are not what they claim. Request bodies are assembled by hand from the
//! wire format, so these tests do not share the server's message layouts.

use std::sync::Arc;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What client-go (kubectl 1.32+) sends.
const CLIENT_GO_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

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

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

/// A length-delimited field.
fn field(num: u64, bytes: &[u8]) -> Vec<u8> {
    [varint(num << 3 | 2), varint(bytes.len() as u64), bytes.to_vec()].concat()
}

fn int_field(num: u64, v: u64) -> Vec<u8> {
    [varint(num << 3), varint(v)].concat()
}

/// `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}.
fn body(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
    [b"k8s\0".to_vec(), field(1, &type_meta), field(2, raw)].concat()
}

/// A Namespace: ObjectMeta{name} as field 1.
fn namespace(name: &str) -> Vec<u8> {
    body("v1", "Namespace", &field(1, &field(1, name.as_bytes())))
}

/// DeleteOptions{gracePeriodSeconds = 1, propagationPolicy = 4}.
fn delete_options(grace: u64, policy: &str) -> Vec<u8> {
    body("v1", "DeleteOptions", &[int_field(1, grace), field(4, policy.as_bytes())].concat())
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn send_protobuf(
        &self,
        method: reqwest::Method,
        path: &str,
        bytes: Vec<u8>,
    ) -> (StatusCode, String, Vec<u8>) {
        let resp = self
            .http
            .request(method, self.url(path))
            .header("content-type", PROTOBUF)
            .header("accept", CLIENT_GO_ACCEPT)
            .body(bytes)
            .send()
            .await
            .expect("request");
        let code = resp.status();
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        (code, ct, resp.bytes().await.expect("body").to_vec())
    }

    async fn get_json(&self, path: &str, accept: Option<&str>) -> (StatusCode, String, Value) {
        let mut req = self.http.get(self.url(path));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = req.send().await.expect("request");
        let code = resp.status();
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let text = resp.text().await.expect("body");
        (code, ct, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn a_protobuf_create_is_stored_and_reads_back_as_json() {
    let s = start().await;
    let (code, ct, out) = s.send_protobuf(reqwest::Method::POST, "/api/v1/namespaces", namespace("x")).await;
    assert_eq!(code, StatusCode::CREATED, "{}", String::from_utf8_lossy(&out));
    assert_eq!(ct, PROTOBUF);
    assert!(out.starts_with(b"k8s\0") && contains(&out, b"Namespace") && contains(&out, b"Active"));

    let (code, ct, ns) = s.get_json("/api/v1/namespaces/x", None).await;
    assert_eq!((code, ct.as_str()), (StatusCode::OK, "application/json"));
    assert_eq!(ns["metadata"]["name"], "x");
    assert_eq!(ns["status"]["phase"], "Active");
    assert!(ns["metadata"]["uid"].is_string());
}

#[tokio::test]
async fn json_stays_the_default_and_protobuf_is_answered_only_to_who_prefers_it() {
    let s = start().await;
    for accept in
        [None, Some("application/json"), Some("*/*"), Some("application/json, application/vnd.kubernetes.protobuf")]
    {
        let (code, ct, v) = s.get_json("/api/v1/namespaces/default", accept).await;
        assert_eq!((code, ct.as_str()), (StatusCode::OK, "application/json"), "{accept:?}");
        assert_eq!(v["metadata"]["name"], "default");
    }
    let resp = s.http.get(s.url("/api/v1/namespaces")).header("accept", CLIENT_GO_ACCEPT).send().await.expect("list");
    assert_eq!(resp.headers()["content-type"], PROTOBUF);
    let list = resp.bytes().await.expect("body");
    assert!(contains(&list, b"NamespaceList") && contains(&list, b"kube-system"));

    // A Table has no protobuf form: JSON, as Kubernetes answers.
    let (code, ct, table) = s
        .get_json(
            "/api/v1/namespaces",
            Some("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json"),
        )
        .await;
    assert_eq!((code, ct.as_str()), (StatusCode::OK, "application/json"));
    assert_eq!(table["kind"], "Table");
}

#[tokio::test]
async fn a_protobuf_delete_options_body_is_honoured() {
    let s = start().await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "minimal"}]}});
    let resp = s.http.post(s.url("/api/v1/namespaces/default/pods")).json(&pod).send().await.expect("create");
    assert_eq!(resp.status(), StatusCode::CREATED);

    let (code, ct, _) = s
        .send_protobuf(
            reqwest::Method::DELETE,
            "/api/v1/namespaces/default/pods/web-0",
            delete_options(7, "Foreground"),
        )
        .await;
    assert!(code.is_success(), "{code}");
    assert_eq!(ct, PROTOBUF);
    let (_, _, pod) = s.get_json("/api/v1/namespaces/default/pods/web-0", None).await;
    assert_eq!(pod["metadata"]["deletionGracePeriodSeconds"], 7, "{pod}");
    assert!(
        pod["metadata"]["finalizers"].as_array().is_some_and(|f| f.contains(&json!("foregroundDeletion"))),
        "{pod}"
    );
}

#[tokio::test]
async fn truncated_foreign_and_garbage_protobuf_bodies_are_bad_requests_that_write_nothing() {
    let s = start().await;
    let before = s.store.revision().await.expect("revision");
    let good = namespace("y");
    let pod_raw = field(1, &field(1, b"p"));
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("POST", "/api/v1/namespaces", good[..good.len() - 2].to_vec(), "truncated"),
        ("POST", "/api/v1/namespaces", [b"k8s\0".as_slice(), &[0xff; 12]].concat(), "malformed"),
        ("POST", "/api/v1/namespaces", b"k8s\0".to_vec(), "kind \"\""),
        ("POST", "/api/v1/namespaces", b"not protobuf at all".to_vec(), "malformed"),
        ("POST", "/api/v1/namespaces/default/pods", namespace("y"), "does not match the expected kind (Pod)"),
        ("POST", "/api/v1/namespaces", body("example.com/v1", "Widget", &pod_raw), "Widget"),
        ("DELETE", "/api/v1/namespaces/default", body("v1", "Pod", &pod_raw), "expected kind (DeleteOptions)"),
        ("DELETE", "/api/v1/namespaces/default", delete_options(0, "Foreground")[..12].to_vec(), "truncated"),
    ];
    for (method, path, bytes, expected) in cases {
        let method: reqwest::Method = method.parse().expect("method");
        let (code, ct, out) = s.send_protobuf(method.clone(), path, bytes).await;
        let text = String::from_utf8_lossy(&out);
        assert_eq!(code, StatusCode::BAD_REQUEST, "{method} {path}: {text}");
        assert!(ct.starts_with("application/json") || ct == PROTOBUF, "{ct}");
        assert!(text.contains(expected), "{method} {path}: {text:?} should mention {expected:?}");
    }
    assert_eq!(s.store.revision().await.expect("revision"), before, "a refused body wrote nothing");
    let (_, _, ns) = s.get_json("/api/v1/namespaces/default", None).await;
    assert!(ns["metadata"].get("deletionTimestamp").is_none());
}

#[tokio::test]
async fn a_watch_is_framed_protobuf_only_for_a_client_that_accepts_nothing_else() {
    let s = start().await;
    let resp = s
        .http
        .get(s.url("/api/v1/namespaces?watch=1&timeoutSeconds=5"))
        .header("accept", PROTOBUF)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.headers()["content-type"], "application/vnd.kubernetes.protobuf;stream=watch");
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    while got.len() < 4 || got.len() < 4 + u32::from_be_bytes([got[0], got[1], got[2], got[3]]) as usize {
        got.extend_from_slice(&stream.next().await.expect("a frame").expect("bytes"));
    }
    let len = u32::from_be_bytes([got[0], got[1], got[2], got[3]]) as usize;
    let event = &got[4..4 + len];
    assert!(event.starts_with(&field(1, b"ADDED")), "{event:?}");
    assert!(contains(event, b"k8s\0") && contains(event, b"Namespace"));

    let resp = s
        .http
        .get(s.url("/api/v1/namespaces?watch=1&timeoutSeconds=1"))
        .header("accept", CLIENT_GO_ACCEPT)
        .send()
        .await;
    assert_eq!(resp.expect("watch").headers()["content-type"], "application/json");
}

#[tokio::test]
async fn subresource_bodies_binding_and_scale_are_read_from_protobuf() {
    let s = start().await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0"},
        "spec": {"containers": [{"name": "c", "image": "minimal"}]}});
    assert_eq!(
        s.http.post(s.url("/api/v1/namespaces/default/pods")).json(&pod).send().await.expect("pod").status(),
        201
    );
    // Binding{metadata{name}, target = 2: ObjectReference{kind = 1, name = 3}}.
    let binding = body(
        "v1",
        "Binding",
        &[field(1, &field(1, b"web-0")), field(2, &[field(1, b"Node"), field(3, b"node-1")].concat())].concat(),
    );
    let (code, _, out) =
        s.send_protobuf(reqwest::Method::POST, "/api/v1/namespaces/default/pods/web-0/binding", binding).await;
    assert_eq!(code, StatusCode::CREATED, "{}", String::from_utf8_lossy(&out));
    let (_, _, pod) = s.get_json("/api/v1/namespaces/default/pods/web-0", None).await;
    assert_eq!(pod["spec"]["nodeName"], "node-1");

    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "minimal"}]}}}});
    let resp =
        s.http.post(s.url("/apis/apps/v1/namespaces/default/deployments")).json(&deploy).send().await.expect("deploy");
    assert_eq!(resp.status(), 201);
    // autoscaling/v1 Scale{metadata{name}, spec = 2: ScaleSpec{replicas = 1}}: zero replicas is a value,
    // not an absence.
    let scale = body("autoscaling/v1", "Scale", &[field(1, &field(1, b"web")), field(2, &int_field(1, 0))].concat());
    let (code, ct, out) =
        s.send_protobuf(reqwest::Method::PUT, "/apis/apps/v1/namespaces/default/deployments/web/scale", scale).await;
    assert_eq!(code, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    assert_eq!(ct, PROTOBUF);
    assert!(contains(&out, b"autoscaling/v1") && contains(&out, b"Scale"));
    let (_, _, deploy) = s.get_json("/apis/apps/v1/namespaces/default/deployments/web", None).await;
    assert_eq!(deploy["spec"]["replicas"], 0, "{deploy}");
}
