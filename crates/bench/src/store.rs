//! Scenario `store`: durable creates/s with 1 and 64 clients, list latency and RSS with N pods, over
//! plain HTTP or TLS with a token.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "c", "image": "minimal", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}})
}

async fn create_n(http: &reqwest::Client, url: &str, prefix: &str, n: usize, clients: usize) -> anyhow::Result<Duration> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, url, next, prefix) = (http.clone(), url.to_string(), next.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(());
                }
                let r = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod(&format!("{prefix}-{i}"))).send().await?;
                anyhow::ensure!(r.status().as_u16() == 201, "create failed: {}", r.status());
                r.bytes().await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

pub async fn run(binary: &Path, pods: usize, sequential: usize, list_runs: usize, tls: bool) -> anyhow::Result<ScenarioResult> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let (server, http) = Process::start_reachable(binary, &["server", "--controllers", "none", "--data-dir", &data], dir.path(), tls)?;
    let transport = if tls { "TLS + token" } else { "plain HTTP" };
    println!("scenario store: pods={pods} sequential={sequential} list_runs={list_runs}, {transport}");

    let one = create_n(&http, &server.url, "seq", sequential, 1).await?;
    let one_rate = sequential as f64 / one.as_secs_f64();
    println!("durable creates, 1 client: {one_rate:.0}/s ({:.3} ms each)", one.as_secs_f64() * 1000.0 / sequential as f64);

    let rest = pods.saturating_sub(sequential);
    let many = create_n(&http, &server.url, "par", rest, 64).await?;
    let many_rate = rest as f64 / many.as_secs_f64();
    println!("durable creates, 64 clients: {many_rate:.0}/s");

    let mut samples = Vec::new();
    let mut count = 0;
    for _ in 0..list_runs {
        let t = Instant::now();
        let body = http.get(format!("{}/api/v1/namespaces/default/pods", server.url)).send().await?.bytes().await?;
        samples.push(t.elapsed());
        count = serde_json::from_slice::<Value>(&body)?["items"].as_array().map_or(0, Vec::len);
    }
    let list = summarize(&samples);
    println!("list of {count} pods: {list}");
    let rss = server.rss_mib();
    println!("server RSS with {count} pods: {rss:.1} MiB");

    Ok(ScenarioResult {
        name: "store",
        params: json!({"pods": pods, "sequential": sequential, "list_runs": list_runs, "tls": tls}),
        values: json!({"creates_per_s_1_client": one_rate, "creates_per_s_64_clients": many_rate,
            "list": list, "listed": count, "rss_mib": rss}),
    })
}
