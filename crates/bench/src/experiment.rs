//! Scenario `trigger-modes`: the seeds' experiment. The real Deployment and ReplicaSet
//! controllers run in level, edge, hybrid and anti-entropy mode while a fraction of their watch events is lost;
//! we measure how fast spec changes converge, what never converges, and what each mode costs.
//!
//! Everything runs in this process: an API server over the in-memory store (the same service
//! layer the HTTP handlers call), the controllers on a `Manager` whose client counts every call,
//! a simulated kubelet that reports each new pod Running and Ready at once, a mutator that changes
//! Deployments at a fixed rate, and an observer that watches Deployments for convergence. Only the
//! controllers' informers lose events; the kubelet and the observer see every event.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rand::Rng;
use serde::Serialize;
use serde_json::{Value, json};
use shepherd_api::kinds::{DEPLOYMENT, POD};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_api::{meta, pod};
use shepherd_controllers::{ControllerConfig, deployment_controller, podutil, replicaset_controller};
use shepherd_runtime::{Client, ListParams, Manager, Patch, RunningManager, TriggerMode, WatchEvent};
use shepherd_store::{HistoryLimits, LocalStore};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::counting::{self, Counts};
use crate::report::{ScenarioResult, Summary, summarize};
use crate::{plot, procstat};

const NS: &str = "default";

/// One run: a trigger mode at one event-loss rate.
#[derive(Debug, Clone)]
pub struct Cell {
    pub label: String,
    pub mode: TriggerMode,
    pub loss: f64,
    /// How long to wait after the last change for stragglers (at least two periods of the mode).
    pub settle: Duration,
    /// Whether the cell belongs to the mode x loss grid (else only to the interval table).
    pub grid: bool,
}

#[derive(Debug, Clone)]
pub struct Params {
    pub deployments: usize,
    pub replicas: i64,
    /// Spec changes per second during the change phase.
    pub change_rate: f64,
    pub change_phase: Duration,
    pub workers: usize,
    pub cells: Vec<Cell>,
}

impl Params {
    /// The full experiment: the mode x loss grid, then level mode at other intervals at 0% loss
    /// for the resync-interval table (5 s and 60 s come from the grid).
    pub fn full(deployments: usize, change_rate: f64, change_secs: f64) -> Self {
        let mut cells = Vec::new();
        for loss in [0.0, 0.01, 0.1] {
            // A rollout needs several ticks (Deployment, ReplicaSet, status, each at its tick), so
            // level 5 s gets 60 s to finish; level 60 s gets two periods, as the issue asks.
            cells.push(cell("level 5 s", TriggerMode::level().with_period(secs(5.0)), loss, secs(60.0), true));
            cells.push(cell("level 60 s", TriggerMode::level().with_period(secs(60.0)), loss, secs(120.0), true));
            // Edge has no period; 30 s is over a hundred times its p99 at 0% loss.
            cells.push(cell("edge", TriggerMode::edge(), loss, secs(30.0), true));
            cells.push(cell("hybrid 30 s", TriggerMode::hybrid().with_period(secs(30.0)), loss, secs(60.0), true));
            // Digest checks every second, the full resync at its 10 minute default (never, here).
            cells.push(cell("anti-entropy 1 s", TriggerMode::anti_entropy().with_period(secs(1.0)), loss, secs(30.0), true));
        }
        cells.push(cell("level 1 s", TriggerMode::level().with_period(secs(1.0)), 0.0, secs(20.0), false));
        cells.push(cell("level 30 s", TriggerMode::level().with_period(secs(30.0)), 0.0, secs(60.0), false));
        Params { deployments, replicas: 2, change_rate, change_phase: secs(change_secs), workers: 4, cells }
    }

