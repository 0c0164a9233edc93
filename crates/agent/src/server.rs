//! The agent's streaming endpoint (the kubelet's port 10250 in Kubernetes): exec, attach and
//! port-forward into the pods this agent runs, as upgraded connections (WebSocket or SPDY/3.1)
//! that the API server hands through, and container logs. Every request must carry the shared
//! bearer token.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tracing::{debug, info, warn};

use crate::exec::ExecRequest;
use crate::pods::PodManager;
use crate::runtime::ContainerId;
use crate::spdy_session::{self, Wanted};
use crate::streams::{self, Channels};
use crate::websocket;

/// Where the streaming endpoint listens and the secret it requires.
#[derive(Clone)]
pub struct StreamingConfig {
    /// Address to listen on; port 0 picks a free one (published in the Node's status).
    pub address: SocketAddr,
    /// Every request must carry `Authorization: Bearer <token>`. The API server holds the same
    /// token; nobody else should.
    pub token: String,
}

/// The file in an agent's data directory that keeps the port its streaming endpoint last had.
const PORT_FILE: &str = "streaming-port";

/// Listens on `address`. With port 0, the port an earlier agent on the same `data_dir` had is
/// taken again when it is free, as kubelet keeps its 10250: the Node still publishes that port
/// until this agent's first status write, and an exec or attach in that window reaches this agent
/// instead of a closed port. The port bound is kept for the next agent.
pub(crate) async fn listen(address: SocketAddr, data_dir: &std::path::Path) -> std::io::Result<TcpListener> {
    if address.port() != 0 {
        return TcpListener::bind(address).await;
    }
    let file = data_dir.join(PORT_FILE);
    let earlier = std::fs::read_to_string(&file).ok().and_then(|p| p.trim().parse::<u16>().ok()).filter(|p| *p != 0);
    let listener = match earlier {
        Some(port) => match TcpListener::bind(SocketAddr::new(address.ip(), port)).await {
            Ok(l) => l,
            Err(e) => {
                debug!(port, error = %e, "the streaming endpoint's earlier port is taken; picking another");
                TcpListener::bind(address).await?
            }
        },
        None => TcpListener::bind(address).await?,
    };
    let port = listener.local_addr()?.port();
    let kept = std::fs::create_dir_all(data_dir)
        .and_then(|()| crate::process::write_atomically(&file, format!("{port}\n").as_bytes()));
    if let Err(e) = kept {
        warn!(path = %file.display(), error = %e, "cannot keep the streaming port for the next agent");
    }
    Ok(listener)
}

impl std::fmt::Debug for StreamingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingConfig").field("address", &self.address).field("token", &"<redacted>").finish()
    }
}

#[derive(Clone)]
struct ServerState {
    managers: Vec<Weak<PodManager>>,
    token: Arc<str>,
}

/// Serves the streaming endpoint on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, managers: Vec<Weak<PodManager>>, token: String) {
    let state = ServerState { managers, token: token.into() };
    let router = Router::new().route("/{*path}", any(handle)).with_state(state);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "streaming endpoint listening");
    }
    if let Err(e) = axum::serve(listener, router).await {
        warn!(error = %e, "streaming endpoint stopped");
    }
}

/// Why a request is refused before any upgrade: becomes a `Status` response.
struct Refusal(StatusCode, &'static str, String);

impl Refusal {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Refusal(code, reason, message.into())
    }

    fn into_response(self) -> Response {
        status(self.0, self.1, self.2)
    }
}

fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code.as_u16(),
    });
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Compares without leaking how much of the token matched through timing.
fn token_matches(given: &[u8], want: &[u8]) -> bool {
    if given.len() != want.len() {
        return false;
    }
    given.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn authorized(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| token_matches(t.as_bytes(), token.as_bytes()))
}

/// The query parameters of an exec or attach request (`command` repeats).
#[derive(Debug, Default)]
struct StreamQuery {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
    /// Port-forward over WebSocket channels: the ports, in channel order.
    ports: Vec<u16>,
}

