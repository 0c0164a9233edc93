//! Behaviour of both backends, checked the same way.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use proptest::prelude::*;
use shepherd_store::{EventKind, HistoryLimits, LocalStore, PackedKeyValue, Store, StoreError};

fn backends() -> Vec<(&'static str, LocalStore, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let redb = LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("open");
    let old_dir = tempfile::tempdir().expect("tempdir");
    let redb_only = LocalStore::open_redb_only(&old_dir.path().join("s.redb"), HistoryLimits::default()).expect("open");
    vec![
        ("memory", LocalStore::in_memory(HistoryLimits::default()), None),
        ("redb", redb, Some(dir)),
        ("redb-only", redb_only, Some(old_dir)),
    ]
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[tokio::test]
async fn stale_revision_is_a_conflict_and_changes_nothing() {
    for (name, store, _dir) in backends() {
        let kv = store.create("/a", b("1")).await.expect("create");
        let kv2 = store.update("/a", b("2"), Some(kv.mod_revision)).await.expect("update");
        assert!(kv2.mod_revision > kv.mod_revision, "{name}");
        assert_eq!(kv2.create_revision, kv.create_revision);
        let err = store.update("/a", b("3"), Some(kv.mod_revision)).await.expect_err("stale update");
        assert!(matches!(err, StoreError::Conflict { .. }), "{name}: {err}");
        let err = store.delete("/a", Some(kv.mod_revision)).await.expect_err("stale delete");
        assert!(matches!(err, StoreError::Conflict { .. }), "{name}: {err}");
        assert_eq!(store.get("/a").await.expect("get").expect("present").value, b("2"));
        assert_eq!(
            store.revision().await.expect("revision"),
            kv2.mod_revision,
            "{name}: rejected writes take no revision"
        );
        let err = store.create("/a", b("x")).await.expect_err("duplicate create");
        assert!(matches!(err, StoreError::AlreadyExists { .. }), "{name}");
        let err = store.update("/missing", b("x"), None).await.expect_err("update missing");
        assert!(matches!(err, StoreError::NotFound { .. }), "{name}");
    }
}

#[tokio::test]
async fn list_pages_by_prefix_in_key_order() {
    for (name, store, _dir) in backends() {
        for k in ["/p/b", "/p/a", "/p/c", "/q/a", "/o/z"] {
            store.create(k, b(k)).await.expect("create");
        }
        let page = store.list("/p/", None, Some(2)).await.expect("list");
        let keys: Vec<_> = page.items.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["/p/a", "/p/b"], "{name}");
        assert!(page.more);
        assert_eq!(page.revision, store.revision().await.expect("revision"));
        let rest = store.list("/p/", Some("/p/b"), Some(2)).await.expect("list");
        assert_eq!(rest.items.len(), 1);
        assert!(!rest.more, "{name}");
        assert_eq!(store.count("/p/").await.expect("count"), 3);
    }
}

/// The next item of `w` within 5 s (a watch that should end or answer never hangs the test).
async fn next_item(w: &mut shepherd_store::WatchStream) -> Option<Result<Arc<shepherd_store::Event>, StoreError>> {
    tokio::time::timeout(Duration::from_secs(5), w.next()).await.expect("the watch answers within 5 s")
}

