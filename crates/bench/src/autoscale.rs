//! Scenario `hpa-reaction`: how long a HorizontalPodAutoscaler takes from the moment its
//! Deployment's pod starts burning CPU to new pods Running and Ready, on `shepherd standalone`
//! with real processes (usage from cgroups, reported by the agent, read by the autoscaler).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const HPAS: &str = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers";

pub struct Params {
    pub runs: usize,
    /// The autoscaler's sync period (`--hpa-sync-seconds`).
    pub sync_seconds: f64,
}

/// A Deployment of one pod that idles until `trigger` exists, then spins (held to 200m, twice
/// its 100m request: four times a 50% target).
fn deployment(name: &str, trigger: &str) -> Value {
    let script = format!("while [ ! -e {trigger} ]; do sleep 0.1; done; while :; do :; done");
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "minimal", "command": ["sh", "-c", script],
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}}]}}}})
}

fn autoscaler(name: &str) -> Value {
    json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]}})
}

async fn get(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    Ok(http.get(url).send().await?.json().await?)
}

/// Polls every 50 ms until `done` holds for the object at `url`.
async fn wait(http: &reqwest::Client, url: &str, what: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        if done(&get(http, url).await?) {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(start.elapsed() < limit, "{what} not reached after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn scaling_active(hpa: &Value) -> bool {
    hpa.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "ScalingActive" && c["status"] == "True"))
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!("scenario hpa-reaction: standalone, process runtime, HPA 50% CPU over 1..3 pods, sync {} s, {} runs", p.sync_seconds, p.runs);
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data").to_string_lossy().to_string();
    let sync = p.sync_seconds.to_string();
    let mut server = Process::start(binary, &["standalone", "--data-dir", &data, "--runtime", "process", "--pod-network", "host", "--hpa-sync-seconds", &sync])?;
    let http = reqwest::Client::new();
    let limit = Duration::from_secs(180);
    let (mut decided, mut ready) = (Vec::new(), Vec::new());
    for i in 0..p.runs {
        let name = format!("load-{i}");
        let trigger = dir.path().join(format!("{name}.go")).to_string_lossy().to_string();
        let deploy_url = format!("{}{DEPLOYMENTS}/{name}", server.url);
        let hpa_url = format!("{}{HPAS}/{name}", server.url);
        let r = http.post(format!("{}{DEPLOYMENTS}", server.url)).json(&deployment(&name, &trigger)).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating {name}: {}", r.status());
        let r = http.post(format!("{}{HPAS}", server.url)).json(&autoscaler(&name)).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating the autoscaler {name}: {}", r.status());
        // Idle and measured: the autoscaler has a metric and keeps one replica.
        wait(&http, &hpa_url, "the autoscaler reading its idle pod", limit, scaling_active).await?;
        let started = Instant::now();
        std::fs::write(&trigger, b"")?;
        wait(&http, &deploy_url, "the autoscaler raising spec.replicas", limit, |d| d["spec"]["replicas"].as_i64() > Some(1)).await?;
        decided.push(started.elapsed());
        wait(&http, &deploy_url, "a second Ready pod", limit, |d| d["status"]["readyReplicas"].as_i64() >= Some(2)).await?;
        ready.push(started.elapsed());
        println!("run {i}: scaled after {:?}, new pods Ready after {:?}", decided[i], ready[i]);
        http.delete(&hpa_url).send().await?;
        http.delete(&deploy_url).send().await?;
        let pods = format!("{}/api/v1/namespaces/default/pods?labelSelector=app%3D{name}", server.url);
        wait(&http, &pods, "the run's pods to go", limit, |l| l["items"].as_array().is_some_and(Vec::is_empty)).await?;
    }
    let (d, r) = (summarize(&decided), summarize(&ready));
    println!("load start -> spec.replicas raised: {d}");
    println!("load start -> new pods Running and Ready: {r}");
    server.terminate(Duration::from_secs(30));
    Ok(ScenarioResult {
        name: "hpa-reaction",
        params: json!({"runs": p.runs, "sync_seconds": p.sync_seconds, "agent_metrics_interval_seconds": 5,
            "target": "50% cpu", "pod": "busy loop held to 200m, requests 100m"}),
        values: json!({"scaled": d, "new_pods_ready": r}),
    })
}
