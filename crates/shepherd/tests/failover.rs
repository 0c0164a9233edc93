//! Two node agents (two processes) and a server: when one agent stops, its pods move to the other
//! after the node grace period and the eviction timeout.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

/// Starts a node agent process, killed with the test.
fn start_agent(server: &str, name: &str, dir: &std::path::Path) -> common::KillOnDrop {
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["agent", "--server", server, "--node-name", name, "--runtime", "simulated", "--lease-seconds", "0.3",
            "--simulated-ready-ms", "20", "--data-dir"])
        .arg(dir.join(name))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start agent");
    common::KillOnDrop(child)
}

async fn pods(http: &reqwest::Client, url: &str) -> Vec<Value> {
    let list: Value = http.get(format!("{url}/api/v1/namespaces/default/pods")).send().await.expect("list").json().await.expect("json");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn node_of(p: &Value) -> &str {
    p["spec"]["nodeName"].as_str().unwrap_or("")
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
}

async fn wait_until<F: Fn(&[Value]) -> bool>(http: &reqwest::Client, url: &str, what: &str, f: F) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ps = pods(http, url).await;
        if f(&ps) {
            return ps;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {:?}",
            ps.iter().map(|p| (p["metadata"]["name"].clone(), node_of(p).to_string(), p["status"]["phase"].clone())).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_stopped_agent_move_to_the_other_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", &dir.path().join("server"), &["--node-grace-seconds", "1.5", "--pod-eviction-seconds", "1"]);
    let url = server.url.clone();
    let a = start_agent(&url, "node-a", dir.path());
    let _b = start_agent(&url, "node-b", dir.path());
    let http = reqwest::Client::new();

    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    // Wait for both nodes so the scheduler spreads the pods over them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes: Value = http.get(format!("{url}/api/v1/nodes")).send().await.expect("nodes").json().await.expect("json");
        if nodes["items"].as_array().map_or(0, Vec::len) == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "agents did not register: {nodes}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = http.post(format!("{url}/apis/apps/v1/namespaces/default/deployments")).json(&deploy).send().await.expect("create");
    assert_eq!(r.status().as_u16(), 201);

    let spread = wait_until(&http, &url, "4 Running pods on both nodes", |ps| {
        ps.iter().filter(|p| running(p)).count() == 4 && ps.iter().any(|p| node_of(p) == "node-a") && ps.iter().any(|p| node_of(p) == "node-b")
    })
    .await;
    let on_a = spread.iter().filter(|p| node_of(p) == "node-a").count();
    assert!(on_a >= 1);

    drop(a); // the agent of node-a stops (SIGKILL)
    let stopped = Instant::now();
    let moved = wait_until(&http, &url, "all 4 pods Running on node-b", |ps| {
        ps.len() == 4 && ps.iter().all(|p| running(p) && node_of(p) == "node-b")
    })
    .await;
    eprintln!("{on_a} pods moved from node-a to node-b {:?} after its agent stopped", stopped.elapsed());
    assert_eq!(moved.len(), 4);

    let node: Value = http.get(format!("{url}/api/v1/nodes/node-a")).send().await.expect("node").json().await.expect("json");
    let ready = node["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Ready")).cloned().unwrap_or_default();
    assert_eq!(ready["status"], "Unknown", "{node}");
    let taints = node["spec"]["taints"].to_string();
    assert!(taints.contains("node.kubernetes.io/unreachable"), "{taints}");
}