#[tokio::test]
async fn after_compaction_lists_and_watches_from_before_it_are_expired_and_from_it_still_work() {
    for (name, store, _dir) in backends() {
        let mut revisions = Vec::new();
        for i in 0..10 {
            let key = format!("/k/{}", i % 4);
            let kv = match store.get(&key).await.expect("get") {
                Some(kv) => store.update(&key, b(&format!("v{i}")), Some(kv.mod_revision)).await,
                None => store.create(&key, b(&format!("v{i}"))).await,
            };
            revisions.push(kv.expect("write").mod_revision);
        }
        let at = revisions[4];
        let then = store.list_at("/k/", None, None, at).await.expect("a list at the revision to compact to");
        let older = store.list_at("/k/", None, None, at - 1).await.expect("a list before it, not yet compacted");
        assert_ne!(older.items, then.items, "{name}: the two revisions hold different values");

        store.compact(at).await.expect("compact");
        match store.list_at("/k/", None, None, at - 1).await {
            Err(StoreError::Expired { requested, oldest }) => assert_eq!((requested, oldest), (at - 1, at), "{name}"),
            other => panic!("{name}: expected Expired, got {other:?}"),
        }
        match store.watch("/k/", at - 1).await {
            Err(StoreError::Expired { .. }) => {}
            other => panic!("{name}: expected Expired, got {:?}", other.map(|_| ())),
        }
        let page = store.list_at("/k/", None, None, at).await.expect("the compacted revision itself");
        assert_eq!(page.items, then.items, "{name}");
        let mut w = store.watch("/k/", at).await.expect("a watch from the compacted revision");
        for r in &revisions[5..] {
            assert_eq!(next_item(&mut w).await.expect("an event").expect("not an error").revision(), *r, "{name}");
        }
        let now = store.revision().await.expect("revision");
        match store.compact(now + 1).await {
            Err(StoreError::FutureRevision { requested, current }) => assert_eq!((requested, current), (now + 1, now)),
            other => panic!("{name}: expected FutureRevision, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_watch_open_at_close_gets_every_event_before_it_then_ends_with_closed() {
    for (name, store, _dir) in backends() {
        let mut w = store.watch("/", 0).await.expect("watch");
        let kv = store.create("/a", b("1")).await.expect("create");
        store.close().await.expect("close");
        let e = next_item(&mut w).await.expect("the event written before the close").expect("not an error");
        assert_eq!(e.revision(), kv.mod_revision, "{name}");
        assert!(matches!(next_item(&mut w).await, Some(Err(StoreError::Closed))), "{name}");
        assert!(next_item(&mut w).await.is_none(), "{name}: nothing after Closed");
        assert!(matches!(store.watch("/", kv.mod_revision).await, Err(StoreError::Closed)), "{name}");

        let err = store.create("/b", b("2")).await.expect_err("a write after close");
        assert!(matches!(err, StoreError::Closed), "{name}: {err:?}");
        assert!(err.to_string().contains("closed"), "{name}: the error says why: {err}");
        assert!(matches!(store.writable(), Err(StoreError::Closed)), "{name}: readiness reports it");
        assert_eq!(store.get("/a").await.expect("reads still answer"), Some(kv), "{name}");
        store.close().await.expect("closing twice is fine");
    }
}

/// Writes racing `close` are either acknowledged, and then on disk, or refused with `Closed`;
/// and the file is free for the next open as soon as `close` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_acknowledged_before_close_are_there_after_reopening() {
    for redb_only in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.redb");
        let open = |path: &std::path::Path| match redb_only {
            false => LocalStore::open_redb(path, HistoryLimits::default()),
            true => LocalStore::open_redb_only(path, HistoryLimits::default()),
        };
        let store = open(&path).expect("open");
        for i in 0..10 {
            store.create(&format!("/k/{i:03}"), b("v")).await.expect("create");
        }
        let writers: Vec<_> = (10..200)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { (i, store.create(&format!("/k/{i:03}"), b("v")).await) })
            })
            .collect();
        store.close().await.expect("close");
        let mut acknowledged = (0..10).map(|i| format!("/k/{i:03}")).collect::<Vec<_>>();
        for w in writers {
            match w.await.expect("writer") {
                (i, Ok(kv)) => {
                    assert_eq!(kv.key, format!("/k/{i:03}"));
                    acknowledged.push(kv.key);
                }
                (_, Err(StoreError::Closed)) => {}
                (i, Err(e)) => panic!("redb_only={redb_only}: write {i} failed otherwise: {e}"),
            }
        }
        acknowledged.sort();
        let err = store.create("/late", b("v")).await.expect_err("a write after close");
        assert!(matches!(err, StoreError::Closed), "{err:?}");

        let reopened = open(&path).expect("the file is free as soon as close returns");
        let keys: Vec<String> =
            reopened.list("/", None, None).await.expect("list").items.into_iter().map(|kv| kv.key).collect();
        assert_eq!(keys, acknowledged, "redb_only={redb_only}: exactly the acknowledged writes");
        reopened.close().await.expect("close");
    }
}

