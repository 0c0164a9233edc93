//! Jobs on the real API server: completions and parallelism, back-off after failures, Indexed
//! completion, the failure policy, and a controller restarted mid-run counting every pod once.

mod workloads_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::meta;
use shepherd_controllers::job::{JobConfig, job_controller};
use shepherd_controllers::podutil;
use shepherd_runtime::{Client, ListParams, Manager, Patch, WatchEvent};
use tokio::time::Instant;
use workloads_support::*;

fn job_config() -> JobConfig {
    JobConfig { backoff_base: Duration::from_secs(10), backoff_max: Duration::from_secs(360) }
}

fn job_controller_only(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    manager.add(job_controller(client.clone(), &manager, &config(), job_config()).shutdown_grace(Duration::from_millis(100)));
    manager.spawn()
}

fn job(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["template"] = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}});
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// What the simulated kubelet saw: each pod's creation and end, by name, in paused-clock time.
#[derive(Default)]
struct Runs {
    started: Vec<(String, Instant)>,
    ended: Vec<(String, Instant, i64)>,
}

/// A kubelet that runs every new pod for one second and ends it with the exit code `script`
/// gives for the run number (0, 1, 2, ... across all pods) and the pod.
fn kubelet_running(client: Arc<dyn Client>, script: impl Fn(usize, &Value) -> i64 + Send + Sync + 'static) -> (Arc<Mutex<Runs>>, tokio::task::JoinHandle<()>) {
    let runs = Arc::new(Mutex::new(Runs::default()));
    let script = Arc::new(script);
    let seen = runs.clone();
    let task = tokio::spawn(async move {
        let Ok(mut events) = client.watch(&kinds::POD, &ListParams::default(), 0).await else { return };
        let mut count = 0;
        while let Some(Ok(event)) = events.next().await {
            let WatchEvent::Added(pod) = event else { continue };
            let n = count;
            count += 1;
            seen.lock().unwrap().started.push((meta::name(&pod).to_string(), Instant::now()));
            let code = script(n, &pod);
            let (client, seen) = (client.clone(), seen.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = podutil::format_time(podutil::now());
                let phase = if code == 0 { "Succeeded" } else { "Failed" };
                let status = json!({"status": {"phase": phase, "containerStatuses": [{"name": "main", "ready": false,
                    "restartCount": 0, "image": "busybox", "imageID": "",
                    "state": {"terminated": {"exitCode": code, "startedAt": now, "finishedAt": now}}}]}});
                let name = meta::name(&pod).to_string();
                if client.patch_status(&kinds::POD, Some("default"), &name, Patch::Merge(status)).await.is_ok() {
                    seen.lock().unwrap().ended.push((name, Instant::now(), code));
                }
            });
        }
    });
    (runs, task)
}

