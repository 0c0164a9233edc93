//! The Shepherd daemon: `shepherd server`, `shepherd standalone`, and store backups.

mod backup;
mod control_plane;
mod controllers_view;
mod credentials;
mod dns;
mod elected;
mod etcd_wait;
mod help;
mod image;
mod join;
mod manifests;
mod node_agent;
mod node_certificate;
mod private_dir;
mod registry;
mod service_accounts;
mod snapshots;
mod store_check;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use control_plane::ControllerArgs;
use node_agent::AgentArgs;
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, ConnectionLimits, ConnectionMetrics, HttpConfig};
use shepherd_runtime::{Client, Manager};
use shepherd_store::{EtcdConfig, Heartbeats, HistoryLimits, LocalStore, Store, WalOptions};

// The daemon allocates and frees many small JSON values per request; jemalloc spends less CPU on
// that than the system allocator and fragments less (scale-out: 43.6 -> 25.7 CPU s, see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start (`_RJEM_MALLOC_CONF` in the environment still adds
/// to or overrides them). Freed pages go back to the kernel 250 ms after they were last used
/// instead of 10 s: a scale-out frees and reuses much, and the old delay kept its garbage resident
/// for the whole burst (peak RSS at 10,000 pods 144-151 MiB against 151-156, for ~4% more CPU in
/// the scale-out; BENCHMARKS.md §3-5, "A fast sitting").
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);
// SAFETY: the pointer is to a static, immutable, NUL-terminated string.
unsafe impl Sync for MallocConf {}
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: MallocConf = MallocConf(c"dirty_decay_ms:250,muzzy_decay_ms:0".as_ptr());

#[derive(Parser)]
#[command(name = "shepherd", version, about = "A small container orchestrator modelled on Kubernetes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server over a durable store.
    Server(Box<ServerArgs>),
    /// Run everything in one process: API server, controllers, scheduler and a local node.
    Standalone(Box<StandaloneArgs>),
    /// Run a node agent against an API server: registers the node and runs its pods.
    Agent(Box<AgentCommand>),
    /// Write a consistent snapshot of the store (from a running server or an idle data dir).
    Backup(backup::BackupArgs),
    /// Create a data directory's store from a backup file.
    Restore(backup::RestoreArgs),
    /// Inspect a store no server holds.
    #[command(subcommand)]
    Store(store_check::StoreCommand),
    /// Serve an OCI distribution registry (push and pull) over a data directory.
    Registry(registry::RegistryArgs),
    /// Run the controllers against an API server, acting while holding the
    /// kube-system/kube-controller-manager Lease (several may run; one acts).
    ControllerManager(Box<elected::ElectedArgs>),
    /// Run the scheduler against an API server, acting while holding the kube-system/kube-scheduler
    /// Lease (several may run; one acts).
    Scheduler(Box<elected::ElectedArgs>),
    /// Print a kubeconfig for a user, with a client certificate signed by the cluster CA.
    Kubeconfig(credentials::KubeconfigArgs),
    /// Bootstrap tokens with which agents join: `token create`, `token list`.
    #[command(subcommand)]
    Token(join::TokenCommand),
    /// A node's images without a registry: `image import FILE`, `image ls`, `image rm NAME`.
    #[command(subcommand)]
    Image(image::ImageCommand),
}

#[derive(Args, Clone)]
struct StandaloneArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    agent: AgentArgs,
    #[command(flatten)]
    registry: registry::BesideArgs,
    /// Leave the local node's containers running when standalone stops (the next start adopts
    /// them); by default stopping standalone stops its pods' containers too.
    #[arg(long)]
    keep_pods: bool,
}

#[derive(Args, Clone)]
struct AgentCommand {
    /// The API server (ignored with --kubeconfig).
    #[arg(long, env = "SHEPHERD_API", default_value = "https://127.0.0.1:9876")]
    server: String,
    /// Bearer token for the API server.
    #[arg(long, env = "SHEPHERD_TOKEN")]
    token: Option<String>,
    /// A kubeconfig naming the server, its CA and the node's credentials (not read from
    /// $KUBECONFIG: an agent started from a user's shell must not join the user's cluster).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The CA certificate (PEM) that signed the server's certificate (the server's
    /// <data-dir>/pki/ca.crt).
    #[arg(long, value_name = "FILE")]
    certificate_authority: Option<PathBuf>,
    /// A bootstrap token (`shepherd token create`) to join with: the agent files a request for its
    /// node's client certificate, and once it is signed keeps key, certificate and a kubeconfig in
    /// its data dir, which later starts use instead of the token (and renews the certificate before
    /// it expires). Needs --certificate-authority, --discovery-token-ca-cert-hash or
    /// --discovery-token-unsafe-skip-ca-verification to trust the server.
    #[arg(long, env = "SHEPHERD_JOIN_TOKEN", hide_env_values = true, value_name = "ID.SECRET",
        conflicts_with_all = ["kubeconfig", "token", "simulate_nodes"])]
    join_token: Option<String>,
    /// With --join-token instead of --certificate-authority: the pin of the cluster CA's public
    /// key (`sha256:<hex>`, printed by `shepherd token create`); the CA is read from the
    /// server's public `kube-public/cluster-info` and used only if the cluster signed it for the
    /// join token and it matches the pin.
    #[arg(long, value_name = "sha256:HEX", requires = "join_token", conflicts_with = "certificate_authority")]
    discovery_token_ca_cert_hash: Option<String>,
    /// With --join-token: trust the CA in `kube-public/cluster-info` on the join token's signature
    /// alone, without --discovery-token-ca-cert-hash (as kubeadm's flag of the same name).
    #[arg(long, requires = "join_token", conflicts_with_all = ["certificate_authority", "discovery_token_ca_cert_hash"])]
    discovery_token_unsafe_skip_ca_verification: bool,
    /// How long to wait for the join request to be approved and signed.
    #[arg(long, default_value = "5m", value_parser = shepherd_api::duration::parse)]
    join_timeout: Duration,
    /// Directory for container state and logs; must survive restarts for re-adoption.
    #[arg(long, env = "SHEPHERD_AGENT_DATA_DIR", default_value = "shepherd-agent-data", value_parser = absolute_dir)]
    data_dir: PathBuf,
    /// Run this many simulated nodes in this one process (implies the simulated runtime).
    #[arg(long)]
    simulate_nodes: Option<usize>,
    /// Names of simulated nodes: PREFIX0, PREFIX1, ...
    #[arg(long, default_value = "sim-")]
    node_name_prefix: String,
    /// The cluster's DNS domain, for the search path of pods' resolv.conf (with --cluster-dns).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    #[command(flatten)]
    agent: AgentArgs,
}

