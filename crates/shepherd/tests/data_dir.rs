//! The data directory is private to the daemon's user: 0700 directories and 0600 files, an
//! existing wider directory tightened at start.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::json;

/// Every entry under `dir` (itself included) whose group or other bits are set.
fn readable_by_others(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            out.push((p.clone(), mode));
        }
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).into_iter().flatten().flatten().map(|e| e.path()));
        }
    }
    out
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            stack.extend(std::fs::read_dir(&p).into_iter().flatten().flatten().map(|e| e.path()));
        } else if let Some(name) = p.file_name() {
            out.push(name.to_string_lossy().to_string());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_and_every_file_in_it_are_private_to_the_owner() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(dir.join("notes"), "left by hand").expect("write");
    std::fs::set_permissions(dir.join("notes"), std::fs::Permissions::from_mode(0o644)).expect("chmod");

    let daemon = Daemon::start("standalone", &dir, &[]);
    let http = reqwest::Client::new();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "talker"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "echo hello; sleep 1000"]}]}});
    let r = http.post(format!("{}/api/v1/namespaces/default/pods", daemon.url)).json(&pod).send().await.expect("create");
    assert_eq!(r.status().as_u16(), 201);
    // Wait for the files a running container leaves: its state and its log with output in it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let files = files_under(&dir);
        let logged = http
            .get(format!("{}/api/v1/namespaces/default/pods/talker/log", daemon.url))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        let text = match logged {
            Some(r) => r.text().await.unwrap_or_default(),
            None => String::new(),
        };
        if text.contains("hello") && ["store.redb", "state.json", "current.log"].iter().all(|f| files.iter().any(|n| n == f)) {
            break;
        }
        assert!(Instant::now() < deadline, "the container never ran and logged; files: {files:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(readable_by_others(&dir), Vec::<(PathBuf, u32)>::new());
}
