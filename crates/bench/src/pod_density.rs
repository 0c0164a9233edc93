//! Scenario `pod-density`: N running pods on one `shepherd standalone` with the process runtime,
//! and what each costs in memory: the PSS of its shim and container processes (from
//! `/proc/PID/smaps_rollup`) plus the standalone's RSS growth, divided by N. The pods are created
//! by one client by default, one after the other, so the create latencies are those of sequential
//! creates through the full standalone (its agent starting the pods created before).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Process;
use crate::procstat;
use crate::report::{ScenarioResult, summarize};

const PODS: &str = "/api/v1/namespaces/default/pods";

pub struct Params {
    pub pods: usize,
    pub clients: usize,
    pub timeout: Duration,
}

/// Pods bound to the node by name: the node agent runs them whatever its advertised pod
/// capacity (110, as the kubelet's default), which the scheduler would hold the rest to.
fn pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "density"}},
        "spec": {"nodeName": node, "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "minimal"}]}})
}

/// Memory of one process, in KiB, from its `smaps_rollup`.
#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    pss: u64,
    rss: u64,
    private: u64,
}

fn memory_of(pid: u32) -> Option<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(Memory { pss: field("Pss:"), rss: field("Rss:"), private: field("Private_Clean:") + field("Private_Dirty:") })
}

/// Minor page faults of process `pid` so far (field 10 of /proc/PID/stat).
fn minor_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(7)?.parse().ok()).unwrap_or(0)
}

/// Every process below `root`, with its parent and command name.
fn process_tree(root: u32) -> Vec<(u32, u32, String)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let (Some(open), Some((head, rest))) = (stat.find('('), stat.rsplit_once(')')) else { continue };
        let comm = head.get(open + 1..).unwrap_or_default().to_string();
        let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) else { continue };
        all.push((pid, ppid, comm));
    }
    let parent: BTreeMap<u32, u32> = all.iter().map(|(p, pp, _)| (*p, *pp)).collect();
    let below = |mut p: u32| {
        for _ in 0..64 {
            match parent.get(&p) {
                Some(&pp) if pp == root => return true,
                Some(&pp) if pp > 1 => p = pp,
                _ => return false,
            }
        }
        false
    };
    all.into_iter().filter(|(p, _, _)| below(*p)).collect()
}

/// Pods Running and Ready: a pod whose container could not start is Running too (restarting,
/// as kubelet reports it), but not Ready, and holds no container to measure.
async fn count_running(http: &reqwest::Client, url: &str) -> anyhow::Result<usize> {
    let list: Value = http.get(format!("{url}{PODS}?labelSelector=app%3Ddensity")).send().await?.json().await?;
    let ready = |p: &Value| {
        p.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    };
    Ok(list["items"].as_array().map_or(0, |items| {
        items.iter().filter(|p| p.pointer("/status/phase").and_then(Value::as_str) == Some("Running") && ready(p)).count()
    }))
}

