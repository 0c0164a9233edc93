//! A pod's identity on the node is its UID: a force delete cuts short a graceful termination under
//! way, and a new pod that reuses a name runs at once while the old one is still going away.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const PODS: &str = "/api/v1/namespaces/default/pods";

async fn pods(http: &reqwest::Client, url: &str) -> Vec<Value> {
    let Ok(r) = http.get(format!("{url}{PODS}")).send().await else { return Vec::new() };
    let list: Value = r.json().await.unwrap_or_default();
    list["items"].as_array().cloned().unwrap_or_default()
}

async fn wait_for<T>(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
}

fn uid(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap_or_default().to_string()
}

fn deployment() -> Value {
    json!({"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "web"}, "spec": {"replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "web", "image": "busybox", "command": ["sh", "-c", "trap '' TERM; sleep 1000"]}]}}}})
}

/// Host pids of the containers of the pods with these uids, from the agent's state files.
fn container_pids(data_dir: &std::path::Path, uids: &BTreeSet<String>) -> Vec<i32> {
    let mut out = Vec::new();
    for uid in uids {
        for c in std::fs::read_dir(data_dir.join("agent/containers").join(uid)).into_iter().flatten().flatten() {
            let state: Value =
                std::fs::read_to_string(c.path().join("state.json")).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
            out.extend(state["main_pid"].as_i64().map(|p| p as i32));
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_reuse_the_names_of_force_deleted_pods_run_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", dir.path(), &["--lease-seconds", "1"]);
    let http = reqwest::Client::new();
    let url = daemon.url.clone();

    let r = http.post(format!("{url}{DEPLOYMENTS}")).json(&deployment()).send().await.expect("create");
    assert_eq!(r.status().as_u16(), 201);
    let old: BTreeSet<String> = wait_for("3 pods Running", Duration::from_secs(60), async || {
        let ps = pods(&http, &url).await;
        (ps.len() == 3 && ps.iter().all(running)).then(|| ps.iter().map(uid).collect())
    })
    .await;
    let old_pids = wait_for("a process per pod", Duration::from_secs(30), async || {
        let pids = container_pids(dir.path(), &old);
        (pids.len() == 3 && pids.iter().all(|p| alive(*p))).then_some(pids)
    })
    .await;

    // Delete the Deployment: its pods start a 30 s termination their containers ignore.
    let r = http.delete(format!("{url}{DEPLOYMENTS}/web")).send().await.expect("delete");
    assert!(r.status().is_success());
    let terminating = wait_for("the pods terminating", Duration::from_secs(60), async || {
        let ps = pods(&http, &url).await;
        (ps.len() == 3 && ps.iter().all(|p| p["metadata"]["deletionTimestamp"].is_string())).then_some(ps)
    })
    .await;
    assert!(old_pids.iter().all(|p| alive(*p)), "SIGTERM is ignored, so the processes still run");

    // Force delete them and apply the Deployment again at once.
    for p in &terminating {
        let name = p["metadata"]["name"].as_str().expect("name");
        let r = http.delete(format!("{url}{PODS}/{name}?gracePeriodSeconds=0")).send().await.expect("force delete");
        assert!(r.status().is_success() || r.status().as_u16() == 404, "{}", r.status());
    }
    let reapplied = Instant::now();
    let r = http.post(format!("{url}{DEPLOYMENTS}")).json(&deployment()).send().await.expect("create again");
    assert_eq!(r.status().as_u16(), 201);
    let new = wait_for("3 new pods Running", Duration::from_secs(60), async || {
        let ps = pods(&http, &url).await;
        (ps.len() == 3 && ps.iter().all(|p| running(p) && !old.contains(&uid(p)))).then_some(ps)
    })
    .await;
    let took = reapplied.elapsed();
    eprintln!("force delete + re-apply -> 3 pods Running: {took:?}");
    let mut names: Vec<&str> = new.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["web-0", "web-1", "web-2"], "the names are reused");
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // The force delete killed the old containers well before their 30 s grace period.
    wait_for("the old containers killed", Duration::from_secs(10), async || old_pids.iter().all(|p| !alive(*p)).then_some(())).await;
    wait_for("the old containers' state removed", Duration::from_secs(10), async || {
        container_pids(dir.path(), &old).is_empty().then_some(())
    })
    .await;
}