fn parse_query(q: &str) -> StreamQuery {
    let mut out = StreamQuery::default();
    let on = |v: &str| matches!(v, "true" | "1" | "True");
    for (k, v) in form_urlencoded::parse(q.as_bytes()) {
        match &*k {
            "command" => out.command.push(v.into_owned()),
            "input" | "stdin" => out.stdin = on(&v),
            "output" | "stdout" => out.stdout = on(&v),
            "error" | "stderr" => out.stderr = on(&v),
            "tty" => out.tty = on(&v),
            "ports" | "port" => out.ports.extend(v.split(',').filter_map(|p| p.trim().parse::<u16>().ok())),
            _ => {}
        }
    }
    out
}

/// A container this agent runs, found by namespace, pod and container name.
struct Found {
    manager: Arc<PodManager>,
    id: ContainerId,
}

async fn find(state: &ServerState, namespace: &str, pod: &str, container: Option<&str>) -> Result<Found, Refusal> {
    let key = format!("{namespace}/{pod}");
    for m in state.managers.iter().filter_map(Weak::upgrade) {
        let Some((uid, names)) = m.containers_of(&key).await else { continue };
        let name = match container {
            Some(c) if names.iter().any(|n| n == c) => c.to_string(),
            Some(c) => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("container {c} is not valid for pod {pod}; choose one of: [{}]", names.join(" ")),
                ));
            }
            None => names.first().cloned().unwrap_or_default(),
        };
        return Ok(Found { manager: m, id: ContainerId { pod_key: key, pod_uid: uid, name } });
    }
    Err(Refusal::new(StatusCode::NOT_FOUND, "NotFound", format!("pod {namespace}/{pod} is not running on this node")))
}

