//! Scenarios `scale-out`, `steady-churn` and `scale-limits`: `shepherd server` plus `shepherd agent`
//! processes running N simulated nodes between them; Deployments of R replicas in all scheduled
//! across them, then (for `steady-churn`) the cluster left idle, then 20 pod deletions per second.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use indexmap::IndexSet;
use rand::Rng;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::procstat;
use crate::report::{ScenarioResult, summarize};

const PODS: &str = "/api/v1/namespaces/default/pods";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const APP: &str = "scale";
/// Pods per page when the churn phase lists the pods it may delete.
const LIST_PAGE: usize = 5_000;

#[derive(Debug, Clone)]
pub struct Params {
    pub nodes: usize,
    /// Replicas in all, split evenly between `deployments` Deployments.
    pub replicas: usize,
    pub deployments: usize,
    /// Agent processes the simulated nodes are split between.
    pub agents: usize,
    /// Give up waiting for all replicas after this long (the rate so far is still reported).
    pub timeout: Duration,
    pub idle: Duration,
    pub churn: Duration,
    pub churn_rate: f64,
    /// Extra arguments for `shepherd server` (e.g. `--history-events=10000`).
    pub server_args: Vec<String>,
}

/// One `shepherd agent` process running a share of the simulated nodes.
struct Agent {
    _dir: tempfile::TempDir,
    child: Child,
    // Kept open so that the agent's later writes to stdout do not fail.
    _stdout: BufReader<ChildStdout>,
}

/// The server and the simulated-node agents, each a child process.
pub(crate) struct Cluster {
    _server_dir: tempfile::TempDir,
    pub(crate) server: Process,
    agents: Vec<Agent>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for agent in &mut self.agents {
            let _ = agent.child.kill();
            let _ = agent.child.wait();
        }
    }
}

impl Cluster {
    /// The server's and the (first) agent's process ids, for reading their CPU time.
    pub(crate) fn pids(&self) -> (u32, u32) {
        (self.server.child.id(), self.agents.first().map_or(0, |a| a.child.id()))
    }

    fn server_pid(&self) -> String {
        self.server.child.id().to_string()
    }
    /// `read` (one of `procstat`'s per-process figures) added up over the agent processes; for
    /// peak RSS, the sum of each process's own peak.
    fn agents_total(&self, read: fn(&str) -> f64) -> f64 {
        self.agents.iter().map(|a| read(&a.child.id().to_string())).sum()
    }
}

