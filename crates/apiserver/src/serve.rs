//! Serves the router over TCP with bounded connections: a header time-out, a connection cap, and
//! a graceful stop.
//!
//! hyper's header time-out starts when a connection is ready for its next request, so it bounds
//! both a client that sends half a request head and a keep-alive connection left idle: such a
//! connection costs a file descriptor only for that long. A streaming response (a watch) is not
//! idle and is never cut. Past the cap, new connections are accepted and closed at once (a quick
//! error for the client instead of a hang in the kernel's backlog), so the descriptors the store
//! and the node agent need are never taken by a flood.
//!
//! Over TLS the handshake runs in the connection's own task, bounded by the same header time-out,
//! and the client's certificates travel with each of its requests as an extension.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::audit::PeerAddr;
use crate::authn::PeerCertificates;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

/// How many connections are served at once and how long a request head may take.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// A connection that has not sent a complete request head this long after it became ready
    /// for one (opened, or finished its previous response) is closed.
    pub header_timeout: Duration,
    /// Connections served at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl ConnectionLimits {
    /// A cap sized from the process's open-file limit: half of it, leaving the rest for the
    /// store, the node agent's containers and logs, and outgoing connections.
    pub fn cap_for_open_files(limit: u64) -> usize {
        usize::try_from(limit / 2).unwrap_or(usize::MAX).clamp(64, 1 << 20)
    }
}

/// The connection gauges and counters, for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    open: Gauge,
    limit: Gauge,
    rejected: Counter,
}

impl ConnectionMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register("apiserver_connections", "HTTP connections currently open", self.open.clone());
        registry.register(
            "apiserver_connections_limit",
            "Most HTTP connections served at once (--max-connections); more are closed on accept",
            self.limit.clone(),
        );
        registry.register(
            "apiserver_connections_rejected",
            "HTTP connections closed on accept because --max-connections were open",
            self.rejected.clone(),
        );
    }
}

/// Logs "connection cap reached" at most once per interval, with the count since the last line.
struct RejectionLog {
    since: AtomicU64,
    last: std::sync::Mutex<Option<Instant>>,
}

/// How long open requests may take to finish once the server stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

const REJECTION_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl RejectionLog {
    fn note(&self, max: usize) {
        let count = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < REJECTION_LOG_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        self.since.store(0, Ordering::Relaxed);
        warn!(
            max_connections = max,
            rejected = count,
            "connection cap reached: new connections are closed until others end (raise --max-connections or the open-file limit)"
        );
    }
}

/// Serves `router` in plain HTTP on `listener` until `shutdown` completes, then lets open
/// requests finish (watches end at once: they are told to stop by the same shutdown elsewhere).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, router, limits, metrics, None, shutdown).await
}

/// As [`serve`], over TLS with `tls`: each request carries the client's certificates (an
/// `Arc<PeerCertificates>` extension) for authentication.
pub async fn serve_tls(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, router, limits, metrics, Some(TlsAcceptor::from(tls)), shutdown).await
}

async fn serve_with(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // A request answered early has the rest of its body read out first (see drain.rs).
    let router = router.layer(axum::middleware::from_fn(crate::drain::drain_unread_body));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    metrics.limit.set(limits.max_connections as i64);
    let rejections = RejectionLog { since: AtomicU64::new(0), last: std::sync::Mutex::new(None) };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: not the listener's
                    // fault; wait a little instead of spinning.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.rejected.inc();
            rejections.note(limits.max_connections);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (builder, metrics, stop) = (builder.clone(), metrics.clone(), stop_rx.clone());
        let (router, tls, handshake_timeout) = (router.clone(), tls.clone(), limits.header_timeout);
        metrics.open.inc();
        tokio::spawn(async move {
            match tls {
                None => {
                    let service = router.map_request(move |mut req: Request<Incoming>| {
                        req.extensions_mut().insert(PeerAddr(peer));
                        req
                    });
                    serve_connection(&builder, stream, TowerToHyperService::new(service), stop, peer).await
                }
                Some(acceptor) => match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let certificates = PeerCertificates::new(stream.get_ref().1.peer_certificates().unwrap_or_default().to_vec());
                        let service = router.map_request(move |mut req: Request<Incoming>| {
                            req.extensions_mut().insert(certificates.clone());
                            req.extensions_mut().insert(PeerAddr(peer));
                            req
                        });
                        serve_connection(&builder, stream, TowerToHyperService::new(service), stop, peer).await
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%peer, "TLS handshake timed out"),
                },
            }
            metrics.open.dec();
            drop(permit);
        });
    }
    stop_tx.send_replace(true);
    drop(listener);
    // Every connection task holds a permit: all of them back means every connection is closed.
    // A client that keeps a response open past the stop does not hold the process up for long.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all)).await.is_err() {
        warn!(open = limits.max_connections - permits.available_permits(), "connections still open at shutdown are dropped");
    }
    Ok(())
}

/// Serves one connection's requests until it ends, or until `stop` asks it to finish gracefully.
async fn serve_connection<I, S>(
    builder: &hyper::server::conn::http1::Builder,
    io: I,
    service: S,
    mut stop: watch::Receiver<bool>,
    peer: std::net::SocketAddr,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming> + Send,
    S::Future: Send + 'static,
    S::ResBody: Send + 'static,
    <S::ResBody as hyper::body::Body>::Data: Send,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = %e, "connection ended with an error");
    }
}
