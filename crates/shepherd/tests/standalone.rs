//! `shepherd standalone` end to end: the seed's Deployment runs as real processes, a container
//! killed by hand is restarted, and a `kill -9`ed daemon takes its containers back on restart
//! instead of starting duplicates.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

/// Container main pids by pod uid, from the agent's state files.
fn container_pids(data_dir: &Path) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    let Ok(pods) = std::fs::read_dir(data_dir.join("agent/containers")) else { return out };
    for pod in pods.flatten() {
        for c in std::fs::read_dir(pod.path()).into_iter().flatten().flatten() {
            let Ok(text) = std::fs::read_to_string(c.path().join("state.json")) else { continue };
            let Ok(state) = serde_json::from_str::<Value>(&text) else { continue };
            if let Some(pid) = state["main_pid"].as_i64() {
                out.insert(pod.file_name().to_string_lossy().to_string(), pid as i32);
            }
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

async fn pods(http: &reqwest::Client, url: &str) -> Vec<Value> {
    let list: Value = http.get(format!("{url}/api/v1/namespaces/default/pods")).send().await.expect("list").json().await.expect("json");
    list["items"].as_array().cloned().unwrap_or_default()
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn running_ready(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_deployment_runs_real_processes_that_heal_and_survive_a_daemon_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    // More threads than the default of this suite's two-core machines (one for the API, one for
    // the controllers), so the heal and the restart below also run with several of each.
    let flags = ["--restart-backoff-seconds", "0.2", "--lease-seconds", "1", "--api-threads", "2", "--controller-threads", "3"];
    let mut daemon = Daemon::start("standalone", dir.path(), &flags);
    let http = reqwest::Client::new();
    let url = daemon.url.clone();

    let seed = json!({"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "web"}, "spec": {"replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let r = http.post(format!("{url}/apis/apps/v1/namespaces/default/deployments")).json(&seed).send().await.expect("create");
    assert_eq!(r.status().as_u16(), 201);
    let started = Instant::now();
    let ps = wait_for("web-0..2 Running and Ready", async || {
        let ps = pods(&http, &url).await;
        (ps.len() == 3 && ps.iter().all(running_ready)).then_some(ps)
    })
    .await;
    eprintln!("apply -> 3 pods Running and Ready: {:?}", started.elapsed());
    let mut names: Vec<&str> = ps.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["web-0", "web-1", "web-2"]);

    // Real processes behind them, one each.
    let pids = wait_for("a process per pod", async || {
        let pids = container_pids(dir.path());
        (pids.len() == 3 && pids.values().all(|p| alive(*p))).then_some(pids)
    })
    .await;

    // kill -9 one container's process by hand: noticed and restarted within a second.
    let victim = ps.iter().find(|p| p["metadata"]["name"] == "web-1").expect("web-1");
    let uid = victim["metadata"]["uid"].as_str().expect("uid").to_string();
    let old_pid = pids[&uid];
    let killed = Instant::now();
    // SAFETY: kill(2) on a pid this test read from the agent's state; no memory is involved.
    assert_eq!(unsafe { libc::kill(old_pid, libc::SIGKILL) }, 0);
    let restarted = wait_for("web-1 restarted", async || {
        let p = http.get(format!("{url}/api/v1/namespaces/default/pods/web-1")).send().await.ok()?.json::<Value>().await.ok()?;
        let cs = &p["status"]["containerStatuses"][0];
        (cs["restartCount"].as_i64() == Some(1) && cs["state"]["running"].is_object()).then_some(p)
    })
    .await;
    let noticed = killed.elapsed();
    eprintln!("kill -9 of a container -> restarted and Running: {noticed:?}");
    assert!(noticed < Duration::from_secs(1), "took {noticed:?}");
    assert_eq!(restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"], 137);
    let pids = wait_for("the restarted process recorded", async || {
        let pids = container_pids(dir.path());
        (pids.get(&uid).is_some_and(|p| *p != old_pid && alive(*p))).then_some(pids)
    })
    .await;

    // A pod deleted by hand is replaced (the seed waits 10 s before looking).
    let web0 = ps.iter().find(|p| p["metadata"]["name"] == "web-0").and_then(|p| p["metadata"]["uid"].as_str()).expect("web-0").to_string();
    let deleted = Instant::now();
    let r = http.delete(format!("{url}/api/v1/namespaces/default/pods/web-0")).send().await.expect("delete");
    assert!(r.status().is_success());
    wait_for("a Running and Ready replacement", async || {
        let ps = pods(&http, &url).await;
        let live: Vec<&Value> = ps.iter().filter(|p| running_ready(p)).collect();
        (live.len() == 3 && live.iter().all(|p| p["metadata"]["uid"] != web0.as_str())).then_some(())
    })
    .await;
    let replaced = deleted.elapsed();
    eprintln!("delete pod web-0 -> replacement Running and Ready: {replaced:?}");
    assert!(replaced < Duration::from_secs(1), "took {replaced:?}");
    wait_for("web-0's process gone", async || (!alive(pids[&web0])).then_some(())).await;
    let pids = wait_for("three live container processes", async || {
        let live: BTreeMap<String, i32> = container_pids(dir.path()).into_iter().filter(|(_, p)| alive(*p)).collect();
        (live.len() == 3).then_some(live)
    })
    .await;

    // kill -9 the daemon: its containers keep running, and the restarted daemon adopts them.
    daemon.kill9();
    assert!(pids.values().all(|p| alive(*p)), "containers outlive the agent");
    let daemon = Daemon::start("standalone", dir.path(), &flags);
    let url = daemon.url.clone();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: BTreeMap<String, i32> = container_pids(dir.path()).into_iter().filter(|(_, p)| alive(*p)).collect();
    assert_eq!(after, pids, "the same processes, adopted, no duplicates");
    let ps = pods(&http, &url).await;
    assert_eq!(ps.len(), 3);
    assert!(ps.iter().all(running_ready), "{ps:?}");

    // Deleting the Deployment stops every process.
    let r = http.delete(format!("{url}/apis/apps/v1/namespaces/default/deployments/web")).send().await.expect("delete");
    assert!(r.status().is_success());
    wait_for("no pods and no processes", async || {
        let gone = pods(&http, &url).await.is_empty() && pids.values().all(|p| !alive(*p));
        gone.then_some(())
    })
    .await;
}

/// Ctrl-C says what it waits for, and a second one kills the pods at once: the daemon exits within
/// 5 s although its container ignores SIGTERM and has 30 s of grace, and leaves no container
/// process and no mount behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_says_what_it_waits_for_and_a_second_one_kills_the_pods_at_once() {
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut daemon, said) = common::standalone_with_stderr(dir.path(), &["--insecure-loopback", "--runtime", "process"]);
    let url = daemon.url.clone();
    let http = reqwest::Client::new();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stubborn"},
        "spec": {"terminationGracePeriodSeconds": 30, "containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]}]}});
    let r = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod).send().await.expect("create");
    assert_eq!(r.status(), 201);
    wait_for("the pod Running", async || pods(&http, &url).await.iter().any(running_ready).then_some(())).await;
    let pid = wait_for("its process", async || container_pids(dir.path()).values().copied().find(|p| alive(*p))).await;

    let interrupt = || {
        let _ = Command::new("kill").arg("-INT").arg(daemon.child.id().to_string()).status();
    };
    interrupt();
    let line = common::line_starting(&said, "stopping ", Duration::from_secs(10));
    assert_eq!(line, "stopping 1 pod, up to 30 s; Ctrl-C again to kill them now");
    assert!(alive(pid), "the first Ctrl-C gives the container its grace period");
    interrupt();
    let second = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            break status;
        }
        assert!(second.elapsed() < Duration::from_secs(5), "standalone still running 5 s after a second Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("second Ctrl-C -> exited ({status}) in {:?}", second.elapsed());
    assert!(!alive(pid), "the container's process outlived the second Ctrl-C");
    let left = common::mounts_under(dir.path());
    assert!(left.is_empty(), "mounts left under the data dir: {left:#?}");
}

/// Stopped with Ctrl-C and started again on the same data directory, standalone brings its pods
/// back as a node restart does: each container once more restarted, and the log of the one before
/// the stop served as `--previous`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_of_standalone_a_pod_counts_one_more_restart_and_keeps_its_previous_log() {
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["--insecure-loopback", "--runtime", "process"];
    let (mut daemon, _said) = common::standalone_with_stderr(dir.path(), &flags);
    let url = daemon.url.clone();
    let http = reqwest::Client::new();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "diary"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", "echo started; od -An -N8 -tx8 /dev/urandom; exec sleep 3600"]}]}});
    let r = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod).send().await.expect("create");
    assert_eq!(r.status(), 201);
    let log = |url: String, previous: bool| {
        let http = http.clone();
        async move {
            let r = http.get(format!("{url}/api/v1/namespaces/default/pods/diary/log?previous={previous}")).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            Some(r.text().await.ok()?).filter(|t| t.starts_with("started\n") && t.lines().count() == 2)
        }
    };
    let first = wait_for("the first log line", async || log(url.clone(), false).await).await;
    let _ = Command::new("kill").arg("-INT").arg(daemon.child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.child.try_wait().ok().flatten().is_none() {
        assert!(Instant::now() < deadline, "standalone did not stop within 20 s of Ctrl-C");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(daemon);

    let (daemon, _said) = common::standalone_with_stderr(dir.path(), &flags);
    let url = daemon.url.clone();
    let restarted = wait_for("the pod Running again", async || {
        pods(&http, &url).await.into_iter().find(|p| running_ready(p) && p["status"]["containerStatuses"][0]["restartCount"] == 1)
    })
    .await;
    assert!(restarted["status"]["containerStatuses"][0]["lastState"]["terminated"].is_object(), "{}", restarted["status"]);
    let previous = wait_for("the previous log", async || log(url.clone(), true).await).await;
    assert_eq!(previous, first, "--previous is the log from before the restart");
    let current = wait_for("the new log", async || log(url.clone(), false).await).await;
    assert_ne!(current, first, "a new instance (other random bytes) writes the current log");
}
