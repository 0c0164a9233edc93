//! Scenario `peer`: one toy controller written twice, on Shepherd's engine and on kube-runtime's
//! `Controller`, both run as remote controllers (a child process each) against a real
//! `shepherd server --controllers none` over HTTP.
//!
//! The toy: every Service has an Endpoints object of the same name whose annotation
//! `bench.shepherd.io/mirror` equals the Service's annotation `bench.shepherd.io/value`. Both
//! variants read the Service from their informer cache, GET the Endpoints, and create or
//! merge-patch it when it differs. Neither watches Endpoints; neither resyncs during the run.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use rand::Rng;
use serde_json::{Value, json};
use shepherd_api::kinds::{ENDPOINTS, SERVICE};
use shepherd_api::meta;
use shepherd_client::RemoteClient;
use shepherd_runtime::{Action, Client, Controller, ListParams, Manager, Patch, WatchEvent};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::procstat;
use crate::report::{ScenarioResult, median, summarize};
use crate::scale;

const NS: &str = "default";
const VALUE: &str = "bench.shepherd.io/value";
const MIRROR: &str = "bench.shepherd.io/mirror";
/// Reconciles at once, the same for both engines.
const CONCURRENCY: usize = 8;

#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub services: usize,
    pub change_rate: f64,
    pub change_phase: Duration,
    /// Each run measures both engines, alternating which goes first.
    pub runs: usize,
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS, "annotations": {VALUE: "0"}},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}})
}

/// What the toy writes: the Endpoints `name` with `value` mirrored into its annotation.
async fn mirror(client: &dyn Client, name: &str, value: &str) -> Result<(), shepherd_api::ApiError> {
    match client.get(&ENDPOINTS, Some(NS), name).await {
        Ok(ep) if ep.pointer(&format!("/metadata/annotations/{}", MIRROR.replace('/', "~1"))).and_then(Value::as_str) == Some(value) => Ok(()),
        Ok(_) => {
            let patch = json!({"metadata": {"annotations": {MIRROR: value}}});
            client.patch(&ENDPOINTS, Some(NS), name, Patch::Merge(patch)).await.map(|_| ())
        }
        Err(e) if e.is_not_found() => {
            let ep = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name, "namespace": NS, "annotations": {MIRROR: value}}});
            client.create(&ENDPOINTS, Some(NS), ep).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

fn value_of(obj: &Value, annotation: &str) -> Option<String> {
    obj.pointer("/metadata/annotations").and_then(|a| a.get(annotation)).and_then(Value::as_str).map(str::to_string)
}

/// The child process: runs one variant against `url` until its stdin closes, then prints
/// `{"reconciles": N}` on stdout.
pub async fn worker(engine: &str, url: &str) -> anyhow::Result<()> {
    let reconciles = Arc::new(AtomicU64::new(0));
    let client = Arc::new(RemoteClient::connect(url, None)?);
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {}
    });
    match engine {
        "shepherd" => {
            let manager = Manager::new(client.clone());
            let services = manager.informers().cache(&SERVICE);
            let (c, count) = (client.clone(), reconciles.clone());
            manager.add(
                Controller::new("mirror", &SERVICE, move |key: String| {
                    let (c, services, count) = (c.clone(), services.clone(), count.clone());
                    async move {
                        count.fetch_add(1, Ordering::Relaxed);
                        let Some(svc) = services.get(&key) else { return Ok(Action::Done) };
                        let value = value_of(&svc, VALUE).unwrap_or_default();
                        mirror(c.as_ref(), meta::name(&svc), &value).await?;
                        Ok(Action::Done)
                    }
                })
                .workers(CONCURRENCY),
            );
            manager
                .run(async {
                    let _ = stdin_closed.await;
                })
                .await;
        }
        "kube" => {
            use k8s_openapi::api::core::v1::Service;
            use kube::runtime::controller::{Action as KubeAction, Config, Controller as KubeController};
            use kube::runtime::watcher;
            let api: kube::Api<Service> = kube::Api::namespaced(client.kube().clone(), NS);
            struct Ctx {
                client: Arc<RemoteClient>,
                count: Arc<AtomicU64>,
            }
            let ctx = Arc::new(Ctx { client: client.clone(), count: reconciles.clone() });
            let run = KubeController::new(api, watcher::Config::default())
                .with_config(Config::default().concurrency(CONCURRENCY as u16))
                .graceful_shutdown_on(async {
                    let _ = stdin_closed.await;
                })
                .run(
                    |svc: Arc<Service>, ctx: Arc<Ctx>| async move {
                        ctx.count.fetch_add(1, Ordering::Relaxed);
                        let name = svc.metadata.name.clone().unwrap_or_default();
                        let value = svc.metadata.annotations.as_ref().and_then(|a| a.get(VALUE)).cloned().unwrap_or_default();
                        mirror(ctx.client.as_ref(), &name, &value).await?;
                        Ok::<_, shepherd_api::ApiError>(KubeAction::await_change())
                    },
                    |_svc, _err, _ctx| KubeAction::requeue(Duration::from_millis(100)),
                    ctx,
                );
            run.for_each(|_| async {}).await;
        }
        other => anyhow::bail!("unknown engine {other:?}: expected shepherd or kube"),
    }
    println!("{}", json!({"reconciles": reconciles.load(Ordering::Relaxed)}));
    Ok(())
}

