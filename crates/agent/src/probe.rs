//! Readiness and liveness probes (exec, httpGet, tcpSocket), each a task per container instance.
//!
//! Exec probes run on the host with the container's environment and working directory (the
//! process runtime shares the host's filesystem and network), or inside the container through
//! the runtime's exec command (the oci runtime's `runc exec`); httpGet and tcpSocket probes
//! connect to the pod IP, which is the node's address.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::runtime::ContainerId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    Readiness,
    Liveness,
}

#[derive(Debug, Clone)]
pub(crate) enum ProbeOutcome {
    /// Readiness changed.
    Ready(bool),
    /// Liveness failed `failureThreshold` times in a row; the container must be restarted.
    LivenessFailed(String),
}

#[derive(Debug, Clone)]
pub(crate) struct ProbeEvent {
    pub id: ContainerId,
    pub instance: u64,
    pub outcome: ProbeOutcome,
}

/// What a probe checks.
#[derive(Debug, Clone)]
enum Handler {
    Exec { command: Vec<String> },
    Http { url: String, headers: Vec<(String, String)> },
    Tcp { addr: String },
    Unsupported(String),
}

#[derive(Debug, Clone)]
struct Timing {
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

fn seconds(probe: &Value, field: &str, default: u64, min: u64) -> Duration {
    Duration::from_secs(probe.get(field).and_then(Value::as_u64).unwrap_or(default).max(min))
}

fn count(probe: &Value, field: &str, default: u64) -> u32 {
    probe.get(field).and_then(Value::as_u64).unwrap_or(default).clamp(1, u32::MAX as u64) as u32
}

/// A port given as a number or as the name of one of the container's ports.
fn port(v: Option<&Value>, container: &Value) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64(),
        Value::String(name) => container.get("ports")?.as_array()?.iter().find_map(|p| {
            (p.get("name")?.as_str()? == name).then(|| p.get("containerPort")?.as_u64()).flatten()
        }),
        _ => None,
    }
}

fn handler(probe: &Value, container: &Value, pod_ip: &str) -> Handler {
    if let Some(exec) = probe.get("exec") {
        let command: Vec<String> = exec
            .get("command")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        return Handler::Exec { command };
    }
    if let Some(http) = probe.get("httpGet") {
        let Some(p) = port(http.get("port"), container) else {
            return Handler::Unsupported("httpGet port does not name a container port".into());
        };
        if http.get("scheme").and_then(Value::as_str).is_some_and(|s| s != "HTTP") {
            return Handler::Unsupported("only HTTP is supported for httpGet probes".into());
        }
        let host = http.get("host").and_then(Value::as_str).unwrap_or(pod_ip);
        let path = http.get("path").and_then(Value::as_str).unwrap_or("/");
        let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
        let headers = http
            .get("httpHeaders")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|h| Some((h.get("name")?.as_str()?.to_string(), h.get("value")?.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        return Handler::Http { url: format!("http://{host}:{p}{path}"), headers };
    }
    if let Some(tcp) = probe.get("tcpSocket") {
        let Some(p) = port(tcp.get("port"), container) else {
            return Handler::Unsupported("tcpSocket port does not name a container port".into());
        };
        let host = tcp.get("host").and_then(Value::as_str).unwrap_or(pod_ip);
        return Handler::Tcp { addr: format!("{host}:{p}") };
    }
    Handler::Unsupported("probe without an exec, httpGet or tcpSocket handler".into())
}

fn http_client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| reqwest::Client::builder().no_proxy().build().unwrap_or_default())
}

/// Runs one probe once: `Ok` on success, `Err` with the reason otherwise.
async fn check(h: &Handler, timeout: Duration, env: &[(String, String)], working_dir: Option<&str>) -> Result<(), String> {
    let attempt = async {
        match h {
            Handler::Exec { command } => {
                let Some((program, args)) = command.split_first() else { return Err("empty exec command".to_string()) };
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args).envs(env.iter().cloned()).kill_on_drop(true);
                cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
                if let Some(wd) = working_dir {
                    cmd.current_dir(wd);
                }
                match cmd.status().await {
                    Ok(s) if s.success() => Ok(()),
                    Ok(s) => Err(format!("command {command:?} exited with {s}")),
                    Err(e) => Err(format!("command {command:?} could not run: {e}")),
                }
            }
            Handler::Http { url, headers } => {
                let mut req = http_client().get(url);
                for (k, v) in headers {
                    req = req.header(k, v);
                }
                match req.send().await {
                    Ok(r) if (200..400).contains(&r.status().as_u16()) => Ok(()),
                    Ok(r) => Err(format!("HTTP probe {url} returned {}", r.status())),
                    Err(e) => Err(format!("HTTP probe {url} failed: {e}")),
                }
            }
            Handler::Tcp { addr } => tokio::net::TcpStream::connect(addr.as_str())
                .await
                .map(|_| ())
                .map_err(|e| format!("TCP probe {addr} failed: {e}")),
            Handler::Unsupported(why) => Err(why.clone()),
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("probe timed out after {timeout:?}")),
    }
}