#[derive(Args, Clone)]
struct ServerArgs {
    /// Directory for the store and other state; created if absent.
    #[arg(long, env = "SHEPHERD_DATA_DIR", default_value = "shepherd-data", value_parser = absolute_dir)]
    data_dir: PathBuf,
    /// Address to serve the API on.
    #[arg(long, env = "SHEPHERD_LISTEN", default_value = "127.0.0.1:9876")]
    listen: SocketAddr,
    /// A bearer token that authenticates as the administrator (user shepherd-admin, group
    /// system:masters); with --insecure-loopback, required on every request.
    #[arg(long, env = "SHEPHERD_TOKEN")]
    token: Option<String>,
    #[command(flatten)]
    tls: credentials::TlsArgs,
    #[command(flatten)]
    service_accounts: service_accounts::ServiceAccountArgs,
    /// The longest validity of certificates signed for CertificateSigningRequests, nodes' client
    /// certificates among them (kube-controller-manager's --cluster-signing-duration); a request
    /// may ask for less.
    #[arg(long, default_value = "8760h", value_parser = join::signing_duration)]
    cluster_signing_duration: Duration,
    /// The secret node agents' streaming endpoints require (their --streaming-token); without
    /// it, exec, attach and port-forward are refused. Standalone generates one when unset.
    #[arg(long, env = "SHEPHERD_STREAMING_TOKEN", hide_env_values = true)]
    node_streaming_token: Option<String>,
    /// Keep an in-memory store only (nothing written to disk).
    #[arg(long)]
    in_memory: bool,
    /// Threads that serve the API (HTTP, admission, the store's callers). In standalone the node
    /// agent has a thread of its own beside them. Default: half the cores, at least one.
    #[arg(long, default_value_t = half_the_cores(), value_parser = at_least_one)]
    api_threads: usize,
    /// Threads of the controllers and their informers, a runtime of their own beside the API's
    /// (the scheduler has one more thread of its own). Default: half the cores, at least one.
    #[arg(long, default_value_t = half_the_cores(), value_parser = at_least_one)]
    controller_threads: usize,
    /// Where the objects live: `embedded` (a redb file under --data-dir, one server) or `etcd`
    /// (etcd at --etcd-endpoints, which several API servers may share).
    #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
    store: StoreKind,
    /// How the embedded store writes: `wal` (a write-ahead log checkpointed into redb) or `redb`
    /// (the previous engine, a redb commit per batch; kept for benchmarks).
    #[arg(long, value_enum, default_value_t = StoreEngine::Wal, hide = true)]
    store_engine: StoreEngine,
    /// etcd client URLs, comma-separated (with --store etcd).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    etcd_endpoints: Vec<String>,
    /// The prefix of every key in etcd (with --store etcd): API servers with one prefix serve one
    /// cluster; another prefix is another cluster in the same etcd.
    #[arg(long, default_value = "/shepherd")]
    etcd_prefix: String,
    /// How often etcd's history is compacted (with --store etcd; 0 leaves it to etcd's own
    /// --auto-compaction-retention): one of the API servers sharing it compacts to the revision
    /// one interval old, as kube-apiserver's --etcd-compaction-interval.
    #[arg(long, default_value = "5m", value_parser = shepherd_api::duration::parse)]
    etcd_compaction_interval: Duration,
    /// The CA certificate (PEM) that verifies etcd's serving certificate: talk to etcd over TLS
    /// (with https:// endpoints).
    #[arg(long, value_name = "FILE")]
    etcd_cafile: Option<PathBuf>,
    /// This server's client certificate (PEM) for an etcd that requires one (--client-cert-auth).
    #[arg(long, value_name = "FILE", requires_all = ["etcd_cafile", "etcd_keyfile"])]
    etcd_certfile: Option<PathBuf>,
    /// The private key (PEM) of --etcd-certfile.
    #[arg(long, value_name = "FILE", requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 3 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Watch history kept for clients to resume from, in events.
    #[arg(long, default_value_t = 100_000)]
    history_events: usize,
    /// Watch history kept for clients to resume from, in seconds.
    #[arg(long, default_value_t = 900)]
    history_seconds: u64,
    /// Watch history kept for clients to resume from, in MiB of objects.
    #[arg(long, default_value_t = 64)]
    history_mib: usize,
    /// Of the watch history, the newest MiB of objects kept in memory: the embedded store reads
    /// older events back from its file when a watch or a list at a past revision reaches them.
    /// The writes since its last checkpoint stay in memory whatever this says; a checkpoint comes
    /// once half of this (1 to 16 MiB) is written since the last one, or after five seconds.
    /// `store_watch_history_file_events_total` in `/metrics` counts the events read back.
    #[arg(long, default_value_t = 4)]
    history_memory_mib: usize,
    /// Page cache of the store file (redb), in MiB. Reads are served from memory, so it only
    /// speeds up writing to the file: a larger cache costs memory and saves some CPU per commit.
    #[arg(long, default_value_t = shepherd_store::DEFAULT_REDB_CACHE_BYTES / (1024 * 1024))]
    store_cache_mib: usize,
    /// How far the embedded store's write-ahead log may run ahead of its last checkpoint, in MiB:
    /// while checkpoints fail, writes are refused beyond it (503, or 507 when the disk is full)
    /// until one succeeds. It bounds the log on disk and the writes held in memory for the next
    /// checkpoint.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1024 * 1024))]
    store_wal_max_uncheckpointed_mib: u64,
    /// How long a node Lease renewal may wait, in milliseconds, for other writes to share its
    /// commit (one `fdatasync` for several renewals); any other write commits at once with
    /// them. 0: every renewal is committed on its own. 50 makes the idle control plane at 1,000
    /// nodes a third cheaper (BENCHMARKS.md) and answers a renewal up to 50 ms later.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=1000))]
    store_heartbeat_wait_ms: u64,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 10)]
    bookmark_seconds: u64,
    /// A connection that has not sent a complete request head this long after it was opened or
    /// finished its previous request is closed (half-sent headers, idle keep-alive connections).
    #[arg(long, default_value = "30s", value_parser = shepherd_api::duration::parse)]
    request_header_timeout: Duration,
    /// HTTP connections served at once; more are closed on accept. Default: half the open-file
    /// limit (which is raised to its hard limit at start).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Events are deleted this long after their last update (e.g. 30m, 1h, 5s), as
    /// kube-apiserver's --event-ttl.
    #[arg(long, default_value = "1h", value_parser = shepherd_api::duration::parse)]
    event_ttl: Duration,
    /// Write a snapshot of the store into <data-dir>/snapshots/ this often (e.g. 1h, 10m; 0
    /// turns it off); a store damaged on disk is restored from one with `shepherd restore`.
    #[arg(long, default_value = "1h", value_parser = shepherd_api::duration::parse)]
    snapshot_interval: Duration,
    /// Snapshots kept in <data-dir>/snapshots/; older ones are removed.
    #[arg(long, default_value_t = 3)]
    snapshot_keep: usize,
    /// Let the dashboard (and `POST /debug/controllers/NAME`) switch a controller's trigger mode
    /// and make it lose events, to watch edge mode get stuck and a resync repair it. For
    /// demonstrations only: it breaks the cluster on purpose.
    #[arg(long)]
    dashboard_demo: bool,
    /// The benchmark harness's results directory, whose trigger-mode experiment the dashboard's
    /// Benchmarks view shows when it is there.
    #[arg(long, default_value = "bench/results")]
    bench_results: PathBuf,
    /// Record authenticated requests as audit.k8s.io/v1 Events, one JSON line each, in this
    /// file (`-`: standard output).
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// An audit.k8s.io/v1 Policy (YAML or JSON) choosing how much of each request is recorded;
    /// without one, every authenticated request is recorded at the Metadata level.
    #[arg(long, requires = "audit_log_path")]
    audit_policy_file: Option<PathBuf>,
    /// Start a new audit log file once it reaches this many megabytes (0: never).
    #[arg(long, default_value_t = 100)]
    audit_log_maxsize: u64,
    /// Rotated audit log files kept; older ones are removed (0: keep all).
    #[arg(long, default_value_t = 10)]
    audit_log_maxbackup: usize,
    /// Writes (create, update, patch, delete) per second each authenticated user may make,
    /// members of system:masters excepted; beyond it, 429 with Retry-After. 0 turns it off.
    #[arg(long, default_value_t = 100.0)]
    user_write_rate: f64,
    /// Writes a user may make at once after a quiet spell.
    #[arg(long, default_value_t = 200)]
    user_write_burst: u32,
    #[command(flatten)]
    controllers: ControllerArgs,
    #[command(flatten)]
    dns: dns::DnsArgs,
}

