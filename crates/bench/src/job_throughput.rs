//! Scenario `job-throughput`: `shepherd server` and N simulated nodes; one Job of C short pods
//! (each exits 0 a fixed time after Running) at parallelism P: time from create to the Job's
//! Complete condition, pods completed per second, and what the control plane spent on it.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::procstat;
use crate::report::ScenarioResult;
use crate::scale::start_cluster;

const JOBS: &str = "/apis/batch/v1/namespaces/default/jobs";

#[derive(Debug, Clone)]
pub struct Params {
    pub nodes: usize,
    pub completions: usize,
    pub parallelism: usize,
    /// How long each pod runs once Running, in milliseconds.
    pub pod_ms: u64,
    pub timeout: Duration,
}

fn job(p: &Params) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "throughput"},
        "spec": {"completions": p.completions, "parallelism": p.parallelism, "backoffLimit": 6,
            "template": {"metadata": {"annotations": {"shepherd.io/simulate-exit-after-ms": p.pod_ms.to_string()}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "minimal",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

fn condition(job: &Value, type_: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario job-throughput: {} simulated nodes, a Job of {} pods of {} ms at parallelism {}",
        p.nodes, p.completions, p.pod_ms, p.parallelism
    );
    let (cluster, nodes_ready) = start_cluster(binary, p.nodes, &[]).await?;
    println!("{} nodes Ready {:.2} s after the agent started", p.nodes, nodes_ready.as_secs_f64());
    let http = reqwest::Client::new();
    let url = cluster.server.url.clone();
    let spid = cluster.server.child.id().to_string();
    let cpu0 = procstat::cpu_seconds(&spid);
    let started = Instant::now();
    let r = http.post(format!("{url}{JOBS}")).json(&job(&p)).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the Job: {} {}", r.status(), r.text().await.unwrap_or_default());
    let (mut timeline, mut last_print) = (Vec::new(), Instant::now());
    let (mut first_done, mut succeeded, mut complete, mut max_active) = (None, 0, false, 0);
    while started.elapsed() < p.timeout {
        let j: Value = http.get(format!("{url}{JOBS}/throughput")).send().await?.json().await?;
        let t = started.elapsed();
        succeeded = j.pointer("/status/succeeded").and_then(Value::as_u64).unwrap_or(0) as usize;
        let active = j.pointer("/status/active").and_then(Value::as_u64).unwrap_or(0) as usize;
        max_active = max_active.max(active);
        if succeeded > 0 && first_done.is_none() {
            first_done = Some(t);
        }
        timeline.push(json!([t.as_secs_f64(), succeeded, active]));
        anyhow::ensure!(!condition(&j, "Failed"), "the Job failed: {}", j["status"]);
        if condition(&j, "Complete") {
            complete = true;
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(2) {
            println!("  {:.1} s: {succeeded}/{} succeeded, {active} active", t.as_secs_f64(), p.completions);
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    let cpu = procstat::cpu_seconds(&spid) - cpu0;
    let rate = succeeded as f64 / elapsed.as_secs_f64();
    // Pods that cannot run faster than their own length: the bound the control plane is held against.
    let floor = (p.completions as f64 / p.parallelism.max(1) as f64).ceil() * (p.pod_ms as f64 / 1000.0 + 0.1);
    if complete {
        println!("Job Complete after {:.2} s: {} pods, {rate:.0} pods/s (pods alone: >= {floor:.1} s)", elapsed.as_secs_f64(), p.completions);
    } else {
        println!("NOT complete: {succeeded}/{} succeeded after {:.1} s ({rate:.0} pods/s so far)", p.completions, elapsed.as_secs_f64());
    }
    let peak = procstat::peak_rss_mib(&spid);
    println!("first pod succeeded after {:.2} s; most active at once {max_active}; control plane CPU {cpu:.1} s, peak RSS {peak:.0} MiB",
        first_done.unwrap_or_default().as_secs_f64());
    Ok(ScenarioResult {
        name: "job-throughput",
        params: json!({"nodes": p.nodes, "completions": p.completions, "parallelism": p.parallelism, "pod_ms": p.pod_ms,
            "simulated_ready_ms": 100, "controller_workers": 4, "poll_ms": 100, "timeout_s": p.timeout.as_secs_f64()}),
        values: json!({"complete": complete, "succeeded": succeeded, "seconds_to_complete": elapsed.as_secs_f64(),
            "pods_per_s": rate, "seconds_to_first_success": first_done.map(|d| d.as_secs_f64()), "max_active": max_active,
            "pods_alone_floor_s": floor, "seconds_to_nodes_ready": nodes_ready.as_secs_f64(),
            "control_plane_cpu_seconds": cpu, "control_plane_peak_rss_mib": peak,
            "load_average": procstat::load_average(), "timeline_s_succeeded_active": timeline}),
    })
}
