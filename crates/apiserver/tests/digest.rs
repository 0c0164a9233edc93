//! List digests over HTTP: what a list holds as (key, resourceVersion) pairs, at a past revision,
//! without bodies; the anti-entropy check of informers rests on them.

mod common;

use common::*;
use serde_json::{Value, json};
use shepherd_api::digest::{DigestDetail, ListDigest, SetDigest, bucket_of, hex};
use shepherd_apiserver::HttpConfig;
use shepherd_store::HistoryLimits;

fn labelled(name: &str, app: &str) -> Value {
    let mut p = pod(name);
    p["metadata"]["labels"] = json!({ "app": app });
    p
}

async fn digest(s: &Server, query: &str) -> ListDigest {
    let r = s.get(&format!("{PODS}?{query}")).await;
    assert_eq!(r.code, 200, "{query}: {}", r.body);
    assert_eq!(r.body["kind"], "ListDigest");
    serde_json::from_value(r.body).expect("a ListDigest")
}

/// The digest a client computes from a list it read.
async fn digest_of_list(s: &Server, query: &str) -> (u64, SetDigest) {
    let r = s.get(&format!("{PODS}?{query}")).await;
    assert_eq!(r.code, 200);
    let mut d = SetDigest::default();
    for item in r.body["items"].as_array().expect("items") {
        let key = format!("default/{}", item["metadata"]["name"].as_str().expect("name"));
        d.insert(&key, item["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("rv"));
    }
    (r.body["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("list rv"), d)
}

#[tokio::test]
async fn a_digest_at_a_past_revision_still_describes_the_list_of_that_revision() {
    let s = start().await;
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "web"), ("x", "db")] {
        s.create(PODS, &labelled(name, app)).await;
    }
    let (then, all_then) = digest_of_list(&s, "").await;
    let (_, web_then) = digest_of_list(&s, "labelSelector=app%3Dweb").await;
    let now = digest(&s, "digest=total").await;
    assert_eq!((now.count, now.digest.clone()), (4, hex(all_then.sum())), "the current digest is the list's");

    // Change the set every way there is: update, delete, create, and leave the label scope.
    s.patch(&format!("{PODS}/b"), &json!({"metadata": {"annotations": {"n": "1"}}}), MERGE).await;
    s.delete(&format!("{PODS}/c")).await;
    s.create(PODS, &labelled("d", "web")).await;
    s.patch(&format!("{PODS}/a"), &json!({"metadata": {"labels": {"app": "db"}}}), MERGE).await;

    let past = digest(&s, &format!("digest=total&resourceVersion={then}")).await;
    assert_eq!((past.count, past.digest, past.resource_version), (4, hex(all_then.sum()), then.to_string()));
    let past_web = digest(&s, &format!("digest=buckets&labelSelector=app%3Dweb&resourceVersion={then}")).await;
    assert_eq!((past_web.count, past_web.digest.clone()), (3, hex(web_then.sum())), "a selector applies as of then");
    let expected: Vec<String> = web_then.buckets().iter().map(|b| hex(*b)).collect();
    assert_eq!(past_web.buckets, expected);

    let (_, web_now) = digest_of_list(&s, "labelSelector=app%3Dweb").await;
    let current_web = digest(&s, "digest=total&labelSelector=app%3Dweb").await;
    assert_eq!((current_web.count, current_web.digest), (2, hex(web_now.sum())), "b and d are web now");
}

#[tokio::test]
async fn one_bucket_lists_its_keys_and_versions_as_of_the_revision_asked() {
    let s = start().await;
    let names: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    for n in &names {
        s.create(PODS, &pod(n)).await;
    }
    let (then, _) = digest_of_list(&s, "").await;
    let key = "default/p7";
    let bucket = bucket_of(key);
    let before = digest(&s, &format!("digest={bucket}")).await;
    let rv_then = before.items.iter().find(|i| i.key == key).expect("p7 listed in its bucket").resource_version.clone();
    assert!(before.items.iter().all(|i| bucket_of(&i.key) == bucket), "only that bucket's keys");
    assert!(before.items.windows(2).all(|w| w[0].key < w[1].key), "in key order");

    s.delete(&format!("{PODS}/p7")).await;
    let now = digest(&s, &format!("digest={bucket}")).await;
    assert!(now.items.iter().all(|i| i.key != key), "gone now");
    let past = digest(&s, &format!("digest={bucket}&resourceVersion={then}")).await;
    assert_eq!(past.items, before.items, "and there as of then, at {rv_then}");
    assert_eq!(past.bucket, Some(bucket));
}

#[tokio::test]
async fn a_revision_older_than_the_history_is_gone_and_a_bad_bucket_is_a_bad_request() {
    let limits = HistoryLimits { max_events: 5, ..HistoryLimits::default() };
    let s = start_on(limits, HttpConfig::default(), axum::Router::new()).await;
    s.create(PODS, &pod("first")).await;
    let (then, _) = digest_of_list(&s, "").await;
    for i in 0..10 {
        s.create(PODS, &pod(&format!("later-{i}"))).await;
    }
    let r = s.get(&format!("{PODS}?digest=total&resourceVersion={then}")).await;
    assert_eq!(r.code, 410, "{}", r.body);
    assert_eq!(r.body["reason"], "Expired");

    for bad in ["256", "-1", "everything"] {
        let r = s.get(&format!("{PODS}?digest={bad}")).await;
        assert_eq!(r.code, 400, "digest={bad}: {}", r.body);
        assert!(r.body["message"].as_str().unwrap_or("").contains("bucket number from 0 to 255"), "{}", r.body);
    }
    assert_eq!(DigestDetail::parse("buckets"), Ok(DigestDetail::Buckets));
}