#[tokio::test]
async fn watch_older_than_history_is_expired() {
    let limits = HistoryLimits { max_events: 3, ..HistoryLimits::default() };
    let store = LocalStore::in_memory(limits);
    for i in 0..10 {
        store.create(&format!("/k{i}"), b("v")).await.expect("create");
    }
    match store.watch("/", 2).await {
        Err(StoreError::Expired { requested: 2, oldest }) => assert_eq!(oldest, 7),
        other => panic!("expected Expired, got {:?}", other.map(|_| ())),
    }
    let mut w = store.watch("/", 7).await.expect("watch from the oldest retained");
    let revs: Vec<u64> = (0..3).map(|_| 0).collect::<Vec<_>>();
    let mut got = Vec::new();
    for _ in revs {
        got.push(w.next().await.expect("event").expect("ok").revision());
    }
    assert_eq!(got, [8, 9, 10]);
}

#[tokio::test]
async fn history_is_bounded_by_the_bytes_of_its_objects() {
    // Ten writes of 100 bytes each into a history of 350 bytes: the last three remain.
    let limits = HistoryLimits { max_bytes: 350, ..HistoryLimits::default() };
    let store = LocalStore::in_memory(limits);
    for i in 0..10 {
        store.create(&format!("/k{i}"), Bytes::from(vec![b'x'; 100])).await.expect("create");
    }
    match store.watch("/", 6).await {
        Err(StoreError::Expired { requested: 6, oldest }) => assert_eq!(oldest, 7),
        other => panic!("expected Expired, got {:?}", other.map(|_| ())),
    }
    let mut w = store.watch("/", 7).await.expect("watch from the oldest retained");
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(w.next().await.expect("event").expect("ok").revision());
    }
    assert_eq!(got, [8, 9, 10]);
    // One object larger than the whole budget is still watchable.
    store.create("/big", Bytes::from(vec![b'x'; 1000])).await.expect("create big");
    let mut w = store.watch("/", 10).await.expect("watch from before the big write");
    assert_eq!(w.next().await.expect("event").expect("ok").revision(), 11);
}

#[tokio::test]
async fn a_watcher_that_falls_behind_is_dropped_and_writers_go_on() {
    // The watcher falls 20 events behind a live buffer of 4 and a history of 8: it cannot resume.
    let limits = HistoryLimits { watcher_buffer: 4, max_events: 8, ..HistoryLimits::default() };
    let store = LocalStore::in_memory(limits);
    let mut w = store.watch("/", 0).await.expect("watch");
    for i in 0..20 {
        store.create(&format!("/k{i}"), b("v")).await.expect("writers are never blocked by a watcher");
    }
    let mut saw_lagged = false;
    while let Some(e) = w.next().await {
        if let Err(StoreError::Lagged) = e {
            saw_lagged = true;
            break;
        }
    }
    assert!(saw_lagged);
    assert!(w.next().await.is_none(), "the stream ends after Lagged");
}

#[tokio::test]
async fn writes_under_other_prefixes_do_not_push_a_watcher_out_of_its_live_buffer() {
    // A live buffer of 4 and a history of 8: 20 writes under /b/ would drop a watcher of /a/ that
    // shared one buffer with them, past what the history could give back.
    let limits = HistoryLimits { watcher_buffer: 4, max_events: 8, ..HistoryLimits::default() };
    let store = LocalStore::in_memory(limits);
    let mut a = store.watch("/a/", 0).await.expect("watch /a/");
    let mut b_watch = store.watch("/b/", 0).await.expect("watch /b/");
    assert_eq!(store.retention().expect("retention").live_watchers, 2);
    for i in 0..20 {
        store.create(&format!("/b/k{i}"), b("v")).await.expect("create");
    }
    store.create("/a/one", b("v")).await.expect("create");
    let e = a.next().await.expect("an event").expect("not lagged: nothing under /a/ was missed");
    assert_eq!((e.kv.key.as_str(), e.revision()), ("/a/one", 21));
    // The /b/ watcher fell 20 behind its own buffer of 4 and the history holds 8: it lags.
    let mut lagged = false;
    while let Some(e) = b_watch.next().await {
        if let Err(StoreError::Lagged) = e {
            lagged = true;
            break;
        }
    }
    assert!(lagged);
    drop((a, b_watch));
    store.create("/a/two", b("v")).await.expect("create");
    assert_eq!(store.retention().expect("retention").live_watchers, 0, "dropped watchers are not followed");
}

