//! Shepherd's node agent: registers a node, heartbeats through its Lease, and runs the pods bound
//! to it through a runtime (`process`: host processes; `oci`: containers from images on runc;
//! `simulated`: no processes, many nodes per agent process for scale tests).
//!
//! ```ignore
//! let agent = Agent::new(client, AgentConfig::new("node-1", "/var/lib/shepherd/agent")).await?;
//! let logs = agent.logs();            // serve GET .../pods/{name}/log from this
//! agent.run(ctrl_c()).await?;
//! ```

mod backoff;
mod cgroup;
mod crilog;
mod dns;
mod envvars;
mod exec;
mod logs;
mod mountns;
mod network;
mod network_ipam;
mod node;
mod oci;
mod pods;
mod probe;
mod proxy;
mod pullsecrets;
mod process;
mod quantity;
mod runtime;
mod server;
mod simulated;
mod sources;
mod tokens;
mod spdy;
mod spdy_session;
mod streams;
mod usage;
mod volumes;
mod websocket;

pub use dns::ClusterDns;

use std::collections::HashMap;
use std::fs::{self, File};
use std::future::Future;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shepherd_api::{JsonPath, kinds};
use shepherd_runtime::{Action, Client, Controller, ListParams, Manager, Metrics, TriggerMode};
use tokio::sync::mpsc;
use tracing::info;

pub use logs::{LogQuery, LogStream, PodLogs};
pub use pods::{SIMULATE_EXIT_AFTER_MS_ANNOTATION, SIMULATE_FAIL_ANNOTATION};
pub use oci::DEFAULT_RUNC;
pub use network::BRIDGE as POD_BRIDGE;
pub use process::MINIMAL_IMAGE;
pub use server::StreamingConfig;
pub use simulated::SimulatedBehaviour;
pub use usage::{SIMULATED_CPU_ANNOTATION, SIMULATED_MEMORY_ANNOTATION};

/// Which runtime runs the containers.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeKind {
    /// Host processes, with namespaces and cgroups when running as root.
    Process,
    /// Containers from OCI images, run by runc in pod sandboxes (needs root).
    Oci,
    /// No processes: containers become Running after a delay (or fail).
    Simulated(SimulatedBehaviour),
}

/// Where pods' network comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodNetworkMode {
    /// Pods share the node's network namespace and report the node's address.
    #[default]
    Host,
    /// Each pod gets a network namespace, a veth pair into the node's bridge and an address from
    /// the node's podCIDR (`hostNetwork: true` pods keep the node's). The agent must run in a
    /// network namespace of its own.
    Bridge,
}

