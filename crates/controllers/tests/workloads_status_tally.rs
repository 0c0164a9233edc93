//! ReplicaSet status kept from pod events says what a recount over all pods says: one recorded
//! workload run against the incremental controller and against the recounting one gives the same
//! statuses, pods and Events.

mod workloads_support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::{meta, pod};
use shepherd_controllers::podutil;
use shepherd_runtime::{Client, DeleteParams, ListParams, Manager, Patch};
use workloads_support::*;

const LIMIT: Duration = Duration::from_secs(20);

/// What the workload ends with, and what a user sees along the way.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// `status` of the ReplicaSet at each checkpoint, without conditions' timestamps.
    statuses: Vec<Value>,
    /// Active pods, by name, and whether each is ready.
    pods: Vec<(String, bool)>,
    /// The ReplicaSet's Events: reason, message, count.
    events: Vec<(String, String, i64)>,
}

async fn mark_unready(client: &Arc<dyn Client>, name: &str) {
    let now = podutil::format_time(podutil::now());
    let status = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]}});
    client.patch_status(&kinds::POD, Some("default"), name, Patch::Merge(status)).await.expect("pod marked unready");
}

async fn status(client: &Arc<dyn Client>) -> Value {
    let rs = get(client, &kinds::REPLICASET, "web").await.expect("the ReplicaSet exists");
    let mut s = rs["status"].clone();
    if let Some(o) = s.as_object_mut() {
        o.remove("conditions");
    }
    s
}

async fn status_is(client: &Arc<dyn Client>, want: Value) -> Value {
    let reached = wait_until(LIMIT, || {
        let want = want.clone();
        async move {
            let have = status(client).await;
            want.as_object().is_some_and(|w| w.iter().all(|(k, v)| have.get(k) == Some(v)))
        }
    })
    .await;
    let have = status(client).await;
    assert!(reached.is_some(), "status {have} never reached {want}");
    have
}

async fn active_is(client: &Arc<dyn Client>, n: usize) {
    let reached = wait_until(LIMIT, || async { active_pod_names(client, "web-").await.len() == n }).await;
    assert!(reached.is_some(), "never {n} active pods: {:?}", active_pod_names(client, "web-").await);
}

async fn replaced(client: &Arc<dyn Client>, name: &str, uid: &str) {
    let back = wait_until(LIMIT, || async {
        get(client, &kinds::POD, name).await.is_some_and(|p| meta::uid(&p) != uid && pod::is_active(&p))
    })
    .await;
    assert!(back.is_some(), "{name} was not replaced");
}

async fn uid_of(client: &Arc<dyn Client>, name: &str) -> String {
    meta::uid(&get(client, &kinds::POD, name).await.expect("pod exists")).to_string()
}

/// Creates, scales up and down, pods turning ready and unready, deleted and failed, with
/// `minReadySeconds` making availability lag readiness.
async fn recorded_workload(incremental: bool) -> Outcome {
    let client = api().await;
    let manager = Manager::new(client.clone());
    let cfg = config();
    let controller = if incremental {
        shepherd_controllers::replicaset_controller(client.clone(), &manager, &cfg)
    } else {
        shepherd_controllers::replicaset_controller_recounting(client.clone(), &manager, &cfg)
    };
    manager.add(controller.shutdown_grace(Duration::from_millis(100)));
    let running = manager.spawn();
    let mut statuses = Vec::new();

    let mut rs = replicaset("web", 4, "web");
    rs["spec"]["minReadySeconds"] = json!(10);
    client.create(&kinds::REPLICASET, Some("default"), rs).await.expect("ReplicaSet created");
    active_is(&client, 4).await;
    statuses.push(status_is(&client, json!({"replicas": 4, "readyReplicas": 0})).await);

    mark_ready(&client, "web-0").await;
    mark_ready(&client, "web-1").await;
    statuses.push(status_is(&client, json!({"readyReplicas": 2, "availableReplicas": 0})).await);
    // No pod changes from here: availability comes from minReadySeconds running out.
    statuses.push(status_is(&client, json!({"readyReplicas": 2, "availableReplicas": 2})).await);

    let scale = |n: i64| Patch::Merge(json!({"spec": {"replicas": n}}));
    client.patch(&kinds::REPLICASET, Some("default"), "web", scale(7)).await.expect("scaled up");
    active_is(&client, 7).await;
    for i in 2..7 {
        mark_ready(&client, &format!("web-{i}")).await;
    }
    statuses.push(status_is(&client, json!({"replicas": 7, "readyReplicas": 7, "availableReplicas": 2})).await);
    mark_unready(&client, "web-1").await;
    statuses.push(status_is(&client, json!({"readyReplicas": 6, "availableReplicas": 1})).await);
    statuses.push(status_is(&client, json!({"readyReplicas": 6, "availableReplicas": 6})).await);

    let uid = uid_of(&client, "web-3").await;
    client.delete(&kinds::POD, Some("default"), "web-3", &DeleteParams::default()).await.expect("pod deleted");
    replaced(&client, "web-3", &uid).await;
    statuses.push(status_is(&client, json!({"replicas": 7, "readyReplicas": 5})).await);
    let uid = uid_of(&client, "web-4").await;
    mark_failed(&client, "web-4").await;
    replaced(&client, "web-4", &uid).await;
    statuses.push(status_is(&client, json!({"replicas": 7, "readyReplicas": 4, "availableReplicas": 4})).await);

    client.patch(&kinds::REPLICASET, Some("default"), "web", scale(3)).await.expect("scaled down");
    active_is(&client, 3).await;
    // Settled: nothing changes any more.
    tokio::time::sleep(Duration::from_secs(30)).await;
    statuses.push(status(&client).await);

    let mut pods: Vec<(String, bool)> = self::pods(&client)
        .await
        .iter()
        .filter(|p| pod::is_active(p))
        .map(|p| (meta::name(p).to_string(), pod::is_ready(p)))
        .collect();
    pods.sort();
    let mut events: Vec<(String, String, i64)> = client
        .list(&kinds::EVENT, &ListParams::namespace("default"))
        .await
        .expect("events listed")
        .items
        .iter()
        .filter(|e| e["involvedObject"]["name"] == "web")
        .map(|e| {
            let s = |f: &str| e[f].as_str().unwrap_or_default().to_string();
            (s("reason"), s("message"), e["count"].as_i64().unwrap_or(1))
        })
        .collect();
    events.sort();
    running.stop().await;
    Outcome { statuses, pods, events }
}

