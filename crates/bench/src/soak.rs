//! Scenario `soak`: `shepherd standalone` (process runtime) under steady pod churn for a given
//! time: one 10-replica Deployment, one pod deleted every 0.1 s, the daemon's RSS, data directory
//! size, open descriptors, threads and processes sampled every 10 s, to show that memory and
//! disk level off (Events expire after `--event-ttl`, the watch history is bounded) instead of
//! growing with the number of pods ever created.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::procstat;
use crate::report::ScenarioResult;

const PODS: &str = "/api/v1/namespaces/default/pods";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const APP: &str = "soak";
const REPLICAS: usize = 10;

#[derive(Debug, Clone)]
pub struct Params {
    pub duration: Duration,
    pub deletion_interval: Duration,
    pub sample_interval: Duration,
    /// Extra arguments for `shepherd standalone` (e.g. `--event-ttl=60s`).
    pub server_args: Vec<String>,
}

/// `300` (seconds), or a duration as Kubernetes writes it: `300s`, `5m`, `1h`, `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => shepherd_api::duration::parse(s),
    }
}

fn deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": APP},
        "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": APP}},
            "template": {"metadata": {"labels": {"app": APP}},
                "spec": {"containers": [{"name": "main", "image": "minimal"}]}}}})
}

async fn pods(http: &reqwest::Client, url: &str) -> anyhow::Result<Vec<Value>> {
    let list: Value = http.get(format!("{url}{PODS}?labelSelector=app%3D{APP}")).send().await?.json().await?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// The gauges of `/metrics` the samples carry, by metric line prefix.
const GAUGES: &[(&str, &str)] = &[
    ("events", "apiserver_storage_objects{resource=\"events\"}"),
    ("pods", "apiserver_storage_objects{resource=\"pods\"}"),
    ("watch_history_events", "store_watch_history_events "),
    ("watch_history_bytes", "store_watch_history_bytes "),
    ("store_objects", "store_objects "),
    ("store_object_bytes", "store_object_bytes "),
];

async fn gauges(http: &reqwest::Client, url: &str) -> serde_json::Map<String, Value> {
    let text = match http.get(format!("{url}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    GAUGES
        .iter()
        .filter_map(|(key, prefix)| {
            let line = text.lines().find(|l| l.starts_with(prefix))?;
            let v: f64 = line.rsplit(' ').next()?.parse().ok()?;
            Some((key.to_string(), json!(v)))
        })
        .collect()
}

fn sample(server: &Process, data_dir: &Path, started: Instant, deletions: u64, mut extra: serde_json::Map<String, Value>) -> Value {
    let pid = server.child.id().to_string();
    let mut s = json!({
        "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "deletions": deletions,
        "rss_mib": (server.rss_mib() * 10.0).round() / 10.0,
        "data_dir_mib": (procstat::dir_bytes(data_dir) as f64 / (1024.0 * 1024.0) * 100.0).round() / 100.0,
        "open_fds": procstat::open_fds(&pid),
        "threads": procstat::threads(&pid),
        "processes": procstat::descendants(server.child.id()),
        "load_average": procstat::load_average(),
    });
    if let Some(obj) = s.as_object_mut() {
        obj.append(&mut extra);
    }
    s
}

/// Whether `values` (one per sample) stopped growing: the largest of the last third is within
/// `tolerance` (a fraction) of the largest before it.
fn levelled_off(values: &[f64], tolerance: f64) -> Option<bool> {
    if values.len() < 6 {
        return None;
    }
    let split = values.len() * 2 / 3;
    let before = values[..split].iter().copied().fold(0.0, f64::max);
    let after = values[split..].iter().copied().fold(0.0, f64::max);
    Some(after <= before * (1.0 + tolerance))
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario soak: standalone, process runtime, Deployment of {REPLICAS} `minimal`, a pod deleted every {:?} for {:?}, \
         sampled every {:?}, server args {:?}",
        p.deletion_interval, p.duration, p.sample_interval, p.server_args
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let mut args: Vec<&str> = vec!["standalone", "--data-dir", &data, "--runtime", "process", "--pod-network", "host"];
    args.extend(p.server_args.iter().map(String::as_str));
    let server = Process::start(binary, &args)?;
    let http = reqwest::Client::new();
    let url = server.url.clone();
    let r = http.post(format!("{url}{DEPLOYMENTS}")).json(&deployment()).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the Deployment: {}", r.status());

    let started = Instant::now();
    let mut samples = vec![sample(&server, dir.path(), started, 0, gauges(&http, &url).await)];
    let mut next_sample = started + p.sample_interval;
    let mut deletions = 0u64;
    let mut failed = 0u64;
    let mut tick = tokio::time::interval(p.deletion_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while started.elapsed() < p.duration {
        tick.tick().await;
        let all = pods(&http, &url).await.unwrap_or_default();
        // The oldest pod not already going away, so every replica takes its turn.
        let victim = all
            .iter()
            .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
            .min_by_key(|p| p.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or("").to_string());
        if let Some(name) = victim.and_then(|v| v.pointer("/metadata/name")).and_then(Value::as_str) {
            match http.delete(format!("{url}{PODS}/{name}")).send().await {
                Ok(r) if r.status().is_success() => deletions += 1,
                _ => failed += 1,
            }
        }
        if Instant::now() >= next_sample {
            next_sample += p.sample_interval;
            let s = sample(&server, dir.path(), started, deletions, gauges(&http, &url).await);
            println!("{s}");
            samples.push(s);
        }
    }
    let last = sample(&server, dir.path(), started, deletions, gauges(&http, &url).await);
    println!("{last}");
    samples.push(last);

    // Containers outlive the daemon: stop them before it goes.
    let _ = http.delete(format!("{url}{DEPLOYMENTS}/{APP}")).send().await;
    let settle = Instant::now();
    while !pods(&http, &url).await.unwrap_or_default().is_empty() && settle.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let series = |key: &str| -> Vec<f64> { samples.iter().filter_map(|s| s[key].as_f64()).collect() };
    let (rss, disk) = (series("rss_mib"), series("data_dir_mib"));
    let first_last = |v: &[f64]| json!({"first": v.first(), "last": v.last(), "max": v.iter().copied().fold(0.0, f64::max)});
    let values = json!({
        "deletions": deletions,
        "failed_deletions": failed,
        "rss_mib": first_last(&rss),
        "data_dir_mib": first_last(&disk),
        "rss_levelled_off": levelled_off(&rss, 0.1),
        "data_dir_levelled_off": levelled_off(&disk, 0.1),
        "samples": samples,
    });
    println!(
        "{deletions} deletions in {:?}: RSS {} MiB, data dir {} MiB (levelled off: RSS {}, disk {})",
        p.duration, values["rss_mib"], values["data_dir_mib"], values["rss_levelled_off"], values["data_dir_levelled_off"]
    );
    Ok(ScenarioResult {
        name: "soak",
        params: json!({"replicas": REPLICAS, "image": "minimal", "runtime": "process",
            "duration_seconds": p.duration.as_secs_f64(), "deletion_interval_seconds": p.deletion_interval.as_secs_f64(),
            "sample_interval_seconds": p.sample_interval.as_secs_f64(), "server_args": p.server_args}),
        values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soak_durations_take_seconds_minutes_or_hours() {
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn a_series_levels_off_when_its_last_third_stays_near_the_earlier_peak() {
        assert_eq!(levelled_off(&[10.0, 20.0, 30.0, 31.0, 30.0, 31.5], 0.1), Some(true));
        assert_eq!(levelled_off(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0], 0.1), Some(false));
        assert_eq!(levelled_off(&[10.0, 20.0], 0.1), None);
    }
}