/// A data directory, made absolute against the working directory at start: paths derived from it
/// reach runc (which resolves a relative root against the container's bundle) and processes that
/// start in other directories, and must mean the same there.
fn absolute_dir(arg: &str) -> Result<PathBuf, String> {
    std::path::absolute(arg).map_err(|e| format!("{arg}: {e}"))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person watching; journald, files and pipes get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // `-h` shows the everyday flags under headings, `--help-all` every one (help.rs).
    let cli = Cli::from_arg_matches(&help::arrange(Cli::command()).get_matches()).unwrap_or_else(|e| e.exit());
    private_dir::private_umask();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    match &cli.command {
        Command::Server(args) => runtime.worker_threads(args.api_threads),
        Command::Standalone(args) => runtime.worker_threads(args.server.api_threads),
        _ => &mut runtime,
    };
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Server(args) => run_server(*args, None).await,
            Command::Standalone(args) => {
                let registry = registry::start_beside(&args.registry, &args.server.data_dir).await?;
                let StandaloneArgs { server, agent: mut agent_args, keep_pods, .. } = *args;
                let runtime_note = agent_args.choose_standalone_runtime();
                let host_network_reason = agent_args.choose_standalone_pod_network();
                let local = LocalAgent { args: agent_args, keep_pods, runtime_note, host_network_reason, registry };
                run_server(server, Some(local)).await
            }
            Command::Agent(args) => run_agent(*args).await,
            Command::Backup(args) => backup::backup(args).await,
            Command::Restore(args) => backup::restore(args),
            Command::Store(command) => store_check::run(command),
            Command::Registry(args) => registry::run(args).await,
            Command::ControllerManager(args) => elected::run(elected::Role::ControllerManager, *args, shutdown_signal()).await,
            Command::Scheduler(args) => elected::run(elected::Role::Scheduler, *args, shutdown_signal()).await,
            Command::Kubeconfig(args) => credentials::print_kubeconfig(args),
            Command::Token(command) => join::run(command).await,
            Command::Image(command) => image::run(command),
        }
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StoreEngine {
    Wal,
    Redb,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    Embedded,
    Etcd,
}

