//! Many simulated nodes in one agent against a real in-process API server.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_agent::{Agent, AgentConfig, RuntimeKind, SimulatedBehaviour};
use shepherd_api::kinds;
use shepherd_runtime::{DeleteParams, ListParams};
use support::*;

fn sim_config(delay_ms: u64) -> AgentConfig {
    let mut c = AgentConfig::new("unused", "/nonexistent");
    c.runtime = RuntimeKind::Simulated(SimulatedBehaviour { ready_delay: Duration::from_millis(delay_ms), fail_fraction: 0.0 });
    c.lease_interval = Duration::from_secs(1);
    c.restart_backoff_initial = Duration::from_millis(200);
    c.workers = 8;
    c
}

fn ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_simulated_nodes_each_get_a_node_and_a_lease_and_their_pods_run() {
    let client = api().await;
    let agent = Agent::simulated(client.clone(), sim_config(50), 100, "sim-").await.expect("agent");
    assert_eq!(agent.node_names().len(), 100);
    let agent = RunningAgent::run(agent);

    let start = Instant::now();
    loop {
        let nodes = client.list(&kinds::NODE, &ListParams::default()).await.expect("nodes");
        let leases = client.list(&kinds::LEASE, &ListParams::namespace("kube-node-lease")).await.expect("leases");
        let ready_nodes = nodes.items.iter().filter(|n| ready(n)).count();
        if ready_nodes == 100 && leases.items.len() == 100 {
            let n = &nodes.items[0];
            assert_eq!(n["status"]["capacity"]["pods"], "110");
            assert!(n["metadata"]["labels"]["kubernetes.io/hostname"].is_string());
            let l = &leases.items[0];
            assert_eq!(l["spec"]["leaseDurationSeconds"], 40);
            assert!(l["spec"]["renewTime"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('.')));
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "only {ready_nodes} ready nodes and {} leases", leases.items.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("100 simulated nodes registered with leases in {:?}", start.elapsed());

    let start = Instant::now();
    for i in 0..200 {
        let spec = json!({"containers": [{"name": "c", "image": "minimal"}]});
        create(&client, pod(&format!("p-{i}"), &format!("sim-{}", i % 100), spec)).await;
    }
    loop {
        let pods = client.list(&kinds::POD, &ListParams::namespace("default")).await.expect("pods");
        let running = pods.items.iter().filter(|p| running_and_ready(p)).count();
        if running == 200 {
            let p = &pods.items[0];
            assert!(p["status"]["podIP"].as_str().is_some_and(|ip| ip.starts_with("10.")), "{}", p["status"]);
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "only {running} of 200 pods running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("200 simulated pods Running and Ready in {:?}", start.elapsed());

    // Deleted pods go away (the simulated containers stop at once).
    client.delete(&kinds::POD, Some("default"), "p-7", &DeleteParams::default()).await.expect("delete");
    assert!(
        wait_until_async(Duration::from_secs(5), || async { get(&client, "p-7").await.is_none() }).await,
        "deleted simulated pod is removed"
    );

    // A deleted Node is registered again by its agent.
    client.delete(&kinds::NODE, None, "sim-3", &DeleteParams::default()).await.expect("delete node");
    assert!(
        wait_until_async(Duration::from_secs(5), || async { client.get(&kinds::NODE, None, "sim-3").await.is_ok_and(|n| ready(&n)) }).await,
        "node re-registered"
    );
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_sharing_a_cluster_each_follow_only_their_own_nodes_and_pods() {
    let client = api().await;
    let a = Agent::simulated(client.clone(), sim_config(20), 3, "sim-a-").await.expect("agent a");
    let b = Agent::simulated(client.clone(), sim_config(20), 3, "sim-b-").await.expect("agent b");
    let ((a_pods, a_nodes), (b_pods, b_nodes)) = (a.caches(), b.caches());
    let (a, b) = (RunningAgent::run(a), RunningAgent::run(b));
    for i in 0..12 {
        let node = format!("sim-{}-{}", if i % 2 == 0 { "a" } else { "b" }, i % 3);
        create(&client, pod(&format!("p-{i}"), &node, json!({"containers": [{"name": "c", "image": "minimal"}]}))).await;
    }
    let running = || async {
        let pods = client.list(&kinds::POD, &ListParams::namespace("default")).await.expect("pods");
        pods.items.iter().filter(|p| running_and_ready(p)).count() == 12
    };
    assert!(wait_until_async(Duration::from_secs(20), running).await, "12 pods Running and Ready");
    // The nodes register over the first lease interval.
    let registered = || async { client.list(&kinds::NODE, &ListParams::default()).await.is_ok_and(|l| l.items.len() == 6) };
    assert!(wait_until_async(Duration::from_secs(5), registered).await, "6 nodes registered");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Each agent holds the 6 pods and 3 Nodes it runs, not those of the other agent.
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let a_keys = sorted(a_pods.keys());
    assert_eq!(a_keys, ["default/p-0", "default/p-10", "default/p-2", "default/p-4", "default/p-6", "default/p-8"]);
    assert_eq!(b_pods.len(), 6);
    assert!(b_pods.keys().iter().all(|k| !a_keys.contains(k)));
    assert_eq!(sorted(a_nodes.keys()), ["sim-a-0", "sim-a-1", "sim-a-2"]);
    assert_eq!(sorted(b_nodes.keys()), ["sim-b-0", "sim-b-1", "sim-b-2"]);
    a.finish(&client).await;
    b.finish(&client).await;
}

async fn wait_until_async<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_pod_told_to_fail_fails_and_with_restart_policy_never_ends_failed() {
    let client = api().await;
    let agent = RunningAgent::run(Agent::simulated(client.clone(), sim_config(20), 2, "sim-").await.expect("agent"));
    let mut failing = pod("doomed", "sim-0", json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "minimal"}]}));
    failing["metadata"]["annotations"] = json!({shepherd_agent::SIMULATE_FAIL_ANNOTATION: "true"});
    create(&client, failing).await;
    let p = wait_pod(&client, "doomed", Duration::from_secs(10), |p| p["status"]["phase"] == "Failed").await;
    assert_eq!(container_status(&p)["state"]["terminated"]["exitCode"], 1);

    let mut looping = pod("looping", "sim-1", json!({"containers": [{"name": "c", "image": "minimal"}]}));
    looping["metadata"]["annotations"] = json!({shepherd_agent::SIMULATE_FAIL_ANNOTATION: "true"});
    create(&client, looping).await;
    wait_pod(&client, "looping", Duration::from_secs(10), |p| container_status(p)["state"]["waiting"]["reason"] == "CrashLoopBackOff").await;
    agent.finish(&client).await;
}

/// The simulated runtime reports a container Running after its fixed delay, so the agent does not
/// write the ContainerCreating status in between: the first status it writes is Running and
/// Ready, and it is written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_pod_gets_one_status_write_running_and_ready() {
    use futures::StreamExt;
    let client = api().await;
    let agent = RunningAgent::run(Agent::simulated(client.clone(), sim_config(300), 1, "sim-").await.expect("agent"));
    let created = create(&client, pod("once", "sim-0", json!({"containers": [{"name": "c", "image": "minimal"}]}))).await;
    let rv: u64 = created["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("resourceVersion");
    let mut watch = client.watch(&kinds::POD, &ListParams::namespace("default"), rv).await.expect("watch");
    let mut versions = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !versions.last().is_some_and(running_and_ready) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, watch.next()).await {
            Ok(Some(Ok(shepherd_runtime::WatchEvent::Modified(p)))) if p["metadata"]["name"] == "once" => versions.push(p),
            Ok(Some(Ok(_))) => {}
            other => panic!("pod not Running and Ready; versions seen: {versions:?}; then {:?}", other.map(|o| o.map(|r| r.is_ok()))),
        }
    }
    let ready = versions.last().expect("a version");
    assert_eq!(ready["status"]["phase"], "Running");
    assert!(ready["status"]["startTime"].is_string() && ready["status"]["podIP"].is_string(), "{}", ready["status"]);
    // Every earlier version is without container statuses: no ContainerCreating was written.
    for v in &versions[..versions.len() - 1] {
        assert!(v["status"]["containerStatuses"].is_null(), "a status before Running: {}", v["status"]);
    }
    // And nothing is written afterwards while the pod runs on unchanged.
    let later = tokio::time::timeout(Duration::from_millis(800), async {
        loop {
            match watch.next().await {
                Some(Ok(shepherd_runtime::WatchEvent::Modified(p))) if p["metadata"]["name"] == "once" => return p,
                Some(Ok(_)) => {}
                _ => std::future::pending::<()>().await,
            }
        }
    })
    .await;
    assert!(later.is_err(), "a further write: {:?}", later.map(|p| p["status"].clone()));
    agent.finish(&client).await;
}
