//! Scenario `dashboard`: the web dashboard in headless Chromium against a cluster of N pods on
//! simulated nodes. First paint and time to live data (every kind listed and drawn), then pods
//! changed at a fixed rate while the page watches: the longest gap between two frames, frames
//! over 100 ms, the browser's long tasks, how many watch events the page took in, and how long a
//! change takes to reach the screen (pods created and deleted through the API meanwhile, timed
//! from the call to the frame after the page's DOM shows them), split into the server's part (the
//! bench's own watch of the pods) and the browser's (the page's handler, its redraw, the frame),
//! with the CPU the server, the agent and the page got meanwhile.

use std::collections::HashMap;
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

/// Watches the pods list for the stamp pods, looking only at the nodes each change adds or takes
/// away (a scan of the table at every change would cost the page more than it measures): when
/// each row first appears, and when it first shows the deletion (Terminating, or the row gone: a
/// simulated node finishes a pod at once). Each is noted twice: when the DOM changed, and at the
/// next frame (`...Painted`), by when the browser has drawn the frame that carried the change.
/// Wall-clock milliseconds (the bench's clock: the same machine). A page that offers it is also
/// asked to note when its handler took each stamp's watch events in (`dashboardPerf.follow`).
const OBSERVE: &str = "
  const seen = window.stamps = {};
  const prefix = 'default/dash-stamp-';
  const wall = () => performance.timeOrigin + performance.now();
  const painting = [];
  const mark = (key, what) => {
    const s = seen[key.slice(8)] ||= {};
    if (s[what] !== undefined) return;
    s[what] = wall();
    if (!painting.length) requestAnimationFrame(() => { const t = wall(); for (const [s, w] of painting.splice(0)) s[w] ??= t; });
    painting.push([s, what + 'Painted']);
  };
  const rows = (n, f) => {
    if (n.nodeType !== 1) return;
    if (n.matches('tr[data-pod]')) { if (n.dataset.pod.startsWith(prefix)) f(n); return; }
    for (const r of n.querySelectorAll(`tr[data-pod^=\"${prefix}\"]`)) f(r);
  };
  const box = document.getElementById('pods');
  new MutationObserver((records) => {
    for (const rec of records) {
      for (const n of rec.addedNodes) {
        if (n.nodeType === 1 && n.classList.contains('terminating')) {
          const r = n.closest('tr[data-pod]');
          if (r && r.dataset.pod.startsWith(prefix)) mark(r.dataset.pod, 'deleted');
          continue;
        }
        rows(n, (r) => { mark(r.dataset.pod, 'shown'); if (r.querySelector('.terminating')) mark(r.dataset.pod, 'deleted'); });
      }
      for (const n of rec.removedNodes) rows(n, (r) => { if (!r.isConnected) mark(r.dataset.pod, 'deleted'); });
    }
  }).observe(box, { childList: true, subtree: true });
  if (window.dashboardPerf.follow) window.dashboardPerf.follow(prefix);
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
    let listed_at = list["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
    let served = Arc::new(Mutex::new(HashMap::<String, Seen>::new()));
    let server_watch = tokio::spawn(watch_stamps(http.clone(), url.clone(), listed_at, served.clone()));
    browser.client.execute(OBSERVE, vec![]).await?;
    cdp(&http, &browser, "Performance.enable", json!({})).await?;
    if d.profile.is_some() {
        cdp(&http, &browser, "Profiler.enable", json!({})).await?;
        cdp(&http, &browser, "Profiler.start", json!({})).await?;
    }
    browser.client.execute("window.dashboardPerf.reset(); return true;", vec![]).await?;
    let metrics_before = page_metrics(&http, &browser).await?;
    let (server_pid, agent_pid) = cluster.pids();
    let cpu_before = (machine_cpu(), process_cpu_s(server_pid), process_cpu_s(agent_pid));
    let change_for = Duration::from_secs_f64(d.change_seconds);
    let stamps = tokio::spawn(stamp_pods(http.clone(), url.clone(), change_for));
    let changing = Instant::now();
    let (sent, failed) = change_pods(&http, &url, names, d.change_rate, d.in_flight, change_for).await;
    let changed_for = changing.elapsed();
    let stamped = stamps.await?;
    let cpu_after = (machine_cpu(), process_cpu_s(server_pid), process_cpu_s(agent_pid));
    let metrics_after = page_metrics(&http, &browser).await?;
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
    server_watch.abort();
    let perf = browser
        .client
        .execute(
            "const p = window.dashboardPerf; return {maxFrameGapMs: p.maxFrameGapMs, framesOver100: p.framesOver100,
             frames: p.frames, longTasks: p.longTasks.length, longestTaskMs: Math.max(0, ...p.longTasks), watchEvents: p.watchEvents,
             draws: p.draws, drawMsMean: p.draws ? p.drawMs / p.draws : 0, maxDrawMs: p.maxDrawMs,
             longFrames: p.longFrames || null,
             errors: window.dashboardErrors, stamps: window.stamps, followed: p.followed || null};",
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
    let lf = &perf["longFrames"];
    if lf.is_object() {
        let f = |k: &str| lf[k].as_f64().unwrap_or(0.0);
        println!(
            "frames over 100 ms as the browser accounts them (long animation frames): {} taking {:.0} ms: tasks before the frame's \
             rendering began (watch messages, the browser's own work, the thread waiting for a core) {:.0} ms; rendering {:.0} ms, of \
             which style and layout {:.0} ms; the page's scripts in all {:.0} ms (forced style and layout in them {:.0} ms)",
            lf["count"], f("ms"), f("ms") - f("renderMs"), f("renderMs"), f("styleLayoutMs"), f("scriptMs"), f("forcedStyleLayoutMs")
        );
        let mut scripts: Vec<(String, f64)> =
            lf["scripts"].as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(0.0))).collect();
        scripts.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (what, ms) in scripts.iter().take(6) {
            println!("  {ms:8.1} ms  {what}");
        }
    }
    let served = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let latency = change_to_screen(&stamped, &served, &perf["stamps"], &perf["followed"]);
    println!(
        "change to screen (to the frame after the DOM changed): pod created -> row shown {}; pod deleted -> row shows Terminating \
         or goes {}; {} of {} changes over 100 ms from the API's answer, {} never shown",
        latency.created, latency.deleted, latency.over_100ms, latency.changes, latency.missed
    );
    println!("  from the API's answer to the screen: {}", latency.from_answer);
    println!("  split: answer -> the bench's own watch got the event (the server's part) {}", latency.server);
    if latency.page_took_in.n > 0 {
        println!("         bench's watch -> the page's handler took the event in (socket, browser queue) {}", latency.page_took_in);
        println!("         handler -> DOM changed (the page's redraw) {}", latency.page_drew);
    } else {
        println!("         bench's watch -> DOM changed (this page does not note when its handler runs) {}", latency.page_drew);
    }
    println!("         DOM changed -> next frame (style, layout, paint) {}", latency.frame);
    let busy = |before: Option<f64>, after: Option<f64>| match (before, after) {
        (Some(b), Some(a)) => (a - b) / changed_for.as_secs_f64(),
        _ => f64::NAN,
    };
    let machine = match (cpu_before.0, cpu_after.0) {
        (Some((busy0, all0)), Some((busy1, all1))) if all1 > all0 => (busy1 - busy0) / (all1 - all0),
        _ => f64::NAN,
    };
    let metric = |name: &str| metrics_after.get(name).copied().unwrap_or(f64::NAN) - metrics_before.get(name).copied().unwrap_or(f64::NAN);
    let seconds = changed_for.as_secs_f64();
    let cpu = json!({
        "machine_busy": machine, "server_cores": busy(cpu_before.1, cpu_after.1), "agent_cores": busy(cpu_before.2, cpu_after.2),
        "page_main_thread_busy": metric("TaskDuration") / seconds, "page_main_thread_cpu": metric("ThreadTime") / seconds,
        "page_script_s": metric("ScriptDuration"), "page_style_s": metric("RecalcStyleDuration"), "page_layout_s": metric("LayoutDuration"),
        "page_other_task_s": metric("TaskOtherDuration"), "page_renderer_process_cores": metric("ProcessTime") / seconds,
        "page_layouts": metric("LayoutCount"), "page_style_recalcs": metric("RecalcStyleCount"),
    });
    println!(
        "CPU while pods changed ({} cores): machine {:.0}% busy; server {:.2} cores, agent {:.2} cores; the page's renderer {:.2} cores, \
         its main thread busy {:.0}% of the time (on CPU {:.0}%): script {:.1} s, style {:.1} s ({} recalcs), layout {:.1} s ({} layouts), \
         other {:.1} s",
        std::thread::available_parallelism().map_or(0, |n| n.get()), machine * 100.0, cpu["server_cores"].as_f64().unwrap_or(f64::NAN),
        cpu["agent_cores"].as_f64().unwrap_or(f64::NAN), cpu["page_renderer_process_cores"].as_f64().unwrap_or(f64::NAN),
        metric("TaskDuration") / seconds * 100.0, metric("ThreadTime") / seconds * 100.0, metric("ScriptDuration"),
        metric("RecalcStyleDuration"), metric("RecalcStyleCount"), metric("LayoutDuration"), metric("LayoutCount"),
        metric("TaskOtherDuration")
    );
    println!("load average before the page opened {load_before}, after the changes {load_after}");
    println!(
        "summary: first paint {} ms; live data {live:.0} ms; {} of {} frames over 100 ms, longest {:.0} ms; change to screen from the \
         API's answer p50 {:.0} ms, p99 {:.0} ms (server's part p50 {:.0} ms, browser's part p50 {:.0} ms)",
        paint.map_or("?".into(), |p| format!("{p:.0}")), perf["framesOver100"], perf["frames"], perf["maxFrameGapMs"].as_f64().unwrap_or(0.0),
        latency.from_answer.p50_ms, latency.from_answer.p99_ms, latency.server.p50_ms, latency.browser.p50_ms
    );
    anyhow::ensure!(perf["errors"] == json!([]), "JavaScript errors on the page: {}", perf["errors"]);
    let mut page = perf.clone();
    if let Some(p) = page.as_object_mut() {
        p.remove("stamps");
        p.remove("followed");
    }
    let values = json!({
        "first_contentful_paint_ms": paint, "live_ms": live, "wall_to_live_ms": wall_to_live.as_secs_f64() * 1000.0,
        "changes_sent": sent, "changes_failed": failed, "change_seconds": d.change_seconds,
        "changes_per_second": sent as f64 / changed_for.as_secs_f64(), "page": page, "cpu": cpu,
        "change_to_screen": {"created": latency.created, "deleted": latency.deleted, "from_answer": latency.from_answer,
            "server": latency.server, "browser": latency.browser, "page_took_in": latency.page_took_in,
            "page_drew": latency.page_drew, "frame": latency.frame,
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
    /// From the call creating a pod to the frame showing its row.
    created: crate::report::Summary,
    /// From the call deleting a pod to the frame showing its row Terminating or gone.
    deleted: crate::report::Summary,
    /// Both, from the API's answer (the change committed) rather than the call.
    from_answer: crate::report::Summary,
    /// From the answer to the bench's own watch event: what the server takes to deliver.
    server: crate::report::Summary,
    /// From the bench's watch event to the frame: what the browser and the page take.
    browser: crate::report::Summary,
    /// The browser's part, split: until the page's handler ran (when the page notes it), until
    /// the DOM changed, until the next frame.
    page_took_in: crate::report::Summary,
    page_drew: crate::report::Summary,
    frame: crate::report::Summary,
    changes: usize,
    over_100ms: usize,
    missed: usize,
}

/// When the bench's own watch of the pods saw a stamp pod arrive, and its deletion begin
/// (wall-clock ms).
#[derive(Clone, Default)]
struct Seen {
    added: Option<f64>,
    deleting: Option<f64>,
}

/// Watches the pods as a client off the page would, from `listed_at`, noting when the events of
/// the stamp pods arrive: the server's part of change-to-screen. Lines that are not a stamp's are
/// skipped unparsed.
async fn watch_stamps(http: reqwest::Client, url: String, listed_at: String, served: Arc<Mutex<HashMap<String, Seen>>>) -> anyhow::Result<()> {
    use futures::StreamExt;
    let resp = http.get(format!("{url}/api/v1/pods?watch=true&resourceVersion={listed_at}")).send().await?;
    anyhow::ensure!(resp.status().is_success(), "watching the pods: {}", resp.status());
    let mut body = resp.bytes_stream();
    let mut buffered: Vec<u8> = Vec::new();
    let needle = format!("\"name\":\"{STAMP}");
    while let Some(chunk) = body.next().await {
        let now = wall_ms();
        buffered.extend_from_slice(&chunk?);
        while let Some(nl) = buffered.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffered.drain(..=nl).collect();
            if !line.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                continue;
            }
            let Ok(event) = serde_json::from_slice::<Value>(&line) else { continue };
            let Some(name) = event["object"]["metadata"]["name"].as_str() else { continue };
            if !name.starts_with(STAMP) {
                continue;
            }
            let deleting = event["type"] == "DELETED" || event["object"]["metadata"]["deletionTimestamp"].is_string();
            let mut all = served.lock().unwrap_or_else(|e| e.into_inner());
            let s = all.entry(name.to_string()).or_default();
            s.added.get_or_insert(now);
            if deleting {
                s.deleting.get_or_insert(now);
            }
        }
    }
    Ok(())
}

