//! The controllers and scheduler of `shepherd server` and `standalone`, and their flags.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use shepherd_controllers::disruption::disruption_controller;
use shepherd_controllers::endpoints::{ClusterIpConfig, ServiceIpRange, cluster_ip_allocator, endpoints_controller};
use shepherd_controllers::endpointslice::endpoint_slice_controller;
use shepherd_controllers::nodeipam::{ClusterCidr, NodeIpamConfig, node_ipam_controller};
use shepherd_controllers::nodelifecycle::{NodeLifecycleConfig, node_lifecycle_controller};
use shepherd_controllers::scheduler::{SchedulerConfig, scheduler};
use shepherd_controllers::taintmanager::taint_manager;
use shepherd_controllers::{ControllerConfig, deployment_controller, garbage_collector, replicaset_controller};
use shepherd_runtime::{Client, Manager, TriggerMode};

/// Every controller `shepherd` runs, by the name used in flags.
pub const CONTROLLERS: &[&str] = &["deployment", "replicaset", "endpoints", "endpointslice", "clusterip", "nodelifecycle",
    "nodeipam", "taint-eviction", "disruption", "garbagecollector", "scheduler", "serviceaccount", "job", "cronjob",
    "daemonset", "statefulset", "replicationcontroller", "horizontalpodautoscaler", "root-ca-cert-publisher",
    "clusterrole-aggregation"];

/// The scheduler's default workers: placement is serialized, so they are the binds in flight.
/// kube-scheduler binds each pod in a goroutine of its own; 16 kept a scale-out of 10,000 pods
/// waiting on the binds (thousands of pods queued while the store wrote ~7,000/s), 64 do not.
const SCHEDULER_WORKERS: usize = 64;

#[derive(Args, Clone, Debug)]
pub struct ControllerArgs {
    /// Controllers to run: `all`, `none`, or a comma-separated list of deployment, replicaset,
    /// endpoints, endpointslice, clusterip, nodelifecycle, nodeipam, taint-eviction, disruption,
    /// garbagecollector, scheduler, job, cronjob, daemonset, statefulset, replicationcontroller,
    /// horizontalpodautoscaler, root-ca-cert-publisher, clusterrole-aggregation.
    #[arg(long, default_value = "all")]
    pub controllers: String,
    /// Default trigger mode: `hybrid` (events plus periodic resync), `level` (re-list on a
    /// ticker only), `edge` (events only) or `anti-entropy` (events plus digest checks that
    /// repair what a lost event left stale, plus a rare resync).
    #[arg(long, default_value = "hybrid")]
    pub controller_mode: TriggerMode,
    /// Resync period in hybrid and anti-entropy mode, tick interval in level mode (seconds).
    /// Defaults: hybrid 300, anti-entropy 600, level 5.
    #[arg(long)]
    pub resync_seconds: Option<f64>,
    /// Digest check interval in anti-entropy mode (seconds; default 1).
    #[arg(long)]
    pub anti_entropy_seconds: Option<f64>,
    /// Default workers per controller (the scheduler has at least 64: its binds in flight).
    #[arg(long, default_value_t = 4)]
    pub controller_workers: usize,
    /// Per-controller override, repeatable: `NAME:mode=level,interval=5,workers=2`.
    #[arg(long = "controller", value_name = "NAME:SETTINGS")]
    pub overrides: Vec<String>,
    /// A node whose lease is older than this is Ready=Unknown and tainted (seconds).
    #[arg(long, default_value_t = 40.0)]
    pub node_grace_seconds: f64,
    /// How long an unknown node keeps its pods before they are evicted (seconds).
    #[arg(long, default_value_t = 60.0)]
    pub pod_eviction_seconds: f64,
    /// Range Services' cluster IPs are allocated from.
    #[arg(long, default_value = "10.96.0.0/16")]
    pub service_cluster_ip_range: String,
    /// Ports Services of type NodePort (and LoadBalancer) get their `nodePort`s from (FIRST-LAST).
    #[arg(long, default_value = "30000-32767")]
    pub service_node_port_range: String,
    /// Range pod addresses come from; each Node gets one block of it as its `spec.podCIDR`.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: String,
    /// Prefix length of each Node's block of `--cluster-cidr`.
    #[arg(long, default_value_t = 24)]
    pub node_cidr_mask_size: u32,
    /// The Job controller's back-off before re-creating a failed pod, doubled per further
    /// failure up to six minutes (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub job_backoff_seconds: f64,
    /// How often each HorizontalPodAutoscaler is evaluated (seconds; kube-controller-manager's
    /// --horizontal-pod-autoscaler-sync-period).
    #[arg(long, default_value_t = 15.0)]
    pub hpa_sync_seconds: f64,
    /// Fault injection for experiments: drop this fraction (0..1) of watch events before they
    /// reach the controllers' caches.
    #[arg(long, default_value_t = 0.0)]
    pub drop_watch_events: f64,
    /// The cluster CA (PEM) the root-ca-cert-publisher publishes as `kube-root-ca.crt`; without
    /// one (a server without TLS) that controller does not run.
    #[arg(skip)]
    pub root_ca_pem: Option<String>,
}