fn history_limits(args: &ServerArgs) -> HistoryLimits {
    HistoryLimits {
        max_events: args.history_events,
        max_age: Duration::from_secs(args.history_seconds),
        max_bytes: args.history_mib.saturating_mul(1024 * 1024),
        memory_bytes: args.history_memory_mib.saturating_mul(1024 * 1024),
        ..HistoryLimits::default()
    }
}

/// The server's store: the embedded one (which backups and snapshots read directly), or etcd;
/// with the listener already serving readiness if etcd was not there at first.
async fn open_any_store(
    args: &ServerArgs,
    mode: &str,
) -> anyhow::Result<(Arc<dyn Store>, Option<LocalStore>, Option<etcd_wait::Bound>)> {
    match args.store {
        StoreKind::Embedded => {
            let local = open_store(args).await?;
            Ok((Arc::new(local.clone()), Some(local), None))
        }
        StoreKind::Etcd => {
            if args.in_memory {
                anyhow::bail!("--in-memory and --store etcd exclude each other: the objects are in etcd");
            }
            // The data directory still holds this server's credentials (pki/).
            private_dir::secure(&args.data_dir)?;
            let mut config = EtcdConfig::new(args.etcd_endpoints.clone(), &args.etcd_prefix);
            config.limits = history_limits(args);
            config.compaction_interval = args.etcd_compaction_interval;
            config.tls = etcd_wait::tls(args)?;
            let (store, bound) = etcd_wait::connect(args, config, mode).await?;
            Ok((store, None, bound))
        }
    }
}

async fn open_store(args: &ServerArgs) -> anyhow::Result<LocalStore> {
    let limits = history_limits(args);
    if args.in_memory {
        return Ok(LocalStore::in_memory(limits));
    }
    private_dir::secure(&args.data_dir)?;
    shepherd_store::set_redb_cache_bytes(args.store_cache_mib.max(1).saturating_mul(1024 * 1024));
    let path = backup::store_file(&args.data_dir);
    let opened = match args.store_engine {
        StoreEngine::Wal => {
            let heartbeats = Heartbeats {
                prefix: kinds::LEASE.namespace_prefix(kinds::NODE_LEASE_NAMESPACE).leak(),
                wait: Duration::from_millis(args.store_heartbeat_wait_ms),
            };
            let options = WalOptions {
                segment_bytes: WalOptions::segment_bytes_for(limits.memory_bytes),
                max_uncheckpointed_bytes: args.store_wal_max_uncheckpointed_mib << 20,
                heartbeats,
                ..WalOptions::default()
            };
            LocalStore::open_embedded(&path, limits, options)
        }
        StoreEngine::Redb => LocalStore::open_redb_only(&path, limits),
    };
    let store = opened.map_err(|e| {
        anyhow::anyhow!("cannot open the store {}: {e}; {}", path.display(), snapshots::recovery_hint(&args.data_dir))
    })?;
    // A store behind its own snapshot lost acknowledged writes: an older copy of the file, or a
    // damaged newest commit that redb skipped for the one before it. Serving it would hand out
    // resourceVersions again that clients already saw for other objects.
    let current = store.revision().await?;
    if let Some((snapshot, revision)) = snapshots::newest_good(&args.data_dir)
        && revision > current
    {
        anyhow::bail!(
            "the store {} is at revision {current}, behind the snapshot {} at revision {revision}: writes were lost; \
             restore the snapshot with: shepherd restore --from {} --data-dir {} --force",
            path.display(),
            snapshot.display(),
            snapshot.display(),
            args.data_dir.display()
        );
    }
    Ok(store)
}

/// Most pods one agent process simulating many nodes reconciles at once (requests in flight).
const MAX_SIMULATED_AGENT_WORKERS: usize = 64;

