//! Scenario `failover`: two `shepherd controller-manager` candidates against one `shepherd server`;
//! `kill -9` the leader N times and time, from the kill, the Lease taken by the other candidate and
//! the first reconcile by it (a Deployment scaled right after the kill gets its ReplicaSet resized).
//! Each kill comes at a random moment of the renew cycle, as a crash would.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::Rng;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/failover";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-controller-manager";

pub struct Params {
    pub kills: usize,
    /// The candidates' --leader-elect-lease-duration, --leader-elect-renew-deadline and
    /// --leader-elect-retry-period, as the flags take them (`15s`, `500ms`).
    pub lease_duration: String,
    pub renew_deadline: String,
    pub retry_period: String,
}

impl Params {
    pub fn smoke() -> Params {
        Params { kills: 2, lease_duration: "4s".into(), renew_deadline: "3s".into(), retry_period: "500ms".into() }
    }
}

/// A controller-manager candidate, killed on drop.
struct Candidate {
    child: Child,
    identity: String,
}

impl Candidate {
    fn start(binary: &Path, server: &str, p: &Params) -> anyhow::Result<Candidate> {
        let mut child = Command::new(binary)
            .args(["controller-manager", "--server", server])
            .args(["--leader-elect-lease-duration", &p.lease_duration])
            .args(["--leader-elect-renew-deadline", &p.renew_deadline])
            .args(["--leader-elect-retry-period", &p.retry_period])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?).read_line(&mut line)?;
        // "shepherd controller-manager candidate ID against URL"
        let identity = line
            .split_whitespace()
            .nth(3)
            .ok_or_else(|| anyhow::anyhow!("unexpected first line: {line:?}"))?
            .to_string();
        Ok(Candidate { child, identity })
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn get(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    Ok(http.get(url).send().await?.json().await?)
}

async fn holder(http: &reqwest::Client, server: &str) -> anyhow::Result<String> {
    Ok(get(http, &format!("{server}{LEASE}")).await?["spec"]["holderIdentity"].as_str().unwrap_or("").to_string())
}

/// The `spec.replicas` of the Deployment's ReplicaSets (one: the template never changes).
async fn replica_set_replicas(http: &reqwest::Client, server: &str) -> anyhow::Result<Option<u64>> {
    let list = get(http, &format!("{server}/apis/apps/v1/namespaces/default/replicasets?labelSelector=app%3Dfailover"))
        .await?;
    Ok(list["items"].as_array().and_then(|items| items.first()).and_then(|rs| rs["spec"]["replicas"].as_u64()))
}

async fn scale(http: &reqwest::Client, server: &str, replicas: u64) -> anyhow::Result<()> {
    let r = http
        .patch(format!("{server}{DEPLOYMENT}"))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"replicas": replicas}}).to_string())
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "scaling: {}", r.status());
    Ok(())
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    let server = Process::start(binary, &["server", "--in-memory", "--controllers", "none"])?;
    let url = server.url.clone();
    let http = reqwest::Client::new();
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "failover"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "failover"}},
            "template": {"metadata": {"labels": {"app": "failover"}}, "spec": {"containers": [{"name": "c", "image": "minimal"}]}}}});
    let r = http.post(format!("{url}/apis/apps/v1/namespaces/default/deployments")).json(&deployment).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the Deployment: {}", r.status());
    let mut candidates = vec![Candidate::start(binary, &url, &p)?, Candidate::start(binary, &url, &p)?];
    let lease: Duration = shepherd_api::duration::parse(&p.lease_duration).map_err(|e| anyhow::anyhow!(e))?;
    let retry: Duration = shepherd_api::duration::parse(&p.retry_period).map_err(|e| anyhow::anyhow!(e))?;
    // A crash comes at any moment of the leader's renew cycle, and a standby polls at its own
    // phase: both drawn at random, or every kill would land at the same point of the cycle.
    let random_phase = || retry.mul_f64(rand::rng().random_range(0.0..1.0));
    let limit = lease * 3 + Duration::from_secs(30);

    let (mut takeovers, mut reconciles) = (Vec::new(), Vec::new());
    let mut replicas = 0;
    for kill in 0..p.kills {
        // A settled leader: it holds the Lease and has reconciled the last change.
        let start = Instant::now();
        let leader = loop {
            let h = holder(&http, &url).await?;
            if candidates.iter().any(|c| c.identity == h) && replica_set_replicas(&http, &url).await? == Some(replicas)
            {
                break h;
            }
            anyhow::ensure!(start.elapsed() < limit, "no settled leader after {limit:?} (kill {kill})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tokio::time::sleep(random_phase()).await;
        let i = candidates.iter().position(|c| c.identity == leader).unwrap_or(0);
        let mut dead = candidates.remove(i);
        let killed = Instant::now();
        dead.child.kill()?;
        let _ = dead.child.wait();
        replicas = 1 - replicas;
        scale(&http, &url, replicas).await?;
        let (mut took, mut reconciled) = (None, None);
        while took.is_none() || reconciled.is_none() {
            if took.is_none() && candidates.iter().any(|c| c.identity != leader) {
                let h = holder(&http, &url).await?;
                if !h.is_empty() && h != leader {
                    took = Some(killed.elapsed());
                }
            }
            if reconciled.is_none() && replica_set_replicas(&http, &url).await? == Some(replicas) {
                reconciled = Some(killed.elapsed());
            }
            anyhow::ensure!(killed.elapsed() < limit, "no takeover within {limit:?} (kill {kill})");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (took, reconciled) = (took.unwrap_or_default(), reconciled.unwrap_or_default());
        println!("kill {}: Lease taken after {took:.2?}, first reconcile after {reconciled:.2?}", kill + 1);
        takeovers.push(took);
        reconciles.push(reconciled);
        // Back to two candidates for the next kill.
        tokio::time::sleep(random_phase()).await;
        candidates.push(Candidate::start(binary, &url, &p)?);
    }
    let (takeover, reconcile) = (summarize(&takeovers), summarize(&reconciles));
    println!("failover over {} kills: Lease taken {takeover}; first reconcile by the new leader {reconcile}", p.kills);
    Ok(ScenarioResult {
        name: "failover",
        params: json!({"kills": p.kills, "lease_duration": p.lease_duration, "renew_deadline": p.renew_deadline,
            "retry_period": p.retry_period}),
        values: json!({"lease_taken": takeover, "first_reconcile": reconcile,
            "first_reconcile_ms": reconciles.iter().map(|d| d.as_secs_f64() * 1000.0).collect::<Vec<_>>()}),
    })
}
