//! The etcd backend against a real etcd (Debian's etcd-server), started by each test on loopback.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use shepherd_store::{EtcdConfig, EtcdStore, EventKind, HistoryLimits, LocalEtcd, Store, StoreError};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn etcd() -> LocalEtcd {
    LocalEtcd::start().unwrap_or_else(|e| panic!("cannot run the etcd backend's tests: {e}"))
}

async fn store(etcd: &LocalEtcd, prefix: &str) -> EtcdStore {
    EtcdStore::connect(EtcdConfig::new(vec![etcd.endpoint()], prefix)).await.expect("connect to etcd")
}

async fn next_event(w: &mut shepherd_store::WatchStream) -> Arc<shepherd_store::Event> {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("an event within 10 s")
        .expect("the stream is open")
        .expect("not an error")
}

#[tokio::test]
async fn a_stale_revision_is_a_conflict_and_changes_nothing_in_etcd() {
    let etcd = etcd();
    let store = store(&etcd, "/c").await;
    let kv = store.create("/a", b("1")).await.expect("create");
    assert_eq!(kv.create_revision, kv.mod_revision);
    let kv2 = store.update("/a", b("2"), Some(kv.mod_revision)).await.expect("update");
    assert!(kv2.mod_revision > kv.mod_revision);
    assert_eq!(kv2.create_revision, kv.create_revision);
    let err = store.update("/a", b("3"), Some(kv.mod_revision)).await.expect_err("stale update");
    assert_eq!(err, StoreError::Conflict { key: "/a".into(), expected: kv.mod_revision, actual: kv2.mod_revision });
    let err = store.delete("/a", Some(kv.mod_revision)).await.expect_err("stale delete");
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    assert_eq!(store.get("/a").await.expect("get").expect("present").value, b("2"));
    assert_eq!(store.revision().await.expect("revision"), kv2.mod_revision, "rejected writes take no revision");
    let err = store.create("/a", b("x")).await.expect_err("duplicate create");
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    let err = store.update("/missing", b("x"), None).await.expect_err("update missing");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    let err = store.delete("/missing", Some(kv.mod_revision)).await.expect_err("delete missing");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    let gone = store.delete("/a", Some(kv2.mod_revision)).await.expect("delete");
    assert_eq!(gone.value, b("2"), "a delete returns the last value");
    assert!(gone.mod_revision > kv2.mod_revision, "at the revision of the delete");
    assert_eq!(store.get("/a").await.expect("get"), None);
}

#[tokio::test]
async fn etcd_lists_page_by_prefix_in_key_order_and_count_follows_writes() {
    let etcd = etcd();
    let store = store(&etcd, "/l").await;
    for k in ["/p/b", "/p/a", "/p/c", "/q/a", "/o/z"] {
        store.create(k, b(k)).await.expect("create");
    }
    let page = store.list("/p/", None, Some(2)).await.expect("list");
    let keys: Vec<_> = page.items.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/p/a", "/p/b"]);
    assert!(page.more);
    assert_eq!(page.revision, store.revision().await.expect("revision"));
    let rest = store.list("/p/", Some("/p/b"), Some(2)).await.expect("list");
    assert_eq!(rest.items.len(), 1);
    assert!(!rest.more);
    assert_eq!(store.count("/p/").await.expect("count"), 3);
    store.delete("/p/a", None).await.expect("delete");
    assert_eq!(store.count("/p/").await.expect("count"), 2, "the cache has the delete when it returns");
    // Another prefix in the same etcd is another store.
    let other = store_with_objects(&etcd).await;
    assert_eq!(other.count("/").await.expect("count"), 1);
    assert_eq!(store.count("/").await.expect("count"), 4);
}

async fn store_with_objects(etcd: &LocalEtcd) -> EtcdStore {
    let other = store(etcd, "/other").await;
    other.create("/p/x", b("x")).await.expect("create");
    other
}

