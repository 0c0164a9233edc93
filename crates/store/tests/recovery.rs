//! The embedded store after a crash: every acknowledged write and the watch history come back
//! from redb and the write-ahead log, a torn log tail is cut off, a segment prepared ahead (whole
//! or half made) is read past, and a process killed in the middle of a checkpoint loses nothing.

use std::fs;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use shepherd_store::{EventKind, HistoryLimits, LocalStore, Revision, Snapshot, Store, StoreError, WalOptions};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Never checkpoints after the open: the redb file stays as the open left it, the log holds
/// every write since.
fn log_only() -> WalOptions {
    WalOptions { segment_bytes: u64::MAX, checkpoint_interval: Duration::from_secs(3600), ..WalOptions::default() }
}

fn wal_dir(db: &Path) -> PathBuf {
    db.with_extension("wal")
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(d) => d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "log")).collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// A segment's header: magic and epoch. Each record after it starts with its payload's length
/// (u32) and checksum (u32); zeros follow the last one (space the segment was given ahead).
const HEADER_LEN: usize = 16;

fn u32_at(data: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize)
}

/// Where the records of a segment end.
fn records_end(segment: &Path) -> u64 {
    let data = fs::read(segment).expect("read segment");
    let mut at = HEADER_LEN;
    while let Some(len) = u32_at(&data, at).filter(|l| *l > 0 && at + 8 + l <= data.len()) {
        at += 8 + len;
    }
    at as u64
}

/// Cuts `segment` `bytes` before the end of its last record, as a crash in the middle of its
/// write leaves it.
fn cut_last_record(segment: &Path, bytes: u64) {
    let end = records_end(segment);
    fs::OpenOptions::new().write(true).open(segment).expect("open").set_len(end - bytes).expect("cut");
}

/// A segment with a whole header and at least one record after it.
fn holds_records(segment: &Path) -> bool {
    fs::read(segment).is_ok_and(|d| u32_at(&d, HEADER_LEN).is_some_and(|l| l > 0))
}

/// The segments that hold at least one record (a prepared segment holds only its header).
fn written_segments(dir: &Path) -> Vec<PathBuf> {
    segments(dir).into_iter().filter(|s| holds_records(s)).collect()
}

