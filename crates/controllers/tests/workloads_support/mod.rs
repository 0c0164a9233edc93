//! Shared test setup: a real in-process API server, the controllers on a manager, a simulated
//! kubelet that marks pods ready, and polling on tokio's paused clock.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_api::{meta, pod};
use shepherd_controllers::{ControllerConfig, podutil};
use shepherd_runtime::intercept::{Call, Intercepted, Interceptor};
use shepherd_runtime::{Client, ListParams, Manager, Patch, TriggerMode, WatchEvent};
use shepherd_store::{HistoryLimits, LocalStore};
use tokio::time::Instant;

pub async fn api() -> Arc<dyn Client> {
    let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
    let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
    Arc::new(server.client())
}

pub fn config() -> ControllerConfig {
    ControllerConfig { workers: 2, mode: TriggerMode::hybrid().with_period(Duration::from_secs(30)) }
}

/// The controllers a test runs, stopped with `.stop().await`.
pub type Running = shepherd_runtime::RunningManager;

/// The workload controllers and the garbage collector, as the daemon runs them.
pub fn workloads(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    let cfg = config();
    manager.add(shepherd_controllers::replicaset_controller(client.clone(), &manager, &cfg));
    manager.add(shepherd_controllers::deployment_controller(client.clone(), &manager, &cfg));
    for c in shepherd_controllers::garbage_collector(client.clone(), &manager, &cfg) {
        manager.add(c);
    }
    manager.spawn()
}

/// Polls `cond` every 10 ms of (paused) time; the time it took, or `None` after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, mut cond: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() <= limit {
        if cond().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

pub fn deployment(name: &str, replicas: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": image}]}}}})
}

pub fn replicaset(name: &str, replicas: i64, app: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "main", "image": "minimal"}]}}}})
}

pub async fn pods(client: &Arc<dyn Client>) -> Vec<Value> {
    client.list(&kinds::POD, &ListParams::namespace("default")).await.map(|l| l.items).unwrap_or_default()
}

/// Names of the pods that count (not terminating, not finished), sorted.
pub async fn active_pod_names(client: &Arc<dyn Client>, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = pods(client)
        .await
        .iter()
        .filter(|p| pod::is_active(p) && meta::name(p).starts_with(prefix))
        .map(|p| meta::name(p).to_string())
        .collect();
    names.sort_by_key(|n| (n.len(), n.clone()));
    names
}

pub async fn get(client: &Arc<dyn Client>, res: &shepherd_api::ResourceInfo, name: &str) -> Option<Value> {
    client.get(res, Some("default"), name).await.ok()
}

/// What a kubelet reports for a started, ready pod.
pub async fn mark_ready(client: &Arc<dyn Client>, name: &str) {
    let now = podutil::format_time(podutil::now());
    let status = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"running": {"startedAt": now}}}]}});
    let _ = client.patch_status(&kinds::POD, Some("default"), name, Patch::Merge(status)).await;
}

pub async fn mark_failed(client: &Arc<dyn Client>, name: &str) {
    let status = json!({"status": {"phase": "Failed", "reason": "Error",
        "conditions": [{"type": "Ready", "status": "False"}]}});
    let _ = client.patch_status(&kinds::POD, Some("default"), name, Patch::Merge(status)).await;
}

/// A simulated kubelet: every pod that appears is reported ready after `startup`.
pub fn kubelet(client: Arc<dyn Client>, startup: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(list) = client.list(&kinds::POD, &ListParams::default()).await else { return };
        for p in &list.items {
            spawn_start(&client, p, startup);
        }
        let Ok(mut events) = client.watch(&kinds::POD, &ListParams::default(), list.resource_version).await else { return };
        while let Some(Ok(event)) = events.next().await {
            if let WatchEvent::Added(p) = event {
                spawn_start(&client, &p, startup);
            }
        }
    })
}

fn spawn_start(client: &Arc<dyn Client>, pod: &Value, startup: Duration) {
    if pod::is_ready(pod) || !pod::is_active(pod) {
        return;
    }
    let (client, name) = (client.clone(), meta::name(pod).to_string());
    tokio::spawn(async move {
        tokio::time::sleep(startup).await;
        mark_ready(&client, &name).await;
    });
}

/// A client that stops answering (hangs, as a process about to be killed does) once it has
/// created `creates` pods or deleted `deletes` objects; everything else passes through.
pub struct Stalling {
    creates: std::sync::atomic::AtomicI64,
    deletes: std::sync::atomic::AtomicI64,
}

impl Stalling {
    pub fn client(inner: Arc<dyn Client>, creates: i64, deletes: i64) -> Arc<dyn Client> {
        Arc::new(Intercepted::new(inner, Stalling { creates: creates.into(), deletes: deletes.into() }))
    }
}

#[async_trait::async_trait]
impl Interceptor for Stalling {
    async fn before(&self, call: &Call<'_>) -> Result<(), shepherd_api::ApiError> {
        let counter = match call {
            Call::Create { res, .. } if res.kind == "Pod" => &self.creates,
            Call::Delete { .. } => &self.deletes,
            _ => return Ok(()),
        };
        if counter.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) <= 0 {
            futures::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// A manager running only the garbage collector, through `client`.
pub fn garbage_collector_only(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    for c in shepherd_controllers::garbage_collector(client.clone(), &manager, &config()) {
        manager.add(c.shutdown_grace(Duration::from_millis(100)));
    }
    manager.spawn()
}

/// The workload controllers without the garbage collector, through `client`.
pub fn workload_controllers_only(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    let cfg = config();
    manager.add(shepherd_controllers::replicaset_controller(client.clone(), &manager, &cfg).shutdown_grace(Duration::from_millis(100)));
    manager.add(shepherd_controllers::deployment_controller(client.clone(), &manager, &cfg).shutdown_grace(Duration::from_millis(100)));
    manager.spawn()
}