#[tokio::test]
async fn concurrent_writers_give_a_gapless_history_that_watches_replay() {
    let etcd = etcd();
    let store = store(&etcd, "/w").await;
    let start = store.revision().await.expect("revision");
    let mut all = store.watch("/k/", start).await.expect("watch");
    let mut tasks = Vec::new();
    for client in 0..4u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for i in 0..25u64 {
                let key = format!("/k/{}", (client * 7 + i) % 6);
                let r = match i % 3 {
                    0 => store.create(&key, b("c")).await,
                    1 => {
                        let cur = store.get(&key).await.ok().flatten();
                        store.update(&key, b("u"), cur.map(|c| c.mod_revision)).await
                    }
                    _ => store.delete(&key, None).await,
                };
                ok += r.is_ok() as u64;
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("client");
    }
    let last = store.revision().await.expect("revision");
    assert_eq!(last - start, ok, "every successful write takes exactly one revision");
    let mut events = Vec::new();
    while (events.len() as u64) < ok {
        events.push(next_event(&mut all).await);
    }
    let revisions: Vec<u64> = events.iter().map(|e| e.revision()).collect();
    assert_eq!(revisions, (start + 1..=last).collect::<Vec<_>>(), "in order, no gap, no duplicate");

    let from = start + ok / 2;
    let mut w = store.watch("/k/", from).await.expect("watch from the middle");
    let mut replay = Vec::new();
    while replay.len() < (last - from) as usize {
        replay.push(next_event(&mut w).await.revision());
    }
    assert_eq!(replay, (from + 1..=last).collect::<Vec<_>>());

    let mut model = BTreeMap::new();
    for e in &events {
        match e.kind {
            EventKind::Deleted => {
                model.remove(&e.kv.key);
            }
            _ => {
                model.insert(e.kv.key.clone(), e.kv.clone());
            }
        }
    }
    let listed = store.list("/k/", None, None).await.expect("list");
    assert_eq!(listed.items, model.into_values().collect::<Vec<_>>(), "the history rebuilds what etcd holds");
}

#[tokio::test]
async fn a_list_at_a_past_revision_reads_etcd_as_it_was_until_compacted() {
    let etcd = etcd();
    let store = store(&etcd, "/h").await;
    let mut states = Vec::new();
    for i in 0..12 {
        let key = format!("/k/{}", i % 5);
        let r = match i % 4 {
            3 => store.delete(&key, None).await,
            _ if i >= 5 => store.update(&key, b(&format!("u{i}")), None).await,
            _ => store.create(&key, b(&format!("c{i}"))).await,
        };
        if r.is_ok() {
            states.push((
                store.revision().await.expect("revision"),
                store.list("/k/", None, None).await.expect("list").items,
            ));
        }
    }
    assert!(states.len() >= 8, "most writes succeed: {}", states.len());
    for (at, expected) in &states {
        let mut got = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let p = store.list_at("/k/", after.as_deref(), Some(2), *at).await.expect("list_at");
            assert_eq!(p.revision, *at);
            after = p.items.last().map(|kv| kv.key.clone()).or(after);
            got.extend(p.items);
            if !p.more {
                break;
            }
        }
        assert_eq!(&got, expected, "at revision {at}");
    }
    let (old, _) = states[1];
    store.compact(states[3].0).await.expect("compact");
    match store.list_at("/k/", None, None, old).await {
        Err(StoreError::Expired { requested, .. }) => assert_eq!(requested, old),
        other => panic!("expected Expired, got {other:?}"),
    }
    store.list_at("/k/", None, None, states[3].0).await.expect("the compacted revision itself is still readable");
}

#[tokio::test]
async fn many_watchers_cost_etcd_one_watch() {
    let etcd = etcd();
    let store = store(&etcd, "/m").await;
    let now = store.revision().await.expect("revision");
    let mut watchers = Vec::new();
    for _ in 0..20 {
        watchers.push(store.watch("/", now).await.expect("watch"));
    }
    let kv = store.create("/x", b("1")).await.expect("create");
    for w in &mut watchers {
        assert_eq!(next_event(w).await.revision(), kv.mod_revision);
    }
    assert_eq!(etcd_watches(&etcd), "1", "twenty watchers of the store, one etcd watch");
}