/// Waits until the segment after the one being written is prepared: on disk, no record.
fn wait_for_prepared_segment(dir: &Path) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let all = segments(dir);
        if all.len() >= 2
            && let Some(last) = all.last()
            && fs::read(last).is_ok_and(|d| d.len() >= HEADER_LEN && d[..8] == *b"SHPWAL01")
            && !holds_records(last)
        {
            return last.clone();
        }
        assert!(Instant::now() < deadline, "no segment was prepared ahead: {all:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What the disk of a process killed right now would hold: its redb file (untouched since the
/// open, as nothing checkpoints) and its log.
fn crash_image(db: &Path, to: &Path) -> PathBuf {
    let image = to.join("s.redb");
    fs::copy(db, &image).expect("copy redb");
    fs::create_dir_all(wal_dir(&image)).expect("wal dir");
    for seg in segments(&wal_dir(db)) {
        fs::copy(&seg, wal_dir(&image).join(seg.file_name().expect("name"))).expect("copy segment");
    }
    image
}

/// Writes a mix of creates, updates and deletes; returns the revision in their middle.
async fn some_writes(store: &LocalStore) -> Revision {
    let a = store.create("/p/a", b("a1")).await.expect("create");
    store.create("/p/b", b("b1")).await.expect("create");
    let middle = store.revision().await.expect("revision");
    store.update("/p/a", b("a2"), Some(a.mod_revision)).await.expect("update");
    store.delete("/p/b", None).await.expect("delete");
    store.create("/p/c", b("c1")).await.expect("create");
    store.create("/q/x", b("x1")).await.expect("create");
    middle
}

/// The events of a watch from `from` until it has caught up with `store`'s revision.
async fn events_after(store: &LocalStore, prefix: &str, from: Revision) -> Vec<(EventKind, String, Revision, Option<Bytes>)> {
    let mut w = store.watch(prefix, from).await.expect("watch");
    let mut out = Vec::new();
    let last = store.revision().await.expect("revision");
    let count = store.list(prefix, None, None).await.expect("list");
    assert_eq!(count.revision, last);
    while out.last().is_none_or(|(_, _, r, _)| *r < last) {
        let next = tokio::time::timeout(Duration::from_secs(1), w.next()).await;
        let Ok(Some(Ok(e))) = next else { break };
        out.push((e.kind, e.kv.key.clone(), e.revision(), e.prev.as_ref().map(|p| p.value.clone())));
    }
    out
}

#[tokio::test]
async fn writes_only_in_the_log_come_back_and_a_watch_resumes_from_before_the_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    let middle = some_writes(&store).await;
    let before = events_after(&store, "/p/", middle).await;
    let revision = store.revision().await.expect("revision");
    let image = crash_image(&path, crashed.path());
    drop(store);

    let store = LocalStore::open_redb(&image, HistoryLimits::default()).expect("recover");
    assert_eq!(store.revision().await.expect("revision"), revision);
    let keys: Vec<String> = store.list("/", None, None).await.expect("list").items.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, ["/p/a", "/p/c", "/q/x"]);
    assert_eq!(store.get("/p/a").await.expect("get").expect("a").value, b("a2"));
    let after = events_after(&store, "/p/", middle).await;
    assert_eq!(after, before, "the same events, with the same previous values, after the crash");
    assert_eq!(after.len(), 3);
    assert_eq!(after[1].3, Some(b("b1")), "a delete carries the value it removed");
    // The next write follows on without a gap.
    let next = store.create("/p/d", b("d1")).await.expect("create");
    assert_eq!(next.mod_revision, revision + 1);
}

/// The objects of the redb file at `path` opened alone, without its log (a copy in `to`).
async fn keys_in_the_file_alone(path: &Path, to: &Path) -> (Revision, Vec<String>) {
    let alone = to.join("s.redb");
    fs::copy(path, &alone).expect("copy the redb file");
    let store = LocalStore::open_redb(&alone, HistoryLimits::default()).expect("open the copy");
    let keys = store.list("/", None, None).await.expect("list").items.into_iter().map(|kv| kv.key).collect();
    let revision = store.revision().await.expect("revision");
    store.close().await.expect("close the copy");
    (revision, keys)
}

#[tokio::test]
async fn after_close_the_redb_file_alone_holds_every_write_and_the_log_nothing_more() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    some_writes(&store).await;
    let revision = store.revision().await.expect("revision");
    let expected = ["/p/a", "/p/c", "/q/x"].map(String::from).to_vec();

    // Before the close every write is only in the log (nothing checkpoints): the file alone lacks them.
    let before = tempfile::tempdir().expect("tempdir");
    assert_eq!(keys_in_the_file_alone(&path, before.path()).await, (0, Vec::new()));

    store.close().await.expect("close");
    let after = tempfile::tempdir().expect("tempdir");
    assert_eq!(keys_in_the_file_alone(&path, after.path()).await, (revision, expected.clone()));
    // So the next open has nothing to replay, and serves the same objects and history.
    let reopened = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("reopen at once");
    let listed = reopened.list("/", None, None).await.expect("list");
    let keys: Vec<String> = listed.items.into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys, expected);
    assert_eq!(events_after(&reopened, "/", 0).await.len() as u64, revision, "the whole history is retained");
}