/// Settings of one agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The node's name (for simulated nodes: unused, see `Agent::simulated`).
    pub node_name: String,
    /// Container state and logs live here; it must survive agent restarts for re-adoption.
    pub data_dir: PathBuf,
    /// The node's InternalIP; also every pod's podIP and hostIP (containers share the host network).
    pub node_ip: String,
    pub runtime: RuntimeKind,
    /// How often the Lease is renewed and the Node checked.
    pub lease_interval: Duration,
    pub lease_duration_seconds: i64,
    /// Pods reconciled at once.
    pub workers: usize,
    /// The engine's trigger mode for pod events (anti-entropy: events plus digest checks).
    pub mode: TriggerMode,
    /// Restart back-off: first delay, doubling up to `restart_backoff_max`.
    pub restart_backoff_initial: Duration,
    pub restart_backoff_max: Duration,
    /// A container's log is rotated (one previous file kept) beyond this size.
    pub log_max_bytes: u64,
    /// `pids.max` of each container's cgroup, where the pids controller is available.
    pub pids_limit: Option<u64>,
    /// The runc binary of the oci runtime.
    pub runc: PathBuf,
    /// Registries (`HOST:PORT`) the oci runtime pulls from over plain http (loopback ones always are).
    pub insecure_registries: Vec<String>,
    /// Registry mirrors, credentials and TLS, as k3s's `registries.yaml` (a missing file is none).
    pub registries_file: Option<PathBuf>,
    /// Stop and remove every container when the agent stops (a node going away with its pods)
    /// instead of leaving them for the next agent to adopt.
    pub stop_containers_on_exit: bool,
    /// The streaming endpoint (exec, attach, port-forward); `None` serves none.
    pub streaming: Option<StreamingConfig>,
    /// Pods' network (simulated nodes always share the node's).
    pub pod_network: PodNetworkMode,
    /// The cluster DNS pods' resolv.conf names (kubelet's --cluster-dns); `None`: the node's.
    pub cluster_dns: Option<ClusterDns>,
    /// How often container and node usage is sampled and reported to the `metrics.k8s.io` API
    /// (the window of each CPU rate).
    pub metrics_interval: Duration,
    /// Where containers reach the API server (host, port): the `KUBERNETES_SERVICE_HOST`/`_PORT`
    /// variables every container gets, as kubelet gives them the `kubernetes` Service's address.
    pub kubernetes_service: Option<(String, u16)>,
    /// The Service range (the server's --service-cluster-ip-range): with a pod network, routed to
    /// the bridge so the node itself reaches ClusterIPs.
    pub service_cidr: Option<String>,
    /// Every pod address of the cluster (the server's --cluster-cidr): with a pod network, pods'
    /// traffic to anywhere else leaves masqueraded as the node.
    pub cluster_cidr: Option<String>,
}

impl AgentConfig {
    /// Defaults: process runtime, 127.0.0.1, lease renewed every 10 s for 40 s, back-off 10 s to
    /// 5 min, logs rotated at 10 MiB, 4 workers, anti-entropy mode (1 s checks, 10 minute re-list).
    pub fn new(node_name: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        AgentConfig {
            node_name: node_name.into(),
            data_dir: data_dir.into(),
            node_ip: "127.0.0.1".into(),
            runtime: RuntimeKind::Process,
            lease_interval: Duration::from_secs(10),
            lease_duration_seconds: 40,
            workers: 4,
            mode: TriggerMode::anti_entropy(),
            restart_backoff_initial: Duration::from_secs(10),
            restart_backoff_max: Duration::from_secs(300),
            log_max_bytes: 10 * 1024 * 1024,
            pids_limit: Some(4096),
            runc: PathBuf::from(oci::DEFAULT_RUNC),
            insecure_registries: Vec::new(),
            registries_file: None,
            stop_containers_on_exit: false,
            streaming: None,
            pod_network: PodNetworkMode::Host,
            cluster_dns: None,
            metrics_interval: Duration::from_secs(5),
            kubernetes_service: None,
            service_cidr: None,
            cluster_cidr: None,
        }
    }
}

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot use data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("data directory {0} is in use by another agent; stop it or choose another --data-dir")]
    Locked(PathBuf),
    #[error("the oci runtime cannot start: {0}")]
    Runtime(String),
    #[error("cannot listen on {address} for the streaming endpoint: {source}")]
    Listen { address: std::net::SocketAddr, source: std::io::Error },
    #[error("the pod network cannot start: {0}")]
    Network(String),
}

/// A node agent (or a set of simulated nodes), ready to run.
pub struct Agent {
    client: Arc<dyn Client>,
    config: AgentConfig,
    nodes: Vec<node::NodeIdentity>,
    manager: Manager,
    pods: Arc<pods::PodManager>,
    streaming: Option<(tokio::net::TcpListener, String)>,
    /// Pods' own networks (`PodNetworkMode::Bridge`).
    network: Option<Arc<network::PodNetwork>>,
    _lock: Option<File>,
}

fn lock_data_dir(dir: &Path) -> Result<File, AgentError> {
    let err = |source| AgentError::DataDir { path: dir.to_path_buf(), source };
    fs::create_dir_all(dir).map_err(err)?;
    let file = File::create(dir.join("agent.lock")).map_err(err)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(AgentError::Locked(dir.to_path_buf()));
    }
    Ok(file)
}