#[tokio::test(start_paused = true)]
async fn incremental_status_gives_the_statuses_pods_and_events_of_a_full_recount() {
    let recounted = recorded_workload(false).await;
    let incremental = recorded_workload(true).await;
    assert_eq!(incremental, recounted);

    // And both tell the truth about the pods they end with.
    let last = incremental.statuses.last().expect("statuses");
    let ready = incremental.pods.iter().filter(|(_, r)| *r).count();
    assert_eq!(last["replicas"], json!(incremental.pods.len()));
    assert_eq!(last["readyReplicas"], json!(ready));
    assert_eq!(last["availableReplicas"], json!(ready), "ready for longer than minReadySeconds");
    assert_eq!(last["fullyLabeledReplicas"], json!(incremental.pods.len()));
    let created: i64 = incremental.events.iter().filter(|e| e.0 == "SuccessfulCreate").map(|e| e.2).sum();
    assert_eq!(created, 9, "7 pods and 2 replacements: {:?}", incremental.events);
}

#[tokio::test(start_paused = true)]
async fn a_hundred_pods_turning_ready_within_two_seconds_are_reported_in_a_few_status_writes() {
    let client = api().await;
    let manager = Manager::new(client.clone());
    manager.add(shepherd_controllers::replicaset_controller(client.clone(), &manager, &config()));
    let running = manager.spawn();
    client.create(&kinds::REPLICASET, Some("default"), replicaset("web", 100, "web")).await.expect("ReplicaSet created");
    active_is(&client, 100).await;
    status_is(&client, json!({"replicas": 100, "readyReplicas": 0})).await;

    let rs = get(&client, &kinds::REPLICASET, "web").await.expect("exists");
    let from = rs["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("revision");
    let mut writes = client.watch(&kinds::REPLICASET, &ListParams::namespace("default"), from).await.expect("watch");
    let start = tokio::time::Instant::now();
    for i in 0..100 {
        mark_ready(&client, &format!("web-{i}")).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    status_is(&client, json!({"replicas": 100, "readyReplicas": 100, "availableReplicas": 100})).await;
    let took = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    running.stop().await;

    let mut count = 0;
    let deadline = tokio::time::Instant::now() + LIMIT;
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_millis(10), futures::StreamExt::next(&mut writes)).await {
        count += 1;
        assert!(tokio::time::Instant::now() < deadline, "status writes go on after the controller stopped ({count} so far)");
    }
    // 5 at once, then 10 a second.
    let allowed = 5 + (took.as_secs_f64() * 10.0).ceil() as usize + 1;
    assert!(count >= 1 && count <= allowed, "{count} status writes in {took:?} (at most {allowed})");
    assert!(count < 50, "{count} status writes for 100 pods");
}