    /// Seconds, not minutes: three cells at a tiny size (CI).
    pub fn smoke() -> Self {
        let cells = vec![
            cell("level 1 s", TriggerMode::level().with_period(secs(1.0)), 0.0, secs(6.0), true),
            cell("edge", TriggerMode::edge(), 0.1, secs(2.0), true),
            cell("hybrid 1 s", TriggerMode::hybrid().with_period(secs(1.0)), 0.1, secs(2.0), true),
            cell("anti-entropy 1 s", TriggerMode::anti_entropy().with_period(secs(1.0)), 0.1, secs(3.0), true),
        ];
        Params { deployments: 20, replicas: 2, change_rate: 5.0, change_phase: secs(2.0), workers: 2, cells }
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn cell(label: &str, mode: TriggerMode, loss: f64, settle: Duration, grid: bool) -> Cell {
    Cell { label: label.to_string(), mode, loss, settle, grid }
}

#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    pub mode: String,
    pub period_s: Option<f64>,
    pub loss: f64,
    pub grid: bool,
    pub changes: usize,
    pub latency: Summary,
    /// Changes whose Deployment had not converged when the run ended (after the settle wait).
    pub never_converged: usize,
    /// Deployments whose final status does not match their spec, read from the API at the end.
    pub unconverged_at_end: usize,
    /// The measured window: change phase plus the whole settle wait.
    pub window_s: f64,
    /// Rates over the window (same changes, same length for every cell of a mode).
    pub api_reads_per_min: f64,
    pub listed_objects_per_min: f64,
    pub api_writes_per_min: f64,
    pub reconciles_per_min: f64,
    /// CPU seconds of the whole process (API server, store, kubelet and observer included) over
    /// the window.
    pub cpu_seconds: f64,
    /// Rates over the settle wait alone, when no spec changes: the cost of the trigger mode itself.
    pub idle_api_reads_per_min: f64,
    pub idle_listed_objects_per_min: f64,
    /// Digest requests (anti-entropy checks; no object bodies).
    pub idle_digests_per_min: f64,
    pub idle_reconciles_per_min: f64,
    pub idle_cpu_seconds_per_min: f64,
    pub calls: Counts,
    pub dropped_watch_events: f64,
    pub load_average: f64,
    /// Every latency, sorted, in milliseconds (for the plot).
    pub latencies_ms: Vec<f64>,
}

pub async fn run(p: &Params, out: &std::path::Path) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario trigger-modes: deployments={} replicas={} change_rate={}/s change_phase={:?} workers={} (rates over change phase + settle wait)",
        p.deployments, p.replicas, p.change_rate, p.change_phase, p.workers
    );
    println!(
        "| mode | loss | changes | p50 ms | p99 ms | mean ms | never converged | API reads/min | idle reads/min | idle listed/min | idle digests/min | reconciles/min | CPU s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for c in &p.cells {
        let r = run_cell(p, c).await?;
        println!(
            "| {} | {}% | {} | {:.1} | {:.1} | {:.1} | {} ({} at end) | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} |",
            r.mode,
            r.loss * 100.0,
            r.changes,
            r.latency.p50_ms,
            r.latency.p99_ms,
            r.latency.mean_ms,
            r.never_converged,
            r.unconverged_at_end,
            r.api_reads_per_min,
            r.idle_api_reads_per_min,
            r.idle_listed_objects_per_min,
            r.idle_digests_per_min,
            r.reconciles_per_min,
            r.cpu_seconds
        );
        results.push(r);
    }
    std::fs::create_dir_all(out)?;
    let svg = plot::latency_cdf_svg(&results);
    let svg_path = out.join("trigger-modes.svg");
    std::fs::write(&svg_path, svg)?;
    println!("wrote {}", svg_path.display());
    let params = json!({
        "deployments": p.deployments, "replicas": p.replicas, "change_rate_per_s": p.change_rate,
        "change_phase_s": p.change_phase.as_secs_f64(), "workers": p.workers,
        "cells": p.cells.iter().map(|c| json!({"mode": c.label, "loss": c.loss, "settle_s": c.settle.as_secs_f64()})).collect::<Vec<_>>(),
    });
    Ok(ScenarioResult { name: "trigger-modes", params, values: json!({ "cells": results }) })
}

/// Whether a Deployment's status shows generation `generation` fully rolled out and ready.
fn converged(d: &Value, generation: i64) -> bool {
    let int = |ptr: &str| d.pointer(ptr).and_then(Value::as_i64).unwrap_or(0);
    let want = d.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    int("/status/observedGeneration") >= generation
        && int("/status/updatedReplicas") == want
        && int("/status/readyReplicas") == want
        && int("/status/availableReplicas") == want
        && int("/status/replicas") == want
}

fn deployment(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "minimal"}]}}}})
}

/// A manager running the Deployment and ReplicaSet controllers until stopped.
struct Running(RunningManager);

impl Running {
    fn start(client: Arc<dyn Client>, cfg: ControllerConfig, loss: f64) -> Self {
        let manager = Manager::new(client.clone());
        manager.informers().watch_faults().set_drop_fraction(loss);
        manager.add(replicaset_controller(client.clone(), &manager, &cfg).shutdown_grace(Duration::from_secs(1)));
        manager.add(deployment_controller(client, &manager, &cfg).shutdown_grace(Duration::from_secs(1)));
        Running(manager.spawn())
    }