enum Transport {
    WebSocket { protocol: &'static str },
    Spdy { protocol: &'static str },
}

/// Picks the transport and protocol version from the upgrade request.
fn negotiate(headers: &HeaderMap, port_forward: bool) -> Result<Transport, Refusal> {
    let upgrade = headers.get(header::UPGRADE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    let offered = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_string())
            .collect()
    };
    if upgrade == "websocket" {
        let ours: &[&'static str] =
            if port_forward { &[websocket::SPDY_TUNNEL, websocket::V4] } else { &[websocket::V5, websocket::V4] };
        let theirs = offered("sec-websocket-protocol");
        return ours
            .iter()
            .find(|p| theirs.iter().any(|t| t == *p))
            .map(|p| Transport::WebSocket { protocol: p })
            .ok_or_else(|| {
                Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", format!("no supported WebSocket subprotocol among {theirs:?}; supported: {ours:?}"))
            });
    }
    if upgrade.starts_with("spdy/3.1") {
        let want = if port_forward { "portforward.k8s.io" } else { websocket::V4 };
        let theirs = offered("x-stream-protocol-version");
        if theirs.iter().any(|t| t == want) {
            return Ok(Transport::Spdy { protocol: want });
        }
        return Err(Refusal::new(StatusCode::FORBIDDEN, "Forbidden", format!("unable to upgrade: no supported stream protocol among {theirs:?} (want {want})")));
    }
    Err(Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", "this endpoint needs an upgrade to websocket or SPDY/3.1"))
}

fn switching(transport: &Transport, headers: &HeaderMap) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    match transport {
        Transport::WebSocket { protocol } => {
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            let key = headers.get("sec-websocket-key").map(|k| derive_accept_key(k.as_bytes())).unwrap_or_default();
            if let Ok(v) = HeaderValue::from_str(&key) {
                h.insert("sec-websocket-accept", v);
            }
            h.insert("sec-websocket-protocol", HeaderValue::from_static(protocol));
        }
        Transport::Spdy { protocol } => {
            h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            h.insert("x-stream-protocol-version", HeaderValue::from_static(protocol));
        }
    }
    r
}

async fn handle(State(state): State<ServerState>, mut req: Request) -> Response {
    if !authorized(req.headers(), &state.token) {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let ["containerLogs", ns, pod, c] = parts.as_slice() {
        return container_logs(&state, ns, pod, c, req.uri().query().unwrap_or("")).await;
    }
    let (action, namespace, pod, container) = match parts.as_slice() {
        [a @ ("exec" | "attach"), ns, pod, c] => (*a, *ns, *pod, Some(*c)),
        ["portForward", ns, pod] => ("portForward", *ns, *pod, None),
        _ => return status(StatusCode::NOT_FOUND, "NotFound", format!("no streaming endpoint at {path}")),
    };
    let found = match find(&state, namespace, pod, container).await {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let port_forward = action == "portForward";
    let transport = match negotiate(req.headers(), port_forward) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    let runtime = found.manager.runtime().clone();
    let pid = runtime.pid(&found.id);
    if !port_forward && pid.is_none() {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("container {} in pod {pod} is not running", found.id.name),
        );
    }
    let session: Session = match action {
        "exec" => {
            if query.command.is_empty() {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "you must specify at least 1 command");
            }
            let req = ExecRequest { argv: query.command.clone(), stdin: query.stdin, tty: query.tty };
            let pid = pid.unwrap_or(0);
            Session::Channels(Box::new(move |chans| Box::pin(streams::run_exec(pid, req, chans))))
        }
        "attach" => {
            let stdin = match (query.stdin, runtime.stdin_pipe(&found.id)) {
                (false, _) => None,
                (true, Some(pipe)) => {
                    let (runtime, id) = (runtime.clone(), found.id.clone());
                    let ended: Box<dyn FnOnce() + Send> = Box::new(move || runtime.attach_ended(&id));
                    Some((pipe, ended))
                }
                (true, None) => {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!(
                            "container {} in pod {pod} has no stdin to attach to: set stdin: true in its spec, or \
                             attach without -i to see its output",
                            found.id.name
                        ),
                    );
                }
            };
            let Some(files) = runtime.log_files(&found.id) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "this node's runtime keeps no container output");
            };
            let target = streams::AttachTarget { log: files.current, stdin, terminal_of: query.tty.then_some(pid).flatten() };
            // This instance of the container: a restart (same id, new process) ends the attach.
            let main = pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
            let started = crate::process::start_time(main);
            let alive = move || started.is_some() && crate::process::start_time(main) == started;
            Session::Channels(Box::new(move |chans| Box::pin(streams::run_attach(target, alive, chans))))
        }
        _ => Session::PortForward(format!("{namespace}/{pod}")),
    };
    let wanted = Wanted { stdin: query.stdin, stdout: query.stdout, stderr: query.stderr, tty: query.tty };
    let response = switching(&transport, req.headers());
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                debug!(error = %e, "the client did not complete the upgrade");
                return;
            }
        };
        match (transport, session) {
            (Transport::WebSocket { protocol }, Session::Channels(run)) => {
                let ws = WebSocketStream::from_raw_socket(upgraded, Role::Server, None).await;
                let (chans, ends) = streams::channels();
                let session = tokio::spawn(run(chans));
                websocket::serve(ws, protocol == websocket::V5, ends).await;
                let _ = session.await;
            }
            (Transport::Spdy { .. }, Session::Channels(run)) => {
                let (chans, ends) = streams::channels();
                let session = tokio::spawn(run(chans));
                spdy_session::serve_channels(upgraded, wanted, ends).await;
                let _ = session.await;
            }
            (Transport::Spdy { .. }, Session::PortForward(pod)) => {
                spdy_session::serve_port_forward(upgraded, pod, pod_dialer(pid)).await;
            }
            (Transport::WebSocket { protocol }, Session::PortForward(pod)) if protocol != websocket::SPDY_TUNNEL => {
                let ws = WebSocketStream::from_raw_socket(upgraded, Role::Server, None).await;
                websocket::serve_port_forward(ws, pod, query.ports, pod_dialer(pid)).await;
            }
            (Transport::WebSocket { .. }, Session::PortForward(pod)) => {
                let ws = WebSocketStream::from_raw_socket(upgraded, Role::Server, None).await;
                let (ours, theirs) = tokio::io::duplex(256 * 1024);
                tokio::spawn(websocket::tunnel(ws, theirs));
                spdy_session::serve_port_forward(ours, pod, pod_dialer(pid)).await;
            }
        }
    });
    response
}