async fn run_agent(args: AgentCommand) -> anyhow::Result<()> {
    private_dir::secure(&args.data_dir)?;
    let mut config = args.agent.config(&args.data_dir)?;
    config.registries_file.get_or_insert_with(|| args.data_dir.join("registries.yaml"));
    // A joined agent is its node from then on: the token is needed only until the first certificate.
    let joined = join::node_kubeconfig_path(&args.data_dir);
    let rejoin = args.join_token.is_some() && node_certificate::expired(&joined);
    let node_kubeconfig = match (&args.join_token, &args.certificate_authority, &args.discovery_token_ca_cert_hash) {
        _ if joined.exists() && !rejoin && args.kubeconfig.is_none() && args.token.is_none() => Some(joined),
        (Some(token), ca, pin) => {
            let ca = match (ca, pin) {
                (Some(ca), _) => ca.clone(),
                (None, pin) if pin.is_some() || args.discovery_token_unsafe_skip_ca_verification => {
                    join::discover_ca(&args.server, token, pin.as_deref(), &args.data_dir, args.join_timeout).await?
                }
                (None, _) => anyhow::bail!(
                    "--join-token needs --certificate-authority FILE or --discovery-token-ca-cert-hash sha256:... to trust \
                     the server (or --discovery-token-unsafe-skip-ca-verification to trust cluster-info's signature alone)"
                ),
            };
            Some(join::bootstrap(&args.server, token, &ca, &args.data_dir, &config.node_name, args.join_timeout).await?)
        }
        _ => None,
    };
    let (token, ca) = match &node_kubeconfig {
        Some(_) => (None, None),
        None => (args.token.as_deref(), args.certificate_authority.as_deref()),
    };
    let kube_config =
        credentials::agent_client_config(&args.server, args.kubeconfig.as_deref().or(node_kubeconfig.as_deref()), token, ca)
            .await?;
    let server_url = kube_config.cluster_url.to_string();
    let mut kube = kube::Client::try_from(kube_config).map_err(|e| anyhow::anyhow!("building a client for {server_url}: {e}"))?;
    if let (None, Some(path)) = (&args.kubeconfig, &node_kubeconfig) {
        kube = node_certificate::keep_renewed(path.clone(), kube, args.join_timeout);
    }
    let client: Arc<dyn Client> =
        Arc::new(shepherd_client::RemoteClient::new(kube).named(shepherd_apiserver::AGENT_FIELD_MANAGER));
    if let Some(dns) = config.cluster_dns.as_mut() {
        dns.domain = args.cluster_domain.clone();
    }
    if let Some(host) = server_url.strip_prefix("https://").and_then(|_| kube_config_host(&server_url)) {
        config.kubernetes_service = Some(host);
    }
    match args.simulate_nodes {
        Some(n) => {
            if config.runtime == shepherd_agent::RuntimeKind::Process {
                config.runtime = shepherd_agent::RuntimeKind::Simulated(shepherd_agent::SimulatedBehaviour {
                    ready_delay: Duration::from_millis(args.agent.simulated_ready_ms),
                    fail_fraction: args.agent.simulated_fail_fraction,
                });
            }
            config.workers = config.workers.saturating_mul(n).clamp(1, MAX_SIMULATED_AGENT_WORKERS);
            let agent = shepherd_agent::Agent::simulated(client, config, n, &args.node_name_prefix)
                .await
                .map_err(node_agent::context)?;
            println!("shepherd agent running {n} simulated nodes ({}0..) against {server_url}", args.node_name_prefix);
            agent.run(shutdown_signal()).await.map_err(node_agent::context)
        }
        None => {
            let name = config.node_name.clone();
            if config.streaming.is_none() {
                tracing::warn!("no --streaming-token: this node serves no exec, attach or port-forward");
            }
            let agent = shepherd_agent::Agent::new(client, config).await.map_err(node_agent::context)?;
            println!("shepherd agent running node {name} against {server_url}");
            agent.run(shutdown_signal()).await.map_err(node_agent::context)
        }
    }
}

fn audit_log(args: &ServerArgs) -> anyhow::Result<Option<Arc<shepherd_apiserver::AuditLog>>> {
    let Some(path) = &args.audit_log_path else { return Ok(None) };
    let policy = match &args.audit_policy_file {
        Some(file) => shepherd_apiserver::AuditPolicy::load(file).map_err(|e| anyhow::anyhow!(e))?,
        None => shepherd_apiserver::AuditPolicy::metadata_for_everything(),
    };
    let config = shepherd_apiserver::AuditConfig {
        path: path.clone(),
        policy,
        max_bytes: args.audit_log_maxsize.saturating_mul(1024 * 1024),
        max_backups: args.audit_log_maxbackup,
    };
    shepherd_apiserver::AuditLog::start(config).map(Some).map_err(|e| anyhow::anyhow!(e))
}

fn user_rate_limiter(args: &ServerArgs) -> anyhow::Result<Option<Arc<shepherd_apiserver::UserRateLimiter>>> {
    let per_second = args.user_write_rate;
    if !per_second.is_finite() || per_second < 0.0 {
        anyhow::bail!("--user-write-rate must be a number of writes per second, 0 or more, not {per_second}");
    }
    if per_second == 0.0 {
        return Ok(None);
    }
    let limit = shepherd_apiserver::RateLimit { per_second, burst: args.user_write_burst.max(1) };
    Ok(Some(Arc::new(shepherd_apiserver::UserRateLimiter::new(limit))))
}

/// The host (without brackets) and port of an `https://HOST:PORT` URL, for containers'
/// `KUBERNETES_SERVICE_HOST` and `_PORT`.
fn kube_config_host(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']').to_string();
    Some((host, uri.port_u16().unwrap_or(443)))
}

/// The node agent `standalone` runs in its own process.
struct LocalAgent {
    args: AgentArgs,
    keep_pods: bool,
    /// Which runtime was chosen and why, printed at start.
    runtime_note: Option<String>,
    /// Why pods share the host's network, when standalone chose it.
    host_network_reason: Option<String>,
    /// The registry beside it.
    registry: registry::Beside,
}

impl LocalAgent {
    fn bridged(&self) -> bool {
        matches!(self.args.pod_network, Some(node_agent::PodNetworkArg::Bridge))
    }
}