/// Pairs the bench's calls with what its own watch and the page saw of them.
fn change_to_screen(stamps: &[Stamp], served: &HashMap<String, Seen>, seen: &Value, followed: &Value) -> Latency {
    #[derive(Default)]
    struct Samples {
        created: Vec<Duration>,
        deleted: Vec<Duration>,
        from_answer: Vec<Duration>,
        server: Vec<Duration>,
        browser: Vec<Duration>,
        took_in: Vec<Duration>,
        drew: Vec<Duration>,
        frame: Vec<Duration>,
        missed: usize,
    }
    let ms = |d: f64| Duration::from_secs_f64(d.max(0.0) / 1000.0);
    let mut s = Samples::default();
    let none = Seen::default();
    for stamp in stamps {
        let page = &seen[&stamp.name];
        let handled = &followed[format!("default/{}", stamp.name)];
        let server = served.get(&stamp.name).unwrap_or(&none);
        let changes = [
            (stamp.created, server.added, handled["added"].as_f64(), page["shown"].as_f64(), page["shownPainted"].as_f64(), true),
            (stamp.deleted, server.deleting, handled["deleting"].as_f64(), page["deleted"].as_f64(), page["deletedPainted"].as_f64(), false),
        ];
        for (call, watched, took_in, drawn, painted, creation) in changes {
            let Some((sent, answered)) = call else { continue };
            let Some(painted) = painted else {
                s.missed += 1;
                continue;
            };
            if creation { &mut s.created } else { &mut s.deleted }.push(ms(painted - sent));
            s.from_answer.push(ms(painted - answered));
            if let Some(watched) = watched {
                s.server.push(ms(watched - answered));
                s.browser.push(ms(painted - watched));
            }
            if let Some(drawn) = drawn {
                s.frame.push(ms(painted - drawn));
                match (took_in, watched) {
                    (Some(took_in), _) => {
                        if let Some(watched) = watched {
                            s.took_in.push(ms(took_in - watched));
                        }
                        s.drew.push(ms(drawn - took_in));
                    }
                    (None, Some(watched)) => s.drew.push(ms(drawn - watched)),
                    (None, None) => {}
                }
            }
        }
    }
    let over_100ms = s.from_answer.iter().filter(|d| d.as_millis() > 100).count();
    let changes = s.created.len() + s.deleted.len() + s.missed;
    Latency {
        created: summarize(&s.created),
        deleted: summarize(&s.deleted),
        from_answer: summarize(&s.from_answer),
        server: summarize(&s.server),
        browser: summarize(&s.browser),
        page_took_in: summarize(&s.took_in),
        page_drew: summarize(&s.drew),
        frame: summarize(&s.frame),
        changes,
        over_100ms,
        missed: s.missed,
    }
}

/// The page's counters from Chrome (`Performance.getMetrics`): time the main thread spent in
/// tasks, script, style and layout, and its CPU time, in seconds.
async fn page_metrics(http: &reqwest::Client, browser: &Browser) -> anyhow::Result<HashMap<String, f64>> {
    let answer = cdp(http, browser, "Performance.getMetrics", json!({})).await?;
    Ok(answer["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["name"].as_str()?.to_string(), m["value"].as_f64()?)))
        .collect())
}

/// The machine's busy and total CPU time (jiffies) from /proc/stat.
fn machine_cpu() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<f64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let total: f64 = fields.iter().sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0.0) + fields.get(4).copied().unwrap_or(0.0);
    Some((total - idle, total))
}

/// A process's CPU time (user and system) in seconds, with Linux's 100 ticks a second.
fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
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
