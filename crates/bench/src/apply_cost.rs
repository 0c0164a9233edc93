//! Scenario `apply-cost`: server CPU per request of server-side apply against a merge patch making
//! the same Deployment change, read from the server's /proc CPU times.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Process;
use crate::procstat;
use crate::report::{ScenarioResult, summarize};

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";

/// A Deployment of the size operators apply: three containers with ports, env and resources.
fn deployment(replicas: u64) -> Value {
    let container = |name: &str, port: u16| {
        json!({"name": name, "image": format!("registry.example/{name}:1.0"),
            "ports": [{"containerPort": port, "name": "http"}],
            "env": [{"name": "MODE", "value": "fast"}, {"name": "LEVEL", "value": "3"}],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}})
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container("web", 8080), container("metrics", 9090), container("proxy", 8443)]}}}})
}

/// Sends `n` requests, each changing `spec.replicas` (2, 3, 2, ...); returns the server CPU seconds
/// they cost and each request's latency.
async fn measure(
    server: &Process,
    n: usize,
    request: impl Fn(u64) -> reqwest::RequestBuilder,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let pid = server.child.id().to_string();
    let cpu_before = procstat::cpu_seconds(&pid);
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let r = request(2 + (i as u64 % 2)).send().await?;
        anyhow::ensure!(r.status().is_success(), "request {i} failed: {} {}", r.status(), r.text().await.unwrap_or_default());
        r.bytes().await?;
        latencies.push(t.elapsed());
    }
    Ok((procstat::cpu_seconds(&pid) - cpu_before, latencies))
}

pub async fn run(binary: &Path, requests: usize) -> anyhow::Result<ScenarioResult> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let server = Process::start(binary, &["server", "--controllers", "none", "--data-dir", &data])?;
    let http = reqwest::Client::new();
    println!("scenario apply-cost: requests={requests} of each kind");
    let item = format!("{}{DEPLOYMENTS}/web", server.url);
    let created = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&deployment(1)).send().await?;
    anyhow::ensure!(created.status().as_u16() == 201, "create failed: {}", created.status());

    let apply = |replicas: u64| {
        http.patch(format!("{item}?fieldManager=bench&force=true"))
            .header("content-type", "application/apply-patch+yaml")
            .body(deployment(replicas).to_string())
    };
    let merge = |replicas: u64| {
        http.patch(format!("{item}?fieldManager=bench-merge"))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"spec": {"replicas": replicas}}).to_string())
    };
    // Warm up both paths (schema tables, allocator), then measure each.
    measure(&server, 20.min(requests), apply).await?;
    measure(&server, 20.min(requests), merge).await?;
    let (apply_cpu, apply_latency) = measure(&server, requests, apply).await?;
    let (merge_cpu, merge_latency) = measure(&server, requests, merge).await?;
    let per = |cpu: f64| cpu * 1e6 / requests as f64;
    let (apply_us, merge_us) = (per(apply_cpu), per(merge_cpu));
    let (apply_latency, merge_latency) = (summarize(&apply_latency), summarize(&merge_latency));
    println!("server-side apply: {apply_us:.0} us of server CPU per request; latency {apply_latency}");
    println!("merge patch:       {merge_us:.0} us of server CPU per request; latency {merge_latency}");
    println!("load average: {:.2}", procstat::load_average());
    Ok(ScenarioResult {
        name: "apply-cost",
        params: json!({"requests": requests}),
        values: json!({"apply_cpu_us_per_request": apply_us, "merge_patch_cpu_us_per_request": merge_us,
            "apply_latency": apply_latency, "merge_patch_latency": merge_latency,
            "load_average": procstat::load_average()}),
    })
}