async fn run_server(mut args: ServerArgs, local_agent: Option<LocalAgent>) -> anyhow::Result<()> {
    let standalone = local_agent.is_some();
    credentials::check_insecure_listen(&args.tls, args.listen)?;
    let mode = if standalone { "standalone" } else { "server" };
    let (store, local_store, bound) = open_any_store(&args, mode).await?;
    let (bound_listener, bound_secured) = match bound {
        Some(b) => (Some(b.listener), Some(b.secured)),
        None => (None, None),
    };
    let secured = match (bound_secured, args.tls.insecure_loopback) {
        (Some(secured), _) => secured,
        (None, true) => None,
        (None, false) => Some(credentials::secure(&args.tls, &args.data_dir, args.listen, args.token.as_deref())?),
    };
    let config = HttpConfig {
        max_body_bytes: args.max_body_bytes,
        token: args.token.clone(),
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
        authenticator: secured.as_ref().map(|s| s.authenticator.clone()),
        audit: audit_log(&args)?,
        rate_limiter: user_rate_limiter(&args)?,
    };
    let server = ApiServer::new(store.clone(), config).await.map_err(|e| anyhow::anyhow!("starting API server: {e}"))?;
    let server = server.with_node_port_range(args.controllers.service_node_port_range.parse()?);
    // Tokens are signed, accepted and mounted only where requests are authenticated at all.
    let server = match &secured {
        Some(s) => {
            args.controllers.root_ca_pem = Some(s.root_ca_pem.clone());
            server.with_service_account_tokens(args.service_accounts.tokens(&args.data_dir)?)
        }
        None => server,
    };
    let client: Arc<dyn Client> = Arc::new(server.client());
    let mut streaming_token = args.node_streaming_token.clone();
    let agent = match &local_agent {
        Some(local) => {
            let dir = node_agent::agent_dir(&args.data_dir);
            node_agent::ensure_dir(&dir)?;
            let mut agent_args = local.args.clone();
            let token = match streaming_token.clone().or_else(|| agent_args.streaming_token.clone()) {
                Some(t) => t,
                None => node_agent::random_token()?,
            };
            agent_args.streaming_token = Some(token.clone());
            streaming_token = Some(token);
            let mut config = agent_args.config(&dir)?;
            config.registries_file.get_or_insert_with(|| args.data_dir.join("registries.yaml"));
            config.stop_containers_on_exit = !local.keep_pods;
            if !args.tls.insecure_loopback && args.listen.port() != 0 {
                config.kubernetes_service = kube_config_host(&credentials::client_url("https", args.listen));
            }
            if local.bridged() {
                config.service_cidr = Some(args.controllers.service_cluster_ip_range.clone());
                config.cluster_cidr = Some(args.controllers.cluster_cidr.clone());
                // The cluster DNS standalone serves on the pod network, unless told otherwise.
                if config.cluster_dns.is_none() && args.dns.cluster_dns_listen.is_none() {
                    let ip = dns::kube_dns_cluster_ip(&args.controllers.service_cluster_ip_range)
                        .context("--service-cluster-ip-range leaves no address for the kube-dns Service")?;
                    config.cluster_dns = Some(shepherd_agent::ClusterDns { nameservers: vec![ip.into()], domain: String::new() });
                }
            }
            if let Some(dns) = config.cluster_dns.as_mut() {
                dns.domain = args.dns.cluster_domain.clone();
            }
            // The node agent acts as its node, restricted as a remote agent's node identity is.
            let node = shepherd_apiserver::auth::UserInfo::new(format!("system:node:{}", config.node_name), ["system:nodes"]);
            let agent_client: Arc<dyn Client> = Arc::new(server.client_as(node).await);
            let agent = shepherd_agent::Agent::new(agent_client, config)
                .await
                .map_err(node_agent::context)?;
            Some(agent)
        }
        None => None,
    };
    let server = match &agent {
        Some(a) => server.with_logs(Arc::new(node_agent::AgentLogs(a.logs()))),
        None => server,
    };
    let server = match streaming_token {
        Some(t) => server.with_node_streaming(t),
        None => server,
    };
    // The controllers and the scheduler act as themselves, held to their default roles as they
    // would be in processes of their own.
    let as_user = |name: &str| shepherd_apiserver::auth::UserInfo::new(name, Vec::<String>::new());
    let controllers: Arc<dyn Client> = Arc::new(server.client_as(as_user("system:kube-controller-manager")).await);
    let scheduler: Arc<dyn Client> = Arc::new(server.client_as(as_user("system:kube-scheduler")).await);
    let manager = Arc::new(Manager::new(controllers.clone()));
    // The scheduler gets a thread of its own beside the controllers': during a scale-out its
    // binds and Events (a third of that thread's work) no longer wait behind the ReplicaSet
    // controller and the informers, and at idle, with nothing to place, it sleeps.
    let scheduler_rt = BackgroundRuntime(Some(
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("scheduler").enable_all().build()?,
    ));
    let enabled = args.controllers.install(controllers, scheduler, &manager, Some(scheduler_rt.handle().clone()))?;
    // Event expiry is the API server's duty in Kubernetes (--event-ttl), so it runs whatever
    // --controllers says.
    let ttl = shepherd_controllers::eventttl::event_ttl_controller(client.clone(), &manager, args.event_ttl, Default::default());
    manager.add(ttl);
    if let Ok(mut registry) = server.registry().lock() {
        manager.metrics().register(&mut registry);
    }
    let node_names = agent.as_ref().map(|a| a.node_names()).unwrap_or_default();
    let debug_manager = manager.clone();
    let backup_store = local_store.clone();
    // Behind the API's bearer token: they name objects and their errors, or hold every object.
    let router = server.router_with(
        axum::Router::new()
            .merge(controllers_view::routes(debug_manager, args.dashboard_demo))
            .route(
                "/backup",
                axum::routing::get(move || {
                    let store = backup_store.clone();
                    async move {
                        match store {
                            Some(store) => backup::serve(store).await,
                            None => backup::not_embedded(),
                        }
                    }
                }),
            )
            .merge(shepherd_dashboard::router(Some(args.bench_results.clone()))),
    );

    let open_files = raise_open_file_limit();
    let limits = ConnectionLimits {
        header_timeout: args.request_header_timeout,
        max_connections: args.max_connections.unwrap_or_else(|| ConnectionLimits::cap_for_open_files(open_files)).max(1),
    };
    let connection_metrics = ConnectionMetrics::default();
    if let Ok(mut registry) = server.registry().lock() {
        connection_metrics.register(&mut registry);
        shepherd_apiserver::register_retention(store.clone(), &mut registry);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (hurry_tx, hurry_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // Bound before the API's address is printed: a port in use fails the start, not a running server.
    let cluster_dns = dns::start(&args.dns, &manager, stopped(stop_rx.clone())).await?;
    let bridged = local_agent.as_ref().is_some_and(LocalAgent::bridged);
    let pod_network_dns = match (&cluster_dns, node_names.first()) {
        (None, Some(node)) if bridged => Some(dns::start_on_pod_network(
            &args.dns,
            &manager,
            client.clone(),
            node.clone(),
            args.controllers.service_cluster_ip_range.clone(),
            stop_rx.clone(),
        )?),
        _ => None,
    };
    if let Some((addr, _)) = &cluster_dns {
        // On stderr: scripts read the API's address from stdout's first line.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "cluster DNS listening on {addr} (udp and tcp)");
        let (client, addr, range) = (client.clone(), *addr, args.controllers.service_cluster_ip_range.clone());
        let node = node_names.first().cloned();
        tokio::spawn(async move { dns::publish_kube_dns(client.as_ref(), addr, &range, node.as_deref()).await });
    }
    let printed = bound_listener.is_some();
    let listener = match bound_listener {
        Some(l) => tokio::net::TcpListener::from_std(l)?,
        None => tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?,
    };
    let addr = listener.local_addr()?;
    let scheme = if secured.is_some() { "https" } else { "http" };
    let url = credentials::client_url(scheme, addr);
    let kubeconfig = match &secured {
        Some(s) => Some(credentials::write_admin_kubeconfig(&args.data_dir, s, &url)?),
        None => None,
    };
    if let Some(s) = secured.as_ref().filter(|s| s.serving_by_cluster_ca) {
        shepherd_apiserver::bootstrap_token::publish_cluster_info(server.service(), &url, s.ca.cert_pem())
            .await
            .map_err(|e| anyhow::anyhow!("writing kube-public/cluster-info: {e}"))?;
    }
    // The first line on stdout is the address, so scripts and tests can read it.
    if !printed {
        println!("shepherd {mode} listening on {scheme}://{addr}");
    }
    if let Some(path) = &kubeconfig {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "admin kubeconfig: {} (kubectl --kubeconfig {0} get pods)", path.display());
        let dashboard = match secured.as_ref().and_then(|s| s.sign_in_token.as_ref()) {
            // A fragment never reaches the server, its logs or a proxy; the page takes the token
            // out of the address bar at once.
            Some(token) => format!(
                "dashboard: {url}/dashboard/#token={token} (signs you in as the administrator; the token is in {})",
                credentials::sign_in_token_path(&args.data_dir).display()
            ),
            None => format!("dashboard: {url}/dashboard/ (sign in with the --token value)"),
        };
        let _ = writeln!(std::io::stderr(), "{dashboard}");
    }
    if let Some(local) = &local_agent {
        // On stderr: scripts read the address from stdout and may close it after that line.
        use std::io::Write;
        if let Some(note) = &local.runtime_note {
            let _ = writeln!(std::io::stderr(), "{note}");
        }
        let c = &args.controllers;
        let network = if local.bridged() {
            let dns = match (&cluster_dns, dns::kube_dns_cluster_ip(&c.service_cluster_ip_range)) {
                (None, Some(ip)) => format!(", cluster DNS {ip} ({})", args.dns.cluster_domain),
                _ => String::new(),
            };
            Some(format!(
                "pod network: bridge {}, pods in {}, Services in {} (reachable from this host){dns}; \
                 --pod-network host shares this host's network instead",
                shepherd_agent::POD_BRIDGE,
                c.cluster_cidr,
                c.service_cluster_ip_range
            ))
        } else {
            local.host_network_reason.as_ref().map(|why| {
                format!("pod network: host (pods share this host's network; no Services or cluster DNS for them): {why}")
            })
        };
        if let Some(line) = network {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
        match &local.registry {
            registry::Beside::Serving(addr) => {
                let _ = writeln!(std::io::stderr(), "registry: http://{addr} (pods pull {addr}/NAME:TAG); --no-registry starts none");
            }
            registry::Beside::PortTaken(addr) => {
                let _ = writeln!(std::io::stderr(), "registry: none, {addr} is taken (--registry-listen ADDR to pick another)");
            }
            registry::Beside::Off => {}
        }
        if !args.in_memory {
            let dir = manifests::dir(&args.data_dir);
            let _ = writeln!(std::io::stderr(), "add-ons: every manifest in {} is applied, and again when it changes", dir.display());
        }
    }
    let revision = store.revision().await?;
    tracing::info!(%addr, data_dir = %args.data_dir.display(), revision, controllers = ?enabled,
        open_files, max_connections = limits.max_connections, "shepherd {mode} ready");

    // The controllers get threads of their own. With one pool for everything, each request woke
    // the other thread to look for work it rarely found: with 1,000 nodes renewing their Leases,
    // a quarter of the idle server's CPU was threads parking and waking, and a 10,000-pod
    // scale-out took more CPU than with the API and the controllers on a thread each.
    let control_rt = BackgroundRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.controller_threads)
            .thread_name("controllers")
            .enable_all()
            .build()?,
    ));
    let controllers = {
        let manager = manager.clone();
        let stop = stopped(stop_rx.clone());
        control_rt.handle().spawn(async move { manager.run(stop).await })
    };
    // Add-ons by files (k3s's auto-deploying manifests), as the administrator.
    let manifests_dir = manifests::dir(&args.data_dir);
    if !args.in_memory {
        if let Err(e) = std::fs::create_dir_all(&manifests_dir) {
            tracing::warn!(dir = %manifests_dir.display(), error = %e, "cannot create the manifests directory");
        }
        tokio::spawn(manifests::run(server.service().clone(), client.clone(), manifests_dir.clone(), stop_rx.clone()));
    }
    // Joining nodes: the CSR approver and signer hold the cluster CA's key, cluster-info is signed
    // for each bootstrap token, and expired tokens are removed; only a TLS server has any of it.
    if !args.tls.insecure_loopback {
        let ca = Arc::new(credentials::cluster_ca(&args.data_dir)?);
        let duration = args.cluster_signing_duration;
        tokio::spawn(shepherd_apiserver::certificates::run_controller(server.service().clone(), ca, duration, stopped(stop_rx.clone())));
        tokio::spawn(shepherd_apiserver::bootstrap_token::run_signer(server.service().clone(), stopped(stop_rx.clone())));
        tokio::spawn(shepherd_apiserver::bootstrap_token::run_cleaner(
            server.service().clone(),
            Duration::from_secs(60),
            stopped(stop_rx.clone()),
        ));
    }
    // The standalone's node agent gets a thread of its own too. On the API's threads, each pod it
    // started held a thread that a request needed: tokio does not preempt a task, and the kernel
    // shares a core more finely between threads than a busy task yields (`shepherd-bench
    // pod-density`: sequential creates while pods start, p99 3.0-6.6 ms on the API's threads,
    // 2.0-3.9 ms on the agent's own).
    let (agent_rt, agent_task) = match agent {
        Some(a) => {
            let rt = BackgroundRuntime(Some(
                tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name("agent").enable_all().build()?,
            ));
            tracing::info!(nodes = ?node_names, "local node agent starting");
            let stop = stopped(stop_rx.clone());
            let stopping = shepherd_agent::Stopping {
                hurry: Box::pin(stopped(hurry_rx.clone())),
                notice: Box::new(|pods, grace| {
                    use std::io::Write;
                    let s = if pods == 1 { "" } else { "s" };
                    let grace = grace.as_secs_f64();
                    let _ = writeln!(std::io::stderr(), "stopping {pods} pod{s}, up to {grace:.0} s; Ctrl-C again to kill them now");
                }),
            };
            let task = rt.handle().spawn(async move { a.run_then(stop, stopping).await });
            (Some(rt), Some(task))
        }
        None => (None, None),
    };
    let snapshotter = local_store.filter(|_| !args.in_memory && !args.snapshot_interval.is_zero()).map(|local| {
        tokio::spawn(snapshots::run_periodic(
            local,
            args.data_dir.clone(),
            args.snapshot_interval,
            args.snapshot_keep,
        ))
    });
    let serving = match secured {
        Some(s) => tokio::spawn(shepherd_apiserver::serve_tls(
            listener,
            router,
            limits,
            connection_metrics,
            s.tls,
            stopped(stop_rx.clone()),
        )),
        None => tokio::spawn(shepherd_apiserver::serve(listener, router, limits, connection_metrics, stopped(stop_rx.clone()))),
    };
    shutdown_signal().await;
    stop_tx.send_replace(true);
    // A second Ctrl-C (or SIGTERM) while the pods get their grace periods kills them at once.
    let hurry = tokio::spawn(async move {
        shutdown_signal().await;
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "killing the pods now");
        hurry_tx.send_replace(true);
    });
    if let Some(s) = snapshotter {
        s.abort();
    }
    let _ = controllers.await;
    if let Some((_, task)) = cluster_dns {
        let _ = task.await;
    }
    if let Some(task) = pod_network_dns {
        let _ = task.await;
    }
    if let Some(t) = agent_task
        && let Ok(Err(e)) = t.await
    {
        tracing::warn!(error = %e, "node agent stopped with an error");
    }
    hurry.abort();
    let served = serving.await;
    // Every writer has stopped: the store finishes what it took, checkpoints, and lets go of its
    // files (or of etcd), so the next start replays nothing.
    if let Err(e) = store.close().await {
        tracing::warn!(error = %e, "closing the store");
    }
    drop(control_rt);
    drop(scheduler_rt);
    drop(agent_rt);
    served??;
    tracing::info!("shut down cleanly");
    Ok(())
}

/// A runtime owned by async code (the controllers' beside the API's): dropped, it lets its tasks
/// go without waiting for them, on every way out of `run_server`, an early error included (a
/// runtime dropped the usual way inside another one's task would block, which tokio refuses with a
/// panic).
struct BackgroundRuntime(Option<tokio::runtime::Runtime>);

impl BackgroundRuntime {
    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("taken only on drop").handle()
    }
}

impl Drop for BackgroundRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The default of `--api-threads` and `--controller-threads`: the two share the machine's cores.
fn half_the_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1)
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Raises the soft open-file limit to the hard one (each connection, watch and container log
/// takes a descriptor; the usual soft default of 1024 is reached by a modest flood) and returns
/// the limit in force.
fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit write to and read from a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                tracing::debug!(from = limit.rlim_cur, to = limit.rlim_max, "open-file limit raised to its hard limit");
                limit = raised;
            } else {
                tracing::warn!(soft = limit.rlim_cur, hard = limit.rlim_max, "cannot raise the open-file limit");
            }
        }
    }
    limit.rlim_cur
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
