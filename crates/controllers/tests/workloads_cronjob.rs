//! CronJobs on the real API server and tokio's paused clock: Forbid never overlaps two Jobs, an
//! outage of hours leads to one catch-up run, Replace swaps the running Job, history is trimmed.

mod workloads_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::meta;
use shepherd_controllers::cronjob::cronjob_controller;
use shepherd_controllers::podutil;
use shepherd_runtime::{Client, ListParams, Manager, Patch, WatchEvent};
use workloads_support::*;

fn cronjob_controller_only(client: &Arc<dyn Client>) -> Running {
    let manager = Manager::new(client.clone());
    manager.add(cronjob_controller(client.clone(), &manager, &config()).shutdown_grace(Duration::from_millis(100)));
    manager.spawn()
}

fn cronjob(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["jobTemplate"] = json!({"spec": {"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox"}]}}}});
    json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// Jobs seen running at once, at most, and every Job name created.
#[derive(Default)]
struct Seen {
    running: usize,
    most_at_once: usize,
    created: Vec<String>,
}

/// Stands in for the Job controller: every new Job completes after `run`, unless deleted first.
fn finisher(client: Arc<dyn Client>, run: Duration) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let Ok(mut events) = client.watch(&kinds::JOB, &ListParams::default(), 0).await else { return };
        while let Some(Ok(event)) = events.next().await {
            match event {
                WatchEvent::Added(job) => {
                    {
                        let mut s = s.lock().unwrap();
                        s.running += 1;
                        s.most_at_once = s.most_at_once.max(s.running);
                        s.created.push(meta::name(&job).to_string());
                    }
                    let (client, s) = (client.clone(), s.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(run).await;
                        let now = podutil::format_time(podutil::now());
                        let status = json!({"status": {"succeeded": 1, "startTime": now, "completionTime": now,
                            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": now}]}});
                        if client.patch_status(&kinds::JOB, Some("default"), meta::name(&job), Patch::Merge(status)).await.is_ok() {
                            s.lock().unwrap().running -= 1;
                        }
                    });
                }
                WatchEvent::Deleted(job) if job["status"]["conditions"].as_array().is_none_or(|c| c.is_empty()) => {
                    s.lock().unwrap().running -= 1;
                }
                _ => {}
            }
        }
    });
    (seen, task)
}

async fn jobs(client: &Arc<dyn Client>) -> Vec<Value> {
    client.list(&kinds::JOB, &ListParams::namespace("default")).await.map(|l| l.items).unwrap_or_default()
}

fn minute_of(name: &str) -> i64 {
    name.rsplit('-').next().and_then(|m| m.parse().ok()).expect("job name ends in its minute")
}

#[tokio::test(start_paused = true)]
async fn a_forbid_cronjob_every_minute_never_runs_two_jobs_at_once() {
    let client = api().await;
    let controllers = cronjob_controller_only(&client);
    // Each Job runs 90 s: every other minute finds the previous one still running.
    let (seen, finish) = finisher(client.clone(), Duration::from_secs(90));
    let spec = json!({"schedule": "* * * * *", "concurrencyPolicy": "Forbid", "successfulJobsHistoryLimit": 100});
    client.create(&kinds::CRONJOB, Some("default"), cronjob("tick", spec)).await.unwrap();
    let ran = wait_until(Duration::from_secs(660), || async { seen.lock().unwrap().created.len() >= 4 }).await;
    {
        let seen = seen.lock().unwrap();
        assert!(ran.is_some(), "only {:?} ran", seen.created);
        assert_eq!(seen.most_at_once, 1, "Forbid let Jobs overlap: {:?}", seen.created);
    }
    let cj = get(&client, &kinds::CRONJOB, "tick").await.expect("cronjob");
    assert!(cj["status"]["lastScheduleTime"].is_string(), "{}", cj["status"]);
    finish.abort();
    controllers.stop().await;
}

