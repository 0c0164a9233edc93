//! Scenario `watch-fanout`: what a pod change costs the API server per watcher that filters by
//! node, as each node's agent watches `spec.nodeName=<node>`. Pods bound to `watchers` nodes are
//! changed while no watch is open and again while every node's watch is open; the server's CPU per
//! change in each phase, and the difference divided by the watchers, is the cost of one filtered
//! watcher looking at one event. Every change must reach exactly the watcher of its pod's node.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::cluster::Process;
use crate::procstat;
use crate::report::ScenarioResult;

const PODS: &str = "/api/v1/namespaces/default/pods";

#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub watchers: usize,
    pub pods: usize,
    pub changes: usize,
}

/// A pod of the size Deployments make: two containers with env, ports, resources and probes.
fn pod(name: &str, node: &str) -> Value {
    let container = |name: &str, port: u16| {
        json!({"name": name, "image": format!("registry.example/{name}:1.0"),
            "ports": [{"containerPort": port, "name": "http", "protocol": "TCP"}],
            "env": [{"name": "MODE", "value": "fast"}, {"name": "LEVEL", "value": "3"}],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": port}, "periodSeconds": 5}})
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web", "pod-template-hash": "5d4f8c9b7"}},
        "spec": {"nodeName": node, "containers": [container("web", 8080), container("metrics", 9090)]}})
}

/// Changes every pod's `bench/round` label `rounds` times, `concurrency` requests at a time;
/// returns the server CPU seconds it cost.
async fn change_all(server: &Process, http: &reqwest::Client, p: Params, round: usize) -> anyhow::Result<f64> {
    let pid = server.child.id().to_string();
    let before = procstat::cpu_seconds(&pid);
    let names: Vec<usize> = (0..p.changes).map(|i| i % p.pods).collect();
    let results = futures::stream::iter(names.into_iter().enumerate().map(|(i, n)| {
        let url = format!("{}{PODS}/p-{n}", server.url);
        let body = json!({"metadata": {"labels": {"bench/round": format!("{round}-{i}")}}}).to_string();
        let http = http.clone();
        async move {
            let r = http.patch(url).header("content-type", "application/merge-patch+json").body(body).send().await?;
            anyhow::ensure!(r.status().is_success(), "change failed: {}", r.status());
            r.bytes().await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(8)
    .collect::<Vec<_>>()
    .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(procstat::cpu_seconds(&pid) - before)
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    anyhow::ensure!(p.watchers > 0 && p.pods >= p.watchers, "need at least one watcher and a pod per watcher");
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let server = Process::start(binary, &["server", "--controllers", "none", "--data-dir", &data])?;
    let http = reqwest::Client::new();
    println!("scenario watch-fanout: watchers={} pods={} changes={} per phase", p.watchers, p.pods, p.changes);
    for i in 0..p.pods {
        let r = http.post(format!("{}{PODS}", server.url)).json(&pod(&format!("p-{i}"), &format!("node-{}", i % p.watchers))).send().await?;
        anyhow::ensure!(r.status().as_u16() == 201, "create failed: {}", r.status());
    }
    // Warm-up, then the phase without watchers.
    change_all(&server, &http, Params { changes: p.changes.min(200), ..p }, 0).await?;
    let alone = change_all(&server, &http, p, 1).await?;

    // One watch per node, from now on.
    let listed: Value = http.get(format!("{}{PODS}?limit=1", server.url)).send().await?.json().await?;
    let rv = listed["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string();
    let delivered = Arc::new(AtomicUsize::new(0));
    let misdelivered = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..p.watchers {
        let node = format!("node-{w}");
        // Cluster-wide, as a node's agent watches.
        let url = format!("{}/api/v1/pods?watch=true&resourceVersion={rv}&fieldSelector=spec.nodeName%3D{node}", server.url);
        let response = http.get(url).send().await?;
        anyhow::ensure!(response.status().is_success(), "watch failed: {}", response.status());
        let (delivered, misdelivered) = (delivered.clone(), misdelivered.clone());
        let expect = format!("\"nodeName\":\"{node}\"");
        tasks.push(tokio::spawn(async move {
            let mut body = response.bytes_stream();
            let mut pending: Vec<u8> = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    if line.windows(expect.len()).any(|w| w == expect.as_bytes()) {
                        delivered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        misdelivered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let watched = change_all(&server, &http, p, 2).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while delivered.load(Ordering::Relaxed) < p.changes && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (got, wrong) = (delivered.load(Ordering::Relaxed), misdelivered.load(Ordering::Relaxed));
    for t in tasks {
        t.abort();
    }
    anyhow::ensure!(got == p.changes && wrong == 0, "{got} of {} changes reached their node's watcher, {wrong} reached another", p.changes);

    let per_change = |cpu: f64| cpu * 1e6 / p.changes as f64;
    let (alone_us, watched_us) = (per_change(alone), per_change(watched));
    let per_watcher_us = (watched_us - alone_us) / p.watchers as f64;
    let load = procstat::load_average();
    println!("server CPU per change: {alone_us:.0} us without watchers, {watched_us:.0} us with {} (each change to its node's watcher only)", p.watchers);
    println!("per filtered watcher per change: {per_watcher_us:.2} us; load average {load:.2}");
    Ok(ScenarioResult {
        name: "watch-fanout",
        params: json!({"watchers": p.watchers, "pods": p.pods, "changes": p.changes}),
        values: json!({"server_cpu_us_per_change_without_watchers": alone_us,
            "server_cpu_us_per_change_with_watchers": watched_us,
            "server_cpu_us_per_watcher_per_change": per_watcher_us, "load_average": load}),
    })
}
