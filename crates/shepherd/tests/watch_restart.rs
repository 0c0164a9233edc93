//! A watch from a resourceVersion before a `kill -9` of `shepherd server` resumes after the
//! restart without a re-list: every change after that version, exactly once, in order.

mod common;

use std::time::Duration;

use common::Daemon;
use futures::StreamExt;
use serde_json::{Value, json};

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

fn configmap(name: &str, v: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"test": "watch-restart"}}, "data": {"v": v.to_string()}})
}

/// Sends a write and returns the object the server answered with.
async fn write(req: reqwest::RequestBuilder, expect: u16) -> Value {
    let r = req.send().await.expect("request");
    assert_eq!(r.status().as_u16(), expect);
    r.json().await.expect("json")
}

fn rv(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"].as_str().expect("resourceVersion").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_before_a_kill_9_resumes_with_every_later_change_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start("server", dir.path(), &["--controllers", "none"]);
    let http = reqwest::Client::new();
    let url = format!("{}{CONFIGMAPS}", daemon.url);

    for i in 0..10 {
        write(http.post(&url).json(&configmap(&format!("before-{i}"), 0)), 201).await;
    }
    let from = rv(&write(http.post(&url).json(&configmap("mark", 0)), 201).await);
    // Every change after `from`, as a watcher must see it: (type, name, resourceVersion).
    let mut expected = Vec::new();
    for i in 0..40 {
        let name = format!("after-{i}");
        let created = write(http.post(&url).json(&configmap(&name, 0)), 201).await;
        expected.push(("ADDED".to_string(), name.clone(), rv(&created)));
        if i % 3 == 0 {
            let mut changed = configmap(&name, 1);
            changed["metadata"]["resourceVersion"] = json!(rv(&created));
            let updated = write(http.put(format!("{url}/{name}")).json(&changed), 200).await;
            expected.push(("MODIFIED".to_string(), name.clone(), rv(&updated)));
        }
        if i % 5 == 0 {
            let deleted = write(http.delete(format!("{url}/before-{}", i / 5)), 200).await;
            let gone = deleted["metadata"]["resourceVersion"].as_str().map(str::to_string);
            expected.push(("DELETED".to_string(), format!("before-{}", i / 5), gone.unwrap_or_default()));
        }
    }
    // Killed right after the last acknowledgement: the newest writes are only in the log.
    daemon.kill9();

    let daemon = Daemon::start("server", dir.path(), &["--controllers", "none"]);
    let url = format!("{}{CONFIGMAPS}", daemon.url);
    let watch = http
        .get(format!("{url}?watch=1&resourceVersion={from}&labelSelector=test%3Dwatch-restart"))
        .send()
        .await
        .expect("watch");
    assert_eq!(watch.status().as_u16(), 200, "a resourceVersion from before the kill is still watchable");
    let sentinel = rv(&write(http.post(&url).json(&configmap("after-restart", 0)), 201).await);
    expected.push(("ADDED".to_string(), "after-restart".to_string(), sentinel));

    let mut seen = Vec::new();
    let mut body = watch.bytes_stream();
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.last().is_none_or(|(_, n, _): &(String, String, String)| n != "after-restart") {
        let chunk = tokio::time::timeout_at(deadline, body.next()).await.expect("the watch went quiet");
        buf.extend_from_slice(&chunk.expect("stream open").expect("chunk"));
        while let Some(end) = buf.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let e: Value = serde_json::from_slice(&line).expect("event json");
            let kind = e["type"].as_str().unwrap_or("").to_string();
            assert_ne!(kind, "ERROR", "the watch failed: {e}");
            seen.push((kind, e["object"]["metadata"]["name"].as_str().unwrap_or("").to_string(), rv(&e["object"])));
        }
    }
    // A DELETED event carries the deletion's resourceVersion, which the DELETE reply may not.
    for (s, e) in seen.iter().zip(&expected) {
        if e.0 == "DELETED" && e.2.is_empty() {
            assert_eq!((&s.0, &s.1), (&e.0, &e.1));
        }
    }
    let strip = |v: &[(String, String, String)]| -> Vec<(String, String)> {
        v.iter().map(|(k, n, _)| (k.clone(), n.clone())).collect()
    };
    assert_eq!(strip(&seen), strip(&expected), "every change after {from}, exactly once, in order");
    for (s, e) in seen.iter().zip(&expected) {
        if !e.2.is_empty() && e.0 != "DELETED" {
            assert_eq!(s.2, e.2, "{} {}", s.0, s.1);
        }
    }
}
