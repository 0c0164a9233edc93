//! A real `shepherd server` whose data dir fills up: writes are refused with 507 and leave nothing
//! behind, `/readyz` says why, writes resume by themselves once the disk has room again, and after
//! a restart the store holds exactly the writes that were acknowledged.
//!
//! Mounts a small tmpfs for the data dir, so it needs root (CI runs as root).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

/// A tmpfs the test mounts, resizes and unmounts.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test mounts a tmpfs for the data dir and needs root (run the suite as root, as CI does)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(ok.success(), "mounting a {size} tmpfs at {} failed (needs root and tmpfs)", dir.path().display());
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.path())
            .status()
            .expect("run mount");
        assert!(ok.success(), "growing the tmpfs to {size} failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"fill": "disk"}},
        "spec": {"containers": [{"name": "c", "image": "minimal", "args": ["x".repeat(3000)]}]}})
}

async fn pod_names(http: &reqwest::Client, url: &str) -> BTreeSet<String> {
    let list: Value = http
        .get(format!("{url}/api/v1/namespaces/default/pods?labelSelector=fill%3Ddisk"))
        .send()
        .await
        .expect("list pods")
        .json()
        .await
        .expect("list body");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn readyz(http: &reqwest::Client, url: &str) -> (u16, String) {
    let r = http.get(format!("{url}/readyz")).send().await.expect("readyz");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_cleanly_and_they_resume_when_it_has_room() {
    let fs = Tmpfs::mount("8m");
    let data: PathBuf = fs.path().join("data");
    let http = reqwest::Client::new();
    // No controllers and no snapshots: nothing but the writers below touches the disk.
    let args = ["--controllers", "none", "--snapshot-interval", "0s"];
    let mut daemon = Daemon::start("server", &data, &args);
    let url = daemon.url.clone();

    // Eight writers fill the disk; each stops after its first refused write.
    let acked: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let refusals: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..8 {
        let (http, url, acked, refusals) = (http.clone(), url.clone(), acked.clone(), refusals.clone());
        writers.push(tokio::spawn(async move {
            for i in 0..20_000 {
                let name = format!("w{w}-{i}");
                let r = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod(&name)).send().await;
                let r = r.expect("the server answers while its disk is full");
                let code = r.status().as_u16();
                if code == 201 {
                    acked.lock().expect("lock").insert(name);
                    continue;
                }
                let body = r.text().await.unwrap_or_default();
                refusals.lock().expect("lock").push((code, body));
                return;
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    let refusals = refusals.lock().expect("lock").clone();
    assert_eq!(refusals.len(), 8, "every writer ends on a refused write: {refusals:?}");
    for (code, body) in &refusals {
        assert!(*code == 507 || *code == 503, "a write on a full disk gets 507 or 503, not {code}: {body}");
        assert!(body.contains("no space left"), "the refusal says the disk is full: {body}");
    }
    assert!(refusals.iter().any(|(code, _)| *code == 507), "{refusals:?}");

    // The server stays up: it says why it is not ready, and serves exactly the acknowledged pods.
    let (code, body) = readyz(&http, &url).await;
    assert_eq!(code, 503, "/readyz with a full disk: {body}");
    assert!(body.contains("[-]store failed") && body.contains("no space left"), "{body}");
    let live = http.get(format!("{url}/livez")).send().await.expect("livez").status().as_u16();
    assert_eq!(live, 200, "a full disk does not make the process unhealthy");
    let mut acked = acked.lock().expect("lock").clone();
    assert!(acked.len() > 100, "only {} pods fit on 8 MiB", acked.len());
    assert_eq!(pod_names(&http, &url).await, acked, "reads show exactly the acknowledged writes");

    // A delete on the full disk either fits or is refused the same way; it never half-happens.
    let first = acked.iter().next().cloned().expect("a pod");
    let r = http.delete(format!("{url}/api/v1/namespaces/default/pods/{first}?gracePeriodSeconds=0")).send().await;
    match r.expect("delete").status().as_u16() {
        200 => {
            acked.remove(&first);
        }
        503 | 507 => {}
        code => panic!("a delete on a full disk answered {code}"),
    }
    assert_eq!(pod_names(&http, &url).await, acked, "reads after the delete");

    // Room again: the store notices on its own, and writes succeed without a restart.
    fs.resize("64m");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, body) = readyz(&http, &url).await;
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "/readyz still failing 15 s after the disk has room: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in ["after-0", "after-1"] {
        let r = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod(name)).send().await.expect("post");
        assert_eq!(r.status().as_u16(), 201, "a write once the disk has room: {}", r.text().await.unwrap_or_default());
        acked.insert(name.to_string());
    }
    let victim = acked.iter().next().cloned().expect("a pod");
    let r = http.delete(format!("{url}/api/v1/namespaces/default/pods/{victim}?gracePeriodSeconds=0")).send().await.expect("delete");
    assert_eq!(r.status().as_u16(), 200, "a delete once the disk has room");
    acked.remove(&victim);
    // Checkpoints resume too: the write-ahead log is folded into redb and shrinks to two segments
    // (the one being written and the one prepared after it).
    let log = data.join("store.wal");
    let segments = || std::fs::read_dir(&log).map_or(0, |d| d.filter(|e| e.is_ok()).count());
    let deadline = Instant::now() + Duration::from_secs(30);
    while segments() > 2 {
        assert!(Instant::now() < deadline, "the log still has {} segments 30 s after the disk has room", segments());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A restart reads back exactly what was acknowledged: no refused write comes back.
    daemon.terminate();
    drop(daemon);
    let daemon = Daemon::start("server", &data, &args);
    assert_eq!(pod_names(&http, &daemon.url).await, acked, "after a restart");
    drop(daemon);
}
