//! The process runtime against a real in-process API server: real processes, checked in /proc.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use shepherd_agent::LogQuery;
use shepherd_api::kinds;
use shepherd_runtime::DeleteParams;
use support::*;

/// A shell loop that exits promptly on SIGTERM (it runs as PID 1 of its namespace).
const LOOP: &str = "trap 'exit 0' TERM; while :; do sleep 0.1; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimal_pod_runs_a_real_isolated_process_and_reports_running_and_ready() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let created = Instant::now();
    create(&client, pod("web-0", "node-1", json!({"containers": [{"name": "web", "image": "minimal"}]}))).await;
    let p = wait_pod(&client, "web-0", Duration::from_secs(10), running_and_ready).await;
    println!("pod create -> Running and Ready: {:?}", created.elapsed());

    let cs = container_status(&p);
    assert_eq!(cs["name"], "web");
    assert_eq!(cs["image"], "minimal");
    assert_eq!(cs["ready"], true);
    assert_eq!(cs["started"], true);
    assert_eq!(cs["restartCount"], 0);
    assert!(cs["state"]["running"]["startedAt"].is_string(), "{cs}");
    for c in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&p, c), "True", "condition {c}");
    }
    assert_eq!(p["status"]["podIP"], "127.0.0.1");
    assert_eq!(p["status"]["hostIP"], "127.0.0.1");
    assert!(p["status"]["startTime"].is_string());

    let pid = main_pid(dir.path(), &p, "web").expect("the agent recorded the container's pid");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "the container process runs");
    // The idle program as `ps` and an exec into the container see it: `shepherd-shim pause`, the
    // container's environment, and no descriptor beyond stdin, stdout and stderr.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
    assert_eq!(args.len(), 2, "{:?}", String::from_utf8_lossy(&cmdline));
    assert!(args[0].ends_with(b"/shepherd-shim") && args[1] == b"pause", "{:?}", String::from_utf8_lossy(&cmdline));
    let environ = String::from_utf8(std::fs::read(format!("/proc/{pid}/environ")).expect("environ")).expect("utf-8");
    let environ: Vec<&str> = environ.split('\0').filter(|v| !v.is_empty()).collect();
    assert!(environ.contains(&"HOSTNAME=web-0") && environ.iter().any(|v| v.starts_with("PATH=/")), "{environ:?}");
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"]);
    // Containers start at the lowest priority, then run at the agent's, as does their shim; the
    // agent's threads that spawned them are back at theirs.
    let own = stat_field("self", NICE);
    assert_eq!(stat_field(&pid.to_string(), NICE), own, "the container runs at the agent's priority");
    let shim = stat_field(&pid.to_string(), PPID);
    assert_eq!(stat_field(&shim, NICE), own, "its shim runs at the agent's priority");
    for task in std::fs::read_dir("/proc/self/task").expect("tasks").filter_map(Result::ok) {
        let tid = task.file_name().into_string().expect("a tid");
        assert_eq!(stat_field(&format!("self/task/{tid}"), NICE), own, "thread {tid} of the agent");
    }
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    if unsafe_is_root() {
        assert_ne!(ns(&pid.to_string()), ns("self"), "the container has its own PID namespace");
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/uts")).ok(),
            std::fs::read_link("/proc/self/ns/uts").ok(),
            "and its own UTS namespace"
        );
    }

    client
        .delete(&kinds::POD, Some("default"), "web-0", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let gone = wait_until(Duration::from_secs(5), || !std::path::Path::new(&format!("/proc/{pid}")).exists()).await;
    assert!(gone, "the process stops when its pod is deleted");
    agent.finish(&client).await;
}

/// Fields of proc(5)'s `/proc/PID/stat`, counted from 1.
const PPID: usize = 4;
const NICE: usize = 19;