    /// Sum of `controller_reconcile_total` over controllers and results, and dropped watch events.
    fn reconciles_and_drops(&self) -> (f64, f64) {
        let mut registry = prometheus_client::registry::Registry::default();
        self.0.manager().metrics().register(&mut registry);
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
            return (0.0, 0.0);
        }
        let sum = |prefix: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                .sum()
        };
        (sum("controller_reconcile_total{"), sum("informer_dropped_events_total"))
    }

    async fn stop(self) {
        self.0.stop().await
    }
}

/// Reports every pod Running and Ready as soon as it appears, as a kubelet with instant
/// containers would. Sees every event (no fault injection on its watch).
async fn kubelet(client: Arc<dyn Client>) {
    loop {
        let Ok(list) = client.list(&POD, &ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        for p in &list.items {
            start_pod(&client, p);
        }
        let Ok(mut events) = client.watch(&POD, &ListParams::default(), list.resource_version).await else { continue };
        while let Some(Ok(event)) = events.next().await {
            if let WatchEvent::Added(p) | WatchEvent::Modified(p) = event {
                start_pod(&client, &p);
            }
        }
    }
}

fn start_pod(client: &Arc<dyn Client>, pod: &Value) {
    if pod::is_ready(pod) || !pod::is_active(pod) || meta::is_deleting(pod) {
        return;
    }
    let (client, name) = (client.clone(), meta::name(pod).to_string());
    tokio::spawn(async move {
        let now = podutil::format_time(podutil::now());
        let status = json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "minimal", "imageID": "",
                "state": {"running": {"startedAt": now}}}]}});
        let _ = client.patch_status(&POD, Some(NS), &name, Patch::Merge(status)).await;
    });
}

/// Changes waiting to be seen converged, and the latencies of those that were.
#[derive(Default)]
struct Tracker {
    /// Deployment name -> (generation of the change, when it was made).
    pending: HashMap<String, (i64, Instant)>,
    latencies: Vec<Duration>,
    replicas: HashMap<String, i64>,
}

impl Tracker {
    fn observe(&mut self, d: &Value) {
        let name = meta::name(d);
        if let Some((generation, at)) = self.pending.get(name)
            && converged(d, *generation)
        {
            self.latencies.push(at.elapsed());
            self.pending.remove(name);
        }
    }
}