/// etcd's count of the watches open on it.
fn etcd_watches(etcd: &LocalEtcd) -> String {
    let metrics = etcd.metrics().expect("etcd metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .unwrap_or_else(|| panic!("etcd reports its watchers: {metrics}"))
        .trim()
        .to_string()
}

#[tokio::test]
async fn after_a_compaction_lists_and_watches_from_before_it_are_expired() {
    let etcd = etcd();
    let compacting = store(&etcd, "/compacting").await;
    let mut revisions = Vec::new();
    for i in 0..6 {
        revisions.push(compacting.create(&format!("/k/{i}"), b("v")).await.expect("create").mod_revision);
    }
    let at = revisions[2];
    compacting.compact(at).await.expect("compact");
    assert!(matches!(compacting.list_at("/k/", None, None, at - 1).await, Err(StoreError::Expired { .. })));
    match compacting.watch("/k/", at - 1).await {
        Err(StoreError::Expired { .. }) => {}
        other => panic!("expected Expired, got {:?}", other.map(|_| ())),
    }
    let page = compacting.list_at("/k/", None, None, at).await.expect("the compacted revision itself");
    assert_eq!(page.items.len(), 3);
    let mut w = compacting.watch("/k/", at).await.expect("a watch from the compacted revision");
    for r in &revisions[3..] {
        assert_eq!(next_event(&mut w).await.revision(), *r);
    }
    // Another server on the same etcd reads etcd's history: compacted for it too.
    let other = store(&etcd, "/compacting").await;
    assert!(matches!(other.list_at("/k/", None, None, at - 1).await, Err(StoreError::Expired { .. })));
    match compacting.compact(revisions[5] + 100).await {
        Err(StoreError::FutureRevision { requested, .. }) => assert_eq!(requested, revisions[5] + 100),
        other => panic!("expected FutureRevision, got {other:?}"),
    }
}

#[tokio::test]
async fn a_closed_etcd_store_ends_its_watches_refuses_writes_and_stops_watching_etcd() {
    let etcd = etcd();
    let closing = store(&etcd, "/closing").await;
    let mut w = closing.watch("/", closing.revision().await.expect("revision")).await.expect("watch");
    let kv = closing.create("/a", b("1")).await.expect("create");
    assert_eq!(etcd_watches(&etcd), "1", "the store's cache watches etcd");
    closing.close().await.expect("close");

    assert_eq!(next_event(&mut w).await.revision(), kv.mod_revision, "the events before the close");
    let end = tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("the watch ends");
    assert!(matches!(end, Some(Err(StoreError::Closed))), "{end:?}");
    let err = closing.create("/b", b("2")).await.expect_err("a write after close");
    assert!(matches!(err, StoreError::Closed), "{err:?}");
    assert!(matches!(closing.writable(), Err(StoreError::Closed)));
    // etcd counts a watch as gone once its gRPC stream is: give it a moment to notice.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while etcd_watches(&etcd) != "0" {
        assert!(std::time::Instant::now() < deadline, "etcd still has {} watches", etcd_watches(&etcd));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = store(&etcd, "/closing").await;
    assert_eq!(next.get("/a").await.expect("get"), Some(kv), "the next server has the write");
    assert!(next.get("/b").await.expect("get").is_none(), "the refused write is nowhere");
}

#[tokio::test]
async fn two_stores_on_one_etcd_see_each_others_writes_and_conflict_on_stale_ones() {
    let etcd = etcd();
    let a = store(&etcd, "/shared").await;
    let b_store = store(&etcd, "/shared").await;
    let mut watch_b = b_store.watch("/pods/", b_store.revision().await.expect("revision")).await.expect("watch on b");
    let created = a.create("/pods/p", b("v1")).await.expect("create through a");
    let seen = next_event(&mut watch_b).await;
    assert_eq!((seen.kind, seen.kv.clone()), (EventKind::Created, created.clone()), "b's watch shows a's write");
    let updated = b_store.update("/pods/p", b("v2"), Some(created.mod_revision)).await.expect("update through b");
    let err = a.update("/pods/p", b("v3"), Some(created.mod_revision)).await.expect_err("stale through a");
    assert!(matches!(err, StoreError::Conflict { actual, .. } if actual == updated.mod_revision), "{err}");
    // The update through b reached a's cache too.
    let mut watch_a = a.watch("/pods/", created.mod_revision).await.expect("watch on a");
    assert_eq!(next_event(&mut watch_a).await.kv, updated);
}

#[tokio::test]
async fn a_watch_from_before_the_cache_started_is_expired() {
    let etcd = etcd();
    let first = store(&etcd, "/e").await;
    first.create("/a", b("1")).await.expect("create");
    let kv = first.create("/b", b("2")).await.expect("create");
    let late = store(&etcd, "/e").await;
    match late.watch("/", kv.mod_revision - 1).await {
        Err(StoreError::Expired { .. }) => {}
        other => panic!("expected Expired, got {:?}", other.map(|_| ())),
    }
    assert_eq!(late.count("/").await.expect("count"), 2, "the cache starts with every object");
    late.watch("/", kv.mod_revision).await.expect("a watch from the cache's start");
}

#[tokio::test]
async fn the_cache_history_is_bounded_as_the_local_stores_is() {
    let etcd = etcd();
    let mut config = EtcdConfig::new(vec![etcd.endpoint()], "/bounded");
    config.limits = HistoryLimits { max_events: 3, ..HistoryLimits::default() };
    let store = EtcdStore::connect(config).await.expect("connect");
    let mut revs = Vec::new();
    for i in 0..6 {
        revs.push(store.create(&format!("/k{i}"), b("v")).await.expect("create").mod_revision);
    }
    assert!(matches!(store.watch("/", revs[1]).await, Err(StoreError::Expired { .. })));
    let mut w = store.watch("/", revs[2]).await.expect("the oldest retained");
    for r in &revs[3..] {
        assert_eq!(next_event(&mut w).await.revision(), *r);
    }
}

#[tokio::test]
async fn an_unreachable_etcd_is_a_clear_error_after_the_connect_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut config = EtcdConfig::new(vec![endpoint.clone()], "/x");
    config.connect_timeout = Duration::from_secs(2);
    let err = EtcdStore::connect(config).await.err().expect("nothing listens there");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains(&endpoint), "the error names the endpoint: {err}");
}

