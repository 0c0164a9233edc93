//! Reaching etcd at start: a server whose etcd is not there yet listens anyway, answers `/readyz`
//! with the store check failed (and `/livez` ok), and retries until etcd answers.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use shepherd_apiserver::{ConnectionLimits, ConnectionMetrics};
use shepherd_store::{EtcdConfig, EtcdTls, Store, StoreError};

use crate::ServerArgs;
use crate::credentials::{self, Secured};

/// What the server bound (and printed) while it waited, for the API to be served on.
pub struct Bound {
    pub listener: std::net::TcpListener,
    pub secured: Option<Secured>,
}

/// Reads --etcd-cafile, --etcd-certfile and --etcd-keyfile.
pub fn tls(args: &ServerArgs) -> anyhow::Result<Option<EtcdTls>> {
    let Some(ca) = &args.etcd_cafile else { return Ok(None) };
    let read = |path: &std::path::Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let identity = match (&args.etcd_certfile, &args.etcd_keyfile) {
        (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
        _ => None,
    };
    Ok(Some(EtcdTls { ca_pem: read(ca)?, identity }))
}

/// Connects to etcd. When it cannot be reached at first, binds the API's address, prints it as a
/// ready server would, serves readiness as failed, and tries again every second until it can.
pub async fn connect(
    args: &ServerArgs,
    config: EtcdConfig,
    mode: &str,
) -> anyhow::Result<(Arc<dyn Store>, Option<Bound>)> {
    let endpoints = config.endpoints.join(",");
    let mut once = config;
    // One attempt at a time: each failure is reported to /readyz before the next.
    once.connect_timeout = Duration::ZERO;
    let first = match shepherd_store::connect_etcd(once.clone()).await {
        Ok(store) => return Ok((store, None)),
        Err(StoreError::Unavailable(e)) => e,
        Err(e) => anyhow::bail!("cannot open the etcd store: {e}"),
    };
    tracing::error!(endpoints, error = %first, "cannot reach etcd; /readyz reports not ready until it can, retrying every second");
    let status = Arc::new(RwLock::new(first));

    let listener = std::net::TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    listener.set_nonblocking(true)?;
    let serving = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
    let secured = match args.tls.insecure_loopback {
        true => None,
        false => Some(credentials::secure(&args.tls, &args.data_dir, args.listen, args.token.as_deref())?),
    };
    let addr = listener.local_addr()?;
    let scheme = if secured.is_some() { "https" } else { "http" };
    println!("shepherd {mode} listening on {scheme}://{addr}");

    let router = router(status.clone());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let stop = async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    };
    let limits = ConnectionLimits { header_timeout: Duration::from_secs(10), max_connections: 64 };
    let metrics = ConnectionMetrics::default();
    let placeholder = match &secured {
        Some(s) => tokio::spawn(shepherd_apiserver::serve_tls(serving, router, limits, metrics, s.tls.clone(), stop)),
        None => tokio::spawn(shepherd_apiserver::serve(serving, router, limits, metrics, stop)),
    };

    let mut attempts = 1u64;
    let store = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        attempts += 1;
        match shepherd_store::connect_etcd(once.clone()).await {
            Ok(store) => break store,
            Err(StoreError::Unavailable(e)) => {
                // Every attempt is on /readyz; the log hears of every tenth.
                if attempts.is_multiple_of(10) {
                    tracing::warn!(endpoints, attempts, error = %e, "cannot reach etcd yet; retrying");
                }
                if let Ok(mut s) = status.write() {
                    *s = e;
                }
            }
            Err(e) => anyhow::bail!("cannot open the etcd store: {e}"),
        }
    };
    tracing::info!(endpoints, attempts, "etcd reached; starting the API");
    stop_tx.send_replace(true);
    let _ = placeholder.await;
    Ok((store, Some(Bound { listener, secured })))
}

/// `/livez` ok, `/readyz` and `/healthz` failed naming the store, anything else 503.
fn router(status: Arc<RwLock<String>>) -> axum::Router {
    let readiness = move || {
        let status = status.clone();
        async move {
            let error = status.read().map(|s| s.clone()).unwrap_or_default();
            let body = format!("[+]ping ok\n[-]store failed: {error}\nreadyz check failed\n");
            let mut r = (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            r
        }
    };
    axum::Router::new()
        .route("/livez", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(readiness.clone()))
        .route("/healthz", axum::routing::get(readiness))
        .fallback(|| async { unavailable() })
}

fn unavailable() -> Response {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the API server cannot reach its etcd yet", "reason": "ServiceUnavailable", "code": 503,
    });
    let mut r = (StatusCode::SERVICE_UNAVAILABLE, status.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
