//! `kubectl drain`, `kubectl taint ... :NoExecute` and `kubectl describe service` with the real
//! kubectl 1.27 and 1.33 against a real `shepherd server` and two simulated node agents: a
//! PodDisruptionBudget holds a pod back until its replacement is ready elsewhere, a NoExecute
//! taint evicts the pods that do not tolerate it, and the endpoints kubectl 1.33 reads from
//! EndpointSlices are shown.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Kubectl};

/// Starts a node agent process, killed with the test.
fn start_agent(server: &str, name: &str, dir: &std::path::Path) -> common::KillOnDrop {
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["agent", "--server", server, "--node-name", name, "--runtime", "simulated", "--simulated-ready-ms", "20",
            "--data-dir"])
        .arg(dir.join(name))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start agent");
    common::KillOnDrop(child)
}

impl Kubectl {
    fn get(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args, None);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }

    /// Polls `kubectl args` until `done` holds for its output; panics with the last output after `limit`.
    fn wait_for(&self, args: &[&str], limit: Duration, done: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < limit {
            let (ok, out, err) = self.run(args, None);
            last = if ok { out } else { err };
            if ok && done(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("kubectl {args:?} never satisfied the condition; last output:\n{last}");
    }

    /// `node pod-name` of every running, ready pod labelled app=web that is not being deleted.
    fn ready_web_pods(&self) -> Vec<(String, String)> {
        let template = r#"{range .items[?(@.status.phase=="Running")]}{.spec.nodeName} {.metadata.name} {.metadata.deletionTimestamp} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#;
        let jsonpath = format!("jsonpath={template}");
        self.get(&["get", "pods", "-l", "app=web", "-o", &jsonpath])
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[2] == "True").then(|| (f[0].to_string(), f[1].to_string()))
            })
            .collect()
    }
}

const APP: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: minimal
        ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: http}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: web}
";

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn kubectl_1_27_drains_within_the_budget_and_a_no_execute_taint_evicts() {
    drain_and_taint(27);
}

#[test]
fn kubectl_1_33_drains_within_the_budget_and_a_no_execute_taint_evicts() {
    drain_and_taint(33);
}

fn drain_and_taint(minor: u32) {
    let bin = common::versioned_kubectl(minor)
        .unwrap_or_else(|| panic!("this test needs kubectl.1.{minor} beside kubectl (the Google Cloud SDK's versioned kubectls)"));
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", dir.path(), &[]);
    let k = Kubectl { bin, url: server.url.clone() };
    let _agents = [start_agent(&server.url, "n1", dir.path()), start_agent(&server.url, "n2", dir.path())];
    k.wait_for(&["get", "nodes", "--no-headers"], MINUTE, |out| out.lines().filter(|l| l.contains(" Ready")).count() == 2);

    let (ok, _, err) = k.run(&["apply", "--validate=false", "-f", "-"], Some(APP));
    assert!(ok, "{err}");
    k.wait_for(&["get", "pdb", "web", "-o", "jsonpath={.status.disruptionsAllowed} {.status.currentHealthy}"], MINUTE, |o| o == "1 3");
    let pods = k.ready_web_pods();
    let busy = ["n1", "n2"].into_iter().max_by_key(|n| pods.iter().filter(|(node, _)| node == n).count()).unwrap_or("n1");
    let other = if busy == "n1" { "n2" } else { "n1" };
    assert!(pods.iter().filter(|(n, _)| n == busy).count() >= 2, "the scheduler did not put two pods on one node: {pods:?}");

    // kubectl 1.32+ reads a service's endpoints from its EndpointSlices.
    k.wait_for(&["describe", "service", "web"], MINUTE, |o| {
        o.lines().any(|l| l.starts_with("Endpoints:") && l.matches(":8080").count() == 3)
    });

    let (ok, out, err) = k.run(&["drain", busy, "--ignore-daemonsets", "--timeout=90s"], None);
    assert!(ok, "drain failed:\n{out}\n{err}");
    assert!(err.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "the budget held no pod back (drain should have retried):\n{err}");
    assert!(out.contains("evicted") && out.contains(&format!("node/{busy} drained")), "{out}");
    assert_eq!(k.get(&["get", "node", busy, "-o", "jsonpath={.spec.unschedulable}"]), "true", "drain cordons the node");
    let after = k.wait_for(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"], MINUTE, |o| {
        o.split_whitespace().count() == 3 && o.split_whitespace().all(|n| n == other)
    });
    assert!(!after.contains(busy));

    // Back in service; a NoExecute taint on the other node sends its pods over.
    k.get(&["uncordon", busy]);
    k.get(&["taint", "nodes", other, "maintenance=now:NoExecute"]);
    k.wait_for(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"], MINUTE, |o| {
        o.split_whitespace().count() == 3 && o.split_whitespace().all(|n| n == busy)
    });
    let events = k.get(&["get", "events"]);
    assert!(events.contains("TaintManagerEviction"), "the taint manager recorded no eviction event:\n{events}");
}