#[tokio::test]
async fn a_key_written_many_times_in_one_checkpoint_holds_its_last_value_and_keeps_every_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    let a = store.create("/p/a", b("a1")).await.expect("create");
    let a = store.update("/p/a", b("a2"), Some(a.mod_revision)).await.expect("update");
    store.update("/p/a", b("a3"), Some(a.mod_revision)).await.expect("update");
    store.create("/p/gone", b("g1")).await.expect("create");
    store.delete("/p/gone", None).await.expect("delete");
    store.create("/p/back", b("k1")).await.expect("create");
    store.delete("/p/back", None).await.expect("delete");
    store.create("/p/back", b("k2")).await.expect("create again");
    let revision = store.revision().await.expect("revision");
    // Everything reaches redb in the one checkpoint of the close.
    store.close().await.expect("close");

    let copy = tempfile::tempdir().expect("tempdir");
    let alone = copy.path().join("s.redb");
    fs::copy(&path, &alone).expect("copy the redb file");
    let file = LocalStore::open_redb(&alone, HistoryLimits::default()).expect("open the copy");
    let items: Vec<(String, Bytes)> =
        file.list("/", None, None).await.expect("list").items.into_iter().map(|kv| (kv.key, kv.value)).collect();
    assert_eq!(items, [("/p/a".to_string(), b("a3")), ("/p/back".to_string(), b("k2"))]);
    let history = events_after(&file, "/p/", 0).await;
    assert_eq!(history.len() as u64, revision, "every version is in the history: {history:?}");
    let values: Vec<Option<Bytes>> = history.iter().filter(|e| e.1 == "/p/a").map(|e| e.3.clone()).collect();
    assert_eq!(values, [None, Some(b("a1")), Some(b("a2"))], "each update carries the value before it");
}

#[tokio::test]
async fn a_compaction_reaches_the_disk_with_the_next_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    let middle = some_writes(&store).await;
    store.compact(middle).await.expect("compact");
    store.close().await.expect("close");

    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("reopen");
    match store.watch("/", middle - 1).await {
        Err(StoreError::Expired { requested, oldest }) => assert_eq!((requested, oldest), (middle - 1, middle)),
        other => panic!("expected Expired, got {:?}", other.map(|_| ())),
    }
    let events = events_after(&store, "/", middle).await;
    let last = store.revision().await.expect("revision");
    assert_eq!(events.iter().map(|e| e.2).collect::<Vec<_>>(), ((middle + 1)..=last).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_history_survives_checkpoints_and_restarts_and_expires_only_beyond_its_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let limits = HistoryLimits { max_events: 20, ..HistoryLimits::default() };
    // Checkpoints after every few writes: the history is spread over redb and the log.
    let options = WalOptions { segment_bytes: 200, checkpoint_interval: Duration::from_millis(1), ..WalOptions::default() };
    let store = LocalStore::open_embedded(&path, limits, options).expect("open");
    for i in 0..25 {
        let kv = store.create(&format!("/k/{i:02}"), b("v1")).await.expect("create");
        store.update(&kv.key, b(&format!("v2-{i}")), None).await.expect("update");
    }
    let revision = store.revision().await.expect("revision");
    let before = events_after(&store, "/k/", revision - 10).await;
    drop(store);
    let store = reopen(&path, limits, options).await;
    assert_eq!(store.revision().await.expect("revision"), revision);
    let events = events_after(&store, "/k/", revision - 10).await;
    let revisions: Vec<Revision> = events.iter().map(|e| e.2).collect();
    assert_eq!(revisions, ((revision - 9)..=revision).collect::<Vec<_>>());
    assert_eq!(events, before, "each event with the value before it, as it was before the restart");
    assert!(events.iter().any(|e| e.0 == EventKind::Updated && e.3 == Some(b("v1"))));
    let e = store.watch("/k/", revision - 30).await.err().expect("beyond the 20 retained events");
    assert!(matches!(e, StoreError::Expired { .. }), "{e:?}");
}

