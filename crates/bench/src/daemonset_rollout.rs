//! Scenario `daemonset-rollout`: `shepherd server` and N simulated nodes; a DaemonSet created:
//! time until every node has its pod Ready; then its image changed: time until the rolling
//! update (RollingUpdate, `maxUnavailable`) has every node on the new image and Ready, and the
//! most pods seen unavailable at once on the way.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::procstat;
use crate::report::ScenarioResult;
use crate::scale::start_cluster;

const DAEMONSETS: &str = "/apis/apps/v1/namespaces/default/daemonsets";

#[derive(Debug, Clone)]
pub struct Params {
    pub nodes: usize,
    /// `maxUnavailable` of the rolling update: a count (`1`) or a percentage (`10%`).
    pub max_unavailable: String,
    pub timeout: Duration,
}

fn daemonset(max_unavailable: &Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "main", "image": "minimal:1",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}})
}

/// `1` as a number, `10%` as a string, as the API wants an IntOrString.
fn int_or_percent(s: &str) -> Value {
    s.parse::<i64>().map_or_else(|_| json!(s), |n| json!(n))
}

fn status_count(ds: &Value, field: &str) -> usize {
    ds.pointer(&format!("/status/{field}")).and_then(Value::as_u64).unwrap_or(0) as usize
}

/// Polls the DaemonSet every 100 ms until `done`; the time it took and the most pods seen
/// unavailable (desired minus available) meanwhile.
async fn wait(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<(Duration, usize)> {
    let (started, mut last_print, mut most_unavailable) = (Instant::now(), Instant::now(), 0);
    loop {
        let ds: Value = http.get(format!("{url}{DAEMONSETS}/agent")).send().await?.json().await?;
        most_unavailable = most_unavailable.max(status_count(&ds, "numberUnavailable"));
        if done(&ds) {
            return Ok((started.elapsed(), most_unavailable));
        }
        anyhow::ensure!(started.elapsed() < limit, "{what} not reached after {limit:?}: {}", ds["status"]);
        if last_print.elapsed() >= Duration::from_secs(2) {
            println!("  {:.1} s: ready {}, updated {}, unavailable {}", started.elapsed().as_secs_f64(),
                status_count(&ds, "numberReady"), status_count(&ds, "updatedNumberScheduled"), status_count(&ds, "numberUnavailable"));
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!("scenario daemonset-rollout: {} simulated nodes, a DaemonSet, then an image update with maxUnavailable {}", p.nodes, p.max_unavailable);
    let (cluster, nodes_ready) = start_cluster(binary, p.nodes, &[]).await?;
    println!("{} nodes Ready {:.2} s after the agent started", p.nodes, nodes_ready.as_secs_f64());
    let http = reqwest::Client::new();
    let url = cluster.server.url.clone();
    let spid = cluster.server.child.id().to_string();
    let n = p.nodes;

    let cpu0 = procstat::cpu_seconds(&spid);
    let r = http.post(format!("{url}{DAEMONSETS}")).json(&daemonset(&int_or_percent(&p.max_unavailable))).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the DaemonSet: {} {}", r.status(), r.text().await.unwrap_or_default());
    let everywhere = |ds: &Value| status_count(ds, "desiredNumberScheduled") == n && status_count(ds, "numberReady") == n;
    let (created, _) = wait(&http, &url, "a Ready pod on every node", p.timeout, everywhere).await?;
    let create_cpu = procstat::cpu_seconds(&spid) - cpu0;
    println!("DaemonSet created -> a Ready pod on all {n} nodes: {:.2} s ({:.0} pods/s)", created.as_secs_f64(), n as f64 / created.as_secs_f64());

    let cpu0 = procstat::cpu_seconds(&spid);
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "minimal:2"}]}}}});
    let r = http
        .patch(format!("{url}{DAEMONSETS}/agent"))
        .header("Content-Type", "application/strategic-merge-patch+json")
        .json(&patch)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "updating the image: {}", r.status());
    let generation = r.json::<Value>().await?.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
    let rolled = |ds: &Value| {
        ds.pointer("/status/observedGeneration").and_then(Value::as_i64) >= Some(generation)
            && status_count(ds, "updatedNumberScheduled") == n
            && status_count(ds, "numberAvailable") == n
    };
    let (rollout, most_unavailable) = wait(&http, &url, "every node on the new image and Ready", p.timeout, rolled).await?;
    let rollout_cpu = procstat::cpu_seconds(&spid) - cpu0;
    println!("image changed -> every node's pod replaced and Ready: {:.2} s ({:.0} nodes/s); most unavailable at once: {most_unavailable}",
        rollout.as_secs_f64(), n as f64 / rollout.as_secs_f64());
    println!("control plane CPU: {create_cpu:.1} s for the creation, {rollout_cpu:.1} s for the rollout; peak RSS {:.0} MiB",
        procstat::peak_rss_mib(&spid));
    Ok(ScenarioResult {
        name: "daemonset-rollout",
        params: json!({"nodes": n, "max_unavailable": p.max_unavailable, "simulated_ready_ms": 100, "controller_workers": 4,
            "poll_ms": 100, "timeout_s": p.timeout.as_secs_f64()}),
        values: json!({"seconds_to_all_ready": created.as_secs_f64(), "seconds_to_rolled_out": rollout.as_secs_f64(),
            "most_unavailable_seen": most_unavailable, "seconds_to_nodes_ready": nodes_ready.as_secs_f64(),
            "control_plane_cpu_seconds_create": create_cpu, "control_plane_cpu_seconds_rollout": rollout_cpu,
            "control_plane_peak_rss_mib": procstat::peak_rss_mib(&spid), "load_average": procstat::load_average()}),
    })
}
