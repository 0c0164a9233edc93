//! DaemonSets and StatefulSets end to end with the real kubectl against `shepherd server` and
//! simulated node agents: `kubectl apply`, `get ds|sts` columns, `rollout status`, `set image`,
//! `scale`, a joining node served at once, and the 422s for what cannot be changed or served.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Kubectl, kubectls_under_test};
use serde_json::Value;

/// Starts a node agent process, killed with the test.
/// `nodes` simulated nodes named `<prefix>0..`, or one node named `prefix` when `nodes` is 0.
fn start_agent(server: &str, prefix: &str, nodes: usize, dir: &std::path::Path) -> common::KillOnDrop {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
    cmd.args(["agent", "--server", server, "--runtime", "simulated", "--simulated-ready-ms", "50", "--data-dir"]);
    cmd.arg(dir.join(prefix));
    if nodes == 0 {
        cmd.args(["--node-name", prefix]);
    } else {
        cmd.args(["--simulate-nodes", &nodes.to_string(), "--node-name-prefix", prefix]);
    }
    let child = cmd.env("RUST_LOG", "warn").stdout(Stdio::null()).spawn().expect("start agent");
    common::KillOnDrop(child)
}

impl Kubectl {
    /// Polls until `done` holds for `kubectl get pods -o json`'s items; panics after `limit`.
    fn wait_for_pods(&self, what: &str, limit: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let pods = self.json(&["get", "pods"])["items"].as_array().cloned().unwrap_or_default();
            let active: Vec<Value> = pods.into_iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
            if done(&active) {
                return active;
            }
            assert!(started.elapsed() < limit, "timed out waiting for {what}: {:?}", names(&active));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn names(pods: &[Value]) -> Vec<String> {
    let mut n: Vec<String> = pods.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string)).collect();
    n.sort();
    n
}

fn of_app<'a>(pods: &'a [Value], app: &str) -> Vec<&'a Value> {
    pods.iter().filter(|p| p["metadata"]["labels"]["app"] == app).collect()
}

fn header(out: &str) -> Vec<&str> {
    out.lines().next().unwrap_or("").split("  ").map(str::trim).filter(|s| !s.is_empty()).collect()
}

fn row(out: &str) -> Vec<&str> {
    out.lines().nth(1).unwrap_or("").split_whitespace().collect()
}

const DAEMON_SET: &str = "
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - name: main
        image: agent:1
";

