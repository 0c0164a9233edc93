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
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::cluster::Process;
use crate::procstat;
use crate::report::{ScenarioResult, summarize};

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

/// Changes waiting for their mirror, by Service name: (value, when it was set).
type Pending = Arc<Mutex<std::collections::HashMap<String, (String, Instant)>>>;

async fn observe_endpoints(client: Arc<dyn Client>, pending: Pending, latencies: Arc<Mutex<Vec<Duration>>>) {
    loop {
        let Ok(list) = client.list(&ENDPOINTS, &ListParams::namespace(NS)).await else { continue };
        let Ok(mut events) = client.watch(&ENDPOINTS, &ListParams::namespace(NS), list.resource_version).await else { continue };
        while let Some(Ok(ev)) = events.next().await {
            let (WatchEvent::Added(ep) | WatchEvent::Modified(ep)) = ev else { continue };
            let name = meta::name(&ep).to_string();
            let mut p = pending.lock().await;
            if let Some((want, at)) = p.get(&name)
                && value_of(&ep, MIRROR).as_deref() == Some(want.as_str())
            {
                latencies.lock().await.push(at.elapsed());
                p.remove(&name);
            }
        }
    }
}

async fn mirrored(client: &dyn Client, value: &str) -> anyhow::Result<usize> {
    let list = client.list(&ENDPOINTS, &ListParams::namespace(NS)).await?;
    Ok(list.items.iter().filter(|e| value_of(e, MIRROR).as_deref() == Some(value)).count())
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

    let me = std::env::current_exe()?;
    let mut child = Command::new(me)
        .args(["peer-worker", "--engine", engine, "--url", &server.url])
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let pid = child.id().to_string();

    // Initial sync: every Service mirrored once.
    let started = Instant::now();
    while mirrored(client.as_ref(), "0").await? < p.services {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(300), "{engine}: initial sync did not finish in 300 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sync = started.elapsed();

    let pending: Pending = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let observer = tokio::spawn(observe_endpoints(client.clone(), pending.clone(), latencies.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu0 = procstat::cpu_seconds(&pid);
    let phase_start = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / p.change_rate));
    let mut changes = 0usize;
    while phase_start.elapsed() < p.change_phase {
        ticker.tick().await;
        let name = {
            let p = pending.lock().await;
            let mut rng = rand::rng();
            (0..50).map(|_| names[rng.random_range(0..names.len())].clone()).find(|n| !p.contains_key(n))
        };
        let Some(name) = name else { continue };
        changes += 1;
        let value = changes.to_string();
        let mut pend = pending.lock().await;
        let at = Instant::now();
        client.patch(&SERVICE, Some(NS), &name, Patch::Merge(json!({"metadata": {"annotations": {VALUE: value}}}))).await?;
        pend.insert(name, (value, at));
    }
    let settle = Instant::now();
    while !pending.lock().await.is_empty() && settle.elapsed() < Duration::from_secs(10) {
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
    let lat = summarize(&latencies.lock().await);
    let unconverged = pending.lock().await.len();
    println!(
        "| {engine} | {:.2} s ({:.0}/s) | {changes} | {:.1} | {:.1} | {unconverged} | {reconciles} | {rss:.1} / {peak:.1} | {phase_cpu:.2} |",
        sync.as_secs_f64(),
        p.services as f64 / sync.as_secs_f64(),
        lat.p50_ms,
        lat.p99_ms
    );
    let _ = std::io::stdout().flush();
    Ok(json!({"engine": engine, "initial_sync_s": sync.as_secs_f64(), "initial_sync_reconciles_per_s": p.services as f64 / sync.as_secs_f64(),
        "changes": changes, "latency": lat, "unconverged": unconverged, "reconciles_total": reconciles,
        "rss_mib": rss, "peak_rss_mib": peak, "cpu_seconds_change_phase": phase_cpu, "cpu_seconds_total": total_cpu}))
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario peer: services={} change_rate={}/s change_phase={:?} concurrency={CONCURRENCY}",
        p.services, p.change_rate, p.change_phase
    );
    println!("| engine | initial sync | changes | p50 ms | p99 ms | unconverged | reconciles | RSS / peak MiB | CPU s (changes) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut variants = Vec::new();
    for engine in ["shepherd", "kube"] {
        variants.push(run_variant(binary, engine, p).await?);
    }
    Ok(ScenarioResult {
        name: "peer",
        params: json!({"services": p.services, "change_rate_per_s": p.change_rate, "change_phase_s": p.change_phase.as_secs_f64(),
            "concurrency": CONCURRENCY}),
        values: json!({"variants": variants}),
    })
}
