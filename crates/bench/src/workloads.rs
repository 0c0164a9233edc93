//! Scenarios `self-heal`, `apply-to-running` and `images`: `shepherd standalone` with the process
//! or the oci runtime, driven over HTTP only, timing how fast a Deployment's pods run and come back
//! and what pulling an image adds.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

const PODS: &str = "/api/v1/namespaces/default/pods";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";

fn deployment(name: &str, replicas: i64) -> Value {
    deployment_of(name, replicas, json!({"name": "main", "image": "minimal"}))
}

fn deployment_of(name: &str, replicas: i64, container: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [container]}}}})
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

fn standalone(binary: &Path, runtime: &str, extra: &[&str]) -> anyhow::Result<(tempfile::TempDir, Process)> {
    let (dir, p, _) = standalone_reachable(binary, runtime, extra, false)?;
    Ok((dir, p))
}

/// A standalone over plain HTTP, or with `tls` over TLS with a token, and a client that reaches it.
fn standalone_reachable(
    binary: &Path,
    runtime: &str,
    extra: &[&str],
    tls: bool,
) -> anyhow::Result<(tempfile::TempDir, Process, reqwest::Client)> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let mut args = vec!["standalone", "--data-dir", &data, "--runtime", runtime, "--pod-network", "host"];
    args.extend_from_slice(extra);
    let (p, http) = Process::start_reachable(binary, &args, dir.path(), tls)?;
    Ok((dir, p, http))
}

pub async fn self_heal(
    binary: &Path,
    runs: usize,
    runtime: &str,
    tls: bool,
    token_volume: bool,
    scratch_volume: bool,
) -> anyhow::Result<ScenarioResult> {
    let transport = if tls { "TLS + token" } else { "plain HTTP" };
    let mut mounted = if token_volume { String::new() } else { ", no token volume".to_string() };
    if scratch_volume {
        mounted.push_str(", an emptyDir at the token's path");
    }
    println!("scenario self-heal: standalone, {runtime} runtime, {transport}{mounted}, Deployment of 3 `minimal`, {runs} deletions");
    let (_dir, mut server, http) = standalone_reachable(binary, runtime, &[], tls)?;
    let mut heal = deployment("heal", 3);
    if !token_volume {
        heal["spec"]["template"]["spec"]["automountServiceAccountToken"] = json!(false);
    }
    if scratch_volume {
        // Where the token volume goes, so that the runtime sets up the same mounts for it.
        heal["spec"]["template"]["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
        heal["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "scratch", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]);
    }
    let r = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&heal).send().await?;
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
        // Read to the end, as a client does before it reuses the connection.
        r.bytes().await?;
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
    server.terminate(Duration::from_secs(30));
    Ok(ScenarioResult {
        name: "self-heal",
        params: json!({"runs": runs, "replicas": 3, "image": "minimal", "runtime": runtime, "tls": tls,
            "token_volume": token_volume, "scratch_volume": scratch_volume}),
        values: json!({"replacement_ready": s, "control_plane_rss_mib": rss}),
    })
}

pub async fn apply_to_running(binary: &Path, runs: usize, runtime: &str) -> anyhow::Result<ScenarioResult> {
    println!("scenario apply-to-running: standalone, {runtime} runtime, {runs} Deployments of 3 `minimal`");
    let (_dir, server) = standalone(binary, runtime, &[])?;
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
        params: json!({"runs": runs, "replicas": 3, "image": "minimal", "runtime": runtime}),
        values: json!({"apply_to_ready": s, "control_plane_rss_mib": server.rss_mib()}),
    })
}

