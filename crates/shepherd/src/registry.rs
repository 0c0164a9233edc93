//! `shepherd registry`: an OCI distribution registry over a data directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use shepherd_apiserver::{ConnectionLimits, ConnectionMetrics};
use shepherd_registry::Registry;
use shepherd_registry::testimage::ImageBuilder;

#[derive(Args, Clone)]
pub struct RegistryArgs {
    /// Directory for blobs, manifests and tags; created if absent.
    #[arg(long, env = "SHEPHERD_REGISTRY_DATA_DIR", default_value = "shepherd-registry")]
    data_dir: PathBuf,
    /// Address to serve the registry on (plain HTTP).
    #[arg(long, env = "SHEPHERD_REGISTRY_LISTEN", default_value = "127.0.0.1:5000")]
    listen: SocketAddr,
    /// Push the busybox test image (built from the host's /bin/busybox) as REPOSITORY:TAG once
    /// serving, e.g. `--test-image busybox:1`; may be given more than once.
    #[arg(long, value_name = "REPOSITORY:TAG")]
    test_image: Vec<String>,
}

/// `shepherd standalone`'s flags for a registry in the same process.
#[derive(Args, Clone)]
pub struct BesideArgs {
    /// Also serve an OCI registry on this address (e.g. 127.0.0.1:5000); off when absent.
    #[arg(long, value_name = "ADDR")]
    registry_listen: Option<SocketAddr>,
    /// The registry's data directory; default: `registry` under --data-dir.
    #[arg(long, value_name = "DIR")]
    registry_data_dir: Option<PathBuf>,
    /// Push the busybox test image (built from the host's /bin/busybox) into that registry as
    /// REPOSITORY:TAG at start, e.g. `--registry-test-image busybox:1`; may be given more than once.
    #[arg(long, value_name = "REPOSITORY:TAG", requires = "registry_listen")]
    registry_test_image: Vec<String>,
}

/// Starts the registry `shepherd standalone` was asked for, if any; it serves until the process stops.
pub async fn start_beside(args: &BesideArgs, server_data_dir: &Path) -> anyhow::Result<()> {
    let Some(listen) = args.registry_listen else { return Ok(()) };
    let data_dir = args.registry_data_dir.clone().unwrap_or_else(|| server_data_dir.join("registry"));
    crate::private_dir::secure(&data_dir)?;
    let registry = Registry::open(&data_dir)
        .with_context(|| format!("opening the registry's data directory {}", data_dir.display()))?;
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("registry: listening on {listen}"))?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = serve(listener, registry).await {
            tracing::error!(%error, "the registry stopped");
        }
    });
    push_test_images(address, &args.registry_test_image).await?;
    tracing::info!(address = %format!("http://{address}"), data_dir = %data_dir.display(), "registry serving");
    Ok(())
}

/// Pushes the busybox test image as each `REPOSITORY:TAG` of `references` to the registry serving at `address`.
async fn push_test_images(address: SocketAddr, references: &[String]) -> anyhow::Result<()> {
    for reference in references {
        let (repository, tag) =
            reference.rsplit_once(':').with_context(|| format!("test image {reference}: expected REPOSITORY:TAG"))?;
        let image = ImageBuilder::busybox()?.build()?;
        image.push(&format!("http://{address}"), repository, tag).await?;
        tracing::info!(%repository, %tag, digest = %image.manifest_digest, "pushed the busybox test image");
    }
    Ok(())
}

pub async fn run(args: RegistryArgs) -> anyhow::Result<()> {
    crate::private_dir::secure(&args.data_dir)?;
    let registry = Registry::open(&args.data_dir)
        .with_context(|| format!("opening the registry's data directory {}", args.data_dir.display()))?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(serve(listener, registry));
    push_test_images(address, &args.test_image).await?;
    println!("registry serving on http://{address}");
    server.await.context("registry task")?.context("serving the registry")
}

/// Serves with the API server's connection handling (a request-head time-out, a connection cap
/// from the open-file limit, a bounded grace period on stop) until SIGTERM or SIGINT.
async fn serve(listener: tokio::net::TcpListener, registry: std::sync::Arc<Registry>) -> std::io::Result<()> {
    let limits = ConnectionLimits {
        header_timeout: Duration::from_secs(30),
        max_connections: ConnectionLimits::cap_for_open_files(crate::raise_open_file_limit()),
    };
    let router = registry.router();
    shepherd_apiserver::serve(listener, router, limits, ConnectionMetrics::default(), crate::shutdown_signal()).await
}