/// Watches Deployments and resolves pending changes the moment their status shows convergence.
async fn observer(client: Arc<dyn Client>, tracker: Arc<Mutex<Tracker>>) {
    loop {
        let Ok(list) = client.list(&DEPLOYMENT, &ListParams::namespace(NS)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        {
            let mut t = tracker.lock().await;
            list.items.iter().for_each(|d| t.observe(d));
        }
        let Ok(mut events) = client.watch(&DEPLOYMENT, &ListParams::namespace(NS), list.resource_version).await else {
            continue;
        };
        while let Some(Ok(event)) = events.next().await {
            if let WatchEvent::Added(d) | WatchEvent::Modified(d) = event {
                tracker.lock().await.observe(&d);
            }
        }
    }
}

/// Makes one random spec change to a Deployment with no change in flight: half of them set a
/// new replica count (1..=3), half change an annotation of the pod template (a rollout).
async fn change_one(client: &Arc<dyn Client>, tracker: &Mutex<Tracker>, names: &[String], serial: usize) -> anyhow::Result<bool> {
    let mut t = tracker.lock().await;
    let mut rng = rand::rng();
    let Some(name) = (0..50).map(|_| &names[rng.random_range(0..names.len())]).find(|n| !t.pending.contains_key(*n)) else {
        return Ok(false);
    };
    let patch = if rng.random_bool(0.5) {
        let current = t.replicas.get(name).copied().unwrap_or(2);
        let mut next = rng.random_range(1..=3);
        if next == current {
            next = if current == 3 { 1 } else { current + 1 };
        }
        t.replicas.insert(name.clone(), next);
        json!({"spec": {"replicas": next}})
    } else {
        json!({"spec": {"template": {"metadata": {"annotations": {"bench.shepherd.io/change": serial.to_string()}}}}})
    };
    let at = Instant::now();
    let updated = client.patch(&DEPLOYMENT, Some(NS), name, Patch::Merge(patch)).await?;
    t.pending.insert(name.clone(), (meta::generation(&updated), at));
    Ok(true)
}

async fn unconverged(client: &Arc<dyn Client>) -> anyhow::Result<usize> {
    let list = client.list(&DEPLOYMENT, &ListParams::namespace(NS)).await?;
    Ok(list.items.iter().filter(|d| !converged(d, meta::generation(d))).count())
}

async fn wait_converged(client: &Arc<dyn Client>, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let left = unconverged(client).await?;
        if left == 0 {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < limit, "setup: {left} Deployments not converged after {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run_cell(p: &Params, c: &Cell) -> anyhow::Result<CellResult> {
    let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
    let server = ApiServer::new(store, HttpConfig::default()).await?;
    let raw: Arc<dyn Client> = Arc::new(server.client());
    let kubelet = tokio::spawn(kubelet(raw.clone()));

    // Setup, not measured: every Deployment created and converged by an edge-mode manager.
    let names: Vec<String> = (0..p.deployments).map(|i| format!("d{i}")).collect();
    for n in &names {
        raw.create(&DEPLOYMENT, Some(NS), deployment(n, p.replicas)).await?;
    }
    let setup = Running::start(raw.clone(), ControllerConfig { workers: p.workers, mode: TriggerMode::edge() }, 0.0);
    wait_converged(&raw, Duration::from_secs(300)).await?;
    setup.stop().await;

    let tracker = Arc::new(Mutex::new(Tracker {
        replicas: names.iter().map(|n| (n.clone(), p.replicas)).collect(),
        ..Tracker::default()
    }));
    let observer = tokio::spawn(observer(raw.clone(), tracker.clone()));

    let (counting, counters) = counting::wrap(raw.clone());
    let running = Running::start(counting, ControllerConfig { workers: p.workers, mode: c.mode }, c.loss);
    tokio::time::sleep(Duration::from_secs(1)).await; // informers synced, first pass done

    let calls0 = counters.snapshot();
    let cpu0 = procstat::cpu_seconds("self");
    let (rec0, drop0) = running.reconciles_and_drops();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / p.change_rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = 0;
    while started.elapsed() < p.change_phase {
        ticker.tick().await;
        if change_one(&raw, &tracker, &names, changes).await? {
            changes += 1;
        }
    }
    let calls_changed = counters.snapshot();
    let (rec_changed, _) = running.reconciles_and_drops();
    let cpu_changed = procstat::cpu_seconds("self");

    // The settle wait always runs to its end, so every cell of a mode is measured over the same
    // window and the periodic work (ticks, resyncs) is inside it.
    tokio::time::sleep(c.settle).await;
    let window = started.elapsed().as_secs_f64() / 60.0;
    let settle_min = c.settle.as_secs_f64() / 60.0;
    let now = counters.snapshot();
    let calls = now.since(&calls0);
    let settle_calls = now.since(&calls_changed);
    let cpu_now = procstat::cpu_seconds("self");
    let (rec1, drop1) = running.reconciles_and_drops();
    let load_average = procstat::load_average();
    let unconverged_at_end = unconverged(&raw).await?;
    running.stop().await;
    observer.abort();
    kubelet.abort();

    let t = tracker.lock().await;
    let latency = summarize(&t.latencies);
    let mut latencies_ms: Vec<f64> = t.latencies.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    latencies_ms.sort_by(|a, b| a.total_cmp(b));
    Ok(CellResult {
        mode: c.label.clone(),
        period_s: c.mode.period().map(|d| d.as_secs_f64()),
        loss: c.loss,
        grid: c.grid,
        changes,
        latency,
        never_converged: t.pending.len(),
        unconverged_at_end,
        window_s: window * 60.0,
        api_reads_per_min: calls.reads() as f64 / window,
        listed_objects_per_min: calls.listed_objects as f64 / window,
        api_writes_per_min: calls.writes as f64 / window,
        reconciles_per_min: (rec1 - rec0) / window,
        cpu_seconds: cpu_now - cpu0,
        idle_api_reads_per_min: settle_calls.reads() as f64 / settle_min,
        idle_listed_objects_per_min: settle_calls.listed_objects as f64 / settle_min,
        idle_digests_per_min: settle_calls.digests as f64 / settle_min,
        idle_reconciles_per_min: (rec1 - rec_changed) / settle_min,
        idle_cpu_seconds_per_min: (cpu_now - cpu_changed) / settle_min,
        calls,
        dropped_watch_events: drop1 - drop0,
        load_average,
        latencies_ms,
    })
}
