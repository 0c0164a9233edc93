//! Measurements, not assertions of speed (ignored by default; run in release):
//! `cargo test --release -p shepherd-controllers --test workloads_scale -- --ignored --nocapture`

mod workloads_support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use shepherd_api::kinds;
use shepherd_api::meta;
use shepherd_runtime::{DeleteParams, ListParams, WatchEvent};
use workloads_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn time_from_creating_a_deployment_of_10000_replicas_to_all_pods_created() {
    const REPLICAS: usize = 10_000;
    let client = api().await;
    let running = workloads(&client);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start_rv = client.list(&kinds::POD, &ListParams::namespace("default")).await.unwrap().resource_version;
    let mut events = client.watch(&kinds::POD, &ListParams::namespace("default"), start_rv).await.unwrap();
    let started = Instant::now();
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", REPLICAS as i64, "minimal")).await.unwrap();
    let mut names = HashSet::new();
    let mut first = None;
    while names.len() < REPLICAS {
        match tokio::time::timeout(Duration::from_secs(300), events.next()).await {
            Ok(Some(Ok(WatchEvent::Added(p)))) => {
                first.get_or_insert_with(|| started.elapsed());
                names.insert(meta::name(&p).to_string());
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("watch ended early: {other:?}"),
        }
    }
    let took = started.elapsed();
    println!(
        "deployment of {REPLICAS} replicas: first pod after {:?}, all {REPLICAS} pods created after {took:?} ({:.0} pods/s)",
        first.unwrap_or_default(),
        REPLICAS as f64 / took.as_secs_f64()
    );
    let expected: HashSet<String> = (0..REPLICAS).map(|i| format!("web-{i}")).collect();
    assert_eq!(names, expected);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(client.list(&kinds::POD, &ListParams::namespace("default")).await.unwrap().items.len(), REPLICAS, "no extra pods");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn latency_from_a_pod_deleted_to_its_replacement_created() {
    const REPLICAS: usize = 100;
    const SAMPLES: usize = 300;
    let client = api().await;
    let running = workloads(&client);
    client.create(&kinds::DEPLOYMENT, Some("default"), deployment("web", REPLICAS as i64, "minimal")).await.unwrap();
    let up = wait_until(Duration::from_secs(30), || async { active_pod_names(&client, "web-").await.len() == REPLICAS }).await;
    assert!(up.is_some());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rv = client.list(&kinds::POD, &ListParams::namespace("default")).await.unwrap().resource_version;
    let mut events = client.watch(&kinds::POD, &ListParams::namespace("default"), rv).await.unwrap();
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let name = format!("web-{}", (i * 37) % REPLICAS);
        let deleted = Instant::now();
        client.delete(&kinds::POD, Some("default"), &name, &DeleteParams::default()).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
                Ok(Some(Ok(WatchEvent::Added(p)))) if meta::name(&p) == name => {
                    samples.push(deleted.elapsed());
                    break;
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("no replacement for {name}: {other:?}"),
            }
        }
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p) as usize];
    println!(
        "pod deleted -> replacement created over {SAMPLES} deletions: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        pct(1.0).as_secs_f64() * 1e3
    );
    running.stop().await;
}
