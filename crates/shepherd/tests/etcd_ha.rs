//! Two `shepherd server --store etcd` processes on one etcd serve one cluster: a write through one
//! is in the other's watch, a stale write through the other is a conflict, node ports and cluster
//! IPs allocated through both at once never collide, and one server killed leaves the other
//! serving everything.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::Daemon;
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