/// The pull duration kubelet-style `Pulled` Events report ("... in 123.456ms. Image size: ...").
async fn pull_durations(http: &reqwest::Client, url: &str) -> anyhow::Result<Vec<Duration>> {
    let events: Value = http.get(format!("{url}/api/v1/namespaces/default/events")).send().await?.json().await?;
    let mut out = Vec::new();
    for e in events["items"].as_array().into_iter().flatten().filter(|e| e["reason"] == "Pulled") {
        let message = e["message"].as_str().unwrap_or("");
        let Some(took) = message.split(" in ").nth(1).and_then(|t| t.split(". ").next()) else { continue };
        let (number, unit) = took.split_at(took.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(took.len()));
        let Ok(n) = number.parse::<f64>() else { continue };
        let seconds = match unit {
            "s" => n,
            "ms" => n / 1e3,
            "µs" | "us" => n / 1e6,
            _ => continue,
        };
        out.push(Duration::from_secs_f64(seconds));
    }
    Ok(out)
}

/// Blob pulls the registry served, from its `/metrics`.
async fn registry_blob_pulls(http: &reqwest::Client, registry: &str) -> anyhow::Result<f64> {
    let text = http.get(format!("{registry}/metrics")).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("registry_blob_pulls_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The `oci` runtime and images: per run a fresh `standalone --runtime oci` and a fresh
/// `shepherd registry` holding the busybox test image (so every image store starts empty): ten pods of the
/// image at once on the one node (one pull, cold), the pull itself (the `Pulled` Event's duration),
/// then one more pod of the now present image (a warm start).
pub async fn images(binary: &Path, runs: usize) -> anyhow::Result<ScenarioResult> {
    println!("scenario images: standalone, oci runtime, local registry, busybox test image; {runs} fresh clusters");
    let http = reqwest::Client::new();
    let (mut ten_cold, mut pulls, mut warm, mut blob_pulls) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let registry_dir = tempfile::tempdir()?;
        let registry_data = registry_dir.path().to_string_lossy().to_string();
        let registry_process = Process::start(binary, &["registry", "--data-dir", &registry_data, "--test-image", "busybox:1"])?;
        let registry = registry_process.url.clone();
        let (_dir, mut server) = standalone(binary, "oci", &[])?;
        let image = format!("{}/busybox:1", registry.trim_start_matches("http://"));
        // PID 1 of a container ignores SIGTERM unless it handles it: this one ends on it, so that
        // stopping standalone at the end of a run does not wait out the grace period.
        let idle = "trap 'exit 0' TERM; sleep 3600 & wait";
        let sleeper = |name: &str| json!({"name": name, "image": image, "command": ["sh", "-c", idle]});
        let before = registry_blob_pulls(&http, &registry).await?;

        let started = Instant::now();
        let r = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&deployment_of("ten", 10, sleeper("main"))).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating the Deployment: {}", r.status());
        wait_ready(&http, &server.url, "ten", 10, None, Duration::from_secs(120)).await?;
        ten_cold.push(started.elapsed());
        blob_pulls.push(registry_blob_pulls(&http, &registry).await? - before);
        pulls.extend(pull_durations(&http, &server.url).await?);

        let started = Instant::now();
        let r = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&deployment_of("one", 1, sleeper("main"))).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating the Deployment: {}", r.status());
        wait_ready(&http, &server.url, "one", 1, None, Duration::from_secs(60)).await?;
        warm.push(started.elapsed());
        // Stopping standalone stops its containers (no --keep-pods).
        server.terminate(Duration::from_secs(30));
    }
    let (ten_cold, pulls, warm) = (summarize(&ten_cold), summarize(&pulls), summarize(&warm));
    println!("ten pods of a cold image -> all Running and Ready: {ten_cold}");
    println!("the pull (Pulled Event): {pulls}");
    println!("one pod of a present image -> Running and Ready: {warm}");
    println!("registry blob pulls per ten-pod start: {blob_pulls:?}");
    Ok(ScenarioResult {
        name: "images",
        params: json!({"runs": runs, "runtime": "oci", "image": "busybox:1 (test image)", "cold_pods": 10}),
        values: json!({"ten_pods_cold_ready": ten_cold, "pull": pulls, "warm_pod_ready": warm, "blob_pulls_per_ten_pods": blob_pulls}),
    })
}
