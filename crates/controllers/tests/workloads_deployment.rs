//! Deployments as `kubectl rollout status` and a watching user see them.

mod workloads_support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::{meta, pod};
use shepherd_runtime::{Client, ListParams, Patch, WatchEvent};
use workloads_support::*;

const LIMIT: Duration = Duration::from_secs(30);

fn condition(d: &Value, type_: &str) -> Option<Value> {
    d["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
}

/// What `kubectl rollout status` waits for: the current generation observed, every replica
/// updated and available, no old replica left.
async fn rolled_out(client: &Arc<dyn Client>, name: &str) -> bool {
    let Some(d) = get(client, &kinds::DEPLOYMENT, name).await else { return false };
    let s = &d["status"];
    let replicas = d["spec"]["replicas"].as_i64().unwrap_or(-1);
    s["observedGeneration"] == d["metadata"]["generation"]
        && s["updatedReplicas"].as_i64() == Some(replicas)
        && s["replicas"].as_i64() == Some(replicas)
        && s["availableReplicas"].as_i64() == Some(replicas)
        && condition(&d, "Progressing").is_some_and(|c| c["reason"] == "NewReplicaSetAvailable")
}

async fn replicasets(client: &Arc<dyn Client>) -> Vec<Value> {
    client.list(&kinds::REPLICASET, &ListParams::namespace("default")).await.map(|l| l.items).unwrap_or_default()
}

fn set_image(image: &str) -> Patch {
    Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": image}]}}}}))
}

#[tokio::test(start_paused = true)]
async fn the_seed_deployment_web_runs_web_0_to_2_and_reports_a_complete_rollout() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", 3, "minimal")).await.unwrap();
    assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
    assert_eq!(active_pod_names(&client, "web-").await, ["web-0", "web-1", "web-2"]);

    let sets = replicasets(&client).await;
    assert_eq!(sets.len(), 1);
    let rs = &sets[0];
    let hash = rs["metadata"]["labels"]["pod-template-hash"].as_str().unwrap().to_string();
    assert_eq!(meta::name(rs), format!("web-{hash}"));
    assert_eq!(rs["spec"]["selector"]["matchLabels"], json!({"app": "web", "pod-template-hash": hash}));
    for p in pods(&client).await {
        assert_eq!(p["metadata"]["labels"], json!({"app": "web", "pod-template-hash": hash}));
    }
    let d = get(&client, &kinds::DEPLOYMENT, "web").await.unwrap();
    assert_eq!(d["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
    assert_eq!(d["status"]["readyReplicas"], 3);
    assert_eq!(d["status"]["unavailableReplicas"], 0);
    let available = condition(&d, "Available").unwrap();
    assert_eq!((available["status"].as_str(), available["reason"].as_str()), (Some("True"), Some("MinimumReplicasAvailable")));
    let events = client.list(&kinds::EVENT, &ListParams::namespace("default")).await.unwrap().items;
    assert!(events.iter().any(|e| e["reason"] == "ScalingReplicaSet" && e["involvedObject"]["name"] == "web"));
    assert!(events.iter().any(|e| e["reason"] == "SuccessfulCreate" && e["message"] == "Created pod: web-0"));
    kubelet.abort();
    running.stop().await;
}

fn web_deployment(name: &str, replicas: i64) -> Value {
    let mut d = deployment(name, replicas, "minimal");
    d["spec"]["selector"] = json!({"matchLabels": {"app": "web"}});
    d["spec"]["template"]["metadata"]["labels"] = json!({"app": "web"});
    d
}

#[tokio::test(start_paused = true)]
async fn two_deployments_selecting_app_web_never_delete_each_others_pods_and_both_reach_their_counts() {
    let client = api().await;
    let running = workloads(&client);
    let stray = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "minimal"}]}});
    client.create(&kinds::POD, Some("default"), stray).await.unwrap();
    client.create(&kinds::DEPLOYMENT, Some("default"), web_deployment("front", 3)).await.unwrap();
    client.create(&kinds::DEPLOYMENT, Some("default"), web_deployment("back", 2)).await.unwrap();
    let both = wait_until(LIMIT, || async {
        active_pod_names(&client, "front-").await.len() == 3 && active_pod_names(&client, "back-").await.len() == 2
    })
    .await;
    assert!(both.is_some());
    let uids = |all: Vec<Value>| -> HashSet<String> { all.iter().map(|p| meta::uid(p).to_string()).collect() };
    let before = uids(pods(&client).await);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(uids(pods(&client).await), before, "nobody deleted anybody's pods");
    assert_eq!(active_pod_names(&client, "front-").await, ["front-0", "front-1", "front-2"]);
    assert_eq!(active_pod_names(&client, "back-").await, ["back-0", "back-1"]);
    // A bare pod without a pod-template-hash matches neither Deployment's ReplicaSet (as in
    // Kubernetes): nobody adopts it and nobody counts it.
    let stray = get(&client, &kinds::POD, "stray").await.unwrap();
    assert!(meta::owner_references(&stray).is_empty());

    client.patch(&kinds::DEPLOYMENT, Some("default"), "front", Patch::Merge(json!({"spec": {"replicas": 1}}))).await.unwrap();
    assert!(wait_until(LIMIT, || async { active_pod_names(&client, "front-").await == ["front-0"] }).await.is_some());
    assert_eq!(active_pod_names(&client, "back-").await, ["back-0", "back-1"], "scaling one leaves the other alone");
    running.stop().await;
}

