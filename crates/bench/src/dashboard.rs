//! Scenario `dashboard`: the web dashboard in headless Chromium against a cluster of N pods on
//! simulated nodes. First paint and time to live data (every kind listed and drawn), then pods
//! changed at a fixed rate while the page watches: the longest gap between two frames, frames
//! over 100 ms, the browser's long tasks, how many watch events the page took in, and how long a
//! change takes to reach the screen (pods created and deleted through the API meanwhile, timed
//! from the call to the moment the page's DOM shows them).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use shepherd_dashboard::webdriver::Browser;
use tokio::time::Instant;

use crate::report::{ScenarioResult, summarize};
use crate::scale::{self, Params};

const PODS: &str = "/api/v1/namespaces/default/pods";
/// Pods the bench creates and deletes to time change-to-screen; they have no owner, so the page
/// shows them in a group of their own, where nothing caps them out of sight.
const STAMP: &str = "dash-stamp-";
/// Stamps per second, and how long each lives before it is deleted.
const STAMPS_PER_SECOND: f64 = 10.0;
const STAMP_LIFE: Duration = Duration::from_secs(1);

pub struct DashboardParams {
    pub nodes: usize,
    pub pods: usize,
    /// Pod changes per second while the page watches.
    pub change_rate: f64,
    pub change_seconds: f64,
    /// Pod changes in flight at most.
    pub in_flight: usize,
    /// Where to write the page's CPU profile while pods change.
    pub profile: Option<std::path::PathBuf>,
    /// Extra arguments for `shepherd server`.
    pub server_args: Vec<String>,
}

/// Watches the pods list for the stamp pods: when each row first appears, and when it first
/// shows the deletion (Terminating, or the row gone: a simulated node finishes a pod at once), in
/// wall-clock milliseconds (the bench's clock: the same machine).
const OBSERVE: &str = "
  const seen = window.stamps = {};
  const box = document.getElementById('pods');
  new MutationObserver(() => {
    const now = performance.timeOrigin + performance.now();
    const present = new Set();
    for (const r of box.querySelectorAll('tr[data-pod^=\"default/dash-stamp-\"]')) {
      const name = r.dataset.pod.slice(8);
      present.add(name);
      const s = seen[name] ||= { shown: now };
      if (!s.deleted && r.querySelector('.terminating')) s.deleted = now;
    }
    for (const [name, s] of Object.entries(seen)) if (!s.deleted && !present.has(name)) s.deleted = now;
  }).observe(box, { childList: true, subtree: true, characterData: true });
  return true;";

fn wall_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

