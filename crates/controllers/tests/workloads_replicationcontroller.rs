//! ReplicationControllers on the real API server, run by the ReplicaSet machinery: replicas kept
//! through deletions, `<rc>-<ordinal>` names, scaling, and a cascading delete.

mod workloads_support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shepherd_api::kinds;
use shepherd_api::pod;
use shepherd_controllers::replicaset::replication_controller;
use shepherd_runtime::{Client, DeleteParams, Manager, Patch, Propagation};
use workloads_support::*;

fn replication_and_gc(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    manager.add(replication_controller(client.clone(), &manager, &config()).shutdown_grace(Duration::from_millis(100)));
    for c in shepherd_controllers::garbage_collector(client.clone(), &manager, &config()) {
        manager.add(c.shutdown_grace(Duration::from_millis(100)));
    }
    manager.spawn()
}

#[tokio::test(start_paused = true)]
async fn a_replication_controller_keeps_its_replicas_through_deletions_scales_and_cascades() {
    let client = api().await;
    let controllers = replication_and_gc(&client);
    let kubelet = kubelet(client.clone(), Duration::from_millis(100));
    // The seeds' manifest shape: an equality selector, defaulted from the template when left out.
    let rc = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "minimal"}]}}}});
    let created = client.create(&kinds::REPLICATIONCONTROLLER, Some("default"), rc).await.unwrap();
    assert_eq!(created["spec"]["selector"], json!({"app": "web"}));
    let three = wait_until(Duration::from_secs(10), || async { active_pod_names(&client, "web-").await.len() == 3 }).await;
    assert!(three.is_some());
    assert_eq!(active_pod_names(&client, "web-").await, ["web-0", "web-1", "web-2"]);

    client.delete(&kinds::POD, Some("default"), "web-1", &DeleteParams::default()).await.unwrap();
    let replaced = wait_until(Duration::from_secs(10), || async {
        get(&client, &kinds::POD, "web-1").await.is_some_and(|p| pod::is_ready(&p))
            && active_pod_names(&client, "web-").await.len() == 3
    })
    .await;
    assert!(replaced.is_some(), "{:?}", active_pod_names(&client, "web-").await);
    let ready = wait_until(Duration::from_secs(10), || async {
        get(&client, &kinds::REPLICATIONCONTROLLER, "web").await.is_some_and(|rc| rc["status"]["readyReplicas"] == 3)
    })
    .await;
    assert!(ready.is_some());

    client.patch(&kinds::REPLICATIONCONTROLLER, Some("default"), "web", Patch::Merge(json!({"spec": {"replicas": 5}}))).await.unwrap();
    let five = wait_until(Duration::from_secs(10), || async { active_pod_names(&client, "web-").await.len() == 5 }).await;
    assert!(five.is_some(), "{:?}", active_pod_names(&client, "web-").await);

    let params = DeleteParams { propagation: Some(Propagation::Background), ..Default::default() };
    client.delete(&kinds::REPLICATIONCONTROLLER, Some("default"), "web", &params).await.unwrap();
    let gone = wait_until(Duration::from_secs(30), || async { active_pod_names(&client, "web-").await.is_empty() }).await;
    assert!(gone.is_some(), "{:?}", active_pod_names(&client, "web-").await);
    kubelet.abort();
    controllers.stop().await;
}