/// What the harness sees on its watch of Endpoints, timestamped as each event arrives.
#[derive(Default)]
struct Seen {
    /// Services whose Endpoints first carried the initial value, and when the first and the last
    /// of them did.
    synced: std::collections::HashSet<String>,
    first_synced: Option<Instant>,
    all_synced: Option<Instant>,
    /// Changes waiting for their mirror, by Service name: (value, when it was set).
    pending: std::collections::HashMap<String, (String, Instant)>,
    latencies: Vec<Duration>,
}

type Shared = Arc<std::sync::Mutex<Seen>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn observe(seen: &Shared, services: usize, ep: &Value) {
    let at = Instant::now();
    let name = meta::name(ep);
    let value = value_of(ep, MIRROR);
    let mut s = lock(seen);
    if value.as_deref() == Some("0") && s.all_synced.is_none() && s.synced.insert(name.to_string()) {
        s.first_synced.get_or_insert(at);
        if s.synced.len() == services {
            s.all_synced = Some(at);
        }
    }
    if let Some((want, set_at)) = s.pending.get(name)
        && value.as_deref() == Some(want.as_str())
    {
        let latency = at.duration_since(*set_at);
        s.latencies.push(latency);
        s.pending.remove(name);
    }
}

/// Watches Endpoints from before the worker starts, so the end of the initial sync is the arrival
/// of the event that completes it rather than the next step of a poll.
async fn observe_endpoints(client: Arc<dyn Client>, seen: Shared, services: usize, ready: tokio::sync::oneshot::Sender<()>) {
    let mut ready = Some(ready);
    loop {
        let Ok(list) = client.list(&ENDPOINTS, &ListParams::namespace(NS)).await else { continue };
        for ep in &list.items {
            observe(&seen, services, ep);
        }
        let Ok(mut events) = client.watch(&ENDPOINTS, &ListParams::namespace(NS), list.resource_version).await else { continue };
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        while let Some(Ok(ev)) = events.next().await {
            let (WatchEvent::Added(ep) | WatchEvent::Modified(ep)) = ev else { continue };
            observe(&seen, services, &ep);
        }
    }
}

