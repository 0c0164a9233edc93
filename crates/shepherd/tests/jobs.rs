//! Jobs and CronJobs end to end: real pods running `sh -c` on the process runtime, the daemon killed
//! and restarted mid-run, and kubectl's `create job|cronjob` and tables.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, free_port, kubectl_command, kubectls_under_test, run_with_stdin};
use serde_json::{Value, json};

const JOBS: &str = "/apis/batch/v1/namespaces/default/jobs";
const CRONJOBS: &str = "/apis/batch/v1/namespaces/default/cronjobs";

async fn get(http: &reqwest::Client, url: &str) -> Option<Value> {
    let r = http.get(url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn wait_for<T>(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition(job: &Value, kind: &str) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

async fn wait_complete(http: &reqwest::Client, url: &str, name: &str, limit: Duration) -> Value {
    wait_for(&format!("Job {name} to complete"), limit, async || {
        let job = get(http, &format!("{url}{JOBS}/{name}")).await?;
        assert!(!condition(&job, "Failed"), "Job {name} failed: {}", job["status"]);
        condition(&job, "Complete").then_some(job)
    })
    .await
}

fn job(name: &str, spec: Value, script: &str) -> Value {
    let mut spec = spec;
    spec["template"] = json!({"spec": {"restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}});
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
}

async fn create(http: &reqwest::Client, url: &str, path: &str, obj: &Value) -> reqwest::Response {
    http.post(format!("{url}{path}")).json(obj).send().await.expect("request")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_first_pods_fail_backs_off_and_completes_with_exactly_five_successes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("work dir");
    let daemon = Daemon::start("standalone", dir.path(), &["--in-memory", "--job-backoff-seconds", "1"]);
    let http = reqwest::Client::new();
    // Each run leaves a file; the first two runs see at most two files and fail.
    let script = format!("mktemp {0}/run.XXXXXX >/dev/null; [ $(ls {0} | wc -l) -gt 2 ]", work.path().display());
    let r = create(&http, &daemon.url, JOBS, &job("flaky", json!({"completions": 5, "parallelism": 2}), &script)).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());

    let done = wait_complete(&http, &daemon.url, "flaky", Duration::from_secs(120)).await;
    assert_eq!((done["status"]["succeeded"].as_i64(), done["status"]["failed"].as_i64()), (Some(5), Some(2)), "{}", done["status"]);
    assert_eq!(std::fs::read_dir(work.path()).map(Iterator::count).unwrap_or(0), 7, "no pod ran beyond five successes");

    let events = get(&http, &format!("{}/api/v1/namespaces/default/events", daemon.url)).await.expect("events");
    let of_job: Vec<&Value> = events["items"].as_array().into_iter().flatten()
        .filter(|e| e["involvedObject"]["name"] == "flaky" && e["involvedObject"]["kind"] == "Job").collect();
    let creates = of_job.iter().filter(|e| e["reason"] == "SuccessfulCreate").count();
    assert_eq!(creates, 7, "one SuccessfulCreate per pod");
    assert!(of_job.iter().any(|e| e["reason"] == "Completed"));

    // The back-off: the first pod after the two failures was created at least 2 s (1 s doubled)
    // after the later failure ended, to the second (timestamps have whole seconds).
    let pods = get(&http, &format!("{}/api/v1/namespaces/default/pods", daemon.url)).await.expect("pods");
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let time = |v: &Value| v.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let last_failure = items.iter().filter(|p| p["status"]["phase"] == "Failed")
        .filter_map(|p| time(&p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])).max().expect("failures");
    let first_after = items.iter().filter(|p| p["status"]["phase"] == "Succeeded")
        .filter_map(|p| time(&p["metadata"]["creationTimestamp"])).min().expect("a pod after the failures");
    assert!(first_after.as_second() - last_failure.as_second() >= 1, "no back-off: {last_failure} then {first_after}");

    // kubectl's STATUS column, as a Kubernetes user reads a finished Job's pods: Completed for
    // those that succeeded, Error for those that failed.
    for (version, bin) in kubectls_under_test() {
        let (status, out, err) = run_with_stdin(kubectl_command(&bin, &daemon.url).args(["get", "pods", "-l", "job-name=flaky"]), None);
        assert!(status.success(), "kubectl {version} get pods: {err}");
        let column = |word: &str| out.lines().filter(|l| l.split_whitespace().nth(2) == Some(word)).count();
        assert_eq!((column("Completed"), column("Error")), (5, 2), "kubectl {version}:\n{out}");
    }
    // `sheepctl logs job/flaky`: one of the Job's pods, named on stderr as kubectl does.
    let sheepctl = Path::new(env!("CARGO_BIN_EXE_shepherd")).with_file_name("sheepctl");
    let (status, _, err) = run_with_stdin(std::process::Command::new(&sheepctl).args(["--server", &daemon.url, "logs", "job/flaky"]), None);
    assert!(status.success(), "sheepctl logs job/flaky: {err}");
    assert!(err.starts_with("Found 7 pods, using pod/flaky-"), "{err}");
    let (status, _, err) = run_with_stdin(std::process::Command::new(&sheepctl).args(["--server", &daemon.url, "logs", "job/nothing"]), None);
    assert!(!status.success() && err.contains("\"nothing\" not found"), "{err}");
    drop(daemon);
}


/// `shepherd server` over `dir` at a fixed address, so that its agent finds it again after a restart.
fn server_at(dir: &Path, listen: &str) -> Daemon {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--insecure-loopback", "--listen", listen, "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start shepherd server");
    Daemon::from_child(child)
}

/// A node agent process over `data_dir`; dropping it kills it and the containers it left.
struct Agent {
    child: std::process::Child,
    cmdline: Vec<u8>,
    data_dir: std::path::PathBuf,
}

impl Agent {
    fn start(server: &str, node: &str, data_dir: &Path) -> Agent {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["agent", "--server", server, "--node-name", node, "--data-dir"])
            .arg(data_dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start agent");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
        Agent { child, cmdline, data_dir: data_dir.to_path_buf() }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        common::kill_leftovers(&self.cmdline, Some(&self.data_dir));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_job_runs_each_index_once_across_a_control_plane_kill_and_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent_dir = tempfile::tempdir().expect("agent dir");
    let work = tempfile::tempdir().expect("work dir");
    let out = work.path().join("indexes");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut server = server_at(dir.path(), &listen);
    let agent = Agent::start(&server.url, "n1", agent_dir.path());
    let http = reqwest::Client::new();
    // An index is written only as the pod's last act, so a line means that index succeeded.
    let script = format!("sleep 1; echo $JOB_COMPLETION_INDEX $(hostname) >> {}", out.display());
    let spec = json!({"completions": 5, "parallelism": 2, "completionMode": "Indexed"});
    let r = create(&http, &server.url, JOBS, &job("sq", spec, &script)).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());

    wait_for("two indexes to succeed", Duration::from_secs(60), async || (lines(&out).len() >= 2).then_some(())).await;
    server.kill9();
    let restarted = server_at(dir.path(), &listen);
    let done = wait_complete(&http, &restarted.url, "sq", Duration::from_secs(120)).await;
    assert_eq!(done["status"]["completedIndexes"], "0-4");
    assert_eq!(done["status"]["succeeded"], 5);
    let mut seen = lines(&out);
    seen.sort();
    let expected: Vec<String> = (0..5).map(|i| format!("{i} sq-{i}")).collect();
    assert_eq!(seen, expected, "each index ran to success exactly once, with its hostname");
    drop(agent);
    drop(restarted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_jobs_and_cronjobs_and_a_cronjob_runs_within_a_minute() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", dir.path(), &["--in-memory"]);
    let http = reqwest::Client::new();
    let kubectl = |bin: &Path, args: &[&str]| run_with_stdin(kubectl_command(bin, &daemon.url).args(args), None);

    let r = create(&http, &daemon.url, CRONJOBS, &json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}}}}}})).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());

    for (version, bin) in kubectls_under_test() {
        let name = format!("once-{}", version.replace('.', "-"));
        let (status, _, err) = kubectl(&bin, &["create", "job", &name, "--image=busybox", "--", "sh", "-c", "exit 0"]);
        assert!(status.success(), "kubectl {version} create job: {err}");
        wait_complete(&http, &daemon.url, &name, Duration::from_secs(60)).await;
        let (status, out, err) = kubectl(&bin, &["get", "jobs", &name]);
        assert!(status.success(), "{err}");
        let header: Vec<&str> = out.lines().next().unwrap_or("").split_whitespace().collect();
        assert!(header.contains(&"COMPLETIONS") && header.contains(&"DURATION"), "kubectl {version}: {out}");
        assert!(out.contains("1/1"), "kubectl {version}: {out}");

        let manual = format!("manual-{}", version.replace('.', "-"));
        let (status, _, err) = kubectl(&bin, &["create", "job", &manual, "--from=cronjob/tick"]);
        assert!(status.success(), "kubectl {version} create job --from: {err}");
        wait_complete(&http, &daemon.url, &manual, Duration::from_secs(60)).await;

        let cron = format!("hourly-{}", version.replace('.', "-"));
        let (status, _, err) = kubectl(&bin, &["create", "cronjob", &cron, "--image=busybox", "--schedule=@hourly", "--", "true"]);
        assert!(status.success(), "kubectl {version} create cronjob: {err}");
        let (status, out, _) = kubectl(&bin, &["get", "cronjobs", &cron]);
        assert!(status.success() && out.contains("@hourly"), "kubectl {version}: {out}");

        let (status, _, err) = kubectl(&bin, &["create", "cronjob", "bad", "--image=busybox", "--schedule=61 * * * *", "--", "true"]);
        assert!(!status.success() && err.contains("spec.schedule") && err.contains("61"), "kubectl {version}: {err}");
    }

    let bad = create(&http, &daemon.url, JOBS, &job("negative", json!({"completions": -1}), "true")).await;
    assert_eq!(bad.status(), 422);
    let body: Value = bad.json().await.expect("a Status");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.completions", "{body}");

    // The schedule fires at the next minute boundary; its Job, named after that minute, completes.
    let scheduled = wait_for("the CronJob's first scheduled run", Duration::from_secs(90), async || {
        let cj = get(&http, &format!("{}{CRONJOBS}/tick", daemon.url)).await?;
        cj["status"]["lastScheduleTime"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok())
    })
    .await;
    let name = format!("tick-{}", scheduled.as_second() / 60);
    let run = wait_complete(&http, &daemon.url, &name, Duration::from_secs(60)).await;
    assert_eq!(run["metadata"]["ownerReferences"][0]["name"], "tick");
    drop(daemon);
}
