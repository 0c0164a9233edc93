//! A controller killed in the middle of a reconcile: its successor converges from the API state.

mod workloads_support;

use std::time::Duration;

use shepherd_api::kinds;
use workloads_support::*;

#[tokio::test(start_paused = true)]
async fn a_replicaset_controller_restarted_mid_reconcile_converges_without_duplicates() {
    let client = api().await;
    // The first controller stops answering after four pod creations, in the middle of a batch.
    let first = workload_controllers_only(&Stalling::client(client.clone(), 4, i64::MAX));
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", 10, "minimal")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let partial = active_pod_names(&client, "web-").await;
    assert!(partial.len() < 10, "cut short at {partial:?}");
    first.stop().await;

    let second = workloads(&client);
    let expected: Vec<String> = (0..10).map(|i| format!("web-{i}")).collect();
    let converged = wait_until(Duration::from_secs(30), || async { active_pod_names(&client, "web-").await == expected }).await;
    assert!(converged.is_some(), "got {:?}", active_pod_names(&client, "web-").await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(pods(&client).await.len(), 10, "no pod created twice");
    let sets = client.list(&kinds::REPLICASET, &shepherd_runtime::ListParams::namespace("default")).await.unwrap().items;
    assert_eq!(sets.len(), 1, "no second ReplicaSet for the same template");
    second.stop().await;
}
