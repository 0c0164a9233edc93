//! `shepherd backup` and `shepherd restore` with the real binary: a backup taken under concurrent
//! writers is a consistent cut at its revision, and a damaged backup is refused.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

const TOKEN: &str = "backup-test-token";

fn shepherd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shepherd")).args(args).env("RUST_LOG", "warn").output().expect("run shepherd")
}

/// Runs `shepherd args` expecting it to exit by itself; one still running after 30 s is serving
/// what it should have refused.
fn server_that_must_not_start(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run shepherd");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("shepherd {args:?} started serving a store it should have refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"writer": "backup"}},
        "spec": {"containers": [{"name": "c", "image": "minimal"}]}})
}

/// The backup's revision, from `backup of N objects at revision R written to FILE`.
fn backup_revision(out: &Output) -> u64 {
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace()
        .skip_while(|w| *w != "revision")
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {s:?}"))
}

async fn stored(http: &reqwest::Client, url: &str) -> (BTreeMap<String, u64>, u64) {
    let list: Value = http
        .get(format!("{url}/api/v1/namespaces/default/pods?labelSelector=writer%3Dbackup"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let rv = |v: &Value| v["resourceVersion"].as_str().and_then(|r| r.parse::<u64>().ok()).expect("resourceVersion");
    let items = list["items"].as_array().expect("items");
    (
        items.iter().map(|c| (c["metadata"]["name"].as_str().expect("name").to_string(), rv(&c["metadata"]))).collect(),
        rv(&list["metadata"]),
    )
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_16_writers_restores_exactly_the_writes_acknowledged_up_to_its_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("source");
    let mut daemon = Daemon::start("server", &source, &["--controllers", "none", "--token", TOKEN]);
    let url = daemon.url.clone();
    let http = reqwest::Client::new();

    let unauthenticated = http.get(format!("{url}/backup")).send().await.expect("GET /backup");
    assert_eq!(unauthenticated.status().as_u16(), 401, "a backup holds every object: it needs the token");

    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..16 {
        let (http, url, acked, stop) = (http.clone(), url.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{i}");
                i += 1;
                let r = http
                    .post(format!("{url}/api/v1/namespaces/default/pods"))
                    .bearer_auth(TOKEN)
                    .json(&pod(&name))
                    .send()
                    .await
                    .expect("create");
                assert_eq!(r.status().as_u16(), 201, "create {name}");
                let body: Value = r.json().await.expect("json");
                let rv = body["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("rv");
                acked.lock().expect("lock").push((name, rv));
            }
        }));
    }
    let count = || acked.lock().expect("lock").len();
    wait_for("the first 200 creates", || count() >= 200).await;

    let file = dir.path().join("cluster.snap");
    let file_arg = file.to_str().expect("path");
    let out = tokio::task::spawn_blocking({
        let (url, file_arg) = (url.clone(), file_arg.to_string());
        move || shepherd(&["backup", "--server", &url, "--token", TOKEN, "--to", &file_arg])
    })
    .await
    .expect("backup");
    assert!(out.status.success(), "backup failed: {}", text(&out));
    let revision = backup_revision(&out);
    let at_backup = count();
    // The writers go on past the backup, so the restore has writes to leave out.
    wait_for("200 creates after the backup", || count() >= at_backup + 200).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let live = shepherd(&["restore", "--from", file_arg, "--data-dir", source.to_str().expect("path"), "--force"]);
    assert!(!live.status.success(), "a restore replaced the store of a running server");
    assert!(text(&live).contains("running Shepherd process"), "{}", text(&live));
    daemon.terminate();
    let mode = std::fs::metadata(&file).expect("backup file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the backup holds every object; only its owner may read it");

    let refused = shepherd(&["restore", "--from", file_arg, "--data-dir", source.to_str().expect("path")]);
    assert!(!refused.status.success(), "restore over a live data dir without --force must fail");
    assert!(text(&refused).contains("--force"), "{}", text(&refused));

    let restored_dir = dir.path().join("restored");
    let out = shepherd(&["restore", "--from", file_arg, "--data-dir", restored_dir.to_str().expect("path")]);
    assert!(out.status.success(), "restore failed: {}", text(&out));
    let daemon = Daemon::start("server", &restored_dir, &["--controllers", "none", "--token", TOKEN]);
    let (restored, list_revision) = stored(&http, &daemon.url).await;

    let acked = acked.lock().expect("lock").clone();
    let expected: BTreeMap<String, u64> = acked.iter().filter(|(_, rv)| *rv <= revision).cloned().collect();
    let later = acked.iter().filter(|(_, rv)| *rv > revision).count();
    assert!(expected.len() >= 200 && later >= 150, "{} writes before the backup, {later} after", expected.len());
    assert_eq!(restored, expected, "the restore holds exactly the creates acknowledged up to revision {revision}");
    assert!(list_revision >= revision, "revision went back from {revision} to {list_revision}");

    // Revisions stay monotonic: a write after the restore gets a resourceVersion above the backup's.
    let r = http
        .post(format!("{}/api/v1/namespaces/default/pods", daemon.url))
        .bearer_auth(TOKEN)
        .json(&pod("after-restore"))
        .send()
        .await
        .expect("create");
    let body: Value = r.json().await.expect("json");
    let rv: u64 = body["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("rv");
    assert!(rv > revision, "resourceVersion {rv} after a restore of revision {revision}");
    eprintln!("backup at revision {revision}: {} objects restored, {later} later writes left out", restored.len());
}

/// Flips 16 bytes in the middle of `path`.
fn corrupt(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read");
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(path, bytes).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_backup_is_refused_and_restores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("source");
    let source_arg = source.to_str().expect("path");
    let mut daemon = Daemon::start("server", &source, &["--controllers", "none", "--token", TOKEN]);
    let http = reqwest::Client::new();
    for i in 0..20 {
        let r = http
            .post(format!("{}/api/v1/namespaces/default/pods", daemon.url))
            .bearer_auth(TOKEN)
            .json(&pod(&format!("cm-{i}")))
            .send()
            .await
            .expect("create");
        assert_eq!(r.status().as_u16(), 201);
    }
    let file = dir.path().join("offline.snap");
    let file_arg = file.to_str().expect("path");

    let held = shepherd(&["backup", "--data-dir", source_arg, "--to", file_arg]);
    assert!(!held.status.success(), "an offline backup of a store a server holds must fail");
    assert!(text(&held).contains("--server"), "the error should point to an online backup: {}", text(&held));
    daemon.terminate();

    let out = shepherd(&["backup", "--data-dir", source_arg, "--to", file_arg]);
    assert!(out.status.success(), "offline backup failed: {}", text(&out));
    let intact = dir.path().join("intact");
    let out = shepherd(&["restore", "--from", file_arg, "--data-dir", intact.to_str().expect("path")]);
    assert!(out.status.success(), "restore of the intact backup failed: {}", text(&out));
    let daemon = Daemon::start("server", &intact, &["--controllers", "none", "--token", TOKEN]);
    assert_eq!(stored(&http, &daemon.url).await.0.len(), 20, "an offline backup holds every object");
    drop(daemon);

    corrupt(&file);
    let target = dir.path().join("target");
    let out = shepherd(&["restore", "--from", file_arg, "--data-dir", target.to_str().expect("path")]);
    assert!(!out.status.success(), "a corrupted backup was restored");
    assert!(text(&out).contains("checksum mismatch") && text(&out).contains("nothing was restored"), "{}", text(&out));
    assert!(!target.join("store.redb").exists(), "a refused restore wrote a store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_check_counts_a_healthy_store_and_names_every_record_that_does_not_fit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("source");
    let source_arg = source.to_str().expect("path");
    let mut daemon = Daemon::start("server", &source, &["--controllers", "none", "--token", TOKEN]);
    let http = reqwest::Client::new();
    for i in 0..3 {
        let r = http
            .post(format!("{}/api/v1/namespaces/default/pods", daemon.url))
            .bearer_auth(TOKEN)
            .json(&pod(&format!("p-{i}")))
            .send()
            .await
            .expect("create");
        assert_eq!(r.status().as_u16(), 201);
    }
    daemon.terminate();

    let healthy = shepherd(&["store", "check", "--data-dir", source_arg]);
    assert!(healthy.status.success(), "a healthy store was reported: {}", text(&healthy));
    assert!(text(&healthy).contains("pods 3") && text(&healthy).contains("no problems"), "{}", text(&healthy));

    // A store with damaged records, made through a backup file that carries them.
    let file = dir.path().join("store.snap");
    let out = shepherd(&["backup", "--data-dir", source_arg, "--to", file.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));
    let mut snapshot = shepherd_store::Snapshot::decode(&std::fs::read(&file).expect("read")).expect("decode");
    let good = snapshot.items[0].clone();
    let bad = |key: &str, value: &[u8]| shepherd_store::KeyValue {
        key: key.into(),
        value: value.to_vec().into(),
        ..good.clone()
    };
    snapshot.items.push(bad("/registry/core/pods/default/zz-truncated", b"{\"metadata\":{\"name\""));
    snapshot.items.push(bad("/registry/core/pods/zz-no-namespace", &good.value));
    snapshot.items.push(bad("/zz/not-a-registry-key", &good.value));
    snapshot.items.sort_by(|a, b| a.key.cmp(&b.key));
    std::fs::write(&file, snapshot.encode()).expect("write");
    let damaged = dir.path().join("damaged");
    let out =
        shepherd(&["restore", "--from", file.to_str().expect("path"), "--data-dir", damaged.to_str().expect("path")]);
    assert!(out.status.success(), "{}", text(&out));

    let out = shepherd(&["store", "check", "--data-dir", damaged.to_str().expect("path")]);
    assert!(!out.status.success(), "damaged records passed the check: {}", text(&out));
    let report = text(&out);
    for key in
        ["/registry/core/pods/default/zz-truncated", "/registry/core/pods/zz-no-namespace", "/zz/not-a-registry-key"]
    {
        assert!(report.contains(&format!("problem: {key}: ")), "{key} not reported: {report}");
    }
    assert!(report.contains("not valid JSON") && report.contains("3 of"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_store_refuses_to_start_and_names_the_snapshot_to_restore() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("path");
    let args = ["--controllers", "none", "--token", TOKEN, "--snapshot-interval", "200ms", "--snapshot-keep", "2"];
    let mut daemon = Daemon::start("server", &data, &args);
    let http = reqwest::Client::new();
    let mut last_rv = 0;
    for name in ["p-0", "p-1", "p-2", "p-3"] {
        let r = http
            .post(format!("{}/api/v1/namespaces/default/pods", daemon.url))
            .bearer_auth(TOKEN)
            .json(&pod(name))
            .send()
            .await
            .expect("create");
        assert_eq!(r.status().as_u16(), 201);
        let body: Value = r.json().await.expect("json");
        last_rv = body["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("rv");
    }
    let snapshots = data.join("snapshots");
    let snapshot_revisions = || -> Vec<u64> {
        let Ok(entries) = std::fs::read_dir(&snapshots) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".snap")?.split("-rev").nth(1)?.parse().ok())
            .collect()
    };
    wait_for("a snapshot holding every create", || snapshot_revisions().iter().any(|r| *r >= last_rv)).await;
    daemon.terminate();

    // 16 bytes of the file header. (A corruption inside a data page is not always detected: redb
    // may fall back to the previous commit, and a stale copy of a page is never read.)
    let store = data.join("store.redb");
    let mut bytes = std::fs::read(&store).expect("read store");
    for b in &mut bytes[..16] {
        *b ^= 0x5a;
    }
    std::fs::write(&store, bytes).expect("write store");

    let out = server_that_must_not_start(
        &[&["server", "--data-dir", data_arg, "--listen", "127.0.0.1:0"], &args[..]].concat(),
    );
    let message = text(&out);
    assert!(!out.status.success(), "a corrupted store was served: {message}");
    let newest =
        std::fs::read_dir(&snapshots).expect("snapshots").flatten().map(|e| e.path()).max().expect("a snapshot");
    let newest = newest.to_str().expect("path");
    assert!(message.contains(store.to_str().expect("path")), "the message does not name the store: {message}");
    assert!(
        message.contains(&format!("shepherd restore --from {newest} --data-dir {data_arg}")),
        "the message does not name the snapshot to restore ({newest}): {message}"
    );

    let check = shepherd(&["store", "check", "--data-dir", data_arg]);
    assert!(!check.status.success(), "store check passed a corrupted store: {}", text(&check));
    assert!(text(&check).contains(&format!("shepherd restore --from {newest}")), "{}", text(&check));

    // The advice works: every pod is back.
    let out = shepherd(&["restore", "--from", newest, "--data-dir", data_arg, "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    // The replaced file's log goes aside with it, not left for the restored file to meet.
    assert!(!data.join("store.wal").exists(), "{}", text(&out));
    let moved: Vec<String> = std::fs::read_dir(&data)
        .expect("data dir")
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with("store.wal.replaced-") || n.starts_with("store.redb.replaced-"))
        .collect();
    assert_eq!(moved.len(), 2, "the old store and its log are kept aside: {moved:?}");
    let daemon = Daemon::start("server", &data, &args);
    let (pods, _) = stored(&http, &daemon.url).await;
    assert_eq!(pods.keys().map(String::as_str).collect::<Vec<_>>(), ["p-0", "p-1", "p-2", "p-3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_behind_its_newest_snapshot_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let args = ["--controllers", "none", "--token", TOKEN, "--snapshot-interval", "100ms"];
    let mut daemon = Daemon::start("server", &data, &args);
    daemon.terminate();
    let store = data.join("store.redb");
    let old_copy = std::fs::read(&store).expect("read store");

    let mut daemon = Daemon::start("server", &data, &args);
    let r = http_create(&daemon.url, "later").await;
    assert_eq!(r.status().as_u16(), 201);
    let snapshots = data.join("snapshots");
    wait_for("a snapshot after the create", || std::fs::read_dir(&snapshots).is_ok_and(|mut d| d.next().is_some()))
        .await;
    daemon.terminate();

    // An older copy of the file put back (or a newest commit redb skipped as damaged).
    std::fs::write(&store, old_copy).expect("write store");
    let out =
        server_that_must_not_start(&["server", "--data-dir", data.to_str().expect("path"), "--listen", "127.0.0.1:0"]);
    let message = text(&out);
    assert!(!out.status.success(), "a store that lost writes was served: {message}");
    // Refused either by the snapshot check or, when the file's log continues past it, by the log.
    assert!(message.contains("behind") && message.contains("shepherd restore --from"), "{message}");
}

async fn http_create(url: &str, name: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/api/v1/namespaces/default/pods"))
        .bearer_auth(TOKEN)
        .json(&pod(name))
        .send()
        .await
        .expect("create")
}

/// 64 bytes flipped in the middle of `store.redb` (issue 46): `store check` finds it (it checks
/// every page against its checksum, not only the objects it reads) and exits 1 with the restore
/// command; the server refuses to start with the same advice, and never panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_damaged_in_the_middle_fails_store_check_and_the_start_without_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data_arg = data.to_str().expect("path");
    let args = ["--controllers", "none", "--token", TOKEN];
    let mut daemon = Daemon::start("server", &data, &args);
    for i in 0..300 {
        let r = http_create(&daemon.url, &format!("p-{i}")).await;
        assert_eq!(r.status().as_u16(), 201);
    }
    daemon.terminate();
    let healthy = shepherd(&["store", "check", "--data-dir", data_arg]);
    assert!(healthy.status.success(), "{}", text(&healthy));

    let store = data.join("store.redb");
    let mut bytes = std::fs::read(&store).expect("read store");
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&store, bytes).expect("write store");

    let check = shepherd(&["store", "check", "--data-dir", data_arg]);
    assert!(!check.status.success(), "store check passed a damaged store: {}", text(&check));
    assert!(text(&check).contains("shepherd restore --from"), "{}", text(&check));
    let out = server_that_must_not_start(&[&["server", "--data-dir", data_arg, "--listen", "127.0.0.1:0"], &args[..]].concat());
    let message = text(&out);
    assert!(!out.status.success(), "a damaged store was served: {message}");
    assert_ne!(out.status.code(), Some(101), "the start panicked: {message}");
    assert!(message.contains("shepherd restore --from"), "{message}");
}
