//! Scenario `pod-io`: what a user of `kubectl` waits for when working with a running pod on
//! `shepherd standalone` (process runtime): `kubectl exec -- true` round trips, `kubectl cp`
//! throughput both ways, `kubectl port-forward` throughput, and how long a ConfigMap change takes
//! to reach the file the pod reads. Needs root (volumes), kubectl and busybox on PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

const PODS: &str = "/api/v1/namespaces/default/pods";
const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

/// Sizes of one run.
pub struct Params {
    pub exec_runs: usize,
    pub cp_mib: usize,
    pub forward_mib: usize,
    pub config_changes: usize,
}

impl Params {
    pub fn smoke() -> Self {
        Params { exec_runs: 5, cp_mib: 4, forward_mib: 4, config_changes: 3 }
    }
}

fn kubectl(url: &str) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--server").arg(url).env("KUBECONFIG", "/dev/null");
    cmd
}

/// Runs kubectl to completion; its wall time.
fn timed(url: &str, args: &[&str]) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let out = kubectl(url).args(args).stdin(Stdio::null()).output()?;
    let took = start.elapsed();
    anyhow::ensure!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(took)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn mib_per_second(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / 1048576.0 / took.as_secs_f64().max(1e-9)
}

async fn wait_running(http: &reqwest::Client, url: &str, name: &str) -> anyhow::Result<Value> {
    let start = Instant::now();
    loop {
        let pod: Value = http.get(format!("{url}{PODS}/{name}")).send().await?.json().await?;
        if pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running") {
            return Ok(pod);
        }
        anyhow::ensure!(start.elapsed() < Duration::from_secs(60), "pod {name} did not run: {}", pod["status"]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `kubectl port-forward` to `port` of the pod; downloads `/blob` through it.
async fn forward_download(url: &str, port: u16, expect: u64) -> anyhow::Result<Duration> {
    let local = free_port()?;
    let mut child = tokio::process::Command::new("kubectl")
        .args(["--server", url, "port-forward", "pod/io", &format!("{local}:{port}")])
        .env("KUBECONFIG", "/dev/null")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("Forwarding from") {
                return Ok::<_, std::io::Error>(true);
            }
        }
        Ok(false)
    });
    anyhow::ensure!(matches!(ready.await, Ok(Ok(true))), "kubectl port-forward did not start");
    let start = Instant::now();
    let mut body = reqwest::get(format!("http://127.0.0.1:{local}/blob")).await?;
    let mut got = 0u64;
    while let Some(chunk) = body.chunk().await? {
        got += chunk.len() as u64;
    }
    let took = start.elapsed();
    let _ = child.kill().await;
    anyhow::ensure!(got == expect, "port-forward delivered {got} bytes of {expect}");
    Ok(took)
}

/// The ConfigMap volume's file as the pod sees it: the agent's volume directory, which the
/// container has bind-mounted.
fn config_file(data: &Path, uid: &str) -> PathBuf {
    data.join("agent/pods").join(uid).join("volumes/kubernetes.io~configmap/conf/v")
}

