//! The embedded store while its checkpoints into redb keep failing: the log takes writes up to its
//! limit, then writes are refused and readiness says why, until a checkpoint succeeds again.
//!
//! The failure is real: a file size limit (RLIMIT_FSIZE) below what redb needs to grow, so the
//! kernel refuses the checkpoint's writes (EFBIG) while the log's small segments stay under it.
//! The limit is process-wide, hence a test binary of its own with this one test.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shepherd_store::{HistoryLimits, LocalStore, Store, StoreError, WalOptions};

/// Limits every file this process writes to `bytes` (`None`: no limit). A write past it fails
/// with EFBIG instead of killing the process with SIGXFSZ.
fn limit_file_size(bytes: Option<u64>) {
    let mut rlimit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on a value owned here.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut rlimit), 0, "getrlimit(RLIMIT_FSIZE)");
        rlimit.rlim_cur = bytes.unwrap_or(rlimit.rlim_max).min(rlimit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit), 0, "setrlimit(RLIMIT_FSIZE)");
    }
}

/// Bytes of the log's segments up to their last record: without the zeros they were given ahead.
fn log_bytes(db: &Path) -> u64 {
    let dir = LocalStore::log_dir(db);
    let files = fs::read_dir(dir).expect("log dir").filter_map(|e| fs::read(e.ok()?.path()).ok());
    files.map(|data| data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1) as u64).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_refused_while_checkpoints_fail_past_the_log_limit_and_resume_once_one_succeeds() {
    const LIMIT: u64 = 256 * 1024;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.redb");
    let options = WalOptions {
        segment_bytes: 32 * 1024,
        checkpoint_interval: Duration::from_millis(20),
        max_uncheckpointed_bytes: LIMIT,
        ..WalOptions::default()
    };
    let store = LocalStore::open_embedded(&path, HistoryLimits::default(), options).expect("open");
    store.create("/before", Bytes::from_static(b"v")).await.expect("create");
    // Above the log's segments (32 KiB and a write, zeroed ahead for at most 64 KiB).
    let redb_size = fs::metadata(&path).expect("redb file").len();
    limit_file_size(Some(redb_size.max(256 * 1024)));

    // redb fills what free space its file has, then cannot grow it: checkpoints fail from there.
    let value = Bytes::from(vec![b'x'; 4096]);
    let mut acked = Vec::new();
    let refusal = loop {
        match store.create(&format!("/k/{}", acked.len()), value.clone()).await {
            Ok(kv) => acked.push(kv.key),
            Err(e) => break e,
        }
        assert!(acked.len() < 20_000, "80 MiB written and never refused");
    };
    let message = refusal.to_string();
    assert!(matches!(refusal, StoreError::Unavailable(_)), "{refusal:?}");
    assert!(message.contains("refuses writes until a checkpoint succeeds"), "{message}");
    assert!(message.contains("File too large"), "the checkpoint's failure is named: {message}");
    let readiness = store.writable().expect_err("readiness reports it").to_string();
    assert!(readiness.contains("refuses writes until a checkpoint succeeds"), "{readiness}");
    let logged = log_bytes(&path);
    assert!((LIMIT..LIMIT + 32 * 1024).contains(&logged), "the log stopped at its limit: {logged} bytes");
    let again = store.create("/refused", Bytes::from_static(b"v")).await.expect_err("still refused");
    assert!(again.to_string().contains("refuses writes"), "{again}");

    limit_file_size(None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.writable().is_err() {
        assert!(Instant::now() < deadline, "no checkpoint succeeded within 10 s: {:?}", store.writable());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.create("/after", Bytes::from_static(b"v")).await.expect("writes resume");
    let revision = store.revision().await.expect("revision");
    drop(store);

    let deadline = Instant::now() + Duration::from_secs(10);
    while LocalStore::redb_is_held(&path) {
        assert!(Instant::now() < deadline, "the store stayed held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store = LocalStore::open_redb(&path, HistoryLimits::default()).expect("reopen");
    assert_eq!(store.revision().await.expect("revision"), revision);
    for key in acked.iter().map(String::as_str).chain(["/before", "/after"]) {
        assert!(store.get(key).await.expect("get").is_some(), "acknowledged {key} is lost");
    }
    assert!(store.get("/refused").await.expect("get").is_none(), "a refused write never lands");
}
