//! `pods/exec`, `pods/attach` and `pods/portforward`: checked here (the pod exists, is bound, the
//! container is one of its own), then handed to the streaming endpoint of the agent running the
//! pod. The upgrade (WebSocket or SPDY) is passed through untouched and the two connections are
//! spliced: the API server never runs anything itself, and needs no knowledge of the protocols.
//! `pods/log` goes the same way when no agent runs inside the API server's process.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use shepherd_api::{ApiError, JsonPath, kinds};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use futures::StreamExt;
use tracing::debug;

use crate::codec;
use crate::service::ApiService;

/// Request headers the agent needs to answer the upgrade; everything else stays here.
const FORWARDED: [&str; 6] = [
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

/// Largest response head accepted from an agent.
const MAX_HEAD: usize = 64 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the agent's first bytes wait once the client has its `101` for a session over the
/// WebSocket channel protocols (exec, attach, and port-forward as kube-rs speaks it). client-go
/// (kubectl 1.30+) starts reading the socket in one goroutine while another registers its
/// streams, and drops a message for a stream not yet registered; a close that comes before the
/// registration fails the command ("closed all streams"). A command as short as `true` ends
/// within that gap when the client's threads are slow to be scheduled. A kubelet takes longer
/// than this to start any exec; Shepherd's agent can take 2 ms.
pub const CHANNELS_FIRST_BYTES_HOLD: Duration = Duration::from_millis(50);

/// The remote command channel protocols over WebSocket (`v4.channel.k8s.io`, `v5...`, their
/// base64 forms), which client-go reads as described at [`CHANNELS_FIRST_BYTES_HOLD`].
fn is_websocket_channels(answer: &[(HeaderName, HeaderValue)]) -> bool {
    answer.iter().any(|(k, v)| {
        k == header::SEC_WEBSOCKET_PROTOCOL && v.to_str().is_ok_and(|p| p.contains(".channel.k8s.io"))
    })
}

/// Where to reach the agent that runs a pod, and the path to ask it for.
struct AgentTarget {
    address: String,
    path: String,
}

fn names(pod: &Value, field: &str) -> Vec<String> {
    pod.at(field)
        .and_then(Value::as_array)
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Checks the request against the pod and finds the agent to hand it to.
async fn locate(
    svc: &ApiService,
    namespace: &str,
    pod_name: &str,
    sub: &str,
    query: &HashMap<String, String>,
    raw_query: &str,
) -> Result<AgentTarget, ApiError> {
    let pod = codec::decode(&svc.get(&kinds::POD, Some(namespace), pod_name).await?)?;
    let path = if sub == "portforward" {
        format!("/portForward/{namespace}/{pod_name}")
    } else {
        let containers = names(&pod, "/spec/containers");
        let container = match query.get("container").filter(|c| !c.is_empty()) {
            Some(c) => c.clone(),
            None => match containers.as_slice() {
                [only] => only.clone(),
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                        containers.join(" ")
                    )));
                }
            },
        };
        if !containers.contains(&container) {
            let init = names(&pod, "/spec/initContainers");
            let all: Vec<String> = containers.iter().chain(init.iter()).cloned().collect();
            return Err(ApiError::BadRequest(format!(
                "container {container} is not valid for pod {pod_name}; choose one of: [{}]",
                all.join(" ")
            )));
        }
        if sub == "exec" && !raw_query.split('&').any(|kv| kv.starts_with("command=")) {
            return Err(ApiError::BadRequest("you must specify at least 1 command".into()));
        }
        format!("/{sub}/{namespace}/{pod_name}/{container}")
    };
    let node_name = pod.at("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
    if node_name.is_empty() {
        return Err(ApiError::BadRequest(format!("pod {pod_name} does not have a host assigned")));
    }
    let node = codec::decode(&svc.get(&kinds::NODE, None, node_name).await?)?;
    let port = node.at("/status/daemonEndpoints/kubeletEndpoint/Port").and_then(Value::as_u64).unwrap_or(0);
    let ip = node
        .at("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .unwrap_or("");
    if port == 0 || ip.is_empty() {
        return Err(ApiError::ServiceUnavailable(format!(
            "node {node_name} publishes no streaming endpoint (status.daemonEndpoints.kubeletEndpoint.Port); \
             its agent serves no exec, attach or port-forward"
        )));
    }
    let address = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    let path = if raw_query.is_empty() { path } else { format!("{path}?{raw_query}") };
    Ok(AgentTarget { address, path })
}

/// The response head an agent sent, and whatever bytes followed it in the same read.
struct Head {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    content_length: Option<usize>,
    rest: Vec<u8>,
}

async fn read_head(tcp: &mut TcpStream) -> Result<Head, ApiError> {
    let bad = |m: &str| ApiError::Internal(format!("the node agent answered the stream request badly: {m}"));
    let mut buf = Vec::with_capacity(4096);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(bad("response head too large"));
        }
        let mut chunk = [0u8; 4096];
        let n = tcp.read(&mut chunk).await.map_err(|e| bad(&e.to_string()))?;
        if n == 0 {
            return Err(bad("connection closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let code = status_line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()).ok_or_else(|| bad("no status"))?;
    let status = StatusCode::from_u16(code).map_err(|_| bad("invalid status"))?;
    let mut headers = Vec::new();
    let mut content_length = None;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else { continue };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("content-length") {
            content_length = v.parse().ok();
        }
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
            headers.push((k, v));
        }
    }
    Ok(Head { status, headers, content_length, rest: buf[end + 4..].to_vec() })
}

async fn connect(target: &AgentTarget) -> Result<TcpStream, ApiError> {
    let unreachable = |e: String| ApiError::ServiceUnavailable(format!("cannot reach the node agent at {}: {e}", target.address));
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&target.address))
        .await
        .map_err(|_| unreachable("timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// Serves `pods/{name}/log` from the agent of the pod's node: the agent's answer, streamed.
pub(crate) async fn logs(
    svc: &ApiService,
    token: &str,
    namespace: &str,
    pod: &str,
    query: &HashMap<String, String>,
    raw_query: &str,
) -> Result<Response, ApiError> {
    let target = locate(svc, namespace, pod, "containerLogs", query, raw_query).await?;
    let mut tcp = connect(&target).await?;
    // HTTP/1.0: the agent ends the body by closing the connection, so it arrives unframed.
    let head = format!("GET {} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\r\n", target.path, target.address);
    tcp.write_all(head.as_bytes())
        .await
        .map_err(|e| ApiError::ServiceUnavailable(format!("cannot reach the node agent at {}: {e}", target.address)))?;
    let answer = read_head(&mut tcp).await?;
    let early = bytes::Bytes::from(answer.rest);
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(early) }).chain(futures::stream::unfold(tcp, |mut tcp| async move {
        let mut buf = vec![0u8; 32 * 1024];
        match tcp.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), tcp))
            }
            Err(e) => Some((Err(e), tcp)),
        }
    }));
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = answer.status;
    let content_type = if answer.status == StatusCode::OK { "text/plain" } else { "application/json" };
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(r)
}

