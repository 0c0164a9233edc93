//! `kill -9` of a real `shepherd server` in the middle of concurrent writes loses no
//! acknowledged write and leaves nothing half-written.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Daemon;
use serde_json::{Value, json};
use shepherd_store::Store;

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"writer": "durability"}},
        "spec": {"containers": [{"name": "c", "image": "minimal", "args": ["x".repeat(200)]}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No controllers: nothing but the writers may change these pods.
    let mut daemon = Daemon::start("server", dir.path(), &["--controllers", "none"]);
    let url = daemon.url.clone();
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let http = reqwest::Client::new();

    let mut writers = Vec::new();
    for w in 0..16 {
        let (http, url, acked) = (http.clone(), url.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let sent = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod(&name)).send().await;
                match sent {
                    Ok(r) if r.status().as_u16() == 201 => {
                        let body: Value = match r.json().await {
                            Ok(b) => b,
                            Err(_) => break,
                        };
                        let rv = body["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
                        acked.lock().expect("lock").push((name, rv));
                    }
                    Ok(r) => panic!("unexpected status {} before the kill", r.status()),
                    Err(_) => break, // the server is gone
                }
            }
        }));
    }
    // Let the writers get going, then kill the server mid-stream.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    daemon.kill9();
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() > 50, "only {} writes were acknowledged before the kill", acked.len());

    let daemon = Daemon::start("server", dir.path(), &["--controllers", "none"]);
    let list: Value = http
        .get(format!("{}/api/v1/namespaces/default/pods?labelSelector=writer%3Ddurability", daemon.url))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let items = list["items"].as_array().expect("items");
    let stored: std::collections::HashMap<&str, &Value> =
        items.iter().map(|p| (p["metadata"]["name"].as_str().unwrap_or(""), p)).collect();
    for (name, rv) in &acked {
        let p = stored.get(name.as_str()).unwrap_or_else(|| panic!("acknowledged pod {name} is missing after kill -9"));
        assert_eq!(p["metadata"]["resourceVersion"].as_str(), Some(rv.as_str()), "{name} changed");
    }
    // Nothing half-written: every stored object is complete.
    for p in items {
        assert_eq!(p["spec"]["containers"][0]["args"][0].as_str().map(str::len), Some(200), "{p}");
        assert!(p["metadata"]["uid"].is_string());
    }
    eprintln!("{} acknowledged writes, {} stored after kill -9 and restart", acked.len(), items.len());
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly_and_a_second_server_on_the_same_data_dir_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Daemon::start("server", dir.path(), &[]);
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run second");
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("already open"), "{err}");
    let status = first.terminate();
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn after_sigterm_the_store_file_alone_holds_every_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start("server", dir.path(), &["--controllers", "none"]);
    let http = reqwest::Client::new();
    for i in 0..20 {
        let r = http
            .post(format!("{}/api/v1/namespaces/default/pods", daemon.url))
            .json(&pod(&format!("p{i}")))
            .send()
            .await
            .expect("create");
        assert_eq!(r.status().as_u16(), 201);
    }
    let status = daemon.terminate();
    assert!(status.success(), "exit status {status}");

    // The server closed its store on the way out: the file holds the checkpoint of every write, so
    // a copy without the write-ahead log beside it (what the next start would replay) has them all.
    let copy = tempfile::tempdir().expect("tempdir");
    let alone = copy.path().join("store.redb");
    std::fs::copy(dir.path().join("store.redb"), &alone).expect("copy the store file");
    let store = shepherd_store::LocalStore::open_redb(&alone, shepherd_store::HistoryLimits::default()).expect("open");
    let pods = store.list("/registry/core/pods/default/", None, None).await.expect("list").items;
    assert_eq!(pods.len(), 20, "every pod is in the store file");
}