fn condition(job: &Value, kind: &str) -> Option<String> {
    job["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind && c["status"] == "True")
        .map(|c| c["reason"].as_str().unwrap_or("").to_string())
}

async fn wait_for_condition(client: &Arc<dyn Client>, name: &str, kind: &str, limit: Duration) -> Value {
    let done = wait_until(limit, || async {
        get(client, &kinds::JOB, name).await.is_some_and(|j| condition(&j, kind).is_some())
    })
    .await;
    let job = get(client, &kinds::JOB, name).await.expect("job exists");
    assert!(done.is_some(), "no {kind} condition: {}", job["status"]);
    job
}

#[tokio::test(start_paused = true)]
async fn a_job_whose_first_two_pods_fail_backs_off_then_completes_with_exactly_its_completions() {
    let client = api().await;
    let controllers = job_controller_only(&client);
    let (runs, kubelet) = kubelet_running(client.clone(), |n, _| if n < 2 { 1 } else { 0 });
    client.create(&kinds::JOB, Some("default"), job("work", json!({"completions": 5, "parallelism": 2}))).await.unwrap();

    let done = wait_for_condition(&client, "work", "Complete", Duration::from_secs(300)).await;
    assert_eq!((done["status"]["succeeded"].as_i64(), done["status"]["failed"].as_i64()), (Some(5), Some(2)));
    assert_eq!(done["status"]["active"], 0);
    assert!(done["status"]["completionTime"].is_string() && done["status"]["startTime"].is_string());

    let (started, ended) = {
        let runs = runs.lock().unwrap();
        (runs.started.clone(), runs.ended.clone())
    };
    assert_eq!(started.len(), 7, "five successes and two failures, no extra pod: {started:?}");
    let last_failure = ended.iter().filter(|e| e.2 != 0).map(|e| e.1).max().expect("failures");
    let next_start = started[2].1;
    // Two failures since the last success: 10 s doubled once, from a finish time of whole seconds.
    assert!(next_start.duration_since(last_failure) >= Duration::from_secs(19),
        "the third pod started {:?} after the second failure", next_start.duration_since(last_failure));

    let events = client.list(&kinds::EVENT, &ListParams::namespace("default")).await.unwrap().items;
    let reasons: Vec<&str> = events.iter().filter(|e| e["involvedObject"]["kind"] == "Job").filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains(&"SuccessfulCreate") && reasons.contains(&"Completed"), "{reasons:?}");
    let finalized = pods(&client).await.iter().all(|p| !meta::has_finalizer(p, shepherd_controllers::job::TRACKING_FINALIZER));
    assert!(finalized, "every finished pod lost its tracking finalizer");
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_job_fails_once_its_failures_pass_the_backoff_limit() {
    let client = api().await;
    let controllers = job_controller_only(&client);
    let (runs, kubelet) = kubelet_running(client.clone(), |_, _| 1);
    client.create(&kinds::JOB, Some("default"), job("doomed", json!({"backoffLimit": 2}))).await.unwrap();
    let failed = wait_for_condition(&client, "doomed", "Failed", Duration::from_secs(300)).await;
    assert_eq!(condition(&failed, "Failed").as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(failed["status"]["failed"], 3);
    assert_eq!(runs.lock().unwrap().started.len(), 3);
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_fail_job_rule_fails_at_once_and_an_ignored_exit_code_is_not_a_failure() {
    let client = api().await;
    let controllers = job_controller_only(&client);
    // Run 0 exits 42 (ignored), run 1 exits 3 (fails the Job).
    let (_runs, kubelet) = kubelet_running(client.clone(), |n, _| if n == 0 { 42 } else { 3 });
    let policy = json!({"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]});
    client.create(&kinds::JOB, Some("default"), job("picky", json!({"podFailurePolicy": policy}))).await.unwrap();
    let failed = wait_for_condition(&client, "picky", "Failed", Duration::from_secs(120)).await;
    assert_eq!(condition(&failed, "Failed").as_deref(), Some("PodFailurePolicy"));
    assert_eq!(failed["status"]["failed"], 1, "the ignored exit does not count");
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_job_past_its_active_deadline_fails_and_its_running_pods_are_deleted() {
    let client = api().await;
    let controllers = job_controller_only(&client);
    client.create(&kinds::JOB, Some("default"), job("slow", json!({"activeDeadlineSeconds": 30, "parallelism": 2, "completions": 4})))
        .await
        .unwrap();
    let failed = wait_for_condition(&client, "slow", "Failed", Duration::from_secs(60)).await;
    assert_eq!(condition(&failed, "Failed").as_deref(), Some("DeadlineExceeded"));
    let gone = wait_until(Duration::from_secs(10), || async { active_pod_names(&client, "slow-").await.is_empty() }).await;
    assert!(gone.is_some(), "running pods were left: {:?}", active_pod_names(&client, "slow-").await);
    controllers.stop().await;
}

fn index_of(pod: &Value) -> usize {
    pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"].as_str().and_then(|s| s.parse().ok()).expect("index")
}

#[tokio::test(start_paused = true)]
async fn an_indexed_job_runs_each_index_once_even_across_a_controller_restart() {
    let client = api().await;
    let first = job_controller_only(&client);
    let (runs, kubelet) = kubelet_running(client.clone(), |_, pod| {
        let env = &pod["spec"]["containers"][0]["env"];
        assert_eq!(env[0]["value"].as_str().map(|v| v.parse::<usize>().ok()), Some(Some(index_of(pod))), "index in env");
        0
    });
    client.create(&kinds::JOB, Some("default"), job("sq", json!({"completions": 5, "parallelism": 2, "completionMode": "Indexed"})))
        .await
        .unwrap();
    // Stop the controller once two pods ended, while others may be finishing unseen.
    let some = wait_until(Duration::from_secs(60), || async { runs.lock().unwrap().ended.len() >= 2 }).await;
    assert!(some.is_some());
    first.stop().await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let second = job_controller_only(&client);
    let done = wait_for_condition(&client, "sq", "Complete", Duration::from_secs(120)).await;
    assert_eq!(done["status"]["completedIndexes"], "0-4");
    assert_eq!(done["status"]["succeeded"], 5);
    let mut per_index: BTreeMap<usize, usize> = BTreeMap::new();
    for pod in pods(&client).await {
        assert_eq!(pod["spec"]["hostname"], format!("sq-{}", index_of(&pod)));
        *per_index.entry(index_of(&pod)).or_default() += 1;
    }
    assert_eq!(per_index, (0..5).map(|i| (i, 1)).collect(), "each index ran exactly once");
    kubelet.abort();
    second.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_suspended_job_runs_nothing_until_resumed_and_a_finished_one_is_deleted_after_its_ttl() {
    let client = api().await;
    let controllers = job_controller_only(&client);
    let (runs, kubelet) = kubelet_running(client.clone(), |_, _| 0);
    client.create(&kinds::JOB, Some("default"), job("later", json!({"suspend": true, "ttlSecondsAfterFinished": 30})))
        .await
        .unwrap();
    wait_for_condition(&client, "later", "Suspended", Duration::from_secs(10)).await;
    assert!(runs.lock().unwrap().started.is_empty(), "a suspended Job starts no pod");
    client.patch(&kinds::JOB, Some("default"), "later", Patch::Merge(json!({"spec": {"suspend": false}}))).await.unwrap();
    let done = wait_for_condition(&client, "later", "Complete", Duration::from_secs(30)).await;
    assert_eq!(done["status"]["succeeded"], 1);
    let finished_at = Instant::now();
    let deleted = wait_until(Duration::from_secs(60), || async { get(&client, &kinds::JOB, "later").await.is_none() }).await;
    assert!(deleted.is_some(), "the Job outlived its TTL");
    assert!(finished_at.elapsed() >= Duration::from_secs(29), "deleted before its TTL: {:?}", finished_at.elapsed());
    kubelet.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_job_takes_its_pods_with_it_despite_their_tracking_finalizers() {
    let client = api().await;
    let controllers = job_controller_only(&client);
    let gc = garbage_collector_only(&client);
    client.create(&kinds::JOB, Some("default"), job("gone", json!({"completions": 4, "parallelism": 2}))).await.unwrap();
    let started = wait_until(Duration::from_secs(10), || async { active_pod_names(&client, "gone-").await.len() == 2 }).await;
    assert!(started.is_some());
    client.delete(&kinds::JOB, Some("default"), "gone", &Default::default()).await.unwrap();
    let cascaded = wait_until(Duration::from_secs(60), || async { pods(&client).await.is_empty() }).await;
    assert!(cascaded.is_some(), "pods left: {:?}", pods(&client).await.iter().map(|p| p["metadata"].clone()).collect::<Vec<_>>());
    gc.stop().await;
    controllers.stop().await;
}