#[tokio::test]
async fn servers_sharing_an_etcd_compact_its_history_and_old_revisions_then_expire() {
    let etcd = etcd();
    let connect = || {
        let mut config = EtcdConfig::new(vec![etcd.endpoint()], "/compacted");
        config.compaction_interval = Duration::from_millis(200);
        EtcdStore::connect(config)
    };
    let (a, b_store) = (connect().await.expect("connect a"), connect().await.expect("connect b"));
    let first = a.create("/k", b("0")).await.expect("create");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    loop {
        i += 1;
        b_store.update("/k", b(&i.to_string()), None).await.expect("update");
        match a.list_at("/", None, None, first.mod_revision).await {
            Err(StoreError::Expired { requested, .. }) => {
                assert_eq!(requested, first.mod_revision);
                break;
            }
            Ok(_) => {}
            Err(e) => panic!("list_at: {e}"),
        }
        assert!(std::time::Instant::now() < deadline, "etcd was not compacted within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The compaction key's writes move the caches too: their revision reaches what lists report.
    let listed = a.list("/", None, None).await.expect("list");
    assert_eq!(listed.items.len(), 1, "the compaction key is not an object: {:?}", listed.items);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.revision().await.expect("revision") < listed.revision
        || b_store.revision().await.expect("revision") < listed.revision
    {
        assert!(std::time::Instant::now() < deadline, "the caches reach revision {} within 10 s", listed.revision);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Compaction changes nothing current, and both caches go on following.
    let kv = a.update("/k", b("last"), None).await.expect("update");
    assert_eq!(b_store.get("/k").await.expect("get").expect("present"), kv);
    assert!(b_store.revision().await.expect("revision") >= kv.mod_revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_that_was_away_while_etcd_moved_on_catches_up_and_its_watchers_miss_nothing_silently() {
    let mut etcd = etcd();
    let mut config = EtcdConfig::new(vec![etcd.endpoint()], "/away");
    config.compaction_interval = Duration::ZERO;
    let a = EtcdStore::connect(config.clone()).await.expect("connect a");
    a.create("/k/0", b("0")).await.expect("create");
    let mut w = a.watch("/k/", a.revision().await.expect("revision")).await.expect("watch");
    etcd.kill9();
    // Long enough for a's watch to fail and back off for a while.
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let mut etcd = tokio::task::spawn_blocking(move || etcd.restart().map(|()| etcd))
        .await
        .expect("restart task")
        .unwrap_or_else(|e| panic!("restarting etcd: {e}"));
    // Writes and a compaction a did not see happen.
    let other = EtcdStore::connect(config).await.expect("connect b");
    let mut written = Vec::new();
    for i in 1..=5 {
        written.push(other.create(&format!("/k/{i}"), b("v")).await.expect("create").mod_revision);
    }
    let last = *written.last().expect("writes");
    other.compact(last).await.expect("compact");

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while a.count("/k/").await.expect("count") != 6 || a.revision().await.expect("revision") < last {
        assert!(
            std::time::Instant::now() < deadline,
            "a's cache caught up within 30 s: {} at {}",
            a.count("/k/").await.expect("count"),
            a.revision().await.expect("revision")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a.writable().is_ok(), "a reports itself ready again");
    let listed = a.list("/k/", None, None).await.expect("list").items;
    assert_eq!(listed, other.list("/k/", None, None).await.expect("list").items);
    // The watcher either saw every write in order, or is told that it lost its place (a 410 for
    // its client, which then re-lists); never a gap.
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        match tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("an answer within 10 s") {
            Some(Ok(e)) => seen.push(e.revision()),
            Some(Err(StoreError::Lagged)) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    if seen.len() == written.len() {
        assert_eq!(seen, written);
    } else {
        assert!(w.next().await.is_none(), "the stream ends after Lagged");
    }
    etcd.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_on_three_members_goes_on_reading_and_writing_when_the_member_it_uses_dies() {
    let mut members = LocalEtcd::start_cluster(3).unwrap_or_else(|e| panic!("cannot run an etcd cluster: {e}"));
    let endpoints = members.iter().map(LocalEtcd::endpoint).collect();
    let store = EtcdStore::connect(EtcdConfig::new(endpoints, "/members")).await.expect("connect");
    for i in 0..10 {
        store.create(&format!("/k/{i:02}"), b("before")).await.expect("create");
    }
    // The store talks to the first member until it fails.
    members[0].kill9();
    // The survivors may be electing a leader for a moment; after that, nothing fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = store.create("/k/10", b("after")).await {
        assert!(std::time::Instant::now() < deadline, "no write within 30 s of losing a member: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 11..40 {
        let key = format!("/k/{i:02}");
        store.create(&key, b("after")).await.unwrap_or_else(|e| panic!("create {key}: {e}"));
        store.get(&key).await.unwrap_or_else(|e| panic!("get {key}: {e}")).expect("present");
        let listed = store.list("/k/", None, None).await.unwrap_or_else(|e| panic!("list: {e}"));
        assert_eq!(listed.items.len(), i + 1, "every acknowledged write is listed");
    }
    assert_eq!(store.count("/k/").await.expect("count"), 40, "the watch cache follows through the survivors");
}
