//! ReplicaSets as a user sees them: pod counts converge, lost pods come back under their names,
//! orphans are adopted by exactly one owner, status tells the truth.

mod workloads_support;

use std::time::Duration;

use serde_json::json;
use shepherd_api::kinds;
use shepherd_api::{meta, pod};
use shepherd_runtime::{DeleteParams, Patch};
use workloads_support::*;

const LIMIT: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn replicas_converge_up_and_down_keeping_the_lowest_ordinals() {
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::REPLICASET, Some("default"), replicaset("cache", 3, "cache")).await.unwrap();
    let three = wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await == ["cache-0", "cache-1", "cache-2"] }).await;
    assert!(three.is_some(), "got {:?}", active_pod_names(&client, "cache-").await);

    let scale = |n: i64| Patch::Merge(json!({"spec": {"replicas": n}}));
    client.patch(&kinds::REPLICASET, Some("default"), "cache", scale(5)).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 5 }).await.is_some());
    assert_eq!(active_pod_names(&client, "cache-").await, ["cache-0", "cache-1", "cache-2", "cache-3", "cache-4"]);

    client.patch(&kinds::REPLICASET, Some("default"), "cache", scale(2)).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await == ["cache-0", "cache-1"] }).await.is_some());
    // Stays there: no flapping after convergence.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(active_pod_names(&client, "cache-").await, ["cache-0", "cache-1"]);
    let rs = get(&client, &kinds::REPLICASET, "cache").await.unwrap();
    assert_eq!(rs["status"]["replicas"], 2);
    assert_eq!(rs["status"]["observedGeneration"], rs["metadata"]["generation"]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn scale_down_removes_not_ready_pods_before_ready_ones() {
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::REPLICASET, Some("default"), replicaset("cache", 4, "cache")).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 4 }).await.is_some());
    mark_ready(&client, "cache-0").await;
    mark_ready(&client, "cache-3").await;
    let scale = Patch::Merge(json!({"spec": {"replicas": 2}}));
    client.patch(&kinds::REPLICASET, Some("default"), "cache", scale).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await == ["cache-0", "cache-3"] }).await.is_some());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_deleted_by_hand_is_replaced_under_the_same_name() {
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::REPLICASET, Some("default"), replicaset("cache", 3, "cache")).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 3 }).await.is_some());
    let before = get(&client, &kinds::POD, "cache-1").await.unwrap();
    client.delete(&kinds::POD, Some("default"), "cache-1", &DeleteParams::default()).await.unwrap();
    let replaced = wait_until(LIMIT, || async {
        get(&client, &kinds::POD, "cache-1").await.is_some_and(|p| meta::uid(&p) != meta::uid(&before))
    })
    .await;
    assert!(replaced.is_some(), "cache-1 comes back as a new pod");
    assert_eq!(active_pod_names(&client, "cache-").await, ["cache-0", "cache-1", "cache-2"]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_pod_is_deleted_and_replaced() {
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::REPLICASET, Some("default"), replicaset("cache", 2, "cache")).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 2 }).await.is_some());
    let failed_uid = meta::uid(&get(&client, &kinds::POD, "cache-0").await.unwrap()).to_string();
    mark_failed(&client, "cache-0").await;
    let replaced = wait_until(LIMIT, || async {
        let all = pods(&client).await;
        let failed_gone = !all.iter().any(|p| meta::uid(p) == failed_uid);
        failed_gone && active_pod_names(&client, "cache-").await == ["cache-0", "cache-1"]
    })
    .await;
    assert!(replaced.is_some(), "pods now: {:?}", pods(&client).await.iter().map(|p| (meta::name(p).to_string(), pod::phase(p).to_string())).collect::<Vec<_>>());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_bare_pod_matching_two_replicasets_is_adopted_by_exactly_one_and_both_keep_their_counts() {
    let client = api().await;
    let orphan = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "minimal"}]}});
    client.create(&kinds::POD, Some("default"), orphan).await.unwrap();
    client.create(&kinds::REPLICASET, Some("default"), replicaset("left", 2, "web")).await.unwrap();
    client.create(&kinds::REPLICASET, Some("default"), replicaset("right", 2, "web")).await.unwrap();
    let running = workloads(&client);

    let settled = wait_until(LIMIT, || async {
        let all = pods(&client).await;
        let owned_by = |rs: &str| {
            all.iter()
                .filter(|p| pod::is_active(p) && meta::controller_ref(p).and_then(|r| r["name"].as_str()) == Some(rs))
                .count()
        };
        owned_by("left") == 2 && owned_by("right") == 2
    })
    .await;
    assert!(settled.is_some(), "both ReplicaSets reach 2 pods");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let all = pods(&client).await;
    assert!(all.iter().all(|p| meta::owner_references(p).iter().filter(|r| r["controller"] == true).count() == 1),
        "every pod has exactly one controller: {all:?}");
    if let Some(stray) = all.iter().find(|p| meta::name(p) == "stray") {
        assert_eq!(meta::owner_references(stray).len(), 1, "adopted once");
    }
    let events = client.list(&kinds::EVENT, &shepherd_runtime::ListParams::namespace("default")).await.unwrap().items;
    let adoptions = events.iter().filter(|e| e["reason"] == "Adopted" && e["message"] == "Adopted pod: stray").count();
    assert_eq!(adoptions, 1, "exactly one ReplicaSet adopted the bare pod");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_relabelled_out_of_the_selector_is_released_and_replaced() {
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::REPLICASET, Some("default"), replicaset("cache", 2, "cache")).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 2 }).await.is_some());
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"app": "debugging"}}}));
    client.patch(&kinds::POD, Some("default"), "cache-0", relabel).await.unwrap();
    let done = wait_until(LIMIT, || async {
        let released = get(&client, &kinds::POD, "cache-0").await.is_some_and(|p| meta::owner_references(&p).is_empty());
        let owned = pods(&client).await.iter().filter(|p| meta::labels(p).get("app") == Some(&json!("cache"))).count();
        released && owned == 2
    })
    .await;
    assert!(done.is_some(), "cache-0 is released (kept, unowned) and a replacement runs");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn available_replicas_wait_for_min_ready_seconds() {
    let client = api().await;
    let running = workloads(&client);
    let mut rs = replicaset("cache", 2, "cache");
    rs["spec"]["minReadySeconds"] = json!(30);
    client.create(&kinds::REPLICASET, Some("default"), rs).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 2 }).await.is_some());
    mark_ready(&client, "cache-0").await;
    mark_ready(&client, "cache-1").await;
    let status = |f: &'static str| {
        let client = client.clone();
        async move { get(&client, &kinds::REPLICASET, "cache").await.and_then(|r| r["status"][f].as_i64()).unwrap_or(-1) }
    };
    assert!(wait_until(LIMIT, || async { status("readyReplicas").await == 2 }).await.is_some());
    assert_eq!(status("availableReplicas").await, 0, "ready, but not for 30 s yet");
    let took = wait_until(Duration::from_secs(60), || async { status("availableReplicas").await == 2 }).await;
    let took = took.expect("available after minReadySeconds, without any other event");
    assert!(took >= Duration::from_secs(25) && took <= Duration::from_secs(32), "took {took:?}");
    running.stop().await;
}