/// Starts probing one container instance; abort the returned handle when the instance ends.
/// `exec_prefix` runs exec handlers inside the container (see `Runtime::exec_prefix`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn(
    kind: ProbeKind,
    probe: &Value,
    container: &Value,
    pod_ip: &str,
    id: ContainerId,
    instance: u64,
    events: mpsc::UnboundedSender<ProbeEvent>,
    exec_prefix: Option<Vec<String>>,
) -> AbortHandle {
    let timing = Timing {
        initial_delay: seconds(probe, "initialDelaySeconds", 0, 0),
        period: seconds(probe, "periodSeconds", 10, 1),
        timeout: seconds(probe, "timeoutSeconds", 1, 1),
        success_threshold: count(probe, "successThreshold", 1),
        failure_threshold: count(probe, "failureThreshold", 3),
    };
    let h = handler(probe, container, pod_ip);
    let env: Vec<(String, String)> = container
        .get("env")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| Some((e.get("name")?.as_str()?.to_string(), e.get("value")?.as_str().unwrap_or("").to_string())))
                .collect()
        })
        .unwrap_or_default();
    let mut working_dir = container.get("workingDir").and_then(Value::as_str).map(str::to_string);
    let mut env = env;
    let h = match (h, exec_prefix) {
        // Run inside the container, which has its own environment and working directory.
        (Handler::Exec { command }, Some(prefix)) if !command.is_empty() => {
            env.clear();
            working_dir = None;
            Handler::Exec { command: prefix.into_iter().chain(command).collect() }
        }
        (h, _) => h,
    };
    let task = tokio::spawn(async move {
        tokio::time::sleep(timing.initial_delay).await;
        let (mut successes, mut failures) = (0u32, 0u32);
        let mut ready: Option<bool> = None;
        loop {
            let result = check(&h, timing.timeout, &env, working_dir.as_deref()).await;
            match result {
                Ok(()) => {
                    successes += 1;
                    failures = 0;
                }
                Err(why) => {
                    failures += 1;
                    successes = 0;
                    if kind == ProbeKind::Liveness && failures >= timing.failure_threshold {
                        let outcome = ProbeOutcome::LivenessFailed(format!("Liveness probe failed: {why}"));
                        let _ = events.send(ProbeEvent { id, instance, outcome });
                        return;
                    }
                }
            }
            if kind == ProbeKind::Readiness {
                let now = if successes >= timing.success_threshold {
                    Some(true)
                } else if failures >= timing.failure_threshold {
                    Some(false)
                } else {
                    ready
                };
                if now != ready && let Some(r) = now {
                    ready = now;
                    let _ = events.send(ProbeEvent { id: id.clone(), instance, outcome: ProbeOutcome::Ready(r) });
                }
            }
            tokio::time::sleep(timing.period).await;
        }
    });
    task.abort_handle()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn probe_ports_may_name_a_container_port() {
        let c = json!({"ports": [{"name": "http", "containerPort": 8080}]});
        let h = handler(&json!({"httpGet": {"port": "http", "path": "healthz"}}), &c, "127.0.0.1");
        assert!(matches!(h, Handler::Http { ref url, .. } if url == "http://127.0.0.1:8080/healthz"));
        let h = handler(&json!({"tcpSocket": {"port": "nope"}}), &c, "127.0.0.1");
        assert!(matches!(h, Handler::Unsupported(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_liveness_probe_reports_after_failure_threshold_periods() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let id = ContainerId { pod_key: "ns/p".into(), pod_uid: "u".into(), name: "c".into() };
        let probe = json!({"exec": {"command": ["/bin/false"]}, "periodSeconds": 5, "failureThreshold": 2});
        let start = tokio::time::Instant::now();
        spawn(ProbeKind::Liveness, &probe, &json!({}), "127.0.0.1", id, 7, tx, None);
        let event = rx.recv().await.expect("a liveness failure");
        assert!(matches!(event.outcome, ProbeOutcome::LivenessFailed(_)));
        assert_eq!(event.instance, 7);
        // Two failures, one period apart.
        assert!(start.elapsed() >= Duration::from_secs(5), "{:?}", start.elapsed());
    }
}