const STATEFUL_SET: &str = "
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: None
  selector: {app: web}
  ports:
  - port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  replicas: 3
  serviceName: web
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: main
        image: web:1
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_a_daemon_set_on_every_node_and_rolls_it_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", dir.path(), &["--in-memory"]);
    let _sims = start_agent(&server.url, "sim-", 3, dir.path());
    let (version, bin) = common::newest_kubectl();
    let k = Kubectl { bin, url: server.url.clone() };
    k.wait_for_pods("three nodes", Duration::from_secs(30), |_| {
        k.json(&["get", "nodes"])["items"].as_array().map(Vec::len) == Some(3)
    });

    k.ok(&["apply", "-f", "-"], Some(DAEMON_SET));
    let out = k.ok(&["rollout", "status", "ds/agent", "--timeout=60s"], None);
    assert!(out.contains("successfully rolled out"), "kubectl {version}: {out}");
    let pods = k.wait_for_pods("a pod per node", Duration::from_secs(30), |p| of_app(p, "agent").len() == 3);
    let mut nodes: Vec<&str> = of_app(&pods, "agent").iter().filter_map(|p| p["spec"]["nodeName"].as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["sim-0", "sim-1", "sim-2"]);
    for (v, bin) in kubectls_under_test() {
        let kv = Kubectl { bin, url: server.url.clone() };
        let out = kv.ok(&["get", "ds"], None);
        assert_eq!(header(&out), ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE"], "kubectl {v}: {out}");
        assert_eq!(row(&out)[..7], ["agent", "3", "3", "3", "3", "3", "<none>"], "kubectl {v}: {out}");
    }

    // A fourth node joins: its pod follows at once.
    let _joining = start_agent(&server.url, "late", 0, dir.path());
    let started = Instant::now();
    k.wait_for_pods("the joining node to register", Duration::from_secs(30), |_| {
        k.run(&["get", "node", "late"], None).0
    });
    let registered = started.elapsed();
    k.wait_for_pods("a pod on the joining node", Duration::from_secs(10), |p| {
        of_app(p, "agent").iter().any(|p| p["spec"]["nodeName"] == "late")
    });
    let served = started.elapsed() - registered;
    eprintln!("the joining node had its daemon pod {served:?} after it was seen registered");
    assert!(served < Duration::from_secs(3), "{served:?}");

    k.ok(&["set", "image", "ds/agent", "main=agent:2"], None);
    let out = k.ok(&["rollout", "status", "ds/agent", "--timeout=60s"], None);
    assert!(out.contains("successfully rolled out"), "kubectl {version}: {out}");
    let pods = k.wait_for_pods("every pod at the new image", Duration::from_secs(30), |p| {
        let ours = of_app(p, "agent");
        ours.len() == 4 && ours.iter().all(|p| p["spec"]["containers"][0]["image"] == "agent:2")
    });
    assert_eq!(of_app(&pods, "agent").len(), 4);

    let out = k.ok(&["rollout", "history", "ds/agent"], None);
    let revisions: Vec<&str> = out.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(revisions, ["1", "2"], "kubectl {version}: {out}");
    k.ok(&["rollout", "undo", "ds/agent"], None);
    let out = k.ok(&["rollout", "status", "ds/agent", "--timeout=60s"], None);
    assert!(out.contains("successfully rolled out"), "kubectl {version}: {out}");
    k.wait_for_pods("every pod back at the first image", Duration::from_secs(30), |p| {
        let ours = of_app(p, "agent");
        ours.len() == 4 && ours.iter().all(|p| p["spec"]["containers"][0]["image"] == "agent:1")
    });

    let changed = DAEMON_SET.replace("{app: agent}", "{app: agent, tier: node}");
    let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&changed));
    assert!(!ok && err.contains("spec.selector") && err.contains("field is immutable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_a_stateful_set_in_order_with_stable_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", dir.path(), &["--in-memory"]);
    let _sims = start_agent(&server.url, "sim-", 2, dir.path());
    let (version, bin) = common::newest_kubectl();
    let k = Kubectl { bin, url: server.url.clone() };

    k.ok(&["apply", "-f", "-"], Some(STATEFUL_SET));
    let out = k.ok(&["rollout", "status", "sts/web", "--timeout=60s"], None);
    assert!(out.contains("roll out complete") || out.contains("rolling update complete"), "kubectl {version}: {out}");
    let pods = k.wait_for_pods("three stateful pods", Duration::from_secs(30), |p| of_app(p, "web").len() == 3);
    assert_eq!(names(&pods), ["web-0", "web-1", "web-2"]);
    let web1 = pods.iter().find(|p| p["metadata"]["name"] == "web-1").expect("web-1");
    assert_eq!((web1["spec"]["hostname"].as_str(), web1["spec"]["subdomain"].as_str()), (Some("web-1"), Some("web")));
    for (v, bin) in kubectls_under_test() {
        let kv = Kubectl { bin, url: server.url.clone() };
        let out = kv.ok(&["get", "sts"], None);
        assert_eq!(header(&out), ["NAME", "READY", "AGE"], "kubectl {v}: {out}");
        assert_eq!(row(&out)[..2], ["web", "3/3"], "kubectl {v}: {out}");
    }

    let old_uid = web1["metadata"]["uid"].clone();
    k.ok(&["delete", "pod", "web-1", "--wait=false"], None);
    k.wait_for_pods("web-1 to come back", Duration::from_secs(30), |p| {
        p.iter().any(|p| p["metadata"]["name"] == "web-1" && p["metadata"]["uid"] != old_uid)
    });

    k.ok(&["set", "image", "sts/web", "main=web:2"], None);
    let out = k.ok(&["rollout", "status", "sts/web", "--timeout=60s"], None);
    assert!(out.contains("complete"), "kubectl {version}: {out}");
    let pods = k.wait_for_pods("every pod at the new image", Duration::from_secs(30), |p| {
        let ours = of_app(p, "web");
        ours.len() == 3 && ours.iter().all(|p| p["spec"]["containers"][0]["image"] == "web:2")
    });
    assert_eq!(names(&pods), ["web-0", "web-1", "web-2"]);
    let out = k.ok(&["rollout", "history", "sts/web"], None);
    let revisions: Vec<&str> = out.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(revisions, ["1", "2"], "kubectl {version}: {out}");
    let before: Vec<Value> = pods.iter().map(|p| p["metadata"]["uid"].clone()).collect();
    k.ok(&["rollout", "restart", "sts/web"], None);
    let out = k.ok(&["rollout", "status", "sts/web", "--timeout=60s"], None);
    assert!(out.contains("complete"), "kubectl {version}: {out}");
    k.wait_for_pods("every pod restarted", Duration::from_secs(30), |p| {
        let ours = of_app(p, "web");
        ours.len() == 3 && ours.iter().all(|p| !before.contains(&p["metadata"]["uid"]))
    });

    k.ok(&["scale", "sts/web", "--replicas=1"], None);
    k.wait_for_pods("scale down to web-0", Duration::from_secs(30), |p| names(&of_app(p, "web").into_iter().cloned().collect::<Vec<_>>()) == ["web-0"]);

    let reselected = STATEFUL_SET.replace("matchLabels: {app: web}", "matchLabels: {app: web, tier: db}")
        .replace("labels: {app: web}", "labels: {app: web, tier: db}");
    let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&reselected));
    assert!(!ok && err.contains("spec.selector") && err.contains("field is immutable"), "{err}");

    let claims = STATEFUL_SET.replace("  serviceName: web\n", "  serviceName: web\n  volumeClaimTemplates:\n  - metadata: {name: data}\n    spec: {accessModes: [ReadWriteOnce]}\n")
        .replace("name: web\nspec:\n  replicas", "name: db\nspec:\n  replicas");
    let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&claims));
    assert!(!ok && err.contains("spec.volumeClaimTemplates"), "{err}");
}

