//! `greeting-operator`: installs the Greeting CRD and reconciles Greetings until SIGINT or SIGTERM.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Reconciles Greeting custom objects into Deployments")]
struct Args {
    /// The API server, e.g. http://127.0.0.1:9876; without it, the kubeconfig (or in-cluster config).
    #[arg(long)]
    server: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let config = match args.server {
        Some(url) => kube::Config::new(url.parse().with_context(|| format!("--server {url:?} is not a URL"))?),
        None => kube::Config::infer().await.context("no --server and no usable kubeconfig")?,
    };
    let client = kube::Client::try_from(config).context("building the API client")?;
    greeting_operator::install_crd(client.clone(), Duration::from_secs(30)).await?;
    tracing::info!("CustomResourceDefinition installed; reconciling Greetings");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    greeting_operator::run(client, async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    })
    .await;
    Ok(())
}