/// The `index`th of `count` Deployments; each selects its own pods, all carry `app=scale`.
fn deployment(index: usize, count: usize, replicas: usize) -> Value {
    let name = if count == 1 { APP.to_string() } else { format!("{APP}-{index}") };
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {"app": APP}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": APP, "part": index.to_string()}},
            "template": {"metadata": {"labels": {"app": APP, "part": index.to_string()}},
                "spec": {"containers": [{"name": "main", "image": "minimal",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

fn is_ready(obj: &Value) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn is_running_ready(p: &Value) -> bool {
    p.pointer("/metadata/deletionTimestamp").is_none()
        && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && is_ready(p)
}

pub(crate) async fn start_cluster(binary: &Path, nodes: usize, extra: &[String]) -> anyhow::Result<(Cluster, Duration)> {
    start_cluster_split(binary, nodes, 1, extra).await
}

/// Starts `shepherd agent --simulate-nodes` with `nodes` named `{prefix}0..` and waits for its
/// first line (printed once its nodes are registered).
async fn start_agent(binary: &Path, url: &str, nodes: usize, prefix: &str) -> anyhow::Result<Agent> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(binary)
        .args(["agent", "--server", url, "--simulate-nodes", &nodes.to_string(), "--node-name-prefix", prefix])
        .args(["--simulated-ready-ms", "100", "--lease-seconds", "10", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting the agent: {e}"))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no agent stdout"))?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    // Read off the async runtime.
    let (line, reader) = tokio::task::spawn_blocking(move || {
        let r = reader.read_line(&mut line);
        (r.map(|_| line), reader)
    })
    .await?;
    let line = line?;
    anyhow::ensure!(line.starts_with("shepherd agent"), "unexpected first line from the agent: {line:?}");
    Ok(Agent { _dir: dir, child, _stdout: reader })
}

/// A server and `agents` agent processes running `nodes` simulated nodes between them (`sim-0..`
/// with one agent, `sim-{agent}-0..` with several); returns once every node is Ready.
pub(crate) async fn start_cluster_split(binary: &Path, nodes: usize, agents: usize, extra: &[String]) -> anyhow::Result<(Cluster, Duration)> {
    let server_dir = tempfile::tempdir()?;
    let data = server_dir.path().to_string_lossy().to_string();
    let mut args = vec!["server", "--data-dir", &data, "--controller-workers", "4"];
    args.extend(extra.iter().map(String::as_str));
    // A /24 per node, as Kubernetes gives; the default /16 has blocks for 256 nodes only, and
    // the nodes beyond would be left without one (a warning and an Event each).
    let cidr;
    if nodes > 256 && !extra.iter().any(|a| a.starts_with("--cluster-cidr")) {
        let bits = usize::BITS - (nodes - 1).leading_zeros();
        cidr = format!("--cluster-cidr=10.0.0.0/{}", 24 - bits.min(16));
        args.push(&cidr);
    }
    let server = Process::start(binary, &args)?;
    let started = Instant::now();
    let mut cluster = Cluster { _server_dir: server_dir, server, agents: Vec::new() };
    let agents = agents.clamp(1, nodes.max(1));
    for a in 0..agents {
        let share = nodes / agents + usize::from(a < nodes % agents);
        let prefix = if agents == 1 { "sim-".to_string() } else { format!("sim-{a}-") };
        cluster.agents.push(start_agent(binary, &cluster.server.url, share, &prefix).await?);
    }
    let http = reqwest::Client::new();
    loop {
        let list: Value = http.get(format!("{}/api/v1/nodes", cluster.server.url)).send().await?.json().await?;
        let ready = list["items"].as_array().map_or(0, |ns| ns.iter().filter(|n| is_ready(n)).count());
        if ready >= nodes {
            break;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(300), "{ready}/{nodes} nodes Ready after 300 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok((cluster, started.elapsed()))
}

/// Ready replicas summed over the Deployments.
async fn ready_replicas(http: &reqwest::Client, url: &str) -> anyhow::Result<usize> {
    let list: Value = http.get(format!("{url}{DEPLOYMENTS}?labelSelector=app%3D{APP}")).send().await?.json().await?;
    let items = list["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(items.iter().map(|d| d.pointer("/status/readyReplicas").and_then(Value::as_u64).unwrap_or(0) as usize).sum())
}

/// Creates the Deployment and waits for all its replicas to be Ready; returns the results.
pub(crate) async fn scale_out(c: &Cluster, p: &Params, http: &reqwest::Client) -> anyhow::Result<Value> {
    let spid = c.server_pid();
    let (server_cpu0, agent_cpu0) = (procstat::cpu_seconds(&spid), c.agents_total(procstat::cpu_seconds));
    let rss_before = procstat::rss_mib(&spid);
    let started = Instant::now();
    for i in 0..p.deployments {
        // The first Deployments take the remainder, so that the sizes add up to `replicas`.
        let size = p.replicas / p.deployments + usize::from(i < p.replicas % p.deployments);
        let r = http.post(format!("{}{DEPLOYMENTS}", c.server.url)).json(&deployment(i, p.deployments, size)).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating Deployment {i}: {}", r.status());
    }
    let mut timeline = Vec::new();
    let mut last_print = Instant::now();
    let mut ready;
    loop {
        ready = ready_replicas(http, &c.server.url).await?;
        let t = started.elapsed();
        timeline.push(json!([t.as_secs_f64(), ready]));
        if ready >= p.replicas || t >= p.timeout {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(2) {
            println!("  {:.1} s: {ready}/{} ready, server RSS {:.0} MiB", t.as_secs_f64(), p.replicas, procstat::rss_mib(&spid));
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = started.elapsed();
    let complete = ready >= p.replicas;
    let server_cpu = procstat::cpu_seconds(&spid) - server_cpu0;
    let agent_cpu = c.agents_total(procstat::cpu_seconds) - agent_cpu0;
    let (server_peak, agent_peak) = (procstat::peak_rss_mib(&spid), c.agents_total(procstat::peak_rss_mib));
    let rate = ready as f64 / elapsed.as_secs_f64();
    if complete {
        println!("{} pods Running and Ready on {} nodes in {:.2} s ({rate:.0} pods/s)", p.replicas, p.nodes, elapsed.as_secs_f64());
    } else {
        println!("NOT complete: {ready}/{} Ready after {:.1} s ({rate:.0} pods/s so far)", p.replicas, elapsed.as_secs_f64());
    }
    println!("control plane: peak RSS {server_peak:.1} MiB (before the Deployment {rss_before:.1}), CPU {server_cpu:.2} s");
    println!("agents ({} simulated nodes in {}): peak RSS {agent_peak:.1} MiB, CPU {agent_cpu:.2} s", p.nodes, c.agents.len());
    Ok(json!({"complete": complete, "ready": ready, "seconds_to_all_ready": elapsed.as_secs_f64(), "pods_per_s": rate,
        "control_plane_peak_rss_mib": server_peak, "control_plane_rss_before_mib": rss_before,
        "control_plane_cpu_seconds": server_cpu, "agent_peak_rss_mib": agent_peak, "agent_cpu_seconds": agent_cpu,
        "load_average": procstat::load_average(), "timeline_s_ready": timeline}))
}

fn params_json(p: &Params, with_churn: bool) -> Value {
    let mut v = json!({"nodes": p.nodes, "replicas": p.replicas, "deployments": p.deployments, "image": "minimal", "simulated_ready_ms": 100,
        "lease_seconds": 10, "controller_workers": 4, "poll_ms": 250, "timeout_s": p.timeout.as_secs_f64(), "server_args": p.server_args});
    if with_churn {
        v["idle_s"] = json!(p.idle.as_secs_f64());
        v["churn_s"] = json!(p.churn.as_secs_f64());
        v["deletions_per_s"] = json!(p.churn_rate);
    }
    v
}

pub async fn run_scale_out(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario scale-out: {} simulated nodes, {} `minimal` replicas in {} Deployment(s)",
        p.nodes, p.replicas, p.deployments
    );
    let (cluster, nodes_ready) = start_cluster(binary, p.nodes, &p.server_args).await?;
    println!("{} nodes Ready {:.2} s after the agent started", p.nodes, nodes_ready.as_secs_f64());
    let http = reqwest::Client::new();
    let mut values = scale_out(&cluster, &p, &http).await?;
    values["seconds_to_nodes_ready"] = json!(nodes_ready.as_secs_f64());
    // The split variant gets its own results file.
    let name = if p.deployments == 1 { "scale-out" } else { "scale-out-split" };
    Ok(ScenarioResult { name, params: params_json(&p, false), values })
}

/// The counters in `/metrics` the steady-state phase reports: store writes, and API requests by
/// verb and resource (a subresource is part of the resource, `nodes/status`), summed over codes.
pub(crate) struct Counters {
    writes: f64,
    pub(crate) requests: HashMap<String, f64>,
}

impl Counters {
    fn requests(&self) -> f64 {
        self.requests.values().sum()
    }
}

/// The value of `label` in a metric's label set, `{verb="PUT",resource="leases",code="200"}`.
fn label<'a>(labels: &'a str, label: &str) -> &'a str {
    let key = format!("{label}=\"");
    labels.split_once(&key).and_then(|(_, rest)| rest.split_once('"')).map(|(v, _)| v).unwrap_or("")
}

pub(crate) async fn counters(http: &reqwest::Client, url: &str) -> anyhow::Result<Counters> {
    let text = http.get(format!("{url}/metrics")).send().await?.text().await?;
    let mut c = Counters { writes: 0.0, requests: HashMap::new() };
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let value: f64 = value.parse().unwrap_or(0.0);
        let (metric, labels) = name.split_once('{').unwrap_or((name, ""));
        if metric == "shepherd_store_write_duration_seconds_count" {
            c.writes += value;
        } else if metric == "apiserver_request_total" {
            let key = format!("{} {}", label(labels, "verb"), label(labels, "resource"));
            *c.requests.entry(key).or_default() += value;
        }
    }
    Ok(c)
}

async fn steady(c: &Cluster, p: &Params, http: &reqwest::Client) -> anyhow::Result<Value> {
    let spid = c.server_pid();
    let before = counters(http, &c.server.url).await?;
    let cpu0 = procstat::cpu_seconds(&spid);
    let agent_cpu0 = c.agents_total(procstat::cpu_seconds);
    let started = Instant::now();
    let mut rss_max: f64 = 0.0;
    while started.elapsed() < p.idle {
        rss_max = rss_max.max(procstat::rss_mib(&spid));
        tokio::time::sleep(Duration::from_millis(500).min(p.idle)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = procstat::cpu_seconds(&spid) - cpu0;
    let agent_cpu = c.agents_total(procstat::cpu_seconds) - agent_cpu0;
    let after = counters(http, &c.server.url).await?;
    // The second scrape itself is one request; not counted.
    let writes = (after.writes - before.writes) / secs;
    let requests = (after.requests() - before.requests() - 1.0).max(0.0) / secs;
    let mut by_kind: Vec<(String, f64)> = after
        .requests
        .iter()
        .map(|(k, v)| (k.clone(), (v - before.requests.get(k).copied().unwrap_or(0.0)) / secs))
        .filter(|(_, rate)| *rate > 0.0)
        .collect();
    by_kind.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rss = procstat::rss_mib(&spid);
    let cpu_pct = cpu / secs * 100.0;
    println!("steady state ({secs:.0} s idle): control plane CPU {cpu_pct:.2}% of one core, RSS {rss:.1} MiB (max {rss_max:.1}), \
              store writes {writes:.1}/s, API requests {requests:.1}/s; agent CPU {:.2}% of one core", agent_cpu / secs * 100.0);
    let listed: Vec<String> = by_kind.iter().map(|(k, r)| format!("{k} {r:.1}/s")).collect();
    println!("  API requests by verb and resource: {}", listed.join(", "));
    let by_kind: serde_json::Map<String, Value> = by_kind.into_iter().map(|(k, r)| (k, json!(r))).collect();
    Ok(json!({"seconds": secs, "control_plane_cpu_percent_of_core": cpu_pct, "control_plane_cpu_seconds": cpu,
        "control_plane_rss_mib": rss, "control_plane_rss_max_mib": rss_max, "store_writes_per_s": writes,
        "api_requests_per_s": requests, "api_requests_per_s_by_verb_and_resource": by_kind,
        "agent_cpu_percent_of_core": agent_cpu / secs * 100.0,
        "agent_rss_mib": c.agents_total(procstat::rss_mib), "load_average": procstat::load_average()}))
}

/// What the pod watch has seen during churn.
#[derive(Default)]
struct Seen {
    /// Pods that are Running and Ready and may be deleted. A set with positions, so that taking
    /// one at random and dropping one by name cost the same at 150,000 pods as at 10: with a list
    /// scanned per event the watch fell seconds behind the server and the replacement latency
    /// measured the benchmark.
    pool: IndexSet<String>,
    /// UIDs ever seen Ready (so that a pod counts as a replacement once; names are reused).
    ready_once: HashSet<String>,
    /// Pods created during churn, as they first became Ready, in order.
    replacements: Vec<Replacement>,
}

/// A pod that became Ready during churn.
struct Replacement {
    at: Instant,
    /// Its ReplicaSet, which replaces deletions of its own pods only.
    owner: String,
    /// When the pod was created, scheduled, started and Ready, by its own timestamps (seconds).
    stages: String,
}

/// The ReplicaSet a pod's generated name belongs to (`{replicaset}-{suffix}`).
fn owner_of(pod_name: &str) -> &str {
    pod_name.rsplit_once('-').map_or(pod_name, |(owner, _)| owner)
}

/// A pod's creation, scheduling, start and readiness times as it records them.
fn stages(pod: &Value) -> String {
    let condition = |t: &str| {
        pod.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .and_then(|c| c["lastTransitionTime"].as_str())
            .unwrap_or("-")
            .to_string()
    };
    let at = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("-").to_string();
    format!(
        "created {} scheduled {} started {} ready {}",
        at("/metadata/creationTimestamp"),
        condition("PodScheduled"),
        at("/status/startTime"),
        condition("Ready")
    )
}

/// Follows pod events from `rv`: keeps the pool of deletable pods and records replacements.
async fn watch_pods(http: reqwest::Client, url: String, rv: String, seen: Arc<Mutex<Seen>>, churn_start: Instant) -> anyhow::Result<()> {
    let resp = http.get(format!("{url}{PODS}?labelSelector=app%3D{APP}&watch=true&resourceVersion={rv}")).send().await?;
    anyhow::ensure!(resp.status().is_success(), "watch: {}", resp.status());
    let mut body = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk?);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let Ok(ev) = serde_json::from_slice::<Value>(&line) else { continue };
            let obj = &ev["object"];
            let Some(name) = obj.pointer("/metadata/name").and_then(Value::as_str) else { continue };
            let uid = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or(name);
            let now = Instant::now();
            let mut s = seen.lock().unwrap();
            if ev["type"] == "DELETED" || !is_running_ready(obj) {
                s.pool.swap_remove(name);
            } else if s.ready_once.insert(uid.to_string()) {
                s.pool.insert(name.to_string());
                if now >= churn_start {
                    s.replacements.push(Replacement { at: now, owner: owner_of(name).to_string(), stages: stages(obj) });
                }
            }
        }
    }
    Ok(())
}

async fn churn(c: &Cluster, p: &Params, http: &reqwest::Client) -> anyhow::Result<Value> {
    let url = c.server.url.clone();
    let seen = Arc::new(Mutex::new(Seen::default()));
    // In pages, as a client of 150,000 pods would list them: every page is read at the first
    // page's revision, which the watch then follows.
    let mut rv = String::new();
    let mut next = String::new();
    loop {
        let page: Value = http
            .get(format!("{url}{PODS}"))
            .query(&[("labelSelector", format!("app={APP}")), ("limit", LIST_PAGE.to_string()), ("continue", next.clone())])
            .send()
            .await?
            .json()
            .await?;
        if rv.is_empty() {
            rv = page.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("0").to_string();
        }
        let mut s = seen.lock().unwrap();
        for pod in page["items"].as_array().into_iter().flatten() {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let uid = pod["metadata"]["uid"].as_str().map_or_else(|| name.clone(), str::to_string);
            if is_running_ready(pod) {
                s.pool.insert(name);
            }
            s.ready_once.insert(uid);
        }
        match page.pointer("/metadata/continue").and_then(Value::as_str) {
            Some(token) if !token.is_empty() => next = token.to_string(),
            _ => break,
        }
    }
    let spid = c.server_pid();
    let cpu0 = procstat::cpu_seconds(&spid);
    let start = Instant::now();
    let watcher = tokio::spawn(watch_pods(http.clone(), url.clone(), rv, seen.clone(), start));
    let deletions: Arc<Mutex<Vec<(Instant, Duration, String)>>> = Arc::default();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / p.churn_rate));
    let mut tasks = Vec::new();
    let mut skipped = 0usize;
    while start.elapsed() < p.churn {
        tick.tick().await;
        let victim = {
            let mut s = seen.lock().unwrap();
            match s.pool.len() {
                0 => None,
                n => s.pool.swap_remove_index(rand::rng().random_range(0..n)),
            }
        };
        let Some(victim) = victim else {
            skipped += 1;
            continue;
        };
        let (http, url, deletions) = (http.clone(), url.clone(), deletions.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = http.delete(format!("{url}{PODS}/{victim}")).send().await?;
            let latency = t.elapsed();
            if r.status().is_success() {
                deletions.lock().unwrap().push((t, latency, owner_of(&victim).to_string()));
            }
            Ok::<_, anyhow::Error>(r.status().as_u16())
        }));
    }
    let mut failed = 0;
    for t in tasks {
        if !matches!(t.await?, Ok(200..=299)) {
            failed += 1;
        }
    }
    let churn_secs = start.elapsed().as_secs_f64();
    let cpu = procstat::cpu_seconds(&spid) - cpu0;
    // Wait for the Deployment to be whole again (and the last replacements to show on the watch).
    let settle = Instant::now();
    while ready_replicas(http, &url).await? < p.replicas && settle.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    if watcher.is_finished() {
        match watcher.await {
            Ok(Err(e)) => println!("pod watch ended early: {e:#}"),
            _ => println!("pod watch ended early"),
        }
    } else {
        watcher.abort();
    }
    let mut dels = deletions.lock().unwrap().clone();
    dels.sort_by_key(|d| d.0);
    let delete_latency = summarize(&dels.iter().map(|d| d.1).collect::<Vec<_>>());
    // A ReplicaSet's i-th deletion is replaced by the i-th of its pods that became Ready after it.
    let mut ready: HashMap<String, VecDeque<Replacement>> = HashMap::new();
    for r in std::mem::take(&mut seen.lock().unwrap().replacements) {
        ready.entry(r.owner.clone()).or_default().push_back(r);
    }
    // (deletion to replacement Ready, deletion's time into churn, ReplicaSet, the pod's stages)
    let mut matched: Vec<(Duration, Duration, &str, String)> = Vec::new();
    for (t, _, owner) in &dels {
        let Some(queue) = ready.get_mut(owner) else { continue };
        while queue.front().is_some_and(|r| r.at < *t) {
            queue.pop_front();
        }
        if let Some(r) = queue.pop_front() {
            matched.push((r.at - *t, *t - start, owner, r.stages));
        }
    }
    let replace: Vec<Duration> = matched.iter().map(|m| m.0).collect();
    matched.sort_by_key(|m| std::cmp::Reverse(m.0));
    for (took, after, owner, stages) in matched.iter().take(5) {
        println!("  slow replacement: {:.1} s, deleted {:.1} s into churn, {owner}: {stages}", took.as_secs_f64(), after.as_secs_f64());
    }
    let unreplaced = dels.len() - replace.len();
    let replacement = summarize(&replace);
    let final_ready = ready_replicas(http, &url).await?;
    let by_code: HashMap<&str, usize> = [("deleted", dels.len()), ("failed", failed), ("no_ready_pod_to_delete", skipped)].into();
    println!("churn ({churn_secs:.0} s at {}/s): {} deletions; DELETE latency {delete_latency}", p.churn_rate, dels.len());
    println!("deleted pod -> a replacement Running and Ready: {replacement}; {unreplaced} not matched; readyReplicas at end {final_ready}/{}", p.replicas);
    println!("control plane CPU during churn: {:.1}% of one core, RSS {:.1} MiB", cpu / churn_secs * 100.0, procstat::rss_mib(&spid));
    Ok(json!({"seconds": churn_secs, "deletions": by_code, "delete_latency": delete_latency,
        "replacement_ready": replacement, "unmatched_deletions": unreplaced, "ready_replicas_at_end": final_ready,
        "control_plane_cpu_percent_of_core": cpu / churn_secs * 100.0, "control_plane_rss_mib": procstat::rss_mib(&spid),
        "control_plane_peak_rss_mib": procstat::peak_rss_mib(&spid), "load_average": procstat::load_average()}))
}

pub async fn run_steady_churn(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario steady-churn: {} simulated nodes, Deployment of {}; idle {:.0} s; then {}/s pod deletions for {:.0} s",
        p.nodes,
        p.replicas,
        p.idle.as_secs_f64(),
        p.churn_rate,
        p.churn.as_secs_f64()
    );
    let (cluster, nodes_ready) = start_cluster(binary, p.nodes, &p.server_args).await?;
    let http = reqwest::Client::new();
    let mut scale = scale_out(&cluster, &p, &http).await?;
    scale["seconds_to_nodes_ready"] = json!(nodes_ready.as_secs_f64());
    anyhow::ensure!(scale["complete"] == true, "the Deployment never became fully Ready; no steady state to measure");
    let steady = steady(&cluster, &p, &http).await?;
    let churn = churn(&cluster, &p, &http).await?;
    Ok(ScenarioResult {
        name: "steady-churn",
        params: params_json(&p, true),
        values: json!({"scale_out": scale, "steady_state": steady, "churn": churn}),
    })
}

