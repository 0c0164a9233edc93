//! Scenario `dashboard`: the web dashboard in headless Chromium against a cluster of N pods on
//! simulated nodes. First paint and time to live data (every kind listed and drawn), then pods
//! changed at a fixed rate while the page watches: the longest gap between two frames, frames
//! over 100 ms, the browser's long tasks, and how many watch events the page took in.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_dashboard::webdriver::Browser;
use tokio::time::Instant;

use crate::report::ScenarioResult;
use crate::scale::{self, Params};

const PODS: &str = "/api/v1/namespaces/default/pods";

pub struct DashboardParams {
    pub nodes: usize,
    pub pods: usize,
    /// Pod changes per second while the page watches.
    pub change_rate: f64,
    pub change_seconds: f64,
}

pub async fn run(binary: &Path, d: DashboardParams) -> anyhow::Result<ScenarioResult> {
    println!("scenario dashboard: {} pods on {} simulated nodes, then {} pod changes/s for {} s", d.pods, d.nodes, d.change_rate, d.change_seconds);
    let p = Params {
        nodes: d.nodes,
        replicas: d.pods,
        deployments: 1,
        timeout: Duration::from_secs(600),
        idle: Duration::ZERO,
        churn: Duration::ZERO,
        churn_rate: 1.0,
        server_args: Vec::new(),
    };
    let (cluster, _) = scale::start_cluster(binary, d.nodes, &p.server_args).await?;
    let http = reqwest::Client::new();
    scale::scale_out(&cluster, &p, &http).await?;
    let url = cluster.server.url.clone();

    let browser = Browser::start(1280, 900).await.map_err(anyhow::Error::msg)?;
    let opened = Instant::now();
    browser.client.goto(&format!("{url}/dashboard/")).await?;
    let marks = browser
        .wait_for(
            "const live = performance.getEntriesByName('shepherd-live')[0];
             const paint = performance.getEntriesByName('first-contentful-paint')[0];
             return live && {live: live.startTime, paint: paint ? paint.startTime : null};",
            Duration::from_secs(120),
        )
        .await
        .map_err(|last| anyhow::anyhow!("the dashboard never showed live data: {last}"))?;
    let wall_to_live = opened.elapsed();
    let (paint, live) = (marks["paint"].as_f64(), marks["live"].as_f64().unwrap_or(f64::NAN));
    println!(
        "first contentful paint {} ms, live data (every kind listed and drawn) {live:.0} ms after navigation ({:.0} ms wall)",
        paint.map_or("?".into(), |p| format!("{p:.0}")),
        wall_to_live.as_secs_f64() * 1000.0
    );

    let list: Value = http.get(format!("{url}{PODS}")).send().await?.json().await?;
    let names: Arc<Vec<String>> = Arc::new(
        list["items"].as_array().into_iter().flatten().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string)).collect(),
    );
    anyhow::ensure!(!names.is_empty(), "no pods to change");
    browser.client.execute("window.dashboardPerf.reset(); return true;", vec![]).await?;
    let (sent, failed) = change_pods(&http, &url, names, d.change_rate, Duration::from_secs_f64(d.change_seconds)).await;
    // Let the last events arrive and one more redraw happen.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let perf = browser
        .client
        .execute(
            "const p = window.dashboardPerf; return {maxFrameGapMs: p.maxFrameGapMs, framesOver100: p.framesOver100,
             frames: p.frames, longTasks: p.longTasks.length, longestTaskMs: Math.max(0, ...p.longTasks), watchEvents: p.watchEvents,
             errors: window.dashboardErrors};",
            vec![],
        )
        .await?;
    let _ = browser.client.clone().close().await;
    println!(
        "{sent} pod changes in {:.0} s ({failed} failed): the page took in {} watch events; frames {} (longest gap {:.0} ms, {} over 100 ms), \
         long tasks {} (longest {:.0} ms)",
        d.change_seconds, perf["watchEvents"], perf["frames"], perf["maxFrameGapMs"].as_f64().unwrap_or(0.0), perf["framesOver100"],
        perf["longTasks"], perf["longestTaskMs"].as_f64().unwrap_or(0.0)
    );
    anyhow::ensure!(perf["errors"] == json!([]), "JavaScript errors on the page: {}", perf["errors"]);
    let values = json!({
        "first_contentful_paint_ms": paint, "live_ms": live, "wall_to_live_ms": wall_to_live.as_secs_f64() * 1000.0,
        "changes_sent": sent, "changes_failed": failed, "change_seconds": d.change_seconds, "page": perf,
    });
    let params = json!({"nodes": d.nodes, "pods": d.pods, "change_rate": d.change_rate, "change_seconds": d.change_seconds});
    Ok(ScenarioResult { name: "dashboard", params, values })
}

/// Patches an annotation of one pod after another at `rate` per second for `duration`, with up
/// to 64 calls in flight; returns (sent, failed).
async fn change_pods(http: &reqwest::Client, url: &str, names: Arc<Vec<String>>, rate: f64, duration: Duration) -> (usize, usize) {
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
    let start = Instant::now();
    let mut sent = 0usize;
    let mut tasks = tokio::task::JoinSet::new();
    while start.elapsed() < duration {
        tick.tick().await;
        let Ok(permit) = limit.clone().acquire_owned().await else { break };
        let name = names[sent % names.len()].clone();
        let (http, url, failed) = (http.clone(), url.to_string(), failed.clone());
        let body = json!({"metadata": {"annotations": {"bench.shepherd.dev/change": sent.to_string()}}}).to_string();
        tasks.spawn(async move {
            let r = http
                .patch(format!("{url}{PODS}/{name}"))
                .header("content-type", "application/merge-patch+json")
                .body(body)
                .send()
                .await;
            if !r.is_ok_and(|r| r.status().is_success()) {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            drop(permit);
        });
        sent += 1;
    }
    while tasks.join_next().await.is_some() {}
    (sent, failed.load(std::sync::atomic::Ordering::Relaxed))
}