/// Every pod change as a watcher sees it, with the ready count and the template hashes present
/// after each one.
struct Observer {
    pods: HashMap<String, Value>,
    min_ready: usize,
    max_active: usize,
    max_hashes: usize,
}

fn observe(client: Arc<dyn Client>) -> (Arc<Mutex<Observer>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Observer { pods: HashMap::new(), min_ready: usize::MAX, max_active: 0, max_hashes: 0 }));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let list = client.list(&kinds::POD, &ListParams::namespace("default")).await.unwrap();
        s.lock().unwrap().pods = list.items.into_iter().map(|p| (meta::name(&p).to_string(), p)).collect();
        let mut events = client.watch(&kinds::POD, &ListParams::namespace("default"), list.resource_version).await.unwrap();
        while let Some(Ok(event)) = events.next().await {
            let mut o = s.lock().unwrap();
            match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    o.pods.insert(meta::name(&p).to_string(), p);
                }
                WatchEvent::Deleted(p) => {
                    o.pods.remove(meta::name(&p));
                }
                WatchEvent::Bookmark(_) => continue,
            }
            let ready = o.pods.values().filter(|p| pod::is_active(p) && pod::is_ready(p)).count();
            let active = o.pods.values().filter(|p| pod::is_active(p)).count();
            let hashes: HashSet<String> =
                o.pods.values().filter_map(|p| p["metadata"]["labels"]["pod-template-hash"].as_str().map(str::to_string)).collect();
            o.min_ready = o.min_ready.min(ready);
            o.max_active = o.max_active.max(active);
            o.max_hashes = o.max_hashes.max(hashes.len());
        }
    });
    (seen, task)
}

