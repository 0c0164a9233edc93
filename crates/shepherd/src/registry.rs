//! `shepherd registry`: an OCI distribution registry over a data directory.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
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

pub async fn run(args: RegistryArgs) -> anyhow::Result<()> {
    crate::private_dir::secure(&args.data_dir)?;
    let registry = Registry::open(&args.data_dir)
        .with_context(|| format!("opening the registry's data directory {}", args.data_dir.display()))?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(shepherd_registry::serve(listener, registry, crate::shutdown_signal()));
    for reference in &args.test_image {
        let (repository, tag) =
            reference.rsplit_once(':').with_context(|| format!("--test-image {reference}: expected REPOSITORY:TAG"))?;
        let image = ImageBuilder::busybox()?.build()?;
        image.push(&format!("http://{address}"), repository, tag).await?;
        tracing::info!(%repository, %tag, digest = %image.manifest_digest, "pushed the busybox test image");
    }
    println!("registry serving on http://{address}");
    server.await.context("registry task")?.context("serving the registry")
}