pub async fn run(binary: &Path, d: DashboardParams) -> anyhow::Result<ScenarioResult> {
    println!("scenario dashboard: {} pods on {} simulated nodes, then {} pod changes/s for {} s", d.pods, d.nodes, d.change_rate, d.change_seconds);
    let mut server_args = d.server_args.clone();
    if d.nodes > 200 && !server_args.iter().any(|a| a.starts_with("--cluster-cidr")) {
        // The default pod range (10.244.0.0/16 in /24 blocks) has room for 256 nodes.
        server_args.extend(["--cluster-cidr".to_string(), "10.128.0.0/9".to_string()]);
    }
    let p = Params {
        nodes: d.nodes,
        replicas: d.pods,
        deployments: 1,
        agents: 1,
        timeout: Duration::from_secs(600),
        idle: Duration::ZERO,
        churn: Duration::ZERO,
        churn_rate: 1.0,
        server_args,
    };
    let (cluster, _) = scale::start_cluster(binary, d.nodes, &p.server_args).await?;
    // Enough idle connections kept for every change in flight: a change never waits on a handshake.
    let http = reqwest::Client::builder().pool_max_idle_per_host(d.in_flight.max(16)).build()?;
    scale::scale_out(&cluster, &p, &http).await?;
    let url = cluster.server.url.clone();
    let load_before = load_average();

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
    browser.client.execute(OBSERVE, vec![]).await?;
    if d.profile.is_some() {
        cdp(&http, &browser, "Profiler.enable", json!({})).await?;
        cdp(&http, &browser, "Profiler.start", json!({})).await?;
    }
    browser.client.execute("window.dashboardPerf.reset(); return true;", vec![]).await?;
    let change_for = Duration::from_secs_f64(d.change_seconds);
    let stamps = tokio::spawn(stamp_pods(http.clone(), url.clone(), change_for));
    let changing = Instant::now();
    let (sent, failed) = change_pods(&http, &url, names, d.change_rate, d.in_flight, change_for).await;
    let changed_for = changing.elapsed();
    let stamped = stamps.await?;
    if let Some(path) = &d.profile {
        let profile = cdp(&http, &browser, "Profiler.stop", json!({})).await?;
        std::fs::write(path, serde_json::to_vec(&profile["profile"])?)?;
        println!("the page's CPU profile while pods changed: {}; most time in:", path.display());
        for (what, ms) in profile_top(&profile["profile"], 20) {
            println!("  {ms:8.1} ms  {what}");
        }
    }
    // Let the last events arrive and one more redraw happen.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let perf = browser
        .client
        .execute(
            "const p = window.dashboardPerf; return {maxFrameGapMs: p.maxFrameGapMs, framesOver100: p.framesOver100,
             frames: p.frames, longTasks: p.longTasks.length, longestTaskMs: Math.max(0, ...p.longTasks), watchEvents: p.watchEvents,
             draws: p.draws, drawMsMean: p.draws ? p.drawMs / p.draws : 0, maxDrawMs: p.maxDrawMs,
             errors: window.dashboardErrors, stamps: window.stamps};",
            vec![],
        )
        .await?;
    let load_after = load_average();
    let _ = browser.client.clone().close().await;
    println!(
        "{sent} pod changes in {:.1} s ({:.0}/s, {failed} failed, at most {} in flight): the page took in {} watch events; frames {} (longest gap {:.0} ms, {} over 100 ms), \
         long tasks {} (longest {:.0} ms); {} redraws, {:.1} ms each on average, longest {:.0} ms",
        changed_for.as_secs_f64(), sent as f64 / changed_for.as_secs_f64(), d.in_flight, perf["watchEvents"], perf["frames"], perf["maxFrameGapMs"].as_f64().unwrap_or(0.0), perf["framesOver100"],
        perf["longTasks"], perf["longestTaskMs"].as_f64().unwrap_or(0.0), perf["draws"], perf["drawMsMean"].as_f64().unwrap_or(0.0),
        perf["maxDrawMs"].as_f64().unwrap_or(0.0)
    );
    let latency = change_to_screen(&stamped, &perf["stamps"]);
    println!(
        "change to screen: pod created -> row shown {}; pod deleted -> row shows Terminating or goes {}; {} of {} changes over 100 ms, \
         {} never shown; from the API's answer to the screen {}",
        latency.created, latency.deleted, latency.over_100ms, latency.changes, latency.missed, latency.from_answer
    );
    println!("load average before the page opened {load_before}, after the changes {load_after}");
    anyhow::ensure!(perf["errors"] == json!([]), "JavaScript errors on the page: {}", perf["errors"]);
    let mut page = perf.clone();
    if let Some(p) = page.as_object_mut() {
        p.remove("stamps");
    }
    let values = json!({
        "first_contentful_paint_ms": paint, "live_ms": live, "wall_to_live_ms": wall_to_live.as_secs_f64() * 1000.0,
        "changes_sent": sent, "changes_failed": failed, "change_seconds": d.change_seconds,
        "changes_per_second": sent as f64 / changed_for.as_secs_f64(), "page": page,
        "change_to_screen": {"created": latency.created, "deleted": latency.deleted, "from_answer": latency.from_answer,
            "changes": latency.changes,
            "over_100ms": latency.over_100ms, "never_shown": latency.missed},
        "load_average": {"before": load_before, "after": load_after},
    });
    let params = json!({"nodes": d.nodes, "pods": d.pods, "change_rate": d.change_rate, "change_seconds": d.change_seconds,
        "in_flight": d.in_flight,
        "stamps_per_second": STAMPS_PER_SECOND, "server_args": p.server_args});
    Ok(ScenarioResult { name: "dashboard", params, values })
}

/// When the bench sent its calls creating and deleting one stamp pod, and when the API answered
/// them (wall-clock ms; `None`: the call failed).
#[derive(Clone, Default)]
struct Stamp {
    name: String,
    created: Option<(f64, f64)>,
    deleted: Option<(f64, f64)>,
}

/// Creates a stamp pod at STAMPS_PER_SECOND for `duration` and deletes each STAMP_LIFE later,
/// noting when each call was sent.
async fn stamp_pods(http: reqwest::Client, url: String, duration: Duration) -> Vec<Stamp> {
    let stamps = Arc::new(Mutex::new(Vec::<Stamp>::new()));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / STAMPS_PER_SECOND));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0usize;
    while start.elapsed() < duration {
        tick.tick().await;
        let name = format!("{STAMP}{i}");
        let index = {
            let mut all = stamps.lock().unwrap_or_else(|e| e.into_inner());
            all.push(Stamp { name: name.clone(), ..Stamp::default() });
            all.len() - 1
        };
        let (http, url, stamps) = (http.clone(), url.clone(), stamps.clone());
        tasks.spawn(async move {
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "main", "image": "minimal"}]}});
            let at = wall_ms();
            let created = http.post(format!("{url}{PODS}")).json(&pod).send().await.is_ok_and(|r| r.status().is_success());
            if created {
                stamps.lock().unwrap_or_else(|e| e.into_inner())[index].created = Some((at, wall_ms()));
            }
            tokio::time::sleep(STAMP_LIFE).await;
            let at = wall_ms();
            let deleted = http.delete(format!("{url}{PODS}/{name}")).send().await.is_ok_and(|r| r.status().is_success());
            if created && deleted {
                stamps.lock().unwrap_or_else(|e| e.into_inner())[index].deleted = Some((at, wall_ms()));
            }
        });
        i += 1;
    }
    while tasks.join_next().await.is_some() {}
    stamps.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