#[tokio::test(start_paused = true)]
async fn after_a_three_hour_outage_a_cronjob_runs_once_to_catch_up_and_says_it_missed_many() {
    let client = api().await;
    let (seen, finish) = finisher(client.clone(), Duration::from_secs(5));
    let first = cronjob_controller_only(&client);
    client.create(&kinds::CRONJOB, Some("default"), cronjob("tick", json!({"schedule": "* * * * *", "concurrencyPolicy": "Forbid"})))
        .await
        .unwrap();
    let started = wait_until(Duration::from_secs(120), || async { !seen.lock().unwrap().created.is_empty() }).await;
    assert!(started.is_some(), "no first run");
    first.stop().await;
    let stopped_minute = podutil::now().as_second() / 60;

    tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
    let restarted_minute = podutil::now().as_second() / 60;
    let second = cronjob_controller_only(&client);
    let in_outage = || async {
        let names: Vec<String> = jobs(&client).await.iter().map(|j| meta::name(j).to_string()).collect();
        names.into_iter().filter(|n| (stopped_minute + 1..=restarted_minute).contains(&minute_of(n))).collect::<Vec<_>>()
    };
    let caught_up = wait_until(Duration::from_secs(20), || async {
        let scheduled = get(&client, &kinds::CRONJOB, "tick").await
            .and_then(|c| c["status"]["lastScheduleTime"].as_str().and_then(podutil::parse_time));
        scheduled.is_some_and(|t| t.as_second() / 60 == restarted_minute) && !in_outage().await.is_empty()
    })
    .await;
    assert!(caught_up.is_some(), "no catch-up run: {:?}", jobs(&client).await);
    let in_outage = in_outage().await;
    assert_eq!(in_outage.len(), 1, "one catch-up run for the most recent missed time: {in_outage:?}");
    let events = client.list(&kinds::EVENT, &ListParams::namespace("default")).await.unwrap().items;
    let too_many = events.iter().find(|e| e["reason"] == "TooManyMissedTimes").expect("a TooManyMissedTimes event");
    assert!(too_many["message"].as_str().unwrap_or("").starts_with("too many missed start times: 1"), "{}", too_many["message"]);
    finish.abort();
    second.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_replace_cronjob_deletes_the_running_job_and_history_keeps_the_newest() {
    let client = api().await;
    let controllers = cronjob_controller_only(&client);
    // Jobs that never finish: each minute replaces the one before.
    let (seen, finish) = finisher(client.clone(), Duration::from_secs(24 * 3600));
    client.create(&kinds::CRONJOB, Some("default"), cronjob("swap", json!({"schedule": "*/1 * * * *", "concurrencyPolicy": "Replace"})))
        .await
        .unwrap();
    let replaced = wait_until(Duration::from_secs(200), || async { seen.lock().unwrap().created.len() >= 3 }).await;
    assert!(replaced.is_some());
    let alive = wait_until(Duration::from_secs(10), || async {
        jobs(&client).await.iter().filter(|j| !meta::is_deleting(j)).count() == 1
    })
    .await;
    assert!(alive.is_some(), "Replace left {} Jobs", jobs(&client).await.len());
    finish.abort();
    controllers.stop().await;

    // History: four finished Jobs with a limit of two keeps the newest two.
    let client = api().await;
    let controllers = cronjob_controller_only(&client);
    let (seen, finish) = finisher(client.clone(), Duration::from_secs(1));
    client.create(&kinds::CRONJOB, Some("default"), cronjob("keep", json!({"schedule": "* * * * *", "successfulJobsHistoryLimit": 2})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4 * 60 + 30)).await;
    let trimmed = wait_until(Duration::from_secs(20), || async { jobs(&client).await.len() == 2 }).await;
    let mut kept: Vec<String> = jobs(&client).await.iter().map(|j| meta::name(j).to_string()).collect();
    assert!(trimmed.is_some(), "kept {kept:?}");
    let mut created = seen.lock().unwrap().created.clone();
    assert!(created.len() >= 4, "{created:?}");
    created.sort();
    kept.sort();
    assert_eq!(kept, created[created.len() - 2..], "the newest two are kept");
    let cj = get(&client, &kinds::CRONJOB, "keep").await.expect("cronjob");
    assert!(cj["status"]["lastSuccessfulTime"].is_string());
    finish.abort();
    controllers.stop().await;
}