/// Kubernetes' published scalability SLOs the `scale-limits` scenario is held to.
const MUTATING_P99_SLO_MS: f64 = 1_000.0;
const STARTUP_P99_SLO_MS: f64 = 5_000.0;
const PEAK_RSS_TARGET_MIB: f64 = 4_096.0;

/// Kubernetes' own limits (5,000 nodes, 150,000 pods): the pods as `deployments` Deployments on
/// nodes run by `agents` agent processes, all Ready, then pod deletions at a fixed rate; reports
/// the time it took, the control plane's peak RSS, DELETE latency and replacement latency against
/// the SLOs.
pub async fn run_scale_limits(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario scale-limits: {} simulated nodes in {} agent processes, {} `minimal` pods in {} Deployments; then {}/s pod deletions for {:.0} s",
        p.nodes,
        p.agents,
        p.replicas,
        p.deployments,
        p.churn_rate,
        p.churn.as_secs_f64()
    );
    let started = Instant::now();
    let (cluster, nodes_ready) = start_cluster_split(binary, p.nodes, p.agents, &p.server_args).await?;
    println!("{} nodes Ready {:.1} s after the agents started", p.nodes, nodes_ready.as_secs_f64());
    let http = reqwest::Client::new();
    let mut scale = scale_out(&cluster, &p, &http).await?;
    scale["seconds_to_nodes_ready"] = json!(nodes_ready.as_secs_f64());
    anyhow::ensure!(scale["complete"] == true, "the pods never all became Ready; no churn to measure");
    let churn = churn(&cluster, &p, &http).await?;
    let total = started.elapsed().as_secs_f64();
    let peak = procstat::peak_rss_mib(&cluster.server_pid());
    let p99 = |key: &str| churn[key]["p99_ms"].as_f64().unwrap_or(f64::INFINITY);
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    let (mutating, startup) = (p99("delete_latency"), p99("replacement_ready"));
    println!("SLO mutating call p99 <= 1 s: DELETE p99 {mutating:.1} ms, {}", verdict(mutating <= MUTATING_P99_SLO_MS));
    println!("SLO pod startup p99 <= 5 s: replacement p99 {startup:.1} ms, {}", verdict(startup <= STARTUP_P99_SLO_MS));
    println!("control plane peak RSS {peak:.0} MiB (target < 4 GiB: {}); whole run {total:.0} s", verdict(peak < PEAK_RSS_TARGET_MIB));
    let mut params = params_json(&p, true);
    params["agents"] = json!(p.agents);
    Ok(ScenarioResult {
        name: "scale-limits",
        params,
        values: json!({"scale_out": scale, "churn": churn, "seconds_total": total, "control_plane_peak_rss_mib": peak,
            "slo": {"mutating_p99_ms": mutating, "mutating_met": mutating <= MUTATING_P99_SLO_MS,
                "startup_p99_ms": startup, "startup_met": startup <= STARTUP_P99_SLO_MS,
                "peak_rss_met": peak < PEAK_RSS_TARGET_MIB}}),
    })
}