#[tokio::test]
async fn a_watcher_behind_its_live_buffer_resumes_from_the_history_without_a_gap() {
    let limits = HistoryLimits { watcher_buffer: 4, ..HistoryLimits::default() };
    let store = LocalStore::in_memory(limits);
    let mut w = store.watch("/a/", 0).await.expect("watch");
    for i in 0..50 {
        store.create(&format!("/a/k{i}"), b("v")).await.expect("create");
        store.create(&format!("/b/k{i}"), b("v")).await.expect("create");
    }
    let mut revisions = Vec::new();
    for _ in 0..50 {
        let e = w.next().await.expect("an event").expect("not lagged: the history has it");
        assert!(e.kv.key.starts_with("/a/"), "only the watched prefix: {}", e.kv.key);
        revisions.push(e.revision());
    }
    // Every other revision is under /a/: 1, 3, 5, ..., 99, in order and none missing.
    assert_eq!(revisions, (0..50).map(|i| 2 * i + 1).collect::<Vec<u64>>());
    store.create("/a/late", b("v")).await.expect("create");
    assert_eq!(w.next().await.expect("live again").expect("ok").kv.key, "/a/late");
}

#[tokio::test]
async fn a_watch_of_a_quiet_prefix_dropped_under_writes_elsewhere_resumes_from_what_it_last_received() {
    // The authorizer's watch of the RBAC objects: nothing under its prefix for a long time while
    // pods are written at a high rate, read now and then, and sometimes too late for the live
    // buffer. It resumes from the history after the last write it received, not after the last
    // RBAC object (long gone from a history of 30 writes), so it neither ends nor misses a write.
    let limits = HistoryLimits { watcher_buffer: 10, max_events: 30, ..HistoryLimits::default() };
    let store = LocalStore::in_memory(limits);
    store.create("/rbac/r0", b("v")).await.expect("create");
    let mut w = store.watch("/rbac/", 1).await.expect("watch");
    let mut written = 0;
    for _ in 0..10 {
        for _ in 0..8 {
            store.create(&format!("/pods/p{written}"), b("v")).await.expect("create");
            written += 1;
        }
        let nothing = tokio::time::timeout(Duration::from_millis(20), w.next()).await;
        assert!(nothing.is_err(), "no event under /rbac/ yet");
    }
    // More writes than the live buffer holds (10, rounded up to 16) before the watcher looks again.
    for _ in 0..25 {
        store.create(&format!("/pods/p{written}"), b("v")).await.expect("create");
        written += 1;
    }
    store.create("/rbac/r1", b("v")).await.expect("create");
    let e = w.next().await.expect("an event").expect("resumed from the history, not Lagged");
    assert_eq!((e.kv.key.as_str(), e.revision()), ("/rbac/r1", 107));
}