async fn run_variant(binary: &Path, engine: &str, p: Params) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let server = Process::start(binary, &["server", "--data-dir", &data, "--controllers", "none"])?;
    let client: Arc<dyn Client> = Arc::new(RemoteClient::connect(&server.url, None)?);
    let names: Vec<String> = (0..p.services).map(|i| format!("s{i}")).collect();
    futures::stream::iter(names.iter())
        .map(|n| {
            let c = client.clone();
            async move { c.create(&SERVICE, Some(NS), service(n)).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;

    let seen: Shared = Arc::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let observer = tokio::spawn(observe_endpoints(client.clone(), seen.clone(), p.services, ready_tx));
    tokio::time::timeout(Duration::from_secs(30), ready_rx).await.map_err(|_| anyhow::anyhow!("the watch of Endpoints did not start"))??;
    // Let the server settle after the creates so both variants start on the same footing.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let me = std::env::current_exe()?;
    let http = reqwest::Client::new();
    let server_pid = server.child.id().to_string();
    let requests_before = scale::counters(&http, &server.url).await?;
    let server_cpu0 = procstat::cpu_seconds(&server_pid);
    // Initial sync: from starting the worker to the event that shows the last Service mirrored.
    let started = Instant::now();
    let mut child = Command::new(me)
        .args(["peer-worker", "--engine", engine, "--url", &server.url])
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id().to_string();

    let (first, sync) = loop {
        {
            let s = lock(&seen);
            if let (Some(first), Some(all)) = (s.first_synced, s.all_synced) {
                break (first.duration_since(started), all.duration_since(started));
            }
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(300), "{engine}: initial sync did not finish in 300 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // What the sync asked of the server, by verb and resource (the scrape itself not counted).
    let server_sync_cpu = procstat::cpu_seconds(&server_pid) - server_cpu0;
    let requests_after = scale::counters(&http, &server.url).await?;
    let sync_requests: std::collections::BTreeMap<String, u64> = requests_after
        .requests
        .iter()
        .map(|(k, v)| (k.clone(), (v - requests_before.requests.get(k).copied().unwrap_or(0.0)) as u64))
        .filter(|(k, n)| *n > 0 && !k.ends_with(" metrics"))
        .collect();
    let sync_request_total: u64 = sync_requests.values().sum();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu0 = procstat::cpu_seconds(&pid);
    let phase_start = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / p.change_rate));
    let mut changes = 0usize;
    while phase_start.elapsed() < p.change_phase {
        ticker.tick().await;
        let name = {
            let s = lock(&seen);
            let mut rng = rand::rng();
            (0..50).map(|_| names[rng.random_range(0..names.len())].clone()).find(|n| !s.pending.contains_key(n))
        };
        let Some(name) = name else { continue };
        changes += 1;
        let value = changes.to_string();
        let at = Instant::now();
        // Registered before the PATCH is sent: its mirror may arrive before the PATCH's answer.
        lock(&seen).pending.insert(name.clone(), (value.clone(), at));
        client.patch(&SERVICE, Some(NS), &name, Patch::Merge(json!({"metadata": {"annotations": {VALUE: value}}}))).await?;
    }
    let settle = Instant::now();
    while !lock(&seen).pending.is_empty() && settle.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let phase_cpu = procstat::cpu_seconds(&pid) - cpu0;
    let total_cpu = procstat::cpu_seconds(&pid);
    let rss = procstat::rss_mib(&pid);
    let peak = procstat::peak_rss_mib(&pid);
    observer.abort();

    drop(child.stdin.take()); // the worker stops when its stdin closes
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    let _ = child.wait();
    let reconciles = serde_json::from_str::<Value>(line.trim()).ok().and_then(|v| v["reconciles"].as_u64()).unwrap_or(0);
    let (lat, unconverged) = {
        let s = lock(&seen);
        (summarize(&s.latencies), s.pending.len())
    };
    println!(
        "| {engine} | {:.3} s ({:.0}/s) | {:.3} s | {sync_request_total} | {server_sync_cpu:.2} | {changes} | {:.1} | {:.1} | {unconverged} | {reconciles} | {rss:.1} / {peak:.1} | {phase_cpu:.2} | {total_cpu:.2} |",
        sync.as_secs_f64(),
        p.services as f64 / sync.as_secs_f64(),
        first.as_secs_f64(),
        lat.p50_ms,
        lat.p99_ms
    );
    let _ = std::io::stdout().flush();
    Ok(json!({"engine": engine, "initial_sync_s": sync.as_secs_f64(), "initial_sync_reconciles_per_s": p.services as f64 / sync.as_secs_f64(),
        "first_mirrored_s": first.as_secs_f64(),
        "sync_requests": sync_requests, "sync_server_cpu_seconds": server_sync_cpu,
        "changes": changes, "latency": lat, "unconverged": unconverged, "reconciles_total": reconciles,
        "rss_mib": rss, "peak_rss_mib": peak, "cpu_seconds_change_phase": phase_cpu, "cpu_seconds_total": total_cpu}))
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario peer: services={} change_rate={}/s change_phase={:?} concurrency={CONCURRENCY} runs={}",
        p.services, p.change_rate, p.change_phase, p.runs
    );
    println!(
        "| engine | initial sync | first mirrored | server requests (sync) | server CPU s (sync) | changes | p50 ms | p99 ms | unconverged | reconciles | RSS / peak MiB | CPU s (changes) | CPU s (total) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut runs = Vec::new();
    let mut loads = Vec::new();
    for run in 0..p.runs {
        // Alternate which engine goes first, so neither always meets a warmer (or busier) machine.
        let order = if run % 2 == 0 { ["shepherd", "kube"] } else { ["kube", "shepherd"] };
        let load_before = procstat::load_average();
        let mut variants = Vec::new();
        for engine in order {
            variants.push(run_variant(binary, engine, p).await?);
        }
        let load_after = procstat::load_average();
        println!("| run {} (load {load_before:.1} -> {load_after:.1}) | | | | | | | | | | | | |", run + 1);
        loads.push(json!([load_before, load_after]));
        runs.push(json!({"order": order, "load_1m_before_after": [load_before, load_after], "variants": variants}));
    }
    // Which engine finished its initial sync first, run by run: a median alone hides a split.
    let sync_of = |r: &Value, engine: &str| {
        r["variants"].as_array().and_then(|v| v.iter().find(|v| v["engine"] == engine)).and_then(|v| v["initial_sync_s"].as_f64())
    };
    let shepherd_first = runs.iter().filter(|r| matches!((sync_of(r, "shepherd"), sync_of(r, "kube")), (Some(s), Some(k)) if s < k)).count();
    println!("initial sync: shepherd's engine finished first in {shepherd_first} of {} runs", runs.len());
    let mut medians = serde_json::Map::new();
    for engine in ["shepherd", "kube"] {
        let pick = |f: &dyn Fn(&Value) -> Option<f64>| -> f64 {
            median(runs.iter().flat_map(|r| r["variants"].as_array().cloned().unwrap_or_default()).filter(|v| v["engine"] == engine).filter_map(|v| f(&v)).collect())
        };
        let m = json!({
            "initial_sync_s": pick(&|v| v["initial_sync_s"].as_f64()),
            "first_mirrored_s": pick(&|v| v["first_mirrored_s"].as_f64()),
            "p50_ms": pick(&|v| v["latency"]["p50_ms"].as_f64()),
            "p99_ms": pick(&|v| v["latency"]["p99_ms"].as_f64()),
            "rss_mib": pick(&|v| v["rss_mib"].as_f64()),
            "cpu_seconds_change_phase": pick(&|v| v["cpu_seconds_change_phase"].as_f64()),
            "cpu_seconds_total": pick(&|v| v["cpu_seconds_total"].as_f64()),
        });
        println!(
            "median {engine}: sync {:.3} s, first {:.3} s, p50 {:.1} ms, p99 {:.1} ms, RSS {:.1} MiB, CPU {:.2} s (changes) {:.2} s (total)",
            m["initial_sync_s"].as_f64().unwrap_or(0.0),
            m["first_mirrored_s"].as_f64().unwrap_or(0.0),
            m["p50_ms"].as_f64().unwrap_or(0.0),
            m["p99_ms"].as_f64().unwrap_or(0.0),
            m["rss_mib"].as_f64().unwrap_or(0.0),
            m["cpu_seconds_change_phase"].as_f64().unwrap_or(0.0),
            m["cpu_seconds_total"].as_f64().unwrap_or(0.0)
        );
        medians.insert(engine.to_string(), m);
    }
    Ok(ScenarioResult {
        name: "peer",
        params: json!({"services": p.services, "change_rate_per_s": p.change_rate, "change_phase_s": p.change_phase.as_secs_f64(),
            "concurrency": CONCURRENCY, "runs": p.runs}),
        values: json!({"medians": medians, "runs": runs, "load_1m": loads, "shepherd_synced_first_runs": shepherd_first}),
    })
}
