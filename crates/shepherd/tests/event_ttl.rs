//! Events expire `--event-ttl` after their last update, as kube-apiserver's do.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

const EVENTS: &str = "/api/v1/namespaces/default/events";

fn event(name: &str, last: Option<String>) -> Value {
    let mut e = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "p"},
        "reason": "Tested", "message": "an event", "type": "Normal", "count": 1});
    if let Some(t) = last {
        e["lastTimestamp"] = json!(t);
    }
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_older_than_the_event_ttl_is_deleted_and_a_recent_one_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("server", dir.path(), &["--in-memory", "--event-ttl", "3s"]);
    let http = reqwest::Client::new();
    let url = &daemon.url;
    let later = (jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)).strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    for e in [event("old", None), event("bumped-later", Some(later))] {
        let r = http.post(format!("{url}{EVENTS}")).json(&e).send().await.expect("create");
        assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap_or_default());
    }
    let created = Instant::now();
    let deadline = created + Duration::from_secs(60);
    loop {
        let r = http.get(format!("{url}{EVENTS}/old")).send().await.expect("get");
        if r.status().as_u16() == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "the event outlived its TTL by far");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone_after = created.elapsed();
    eprintln!("event with a 3 s TTL deleted after {gone_after:?}");
    // Timestamps have whole seconds, so an Event may go up to a second before its exact TTL.
    assert!(gone_after >= Duration::from_secs(2), "deleted before its TTL: {gone_after:?}");
    let r = http.get(format!("{url}{EVENTS}/bumped-later")).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 200, "an event updated within the TTL is kept");
}