/// Waits until the store holds most of its history only in its file: the background checkpoint
/// moves it there, and one that ran before the last writes leaves those in memory until the next.
async fn history_spilled(store: &LocalStore) -> shepherd_store::Retention {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = store.retention().expect("retention");
        if r.history_memory_bytes < r.history_bytes / 4 {
            return r;
        }
        assert!(Instant::now() < deadline, "most of the history never left memory: {r:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Writes faster than a checkpoint a second keeps up with hold memory only until half the
/// history's in-memory budget is logged: then a checkpoint comes without waiting for the second.
#[tokio::test]
async fn heavy_writing_is_checkpointed_by_size_so_the_history_in_memory_stays_near_its_limit() {
    const MIB: usize = 1024 * 1024;
    assert_eq!(WalOptions::segment_bytes_for(8 * MIB), 4 * MIB as u64);
    assert_eq!(WalOptions::segment_bytes_for(0), MIB as u64, "never a segment per write");
    assert_eq!(WalOptions::segment_bytes_for(1024 * MIB), 16 * MIB as u64);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let limits = HistoryLimits { memory_bytes: 2 * MIB, ..HistoryLimits::default() };
    // No checkpoint by time during the test: only the log's size can bring one.
    let options = WalOptions {
        segment_bytes: WalOptions::segment_bytes_for(limits.memory_bytes),
        checkpoint_interval: Duration::from_secs(3600),
        ..WalOptions::default()
    };
    let store = LocalStore::open_embedded(&path, limits, options).expect("open");
    let value = Bytes::from(vec![b'x'; 64 * 1024]);
    let first = store.create("/k/000", value.clone()).await.expect("create").mod_revision;
    for i in 1..200 {
        store.create(&format!("/k/{i:03}"), value.clone()).await.expect("create");
    }
    let r = store.retention().expect("retention");
    assert_eq!(r.history_bytes, 200 * value.len(), "the whole history is kept, on disk or in memory");
    // The budget, the segment being written and the one being checkpointed, and a value over.
    let bound = limits.memory_bytes + 2 * MIB + value.len();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = store.retention().expect("retention");
        if r.history_memory_bytes <= bound {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:.1} MiB of history still in memory after 12.5 MiB written (limit 2 MiB): {r:?}",
            r.history_memory_bytes as f64 / MIB as f64
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The events that left memory are read back from the file by a watch from the first write.
    assert_eq!(events_after(&store, "/k/", first).await.len(), 199);
}

/// Watches and lists at every past revision of `store` and of `oracle` (same writes, the whole
/// history in memory) agree.
async fn same_past(store: &LocalStore, oracle: &LocalStore, from: Revision, what: &str) {
    let last = store.revision().await.expect("revision");
    assert_eq!(oracle.revision().await.expect("revision"), last);
    for at in from..last {
        let got = events_after(store, "/k/", at).await;
        assert_eq!(got, events_after(oracle, "/k/", at).await, "{what}: a watch from revision {at}");
        assert!(!got.is_empty(), "{what}: the watch from {at} replays the writes after it");
        let page = |s: &LocalStore| {
            let s = s.clone();
            async move {
                let first = s.list_at("/k/", None, Some(3), at).await.expect("list at");
                let rest = s.list_at("/k/", first.items.last().map(|kv| kv.key.as_str()), None, at).await.expect("page");
                first.items.into_iter().chain(rest.items).collect::<Vec<_>>()
            }
        };
        assert_eq!(page(store).await, page(oracle).await, "{what}: the list as it stood at revision {at}");
    }
}

#[tokio::test]
async fn watches_and_lists_reaching_past_the_history_in_memory_read_the_older_events_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    // 64 bytes of values in memory: all but the newest few events live only in the file.
    let limits = HistoryLimits { memory_bytes: 64, max_events: 200, ..HistoryLimits::default() };
    let options = WalOptions { segment_bytes: 300, checkpoint_interval: Duration::from_millis(1), ..WalOptions::default() };
    let store = LocalStore::open_embedded(&path, limits, options).expect("open");
    let oracle = LocalStore::in_memory(limits);
    for s in [&store, &oracle] {
        for i in 0..30 {
            let kv = s.create(&format!("/k/{i:02}"), b(&format!("first value of {i}"))).await.expect("create");
            s.create(&format!("/q/{i:02}"), b("elsewhere")).await.expect("create");
            s.update(&kv.key, b(&format!("second value of {i}")), None).await.expect("update");
            if i % 3 == 0 {
                s.delete(&kv.key, None).await.expect("delete");
            }
        }
        s.create("/k/last", b("the last write")).await.expect("create");
    }
    history_spilled(&store).await;
    same_past(&store, &oracle, 0, "open").await;

    drop(store);
    let store = reopen(&path, limits, options).await;
    history_spilled(&store).await;
    same_past(&store, &oracle, 0, "reopened").await;

    // The limits still say how far back the history reaches, on disk as in memory.
    for _ in 0..150 {
        for s in [&store, &oracle] {
            s.update("/k/last", b("again"), None).await.expect("update");
        }
    }
    let e = store.watch("/k/", 10).await.err().expect("beyond the 200 retained events");
    assert!(matches!(e, StoreError::Expired { .. }), "{e:?}");
    let e = store.list_at("/k/", None, None, 10).await.expect_err("beyond the retained events");
    assert!(matches!(e, StoreError::Expired { .. }), "{e:?}");
    let from = store.revision().await.expect("revision") - 150;
    history_spilled(&store).await;
    same_past(&store, &oracle, from, "after more writes").await;
}

#[tokio::test]
async fn a_watcher_that_fell_out_of_the_live_buffer_resumes_from_the_file_without_a_gap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let limits = HistoryLimits { memory_bytes: 64, watcher_buffer: 4, ..HistoryLimits::default() };
    let options = WalOptions { segment_bytes: 300, checkpoint_interval: Duration::from_millis(1), ..WalOptions::default() };
    let store = LocalStore::open_embedded(&path, limits, options).expect("open");
    let from = store.create("/k/first", b("first")).await.expect("create").mod_revision;
    // Opened, then not read while 60 writes go by: it falls out of its 4-event live buffer, and
    // all but the newest few of those writes leave memory.
    let mut watch = store.watch("/k/", from).await.expect("watch");
    for i in 0..60 {
        store.create(&format!("/k/{i:02}"), b(&format!("value {i}"))).await.expect("create");
    }
    let before = history_spilled(&store).await;
    assert_eq!((before.watch_resumes, before.history_file_reads, before.history_file_events), (0, 0, 0));
    let mut got = Vec::new();
    while got.len() < 60 {
        let next = tokio::time::timeout(Duration::from_secs(5), watch.next()).await.expect("the watch goes on");
        let e = next.expect("open").expect("no error: the history still reaches back");
        got.push((e.revision(), e.kv.key.clone()));
    }
    let expected: Vec<(Revision, String)> = (0..60).map(|i| (from + 1 + i as u64, format!("/k/{i:02}"))).collect();
    assert_eq!(got, expected);
    // What `/metrics` shows of it: one resume, and the events that had left memory read back.
    // How many had left memory by then depends on when the trimming ran (fewer on a busy
    // machine); that every event came, in order, is asserted above.
    let after = store.retention().expect("retention");
    assert_eq!(after.watch_resumes, 1, "{after:?}");
    assert_eq!(after.history_file_reads, 1, "{after:?}");
    assert!(after.history_file_events > 0 && after.history_file_events <= 60, "{after:?}");
}