impl Agent {
    /// One node named `config.node_name` on this host. Takes over the containers an earlier run
    /// of an agent on the same data directory left running. Needs a Tokio runtime.
    pub async fn new(client: Arc<dyn Client>, config: AgentConfig) -> Result<Agent, AgentError> {
        let mut identity = node::NodeIdentity::of_host(&config.node_name, &config.node_ip, config.lease_duration_seconds);
        let streaming = match &config.streaming {
            Some(s) => {
                let listener = server::listen(s.address, &config.data_dir)
                    .await
                    .map_err(|source| AgentError::Listen { address: s.address, source })?;
                identity.streaming_port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
                Some((listener, s.token.clone()))
            }
            None => None,
        };
        let mut agent = Agent::build(client, config, vec![identity])?;
        agent.streaming = streaming;
        Ok(agent)
    }

    /// `count` simulated nodes named `{prefix}0`, `{prefix}1`, ... in this one agent, each with its
    /// own Node and Lease; one pod informer serves them all. `config.runtime` must be simulated
    /// (a process runtime is replaced by the default simulated behaviour).
    pub async fn simulated(client: Arc<dyn Client>, mut config: AgentConfig, count: usize, prefix: &str) -> Result<Agent, AgentError> {
        if config.runtime == RuntimeKind::Process {
            config.runtime = RuntimeKind::Simulated(SimulatedBehaviour::default());
        }
        let nodes = (0..count)
            .map(|i| node::NodeIdentity {
                name: format!("{prefix}{i}"),
                ip: format!("10.{}.{}.{}", 64 + (i >> 16) % 64, (i >> 8) & 255, i & 255),
                cpu: "8".into(),
                memory: "32Gi".into(),
                lease_duration_seconds: config.lease_duration_seconds,
                streaming_port: 0,
            })
            .collect();
        Agent::build(client, config, nodes)
    }

