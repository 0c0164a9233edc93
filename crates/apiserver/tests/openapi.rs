//! The OpenAPI documents over a real socket: content negotiation, ETags, the v3 index and its hashes.

use std::sync::Arc;

use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LOCATION};
use serde_json::Value;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};

const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

async fn start() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> =
        Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("store"));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    (format!("http://{addr}"), dir)
}

fn header(r: &reqwest::Response, name: reqwest::header::HeaderName) -> String {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

#[tokio::test]
async fn openapi_v2_answers_json_or_protobuf_as_asked_and_honours_its_etag() {
    let (base, _dir) = start().await;
    let http = reqwest::Client::new();

    let json = http.get(format!("{base}/openapi/v2")).send().await.expect("get");
    assert_eq!(json.status(), StatusCode::OK);
    assert_eq!(header(&json, CONTENT_TYPE), "application/json");
    let etag = header(&json, ETAG);
    let doc: Value = json.json().await.expect("json");
    assert_eq!(doc["swagger"], "2.0");
    assert!(doc["definitions"]["io.k8s.api.apps.v1.Deployment"].is_object());

    let pb = http.get(format!("{base}/openapi/v2")).header(ACCEPT, PROTOBUF).send().await.expect("get");
    assert_eq!(pb.status(), StatusCode::OK);
    // client-go parses the answer's media type; Go refuses the `@` of the name asked for.
    assert_eq!(header(&pb, CONTENT_TYPE), "application/octet-stream");
    let pb_etag = header(&pb, ETAG);
    assert_ne!(pb_etag, etag, "the two forms are different bytes");
    let bytes = pb.bytes().await.expect("bytes");
    // Field 1 of gnostic's Document, a string: "2.0".
    assert_eq!(&bytes[..5], b"\x0a\x032.0");

    let again = http.get(format!("{base}/openapi/v2")).header(IF_NONE_MATCH, &etag).send().await.expect("get");
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    let stale = http.get(format!("{base}/openapi/v2")).header(IF_NONE_MATCH, "\"stale\"").send().await.expect("get");
    assert_eq!(stale.status(), StatusCode::OK);
}

#[tokio::test]
async fn openapi_v3_lists_each_group_version_and_serves_it_by_hash() {
    let (base, _dir) = start().await;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");

    let index: Value = http.get(format!("{base}/openapi/v3")).send().await.expect("get").json().await.expect("json");
    let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"].as_str().expect("apps/v1 listed").to_string();
    assert!(index["paths"]["api/v1"].is_object(), "{index}");

    let doc = http.get(format!("{base}{url}")).send().await.expect("get");
    assert_eq!(doc.status(), StatusCode::OK);
    assert_eq!(header(&doc, CACHE_CONTROL), "public, immutable");
    let doc: Value = doc.json().await.expect("json");
    assert_eq!(doc["openapi"], "3.0.0");
    assert!(doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"].is_object());

    let old = http.get(format!("{base}/openapi/v3/apis/apps/v1?hash=0123")).send().await.expect("get");
    assert_eq!(old.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(header(&old, LOCATION), url);

    let missing = http.get(format!("{base}/openapi/v3/apis/widgets.example.com/v1")).send().await.expect("get");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let status: Value = missing.json().await.expect("status");
    assert_eq!(status["reason"], "NotFound");

    let protobuf_only = http
        .get(format!("{base}/openapi/v3/api/v1"))
        .header(ACCEPT, "application/com.github.proto-openapi.spec.v3@v1.0+protobuf")
        .send()
        .await
        .expect("get");
    assert_eq!(protobuf_only.status(), StatusCode::NOT_ACCEPTABLE);
}