/// Opens `path` once the store that held it has let go of it.
async fn reopen(path: &Path, limits: HistoryLimits, options: WalOptions) -> LocalStore {
    for _ in 0..100 {
        match LocalStore::open_embedded(path, limits, options) {
            Ok(s) => return s,
            Err(e) if e.to_string().contains("already open") => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("reopen: {e}"),
        }
    }
    panic!("the store stayed held");
}

#[tokio::test]
async fn a_log_cut_inside_its_last_record_opens_with_every_complete_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    for i in 0..5 {
        store.create(&format!("/k/{i}"), b("a value long enough to cut into")).await.expect("create");
    }
    let image = crash_image(&path, crashed.path());
    drop(store);
    // The segment written to, not the one prepared after it.
    let last = written_segments(&wal_dir(&image)).pop().expect("a segment");
    cut_last_record(&last, 7);

    let store = LocalStore::open_redb(&image, HistoryLimits::default()).expect("a torn tail is no reason to refuse");
    assert_eq!(store.revision().await.expect("revision"), 4);
    assert_eq!(store.count("/k/").await.expect("count"), 4);
    assert!(store.get("/k/4").await.expect("get").is_none(), "the torn write was never acknowledged");
    let kv = store.create("/k/5", b("v")).await.expect("writes go on");
    assert_eq!(kv.mod_revision, 5);
    drop(store);
    let store = reopen(&image, HistoryLimits::default(), WalOptions::default()).await;
    assert_eq!(store.count("/k/").await.expect("count"), 5, "the write after the cut is there after another restart");
}