    fn build(client: Arc<dyn Client>, config: AgentConfig, nodes: Vec<node::NodeIdentity>) -> Result<Agent, AgentError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (runtime, lock): (Arc<dyn runtime::Runtime>, Option<File>) = match &config.runtime {
            RuntimeKind::Process => {
                let lock = lock_data_dir(&config.data_dir)?;
                let pc = process::ProcessConfig {
                    data_dir: config.data_dir.clone(),
                    log_max_bytes: config.log_max_bytes,
                    pids_limit: config.pids_limit,
                };
                (Arc::new(process::ProcessRuntime::new(pc, tx)), Some(lock))
            }
            RuntimeKind::Oci => {
                if let Some(why) = oci::unavailable(&config.runc) {
                    return Err(AgentError::Runtime(why));
                }
                let lock = lock_data_dir(&config.data_dir)?;
                let registries = match &config.registries_file {
                    Some(path) => shepherd_image::RegistriesConfig::load(path).map_err(AgentError::Runtime)?.unwrap_or_default(),
                    None => Default::default(),
                };
                let oc = oci::OciConfig {
                    registries,
                    data_dir: config.data_dir.clone(),
                    runc: config.runc.clone(),
                    node_ip: config.node_ip.clone(),
                    insecure_registries: config.insecure_registries.clone(),
                    log_max_bytes: config.log_max_bytes,
                    pids_limit: config.pids_limit,
                };
                let runtime = oci::OciRuntime::new(oc, tx)
                    .map_err(|source| AgentError::DataDir { path: config.data_dir.clone(), source })?;
                (Arc::new(runtime), Some(lock))
            }
            RuntimeKind::Simulated(b) => (Arc::new(simulated::SimulatedRuntime::new(*b, tx)), None),
        };
        let manager = Manager::new(client.clone());
        // Watch only the pods bound to our node(s), not every pod of the cluster: an agent standing
        // in for 1,000 of 5,000 nodes that watched every bound pod cached (and reconciled) five
        // times the pods it runs.
        let names = nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(",");
        let scope = match nodes.as_slice() {
            [one] => format!("spec.nodeName={}", one.name),
            _ => format!("spec.nodeName in ({names})"),
        };
        manager.informers().scope(&kinds::POD, ListParams::default().fields(scope));
        let cache = manager.informers().cache(&kinds::POD);
        let addresses: HashMap<String, String> = nodes.iter().map(|n| (n.name.clone(), n.ip.clone())).collect();
        let pc = pods::PodConfig { backoff_initial: config.restart_backoff_initial, backoff_max: config.restart_backoff_max };
        let sources = Arc::new(sources::Sources::new(client.clone()));
        // Runtimes that run real containers mount volumes; simulated ones have nothing to mount into.
        let mounts = matches!(config.runtime, RuntimeKind::Process | RuntimeKind::Oci);
        let volumes = mounts.then(|| {
            volumes::Volumes::new(&config.data_dir, sources.clone(), Arc::new(tokens::PodTokens::new(client.clone())))
        });
        let network = match (&config.pod_network, &config.runtime, nodes.as_slice()) {
            (PodNetworkMode::Bridge, RuntimeKind::Process | RuntimeKind::Oci, [node]) => Some(Arc::new(
                network::PodNetwork::new(&config.data_dir, &node.name, client.clone(), network::Ranges::parse(&config)?)
                    .map_err(|e| AgentError::Network(e.to_string()))?,
            )),
            _ => None,
        };
        // Each beat compares the node's status with a watch of the Node instead of reading it:
        // only its own Nodes, unless it routes to other nodes' pods (then it watches them all).
        if network.is_none() {
            let scope = match nodes.as_slice() {
                [one] => format!("metadata.name={}", one.name),
                _ => format!("metadata.name in ({names})"),
            };
            manager.informers().scope(&kinds::NODE, ListParams::default().fields(scope));
        }
        let inputs =
            pods::ConfigInputs {
            sources: sources.clone(),
            volumes,
            network: network.clone(),
            dns: config.cluster_dns.clone().unwrap_or_default(),
            kubernetes_service: config.kubernetes_service.clone(),
        };
        let pods = pods::PodManager::new(client.clone(), cache.clone(), addresses, runtime, pc, rx, inputs);
        // A changed ConfigMap or Secret re-syncs the pods that read it: waiting containers start,
        // volume files follow.
        {
            let (pods, cache) = (Arc::downgrade(&pods), cache.clone());
            sources.on_change(move |kind, ns, name| {
                let Some(manager) = pods.upgrade() else { return };
                for pod in cache.by_namespace(ns) {
                    if sources::references(&pod, kind, name) {
                        let pod_name = pod.at("/metadata/name").and_then(serde_json::Value::as_str).unwrap_or("");
                        manager.kick(&format!("{ns}/{pod_name}"));
                    }
                }
            });
        }
        // Objects no pod of this node names any more are no longer followed.
        {
            let (weak, cache) = (Arc::downgrade(&sources), cache.clone());
            manager.informers().informer(&kinds::POD).subscribe(move |change| {
                if let shepherd_runtime::Change::Deleted(pod) = change
                    && let Some(sources) = weak.upgrade()
                {
                    sources.release(pod, |ns| cache.by_namespace(ns));
                }
            });
        }
        Ok(Agent { client, config, nodes, manager, pods, streaming: None, network, _lock: lock })
    }

    /// Serves this agent's container logs (wire it into the API server's `LogSource`).
    pub fn logs(&self) -> PodLogs {
        PodLogs { managers: vec![Arc::downgrade(&self.pods)] }
    }

    /// The port of the streaming endpoint, when it serves one.
    pub fn streaming_port(&self) -> Option<u16> {
        self.streaming.as_ref().and_then(|(l, _)| l.local_addr().ok()).map(|a| a.port())
    }

    /// The agent's copy of the pods it follows (those bound to its nodes) and of its Nodes.
    pub fn caches(&self) -> (Arc<shepherd_runtime::Cache>, Arc<shepherd_runtime::Cache>) {
        (self.manager.informers().cache(&kinds::POD), self.manager.informers().cache(&kinds::NODE))
    }

    /// The names of the nodes this agent runs.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The agent's engine metrics (queue, reconcile, informer), to register in a registry.
    pub fn metrics(&self) -> &Metrics {
        self.manager.metrics()
    }

    /// The host pid of a running container's main process (`None` for simulated containers).
    pub fn container_pid(&self, namespace: &str, pod: &str, uid: &str, container: &str) -> Option<u32> {
        let id = runtime::ContainerId { pod_key: format!("{namespace}/{pod}"), pod_uid: uid.into(), name: container.into() };
        self.pods.runtime().pid(&id)
    }

    /// Runs until `shutdown` completes. Containers keep running afterwards (as they do when the
    /// agent is killed) and the next agent on the same data directory takes them over, unless
    /// `stop_containers_on_exit` is set.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        self.run_then(shutdown, Stopping::default()).await
    }

    /// As [`Agent::run`], with `stopping` for how the pods are stopped at the end (with
    /// `stop_containers_on_exit`).
    pub async fn run_then(self, shutdown: impl Future<Output = ()>, stopping: Stopping) -> Result<(), AgentError> {
        let Agent { client, config, nodes, manager, pods, streaming, network, _lock } = self;
        info!(nodes = nodes.len(), runtime = ?config.runtime, "node agent starting");
        let reconciler = pods.clone();
        let (trigger_tx, trigger_rx) = mpsc::unbounded_channel();
        pods.route_through(trigger_tx);
        manager.add(
            Controller::new("node-agent", &kinds::POD, move |key: String| {
                let pods = reconciler.clone();
                async move {
                    pods.reconcile(&key).await?;
                    Ok(Action::Done)
                }
            })
            .workers(config.workers)
            .mode(config.mode)
            .triggered_by(trigger_rx),
        );
        let mut background = tokio::task::JoinSet::new();
        if let Some((listener, token)) = streaming {
            background.spawn(server::serve(listener, vec![Arc::downgrade(&pods)], token));
        }
        // Simulated nodes report at metrics-server's default resolution (15 s) at the most often,
        // in lists of up to 100 nodes per request (see `usage::batches`).
        let (source, interval) = match config.runtime {
            RuntimeKind::Simulated(_) => (usage::Source::Synthetic, config.metrics_interval.max(Duration::from_secs(15))),
            RuntimeKind::Process | RuntimeKind::Oci => {
                (usage::Source::Measured(cgroup::Cgroups::detect()), config.metrics_interval)
            }
        };
        let node_names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        background.spawn(usage::report(client.clone(), pods.clone(), node_names, source, interval));
        let spread = config.lease_interval.as_millis().max(1) as u64;
        let count = nodes.len().max(1) as u64;
        let node_informer = manager.informers().informer(&kinds::NODE);
        for (i, n) in nodes.into_iter().enumerate() {
            let jitter = if count > 1 { Duration::from_millis(spread * i as u64 / count) } else { Duration::ZERO };
            background.spawn(node::heartbeat(client.clone(), n, config.lease_interval, jitter, node_informer.clone()));
        }
        if let Some(network) = network.clone() {
            // The bridge is there before the first pod, for the node's own traffic to Services
            // and for a cluster DNS listening on its address.
            let eager = network.clone();
            background.spawn(async move { eager.wait_ready().await });
            background.spawn(route_to_other_nodes(&manager, network, period_or_default(config.mode)));
            // Pods with addresses of their own reach Services through the node's nftables table.
            background.spawn(proxy::run(&manager, SERVICE_RULES_RESYNC));
        }
        let informer = manager.informers().informer(&kinds::POD);
        let sweeper = pods.clone();
        let period = config.mode.period().unwrap_or(Duration::from_secs(300));
        let sweep_network = network.clone();
        background.spawn(async move {
            informer.wait_synced().await;
            loop {
                sweeper.sweep_orphans();
                if let Some(n) = &sweep_network {
                    n.release_stale(|| sweeper.live_uids()).await;
                }
                tokio::time::sleep(period).await;
            }
        });
        manager.run(shutdown).await;
        background.abort_all();
        while background.join_next().await.is_some() {}
        if config.stop_containers_on_exit {
            info!("node agent stopping its containers");
            pods.stop_everything(stopping).await;
            if let Some(n) = &network {
                n.release_namespaces().await;
            }
            pods.runtime().detach();
            info!("node agent stopped with its containers");
        } else {
            pods.runtime().detach();
            info!("node agent stopped; containers left running for the next agent");
        }
        Ok(())
    }
}