fn seconds(s: f64) -> anyhow::Result<Duration> {
    if s > 0.0 && s.is_finite() {
        Ok(Duration::from_secs_f64(s))
    } else {
        bail!("a resync or check interval must be a positive number of seconds, not {s}")
    }
}

fn with_period(mode: TriggerMode, period: Option<f64>) -> anyhow::Result<TriggerMode> {
    Ok(match period {
        None => mode,
        Some(s) => mode.with_period(seconds(s)?),
    })
}

/// `mode` with the periods of `--resync-seconds` (hybrid's resync, level's tick, anti-entropy's
/// full resync) and `--anti-entropy-seconds` (anti-entropy's check interval).
fn tuned(mode: TriggerMode, resync: Option<f64>, check: Option<f64>) -> anyhow::Result<TriggerMode> {
    match mode {
        TriggerMode::AntiEntropy { check: c, resync: r } => Ok(TriggerMode::AntiEntropy {
            check: check.map(seconds).transpose()?.unwrap_or(c),
            resync: resync.map(seconds).transpose()?.unwrap_or(r),
        }),
        other => with_period(other, resync),
    }
}

impl ControllerArgs {
    fn enabled(&self) -> anyhow::Result<Vec<&'static str>> {
        match self.controllers.trim() {
            "all" => Ok(CONTROLLERS.to_vec()),
            "none" | "" => Ok(Vec::new()),
            list => list
                .split(',')
                .map(|n| {
                    let n = n.trim();
                    CONTROLLERS.iter().find(|c| **c == n).copied().with_context(|| {
                        format!("unknown controller {n:?} in --controllers; known: {}", CONTROLLERS.join(", "))
                    })
                })
                .collect(),
        }
    }

    /// The run settings of each controller: the defaults, then its `--controller` override.
    fn configs(&self) -> anyhow::Result<HashMap<&'static str, ControllerConfig>> {
        let base = ControllerConfig {
            workers: self.controller_workers.max(1),
            mode: tuned(self.controller_mode, self.resync_seconds, self.anti_entropy_seconds)?,
        };
        let mut out: HashMap<&'static str, ControllerConfig> = CONTROLLERS.iter().map(|c| (*c, base)).collect();
        // The scheduler decides one pod at a time; its workers are the binds waiting on the store.
        if let Some(cfg) = out.get_mut("scheduler") {
            cfg.workers = cfg.workers.max(SCHEDULER_WORKERS);
        }
        for o in &self.overrides {
            let (name, settings) = o.split_once(':').with_context(|| format!("--controller {o:?}: expected NAME:key=value,..."))?;
            let name = CONTROLLERS
                .iter()
                .find(|c| **c == name)
                .with_context(|| format!("--controller {o:?}: unknown controller {name:?}"))?;
            let cfg = out.entry(name).or_insert(base);
            let mut interval = None;
            for kv in settings.split(',').filter(|s| !s.is_empty()) {
                let (k, v) = kv.split_once('=').with_context(|| format!("--controller {o:?}: {kv:?} is not key=value"))?;
                match k {
                    "mode" => cfg.mode = v.parse().map_err(|e: String| anyhow::anyhow!("--controller {o:?}: {e}"))?,
                    "workers" => cfg.workers = v.parse::<usize>().with_context(|| format!("--controller {o:?}: workers"))?.max(1),
                    "interval" | "resync" => interval = Some(v.parse::<f64>().with_context(|| format!("--controller {o:?}: {k}"))?),
                    other => bail!("--controller {o:?}: unknown setting {other:?} (mode, workers, interval)"),
                }
            }
            // `interval` is the mode's own period (for anti-entropy, the check interval).
            cfg.mode = match interval {
                Some(_) => with_period(cfg.mode, interval)?,
                None => tuned(cfg.mode, self.resync_seconds, self.anti_entropy_seconds)?,
            };
        }
        Ok(out)
    }

    /// Adds the enabled controllers to `manager`; the scheduler writes through `scheduler_client`,
    /// the others through `client`. The scheduler runs on `scheduler_runtime` when given one.
    pub fn install(
        &self,
        client: Arc<dyn Client>,
        scheduler_client: Arc<dyn Client>,
        manager: &Manager,
        scheduler_runtime: Option<tokio::runtime::Handle>,
    ) -> anyhow::Result<Vec<&'static str>> {
        let enabled = self.enabled()?;
        let configs = self.configs()?;
        let range: ServiceIpRange = self.service_cluster_ip_range.parse()?;
        let cluster_cidr = ClusterCidr::new(&self.cluster_cidr, self.node_cidr_mask_size)?;
        if cluster_cidr.overlaps(&self.service_cluster_ip_range) {
            bail!(
                "--cluster-cidr {} overlaps --service-cluster-ip-range {}: pods and Services need separate ranges",
                self.cluster_cidr,
                self.service_cluster_ip_range
            );
        }
        if !(0.0..=1.0).contains(&self.drop_watch_events) {
            bail!("--drop-watch-events must be between 0 and 1");
        }
        manager.informers().watch_faults().set_drop_fraction(self.drop_watch_events);
        for name in &enabled {
            let cfg = configs[name];
            match *name {
                "deployment" => {
                    manager.add(deployment_controller(client.clone(), manager, &cfg));
                }
                "replicaset" => {
                    manager.add(replicaset_controller(client.clone(), manager, &cfg));
                }
                "endpoints" => {
                    manager.add(endpoints_controller(client.clone(), manager, cfg));
                }
                "endpointslice" => {
                    manager.add(endpoint_slice_controller(client.clone(), manager, cfg));
                }
                "taint-eviction" => {
                    manager.add(taint_manager(client.clone(), manager, cfg));
                }
                "disruption" => {
                    manager.add(disruption_controller(client.clone(), manager, cfg));
                }
                "serviceaccount" => {
                    manager.add(shepherd_controllers::serviceaccount::service_account_controller(client.clone(), manager, cfg));
                }
                "root-ca-cert-publisher" => {
                    if let Some(pem) = &self.root_ca_pem {
                        manager.add(shepherd_controllers::rootcacertpublisher::root_ca_cert_publisher(
                            client.clone(),
                            manager,
                            cfg,
                            pem.clone(),
                        ));
                    }
                }
                "clusterrole-aggregation" => {
                    manager.add(shepherd_controllers::clusterroleaggregation::clusterrole_aggregation_controller(
                        client.clone(),
                        manager,
                        cfg,
                    ));
                }
                "clusterip" => {
                    manager.add(cluster_ip_allocator(client.clone(), manager, ClusterIpConfig { run: cfg, range }));
                }
                "nodelifecycle" => {
                    let config = NodeLifecycleConfig {
                        run: cfg,
                        grace_period: Duration::from_secs_f64(self.node_grace_seconds.max(0.1)),
                        eviction_timeout: Duration::from_secs_f64(self.pod_eviction_seconds.max(0.0)),
                        ..NodeLifecycleConfig::default()
                    };
                    manager.add(node_lifecycle_controller(client.clone(), manager, config));
                }
                "nodeipam" => {
                    manager.add(node_ipam_controller(client.clone(), manager, NodeIpamConfig { run: cfg, cidr: cluster_cidr }));
                }
                "job" => {
                    let job = shepherd_controllers::job::JobConfig {
                        backoff_base: Duration::from_secs_f64(self.job_backoff_seconds.clamp(0.0, 360.0)),
                        ..Default::default()
                    };
                    manager.add(shepherd_controllers::job::job_controller(client.clone(), manager, &cfg, job));
                }
                "horizontalpodautoscaler" => {
                    let config = shepherd_controllers::podautoscaler::AutoscalerConfig {
                        run: cfg,
                        sync_period: Duration::from_secs_f64(self.hpa_sync_seconds.clamp(0.1, 3600.0)),
                        ..Default::default()
                    };
                    manager.add(shepherd_controllers::podautoscaler::horizontal_pod_autoscaler_controller(
                        client.clone(),
                        manager,
                        config,
                    ));
                }
                "cronjob" => {
                    manager.add(shepherd_controllers::cronjob::cronjob_controller(client.clone(), manager, &cfg));
                }
                "daemonset" => {
                    manager.add(shepherd_controllers::daemonset::daemonset_controller(client.clone(), manager, &cfg));
                }
                "replicationcontroller" => {
                    manager.add(shepherd_controllers::replicaset::replication_controller(client.clone(), manager, &cfg));
                }
                "statefulset" => {
                    manager.add(shepherd_controllers::statefulset::statefulset_controller(client.clone(), manager, &cfg));
                }
                "garbagecollector" => {
                    for c in garbage_collector(client.clone(), manager, &cfg) {
                        manager.add(c);
                    }
                }
                "scheduler" => {
                    let config = SchedulerConfig { run: cfg, ..SchedulerConfig::default() };
                    let scheduler = scheduler(scheduler_client.clone(), manager, config);
                    manager.add(match &scheduler_runtime {
                        Some(runtime) => scheduler.on_runtime(runtime.clone()),
                        None => scheduler,
                    });
                }
                _ => {}
            }
        }
        Ok(enabled)
    }
}