fn stats(kib: &mut [u64]) -> Value {
    kib.sort_unstable();
    let pick = |q: f64| kib.get(((kib.len().saturating_sub(1)) as f64 * q).round() as usize).copied().unwrap_or(0);
    let mean = if kib.is_empty() { 0.0 } else { kib.iter().sum::<u64>() as f64 / kib.len() as f64 };
    json!({"n": kib.len(), "mean_kib": mean, "p50_kib": pick(0.5), "max_kib": kib.last().copied().unwrap_or(0)})
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let command = format!("shepherd-bench --shepherd {} pod-density --pods {} --clients {}", binary.display(), p.pods, p.clients);
    println!("scenario pod-density: standalone, process runtime, {} running `minimal` pods ({command})", p.pods);
    let mut server = Process::start(binary, &["standalone", "--data-dir", &data, "--runtime", "process", "--pod-network", "host"])?;
    let root = server.child.id();
    let http = reqwest::Client::new();

    let node = {
        let started = Instant::now();
        loop {
            let nodes: Value = http.get(format!("{}/api/v1/nodes", server.url)).send().await?.json().await?;
            if let Some(name) = nodes.pointer("/items/0/metadata/name").and_then(Value::as_str) {
                break name.to_string();
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "the standalone's node did not register");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // A first pod settles the agent's start-up allocations before the baseline is taken.
    let r = http.post(format!("{}{PODS}", server.url)).json(&pod("warm", &node)).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the warm-up pod: {}", r.status());
    let started = Instant::now();
    while count_running(&http, &server.url).await? < 1 {
        anyhow::ensure!(started.elapsed() < p.timeout, "the warm-up pod did not run and become Ready (is shepherd-shim beside the shepherd binary?)");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = procstat::rss_mib(&root.to_string());
    let (cpu_before, faults_before) = (procstat::cpu_seconds(&root.to_string()), minor_faults(root));

    let next = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::with_capacity(p.pods)));
    let created = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..p.clients.max(1) {
        let (http, url, next, node, n) = (http.clone(), server.url.clone(), next.clone(), node.clone(), p.pods);
        let latencies = latencies.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(());
                }
                let body = pod(&format!("density-{i}"), &node);
                let sent = Instant::now();
                let r = http.post(format!("{url}{PODS}")).json(&body).send().await?;
                anyhow::ensure!(r.status().as_u16() == 201, "creating density-{i}: {}", r.status());
                r.bytes().await?;
                latencies.lock().unwrap_or_else(|e| e.into_inner()).push(sent.elapsed());
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let creates = summarize(&latencies.lock().unwrap_or_else(|e| e.into_inner()));
    println!("pod create ({} client{}): {creates}", p.clients, if p.clients == 1 { "" } else { "s" });
    let total = p.pods + 1;
    loop {
        let running = count_running(&http, &server.url).await?;
        if running >= total {
            break;
        }
        anyhow::ensure!(created.elapsed() < p.timeout, "{running}/{total} pods Running and Ready after {:?}", p.timeout);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_running = created.elapsed();
    // The standalone's own cost of starting the pods: CPU, and the page faults that copy-on-write
    // sharing with forked processes makes it take on its own writes.
    let cpu = procstat::cpu_seconds(&root.to_string()) - cpu_before;
    let faults = minor_faults(root).saturating_sub(faults_before);
    println!("standalone while starting them: {:.2} CPU s ({:.1} ms per pod), {faults} minor page faults ({} per pod)",
        cpu, cpu * 1000.0 / p.pods as f64, faults / p.pods as u64);
    println!("{total} pods Running and Ready after {:.1} s", all_running.as_secs_f64());
    // Let the agent's status writes and the kernel's copy-on-write settle into their steady state.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_after = procstat::rss_mib(&root.to_string());

    let tree = process_tree(root);
    let (mut shim_pss, mut container_pss, mut shim_rss, mut shim_private) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut shim_programs = BTreeMap::<String, usize>::new();
    for (pid, ppid, comm) in &tree {
        let Some(m) = memory_of(*pid) else { continue };
        if *ppid == root {
            shim_pss.push(m.pss);
            shim_rss.push(m.rss);
            shim_private.push(m.private);
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|e| e.display().to_string()).unwrap_or_default();
            *shim_programs.entry(format!("{comm} ({exe})")).or_default() += 1;
        } else {
            container_pss.push(m.pss);
        }
    }
    let (shim_sum, container_sum): (u64, u64) = (shim_pss.iter().sum(), container_pss.iter().sum());
    let growth_kib = ((rss_after - rss_before) * 1024.0).max(0.0);
    let per_pod_kib = (shim_sum + container_sum) as f64 / total as f64 + growth_kib / p.pods.max(1) as f64;
    let shims = stats(&mut shim_pss);
    let containers = stats(&mut container_pss);
    let shim_rss = stats(&mut shim_rss);
    let shim_private = stats(&mut shim_private);
    println!("shim processes {shim_programs:?}");
    println!(
        "shim PSS: mean {:.0} KiB, p50 {} KiB, max {} KiB (RSS p50 {} KiB, private p50 {} KiB; n={})",
        shims["mean_kib"].as_f64().unwrap_or(0.0),
        shims["p50_kib"],
        shims["max_kib"],
        shim_rss["p50_kib"],
        shim_private["p50_kib"],
        shims["n"]
    );
    println!(
        "container PSS: mean {:.0} KiB, p50 {} KiB (n={})",
        containers["mean_kib"].as_f64().unwrap_or(0.0),
        containers["p50_kib"],
        containers["n"]
    );
    println!(
        "standalone RSS {rss_before:.1} -> {rss_after:.1} MiB ({:.0} KiB per pod); total per pod {per_pod_kib:.0} KiB",
        growth_kib / p.pods.max(1) as f64
    );

    // Containers outlive the daemon: stop them before it goes.
    for name in std::iter::once("warm".to_string()).chain((0..p.pods).map(|i| format!("density-{i}"))) {
        http.delete(format!("{}{PODS}/{name}", server.url)).send().await?.bytes().await?;
    }
    let settle = Instant::now();
    while !process_tree(root).is_empty() && settle.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.terminate(Duration::from_secs(30));

    Ok(ScenarioResult {
        name: "pod-density",
        params: json!({"pods": p.pods, "clients": p.clients, "image": "minimal", "runtime": "process", "command": command}),
        values: json!({"create": creates, "all_running_s": all_running.as_secs_f64(), "standalone_cpu_s_starting": cpu,
            "standalone_minor_faults_starting": faults, "shim_pss": shims, "shim_rss": shim_rss,
            "shim_private": shim_private, "container_pss": containers, "shim_programs": shim_programs,
            "standalone_rss_mib_before": rss_before, "standalone_rss_mib_after": rss_after,
            "standalone_rss_growth_kib_per_pod": growth_kib / p.pods.max(1) as f64, "total_kib_per_pod": per_pod_kib}),
    })
}