/// How often routes to other nodes are re-checked without a Node change: the engine's resync,
/// at most 30 s.
/// How often the Service rules are compared with the kernel's and rebuilt when someone changed
/// them: a listing of one table, cheap enough to do every second whatever the pods' trigger mode.
const SERVICE_RULES_RESYNC: Duration = Duration::from_secs(1);

fn period_or_default(mode: TriggerMode) -> Duration {
    mode.period().unwrap_or(Duration::from_secs(30)).min(Duration::from_secs(30))
}

/// Keeps the routes to other nodes' pod CIDRs in step with the Nodes: at once when a Node
/// changes, and every `resync` in case someone removed one.
fn route_to_other_nodes(manager: &Manager, network: Arc<network::PodNetwork>, resync: Duration) -> impl Future<Output = ()> + use<> {
    let informer = manager.informers().informer(&kinds::NODE);
    let nodes = manager.informers().cache(&kinds::NODE);
    let changed = Arc::new(tokio::sync::Notify::new());
    let notify = changed.clone();
    informer.subscribe(move |_| notify.notify_one());
    async move {
        informer.wait_synced().await;
        loop {
            if let Err(e) = network.sync_routes(&nodes.list()).await {
                tracing::warn!(error = %e, "cannot sync the routes to other nodes' pods");
            }
            let _ = tokio::time::timeout(resync, changed.notified()).await;
        }
    }
}

