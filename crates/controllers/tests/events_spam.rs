//! The event recorder under a flood: a burst of 25 writes per object, one more every five
//! minutes, and similar events combined into one, as client-go's recorder behaves. Events are
//! read back from a real in-process API server; time is tokio's paused clock.

#[path = "workloads_support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use shepherd_api::kinds;
use shepherd_controllers::{EventRecorder, EventType};
use shepherd_runtime::{Client, ListParams};
use support::*;

const COMBINED: &str = "(combined from similar events): ";

async fn stored_replicaset(client: &Arc<dyn Client>, name: &str) -> Value {
    client.create(&kinds::REPLICASET, Some("default"), replicaset(name, 10_000, name)).await.expect("replicaset created")
}

/// The Events stored about `object`.
async fn events_about(client: &Arc<dyn Client>, object: &str) -> Vec<Value> {
    let list = client.list(&kinds::EVENT, &ListParams::namespace("default")).await.expect("events listed");
    list.items.into_iter().filter(|e| e["involvedObject"]["name"] == object).collect()
}

/// Writes that reached the API server: one create per Event plus one patch per bump.
fn writes(events: &[Value]) -> i64 {
    events.iter().map(|e| e["count"].as_i64().unwrap_or(0)).sum()
}

fn combined(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["message"].as_str().is_some_and(|m| m.starts_with(COMBINED))).collect()
}

async fn creates(events: &EventRecorder, rs: &Value, pods: std::ops::Range<usize>) {
    for i in pods {
        events.record(rs, EventType::Normal, "SuccessfulCreate", &format!("Created pod: web-{i}")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_hundred_creates_write_at_most_a_burst_with_similar_ones_combined() {
    let client = api().await;
    let rs = stored_replicaset(&client, "web").await;
    let events = EventRecorder::new(client.clone(), "replicaset-controller");
    creates(&events, &rs, 0..100).await;

    let stored = events_about(&client, "web").await;
    assert_eq!(writes(&stored), 25, "the burst, and not one write more");
    // Nine messages keep their own Events; the rest share one.
    assert_eq!(stored.len(), 10);
    let own: Vec<&str> = stored.iter().filter_map(|e| e["message"].as_str()).filter(|m| !m.starts_with(COMBINED)).collect();
    assert_eq!(own.len(), 9);
    assert!(own.iter().all(|m| m.starts_with("Created pod: web-")));
    let combined = combined(&stored);
    assert_eq!(combined.len(), 1);
    assert_eq!(combined[0]["message"], format!("{COMBINED}Created pod: web-24"), "the latest message that got through");
    assert_eq!(combined[0]["count"], 16);
    assert_eq!((combined[0]["reason"].as_str(), combined[0]["type"].as_str()), (Some("SuccessfulCreate"), Some("Normal")));
}

#[tokio::test(start_paused = true)]
async fn five_minutes_later_one_more_event_gets_through() {
    let client = api().await;
    let rs = stored_replicaset(&client, "web").await;
    let events = EventRecorder::new(client.clone(), "replicaset-controller");
    creates(&events, &rs, 0..100).await;
    tokio::time::advance(Duration::from_secs(299)).await;
    creates(&events, &rs, 100..101).await;
    assert_eq!(writes(&events_about(&client, "web").await), 25, "not yet");

    tokio::time::advance(Duration::from_secs(1)).await;
    creates(&events, &rs, 101..110).await;
    let stored = events_about(&client, "web").await;
    assert_eq!(writes(&stored), 26);
    let combined = combined(&stored);
    assert_eq!(combined[0]["message"], format!("{COMBINED}Created pod: web-101"));
    assert_eq!(combined[0]["count"], 17);
}

#[tokio::test(start_paused = true)]
async fn each_object_has_its_own_bucket() {
    let client = api().await;
    let (a, b) = (stored_replicaset(&client, "a").await, stored_replicaset(&client, "b").await);
    let events = EventRecorder::new(client.clone(), "replicaset-controller");
    creates(&events, &a, 0..40).await;
    creates(&events, &b, 0..40).await;
    assert_eq!(writes(&events_about(&client, "a").await), 25);
    assert_eq!(writes(&events_about(&client, "b").await), 25, "a's flood did not use b's tokens");
}

#[tokio::test(start_paused = true)]
async fn identical_repeats_bump_one_event_and_spend_the_same_burst() {
    let client = api().await;
    let rs = stored_replicaset(&client, "web").await;
    let events = EventRecorder::new(client.clone(), "replicaset-controller");
    for _ in 0..30 {
        events.record(&rs, EventType::Warning, "FailedCreate", "quota exceeded").await;
    }
    let stored = events_about(&client, "web").await;
    assert_eq!(stored.len(), 1);
    assert_eq!((stored[0]["message"].as_str(), stored[0]["count"].as_i64()), (Some("quota exceeded"), Some(25)));
}

#[tokio::test(start_paused = true)]
async fn similar_events_get_their_own_again_after_ten_quiet_minutes() {
    let client = api().await;
    let rs = stored_replicaset(&client, "web").await;
    let events = EventRecorder::new(client.clone(), "replicaset-controller");
    creates(&events, &rs, 0..10).await;
    assert_eq!(combined(&events_about(&client, "web").await).len(), 1, "the tenth is combined");

    tokio::time::advance(Duration::from_secs(601)).await;
    creates(&events, &rs, 10..11).await;
    let stored = events_about(&client, "web").await;
    assert!(stored.iter().any(|e| e["message"] == "Created pod: web-10" && e["count"] == 1));
    assert_eq!(combined(&stored)[0]["count"], 1, "the combined Event was left alone");
}
