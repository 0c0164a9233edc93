//! Controller managers and schedulers as processes of their own, several of each against one API
//! server: one of each acts, a killed or frozen leader is replaced within the lease duration, and a
//! frozen leader that wakes up stops without acting.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Candidate, Daemon, LEASE};
use serde_json::{Value, json};

async fn get(http: &reqwest::Client, url: &str) -> Value {
    http.get(url).send().await.expect("GET").json().await.expect("json")
}

async fn holder(http: &reqwest::Client, server: &str, lease: &str) -> String {
    let l = get(http, &format!("{server}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{lease}")).await;
    l["spec"]["holderIdentity"].as_str().unwrap_or("").to_string()
}

/// Polls until `lease` is held by one of `ids` (comma-separated); returns its holder.
async fn wait_for_holder(http: &reqwest::Client, server: &str, lease: &str, ids: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let h = holder(http, server, lease).await;
        if ids.split(',').any(|id| id == h) {
            return h;
        }
        assert!(Instant::now() < deadline, "{lease} not taken by one of {ids:?} within {within:?}: held by {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scale_and_wait(http: &reqwest::Client, server: &str, replicas: u64) {
    let deploy = format!("{server}/apis/apps/v1/namespaces/default/deployments/web");
    let r = http
        .patch(&deploy)
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"replicas": replicas}}).to_string())
        .send()
        .await
        .expect("scale");
    assert!(r.status().is_success(), "scale: {}", r.status());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = get(http, &deploy).await;
        let pods = get(http, &format!("{server}/api/v1/namespaces/default/pods")).await;
        let bound = pods["items"].as_array().map_or(0, |ps| {
            ps.iter().filter(|p| p["spec"]["nodeName"].is_string() && p["metadata"]["deletionTimestamp"].is_null()).count()
        });
        if d["status"]["readyReplicas"] == json!(replicas) && d["status"]["replicas"] == json!(replicas) && bound == replicas as usize {
            return;
        }
        assert!(Instant::now() < deadline, "web did not converge to {replicas}: status {} with {bound} bound pods", d["status"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_acts_and_a_killed_or_frozen_one_is_replaced_within_the_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", &dir.path().join("server"), &["--controllers", "none"]);
    let url = server.url.clone();
    let agent = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["agent", "--server", &url, "--simulate-nodes", "2", "--simulated-ready-ms", "20", "--data-dir"])
        .arg(dir.path().join("agent"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start agent");
    let _agent = common::KillOnDrop(agent);
    let mut cms = [Candidate::start("controller-manager", &url, &[]), Candidate::start("controller-manager", &url, &[])];
    let schedulers = [Candidate::start("scheduler", &url, &[]), Candidate::start("scheduler", &url, &[])];
    let http = reqwest::Client::new();

    let cm_ids: Vec<String> = cms.iter().map(|c| c.identity.clone()).collect();
    let sched_ids: Vec<String> = schedulers.iter().map(|c| c.identity.clone()).collect();
    let ids = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(",");
    let cm_leader = wait_for_holder(&http, &url, "kube-controller-manager", &ids(&cm_ids), Duration::from_secs(30)).await;
    let sched_leader = wait_for_holder(&http, &url, "kube-scheduler", &ids(&sched_ids), Duration::from_secs(30)).await;

    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let r = http.post(format!("{url}/apis/apps/v1/namespaces/default/deployments")).json(&deploy).send().await.expect("create");
    assert!(r.status().is_success(), "create: {}", r.status());
    scale_and_wait(&http, &url, 3).await;
    // Exactly one of each acts: the other candidates still wait for their Lease.
    for c in cms.iter().chain(&schedulers) {
        let leading = c.stderr().contains("is leading");
        assert_eq!(leading, c.identity == cm_leader || c.identity == sched_leader, "{}: {}", c.identity, c.stderr());
    }

    // kill -9 both leaders: the others take over within the lease duration and the next change converges.
    let (cm_i, sched_i) = (cm_ids.iter().position(|i| *i == cm_leader).unwrap(), sched_ids.iter().position(|i| *i == sched_leader).unwrap());
    let killed = Instant::now();
    cms[cm_i].signal("-KILL");
    schedulers[sched_i].signal("-KILL");
    let (cm_next, sched_next) = (cms[1 - cm_i].identity.clone(), schedulers[1 - sched_i].identity.clone());
    let slack = LEASE + Duration::from_secs(6);
    wait_for_holder(&http, &url, "kube-controller-manager", &cm_next, slack).await;
    wait_for_holder(&http, &url, "kube-scheduler", &sched_next, slack).await;
    eprintln!("both Leases taken over {:?} after the kill", killed.elapsed());
    scale_and_wait(&http, &url, 5).await;

    // Freeze the active controller manager past its lease: a fresh candidate takes over and acts.
    let frozen = &cms[1 - cm_i];
    let fresh = Candidate::start("controller-manager", &url, &[]);
    frozen.signal("-STOP");
    wait_for_holder(&http, &url, "kube-controller-manager", &fresh.identity, slack).await;
    scale_and_wait(&http, &url, 2).await;
    // Woken up, the old leader finds its renew deadline long past: it stops without acting.
    frozen.signal("-CONT");
    let frozen = &mut cms[1 - cm_i];
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = frozen.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the woken leader kept running: {}", frozen.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "a leader that lost its lease exits with an error");
    assert!(frozen.stderr().contains("lost the lease kube-system/kube-controller-manager"), "{}", frozen.stderr());
    assert_eq!(holder(&http, &url, "kube-controller-manager").await, fresh.identity);
    scale_and_wait(&http, &url, 2).await;

    // A clean stop gives the Lease up: the other candidate takes it at once, not after the lease.
    let _standby = Candidate::start("controller-manager", &url, &[]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut fresh = fresh;
    let stopped = Instant::now();
    fresh.signal("-TERM");
    let status = fresh.child.wait().expect("wait");
    assert!(status.success(), "clean stop: {status} {}", fresh.stderr());
    wait_for_holder(&http, &url, "kube-controller-manager", &_standby.identity, LEASE).await;
    eprintln!("a released Lease was taken {:?} after SIGTERM", stopped.elapsed());
}