/// Whether the process runtime can limit memory here (root and a memory cgroup controller);
/// `None` when it can, else the reason it cannot.
pub fn memory_limits_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the agent is not running as root".into());
    }
    if !cgroup::Cgroups::detect().has_memory() {
        return Some("no memory cgroup controller is mounted (v1) or delegated (v2)".into());
    }
    None
}

/// Why the oci runtime cannot run on this host with `runc` (not root, runc missing or broken);
/// `None` when it can.
pub fn oci_unavailable(runc: &Path) -> Option<String> {
    oci::unavailable(runc)
}

/// How an agent that stops its containers on exit goes about it: `notice` hears how many pods it
/// is stopping and the longest grace period they get (not called when none runs); once `hurry`
/// completes, whatever still runs is killed at once.
pub struct Stopping {
    pub hurry: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    pub notice: Box<dyn FnOnce(usize, Duration) + Send>,
}

impl Default for Stopping {
    /// Every container gets its whole grace period, in silence.
    fn default() -> Self {
        Stopping { hurry: Box::pin(std::future::pending()), notice: Box::new(|_, _| {}) }
    }
}

/// `shepherd agent --server URL --node-name NAME`: one agent until `shutdown`.
pub async fn run_agent(client: Arc<dyn Client>, config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    Agent::new(client, config).await?.run(shutdown).await
}

/// `shepherd agent --simulate-nodes N --node-name-prefix P`: `count` simulated nodes until `shutdown`.
pub async fn run_simulated_nodes(
    client: Arc<dyn Client>,
    config: AgentConfig,
    count: usize,
    prefix: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    Agent::simulated(client, config, count, prefix).await?.run(shutdown).await
}