pub async fn run(binary: &Path, p: Params) -> anyhow::Result<ScenarioResult> {
    println!(
        "scenario pod-io: standalone, process runtime; {} execs, cp of {} MiB, port-forward of {} MiB, {} ConfigMap changes",
        p.exec_runs, p.cp_mib, p.forward_mib, p.config_changes
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let data_arg = data.to_string_lossy().to_string();
    let server = Process::start(binary, &["standalone", "--data-dir", &data_arg, "--runtime", "process", "--pod-network", "host"])?;
    let url = server.url.clone();
    let http = reqwest::Client::new();

    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bench-conf"}, "data": {"v": "0"}});
    let r = http.post(format!("{url}{CONFIGMAPS}")).json(&cm).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the ConfigMap: {}", r.status());
    let port = free_port()?;
    let script = format!(
        "dd if=/dev/zero of=/srv/blob bs=1048576 count={} 2>/dev/null; exec busybox httpd -f -p 127.0.0.1:{port} -h /srv",
        p.forward_mib
    );
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "io"}, "spec": {
        "containers": [{"name": "app", "image": "busybox", "command": ["sh", "-c", script],
            "volumeMounts": [{"name": "scratch", "mountPath": "/srv"}, {"name": "conf", "mountPath": "/mnt"}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "conf", "configMap": {"name": "bench-conf"}}]}});
    let r = http.post(format!("{url}{PODS}")).json(&pod).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the pod: {}", r.status());
    let pod = wait_running(&http, &url, "io").await?;
    let uid = pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string();

    // kubectl exec -- true, whole round trip as a user waits for it (kubectl's own start included).
    timed(&url, &["exec", "io", "--", "true"])?;
    let mut execs = Vec::with_capacity(p.exec_runs);
    for _ in 0..p.exec_runs {
        execs.push(timed(&url, &["exec", "io", "--", "true"])?);
    }
    let exec = summarize(&execs);
    println!("kubectl exec -- true: {exec}");
    // The part of that which is kubectl itself and one API read: `kubectl get pod`.
    let mut gets = Vec::with_capacity(p.exec_runs);
    for _ in 0..p.exec_runs {
        gets.push(timed(&url, &["get", "pod", "io", "-o", "name"])?);
    }
    let get = summarize(&gets);
    println!("kubectl get pod (baseline: kubectl's start and one read): {get}");

    // kubectl cp both ways (tar in the container on the other end).
    let bytes = (p.cp_mib as u64) << 20;
    let local = dir.path().join("upload");
    std::fs::write(&local, (0..bytes).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>())?;
    let up = timed(&url, &["cp", &local.to_string_lossy(), "io:/srv/upload"])?;
    let back = dir.path().join("download");
    let down = timed(&url, &["cp", "io:/srv/upload", &back.to_string_lossy()])?;
    anyhow::ensure!(std::fs::read(&back)? == std::fs::read(&local)?, "kubectl cp did not round-trip the file");
    let (cp_up, cp_down) = (mib_per_second(bytes, up), mib_per_second(bytes, down));
    println!("kubectl cp of {} MiB: into the pod {cp_up:.1} MiB/s, out of it {cp_down:.1} MiB/s", p.cp_mib);

    let forward_bytes = (p.forward_mib as u64) << 20;
    let took = forward_download(&url, port, forward_bytes).await?;
    let forward = mib_per_second(forward_bytes, took);
    println!("kubectl port-forward, download of {} MiB: {forward:.1} MiB/s", p.forward_mib);

    // ConfigMap change -> the file the pod reads holds the new value.
    let file = config_file(&data, &uid);
    let mut changes = Vec::with_capacity(p.config_changes);
    for i in 1..=p.config_changes {
        let value = i.to_string();
        let start = Instant::now();
        let r = http
            .patch(format!("{url}{CONFIGMAPS}/bench-conf"))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"data": {"v": value}}).to_string())
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "changing the ConfigMap: {}", r.status());
        while std::fs::read_to_string(&file).unwrap_or_default() != value {
            anyhow::ensure!(start.elapsed() < Duration::from_secs(60), "{} never showed {value}", file.display());
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        changes.push(start.elapsed());
    }
    let config = summarize(&changes);
    println!("ConfigMap change to file in pod: {config}");

    // Containers outlive a killed agent by design: stop this one before the server goes.
    let _ = http.delete(format!("{url}{PODS}/io?gracePeriodSeconds=0")).send().await;
    let start = Instant::now();
    while http.get(format!("{url}{PODS}/io")).send().await?.status() != reqwest::StatusCode::NOT_FOUND {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(60), "the pod was not removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(ScenarioResult {
        name: "pod-io",
        params: json!({"exec_runs": p.exec_runs, "cp_mib": p.cp_mib, "forward_mib": p.forward_mib,
            "config_changes": p.config_changes}),
        values: json!({"exec_true": exec, "get_pod_baseline": get, "cp_into_pod_mib_s": cp_up, "cp_out_of_pod_mib_s": cp_down,
            "port_forward_mib_s": forward, "configmap_to_file": config}),
    })
}
