//! Two `shepherd server --store etcd` processes on one etcd serve one cluster: a write through one
//! is in the other's watch, a stale write through the other is a conflict, node ports and cluster
//! IPs allocated through both at once never collide, and one server killed leaves the other
//! serving everything.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Candidate, Daemon, LEASE};
use futures::future::join_all;
use serde_json::{Value, json};
use shepherd_store::LocalEtcd;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
const SERVICES: &str = "/api/v1/namespaces/default/services";

fn server(dir: &std::path::Path, etcd: &LocalEtcd) -> Daemon {
    let endpoint = etcd.endpoint();
    Daemon::start(
        "server",
        dir,
        &[
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoint,
            "--etcd-prefix",
            "/ha",
            // Only the ClusterIP allocator, in both servers at once: the race the store must settle.
            "--controllers",
            "clusterip",
            "--service-node-port-range",
            "30000-30049",
            "--service-cluster-ip-range",
            "10.96.0.0/26",
        ],
    )
}

async fn send(http: &reqwest::Client, method: reqwest::Method, url: &str, body: Option<&Value>) -> (u16, Value) {
    let mut req = http.request(method, url);
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap_or(Value::Null))
}

/// Reads a watch response until an event satisfies `f`, within 20 s.
async fn watch_until(resp: &mut reqwest::Response, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buffer = Vec::new();
    loop {
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if let Ok(event) = serde_json::from_slice::<Value>(&line)
                && f(&event)
            {
                return event;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, resp.chunk()).await.expect("the event within 20 s").expect("watch read");
        buffer.extend_from_slice(&chunk.expect("the watch stays open"));
    }
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"type": "NodePort", "selector": {"app": name}, "ports": [{"port": 80}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_servers_on_one_etcd_serve_one_cluster_and_survive_the_loss_of_one() {
    let etcd = LocalEtcd::start().unwrap_or_else(|e| panic!("this test runs a real etcd: {e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = server(&dir.path().join("a"), &etcd);
    let b = server(&dir.path().join("b"), &etcd);
    let http = reqwest::Client::new();

    // A watch on b sees a create through a.
    let (_, list) = send(&http, reqwest::Method::GET, &format!("{}{CONFIGMAPS}", b.url), None).await;
    let rv = list["metadata"]["resourceVersion"].as_str().expect("list resourceVersion").to_string();
    let mut watch =
        http.get(format!("{}{CONFIGMAPS}?watch=true&resourceVersion={rv}", b.url)).send().await.expect("watch on b");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": {"v": "1"}});
    let (code, created) = send(&http, reqwest::Method::POST, &format!("{}{CONFIGMAPS}", a.url), Some(&cm)).await;
    assert_eq!(code, 201, "{created}");
    let event = watch_until(&mut watch, |e| e["object"]["metadata"]["name"] == "shared").await;
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);

    // An update through a; the same update through b with the old resourceVersion is a conflict.
    let mut v2 = created.clone();
    v2["data"]["v"] = json!("2");
    let (code, updated) = send(&http, reqwest::Method::PUT, &format!("{}{CONFIGMAPS}/shared", a.url), Some(&v2)).await;
    assert_eq!(code, 200, "{updated}");
    let mut stale = created.clone();
    stale["data"]["v"] = json!("stale");
    let (code, err) = send(&http, reqwest::Method::PUT, &format!("{}{CONFIGMAPS}/shared", b.url), Some(&stale)).await;
    assert_eq!(code, 409, "a stale resourceVersion through the other server: {err}");
    assert_eq!(err["reason"], "Conflict");
    let (_, read) = send(&http, reqwest::Method::GET, &format!("{}{CONFIGMAPS}/shared", b.url), None).await;
    assert_eq!(read["data"]["v"], "2", "b reads a's write");

    // Thirty NodePort Services through both servers at once, from 50 ports and 61 addresses.
    let creates = (0..30).map(|i| {
        let (http, url) = (http.clone(), if i % 2 == 0 { a.url.clone() } else { b.url.clone() });
        async move {
            let svc = service(&format!("svc-{i}"));
            let (code, body) = send(&http, reqwest::Method::POST, &format!("{url}{SERVICES}"), Some(&svc)).await;
            assert_eq!(code, 201, "{body}");
            body["spec"]["ports"][0]["nodePort"].as_i64().expect("a node port")
        }
    });
    let ports: Vec<i64> = join_all(creates).await;
    let distinct: BTreeSet<i64> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "no node port twice: {ports:?}");
    // Both servers' ClusterIP allocators race for the same first free addresses.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ips = loop {
        let (_, list) = send(&http, reqwest::Method::GET, &format!("{}{SERVICES}", b.url), None).await;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let ips: Vec<String> = items
            .iter()
            .filter_map(|s| s["spec"]["clusterIP"].as_str())
            .filter(|ip| !ip.is_empty())
            .map(String::from)
            .collect();
        if ips.len() == 30 {
            break ips;
        }
        assert!(Instant::now() < deadline, "every Service gets a cluster IP within 60 s: {ips:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let distinct: BTreeSet<&String> = ips.iter().collect();
    assert_eq!(distinct.len(), 30, "no cluster IP twice: {ips:?}");

    // a dies without a word; b serves every object and takes writes, and its watch goes on.
    a.kill9();
    let cm2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}});
    let (code, body) = send(&http, reqwest::Method::POST, &format!("{}{CONFIGMAPS}", b.url), Some(&cm2)).await;
    assert_eq!(code, 201, "{body}");
    watch_until(&mut watch, |e| e["object"]["metadata"]["name"] == "after").await;
    let (_, services) = send(&http, reqwest::Method::GET, &format!("{}{SERVICES}", b.url), None).await;
    assert_eq!(services["items"].as_array().map_or(0, Vec::len), 30, "nothing written through a is lost");
    let (code, _) = send(&http, reqwest::Method::GET, &format!("{}/readyz", b.url), None).await;
    assert_eq!(code, 200, "b stays ready");
    // kubectl against the survivor agrees.
    let kubectl = common::Kubectl { bin: common::installed_kubectl(), url: b.url.clone() };
    let listed = tokio::task::spawn_blocking(move || kubectl.json(&["get", "configmaps,services"])).await.expect("kubectl");
    let names: BTreeSet<&str> =
        listed["items"].as_array().into_iter().flatten().filter_map(|o| o["metadata"]["name"].as_str()).collect();
    assert!(names.contains("shared") && names.contains("after") && names.contains("svc-29"), "{names:?}");
}

