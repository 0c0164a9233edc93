//! `shepherd-bench`: starts real Shepherd processes, drives them through the public API only, and
//! writes what it measured as JSON under `bench/results/` and as Markdown on stdout.

mod apply_cost;
mod auth_cost;
mod autoscale;
mod cluster;
mod counting;
mod daemonset_rollout;
mod dashboard;
mod dns;
mod experiment;
mod failover;
mod job_throughput;
mod netns;
mod peer;
mod plot;
mod pod_density;
mod pod_io;
mod procstat;
mod report;
mod scale;
mod service_rules;
mod soak;
mod startup;
mod store;
mod validation_cost;
mod watch_fanout;
mod workloads;

use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "shepherd-bench", about = "Reproducible measurements of Shepherd")]
struct Cli {
    /// The `shepherd` binary to measure (build it with `cargo build --release`).
    #[arg(long, default_value = "target/release/shepherd")]
    shepherd: std::path::PathBuf,
    /// Where JSON results go.
    #[arg(long, default_value = "bench/results")]
    out: std::path::PathBuf,
    /// Run every scenario at a tiny size (CI's smoke check).
    #[arg(long)]
    smoke: bool,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Durable creates/s with 1 and 64 clients; list of N pods p50/p99; server RSS with N pods; on the
    /// embedded store (write-ahead log), the previous redb-only engine and etcd, side by side.
    Store {
        #[arg(long, default_value_t = 10_000)]
        pods: usize,
        #[arg(long, default_value_t = 2_000)]
        sequential: usize,
        #[arg(long, default_value_t = 100)]
        list_runs: usize,
        /// Serve TLS and authenticate every request by an administrator's token, as users run it.
        #[arg(long)]
        tls: bool,
    },
    /// The seeds' experiment: level (5 s, 60 s) vs edge vs hybrid (30 s) x 0/1/10% watch events
    /// lost, with the real Deployment and ReplicaSet controllers in-process; plus level mode at
    /// 1 s and 30 s for the resync-interval table.
    TriggerModes {
        #[arg(long, default_value_t = 1_000)]
        deployments: usize,
        /// Spec changes per second.
        #[arg(long, default_value_t = 5.0)]
        change_rate: f64,
        /// Seconds of changes per cell.
        #[arg(long, default_value_t = 20.0)]
        change_seconds: f64,
        /// Run only the cells whose mode label contains one of these comma-separated texts
        /// (e.g. `hybrid` or `edge,hybrid 30,anti-entropy`).
        #[arg(long)]
        only: Option<String>,
    },
    /// The same toy controller (Service annotation mirrored into an Endpoints object) on
    /// Shepherd's engine and on kube-runtime, each in a child process against `shepherd server`.
    Peer {
        #[arg(long, default_value_t = 1_000)]
        services: usize,
        #[arg(long, default_value_t = 50.0)]
        change_rate: f64,
        #[arg(long, default_value_t = 20.0)]
        change_seconds: f64,
        /// Runs, each measuring both engines (alternating which goes first).
        #[arg(long, default_value_t = 1)]
        runs: usize,
    },
    /// The web dashboard in headless Chromium on a cluster of N pods: first paint, time to live
    /// data, then frames and long tasks while pods change at a fixed rate.
    Dashboard {
        #[arg(long, default_value_t = 1_000)]
        nodes: usize,
        #[arg(long, default_value_t = 10_000)]
        pods: usize,
        /// Pod changes per second while the page watches.
        #[arg(long, default_value_t = 500.0)]
        change_rate: f64,
        #[arg(long, default_value_t = 20.0)]
        change_seconds: f64,
        /// Pod changes in flight at most (each on a connection of its own).
        #[arg(long, default_value_t = 256)]
        in_flight: usize,
        /// Write the page's CPU profile while pods change (Chrome's `.cpuprofile`) to this file,
        /// and print the functions that took the most time.
        #[arg(long)]
        profile: Option<std::path::PathBuf>,
        /// Extra argument for `shepherd server`; repeatable (e.g. `--server-arg=--cluster-cidr=10.128.0.0/9`).
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// `shepherd standalone`, Deployment of 3 `minimal`: delete a pod, time until its
    /// replacement is Running and Ready.
    SelfHeal {
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// The node's runtime: `process` or `oci` (runc; needs root).
        #[arg(long, default_value = "process")]
        runtime: String,
        /// Serve TLS and authenticate every request by an administrator's token, as users run it.
        #[arg(long)]
        tls: bool,
        /// Pods without the ServiceAccount token volume (`automountServiceAccountToken: false`), which
        /// TLS otherwise gives them: what the token request costs a replacement.
        #[arg(long)]
        no_token_volume: bool,
        /// An emptyDir mounted where the token volume goes (with `--no-token-volume`): what mounting
        /// a volume costs a replacement, apart from requesting its token.
        #[arg(long)]
        scratch_volume: bool,
    },
    /// `shepherd standalone`: apply a 3-replica Deployment, time until its 3 pods are Running
    /// and Ready.
    ApplyToRunning {
        #[arg(long, default_value_t = 30)]
        runs: usize,
        #[arg(long, default_value = "process")]
        runtime: String,
    },
    /// `shepherd standalone --runtime oci` with a local registry: ten pods of a cold image, the
    /// pull, a warm start (needs root and runc).
    Images {
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// N simulated nodes (one `shepherd agent` process), R replicas in D Deployments: time until
    /// all are Running and Ready, pods/s, control-plane peak RSS and CPU seconds.
    ScaleOut {
        #[arg(long, default_value_t = 1_000)]
        nodes: usize,
        /// Replicas in all, split evenly between the Deployments.
        #[arg(long, default_value_t = 10_000)]
        replicas: usize,
        /// The variant "10 x 1,000" is `--deployments 10`.
        #[arg(long, default_value_t = 1)]
        deployments: usize,
        /// Give up after this many seconds (the rate so far is still reported).
        #[arg(long, default_value_t = 300.0)]
        timeout_seconds: f64,
        /// Extra argument for `shepherd server` (repeatable), e.g. `--server-arg=--history-events=10000`.
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// scale-out, then the cluster left idle (CPU, RSS, store writes/s, API requests/s), then pod
    /// deletions at a fixed rate (DELETE latency, replacement latency).
    SteadyChurn {
        #[arg(long, default_value_t = 1_000)]
        nodes: usize,
        #[arg(long, default_value_t = 10_000)]
        replicas: usize,
        #[arg(long, default_value_t = 300.0)]
        timeout_seconds: f64,
        #[arg(long, default_value_t = 120.0)]
        idle_seconds: f64,
        #[arg(long, default_value_t = 60.0)]
        churn_seconds: f64,
        #[arg(long, default_value_t = 20.0)]
        deletions_per_second: f64,
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// Kubernetes' scalability limits on one machine: 150,000 pods on 5,000 simulated nodes (run
    /// by several agent processes) all Ready, then pod deletions at a fixed rate; the time it
    /// took, the control plane's peak RSS, DELETE and replacement latency against the SLOs.
    ScaleLimits {
        #[arg(long, default_value_t = 5_000)]
        nodes: usize,
        #[arg(long, default_value_t = 150_000)]
        pods: usize,
        /// The pods are split evenly between this many Deployments.
        #[arg(long, default_value_t = 150)]
        deployments: usize,
        /// Agent processes the simulated nodes are split between.
        #[arg(long, default_value_t = 5)]
        agents: usize,
        #[arg(long, default_value_t = 1_800.0)]
        timeout_seconds: f64,
        #[arg(long, default_value_t = 60.0)]
        churn_seconds: f64,
        #[arg(long, default_value_t = 20.0)]
        deletions_per_second: f64,
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// `shepherd standalone` (process runtime) under pod churn: a 10-replica Deployment, a pod
    /// deleted every 0.1 s for --duration; RSS, data dir size, fds, threads and processes sampled
    /// every 10 s, to see whether memory and disk level off.
    Soak {
        /// How long to churn: `300`, `300s`, `5m`, `30m`.
        #[arg(long, default_value = "30m", value_parser = soak::parse_duration)]
        duration: Duration,
        /// Seconds between pod deletions.
        #[arg(long, default_value_t = 0.1)]
        deletion_interval_seconds: f64,
        /// Extra argument for `shepherd standalone` (repeatable), e.g. `--server-arg=--event-ttl=60s`.
        #[arg(long, allow_hyphen_values = true)]
        server_arg: Vec<String>,
    },
    /// `shepherd server`: server CPU per request of server-side apply against a merge patch making
    /// the same change to one Deployment (N of each).
    ApplyCost {
        #[arg(long, default_value_t = 2_000)]
        requests: usize,
    },
    /// In process, no server: the API server's schema check per object for a Lease renewal and a
    /// Pod, in place against the typed round trip it replaced, and the whole validation of a write.
    ValidationCost {
        #[arg(long, default_value_t = 21)]
        batches: usize,
        #[arg(long, default_value_t = 2_000)]
        calls_per_batch: usize,
    },
    /// `shepherd server` three ways: plain HTTP without authentication, TLS with token
    /// authentication and RBAC over 1,000 RoleBindings, and that with an audit log: server CPU and
    /// latency per read and write.
    AuthCost {
        #[arg(long, default_value_t = 4_000)]
        requests: usize,
        #[arg(long, default_value_t = 8)]
        rounds: usize,
        #[arg(long, default_value_t = 1_000)]
        bindings: usize,
    },
    /// The API server's CPU per pod change with one `spec.nodeName=` watch per node open (each
    /// change goes to one of them), against the same changes with no watch open.
    WatchFanout {
        #[arg(long, default_value_t = 500)]
        watchers: usize,
        #[arg(long, default_value_t = 2_000)]
        pods: usize,
        #[arg(long, default_value_t = 4_000)]
        changes: usize,
    },
    /// `shepherd standalone` (process runtime, root): `kubectl exec -- true` round trip, `kubectl
    /// cp` both ways, `kubectl port-forward` download, ConfigMap change to file in the pod.
    /// Running pods on one standalone with the process runtime, and the memory each costs.
    PodDensity {
        #[arg(long, default_value_t = 500)]
        pods: usize,
        #[arg(long, default_value_t = 1)]
        clients: usize,
        #[arg(long, default_value_t = 600.0)]
        timeout_seconds: f64,
    },
    PodIo {
        #[arg(long, default_value_t = 100)]
        exec_runs: usize,
        #[arg(long, default_value_t = 100)]
        cp_mib: usize,
        #[arg(long, default_value_t = 100)]
        forward_mib: usize,
        #[arg(long, default_value_t = 30)]
        config_changes: usize,
    },
    /// `shepherd server --cluster-dns-listen` on loopback: one UDP client asking for a Service's
    /// A record in a loop; queries/s (median of runs) and latency.
    ClusterDns {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long, default_value_t = 20_000)]
        queries: usize,
    },
    /// `shepherd server` and `shepherd agent --pod-network bridge` in a network namespace of
    /// their own (root, nftables): N Services x M endpoints, then one endpoint change at a time:
    /// event to rule latency and the CPU (agent + nft) of each change, the resync's rebuild.
    ServiceRules {
        #[arg(long, default_value_t = 1_000)]
        services: usize,
        #[arg(long, default_value_t = 10)]
        endpoints: usize,
        #[arg(long, default_value_t = 30)]
        changes: usize,
        /// (internal) Measure here: already inside the scenario's namespace.
        #[arg(long, hide = true)]
        inside: bool,
    },
    /// What a newcomer waits for: `shepherd standalone` on its defaults (oci runtime, pod network,
    /// DNS) in a network namespace of its own, to the API ready, the node Ready and the cluster DNS
    /// answering; a 5 MB image import; a small web app from apply to Ready. Needs root and runc.
    Startup {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// (internal) Measure here: already inside the scenario's namespace.
        #[arg(long, hide = true)]
        inside: bool,
    },
    /// HorizontalPodAutoscaler reaction: from a pod starting to burn CPU to new pods Ready, on
    /// standalone with real processes.
    HpaReaction {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// The autoscaler's sync period, seconds (Kubernetes' default: 15).
        #[arg(long, default_value_t = 15.0)]
        sync_seconds: f64,
    },
    /// N simulated nodes, one Job of C short pods at parallelism P: time to Complete and pods/s.
    /// The defaults are a smoke size; the size is `--nodes 100 --completions 10000`.
    JobThroughput {
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        #[arg(long, default_value_t = 50)]
        completions: usize,
        #[arg(long, default_value_t = 10)]
        parallelism: usize,
        /// How long each pod runs once Running (ms).
        #[arg(long, default_value_t = 100)]
        pod_ms: u64,
        #[arg(long, default_value_t = 600.0)]
        timeout_seconds: f64,
    },
    /// A DaemonSet over N simulated nodes: time until every node has its pod Ready, then an image
    /// update's rolling update. The defaults are a smoke size; the size is `--nodes 1000`.
    DaemonsetRollout {
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        /// The rolling update's `maxUnavailable`: a count or a percentage (`10%`).
        #[arg(long, default_value = "1")]
        max_unavailable: String,
        #[arg(long, default_value_t = 600.0)]
        timeout_seconds: f64,
    },
    /// Two `shepherd controller-manager` candidates: `kill -9` the leader N times; time from each
    /// kill to the Lease taken over and to the first reconcile by the new leader.
    Failover {
        #[arg(long, default_value_t = 10)]
        kills: usize,
        #[arg(long, default_value = "15s")]
        lease_duration: String,
        #[arg(long, default_value = "10s")]
        renew_deadline: String,
        #[arg(long, default_value = "2s")]
        retry_period: String,
    },
    /// (internal) One peer-comparison variant; runs until stdin closes.
    #[command(hide = true)]
    PeerWorker {
        #[arg(long)]
        engine: String,
        #[arg(long)]
        url: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Scenario::PeerWorker { engine, url } = &cli.scenario {
        return peer::worker(engine, url).await;
    }
    if let Scenario::ServiceRules { services, endpoints, changes, inside: true } = cli.scenario {
        let p = service_rules::Params { services, endpoints, changes };
        return service_rules::inside(&cli.shepherd, &p).await;
    }
    if let Scenario::Startup { runs, inside: true } = cli.scenario {
        return startup::inside(&cli.shepherd, &startup::Params { runs }).await;
    }
    let machine = report::Machine::read();
    println!("machine: {machine}");
    let result = match cli.scenario {
        Scenario::Store { pods, sequential, list_runs, tls } => {
            let (pods, sequential, list_runs) = if cli.smoke { (200, 50, 5) } else { (pods, sequential, list_runs) };
            store::run(&cli.shepherd, pods, sequential, list_runs, tls).await?
        }
        Scenario::TriggerModes { deployments, change_rate, change_seconds, only } => {
            let mut params = if cli.smoke {
                experiment::Params::smoke()
            } else {
                experiment::Params::full(deployments, change_rate, change_seconds)
            };
            if let Some(only) = only {
                params.cells.retain(|c| only.split(',').any(|o| c.label.contains(o.trim())));
            }
            experiment::run(&params, &cli.out).await?
        }
        Scenario::Peer { services, change_rate, change_seconds, runs } => {
            let p = if cli.smoke {
                peer::Params { services: 20, change_rate: 10.0, change_phase: std::time::Duration::from_secs(2), runs: 1 }
            } else {
                peer::Params { services, change_rate, change_phase: std::time::Duration::from_secs_f64(change_seconds), runs: runs.max(1) }
            };
            peer::run(&cli.shepherd, p).await?
        }
        Scenario::SelfHeal { runs, runtime, tls, no_token_volume, scratch_volume } => {
            let runs = if cli.smoke { 3 } else { runs };
            workloads::self_heal(&cli.shepherd, runs, &runtime, tls, !no_token_volume, scratch_volume).await?
        }
        Scenario::ApplyToRunning { runs, runtime } => {
            workloads::apply_to_running(&cli.shepherd, if cli.smoke { 3 } else { runs }, &runtime).await?
        }
        Scenario::Images { runs } => workloads::images(&cli.shepherd, if cli.smoke { 1 } else { runs }).await?,
        Scenario::Dashboard { nodes, pods, change_rate, change_seconds, in_flight, profile, server_arg } => {
            let p = if cli.smoke {
                dashboard::DashboardParams {
                    nodes: 5, pods: 50, change_rate: 50.0, change_seconds: 2.0, in_flight, profile, server_args: server_arg,
                }
            } else {
                dashboard::DashboardParams { nodes, pods, change_rate, change_seconds, in_flight, profile, server_args: server_arg }
            };
            dashboard::run(&cli.shepherd, p).await?
        }
        Scenario::ScaleOut { nodes, replicas, deployments, timeout_seconds, server_arg } => {
            let (nodes, replicas) = if cli.smoke { (5, 20) } else { (nodes, replicas) };
            let p = scale::Params {
                nodes,
                replicas,
                deployments: deployments.clamp(1, replicas.max(1)),
                agents: 1,
                timeout: Duration::from_secs_f64(timeout_seconds),
                idle: Duration::ZERO,
                churn: Duration::ZERO,
                churn_rate: 20.0,
                server_args: server_arg,
            };
            scale::run_scale_out(&cli.shepherd, p).await?
        }
        Scenario::SteadyChurn { nodes, replicas, timeout_seconds, idle_seconds, churn_seconds, deletions_per_second, server_arg } => {
            let p = if cli.smoke {
                scale::Params {
                    nodes: 5,
                    replicas: 20,
                    deployments: 1,
                    agents: 1,
                    timeout: Duration::from_secs(60),
                    idle: Duration::from_secs(3),
                    churn: Duration::from_secs(2),
                    churn_rate: deletions_per_second,
                    server_args: server_arg.clone(),
                }
            } else {
                scale::Params {
                    nodes,
                    replicas,
                    deployments: 1,
                    agents: 1,
                    timeout: Duration::from_secs_f64(timeout_seconds),
                    idle: Duration::from_secs_f64(idle_seconds),
                    churn: Duration::from_secs_f64(churn_seconds),
                    churn_rate: deletions_per_second,
                    server_args: server_arg.clone(),
                }
            };
            scale::run_steady_churn(&cli.shepherd, p).await?
        }
        Scenario::ScaleLimits { nodes, pods, deployments, agents, timeout_seconds, churn_seconds, deletions_per_second, server_arg } => {
            let (nodes, pods, deployments, agents, churn_seconds) =
                if cli.smoke { (6, 30, 3, 2, 2.0) } else { (nodes, pods, deployments, agents, churn_seconds) };
            let p = scale::Params {
                nodes,
                replicas: pods,
                deployments: deployments.clamp(1, pods.max(1)),
                agents,
                timeout: Duration::from_secs_f64(timeout_seconds),
                idle: Duration::ZERO,
                churn: Duration::from_secs_f64(churn_seconds),
                churn_rate: deletions_per_second,
                server_args: server_arg,
            };
            scale::run_scale_limits(&cli.shepherd, p).await?
        }
        Scenario::Soak { duration, deletion_interval_seconds, server_arg } => {
            let (duration, sample_interval) =
                if cli.smoke { (Duration::from_secs(5), Duration::from_secs(1)) } else { (duration, Duration::from_secs(10)) };
            let p = soak::Params {
                duration,
                deletion_interval: Duration::from_secs_f64(deletion_interval_seconds.max(0.001)),
                sample_interval,
                server_args: server_arg,
            };
            soak::run(&cli.shepherd, p).await?
        }
        Scenario::ApplyCost { requests } => apply_cost::run(&cli.shepherd, if cli.smoke { 50 } else { requests }).await?,
        Scenario::WatchFanout { watchers, pods, changes } => {
            let p = if cli.smoke {
                watch_fanout::Params { watchers: 5, pods: 10, changes: 20 }
            } else {
                watch_fanout::Params { watchers, pods, changes }
            };
            watch_fanout::run(&cli.shepherd, p).await?
        }
        Scenario::ValidationCost { batches, calls_per_batch } => {
            let (batches, calls) = if cli.smoke { (3, 20) } else { (batches.max(1), calls_per_batch.max(1)) };
            validation_cost::run(batches, calls)?
        }
        Scenario::AuthCost { requests, rounds, bindings } => {
            let (requests, rounds, bindings) = if cli.smoke { (40, 2, 50) } else { (requests, rounds, bindings) };
            auth_cost::run(&cli.shepherd, requests, rounds, bindings).await?
        }
        Scenario::PodDensity { pods, clients, timeout_seconds } => {
            let p = pod_density::Params {
                pods: if cli.smoke { 10 } else { pods.max(1) },
                clients,
                timeout: Duration::from_secs_f64(timeout_seconds),
            };
            pod_density::run(&cli.shepherd, p).await?
        }
        Scenario::PodIo { exec_runs, cp_mib, forward_mib, config_changes } => {
            let p = if cli.smoke {
                pod_io::Params::smoke()
            } else {
                pod_io::Params { exec_runs, cp_mib, forward_mib, config_changes }
            };
            pod_io::run(&cli.shepherd, p).await?
        }
        Scenario::ClusterDns { runs, queries } => {
            let p = if cli.smoke { dns::Params { runs: 3, queries: 200 } } else { dns::Params { runs: runs.max(1), queries: queries.max(1) } };
            dns::run(&cli.shepherd, p).await?
        }
        Scenario::ServiceRules { services, endpoints, changes, .. } => {
            let p = if cli.smoke {
                service_rules::Params { services: 20, endpoints: 10, changes: 3 }
            } else {
                service_rules::Params { services: services.max(1), endpoints: endpoints.max(1), changes: changes.max(1) }
            };
            service_rules::run(&cli.shepherd, &cli.out, &p)?
        }
        Scenario::Startup { runs, .. } => {
            startup::run(&cli.shepherd, &cli.out, &startup::Params { runs: if cli.smoke { 1 } else { runs.max(1) } })?
        }
        Scenario::HpaReaction { runs, sync_seconds } => {
            let p = autoscale::Params { runs: if cli.smoke { 1 } else { runs.max(1) }, sync_seconds };
            autoscale::run(&cli.shepherd, p).await?
        }
        Scenario::JobThroughput { nodes, completions, parallelism, pod_ms, timeout_seconds } => {
            let (nodes, completions, parallelism) = if cli.smoke { (5, 50, 10) } else { (nodes, completions, parallelism) };
            let p = job_throughput::Params {
                nodes: nodes.max(1),
                completions: completions.max(1),
                parallelism: parallelism.max(1),
                pod_ms,
                timeout: Duration::from_secs_f64(timeout_seconds),
            };
            job_throughput::run(&cli.shepherd, p).await?
        }
        Scenario::DaemonsetRollout { nodes, max_unavailable, timeout_seconds } => {
            let nodes = if cli.smoke { 5 } else { nodes.max(1) };
            let p = daemonset_rollout::Params { nodes, max_unavailable, timeout: Duration::from_secs_f64(timeout_seconds) };
            daemonset_rollout::run(&cli.shepherd, p).await?
        }
        Scenario::Failover { kills, lease_duration, renew_deadline, retry_period } => {
            let p = if cli.smoke {
                failover::Params::smoke()
            } else {
                failover::Params { kills: kills.max(1), lease_duration, renew_deadline, retry_period }
            };
            failover::run(&cli.shepherd, p).await?
        }
        Scenario::PeerWorker { .. } => unreachable!("handled above"),
    };
    report::write(&cli.out, &machine, &result)?;
    Ok(())
}