/// The next segment as a crash while it was being prepared can leave it.
fn tear_header(segment: &Path, how: &str) {
    match how {
        "prepared" => {}
        "empty" => fs::write(segment, b"").expect("write"),
        "half a header" => fs::write(segment, &fs::read(segment).expect("read")[..5]).expect("write"),
        // The size reached the disk, the bytes did not.
        "zeros" => fs::write(segment, [0u8; HEADER_LEN]).expect("write"),
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn a_crash_with_the_next_segment_prepared_or_half_prepared_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    for i in 0..5 {
        store.create(&format!("/k/{i}"), b("a value long enough to cut into")).await.expect("create");
    }
    wait_for_prepared_segment(&wal_dir(&path));
    for how in ["prepared", "empty", "half a header", "zeros"] {
        for torn_tail in [false, true] {
            let crashed = tempfile::tempdir().expect("tempdir");
            let image = crash_image(&path, crashed.path());
            let log = segments(&wal_dir(&image));
            assert_eq!(log.len(), 2, "the segment written to and the one prepared after it");
            tear_header(&log[1], how);
            if torn_tail {
                // The last write was half on disk, unacknowledged, when the process died.
                cut_last_record(&log[0], 7);
            }
            let case = format!("next segment {how}, torn last record: {torn_tail}");

            let store = LocalStore::open_redb(&image, HistoryLimits::default())
                .unwrap_or_else(|e| panic!("{case}: a crash is no reason to refuse: {e}"));
            let kept = if torn_tail { 4 } else { 5 };
            assert_eq!(store.revision().await.expect("revision"), kept, "{case}");
            assert_eq!(store.count("/k/").await.expect("count"), kept as usize, "{case}");
            let kv = store.create("/k/next", b("v")).await.expect("writes go on");
            assert_eq!(kv.mod_revision, kept + 1, "{case}: no gap");
            drop(store);
            let store = reopen(&image, HistoryLimits::default(), WalOptions::default()).await;
            let count = store.count("/k/").await.expect("count");
            assert_eq!(count, kept as usize + 1, "{case}: the write after the crash is there after a restart");
        }
    }
}

#[tokio::test]
async fn a_torn_segment_before_one_that_holds_records_is_damage_not_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    for i in 0..5 {
        store.create(&format!("/k/{i}"), b("v")).await.expect("create");
    }
    wait_for_prepared_segment(&wal_dir(&path));
    let image = crash_image(&path, crashed.path());
    drop(store);
    let log = segments(&wal_dir(&image));
    // Records after a torn one: the writes between them are gone, which no crash does.
    fs::copy(&log[0], &log[1]).expect("copy");
    cut_last_record(&log[0], 3);
    let e = LocalStore::open_redb(&image, HistoryLimits::default()).err().expect("refused");
    assert!(e.to_string().contains("is damaged"), "{e}");
}