/// Field `n` of `/proc/{pid}/stat`.
fn stat_field(pid: &str, n: usize) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(')').expect("stat has a command in parentheses");
    // pid and comm come before `rest`.
    rest.split_whitespace().nth(n - 3).expect("stat has the field").to_string()
}

fn unsafe_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_exiting_non_zero_restarts_with_back_off_and_shows_crash_loop_back_off() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    create(&client, pod("crash", "node-1", json!({"containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "exit 3"]}]})))
        .await;
    let p = wait_pod(&client, "crash", Duration::from_secs(10), |p| {
        container_status(p)["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    })
    .await;
    let cs = container_status(&p);
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{cs}");
    assert_eq!(cs["lastState"]["terminated"]["reason"], "Error");
    assert_eq!(cs["ready"], false);
    assert_eq!(condition(&p, "Ready"), "False");
    let p = wait_pod(&client, "crash", Duration::from_secs(10), |p| container_status(p)["restartCount"].as_u64() >= Some(3)).await;
    assert_eq!(p["status"]["phase"], "Running", "a crash-looping pod stays Running");
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_restart_policy_never_a_failed_container_leaves_the_pod_failed() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let spec = json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "echo bye; exit 1"]}]});
    create(&client, pod("once", "node-1", spec)).await;
    let p = wait_pod(&client, "once", Duration::from_secs(10), |p| p["status"]["phase"] == "Failed").await;
    let cs = container_status(&p);
    assert_eq!(cs["state"]["terminated"]["exitCode"], 1, "{cs}");
    assert_eq!(cs["restartCount"], 0);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let p = get(&client, "once").await.expect("pod stays");
    assert_eq!(container_status(&p)["restartCount"], 0, "never restarted");

    let mut logs = agent.logs.logs("default", "once", &LogQuery::default()).await.expect("logs");
    let text = futures::StreamExt::next(&mut logs).await.expect("some output").expect("readable");
    assert_eq!(&text[..], b"bye\n");
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_by_hand_is_noticed_within_a_second_and_restarted() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config("node-1", dir.path());
    cfg.restart_backoff_initial = Duration::from_millis(100);
    let agent = RunningAgent::start(client.clone(), cfg).await;
    let spec = json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", LOOP]}]});
    create(&client, pod("victim", "node-1", spec)).await;
    let p = wait_pod(&client, "victim", Duration::from_secs(10), running_and_ready).await;
    let pid = main_pid(dir.path(), &p, "c").expect("pid recorded");
    let killed = Instant::now();
    // SAFETY: sending a signal to a process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let p = wait_pod(&client, "victim", Duration::from_secs(1), |p| container_status(p)["restartCount"] == 1).await;
    println!("kill -9 -> noticed and restarted: {:?}", killed.elapsed());
    assert_eq!(container_status(&p)["lastState"]["terminated"]["exitCode"], 137);
    let p = wait_pod(&client, "victim", Duration::from_secs(5), running_and_ready).await;
    let new_pid = main_pid(dir.path(), &p, "c").expect("pid recorded");
    assert_ne!(new_pid, pid);
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_restarts_the_container() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let spec = json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", LOOP],
        "livenessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 2}}]});
    create(&client, pod("sick", "node-1", spec)).await;
    let p = wait_pod(&client, "sick", Duration::from_secs(15), |p| container_status(p)["restartCount"].as_u64() >= Some(1)).await;
    assert!(container_status(&p)["lastState"]["terminated"].is_object(), "{}", p["status"]);
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_readiness_probe_turns_the_pod_not_ready_without_restarting_it() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let flag = dir.path().join("ready");
    std::fs::write(&flag, "").expect("flag");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let spec = json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", LOOP],
        "readinessProbe": {"exec": {"command": ["test", "-f", flag.to_string_lossy()]}, "periodSeconds": 1, "failureThreshold": 1}}]});
    create(&client, pod("flaky", "node-1", spec)).await;
    wait_pod(&client, "flaky", Duration::from_secs(10), running_and_ready).await;
    std::fs::remove_file(&flag).expect("remove flag");
    let p = wait_pod(&client, "flaky", Duration::from_secs(5), |p| condition(p, "Ready") == "False").await;
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(container_status(&p)["restartCount"], 0);
    assert_eq!(container_status(&p)["ready"], false);
    std::fs::write(&flag, "").expect("flag");
    wait_pod(&client, "flaky", Duration::from_secs(5), running_and_ready).await;
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_the_memory_limit_is_reported_as_oom_killed() {
    if let Some(why) = shepherd_agent::memory_limits_unavailable() {
        println!("skipped: {why}");
        return;
    }
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    // `tail` keeps a line in memory until it ends, and /dev/zero has no newline.
    let spec = json!({"restartPolicy": "Never", "containers": [{"name": "hog", "image": "busybox",
        "command": ["sh", "-c", "head -c 512m /dev/zero | tail"], "resources": {"limits": {"memory": "32Mi"}}}]});
    create(&client, pod("hog", "node-1", spec)).await;
    let p = wait_pod(&client, "hog", Duration::from_secs(30), |p| p["status"]["phase"] == "Failed").await;
    let t = &container_status(&p)["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{t}");
    assert_eq!(t["exitCode"], 137);
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_its_containers_without_duplicates_and_stops_orphans() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (keep, orphan) = (unique("keep"), unique("orphan"));
    let spec = |marker: &str| {
        json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", LOOP], "env": [{"name": "MARKER", "value": marker}]}]})
    };
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    create(&client, pod("keep", "node-1", spec(&keep))).await;
    create(&client, pod("orphan", "node-1", spec(&orphan))).await;
    let p = wait_pod(&client, "keep", Duration::from_secs(10), running_and_ready).await;
    wait_pod(&client, "orphan", Duration::from_secs(10), running_and_ready).await;
    let pid = main_pid(dir.path(), &p, "c").expect("pid");

    // The agent goes away without stopping anything, as after kill -9.
    agent.stop().await;
    assert!(!pids_with_marker(&keep).is_empty(), "containers outlive the agent");
    // While it is away, one pod is removed for good.
    let force = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    client.delete(&kinds::POD, Some("default"), "orphan", &force).await.expect("force delete");

    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let orphans_gone = wait_until(Duration::from_secs(15), || pids_with_marker(&orphan).is_empty()).await;
    assert!(orphans_gone, "processes of a pod that no longer exists are stopped");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = wait_pod(&client, "keep", Duration::from_secs(5), running_and_ready).await;
    assert_eq!(main_pid(dir.path(), &p, "c"), Some(pid), "the same process, adopted");
    assert_eq!(container_status(&p)["restartCount"], 0, "not restarted");
    let shells: Vec<u32> = pids_with_marker(&keep)
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sh"))
        .collect();
    assert_eq!(shells, vec![pid as u32], "exactly one container process, no duplicate");

    // The adopted container is still managed: deleting its pod stops it.
    client.delete(&kinds::POD, Some("default"), "keep", &DeleteParams::default()).await.expect("delete");
    let stopped = wait_until(Duration::from_secs(15), || pids_with_marker(&keep).is_empty()).await;
    assert!(stopped, "the adopted container is stopped when its pod is deleted");
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_sends_sigterm_then_sigkill_after_the_grace_period_then_removes_the_pod() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let stubborn = unique("stubborn");
    let term_seen = dir.path().join("term-seen");
    let script = format!("trap 'touch {}' TERM; while :; do sleep 0.1; done", term_seen.display());
    let spec = json!({"terminationGracePeriodSeconds": 2, "containers": [{"name": "c", "image": "busybox",
        "command": ["sh", "-c", script], "env": [{"name": "MARKER", "value": stubborn}]}]});
    create(&client, pod("stubborn", "node-1", spec)).await;
    wait_pod(&client, "stubborn", Duration::from_secs(10), running_and_ready).await;

    let asked = Instant::now();
    client.delete(&kinds::POD, Some("default"), "stubborn", &DeleteParams::default()).await.expect("delete");
    assert!(wait_until(Duration::from_secs(2), || term_seen.exists()).await, "SIGTERM delivered");
    assert!(get(&client, "stubborn").await.is_some(), "the pod stays while its container runs");
    let removed = {
        let start = Instant::now();
        loop {
            if get(&client, "stubborn").await.is_none() {
                break Some(start.elapsed());
            }
            if start.elapsed() > Duration::from_secs(8) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let waited = asked.elapsed();
    assert!(removed.is_some(), "the pod object is removed after the grace period");
    assert!(waited >= Duration::from_secs(2), "SIGKILL only after the grace period ({waited:?})");
    assert!(pids_with_marker(&stubborn).is_empty(), "no process left");
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failed_by_the_node_lifecycle_controller_is_stopped() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let marker = unique("evicted");
    let spec = json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "busybox",
        "command": ["sh", "-c", LOOP], "env": [{"name": "MARKER", "value": marker}]}]});
    create(&client, pod("evicted", "node-1", spec)).await;
    wait_pod(&client, "evicted", Duration::from_secs(10), running_and_ready).await;
    client
        .patch_status(&kinds::POD, Some("default"), "evicted", shepherd_runtime::Patch::Merge(json!({"status": {"phase": "Failed", "reason": "NodeLost"}})))
        .await
        .expect("phase set");
    assert!(wait_until(Duration::from_secs(5), || pids_with_marker(&marker).is_empty()).await, "its processes stop");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = get(&client, "evicted").await.expect("pod");
    assert_eq!(p["status"]["phase"], "Failed", "the agent does not bring it back");
    assert!(pids_with_marker(&marker).is_empty(), "nor restart it");
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_the_current_and_previous_instance_are_served_with_tail_lines() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let spec = json!({"containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "echo one; echo two; echo three; exit 1"]}]});
    create(&client, pod("chatty", "node-1", spec)).await;
    wait_pod(&client, "chatty", Duration::from_secs(10), |p| container_status(p)["restartCount"].as_u64() >= Some(1)).await;
    let q = LogQuery { tail_lines: Some(2), previous: true, ..Default::default() };
    let mut s = agent.logs.logs("default", "chatty", &q).await.expect("previous logs");
    let text = futures::StreamExt::next(&mut s).await.expect("output").expect("readable");
    assert_eq!(&text[..], b"two\nthree\n");
    let err = agent.logs.logs("default", "chatty", &LogQuery { container: Some("nope".into()), ..Default::default() }).await;
    assert!(err.is_err(), "an unknown container is refused");
    agent.finish(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_security_context_the_process_runtime_cannot_honour_is_refused_by_name() {
    let client = api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(client.clone(), config("node-1", dir.path())).await;
    let spec = json!({"containers": [{"name": "c", "image": "minimal", "securityContext": {"runAsUser": 1000}}]});
    create(&client, pod("nonroot", "node-1", spec)).await;
    let p = wait_pod(&client, "nonroot", Duration::from_secs(10), |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "RunContainerError"
    })
    .await;
    let message = container_status(&p)["state"]["waiting"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("securityContext.runAsUser") && message.contains("--runtime oci"), "{message}");
    // `kubectl describe pod` shows a waiting container's reason only: the cause is in a Warning
    // Event, as kubelet records it.
    let params = shepherd_runtime::ListParams::namespace("default");
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let events = client.list(&kinds::EVENT, &params).await.expect("events");
        let failed = events.items.into_iter().find(|e| e["involvedObject"]["name"] == "nonroot" && e["reason"] == "Failed");
        match failed {
            Some(e) => break e,
            None if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            None => panic!("no Failed Event for the pod"),
        }
    };
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["message"], format!("Error: {message}"));
    agent.finish(&client).await;
}
