//! Deleting owners: what happens to their dependents in each propagation policy, finalizers
//! holding objects, and a collector that crashes in the middle of a cascade.

#[path = "workloads_support/mod.rs"]
mod support;

use std::time::Duration;

use serde_json::json;
use shepherd_api::kinds;
use shepherd_api::meta;
use shepherd_runtime::{DeleteParams, Patch, Propagation};
use support::*;

const LIMIT: Duration = Duration::from_secs(30);

async fn running_deployment(client: &std::sync::Arc<dyn shepherd_runtime::Client>, replicas: i64) {
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", replicas, "minimal")).await.unwrap();
    let up = wait_until(LIMIT, || async { active_pod_names(client, "web-").await.len() == replicas as usize }).await;
    assert!(up.is_some(), "the deployment's pods run");
}

async fn count(client: &std::sync::Arc<dyn shepherd_runtime::Client>, res: &shepherd_api::ResourceInfo) -> usize {
    client.list(res, &shepherd_runtime::ListParams::namespace("default")).await.map(|l| l.items.len()).unwrap_or(usize::MAX)
}

#[tokio::test(start_paused = true)]
async fn deleting_a_deployment_in_the_background_deletes_its_replicasets_and_pods() {
    let client = api().await;
    let running = workloads(&client);
    running_deployment(&client, 3).await;
    let gone = client.delete(&kinds::DEPLOYMENT, Some("default"), "web", &DeleteParams::default()).await.unwrap();
    assert!(gone.is_none(), "background: the owner goes at once");
    let cleaned = wait_until(LIMIT, || async { count(&client, &kinds::REPLICASET).await == 0 && count(&client, &kinds::POD).await == 0 }).await;
    assert!(cleaned.is_some(), "dependents collected");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn foreground_deletion_keeps_the_deployment_until_its_replicasets_and_pods_are_gone() {
    let client = api().await;
    let running = workloads(&client);
    running_deployment(&client, 3).await;
    let params = DeleteParams { propagation: Some(Propagation::Foreground), ..Default::default() };
    let marked = client.delete(&kinds::DEPLOYMENT, Some("default"), "web", &params).await.unwrap();
    let marked = marked.expect("foreground: the owner stays while dependents exist");
    assert!(meta::has_finalizer(&marked, "foregroundDeletion"));
    let order = wait_until(LIMIT, || async {
        let d = get(&client, &kinds::DEPLOYMENT, "web").await;
        let deps = count(&client, &kinds::REPLICASET).await + count(&client, &kinds::POD).await;
        // The owner must never disappear before its dependents.
        assert!(d.is_some() || deps == 0, "the deployment went while {deps} dependents remained");
        d.is_none()
    })
    .await;
    assert!(order.is_some(), "the deployment is deleted once its dependents are");
    assert_eq!(count(&client, &kinds::POD).await, 0);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn orphan_deletion_removes_the_replicaset_and_leaves_its_pods_running_unowned() {
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::REPLICASET, Some("default"), replicaset("cache", 2, "cache")).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 2 }).await.is_some());
    let params = DeleteParams { propagation: Some(Propagation::Orphan), ..Default::default() };
    client.delete(&kinds::REPLICASET, Some("default"), "cache", &params).await.unwrap();
    let done = wait_until(LIMIT, || async { get(&client, &kinds::REPLICASET, "cache").await.is_none() }).await;
    assert!(done.is_some(), "the ReplicaSet goes once its pods are released");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let left = pods(&client).await;
    assert_eq!(left.len(), 2, "the pods stay");
    assert!(left.iter().all(|p| meta::owner_references(p).is_empty()), "and are no longer owned");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_finalizer_keeps_an_object_and_its_dependents_until_it_is_removed() {
    let client = api().await;
    let running = workloads(&client);
    let mut rs = replicaset("cache", 2, "cache");
    rs["metadata"]["finalizers"] = json!(["example.com/hold"]);
    client.create(&kinds::REPLICASET, Some("default"), rs).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "cache-").await.len() == 2 }).await.is_some());
    let held = client.delete(&kinds::REPLICASET, Some("default"), "cache", &DeleteParams::default()).await.unwrap();
    assert!(held.is_some_and(|r| meta::is_deleting(&r)), "marked, not removed");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(get(&client, &kinds::REPLICASET, "cache").await.is_some(), "still there while the finalizer is");
    assert_eq!(count(&client, &kinds::POD).await, 2, "its pods are not collected while it exists");

    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    client.patch(&kinds::REPLICASET, Some("default"), "cache", release).await.unwrap();
    assert!(get(&client, &kinds::REPLICASET, "cache").await.is_none(), "gone with its last finalizer");
    assert!(wait_until(LIMIT, || async { count(&client, &kinds::POD).await == 0 }).await.is_some());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_garbage_collector_that_crashes_mid_cascade_leaves_no_orphans_after_a_restart() {
    let client = api().await;
    let workloads = workload_controllers_only(&client);
    running_deployment(&client, 6).await;
    workloads.stop().await;

    // The first collector stops answering after two deletions, as if killed mid-cascade.
    let crashing = garbage_collector_only(&Stalling::client(client.clone(), i64::MAX, 2));
    client.delete(&kinds::DEPLOYMENT, Some("default"), "web", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let left = count(&client, &kinds::REPLICASET).await + count(&client, &kinds::POD).await;
    assert!(left > 0, "the cascade was cut short");
    crashing.stop().await;

    let restarted = garbage_collector_only(&client);
    let cleaned = wait_until(LIMIT, || async { count(&client, &kinds::REPLICASET).await == 0 && count(&client, &kinds::POD).await == 0 }).await;
    assert!(cleaned.is_some(), "the restarted collector finishes from what the API shows");
    restarted.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_dependent_with_one_live_owner_left_loses_only_the_dangling_reference() {
    let client = api().await;
    let running = garbage_collector_only(&client);
    let a = client.create(&kinds::REPLICASET, Some("default"), replicaset("a", 0, "a")).await.unwrap();
    let b = client.create(&kinds::REPLICASET, Some("default"), replicaset("b", 0, "b")).await.unwrap();
    let owner = |rs: &serde_json::Value| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta::name(rs), "uid": meta::uid(rs)});
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shared", "namespace": "default",
        "ownerReferences": [owner(&a), owner(&b)]}, "spec": {"containers": [{"name": "main", "image": "minimal"}]}});
    client.create(&kinds::POD, Some("default"), pod).await.unwrap();
    client.delete(&kinds::REPLICASET, Some("default"), "a", &DeleteParams::default()).await.unwrap();
    let trimmed = wait_until(LIMIT, || async {
        get(&client, &kinds::POD, "shared").await.is_some_and(|p| meta::owner_references(&p).len() == 1)
    })
    .await;
    assert!(trimmed.is_some(), "the pod stays, owned by b only");
    assert_eq!(meta::owner_references(&get(&client, &kinds::POD, "shared").await.unwrap())[0]["name"], "b");
    running.stop().await;
}
