//! Watches over WebSocket, as Kubernetes serves them to browsers: the same watch, each event one
//! message. A page holds many watches at once, and HTTP/1.1 streams would use up the browser's six
//! connections per host; WebSockets do not count against that limit.
//!
//! Subprotocols as Kubernetes names them: `binary.k8s.io` (events in binary messages; plain text
//! messages when no protocol is offered), and `base64url.bearer.authorization.k8s.io.<token>`,
//! the bearer token of a client that cannot set headers (never echoed back).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures::{SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tracing::debug;

const BINARY: &str = "binary.k8s.io";
const BEARER_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// Whether the request asks to become a WebSocket.
pub(crate) fn requested(headers: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).any(|v| {
            v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    };
    has(header::UPGRADE, "websocket") && has(header::CONNECTION, "upgrade")
}

fn offered(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The bearer token a browser put in its subprotocols, if any.
pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let encoded = offered(headers).find_map(|p| p.strip_prefix(BEARER_PREFIX))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded.trim_end_matches('=')).ok()?;
    String::from_utf8(bytes).ok()
}

/// Turns a watch answer into a WebSocket carrying its events. A watch that failed before its
/// first event (a 410 for a compacted resourceVersion, say) still upgrades, and sends its `Status`
/// as one `ERROR` event, which is how a browser learns why: it sees no HTTP status.
pub(crate) fn upgrade(watch: Response, headers: &HeaderMap, on_upgrade: OnUpgrade) -> Response {
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return (StatusCode::BAD_REQUEST, "a WebSocket upgrade needs Sec-WebSocket-Key\n").into_response();
    };
    let accept = derive_accept_key(key.as_bytes());
    let binary = offered(headers).any(|p| p == BINARY);
    let failed = !watch.status().is_success();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                debug!(error = %e, "the client did not complete the WebSocket upgrade");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        pump(ws, watch.into_body(), binary, failed).await;
    });
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if binary {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(BINARY));
    }
    r
}

/// Sends each line of the watch body as one message until the watch ends or the client leaves.
async fn pump<S>(ws: WebSocketStream<S>, body: Body, binary: bool, failed: bool)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut incoming) = ws.split();
    let mut frames = body.into_data_stream();
    let mut pending: Vec<u8> = Vec::new();
    let message = |line: &[u8]| {
        if binary {
            Message::binary(line.to_vec())
        } else {
            Message::text(String::from_utf8_lossy(line).into_owned())
        }
    };
    loop {
        tokio::select! {
            chunk = frames.next() => {
                let Some(Ok(chunk)) = chunk else { break };
                pending.extend_from_slice(&chunk);
                if failed {
                    continue; // one Status document, sent whole at the end
                }
                while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=nl).collect();
                    let line = line.trim_ascii();
                    if !line.is_empty() && sink.send(message(line)).await.is_err() {
                        return;
                    }
                }
            }
            msg = incoming.next() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
    let rest = pending.trim_ascii();
    if failed {
        let status: serde_json::Value = serde_json::from_slice(rest).unwrap_or_else(|_| {
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": String::from_utf8_lossy(rest)})
        });
        let event = serde_json::json!({"type": "ERROR", "object": status}).to_string();
        let _ = sink.send(message(event.as_bytes())).await;
    } else if !rest.is_empty() {
        let _ = sink.send(message(rest)).await;
    }
    let _ = sink.send(Message::Close(None)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_browser_token_travels_in_a_subprotocol_and_upgrade_needs_both_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!requested(&h), "no Connection: upgrade");
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(requested(&h));
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("s3cret/token+");
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(&format!("binary.k8s.io, {BEARER_PREFIX}{encoded}")).unwrap());
        assert_eq!(bearer_token(&h).as_deref(), Some("s3cret/token+"));
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("base64url.bearer.authorization.k8s.io.!!"));
        assert_eq!(bearer_token(&h), None, "not base64url");
    }
}