fn ha_server(dir: &std::path::Path, endpoints: &str) -> Daemon {
    Daemon::start(
        "server",
        dir,
        &["--store", "etcd", "--etcd-endpoints", endpoints, "--etcd-prefix", "/ha3", "--controllers", "none"],
    )
}

async fn lease_holder(http: &reqwest::Client, server: &str, lease: &str) -> String {
    let url = format!("{server}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{lease}");
    let (_, l) = send(http, reqwest::Method::GET, &url, None).await;
    l["spec"]["holderIdentity"].as_str().unwrap_or("").to_string()
}

/// Polls until `lease` is held by one of `ids`; returns the holder.
async fn wait_for_holder(http: &reqwest::Client, server: &str, lease: &str, ids: &[&str], within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let h = lease_holder(http, server, lease).await;
        if ids.contains(&h.as_str()) {
            return h;
        }
        assert!(Instant::now() < deadline, "{lease} not taken by one of {ids:?} within {within:?}: held by {h:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scales `web` through `write` and waits until `read` shows it converged: every replica ready
/// and bound to a node.
async fn scale_and_converge(http: &reqwest::Client, write: &str, read: &str, replicas: u64) {
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    let r = http
        .patch(format!("{write}{path}"))
        .header("content-type", "application/merge-patch+json")
        .body(json!({"spec": {"replicas": replicas}}).to_string())
        .send()
        .await
        .expect("scale");
    assert!(r.status().is_success(), "scale: {}", r.status());
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, d) = send(http, reqwest::Method::GET, &format!("{read}{path}"), None).await;
        let (_, pods) = send(http, reqwest::Method::GET, &format!("{read}/api/v1/namespaces/default/pods"), None).await;
        let bound = pods["items"].as_array().map_or(0, |ps| {
            ps.iter().filter(|p| p["spec"]["nodeName"].is_string() && p["metadata"]["deletionTimestamp"].is_null()).count()
        });
        let status = &d["status"];
        if status["readyReplicas"] == json!(replicas) && status["replicas"] == json!(replicas) && bound == replicas as usize {
            return;
        }
        assert!(Instant::now() < deadline, "web did not converge to {replicas}: status {status} with {bound} bound pods");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// ConfigMap names `ha-*` that `server` lists.
async fn listed_configmaps(http: &reqwest::Client, server: &str) -> BTreeSet<String> {
    let (code, list) = send(http, reqwest::Method::GET, &format!("{server}{CONFIGMAPS}"), None).await;
    assert_eq!(code, 200, "{list}");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("ha-"))
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_on_three_etcd_members_survives_the_loss_of_a_leader_a_member_and_a_server() {
    let mut members = LocalEtcd::start_cluster(3).unwrap_or_else(|e| panic!("this test runs a real etcd cluster: {e}"));
    let endpoints = members.iter().map(LocalEtcd::endpoint).collect::<Vec<_>>().join(",");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = ha_server(&dir.path().join("a"), &endpoints);
    let b = ha_server(&dir.path().join("b"), &endpoints);
    let http = reqwest::Client::new();
    // One candidate of each on each server; the node agent talks to b; users write through a.
    let agent = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["agent", "--server", &b.url, "--simulate-nodes", "2", "--simulated-ready-ms", "20", "--data-dir"])
        .arg(dir.path().join("agent"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start agent");
    let _agent = common::KillOnDrop(agent);
    let cms = [Candidate::start("controller-manager", &a.url, &[]), Candidate::start("controller-manager", &b.url, &[])];
    let _schedulers = [Candidate::start("scheduler", &a.url, &[]), Candidate::start("scheduler", &b.url, &[])];
    let cm_ids: Vec<&str> = cms.iter().map(|c| c.identity.as_str()).collect();
    let leader = wait_for_holder(&http, &b.url, "kube-controller-manager", &cm_ids, Duration::from_secs(60)).await;

    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let (code, body) =
        send(&http, reqwest::Method::POST, &format!("{}/apis/apps/v1/namespaces/default/deployments", a.url), Some(&deploy))
            .await;
    assert_eq!(code, 201, "{body}");
    scale_and_converge(&http, &a.url, &b.url, 3).await;

    // kill -9 the active controller manager: the other takes the Lease within the lease duration
    // (plus a retry and the test's polling) and the next change converges.
    let (mut dead, next): (Vec<Candidate>, Vec<Candidate>) = cms.into_iter().partition(|c| c.identity == leader);
    let killed = Instant::now();
    dead[0].child.kill().expect("kill -9 the leader");
    let _ = dead[0].child.wait();
    wait_for_holder(&http, &b.url, "kube-controller-manager", &[next[0].identity.as_str()], LEASE + Duration::from_secs(6))
        .await;
    eprintln!("the controller manager's Lease was taken over {:?} after the kill", killed.elapsed());
    scale_and_converge(&http, &a.url, &b.url, 5).await;
    // Two candidates again, the new one on b: whichever leads when a dies below, one is left.
    let _standby = Candidate::start("controller-manager", &b.url, &[]);

    // kill -9 one etcd member while a writer goes on: every acknowledged write stays, and writes
    // continue on the two left.
    let writer = {
        let (http, url) = (http.clone(), a.url.clone());
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut i = 0;
            while acknowledged.len() < 60 && Instant::now() < deadline {
                let name = format!("ha-{i}");
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
                let resp = http.post(format!("{url}{CONFIGMAPS}")).json(&cm).send().await;
                match resp.map(|r| r.status().as_u16()) {
                    Ok(201) => acknowledged.push(name),
                    // A write in flight when the member died may have failed or may have landed.
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
                i += 1;
            }
            acknowledged
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed_configmaps(&http, &b.url).await.len() < 20 {
        assert!(Instant::now() < deadline, "the writer wrote 20 ConfigMaps within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    members[0].kill9();
    let acknowledged = writer.await.expect("writer");
    assert_eq!(acknowledged.len(), 60, "writes continue after one member of three is lost: {acknowledged:?}");
    for server in [&a.url, &b.url] {
        let listed = listed_configmaps(&http, server).await;
        let lost: Vec<&String> = acknowledged.iter().filter(|n| !listed.contains(*n)).collect();
        assert!(lost.is_empty(), "acknowledged writes missing from {server}: {lost:?}");
    }
    scale_and_converge(&http, &a.url, &b.url, 4).await;

    // kill -9 API server a: b's clients see everything written through a, and the cluster goes on
    // (the candidates on b take over if those on a led).
    let mut watch = http
        .get(format!("{}{CONFIGMAPS}?watch=true&resourceVersion=0", b.url))
        .send()
        .await
        .expect("watch on b");
    a.kill9();
    let listed = listed_configmaps(&http, &b.url).await;
    assert!(acknowledged.iter().all(|n| listed.contains(n)), "b lists every write made through a");
    let (code, body) =
        send(&http, reqwest::Method::POST, &format!("{}{CONFIGMAPS}", b.url), Some(&json!({"metadata": {"name": "ha-last"}})))
            .await;
    assert_eq!(code, 201, "{body}");
    watch_until(&mut watch, |e| e["object"]["metadata"]["name"] == "ha-last").await;
    scale_and_converge(&http, &b.url, &b.url, 6).await;
    let (code, _) = send(&http, reqwest::Method::GET, &format!("{}/readyz", b.url), None).await;
    assert_eq!(code, 200, "b stays ready");
}
