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
