//! `shepherd controller-manager` and `shepherd scheduler`: the controllers, or the scheduler, as a
//! process of their own against any API server, one of several candidates of which the holder of
//! a Lease acts.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use shepherd_runtime::leader::{LeaderElectionConfig, LeaderElector};
use shepherd_runtime::{Client, Manager};

use crate::control_plane::{CONTROLLERS, ControllerArgs};
use crate::node_agent;

/// Which component a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ControllerManager,
    Scheduler,
}

impl Role {
    fn command(self) -> &'static str {
        match self {
            Role::ControllerManager => "controller-manager",
            Role::Scheduler => "scheduler",
        }
    }

    /// The field manager its writes are recorded under, as the same component's in `standalone`.
    fn field_manager(self) -> &'static str {
        match self {
            Role::ControllerManager => shepherd_apiserver::CONTROLLER_MANAGER_FIELD_MANAGER,
            Role::Scheduler => shepherd_apiserver::SCHEDULER_FIELD_MANAGER,
        }
    }

    /// Kubernetes' own Lease names, so tools that look for them find them.
    fn lease(self) -> &'static str {
        match self {
            Role::ControllerManager => "kube-controller-manager",
            Role::Scheduler => "kube-scheduler",
        }
    }
}

#[derive(Args, Clone)]
pub struct ElectedArgs {
    /// The API server (any of several sharing one store; ignored with --kubeconfig).
    #[arg(long, env = "SHEPHERD_API", default_value = "https://127.0.0.1:9876")]
    server: String,
    /// Bearer token for the API server.
    #[arg(long, env = "SHEPHERD_TOKEN")]
    token: Option<String>,
    /// A kubeconfig naming the server, its CA and this component's credentials (not read from
    /// $KUBECONFIG, as for the node agent).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<std::path::PathBuf>,
    /// The CA certificate (PEM) that signed the server's certificate (the server's
    /// <data-dir>/pki/ca.crt).
    #[arg(long, value_name = "FILE")]
    certificate_authority: Option<std::path::PathBuf>,
    #[command(flatten)]
    election: ElectionArgs,
    #[command(flatten)]
    controllers: ControllerArgs,
}

/// kube-controller-manager's and kube-scheduler's leader election flags, with their defaults.
#[derive(Args, Clone)]
pub struct ElectionArgs {
    /// Take part in leader election and act only while holding the Lease; `false` acts at once
    /// (only safe when no other copy runs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// How long a Lease not renewed keeps others from taking it.
    #[arg(long, default_value = "15s", value_parser = shepherd_api::duration::parse)]
    leader_elect_lease_duration: Duration,
    /// How long the holder keeps trying to renew before it stops acting; shorter than the lease
    /// duration.
    #[arg(long, default_value = "10s", value_parser = shepherd_api::duration::parse)]
    leader_elect_renew_deadline: Duration,
    /// Between attempts to take or renew the Lease.
    #[arg(long, default_value = "2s", value_parser = shepherd_api::duration::parse)]
    leader_elect_retry_period: Duration,
    /// The Lease's name (default: kube-controller-manager or kube-scheduler).
    #[arg(long)]
    leader_elect_resource_name: Option<String>,
    #[arg(long, default_value = "kube-system")]
    leader_elect_resource_namespace: String,
}

pub async fn run(role: Role, mut args: ElectedArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let controllers = &mut args.controllers.controllers;
    match role {
        // The scheduler has its own process and Lease; "all" here means every other controller.
        Role::ControllerManager if controllers.trim() == "all" => {
            *controllers = CONTROLLERS.iter().filter(|c| **c != "scheduler").copied().collect::<Vec<_>>().join(",");
        }
        Role::ControllerManager => {}
        Role::Scheduler => *controllers = "scheduler".to_string(),
    }
    let e = &args.election;
    let identity = format!("{}_{}", node_agent::hostname(), &node_agent::random_token()?[..12]);
    let config = LeaderElectionConfig {
        namespace: e.leader_elect_resource_namespace.clone(),
        name: e.leader_elect_resource_name.clone().unwrap_or_else(|| role.lease().to_string()),
        identity: identity.clone(),
        lease_duration: e.leader_elect_lease_duration,
        renew_deadline: e.leader_elect_renew_deadline,
        retry_period: e.leader_elect_retry_period,
    };
    if let Err(why) = config.check() {
        bail!("leader election: {why}");
    }
    let kube_config = crate::credentials::agent_client_config(
        &args.server,
        args.kubeconfig.as_deref(),
        args.token.as_deref(),
        args.certificate_authority.as_deref(),
    )
    .await?;
    let server = kube_config.cluster_url.to_string();
    if let Some(roots) = &kube_config.root_cert {
        args.controllers.root_ca_pem = Some(crate::service_accounts::pem_bundle(roots));
    }
    let kube = kube::Client::try_from(kube_config).map_err(|e| anyhow::anyhow!("building a client for {server}: {e}"))?;
    let client: Arc<dyn Client> = Arc::new(shepherd_client::RemoteClient::new(kube).named(role.field_manager()));
    let elector = LeaderElector::new(client.clone(), config);
    // The first line on stdout names this candidate, for scripts and tests.
    println!("shepherd {} candidate {identity} against {server}", role.command());
    tokio::pin!(shutdown);
    if args.election.leader_elect {
        tokio::select! {
            () = elector.acquire() => {}
            () = &mut shutdown => return Ok(()),
        }
    }
    let writes = if args.election.leader_elect { elector.fence(client) } else { client };
    let manager = Arc::new(Manager::new(writes.clone()));
    let enabled = args.controllers.install(writes.clone(), writes, &manager, None).context("starting the controllers")?;
    tracing::info!(identity, controllers = ?enabled, "leading: {} running", role.command());
    eprintln!("shepherd {} {identity} is leading", role.command());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let running = {
        let manager = manager.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move { manager.run(async move { let _ = stop.wait_for(|s| *s).await; }).await })
    };
    let held = async {
        if args.election.leader_elect {
            elector.hold().await
        } else {
            std::future::pending().await
        }
    };
    tokio::select! {
        () = held => {
            // As kube-controller-manager: a process that lost its Lease exits, and whatever
            // supervises it starts a fresh candidate. Nothing it had in flight may write now.
            bail!(
                "lost the lease {}/{}: stopped acting ({} writes refused after the renew deadline)",
                elector.config().namespace,
                elector.config().name,
                elector.refused_writes()
            );
        }
        () = &mut shutdown => {}
    }
    stop_tx.send_replace(true);
    let _ = running.await;
    if args.election.leader_elect {
        elector.release().await;
    }
    Ok(())
}