#[tokio::test]
async fn a_file_restored_from_a_backup_never_replays_the_log_it_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    store.create("/a", b("1")).await.expect("create");
    let backup = store.snapshot().expect("snapshot");
    store.create("/b", b("2")).await.expect("create");
    let image = crash_image(&path, crashed.path());
    drop(store);
    assert_eq!(LocalStore::read_redb_snapshot(&image).expect("read").items.len(), 2, "an idle file's reader sees the log");

    fs::remove_file(&image).expect("remove");
    LocalStore::write_redb_snapshot(&image, &backup).expect("restore");
    let store = LocalStore::open_redb(&image, HistoryLimits::default()).expect("open");
    assert_eq!(store.revision().await.expect("revision"), backup.revision);
    assert!(store.get("/b").await.expect("get").is_none());
    let aside: Vec<String> = fs::read_dir(crashed.path())
        .expect("dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains("orphaned"))
        .collect();
    assert_eq!(aside.len(), 1, "the replaced file's log is kept aside: {aside:?}");
}

#[tokio::test]
async fn the_redb_only_engine_takes_over_a_file_with_a_log_without_losing_a_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    let middle = some_writes(&store).await;
    let image = crash_image(&path, crashed.path());
    drop(store);
    let old = LocalStore::open_redb_only(&image, HistoryLimits::default()).expect("open");
    assert_eq!(old.count("/").await.expect("count"), 3);
    old.create("/p/z", b("z")).await.expect("create");
    let revision = old.revision().await.expect("revision");
    drop(old);
    let mut store = None;
    for _ in 0..100 {
        if let Ok(s) = LocalStore::open_redb(&image, HistoryLimits::default()) {
            store = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = store.expect("reopen");
    assert_eq!(store.revision().await.expect("revision"), revision);
    let e = store.watch("/p/", middle).await.err().expect("writes the log never saw break the history");
    assert!(matches!(e, StoreError::Expired { .. }), "{e:?}");
}

const CHILD_DIR: &str = "SHEPHERD_TEST_WAL_CHILD_DIR";

/// Run by `a_kill_9_during_a_checkpoint_loses_no_acknowledged_write` as its own process: writes
/// as fast as it can, checkpointing constantly, printing each acknowledged write.
#[test]
#[ignore = "a child process of another test"]
fn checkpointing_writer() {
    let dir = PathBuf::from(std::env::var(CHILD_DIR).expect("run by its parent test"));
    let options =
        WalOptions { segment_bytes: 16 * 1024, checkpoint_interval: Duration::from_millis(2), ..WalOptions::default() };
    let store = LocalStore::open_embedded(&dir.join("s.redb"), HistoryLimits::default(), options).expect("open");
    let round = std::env::var("ROUND").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    runtime.block_on(async move {
        let mut writers = Vec::new();
        for w in 0..8 {
            let (store, out, round) = (store.clone(), out.clone(), round.clone());
            writers.push(tokio::spawn(async move {
                for i in 0.. {
                    let key = format!("/r{round}/w{w}/{i}");
                    let kv = store.create(&key, b(&"v".repeat(300))).await.expect("create");
                    let mut out = out.lock().expect("stdout");
                    writeln!(out, "{key} {}", kv.mod_revision).expect("print");
                    out.flush().expect("flush");
                }
            }));
        }
        for w in writers {
            w.await.expect("writer");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_during_a_checkpoint_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let mut mid_checkpoint = 0;
    let mut with_prepared = 0;
    let mut acked_total = 0;
    for round in 0..12 {
        let start = LocalStore::read_redb_snapshot(&path).map_or(0, |s: Snapshot| s.revision);
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "checkpointing_writer", "--ignored", "--nocapture", "--test-threads", "1"])
            .env(CHILD_DIR, dir.path())
            .env("ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the writer");
        let stdout = child.stdout.take().expect("stdout");
        let acked: Arc<Mutex<Vec<(String, Revision)>>> = Arc::default();
        let reader = {
            let acked = acked.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Some((key, rev)) = line.split_once(' ')
                        && let Ok(rev) = rev.parse()
                    {
                        acked.lock().expect("acked").push((key.to_string(), rev));
                    }
                }
            })
        };
        // Once writes flow, kill the writer while a checkpoint is between its new segment and
        // the removal of the old ones (two segments with records on disk), or after 10 s
        // regardless.
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked.lock().expect("acked").len() < 200 {
            assert!(Instant::now() < deadline, "the writer acknowledged nothing");
            std::thread::sleep(Duration::from_millis(5));
        }
        let give_up = Instant::now() + Duration::from_secs(10);
        while written_segments(&wal_dir(&path)).len() < 2 && Instant::now() < give_up {}
        child.kill().expect("kill -9");
        child.wait().expect("wait");
        reader.join().expect("reader");
        if written_segments(&wal_dir(&path)).len() >= 2 {
            mid_checkpoint += 1;
        }
        // The segment prepared after the one written to, holding no record (or, killed while
        // it was being made, not even its whole header).
        if segments(&wal_dir(&path)).last().is_some_and(|s| !holds_records(s)) {
            with_prepared += 1;
        }

        let acked = acked.lock().expect("acked").clone();
        acked_total += acked.len();
        let store = LocalStore::open_redb(&path, HistoryLimits::default()).expect("recover");
        for (key, rev) in &acked {
            let kv = store.get(key).await.expect("get").unwrap_or_else(|| panic!("acknowledged {key} is lost"));
            assert_eq!(kv.mod_revision, *rev, "{key}");
        }
        // The history reaches back across the kill, without a gap.
        let events = events_after(&store, "/", start).await;
        let revisions: Vec<Revision> = events.iter().map(|e| e.2).collect();
        let last = store.revision().await.expect("revision");
        assert_eq!(revisions, ((start + 1)..=last).collect::<Vec<_>>(), "round {round}");
        drop(store);
        // Let the store's threads let go of the file before the next writer opens it.
        while LocalStore::redb_is_held(&path) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if mid_checkpoint >= 3 {
            break;
        }
    }
    eprintln!(
        "{acked_total} acknowledged writes, {mid_checkpoint} kills during a checkpoint, \
         {with_prepared} with a segment prepared ahead"
    );
    assert!(mid_checkpoint >= 1, "no kill landed during a checkpoint");
    assert!(with_prepared >= 1, "no kill left a prepared segment behind");
}