/// Serves `pods/{name}/{exec,attach,portforward}` by handing the connection to the pod's agent.
pub(crate) async fn proxy(
    svc: &ApiService,
    token: Option<&str>,
    namespace: &str,
    pod: &str,
    sub: &str,
    query: &HashMap<String, String>,
    mut req: Request,
) -> Result<Response, ApiError> {
    if req.method() != Method::GET && req.method() != Method::POST {
        return Err(ApiError::MethodNotAllowed(format!("{} is not allowed on pods/{sub}", req.method())));
    }
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let target = locate(svc, namespace, pod, sub, query, &raw_query).await?;
    let Some(token) = token else {
        return Err(ApiError::ServiceUnavailable(
            "this API server has no credentials for node agents' streaming endpoints".into(),
        ));
    };
    if req.headers().get(header::UPGRADE).is_none() {
        return Err(ApiError::BadRequest(format!("pods/{sub} needs a connection upgrade (WebSocket or SPDY/3.1)")));
    }
    let unreachable = |e: String| ApiError::ServiceUnavailable(format!("cannot reach the node agent at {}: {e}", target.address));
    let mut tcp = connect(&target).await?;
    let mut head = format!("{} {} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n", req.method(), target.path, target.address);
    for (k, v) in req.headers() {
        if FORWARDED.contains(&k.as_str())
            && let Ok(v) = v.to_str()
        {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await.map_err(|e| unreachable(e.to_string()))?;
    let answer = read_head(&mut tcp).await?;
    if answer.status != StatusCode::SWITCHING_PROTOCOLS {
        // The agent's own answer (a Status), passed on as it is.
        let mut body = answer.rest;
        if let Some(len) = answer.content_length {
            let mut rest = vec![0u8; len.saturating_sub(body.len()).min(1 << 20)];
            if tcp.read_exact(&mut rest).await.is_ok() {
                body.extend_from_slice(&rest);
            }
        }
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = answer.status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(r);
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let hold = is_websocket_channels(&answer.headers).then_some(CHANNELS_FIRST_BYTES_HOLD);
    for (k, v) in answer.headers {
        response.headers_mut().append(k, v);
    }
    let early = answer.rest;
    tokio::spawn(async move {
        let client = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                debug!(error = %e, "the client did not complete the upgrade");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        if let Some(hold) = hold {
            tokio::time::sleep(hold).await;
        }
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        // Either side closing ends the session: the agent then ends what ran for it.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut tcp).await;
    });
    Ok(response)
}
