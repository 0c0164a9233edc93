//! No split brain: a controller manager frozen (SIGSTOP) past its lease is replaced, and once
//! woken it stops without writing anything, as the API server's audit log of writes by identity
//! shows. Each candidate signs in with a token of its own, so the log tells them apart.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Candidate, LEASE};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-0123456789";

/// A controller-manager candidate signed in as `system:kube-controller-manager` with uid `uid`.
struct Signed {
    candidate: Candidate,
    uid: String,
}

impl Signed {
    fn start(server: &str, ca: &Path, uid: &str) -> Signed {
        let token = format!("{uid}-token-0123456789");
        let ca = ca.to_str().expect("a UTF-8 path");
        let candidate = Candidate::start("controller-manager", server, &["--token", &token, "--certificate-authority", ca]);
        Signed { candidate, uid: uid.to_string() }
    }
}

impl std::ops::Deref for Signed {
    type Target = Candidate;
    fn deref(&self) -> &Candidate {
        &self.candidate
    }
}

impl std::ops::DerefMut for Signed {
    fn deref_mut(&mut self) -> &mut Candidate {
        &mut self.candidate
    }
}

async fn get(http: &reqwest::Client, url: &str) -> Value {
    let r = http.get(url).bearer_auth(ADMIN).send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    r.json().await.unwrap_or(Value::Null)
}

async fn wait_for_holder(http: &reqwest::Client, server: &str, ids: &[&str], within: Duration) -> String {
    let url = format!("{server}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-controller-manager");
    let deadline = Instant::now() + within;
    loop {
        let h = get(http, &url).await["spec"]["holderIdentity"].as_str().unwrap_or("").to_string();
        if ids.contains(&h.as_str()) {
            return h;
        }
        assert!(Instant::now() < deadline, "the Lease not taken by one of {ids:?} within {within:?}: held by {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scales `web` and waits until it has that many pods (no scheduler runs: they stay pending).
async fn scale_and_converge(http: &reqwest::Client, server: &str, replicas: usize) {
    let r = http
        .patch(format!("{server}/apis/apps/v1/namespaces/default/deployments/web"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"replicas": replicas}}).to_string())
        .send()
        .await
        .expect("scale");
    assert!(r.status().is_success(), "scale: {}", r.status());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pods = get(http, &format!("{server}/api/v1/namespaces/default/pods?labelSelector=app%3Dweb")).await;
        let live = pods["items"]
            .as_array()
            .map_or(0, |ps| ps.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).count());
        if live == replicas {
            return;
        }
        assert!(Instant::now() < deadline, "web did not reach {replicas} pods: {live}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes that succeeded, recorded in the audit log for the user with `uid` (a refused one,
/// such as a stale Lease update answered 409, changed nothing).
fn writes_by(audit: &Path, uid: &str) -> usize {
    let log = std::fs::read_to_string(audit).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete" && e["user"]["uid"] == uid)
        .filter(|e| e["responseStatus"]["code"].as_u64().is_some_and(|c| (200..300).contains(&c)))
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete" | "deletecollection")))
        .count()
}

/// Polls until `uid` has more than `than` writes in the audit log.
async fn wait_for_writes(audit: &Path, uid: &str, than: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = writes_by(audit, uid);
        if n > than {
            return n;
        }
        assert!(Instant::now() < deadline, "no write by {uid} in the audit log after {than}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_that_wakes_after_losing_its_lease_stops_without_a_single_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    let mut csv = format!("{ADMIN},admin,admin,system:masters\n");
    for uid in ["cm-a", "cm-b"] {
        csv.push_str(&format!("{uid}-token-0123456789,system:kube-controller-manager,{uid}\n"));
    }
    std::fs::write(&tokens, csv).expect("tokens");
    let audit = dir.path().join("audit.log");
    let data = dir.path().join("server");
    let server = common::secure_server(
        &data,
        &["--token-auth-file", tokens.to_str().expect("path"), "--audit-log-path", audit.to_str().expect("path")],
    );
    let url = server.url.clone();
    let http = common::https_client(&data);
    let ca = data.join("pki/ca.crt");
    let mut cms = vec![Signed::start(&url, &ca, "cm-a"), Signed::start(&url, &ca, "cm-b")];
    let ids: Vec<String> = cms.iter().map(|c| c.identity.clone()).collect();
    let leader = wait_for_holder(&http, &url, &[&ids[0], &ids[1]], Duration::from_secs(60)).await;
    let i = cms.iter().position(|c| c.identity == leader).expect("a candidate leads");
    let mut frozen = cms.remove(i);
    let other = cms.remove(0);

    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let r = http
        .post(format!("{url}/apis/apps/v1/namespaces/default/deployments"))
        .bearer_auth(ADMIN)
        .json(&deploy)
        .send()
        .await
        .expect("create");
    assert!(r.status().is_success(), "create: {}", r.status());
    scale_and_converge(&http, &url, 2).await;
    wait_for_writes(&audit, &frozen.uid, 0).await;

    // Frozen past its lease: the other takes over and acts.
    frozen.signal("-STOP");
    wait_for_holder(&http, &url, &[&other.identity], LEASE + Duration::from_secs(10)).await;
    scale_and_converge(&http, &url, 4).await;
    let others = wait_for_writes(&audit, &other.uid, 0).await;
    let before = writes_by(&audit, &frozen.uid);

    // Woken, the old leader finds its lease lost and exits; the other goes on acting.
    frozen.signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = frozen.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the woken leader kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "a leader that lost its lease exits with an error");
    scale_and_converge(&http, &url, 1).await;
    // The other's writes after the wake-up are in the log: the old leader's would be too.
    wait_for_writes(&audit, &other.uid, others).await;
    assert_eq!(writes_by(&audit, &frozen.uid), before, "the woken leader wrote after it lost its lease");
}
