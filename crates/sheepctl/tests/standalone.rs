//! The seed's "try it yourself" session, verbatim, against `shepherd standalone`, and `logs -f`.
//!
//! These use the whole of `shepherd standalone`: the deployment and replicaset controllers, the
//! scheduler, and the local node agent running real processes.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{LineReader, Shepherd};
use serde_json::json;

const SEED: &str = r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#;

/// Polls `sheepctl get pods` until `ready` holds for its output.
fn wait_for_pods(s: &Shepherd, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = s.sheepctl(&["get", "pods"]);
        if out.code == 0 && ready(&out.stdout) {
            return out.stdout;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; last output:\n{}{}", out.stdout, out.stderr);
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn running(table: &str, pod: &str) -> bool {
    table.lines().any(|l| l.split_whitespace().next() == Some(pod) && l.split_whitespace().nth(2) == Some("Running"))
}

#[test]
fn seed_session_creates_three_pods_and_replaces_a_deleted_one() {
    let s = Shepherd::standalone();
    assert_eq!(s.sheepctl_stdin(&["apply", "-f", "-"], SEED).ok(), "deployment.apps/web created\n");
    wait_for_pods(&s, "web-0, web-1 and web-2 Running", |t| ["web-0", "web-1", "web-2"].iter().all(|p| running(t, p)));
    let before = s.ok("GET", "/api/v1/namespaces/default/pods/web-0", None)["metadata"]["uid"].clone();
    let deleted_at = Instant::now();
    assert_eq!(s.sheepctl(&["delete", "pod", "web-0"]).ok(), "pod \"web-0\" deleted\n");
    // The replacement is created at once, under the lowest ordinal free at that moment: web-0 is
    // still terminating then, so it is usually web-3.
    let table = wait_for_pods(&s, "three Running pods after the replacement", |t| {
        let running_pods: Vec<&str> = t.lines().skip(1).filter(|l| l.split_whitespace().nth(2) == Some("Running"))
            .filter_map(|l| l.split_whitespace().next()).collect();
        running_pods.len() == 3 && running_pods.iter().all(|p| p.starts_with("web-"))
    });
    eprintln!("replacement Running {:?} after the delete", deleted_at.elapsed());
    let (code, old) = s.api("GET", "/api/v1/namespaces/default/pods/web-0", None);
    assert!(code == 404 || old["metadata"]["uid"] != before, "the deleted pod is gone: {old}");
    assert_eq!(table.lines().count(), 4, "{table}");
    let status = s.sheepctl(&["rollout", "status", "deployment/web", "--timeout", "60"]);
    assert!(status.ok().ends_with("deployment \"web\" successfully rolled out\n"), "{status:?}");
    // Containers outlive their agent by design: stop them before the daemon goes.
    s.sheepctl(&["delete", "deployment", "web"]).ok();
    wait_for_pods(&s, "every pod gone", |t| t.trim().is_empty());
}

#[test]
fn logs_follow_streams_a_running_containers_output() {
    let s = Shepherd::standalone();
    s.ok("POST", "/api/v1/namespaces/default/pods", Some(json!({"metadata": {"name": "ticker"}, "spec": {"containers": [{
        "name": "c", "image": "minimal", "command": ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"]}]}})));
    wait_for_pods(&s, "ticker Running", |t| running(t, "ticker"));
    let mut child = common::command(Some(&s.url), &["logs", "-f", "ticker"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("start logs -f");
    let lines = LineReader::new(child.stdout.take().expect("stdout"));
    lines.until("tick 1", Duration::from_secs(20));
    // Output written after `logs -f` started arrives too.
    lines.until("tick 10", Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    let tail = s.sheepctl(&["logs", "ticker", "--tail", "2"]);
    assert_eq!(tail.ok().lines().count(), 2, "{tail:?}");
    // A shell loop as PID 1 ignores SIGTERM, as in any container: a short grace ends it.
    s.api("DELETE", "/api/v1/namespaces/default/pods/ticker?gracePeriodSeconds=1", None);
    wait_for_pods(&s, "the pod gone", |t| t.trim().is_empty());
}