#[tokio::test(start_paused = true)]
async fn a_rolling_update_with_max_surge_1_and_max_unavailable_0_never_drops_below_replicas_ready() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(2));
    let mut d = deployment("web", 3, "image-a");
    d["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    client.create(&kinds::DEPLOYMENT, Some("default"), d).await.unwrap();
    assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
    let old_rs = meta::name(&replicasets(&client).await[0]).to_string();

    let (seen, watcher) = observe(client.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", set_image("image-b")).await.unwrap();
    let done = wait_until(Duration::from_secs(120), || async {
        rolled_out(&client, "web").await
            && pods(&client).await.iter().filter(|p| pod::is_active(p)).all(|p| p["spec"]["containers"][0]["image"] == "image-b")
    })
    .await;
    assert!(done.is_some(), "the rollout completes");
    tokio::time::sleep(Duration::from_secs(1)).await;
    watcher.abort();
    let (min_ready, max_active, max_hashes) = seen.lock().map(|o| (o.min_ready, o.max_active, o.max_hashes)).unwrap();
    assert!(min_ready >= 3, "at one moment only {min_ready} pods were ready");
    assert!(max_active <= 4, "surge of 1 exceeded: {max_active} pods at once");
    assert_eq!(max_hashes, 2, "old and new pods overlapped, as a rolling update does");
    let old = get(&client, &kinds::REPLICASET, &old_rs).await.expect("the old ReplicaSet is kept as history");
    assert_eq!(old["spec"]["replicas"], 0);
    assert_eq!(active_pod_names(&client, "web-").await.len(), 3);
    let d = get(&client, &kinds::DEPLOYMENT, "web").await.unwrap();
    assert_eq!(d["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "2");
    kubelet.abort();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_recreate_rollout_never_runs_old_and_new_pods_together() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    let mut d = deployment("web", 3, "image-a");
    d["spec"]["strategy"] = json!({"type": "Recreate"});
    client.create(&kinds::DEPLOYMENT, Some("default"), d).await.unwrap();
    assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());

    let (seen, watcher) = observe(client.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", set_image("image-b")).await.unwrap();
    let done = wait_until(Duration::from_secs(60), || async {
        rolled_out(&client, "web").await
            && pods(&client).await.iter().filter(|p| pod::is_active(p)).all(|p| p["spec"]["containers"][0]["image"] == "image-b")
    })
    .await;
    assert!(done.is_some(), "the rollout completes");
    watcher.abort();
    let (max_active, max_hashes) = seen.lock().map(|o| (o.max_active, o.max_hashes)).unwrap();
    assert_eq!(max_hashes, 1, "old and new pods existed at the same time");
    assert!(max_active <= 3);
    assert_eq!(active_pod_names(&client, "web-").await, ["web-0", "web-1", "web-2"]);
    kubelet.abort();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn scaling_a_deployment_changes_its_replicaset_without_a_new_rollout() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", 2, "minimal")).await.unwrap();
    assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
    for n in [5, 1] {
        client.patch(&kinds::DEPLOYMENT, Some("default"), "web", Patch::Merge(json!({"spec": {"replicas": n}}))).await.unwrap();
        assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
        assert_eq!(active_pod_names(&client, "web-").await.len(), n as usize);
    }
    assert_eq!(replicasets(&client).await.len(), 1, "no new ReplicaSet");
    let d = get(&client, &kinds::DEPLOYMENT, "web").await.unwrap();
    assert_eq!(d["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
    kubelet.abort();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_rollout_whose_pods_never_become_ready_reports_progress_deadline_exceeded() {
    let client = api().await;
    let running = workloads(&client);
    let mut d = deployment("web", 2, "never-starts");
    d["spec"]["progressDeadlineSeconds"] = json!(60);
    client.create(&kinds::DEPLOYMENT, Some("default"), d).await.unwrap();
    let exceeded = || async {
        get(&client, &kinds::DEPLOYMENT, "web")
            .await
            .and_then(|d| condition(&d, "Progressing"))
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "ProgressDeadlineExceeded")
    };
    assert!(wait_until(Duration::from_secs(50), exceeded).await.is_none(), "not before the deadline");
    let took = wait_until(Duration::from_secs(60), exceeded).await.expect("reported after the deadline");
    assert!(took <= Duration::from_secs(15), "reported {took:?} after the 50 s mark");
    let d = get(&client, &kinds::DEPLOYMENT, "web").await.unwrap();
    let available = condition(&d, "Available").unwrap();
    assert_eq!(available["reason"], "MinimumReplicasUnavailable");
    assert_eq!(d["status"]["unavailableReplicas"], 2);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn old_replicasets_beyond_the_revision_history_limit_are_deleted() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    let mut d = deployment("web", 2, "v1");
    d["spec"]["revisionHistoryLimit"] = json!(1);
    client.create(&kinds::DEPLOYMENT, Some("default"), d).await.unwrap();
    for image in ["v2", "v3", "v4"] {
        assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
        client.patch(&kinds::DEPLOYMENT, Some("default"), "web", set_image(image)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(wait_until(LIMIT, || async { rolled_out(&client, "web").await && replicasets(&client).await.len() == 2 }).await.is_some());
    let mut revisions: Vec<String> = replicasets(&client)
        .await
        .iter()
        .map(|rs| rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"].as_str().unwrap_or("").to_string())
        .collect();
    revisions.sort();
    assert_eq!(revisions, ["3", "4"], "the newest and one old revision remain");
    kubelet.abort();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_paused_deployment_does_not_roll_out_until_resumed() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(1));
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", 2, "v1")).await.unwrap();
    assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", Patch::Merge(json!({"spec": {"paused": true}}))).await.unwrap();
    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", set_image("v2")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(replicasets(&client).await.len(), 1, "no rollout while paused");
    let d = get(&client, &kinds::DEPLOYMENT, "web").await.unwrap();
    assert_eq!(condition(&d, "Progressing").unwrap()["reason"], "DeploymentPaused");

    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", Patch::Merge(json!({"spec": {"paused": false}}))).await.unwrap();
    let done = wait_until(LIMIT, || async {
        rolled_out(&client, "web").await
            && pods(&client).await.iter().filter(|p| pod::is_active(p)).all(|p| p["spec"]["containers"][0]["image"] == "v2")
    })
    .await;
    assert!(done.is_some());
    kubelet.abort();
    running.stop().await;
}

/// Every `Progressing` reason a watcher of Deployment `name` sees, in order.
fn progressing_reasons(client: Arc<dyn Client>, name: &'static str) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let list = client.list(&kinds::DEPLOYMENT, &ListParams::namespace("default")).await.unwrap();
        let mut events = client.watch(&kinds::DEPLOYMENT, &ListParams::namespace("default"), list.resource_version).await.unwrap();
        while let Some(Ok(event)) = events.next().await {
            let (WatchEvent::Added(d) | WatchEvent::Modified(d)) = event else { continue };
            let Some(reason) = condition(&d, "Progressing").and_then(|c| c["reason"].as_str().map(str::to_string)) else { continue };
            let mut seen = s.lock().unwrap();
            if meta::name(&d) == name && seen.last() != Some(&reason) {
                seen.push(reason);
            }
        }
    });
    (seen, task)
}

#[tokio::test(start_paused = true)]
async fn scaling_a_deployment_rolled_out_long_ago_never_reports_its_progress_deadline_exceeded() {
    let client = api().await;
    let running = workloads(&client);
    let kubelet = kubelet(client.clone(), Duration::from_secs(3));
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", 2, "minimal")).await.unwrap();
    assert!(wait_until(LIMIT, || rolled_out(&client, "web")).await.is_some());
    // Older than the default 600 s progress deadline, as a Deployment in daily use is.
    tokio::time::sleep(Duration::from_secs(11 * 60)).await;
    let (reasons, watcher) = progressing_reasons(client.clone(), "web");
    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", Patch::Merge(json!({"spec": {"replicas": 5}}))).await.unwrap();
    assert!(wait_until(LIMIT, || async {
        rolled_out(&client, "web").await && active_pod_names(&client, "web-").await.len() == 5
    }).await.is_some());
    // A rollout of a new template, long after the last, is not timed out either.
    client.patch(&kinds::DEPLOYMENT, Some("default"), "web", set_image("v2")).await.unwrap();
    let new_template_rolled_out = || async {
        rolled_out(&client, "web").await
            && pods(&client).await.iter().filter(|p| pod::is_active(p)).all(|p| p.to_string().contains("v2"))
    };
    assert!(wait_until(LIMIT, new_template_rolled_out).await.is_some());
    watcher.abort();
    let reasons = reasons.lock().unwrap().clone();
    assert!(!reasons.iter().any(|r| r == "ProgressDeadlineExceeded"), "{reasons:?}");
    assert_eq!(reasons.first().map(String::as_str), Some("NewReplicaSetAvailable"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "NewReplicaSetCreated"), "{reasons:?}");
    assert_eq!(reasons.last().map(String::as_str), Some("NewReplicaSetAvailable"), "{reasons:?}");
    kubelet.abort();
    running.stop().await;
}