/// `GET /containerLogs/{namespace}/{pod}/{container}`: a container's log, with the query of
/// `pods/{name}/log`, for an API server that does not run this agent in its own process.
async fn container_logs(state: &ServerState, namespace: &str, pod: &str, container: &str, query: &str) -> Response {
    let mut q: std::collections::HashMap<String, String> =
        form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    q.insert("container".into(), container.into());
    let logs = crate::logs::PodLogs { managers: state.managers.clone() };
    let result = match crate::logs::LogQuery::from_query(&q) {
        Ok(q) => logs.logs(namespace, pod, &q).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(stream) => {
            let mut r = Response::new(Body::from_stream(stream));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            r
        }
        Err(e) => {
            let mut r = Response::new(Body::from(e.to_status().to_string()));
            *r.status_mut() = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
    }
}

type ChannelSession = Box<dyn FnOnce(Channels) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

enum Session {
    Channels(ChannelSession),
    PortForward(String),
}

/// Connects to a pod's port as kubelet does: to `localhost` inside the pod's network namespace,
/// the one its container `pid` is in (a pod network, an oci sandbox), or the node's loopback for
/// pods on the node's network (and when no container runs to say).
fn pod_dialer(pid: Option<u32>) -> spdy_session::Dialer {
    let netns = pid.map(|p| std::path::PathBuf::from(format!("/proc/{p}/ns/net"))).filter(|ns| !same_namespace(ns));
    Arc::new(move |port| {
        let netns = netns.clone();
        Box::pin(async move {
            match netns {
                None => tokio::net::TcpStream::connect(("127.0.0.1", port)).await,
                Some(ns) => connect_inside(ns, port).await,
            }
        })
    })
}

/// Whether the network namespace `ns` is this process's own.
fn same_namespace(ns: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(ns), std::fs::metadata("/proc/self/ns/net")) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => true,
    }
}

/// A TCP connection to `127.0.0.1:port` made inside the network namespace `ns`: from a thread of
/// its own that enters it and ends (a socket stays in the namespace it was made in).
async fn connect_inside(ns: std::path::PathBuf, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    use std::os::fd::AsRawFd;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let connected = std::fs::File::open(&ns).and_then(|file| {
            // SAFETY: setns on a descriptor we own; it changes only this thread's namespace, and
            // the thread ends right after.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
            stream.set_nonblocking(true)?;
            Ok(stream)
        });
        let _ = tx.send(connected);
    });
    let stream = rx.await.map_err(|_| std::io::Error::other("the connecting thread ended"))??;
    tokio::net::TcpStream::from_std(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_agent_on_the_same_data_directory_gets_the_earlier_port_back_when_it_is_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let first = listen(any, dir.path()).await.expect("listen").local_addr().unwrap().port();
        // The first listener is gone (dropped), as after a kill -9.
        let again = listen(any, dir.path()).await.expect("listen again");
        assert_eq!(again.local_addr().unwrap().port(), first, "the restarted agent's port is the one the Node publishes");
        // Someone else holds it now: another port, kept for the next time.
        let other = listen(any, dir.path()).await.expect("listen while the port is taken").local_addr().unwrap().port();
        assert_ne!(other, first);
        drop(again);
        let third = listen(any, dir.path()).await.expect("listen a third time").local_addr().unwrap().port();
        assert_eq!(third, other, "the port last bound is the one remembered");
    }

    #[test]
    fn exec_queries_keep_every_command_word_in_order() {
        let q = parse_query("command=sh&command=-c&command=echo+%24HOSTNAME%3B+exit+3&stdout=true&stderr=1&tty=false");
        assert_eq!(q.command, ["sh", "-c", "echo $HOSTNAME; exit 3"]);
        assert!(q.stdout && q.stderr && !q.stdin && !q.tty);
    }

    #[test]
    fn only_the_exact_token_is_accepted() {
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, "secret"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer secreT"));
        assert!(!authorized(&h, "secret"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer secret"));
        assert!(authorized(&h, "secret"));
    }
}
