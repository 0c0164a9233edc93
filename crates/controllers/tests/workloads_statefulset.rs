//! StatefulSets on the real API server: ordered start, stable names across deletion, scale-down
//! from the top, rolling updates in reverse ordinal order down to the partition, Parallel pods.

mod workloads_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::{meta, opt_str_at, pod};
use shepherd_controllers::statefulset::statefulset_controller;
use shepherd_runtime::{Client, ListParams, Manager, Patch, WatchEvent};
use tokio::time::Instant;
use workloads_support::*;

fn statefulset_controller_only(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    manager.add(statefulset_controller(client.clone(), &manager, &config()).shutdown_grace(Duration::from_millis(100)));
    manager.spawn()
}

fn stateful_set(name: &str, replicas: i64, spec: Value) -> Value {
    let mut sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "web:1"}]}}}});
    if let (Some(s), Some(extra)) = (sts["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    sts
}

/// Pod creations and deletions in the order the API server saw them, with paused-clock times.
#[derive(Default)]
struct History {
    created: Vec<(String, Instant)>,
    deleted: Vec<String>,
}

fn record_history(client: Arc<dyn Client>) -> (Arc<Mutex<History>>, tokio::task::JoinHandle<()>) {
    let history = Arc::new(Mutex::new(History::default()));
    let seen = history.clone();
    let task = tokio::spawn(async move {
        let Ok(mut events) = client.watch(&kinds::POD, &ListParams::default(), 0).await else { return };
        while let Some(Ok(event)) = events.next().await {
            match event {
                WatchEvent::Added(p) => seen.lock().unwrap().created.push((meta::name(&p).to_string(), Instant::now())),
                WatchEvent::Deleted(p) => seen.lock().unwrap().deleted.push(meta::name(&p).to_string()),
                _ => {}
            }
        }
    });
    (history, task)
}

async fn status(client: &Arc<dyn Client>, name: &str) -> Value {
    get(client, &kinds::STATEFULSET, name).await.map(|s| s["status"].clone()).unwrap_or(Value::Null)
}

async fn ready_names(client: &Arc<dyn Client>, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> =
        pods(client).await.iter().filter(|p| pod::is_active(p) && pod::is_ready(p)).map(|p| meta::name(p).to_string()).collect();
    names.retain(|n| n.starts_with(prefix));
    names.sort();
    names
}

async fn image_of(client: &Arc<dyn Client>, pod: &str) -> String {
    get(client, &kinds::POD, pod).await.and_then(|p| opt_str_at(&p, "/spec/containers/0/image").map(str::to_string)).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn pods_start_in_order_each_after_the_previous_is_ready_and_a_deleted_pod_returns_with_its_name() {
    let client = api().await;
    let (history, recorder) = record_history(client.clone());
    let controllers = statefulset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(2));
    client.create(&kinds::STATEFULSET, Some("default"), stateful_set("web", 3, json!({}))).await.unwrap();

    let up = wait_until(Duration::from_secs(30), || async { status(&client, "web").await["readyReplicas"] == 3 }).await;
    assert!(up.is_some(), "{}", status(&client, "web").await);
    let created = history.lock().unwrap().created.clone();
    let names: Vec<&str> = created.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["web-0", "web-1", "web-2"]);
    for pair in created.windows(2) {
        let gap = pair[1].1.duration_since(pair[0].1);
        assert!(gap >= Duration::from_secs(2), "{} started {gap:?} after {}, before it was ready", pair[1].0, pair[0].0);
    }
    let pod = get(&client, &kinds::POD, "web-1").await.unwrap();
    assert_eq!((pod["spec"]["hostname"].as_str(), pod["spec"]["subdomain"].as_str()), (Some("web-1"), Some("web")));
    let s = status(&client, "web").await;
    assert_eq!((s["replicas"].as_i64(), s["currentReplicas"].as_i64(), s["updatedReplicas"].as_i64()), (Some(3), Some(3), Some(3)));
    assert_eq!(s["currentRevision"], s["updateRevision"]);

    let old_uid = meta::uid(&pod).to_string();
    client.delete(&kinds::POD, Some("default"), "web-1", &Default::default()).await.unwrap();
    let back = wait_until(Duration::from_secs(30), || async {
        get(&client, &kinds::POD, "web-1").await.is_some_and(|p| meta::uid(&p) != old_uid && pod::is_ready(&p))
    })
    .await;
    assert!(back.is_some(), "web-1 did not come back");
    assert_eq!(ready_names(&client, "web-").await, ["web-0", "web-1", "web-2"]);
    recorder.abort();
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn scale_down_removes_the_highest_ordinal_first_one_at_a_time() {
    let client = api().await;
    let controllers = statefulset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_millis(500));
    client.create(&kinds::STATEFULSET, Some("default"), stateful_set("web", 3, json!({}))).await.unwrap();
    assert!(wait_until(Duration::from_secs(30), || async { status(&client, "web").await["readyReplicas"] == 3 }).await.is_some());

    let (history, recorder) = record_history(client.clone());
    client.patch(&kinds::STATEFULSET, Some("default"), "web", Patch::Merge(json!({"spec": {"replicas": 1}}))).await.unwrap();
    let down = wait_until(Duration::from_secs(30), || async { active_pod_names(&client, "web-").await == ["web-0"] }).await;
    assert!(down.is_some(), "{:?}", active_pod_names(&client, "web-").await);
    assert!(wait_until(Duration::from_secs(5), || async { history.lock().unwrap().deleted.len() == 2 }).await.is_some());
    assert_eq!(history.lock().unwrap().deleted, ["web-2", "web-1"]);
    let settled = wait_until(Duration::from_secs(5), || async { status(&client, "web").await["replicas"] == 1 }).await;
    assert!(settled.is_some(), "{}", status(&client, "web").await);
    recorder.abort();
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_rolling_update_goes_from_the_highest_ordinal_down_and_stops_at_the_partition() {
    let client = api().await;
    let controllers = statefulset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    let partitioned = json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}});
    client.create(&kinds::STATEFULSET, Some("default"), stateful_set("web", 3, partitioned)).await.unwrap();
    assert!(wait_until(Duration::from_secs(30), || async { status(&client, "web").await["readyReplicas"] == 3 }).await.is_some());
    let first_revision = status(&client, "web").await["currentRevision"].clone();

    let (history, recorder) = record_history(client.clone());
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "web:2"}]}}}});
    client.patch(&kinds::STATEFULSET, Some("default"), "web", Patch::Merge(patch)).await.unwrap();
    let partial = wait_until(Duration::from_secs(60), || async {
        let s = status(&client, "web").await;
        s["updatedReplicas"] == 2 && s["readyReplicas"] == 3
    })
    .await;
    assert!(partial.is_some(), "{}", status(&client, "web").await);
    assert_eq!(history.lock().unwrap().deleted, ["web-2", "web-1"], "not in reverse ordinal order");
    assert_eq!(image_of(&client, "web-0").await, "web:1", "the pod below the partition was updated");
    assert_eq!(image_of(&client, "web-1").await, "web:2");
    let s = status(&client, "web").await;
    assert_eq!(s["currentRevision"], first_revision, "{s}");
    assert_ne!(s["updateRevision"], first_revision, "{s}");

    // A pod below the partition that is deleted comes back at the current revision.
    let old_uid = get(&client, &kinds::POD, "web-0").await.map(|p| meta::uid(&p).to_string()).unwrap_or_default();
    client.delete(&kinds::POD, Some("default"), "web-0", &Default::default()).await.unwrap();
    let back = wait_until(Duration::from_secs(30), || async {
        get(&client, &kinds::POD, "web-0").await.is_some_and(|p| meta::uid(&p) != old_uid && pod::is_ready(&p))
    })
    .await;
    assert!(back.is_some());
    assert_eq!(image_of(&client, "web-0").await, "web:1", "web-0 came back at the update revision, past the partition");

    let patch = json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}});
    client.patch(&kinds::STATEFULSET, Some("default"), "web", Patch::Merge(patch)).await.unwrap();
    let done = wait_until(Duration::from_secs(60), || async {
        let s = status(&client, "web").await;
        s["updatedReplicas"] == 3 && s["readyReplicas"] == 3 && s["currentRevision"] == s["updateRevision"]
    })
    .await;
    assert!(done.is_some(), "{}", status(&client, "web").await);
    assert_eq!(image_of(&client, "web-0").await, "web:2");
    let revisions = client.list(&kinds::CONTROLLERREVISION, &ListParams::namespace("default")).await.unwrap().items;
    assert_eq!(revisions.len(), 2, "one ControllerRevision per template");
    recorder.abort();
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn parallel_pods_start_together_without_waiting_for_readiness() {
    let client = api().await;
    let controllers = statefulset_controller_only(&client);
    client.create(&kinds::STATEFULSET, Some("default"), stateful_set("db", 3, json!({"podManagementPolicy": "Parallel"}))).await.unwrap();
    // No kubelet: no pod ever becomes ready, and all three are created anyway.
    let all = wait_until(Duration::from_secs(5), || async { active_pod_names(&client, "db-").await.len() == 3 }).await;
    assert!(all.is_some(), "{:?}", active_pod_names(&client, "db-").await);
    assert_eq!(active_pod_names(&client, "db-").await, ["db-0", "db-1", "db-2"]);
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn ordered_pods_wait_for_the_previous_pod_to_become_ready() {
    let client = api().await;
    let controllers = statefulset_controller_only(&client);
    client.create(&kinds::STATEFULSET, Some("default"), stateful_set("db", 3, json!({}))).await.unwrap();
    let first = wait_until(Duration::from_secs(5), || async { status(&client, "db").await["replicas"] == 1 }).await;
    assert!(first.is_some(), "{}", status(&client, "db").await);
    // The status says one pod was seen; ten more seconds bring no second one.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(active_pod_names(&client, "db-").await, ["db-0"]);
    mark_ready(&client, "db-0").await;
    let next = wait_until(Duration::from_secs(5), || async { active_pod_names(&client, "db-").await.len() == 2 }).await;
    assert!(next.is_some(), "db-1 did not follow once db-0 was ready");
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_next_pod_waits_min_ready_seconds_after_the_previous_is_ready() {
    let client = api().await;
    let (history, recorder) = record_history(client.clone());
    let controllers = statefulset_controller_only(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    client.create(&kinds::STATEFULSET, Some("default"), stateful_set("web", 2, json!({"minReadySeconds": 10}))).await.unwrap();
    let up = wait_until(Duration::from_secs(60), || async { status(&client, "web").await["availableReplicas"] == 2 }).await;
    assert!(up.is_some(), "{}", status(&client, "web").await);
    let created = history.lock().unwrap().created.clone();
    let gap = created[1].1.duration_since(created[0].1);
    // One second to ready, ten more to available; timestamps have whole seconds.
    assert!(gap >= Duration::from_secs(10), "web-1 started {gap:?} after web-0");
    recorder.abort();
    kubelet.abort();
    controllers.stop().await;
}
