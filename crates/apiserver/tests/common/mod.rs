//! A real API server on a loopback port over a real redb store, and a client for it.
#![allow(dead_code)]

use std::sync::Arc;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};

pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
pub const MERGE: &str = "application/merge-patch+json";
pub const JSON_PATCH: &str = "application/json-patch+json";
pub const STRATEGIC: &str = "application/strategic-merge-patch+json";

pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

/// A response as a client sees it.
pub struct Reply {
    pub code: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    /// Every `Warning` header's text.
    pub fn warnings(&self) -> Vec<String> {
        self.headers.get_all("warning").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect()
    }
}

pub async fn start_with(config: HttpConfig, extra: axum::Router) -> Server {
    start_on(HistoryLimits::default(), config, extra).await
}

/// A server whose store keeps the watch history `limits` allow.
pub async fn start_on(limits: HistoryLimits, config: HttpConfig, extra: axum::Router) -> Server {
    start_configured(limits, config, extra, |s| s).await
}

/// A server that issues ServiceAccount tokens and mounts them into pods, as a TLS server does:
/// the admission that mounts them runs for pods written by an authenticated user.
#[allow(dead_code)]
pub async fn start_issuing_tokens() -> Server {
    start_configured(HistoryLimits::default(), HttpConfig::default(), axum::Router::new(), |s| {
        let key = shepherd_apiserver::serviceaccount::generate_key_pem().expect("a signing key");
        let tokens = shepherd_apiserver::serviceaccount::ServiceAccountTokens::new(&key, shepherd_apiserver::serviceaccount::DEFAULT_ISSUER, vec![])
            .expect("tokens");
        s.with_service_account_tokens(tokens)
    })
    .await
}

async fn start_configured(limits: HistoryLimits, config: HttpConfig, extra: axum::Router, configure: impl FnOnce(ApiServer) -> ApiServer) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), limits).expect("store"));
    let server = configure(ApiServer::new(store.clone(), config).await.expect("server"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = server.router_with(extra).layer(axum::middleware::from_fn(test_identity));
    tokio::spawn(async move { axum::serve(listener, router).await });
    Server { base: format!("http://{addr}"), http: reqwest::Client::new(), store, _dir: dir }
}

/// Header naming the user a test request is made as (with `x-test-groups`, comma-separated): the
/// stand-in for authentication in these tests. Without it a request is unauthenticated, as through
/// `--insecure-loopback`, and allowed everything.
pub const TEST_USER: &str = "x-test-user";
pub const TEST_GROUPS: &str = "x-test-groups";

async fn test_identity(mut req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let header = |req: &axum::extract::Request, name: &str| {
        req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
    };
    if let Some(user) = header(&req, TEST_USER) {
        let groups: Vec<String> = header(&req, TEST_GROUPS).unwrap_or_default().split(',').filter(|g| !g.is_empty())
            .map(str::to_string).collect();
        req.extensions_mut().insert(shepherd_apiserver::auth::UserInfo::new(user, groups));
    }
    next.run(req).await
}

pub async fn start() -> Server {
    start_with(HttpConfig::default(), axum::Router::new()).await
}

pub fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "minimal"}]}})
}

pub fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "minimal"}]}}}})
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Requests made as `user` in `groups`.
    pub fn user(&self, user: &str, groups: &[&str]) -> Caller<'_> {
        Caller { server: self, identity: Some((user.to_string(), groups.join(","))) }
    }

    /// Sends a raw body; a transport failure (an empty reply) fails the test with the request.
    pub async fn raw(&self, method: reqwest::Method, path: &str, body: Option<String>, content_type: &str) -> Reply {
        Caller { server: self, identity: None }.raw(method, path, body, content_type).await
    }
    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>, content_type: &str) -> Reply {
        self.raw(method, path, body.map(Value::to_string), content_type).await
    }
    pub async fn get(&self, path: &str) -> Reply {
        self.send(reqwest::Method::GET, path, None, "").await
    }
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(reqwest::Method::POST, path, Some(body), "application/json").await
    }
    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(reqwest::Method::PUT, path, Some(body), "application/json").await
    }
    pub async fn patch(&self, path: &str, body: &Value, ct: &str) -> Reply {
        self.send(reqwest::Method::PATCH, path, Some(body), ct).await
    }
    pub async fn delete(&self, path: &str) -> Reply {
        self.send(reqwest::Method::DELETE, path, None, "").await
    }
    /// Creates an object and returns it; the test fails if it is refused.
    pub async fn create(&self, collection: &str, obj: &Value) -> Value {
        let r = self.post(collection, obj).await;
        assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
        r.body
    }
}

/// Requests to a server as one identity (see [`TEST_USER`]).
pub struct Caller<'a> {
    server: &'a Server,
    identity: Option<(String, String)>,
}

impl Caller<'_> {
    pub async fn raw(&self, method: reqwest::Method, path: &str, body: Option<String>, content_type: &str) -> Reply {
        let mut req = self.server.http.request(method.clone(), self.server.url(path));
        if let Some((user, groups)) = &self.identity {
            req = req.header(TEST_USER, user).header(TEST_GROUPS, groups);
        }
        if let Some(b) = &body {
            req = req.header("content-type", content_type).body(b.clone());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => panic!("{method} {path} with {body:?}: no response: {e}"),
        };
        let code = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        Reply { code, headers, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) }
    }
    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>, content_type: &str) -> Reply {
        self.raw(method, path, body.map(Value::to_string), content_type).await
    }
    pub async fn get(&self, path: &str) -> Reply {
        self.send(reqwest::Method::GET, path, None, "").await
    }
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(reqwest::Method::POST, path, Some(body), "application/json").await
    }
    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(reqwest::Method::PUT, path, Some(body), "application/json").await
    }
    pub async fn patch(&self, path: &str, body: &Value, ct: &str) -> Reply {
        self.send(reqwest::Method::PATCH, path, Some(body), ct).await
    }
    pub async fn delete(&self, path: &str) -> Reply {
        self.send(reqwest::Method::DELETE, path, None, "").await
    }
}
