//! Authentication over a real TLS listener: the user a handler finds in the request's extensions
//! comes from the client certificate or the bearer token, including a browser's WebSocket token.

use std::sync::Arc;

use axum::extract::Request;
use base64::Engine;
use serde_json::json;
use shepherd_apiserver::auth::UserInfo;
use shepherd_apiserver::authn::{Authenticator, certificates_from_pem, parse_token_file, server_config};
use shepherd_apiserver::pki::ClusterCa;
use shepherd_apiserver::{ApiServer, ConnectionLimits, ConnectionMetrics, HttpConfig, serve_tls};
use shepherd_store::{HistoryLimits, LocalStore, Store};

struct Served {
    url: String,
    ca: ClusterCa,
    _dir: tempfile::TempDir,
}

/// A TLS server whose extra route `/whoami` answers the request's `UserInfo`.
async fn serve() -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = ClusterCa::generate().expect("CA");
    let cas = certificates_from_pem(ca.cert_pem().as_bytes()).expect("CA pem");
    let tokens = parse_token_file("bob-token,bob,1002,\"dev\"\n").expect("tokens");
    let authn = Arc::new(Authenticator::new(&cas, tokens).expect("authenticator"));
    let serving = ca.serving_cert(&["127.0.0.1".into()]).expect("serving cert");
    let tls = server_config(serving.cert_pem.as_bytes(), serving.key_pem.as_bytes(), &cas).expect("tls");
    let store: Arc<dyn Store> =
        Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("store"));
    let config = HttpConfig { authenticator: Some(authn), ..HttpConfig::default() };
    let server = ApiServer::new(store, config).await.expect("server");
    // Authenticated users may ask who they are, and bob may read (authorization follows RBAC).
    let grants = [
        (&shepherd_api::kinds::CLUSTERROLE, json!({"metadata": {"name": "whoami"},
            "rules": [{"nonResourceURLs": ["/whoami"], "verbs": ["get"]}]})),
        (&shepherd_api::kinds::CLUSTERROLEBINDING, json!({"metadata": {"name": "whoami"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "whoami"},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:authenticated"}]})),
        (&shepherd_api::kinds::CLUSTERROLEBINDING, json!({"metadata": {"name": "bob-view"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "bob"}]})),
    ];
    for (res, obj) in grants {
        server.service().create(res, None, obj).await.expect("grant");
    }
    let whoami = axum::Router::new().route(
        "/whoami",
        axum::routing::get(|req: Request| async move {
            let user = req.extensions().get::<UserInfo>().cloned().unwrap_or_default();
            axum::Json(json!({"name": user.name, "groups": user.groups}))
        }),
    );
    let router = server.router_with(whoami);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let limits = ConnectionLimits { header_timeout: std::time::Duration::from_secs(10), max_connections: 64 };
    tokio::spawn(serve_tls(listener, router, limits, ConnectionMetrics::default(), tls, std::future::pending()));
    Served { url: format!("https://{addr}"), ca, _dir: dir }
}

fn client(ca: &ClusterCa, identity: Option<reqwest::Identity>) -> reqwest::Client {
    let root = reqwest::Certificate::from_pem(ca.cert_pem().as_bytes()).expect("root");
    let mut builder = reqwest::Client::builder().tls_built_in_root_certs(false).add_root_certificate(root);
    if let Some(id) = identity {
        builder = builder.identity(id);
    }
    builder.build().expect("client")
}

#[tokio::test]
async fn a_client_certificate_names_the_user_and_groups_handlers_see() {
    let s = serve().await;
    let cert = s.ca.client_cert("alice", &["dev".into(), "ops".into()]).expect("cert");
    let identity = reqwest::Identity::from_pem(format!("{}{}", cert.cert_pem, cert.key_pem).as_bytes()).expect("identity");
    let alice = client(&s.ca, Some(identity));
    let mut reply = alice.get(format!("{}/whoami", s.url)).send().await.expect("get");
    // The authorizer follows RBAC objects through the store's watch: a moment after they are written.
    for _ in 0..100 {
        if reply.status() != 403 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        reply = alice.get(format!("{}/whoami", s.url)).send().await.expect("get");
    }
    let who: serde_json::Value = reply.json().await.expect("json");
    assert_eq!(who, json!({"name": "alice", "groups": ["dev", "ops", "system:authenticated"]}));
    let anonymous = client(&s.ca, None).get(format!("{}/whoami", s.url)).send().await.expect("get");
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test]
async fn a_websocket_watch_authenticates_with_the_bearer_subprotocol_of_a_token_file_user() {
    let s = serve().await;
    let http = client(&s.ca, None);
    let watch = |token: &str| {
        let protocol = format!(
            "base64url.bearer.authorization.k8s.io.{}, v4.channel.k8s.io",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
        );
        http.get(format!("{}/api/v1/namespaces/default/configmaps?watch=true", s.url))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("Sec-WebSocket-Protocol", protocol)
            .send()
    };
    let mut upgraded = watch("bob-token").await.expect("upgrade").status();
    for _ in 0..100 {
        if upgraded != 403 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        upgraded = watch("bob-token").await.expect("upgrade").status();
    }
    assert_eq!(upgraded, 101);
    assert_eq!(watch("not-a-token").await.expect("refused").status(), 401);
}
