//! `pods/exec`, `pods/attach`, `pods/portforward`: what the API server checks itself, and how it
//! hands an upgraded connection to the agent of the pod's node (a stand-in agent here, on a
//! real socket).

use std::sync::Arc;

use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "node-secret";

struct Api {
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

async fn api() -> Api {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> =
        Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("store"));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("server").with_node_streaming(TOKEN);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = server.router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    Api { addr, _dir: dir }
}

/// Sends one raw request and returns everything read until the head ends, plus the stream.
async fn request(addr: std::net::SocketAddr, head: &str) -> (String, TcpStream) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.expect("read") == 0 {
            break;
        }
        got.push(b[0]);
    }
    (String::from_utf8_lossy(&got).into_owned(), s)
}

/// What a stand-in agent reads of the API server's request: its head.
async fn head_of(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.expect("head");
        head.push(b[0]);
    }
    head
}

async fn body_of(mut s: TcpStream) -> Value {
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), s.read_to_end(&mut rest)).await;
    let text = String::from_utf8_lossy(&rest);
    let start = text.find('{').unwrap_or(0);
    let end = text.rfind('}').map(|i| i + 1).unwrap_or(text.len());
    serde_json::from_str(&text[start..end]).unwrap_or(Value::String(text.into_owned()))
}

async fn post_json(api: &Api, path: &str, body: &Value, method: &str) -> String {
    let text = body.to_string();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let (head, _) = request(api.addr, &head).await;
    head
}

async fn node_with_port(api: &Api, name: &str, port: u16) {
    post_json(api, "/api/v1/nodes", &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}), "POST").await;
    let status = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}});
    let head = post_json(api, &format!("/api/v1/nodes/{name}/status"), &status, "PUT").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