/// The issue 46 case: 16 bytes overwritten in the middle of the newest segment, after a crash.
/// Records stand after the damage, so it is no torn tail: the store refuses to open and says to
/// restore, instead of cutting off acknowledged writes in silence.
#[tokio::test]
async fn damage_in_the_middle_of_the_newest_segment_refuses_to_open_instead_of_losing_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let crashed = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), log_only()).expect("open");
    for i in 0..520 {
        store.create(&format!("/k/{i}"), b("an acknowledged value")).await.expect("create");
    }
    let image = crash_image(&path, crashed.path());
    drop(store);
    let last = written_segments(&wal_dir(&image)).pop().expect("a segment");
    // Inside the records, not in the zeroed space after them: at the key of the 260th write.
    let bytes = fs::read(&last).expect("read");
    let at = bytes.windows(6).position(|w| w == b"/k/260").expect("the 260th write is in the newest segment");
    let file = fs::OpenOptions::new().write(true).open(&last).expect("open");
    std::os::unix::fs::FileExt::write_all_at(&file, &[0x5a; 16], at as u64).expect("corrupt");
    let e = LocalStore::open_redb(&image, HistoryLimits::default()).err().expect("refused");
    let text = e.to_string();
    assert!(text.contains("is damaged") && text.contains("restore from a backup or snapshot"), "{text}");
}
