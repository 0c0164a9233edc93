//! The Shepherd daemon: `shepherd server`, `shepherd standalone`.

mod control_plane;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use control_plane::ControllerArgs;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_runtime::{Client, Manager};
use shepherd_store::{HistoryLimits, LocalStore, Store};

#[derive(Parser)]
#[command(name = "shepherd", version, about = "A small container orchestrator modelled on Kubernetes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server over a durable store.
    Server(ServerArgs),
    /// Run everything in one process: API server, controllers, scheduler and a local node.
    Standalone(ServerArgs),
}

#[derive(Args, Clone)]
struct ServerArgs {
    /// Directory for the store and other state; created if absent.
    #[arg(long, env = "SHEPHERD_DATA_DIR", default_value = "shepherd-data")]
    data_dir: PathBuf,
    /// Address to serve the API on.
    #[arg(long, env = "SHEPHERD_LISTEN", default_value = "127.0.0.1:9876")]
    listen: SocketAddr,
    /// Require this bearer token on every request.
    #[arg(long, env = "SHEPHERD_TOKEN")]
    token: Option<String>,
    /// Keep an in-memory store only (nothing written to disk).
    #[arg(long)]
    in_memory: bool,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 3 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Watch history kept for clients to resume from, in events.
    #[arg(long, default_value_t = 100_000)]
    history_events: usize,
    /// Watch history kept for clients to resume from, in seconds.
    #[arg(long, default_value_t = 900)]
    history_seconds: u64,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 10)]
    bookmark_seconds: u64,
    #[command(flatten)]
    controllers: ControllerArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Server(args) => run_server(args, false).await,
            Command::Standalone(args) => run_server(args, true).await,
        }
    })
}

fn open_store(args: &ServerArgs) -> anyhow::Result<Arc<dyn Store>> {
    let limits = HistoryLimits {
        max_events: args.history_events,
        max_age: Duration::from_secs(args.history_seconds),
        ..HistoryLimits::default()
    };
    if args.in_memory {
        return Ok(Arc::new(LocalStore::in_memory(limits)));
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data directory {}", args.data_dir.display()))?;
    let path = args.data_dir.join("store.redb");
    let store = LocalStore::open_redb(&path, limits).with_context(|| format!("opening store {}", path.display()))?;
    Ok(Arc::new(store))
}

async fn run_server(args: ServerArgs, standalone: bool) -> anyhow::Result<()> {
    let store = open_store(&args)?;
    let config = HttpConfig {
        max_body_bytes: args.max_body_bytes,
        token: args.token.clone(),
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
    };
    let server = ApiServer::new(store.clone(), config).await.map_err(|e| anyhow::anyhow!("starting API server: {e}"))?;
    let client: Arc<dyn Client> = Arc::new(server.client());
    let manager = Arc::new(Manager::new(client.clone()));
    let enabled = args.controllers.install(client.clone(), &manager)?;
    if let Ok(mut registry) = server.registry().lock() {
        manager.metrics().register(&mut registry);
    }
    let debug_manager = manager.clone();
    let router = server.router().route(
        "/debug/controllers",
        axum::routing::get(move || {
            let m = debug_manager.clone();
            async move { axum::Json(m.snapshot().to_json()) }
        }),
    );

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let mode = if standalone { "standalone" } else { "server" };
    // The first line on stdout is the address, so scripts and tests can read it.
    println!("shepherd {mode} listening on http://{addr}");
    tracing::info!(%addr, data_dir = %args.data_dir.display(), revision = store.revision(), controllers = ?enabled, "shepherd {mode} ready");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let controllers = {
        let manager = manager.clone();
        let stop = stopped(stop_rx.clone());
        tokio::spawn(async move { manager.run(stop).await })
    };
    let serving = axum::serve(listener, router).with_graceful_shutdown(stopped(stop_rx.clone()));
    let serving = tokio::spawn(async move { serving.await });
    shutdown_signal().await;
    stop_tx.send_replace(true);
    let _ = controllers.await;
    serving.await??;
    tracing::info!("shut down cleanly");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