async fn pod_on(api: &Api, name: &str, node: Option<&str>) {
    let mut spec = json!({"containers": [{"name": "app", "image": "minimal"}, {"name": "side", "image": "minimal"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    let head = post_json(api, "/api/v1/namespaces/default/pods", &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}), "POST").await;
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
}

const UPGRADE: &str = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n";

#[tokio::test]
async fn an_exec_is_handed_to_the_nodes_agent_with_the_token_and_the_connections_are_spliced() {
    let api = api().await;
    let agent = TcpListener::bind("127.0.0.1:0").await.expect("agent");
    node_with_port(&api, "n1", agent.local_addr().expect("addr").port()).await;
    pod_on(&api, "web", Some("n1")).await;
    let seen = tokio::spawn(async move {
        let (mut s, _) = agent.accept().await.expect("the API server connects");
        let head = head_of(&mut s).await;
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
            .await
            .expect("answer");
        // Echo one message back, upper-cased, through the spliced connection.
        let mut msg = [0u8; 5];
        s.read_exact(&mut msg).await.expect("client bytes");
        s.write_all(&msg.to_ascii_uppercase()).await.expect("echo");
        String::from_utf8_lossy(&head).into_owned()
    });
    let (head, mut client) = request(
        api.addr,
        &format!("POST /api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&command=echo+hi&container=side&stdout=true HTTP/1.1\r\nHost: x\r\n{UPGRADE}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.to_ascii_lowercase().contains("x-stream-protocol-version: v4.channel.k8s.io"), "{head}");
    client.write_all(b"hello").await.expect("send");
    let mut echo = [0u8; 5];
    client.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"HELLO");
    let agent_saw = seen.await.expect("agent");
    assert!(
        agent_saw.starts_with("POST /exec/default/web/side?command=sh&command=-c&command=echo+hi&container=side&stdout=true HTTP/1.1"),
        "{agent_saw}"
    );
    assert!(agent_saw.contains(&format!("Authorization: Bearer {TOKEN}")), "{agent_saw}");
}

#[tokio::test]
async fn requests_the_pod_cannot_serve_are_refused_by_the_api_server() {
    let api = api().await;
    node_with_port(&api, "bare", 0).await;
    pod_on(&api, "pending", None).await;
    pod_on(&api, "placed", Some("bare")).await;
    let exec = |pod: &str, query: &str| {
        format!("POST /api/v1/namespaces/default/pods/{pod}/exec?{query} HTTP/1.1\r\nHost: x\r\n{UPGRADE}Connection: close\r\n\r\n")
    };
    let cases = [
        (exec("ghost", "command=true&container=app"), "404", "pods \"ghost\" not found"),
        (exec("placed", "command=true&container=nope"), "400", "container nope is not valid for pod placed; choose one of: [app side]"),
        (exec("placed", "command=true"), "400", "a container name must be specified for pod placed, choose one of: [app side]"),
        (exec("placed", "container=app"), "400", "you must specify at least 1 command"),
        (exec("pending", "command=true&container=app"), "400", "pod pending does not have a host assigned"),
        (exec("placed", "command=true&container=app"), "503", "node bare publishes no streaming endpoint"),
    ];
    for (req, code, message) in cases {
        let (head, s) = request(api.addr, &req).await;
        assert!(head.starts_with(&format!("HTTP/1.1 {code}")), "{req}: {head}");
        let body = body_of(s).await;
        assert!(body["message"].as_str().is_some_and(|m| m.contains(message)), "{req}: {body}");
    }
}

#[tokio::test]
async fn logs_come_from_the_nodes_agent_when_none_runs_in_the_api_server() {
    let api = api().await;
    let agent = TcpListener::bind("127.0.0.1:0").await.expect("agent");
    node_with_port(&api, "n2", agent.local_addr().expect("addr").port()).await;
    pod_on(&api, "talker", Some("n2")).await;
    let seen = tokio::spawn(async move {
        let (mut s, _) = agent.accept().await.expect("the API server connects");
        let head = head_of(&mut s).await;
        s.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello\nworld\n").await.expect("answer");
        String::from_utf8_lossy(&head).into_owned()
    });
    let (head, s) = request(
        api.addr,
        "GET /api/v1/namespaces/default/pods/talker/log?container=side&tailLines=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut s = s;
    let mut body = Vec::new();
    s.read_to_end(&mut body).await.expect("body");
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("hello\nworld\n"), "{text}");
    let agent_saw = seen.await.expect("agent");
    assert!(agent_saw.starts_with("GET /containerLogs/default/talker/side?container=side&tailLines=2 HTTP/1.0"), "{agent_saw}");
    assert!(agent_saw.contains(&format!("Authorization: Bearer {TOKEN}")), "{agent_saw}");
}

/// A stand-in agent that upgrades one request with `answer` and at once writes `first` (a
/// command that has already ended: its status and the close).
async fn agent_answering_at_once(api: &Api, node: &str, answer: &'static str, first: &'static [u8]) {
    let agent = TcpListener::bind("127.0.0.1:0").await.expect("agent");
    node_with_port(api, node, agent.local_addr().expect("addr").port()).await;
    tokio::spawn(async move {
        let (mut s, _) = agent.accept().await.expect("the API server connects");
        head_of(&mut s).await;
        s.write_all(answer.as_bytes()).await.expect("answer");
        s.write_all(first).await.expect("first bytes");
        let _ = s.read_to_end(&mut Vec::new()).await;
    });
}

/// How long after its `101` a client waits for the first byte of an exec.
async fn first_byte_after_upgrade(api: &Api, pod: &str, upgrade: &str) -> std::time::Duration {
    let (head, mut client) = request(
        api.addr,
        &format!("GET /api/v1/namespaces/default/pods/{pod}/exec?command=true&container=side&stdout=true HTTP/1.1\r\nHost: x\r\n{upgrade}\r\n"),
    )
    .await;
    let upgraded = std::time::Instant::now();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mut b = [0u8; 1];
    client.read_exact(&mut b).await.expect("the agent's first byte");
    upgraded.elapsed()
}

#[tokio::test]
async fn a_websocket_exec_that_ends_at_once_reaches_the_client_after_client_go_has_registered_its_streams() {
    let api = api().await;
    // A binary message on channel 3 (the status), then a normal close: an exec of `true`.
    const ENDED: &[u8] = b"\x82\x15\x03{\"status\":\"Success\"}\x88\x02\x03\xe8";
    agent_answering_at_once(
        &api,
        "n1",
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: x\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n",
        ENDED,
    )
    .await;
    pod_on(&api, "web", Some("n1")).await;
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n";
    let after = first_byte_after_upgrade(&api, "web", ws).await;
    assert!(
        after >= shepherd_apiserver::CHANNELS_FIRST_BYTES_HOLD,
        "the status and close of a finished exec reached the client {after:?} after its 101"
    );
}
