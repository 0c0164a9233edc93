//! The per-container shim of the process runtime on a real `shepherd standalone`: the small
//! `shepherd-shim` program rather than a copy of the agent, a fraction of a megabyte each, and
//! still the one that records a container's exit while no agent runs.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

const PODS: &str = "/api/v1/namespaces/default/pods";

/// (shim pid, container main pid) of pod `uid`'s container `c`, from the agent's state file.
fn pids(data_dir: &Path, uid: &str) -> Option<(i32, i32)> {
    let text = std::fs::read_to_string(data_dir.join("agent/containers").join(uid).join("c/state.json")).ok()?;
    let state: Value = serde_json::from_str(&text).ok()?;
    Some((state["shim_pid"].as_i64()? as i32, state["main_pid"].as_i64()? as i32))
}

/// Proportional set size in KiB, from /proc/PID/smaps_rollup.
fn pss_kib(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("Pss:")?.split_whitespace().next()?.parse().ok()).unwrap_or(u64::MAX)
}

fn exe(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(http: &reqwest::Client, url: &str, name: &str) -> Value {
    http.get(format!("{url}{PODS}/{name}")).send().await.expect("get").json().await.expect("json")
}

async fn create(http: &reqwest::Client, url: &str, pod: Value) -> String {
    let r = http.post(format!("{url}{PODS}")).json(&pod).send().await.expect("create");
    assert_eq!(r.status().as_u16(), 201);
    let created: Value = r.json().await.expect("json");
    created["metadata"]["uid"].as_str().expect("uid").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_costs_a_shim_and_an_idle_process_of_under_a_megabyte_pss_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", dir.path(), &[]);
    let (http, url) = (reqwest::Client::new(), daemon.url.clone());
    let mut uids = Vec::new();
    for i in 0..3 {
        let pod = json!({"metadata": {"name": format!("idle-{i}")}, "spec": {"containers": [{"name": "c", "image": "minimal"}]}});
        uids.push(create(&http, &url, pod).await);
    }
    for (i, uid) in uids.iter().enumerate() {
        wait_for("the pod Running", async || (get(&http, &url, &format!("idle-{i}")).await["status"]["phase"] == "Running").then_some(())).await;
        let (shim, main) = wait_for("the container's pids", async || pids(dir.path(), uid)).await;
        assert!(exe(shim).ends_with("/shepherd-shim"), "the shim execs the shim program: {}", exe(shim));
        assert!(exe(main).ends_with("/shepherd-shim"), "an idle `minimal` container runs its pause mode: {}", exe(main));
        let (shim_pss, main_pss) = (pss_kib(shim), pss_kib(main));
        eprintln!("idle-{i}: shim PSS {shim_pss} KiB, idle container PSS {main_pss} KiB");
        assert!(shim_pss < 1024, "shim PSS {shim_pss} KiB");
        assert!(main_pss < 1024, "idle container PSS {main_pss} KiB");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_records_an_exit_while_the_agent_is_down_and_the_next_agent_reports_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start("standalone", dir.path(), &[]);
    let (http, url) = (reqwest::Client::new(), daemon.url.clone());
    let pod = json!({"metadata": {"name": "once"}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "echo started; while :; do sleep 0.1; done"]}]}});
    let uid = create(&http, &url, pod).await;
    wait_for("the pod Running", async || (get(&http, &url, "once").await["status"]["phase"] == "Running").then_some(())).await;
    let (shim, main) = wait_for("the container's pids", async || pids(dir.path(), &uid)).await;

    daemon.kill9();
    assert!(alive(shim) && alive(main), "the shim and its container outlive the agent");
    // SAFETY: kill on a pid read from the agent's state file, alive just above.
    unsafe { libc::kill(main, libc::SIGKILL) };
    wait_for("the shim to end", async || (!alive(shim)).then_some(())).await;
    let exit = std::fs::read_to_string(dir.path().join("agent/containers").join(&uid).join("c/exit")).expect("exit file");
    assert_eq!(exit.trim(), "137", "128 + SIGKILL");

    let daemon = Daemon::start("standalone", dir.path(), &[]);
    let url = daemon.url.clone();
    let p = wait_for("the pod Failed", async || Some(get(&http, &url, "once").await).filter(|p| p["status"]["phase"] == "Failed")).await;
    let terminated = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 137, "{p}");
    let logs = http.get(format!("{url}{PODS}/once/log")).send().await.expect("logs").text().await.expect("text");
    assert!(logs.contains("started"), "the shim logged the container's output: {logs:?}");
}