#[tokio::test]
async fn redb_store_keeps_every_write_across_reopen_and_refuses_a_second_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let rev;
    {
        let store = LocalStore::open_redb(&path, HistoryLimits::default()).expect("open");
        store.create("/a", b("1")).await.expect("create");
        let kv = store.create("/b", b("2")).await.expect("create");
        store.delete("/a", None).await.expect("delete");
        rev = store.revision().await.expect("revision");
        assert!(rev > kv.mod_revision);
        let second = LocalStore::open_redb(&path, HistoryLimits::default());
        let err = second.err().expect("second open must fail");
        assert!(err.to_string().contains("already open"), "{err}");
    }
    // The committer thread holds the database until its channel closes; give it a moment.
    let mut reopened = None;
    for _ in 0..50 {
        match LocalStore::open_redb(&path, HistoryLimits::default()) {
            Ok(s) => {
                reopened = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let store = reopened.expect("reopen");
    assert_eq!(store.revision().await.expect("revision"), rev);
    assert!(store.get("/a").await.expect("get").is_none());
    let bkv = store.get("/b").await.expect("get").expect("present");
    assert_eq!(bkv.value, b("2"));
    let next = store.create("/c", b("3")).await.expect("create");
    assert_eq!(next.mod_revision, rev + 1, "revisions continue after a restart");
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Update(u8),
    Delete(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![(0u8..8).prop_map(Op::Create), (0u8..8).prop_map(Op::Update), (0u8..8).prop_map(Op::Delete)]
}

async fn run_concurrently(store: &LocalStore, clients: Vec<Vec<Op>>) -> usize {
    let store = Arc::new(store.clone());
    let mut tasks = Vec::new();
    for ops in clients {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for op in ops {
                let r = match op {
                    Op::Create(k) => store.create(&format!("/k/{k}"), b("c")).await,
                    Op::Update(k) => {
                        let cur = store.get(&format!("/k/{k}")).await.ok().flatten();
                        store.update(&format!("/k/{k}"), b("u"), cur.map(|c| c.mod_revision)).await
                    }
                    Op::Delete(k) => store.delete(&format!("/k/{k}"), None).await,
                };
                ok += r.is_ok() as usize;
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("client task");
    }
    ok
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Concurrent writers produce one strictly increasing history without holes, and a watch from
    /// any retained revision replays exactly the writes after it, which rebuild the final state.
    #[test]
    fn concurrent_writes_give_a_gapless_history_that_watches_replay(
        clients in proptest::collection::vec(proptest::collection::vec(op(), 1..20), 1..5),
        from_frac in 0.0f64..1.0,
        durable in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = if durable {
                LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("open")
            } else {
                LocalStore::in_memory(HistoryLimits::default())
            };
            let mut all = store.watch("/k/", 0).await.expect("watch");
            let ok = run_concurrently(&store, clients).await;
            let last = store.revision().await.expect("revision");
            prop_assert_eq!(last as usize, ok, "every successful write takes exactly one revision");

            let mut events = Vec::new();
            while events.len() < ok {
                let e = tokio::time::timeout(Duration::from_secs(5), all.next()).await
                    .expect("event in time").expect("open").expect("ok");
                events.push(e);
            }
            for (i, e) in events.iter().enumerate() {
                prop_assert_eq!(e.revision(), i as u64 + 1, "strictly increasing, no gap, no duplicate");
            }

            // Replaying from a middle revision yields exactly the suffix.
            let from = (last as f64 * from_frac) as u64;
            let mut w = store.watch("/k/", from).await.expect("watch from retained revision");
            let mut replay = Vec::new();
            while (replay.len() as u64) < last - from {
                replay.push(w.next().await.expect("open").expect("ok"));
            }
            prop_assert_eq!(replay.iter().map(|e| e.revision()).collect::<Vec<_>>(), (from + 1..=last).collect::<Vec<_>>());

            // Applying the full history rebuilds the store's final contents.
            let mut model = std::collections::BTreeMap::new();
            for e in &events {
                match e.kind {
                    EventKind::Deleted => { model.remove(&e.kv.key); }
                    _ => { model.insert(e.kv.key.clone(), e.kv.clone()); }
                }
            }
            let listed = store.list("/k/", None, None).await.expect("list");
            prop_assert_eq!(listed.items, model.into_values().collect::<Vec<_>>());
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A list at a past revision, page by page, is exactly the state the store held then, however
    /// the keys changed since.
    #[test]
    fn a_list_at_a_past_revision_is_the_state_at_that_revision(
        ops in proptest::collection::vec(op(), 1..60),
        at_frac in 0.0f64..1.0,
        page in 1usize..5,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async {
            let store = LocalStore::in_memory(HistoryLimits::default());
            store.create("/j/outside", b("x")).await.expect("create");
            let mut states = vec![(store.revision().await.expect("revision"), Vec::new())];
            for (i, op) in ops.iter().enumerate() {
                let r = match op {
                    Op::Create(k) => store.create(&format!("/k/{k}"), b(&format!("c{i}"))).await,
                    Op::Update(k) => store.update(&format!("/k/{k}"), b(&format!("u{i}")), None).await,
                    Op::Delete(k) => store.delete(&format!("/k/{k}"), None).await,
                };
                if r.is_ok() {
                    let now = store.list("/k/", None, None).await.expect("list").items;
                    states.push((store.revision().await.expect("revision"), now));
                }
            }
            let (at, expected) = &states[((states.len() - 1) as f64 * at_frac) as usize];
            let mut got = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let p = store.list_at("/k/", after.as_deref(), Some(page), *at).await.expect("list_at");
                prop_assert_eq!(p.revision, *at);
                prop_assert!(p.items.len() <= page);
                after = p.items.last().map(|kv| kv.key.clone()).or(after);
                got.extend(p.items);
                if !p.more {
                    break;
                }
            }
            prop_assert_eq!(&got, expected);
            let packed = store.list_packed("/k/", None, None, Some(*at)).await.expect("list_packed");
            prop_assert_eq!(packed.revision, *at);
            prop_assert_eq!(&packed.items.iter().map(PackedKeyValue::unpack).collect::<Vec<_>>(), expected);
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn a_list_at_a_revision_older_than_the_history_is_expired() {
    let store = LocalStore::in_memory(HistoryLimits { max_events: 3, ..HistoryLimits::default() });
    for i in 0..10 {
        store.create(&format!("/k{i}"), b("v")).await.expect("create");
    }
    match store.list_at("/", None, None, 2).await {
        Err(StoreError::Expired { requested: 2, oldest: 7 }) => {}
        other => panic!("expected Expired, got {other:?}"),
    }
    let at7 = store.list_at("/", None, None, 7).await.expect("oldest retained");
    assert_eq!(at7.items.len(), 7);
}

/// A pod-like JSON document of about 2 KB: mostly the same for every `i`, as the pods of one
/// Deployment are.
fn pod_doc(i: usize, generation: usize) -> Bytes {
    let managed: String = (0..20).map(|f| format!(r#"{{"f:spec":{{"f:field{f}":{{}}}},"manager":"m{}"}},"#, f % 3)).collect();
    Bytes::from(format!(
        r#"{{"metadata":{{"name":"web-{i}","uid":"{:032x}","generation":{generation},"managedFields":[{managed}{{}}]}},"spec":{{"nodeName":"node-{}"}}}}"#,
        i * 7919,
        i % 13
    ))
}

/// Objects are held compressed, and every read gives them back as written: gets and lists, lists
/// at past revisions, and the values before each write that watches replay, whether the write is
/// recent or long out of the in-memory history, and after the store is reopened from its file.
#[tokio::test]
async fn objects_are_held_compressed_and_read_back_exactly_as_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let small_memory = HistoryLimits { memory_bytes: 1024, ..HistoryLimits::default() };
    let stores = [
        ("memory, 50 events of history", LocalStore::in_memory(HistoryLimits { max_events: 50, ..HistoryLimits::default() })),
        ("redb, 1 KiB of history in memory", LocalStore::open_redb(&path, small_memory).expect("open")),
    ];
    for (name, store) in stores {
        let mut model = std::collections::BTreeMap::new();
        for i in 0..400 {
            let key = format!("/registry/pods/ns/web-{i:03}");
            store.create(&key, pod_doc(i, 1)).await.expect("create");
            model.insert(key, pod_doc(i, 1));
        }
        let at = store.revision().await.expect("revision");
        let then = model.clone();
        for i in (0..400).step_by(3) {
            let key = format!("/registry/pods/ns/web-{i:03}");
            store.update(&key, pod_doc(i, 2), None).await.expect("update");
            model.insert(key, pod_doc(i, 2));
        }
        for i in (1..400).step_by(7) {
            let key = format!("/registry/pods/ns/web-{i:03}");
            store.delete(&key, None).await.expect("delete");
            model.remove(&key);
        }
        // `all_packed`: no write is recent enough to be held as written too (the embedded store
        // keeps every write since its last checkpoint so, shared with the history in memory).
        let check = |store: LocalStore, model: std::collections::BTreeMap<String, Bytes>, name: String, all_packed: bool| async move {
            for (key, value) in &model {
                assert_eq!(&store.get(key).await.expect("get").expect("present").value, value, "{name}: {key}");
            }
            let listed = store.list("/registry/pods/", None, None).await.expect("list");
            let listed: Vec<(String, Bytes)> = listed.items.into_iter().map(|kv| (kv.key, kv.value)).collect();
            assert_eq!(listed, model.clone().into_iter().collect::<Vec<_>>(), "{name}");
            // A packed list holds the values as the store does, and unpacks to the same.
            let packed = store.list_packed("/registry/pods/", None, None, None).await.expect("list_packed");
            let held: usize = packed.items.iter().map(|kv| kv.value.memory()).sum();
            let written: usize = packed.items.iter().map(|kv| kv.value.unpacked_len()).sum();
            assert!(!all_packed || held * 8 < written, "{name}: a packed list holds {held} bytes for {written}");
            let unpacked: Vec<(String, Bytes)> = packed.items.iter().map(|kv| (kv.key.clone(), kv.value.unpack())).collect();
            assert_eq!(unpacked, model.into_iter().collect::<Vec<_>>(), "{name}: packed");
            let r = store.retention().expect("retention");
            assert!(r.object_memory_bytes * 8 < r.object_bytes, "{name}: {} bytes in memory for {}", r.object_memory_bytes, r.object_bytes);
        };
        check(store.clone(), model.clone(), name.to_string(), name.starts_with("memory")).await;

        // Only the embedded store reaches back past its history in memory to the revision of the
        // creates; the other's history keeps the last 50 events.
        if name.starts_with("redb") {
            let past = store.list_at("/registry/pods/", None, None, at).await.expect("list_at");
            let past: Vec<(String, Bytes)> = past.items.into_iter().map(|kv| (kv.key, kv.value)).collect();
            assert_eq!(past, then.clone().into_iter().collect::<Vec<_>>(), "{name}: the list at the creates' revision");
            let past = store.list_packed("/registry/pods/", None, None, Some(at)).await.expect("list_packed at");
            let past: Vec<(String, Bytes)> = past.items.iter().map(|kv| (kv.key.clone(), kv.value.unpack())).collect();
            assert_eq!(past, then.into_iter().collect::<Vec<_>>(), "{name}: the packed list at the creates' revision");
            let mut w = store.watch("/registry/pods/", at).await.expect("watch");
            let mut written = std::collections::BTreeMap::new();
            for _ in 0..(store.revision().await.expect("revision") - at) {
                let e = w.next().await.expect("open").expect("event");
                let key = e.kv.key.clone();
                let i: usize = key.rsplit('-').next().and_then(|n| n.parse().ok()).expect("index");
                let before = written.get(&key).cloned().unwrap_or_else(|| pod_doc(i, 1));
                assert_eq!(e.prev.as_ref().expect("a value before").value, before, "{name}: the value before {key}'s write");
                written.insert(key, e.kv.value.clone());
            }
            store.close().await.expect("close");
            let reopened = LocalStore::open_redb(&path, small_memory).expect("reopen");
            check(reopened, model, format!("{name}, reopened"), true).await;
        }
    }
}

/// Heartbeat writes (node Lease renewals) wait a little for company before their commit, so that
/// several share one `fdatasync`; any other write is not delayed by them and takes them along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_wait_for_company_and_an_ordinary_write_takes_them_along_at_once() {
    use shepherd_store::{Heartbeats, WalOptions};
    use std::time::Instant;
    let open = |dir: &tempfile::TempDir, wait: Duration| {
        let options = WalOptions { heartbeats: Heartbeats { prefix: "/leases/", wait }, ..WalOptions::default() };
        LocalStore::open_embedded(&dir.path().join("s.redb"), HistoryLimits::default(), options).expect("open")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(open(&dir, Duration::from_millis(300)));
    store.create("/leases/n0", b("0")).await.expect("first");

    // A heartbeat alone is committed once the wait is over, not before.
    let started = Instant::now();
    store.update("/leases/n0", b("1"), None).await.expect("renewal");
    assert!(started.elapsed() >= Duration::from_millis(300), "a lone heartbeat committed after {:?}", started.elapsed());

    // Heartbeats that come during the wait share it; an ordinary write ends it at once.
    let wait = Duration::from_secs(30);
    store.close().await.expect("close");
    let store = Arc::new(open(&dir, wait));
    let started = Instant::now();
    let beats: Vec<_> = (1..=3)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.create(&format!("/leases/n{i}"), b("1")).await.map(|kv| kv.mod_revision) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for beat in &beats {
        assert!(!beat.is_finished(), "a heartbeat was committed alone");
    }
    let other = store.create("/pods/p", b("1")).await.expect("ordinary write");
    let mut revisions = Vec::new();
    for beat in beats {
        revisions.push(beat.await.expect("task").expect("heartbeat"));
    }
    assert!(started.elapsed() < wait / 2, "the ordinary write waited {:?}", started.elapsed());
    assert!(revisions.iter().all(|r| *r < other.mod_revision), "{revisions:?} then {}", other.mod_revision);
    store.close().await.expect("close");
    // And all of it is on disk.
    let store = open(&dir, Duration::ZERO);
    for key in ["/leases/n0", "/leases/n1", "/leases/n2", "/leases/n3", "/pods/p"] {
        assert!(store.get(key).await.expect("get").is_some(), "{key} lost");
    }
}