struct Latency {
    /// From the call creating a pod to its row on the page.
    created: crate::report::Summary,
    /// From the call deleting a pod to its row showing Terminating or going.
    deleted: crate::report::Summary,
    /// Both, from the API's answer (the change committed) rather than the call: the page's part.
    from_answer: crate::report::Summary,
    changes: usize,
    over_100ms: usize,
    missed: usize,
}

/// Pairs the bench's calls with what the page saw of them.
fn change_to_screen(stamps: &[Stamp], seen: &Value) -> Latency {
    let (mut created, mut deleted, mut from_answer, mut missed) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let ms = |d: f64| Duration::from_secs_f64(d.max(0.0) / 1000.0);
    let mut take = |call: Option<(f64, f64)>, shown: Option<f64>, into: &mut Vec<Duration>| match (call, shown) {
        (Some((sent, answered)), Some(shown)) => {
            into.push(ms(shown - sent));
            from_answer.push(ms(shown - answered));
        }
        (Some(_), None) => missed += 1,
        (None, _) => {}
    };
    for s in stamps {
        let page = &seen[&s.name];
        take(s.created, page["shown"].as_f64(), &mut created);
        take(s.deleted, page["deleted"].as_f64(), &mut deleted);
    }
    let over_100ms = created.iter().chain(&deleted).filter(|d| d.as_millis() > 100).count();
    let changes = created.len() + deleted.len() + missed;
    Latency { created: summarize(&created), deleted: summarize(&deleted), from_answer: summarize(&from_answer), changes, over_100ms, missed }
}

/// Patches an annotation of one pod after another at `rate` per second for `duration`, with up
/// to `in_flight` calls in flight; returns (sent, failed).
async fn change_pods(
    http: &reqwest::Client,
    url: &str,
    names: Arc<Vec<String>>,
    rate: f64,
    in_flight: usize,
    duration: Duration,
) -> (usize, usize) {
    let limit = Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
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

/// Sends a Chrome DevTools Protocol command to the page through chromedriver's `goog/cdp/execute`.
async fn cdp(http: &reqwest::Client, browser: &Browser, cmd: &str, params: Value) -> anyhow::Result<Value> {
    let session = browser.client.session_id().await?.ok_or_else(|| anyhow::anyhow!("no WebDriver session"))?;
    let answer: Value = http
        .post(format!("http://127.0.0.1:{}/session/{session}/goog/cdp/execute", browser.port))
        .json(&json!({"cmd": cmd, "params": params}))
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(answer["value"].get("error").is_none(), "{cmd}: {}", answer["value"]);
    Ok(answer["value"].clone())
}

/// The `n` functions of a Chrome CPU profile with the most self time (ms), named
/// `function url:line`; the browser's own work shows as `(garbage collector)`, `(program)`, `(idle)`.
fn profile_top(profile: &Value, n: usize) -> Vec<(String, f64)> {
    let mut names = std::collections::HashMap::new();
    for node in profile["nodes"].as_array().into_iter().flatten() {
        let f = &node["callFrame"];
        let url = f["url"].as_str().unwrap_or("");
        let file = url.rsplit('/').next().unwrap_or("");
        let name = match f["functionName"].as_str() {
            Some("") | None => "(anonymous)",
            Some(name) => name,
        };
        let line = f["lineNumber"].as_i64().unwrap_or(-1) + 1;
        let what = if file.is_empty() { name.to_string() } else { format!("{name} {file}:{line}") };
        names.insert(node["id"].as_i64().unwrap_or(-1), what);
    }
    let mut by_name = std::collections::HashMap::<String, f64>::new();
    let samples = profile["samples"].as_array().map(Vec::as_slice).unwrap_or_default();
    let deltas = profile["timeDeltas"].as_array().map(Vec::as_slice).unwrap_or_default();
    // A sample's time is the delta to the next one.
    for (i, sample) in samples.iter().enumerate() {
        let us = deltas.get(i + 1).and_then(Value::as_f64).unwrap_or(0.0);
        let what = names.get(&sample.as_i64().unwrap_or(-1)).cloned().unwrap_or_else(|| "?".into());
        *by_name.entry(what).or_default() += us / 1000.0;
    }
    let mut top: Vec<_> = by_name.into_iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(n);
    top
}
