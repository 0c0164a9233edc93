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
    /// Serve the built-in OCI registry on this address (default 127.0.0.1:5000; when that port
    /// is taken, standalone says so and starts without one).
    #[arg(long, value_name = "ADDR")]
    registry_listen: Option<SocketAddr>,
    /// Start no registry.
    #[arg(long, conflicts_with = "registry_listen")]
    no_registry: bool,
    /// The registry's data directory; default: `registry` under --data-dir.
    #[arg(long, value_name = "DIR")]
    registry_data_dir: Option<PathBuf>,
    /// Push the busybox test image (built from the host's /bin/busybox) into that registry as
    /// REPOSITORY:TAG at start, e.g. `--registry-test-image busybox:1`; may be given more than once.
    #[arg(long, value_name = "REPOSITORY:TAG", conflicts_with = "no_registry")]
    registry_test_image: Vec<String>,
}

/// Where standalone's registry listens unless told otherwise.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 5000);

/// What became of standalone's registry, for the lines it prints at start.
pub enum Beside {
    Serving(SocketAddr),
    /// The default address was taken: none was started.
    PortTaken(SocketAddr),
    Off,
}

/// Starts standalone's registry (unless `--no-registry`); it serves until the process stops. An
/// address given with `--registry-listen` must be free; the default one may be taken (another
/// registry on the machine), and then none is started.
pub async fn start_beside(args: &BesideArgs, server_data_dir: &Path) -> anyhow::Result<Beside> {
    if args.no_registry {
        return Ok(Beside::Off);
    }
    let (listen, explicit) = match args.registry_listen {
        Some(l) => (l, true),
        None => (DEFAULT_LISTEN, false),
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) if !explicit && e.kind() == std::io::ErrorKind::AddrInUse => return Ok(Beside::PortTaken(listen)),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("registry: listening on {listen}"))),
    };
    let data_dir = args.registry_data_dir.clone().unwrap_or_else(|| server_data_dir.join("registry"));
    crate::private_dir::secure(&data_dir)?;
    let registry = Registry::open(&data_dir)
        .with_context(|| format!("opening the registry's data directory {}", data_dir.display()))?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = serve(listener, registry).await {
            tracing::error!(%error, "the registry stopped");
        }
    });
    push_test_images(address, &args.registry_test_image).await?;
    tracing::info!(address = %format!("http://{address}"), data_dir = %data_dir.display(), "registry serving");
    Ok(Beside::Serving(address))
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