const REPLICATION_CONTROLLER: &str = "
apiVersion: v1
kind: ReplicationController
metadata:
  name: web
spec:
  replicas: 3
  selector: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: main
        image: web:1
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scales_a_replication_controller_and_its_delete_cascades() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", dir.path(), &["--in-memory"]);
    let _sims = start_agent(&server.url, "sim-", 2, dir.path());
    let (version, bin) = common::newest_kubectl();
    let k = Kubectl { bin, url: server.url.clone() };

    k.ok(&["apply", "-f", "-"], Some(REPLICATION_CONTROLLER));
    let pods = k.wait_for_pods("three pods", Duration::from_secs(30), |p| of_app(p, "web").len() == 3);
    assert_eq!(names(&pods), ["web-0", "web-1", "web-2"]);
    let victim = pods.iter().find(|p| p["metadata"]["name"] == "web-0").map(|p| p["metadata"]["uid"].clone()).expect("web-0");
    k.ok(&["delete", "pod", "web-0", "--wait=false"], None);
    // The replacement takes the lowest name free at that moment: web-0 again once the old one is gone.
    k.wait_for_pods("web-0 replaced", Duration::from_secs(30), |p| {
        let ours = of_app(p, "web");
        ours.len() == 3 && ours.iter().all(|p| p["metadata"]["uid"] != victim)
    });

    k.ok(&["scale", "rc", "web", "--replicas=5"], None);
    k.wait_for_pods("five pods", Duration::from_secs(30), |p| of_app(p, "web").len() == 5);
    for (v, bin) in kubectls_under_test() {
        let kv = Kubectl { bin, url: server.url.clone() };
        let started = Instant::now();
        let out = loop {
            let out = kv.ok(&["get", "rc"], None);
            if row(&out).get(3) == Some(&"5") || started.elapsed() > Duration::from_secs(30) {
                break out;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(header(&out), ["NAME", "DESIRED", "CURRENT", "READY", "AGE"], "kubectl {v}: {out}");
        assert_eq!(row(&out)[..4], ["web", "5", "5", "5"], "kubectl {v}: {out}");
    }

    let out = k.ok(&["delete", "rc", "web"], None);
    assert!(out.contains("replicationcontroller \"web\" deleted"), "kubectl {version}: {out}");
    k.wait_for_pods("the cascade", Duration::from_secs(30), |p| of_app(p, "web").is_empty());
}
