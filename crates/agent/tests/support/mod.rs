//! A real in-process API server and agents on it, and helpers to wait for pods.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_agent::{Agent, AgentConfig, PodLogs};
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_runtime::Client;
use shepherd_store::{HistoryLimits, LocalStore};
use tokio::sync::oneshot;

pub async fn api() -> Arc<dyn Client> {
    let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
    Arc::new(server.client())
}

pub struct RunningAgent {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    pub logs: PodLogs,
}

impl RunningAgent {
    pub async fn start(client: Arc<dyn Client>, config: AgentConfig) -> RunningAgent {
        let agent = Agent::new(client, config).await.expect("agent starts");
        RunningAgent::run(agent)
    }

    pub fn run(agent: Agent) -> RunningAgent {
        let logs = agent.logs();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            agent
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("agent runs");
        });
        RunningAgent { stop: Some(stop), task, logs }
    }

    /// Deletes every pod in `default`, waits until the agent has stopped their containers and
    /// removed them, then stops the agent: a test leaves no process or cgroup behind.
    pub async fn finish(self, client: &Arc<dyn Client>) {
        let list = client.list(&kinds::POD, &shepherd_runtime::ListParams::namespace("default")).await.expect("list pods");
        for p in &list.items {
            if let Some(name) = p["metadata"]["name"].as_str() {
                let params = shepherd_runtime::DeleteParams { grace_period_seconds: Some(1), ..Default::default() };
                let _ = client.delete(&kinds::POD, Some("default"), name, &params).await;
            }
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let left = client.list(&kinds::POD, &shepherd_runtime::ListParams::namespace("default")).await.map(|l| l.items.len());
            if left.is_ok_and(|n| n == 0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the agent finish removing cgroups (their last processes exit just after PID 1).
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stop().await;
    }

    /// Stops the agent without touching its containers (as a `kill -9` would leave them).
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// A config for tests: quick back-off, quick lease, its own data directory.
pub fn config(node: &str, dir: &std::path::Path) -> AgentConfig {
    let mut c = AgentConfig::new(node, dir);
    c.restart_backoff_initial = Duration::from_millis(300);
    c.restart_backoff_max = Duration::from_secs(2);
    c.lease_interval = Duration::from_secs(1);
    c
}

pub fn pod(name: &str, node: &str, spec: Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec});
    p["spec"]["nodeName"] = json!(node);
    p
}

pub async fn create(client: &Arc<dyn Client>, pod: Value) -> Value {
    client.create(&kinds::POD, Some("default"), pod).await.expect("pod created")
}

pub async fn get(client: &Arc<dyn Client>, name: &str) -> Option<Value> {
    client.get(&kinds::POD, Some("default"), name).await.ok()
}

/// Polls the pod until `cond` holds; panics with the last state after `limit`.
pub async fn wait_pod(client: &Arc<dyn Client>, name: &str, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < limit {
        if let Some(p) = get(client, name).await {
            if cond(&p) {
                return p;
            }
            last = p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("pod {name} did not reach the expected state within {limit:?}; last: {}", last["status"]);
}

pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

pub fn condition(pod: &Value, kind: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

pub fn container_status(pod: &Value) -> &Value {
    &pod["status"]["containerStatuses"][0]
}

pub fn running_and_ready(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && condition(p, "Ready") == "True"
}

/// Host pids of processes whose environment carries `MARKER=marker`.
pub fn pids_with_marker(marker: &str) -> Vec<u32> {
    let needle = format!("MARKER={marker}\0");
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && env.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

/// The container's main process pid as the agent recorded it.
pub fn main_pid(data_dir: &std::path::Path, pod: &Value, container: &str) -> Option<i32> {
    let uid = pod["metadata"]["uid"].as_str()?;
    let state = std::fs::read(data_dir.join("containers").join(uid).join(container).join("state.json")).ok()?;
    let v: Value = serde_json::from_slice(&state).ok()?;
    v["main_pid"].as_i64().map(|p| p as i32)
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), Instant::now().elapsed().as_nanos() ^ rand_u64())
}

fn rand_u64() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}
