//! `shepherd agent` and the local agent of `shepherd standalone`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use axum::body::Body;
use clap::{Args, ValueEnum};
use shepherd_agent::{AgentConfig, LogQuery, PodLogs, PodNetworkMode, RuntimeKind, SimulatedBehaviour};
use shepherd_api::ApiError;
use shepherd_apiserver::LogSource;
use shepherd_runtime::TriggerMode;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RuntimeArg {
    /// Host processes, in their own namespaces and cgroups when run as root.
    Process,
    /// Containers from OCI images on runc, in pod sandboxes (needs root and runc).
    Oci,
    /// No processes: pods become Running after --simulated-ready-ms.
    Simulated,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PodNetworkArg {
    /// Pods share the node's network namespace and report the node's address.
    Host,
    /// Each pod gets its own network namespace and an address from the node's podCIDR, on a
    /// bridge (`shep0`), and Services reach their ready endpoints through the nftables table
    /// `ip shepherd` (needs nft); the agent must run in a network namespace of its own.
    Bridge,
}

/// The node agent's settings, shared by `shepherd agent` and `standalone`.
#[derive(Args, Clone, Debug)]
pub struct AgentArgs {
    /// Node name (default: this host's name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// The node's address (its InternalIP); also every pod's IP with `--pod-network host`.
    #[arg(long, default_value = "127.0.0.1")]
    pub node_ip: String,
    /// The container runtime (default: process for `agent`; for `standalone`, oci where runc can
    /// run containers here, else process).
    #[arg(long, value_enum)]
    pub runtime: Option<RuntimeArg>,
    /// The runc binary of the oci runtime.
    #[arg(long, default_value = shepherd_agent::DEFAULT_RUNC)]
    pub runc: PathBuf,
    /// A registry (HOST:PORT) to pull from over plain http; repeatable. Loopback registries
    /// always are.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    pub insecure_registries: Vec<String>,
    /// Registry mirrors, credentials and TLS in k3s's `registries.yaml` shape (mirrors of
    /// docker.io and others tried in order before the registry itself); default
    /// `<data-dir>/registries.yaml` when it exists.
    #[arg(long, value_name = "FILE")]
    pub registries: Option<PathBuf>,
    /// Seconds between lease renewals.
    #[arg(long, default_value_t = 10.0)]
    pub lease_seconds: f64,
    /// Restart back-off: first delay in seconds (doubling to --restart-backoff-max-seconds).
    #[arg(long, default_value_t = 10.0)]
    pub restart_backoff_seconds: f64,
    #[arg(long, default_value_t = 300.0)]
    pub restart_backoff_max_seconds: f64,
    /// Simulated runtime: milliseconds from start to Running and Ready.
    #[arg(long, default_value_t = 100)]
    pub simulated_ready_ms: u64,
    /// Simulated runtime: fraction (0..1) of container starts that fail.
    #[arg(long, default_value_t = 0.0)]
    pub simulated_fail_fraction: f64,
    /// Pods the agent reconciles at once, per node: an agent simulating many nodes works as many
    /// separate agents would, up to 64 pods at once in all.
    #[arg(long, default_value_t = 4)]
    pub agent_workers: usize,
    /// The agent's trigger mode for its pods (hybrid, anti-entropy, level or edge). Not
    /// anti-entropy by default: each node's digest check has the API server read every pod to
    /// apply the node's field selector, which a cluster of many nodes cannot afford.
    #[arg(long, default_value = "hybrid")]
    pub agent_mode: TriggerMode,
    /// Where the agent serves exec, attach and port-forward for the API server (the kubelet's
    /// 10250); port 0 picks a free port. The port is published in the Node's status.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub streaming_address: std::net::SocketAddr,
    /// The secret the API server presents to the streaming endpoint (the same value as the
    /// server's --node-streaming-token). `shepherd agent` without it serves no streaming endpoint;
    /// standalone generates one.
    #[arg(long, env = "SHEPHERD_STREAMING_TOKEN", hide_env_values = true)]
    pub streaming_token: Option<String>,
    /// Pods' network: `bridge` (a namespace and an address per pod, Services and cluster DNS)
    /// or `host` (the node's). Default: host for `agent`; for `standalone`, bridge where it can be
    /// built (root, nftables), host otherwise.
    #[arg(long, value_enum)]
    pub pod_network: Option<PodNetworkArg>,
    /// The cluster DNS address pods' /etc/resolv.conf names (kubelet's --cluster-dns), for pods
    /// of dnsPolicy ClusterFirst off the host network; repeatable. Unset: pods use the node's.
    #[arg(long = "cluster-dns", value_name = "IP")]
    pub cluster_dns: Vec<std::net::IpAddr>,
}

/// A random secret for the streaming endpoint of standalone's own agent.
pub fn random_token() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for a token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

impl AgentArgs {
    /// The runtime `standalone` uses when none is named: oci where runc can run containers here
    /// (root, runc present and working), process otherwise; with the line to print about it.
    pub fn choose_standalone_runtime(&mut self) -> Option<String> {
        if self.runtime.is_some() {
            return None;
        }
        Some(match shepherd_agent::oci_unavailable(&self.runc) {
            None => {
                self.runtime = Some(RuntimeArg::Oci);
                format!(
                    "runtime: oci (container images on runc, {}); --runtime process runs host processes instead",
                    self.runc.display()
                )
            }
            Some(why) => {
                self.runtime = Some(RuntimeArg::Process);
                format!("runtime: process (host processes); images other than `minimal` need the oci runtime on runc ({why})")
            }
        })
    }

    /// The pod network `standalone` uses when none is named (after the runtime is chosen): the
    /// bridge where pods run as processes or containers and this process may build it (root,
    /// nftables in the kernel); else the host's, with the reason.
    pub fn choose_standalone_pod_network(&mut self) -> Option<String> {
        if self.pod_network.is_some() {
            return None;
        }
        let why = if matches!(self.runtime, Some(RuntimeArg::Simulated)) {
            Some("simulated pods have no network".to_string())
        // SAFETY: geteuid has no preconditions.
        } else if unsafe { libc::geteuid() } != 0 {
            Some("it needs root".to_string())
        } else {
            match std::process::Command::new("nft").args(["list", "tables"]).output() {
                Ok(out) if out.status.success() => None,
                Ok(out) => Some(format!("nft cannot list tables: {}", String::from_utf8_lossy(&out.stderr).trim())),
                Err(e) => Some(format!("nft cannot run ({e}); install nftables")),
            }
        };
        self.pod_network = Some(if why.is_some() { PodNetworkArg::Host } else { PodNetworkArg::Bridge });
        why
    }

    pub fn config(&self, data_dir: &Path) -> anyhow::Result<AgentConfig> {
        let name = self.node_name.clone().unwrap_or_else(hostname);
        let mut config = AgentConfig::new(name, PathBuf::from(data_dir));
        config.node_ip = self.node_ip.clone();
        config.runc = self.runc.clone();
        config.insecure_registries = self.insecure_registries.clone();
        config.registries_file = self.registries.clone();
        config.runtime = match self.runtime.unwrap_or(RuntimeArg::Process) {
            RuntimeArg::Process => RuntimeKind::Process,
            RuntimeArg::Oci => RuntimeKind::Oci,
            RuntimeArg::Simulated => {
                anyhow::ensure!((0.0..=1.0).contains(&self.simulated_fail_fraction), "--simulated-fail-fraction must be between 0 and 1");
                RuntimeKind::Simulated(SimulatedBehaviour {
                    ready_delay: Duration::from_millis(self.simulated_ready_ms),
                    fail_fraction: self.simulated_fail_fraction,
                })
            }
        };
        let secs = |s: f64, flag: &str| -> anyhow::Result<Duration> {
            anyhow::ensure!(s > 0.0 && s.is_finite(), "{flag} must be a positive number of seconds");
            Ok(Duration::from_secs_f64(s))
        };
        config.lease_interval = secs(self.lease_seconds, "--lease-seconds")?;
        config.restart_backoff_initial = secs(self.restart_backoff_seconds, "--restart-backoff-seconds")?;
        config.restart_backoff_max = secs(self.restart_backoff_max_seconds, "--restart-backoff-max-seconds")?;
        config.workers = self.agent_workers.max(1);
        config.mode = self.agent_mode;
        config.pod_network = match self.pod_network.unwrap_or(PodNetworkArg::Host) {
            PodNetworkArg::Host => PodNetworkMode::Host,
            PodNetworkArg::Bridge => PodNetworkMode::Bridge,
        };
        config.streaming = self
            .streaming_token
            .as_ref()
            .map(|token| shepherd_agent::StreamingConfig { address: self.streaming_address, token: token.clone() });
        // The domain is the server's --cluster-domain in standalone, the agent's own flag otherwise.
        config.cluster_dns = (!self.cluster_dns.is_empty())
            .then(|| shepherd_agent::ClusterDns { nameservers: self.cluster_dns.clone(), domain: "cluster.local".into() });
        Ok(config)
    }
}

/// Serves `pods/{name}/log` from the local agent's log files.
pub struct AgentLogs(pub PodLogs);

#[async_trait::async_trait]
impl LogSource for AgentLogs {
    async fn logs(&self, namespace: &str, pod: &str, query: &HashMap<String, String>) -> Result<Body, ApiError> {
        let q = LogQuery::from_query(query)?;
        let stream = self.0.logs(namespace, pod, &q).await?;
        Ok(Body::from_stream(stream))
    }
}

/// The data directory of the agent inside a daemon's data directory.
pub fn agent_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("agent")
}

pub fn context(e: shepherd_agent::AgentError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

pub fn ensure_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}
