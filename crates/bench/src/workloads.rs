//! Scenarios `self-heal` and `apply-to-running`: `shepherd standalone` with the process runtime,
//! driven over HTTP only, timing how fast a Deployment's pods run and come back.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

const PODS: &str = "/api/v1/namespaces/default/pods";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";

fn deployment(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "minimal"}]}}}})
}

fn is_running_ready(p: &Value) -> bool {
    p.pointer("/metadata/deletionTimestamp").is_none()
        && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && p.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
            cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

async fn pods(http: &reqwest::Client, url: &str, app: &str) -> anyhow::Result<Vec<Value>> {
    let list: Value = http.get(format!("{url}{PODS}?labelSelector=app%3D{app}")).send().await?.json().await?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// Polls every 2 ms until `n` pods of `app` other than `except` are Running and Ready.
async fn wait_ready(http: &reqwest::Client, url: &str, app: &str, n: usize, except: Option<&str>, limit: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let ready = pods(http, url, app)
            .await?
            .iter()
            .filter(|p| is_running_ready(p) && except.is_none_or(|uid| p["metadata"]["uid"] != uid))
            .count();
        if ready >= n {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(start.elapsed() < limit, "{app}: {ready}/{n} pods Running and Ready after {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn standalone(binary: &Path) -> anyhow::Result<(tempfile::TempDir, Process)> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let p = Process::start(binary, &["standalone", "--data-dir", &data, "--runtime", "process"])?;
    Ok((dir, p))
}

pub async fn self_heal(binary: &Path, runs: usize) -> anyhow::Result<ScenarioResult> {
    println!("scenario self-heal: standalone, process runtime, Deployment of 3 `minimal`, {runs} deletions");
    let (_dir, server) = standalone(binary)?;
    let http = reqwest::Client::new();
    let r = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&deployment("heal", 3)).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the Deployment: {}", r.status());
    wait_ready(&http, &server.url, "heal", 3, None, Duration::from_secs(60)).await?;
    let mut samples = Vec::new();
    for _ in 0..runs {
        let all = pods(&http, &server.url, "heal").await?;
        let victim = all.iter().find(|p| is_running_ready(p)).ok_or_else(|| anyhow::anyhow!("no ready pod to delete"))?;
        let (name, uid) = (victim["metadata"]["name"].as_str().unwrap_or_default(), victim["metadata"]["uid"].as_str().unwrap_or_default());
        let started = Instant::now();
        let r = http.delete(format!("{}{PODS}/{name}", server.url)).send().await?;
        anyhow::ensure!(r.status().is_success(), "deleting {name}: {}", r.status());
        wait_ready(&http, &server.url, "heal", 3, Some(uid), Duration::from_secs(60)).await?;
        samples.push(started.elapsed());
        // Let the deleted pod finish terminating before the next round.
        let settle = Instant::now();
        while pods(&http, &server.url, "heal").await?.len() > 3 && settle.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let s = summarize(&samples);
    println!("deleted pod -> replacement Running and Ready: {s}");
    let rss = server.rss_mib();
    // Containers outlive the daemon: stop them before it goes.
    http.delete(format!("{}{DEPLOYMENTS}/heal", server.url)).send().await?;
    let settle = Instant::now();
    while !pods(&http, &server.url, "heal").await?.is_empty() && settle.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(ScenarioResult {
        name: "self-heal",
        params: json!({"runs": runs, "replicas": 3, "image": "minimal", "runtime": "process"}),
        values: json!({"replacement_ready": s, "control_plane_rss_mib": rss}),
    })
}

pub async fn apply_to_running(binary: &Path, runs: usize) -> anyhow::Result<ScenarioResult> {
    println!("scenario apply-to-running: standalone, process runtime, {runs} Deployments of 3 `minimal`");
    let (_dir, server) = standalone(binary)?;
    let http = reqwest::Client::new();
    let mut samples = Vec::new();
    for i in 0..runs {
        let name = format!("apply-{i}");
        let started = Instant::now();
        let r = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&deployment(&name, 3)).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating {name}: {}", r.status());
        wait_ready(&http, &server.url, &name, 3, None, Duration::from_secs(60)).await?;
        samples.push(started.elapsed());
        http.delete(format!("{}{DEPLOYMENTS}/{name}", server.url)).send().await?;
        let settle = Instant::now();
        while !pods(&http, &server.url, &name).await?.is_empty() && settle.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let s = summarize(&samples);
    println!("apply -> 3 pods Running and Ready: {s}");
    Ok(ScenarioResult {
        name: "apply-to-running",
        params: json!({"runs": runs, "replicas": 3, "image": "minimal", "runtime": "process"}),
        values: json!({"apply_to_ready": s, "control_plane_rss_mib": server.rss_mib()}),
    })
}
