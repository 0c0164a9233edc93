//! The newest kubectl speaks protobuf to built-in kinds (`create deployment`, `drain`): against a
//! real `shepherd server` it must work as against Kubernetes, and what it wrote must read back as JSON.

mod common;

use std::path::{Path, PathBuf};

use common::Daemon;
use serde_json::Value;

/// The newest kubectl installed (1.33 here), which sends protobuf.
fn newest_kubectl() -> PathBuf {
    common::newest_kubectl().1
}

/// `kubectl.1.27`, which sends JSON, where the versioned binaries are installed.
fn json_kubectl() -> Option<PathBuf> {
    common::versioned_kubectl(27)
}

fn kubectl(url: &str, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    run(&newest_kubectl(), url, args, stdin)
}

fn run(binary: &Path, url: &str, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let (status, out, err) = common::run_with_stdin(common::kubectl_command(binary, url).args(args), stdin);
    (status.success(), out, err)
}

fn get_json(url: &str, what: &[&str]) -> Value {
    let args: Vec<&str> = ["get"].iter().chain(what).chain(&["-o", "json"]).copied().collect();
    let (ok, out, err) = kubectl(url, &args, None);
    assert!(ok, "kubectl get {what:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn kubectl_create_deployment_namespace_and_service_send_protobuf_that_reads_back_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start("server", dir.path(), &[]);
    let url = d.url.as_str();

    let (ok, out, err) = kubectl(url, &["create", "deployment", "web", "--image=minimal", "--replicas=2"], None);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "deployment.apps/web created");
    let deploy = get_json(url, &["deployment", "web"]);
    assert_eq!(deploy["spec"]["replicas"], 2, "{deploy}");
    assert_eq!(deploy["spec"]["selector"]["matchLabels"]["app"], "web");
    assert_eq!(deploy["spec"]["template"]["spec"]["containers"][0]["image"], "minimal");
    assert_eq!(deploy["spec"]["strategy"]["type"], "RollingUpdate", "defaulted as from JSON");
    assert!(deploy["metadata"]["uid"].is_string() && deploy["metadata"].get("creationTimestamp").is_some());

    // The same command from a kubectl that sends JSON stores the same spec: protobuf's zeros of
    // unset Go fields do not leak into the object (nor into its pod-template-hash).
    if let Some(old) = json_kubectl() {
        let (ok, _, err) = run(&old, url, &["create", "deployment", "web2", "--image=minimal", "--replicas=2"], None);
        assert!(ok, "{err}");
        let from_json = get_json(url, &["deployment", "web2"])["spec"].to_string().replace("web2", "web");
        assert_eq!(deploy["spec"].to_string(), from_json);
    }

    let (ok, out, err) = kubectl(url, &["create", "namespace", "x"], None);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "namespace/x created");
    assert_eq!(get_json(url, &["namespace", "x"])["status"]["phase"], "Active");

    let (ok, out, err) = kubectl(url, &["create", "service", "clusterip", "web", "--tcp=80:8080"], None);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "service/web created");
    let svc = get_json(url, &["service", "web"]);
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["ports"][0]["port"], 80, "{svc}");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(svc["spec"]["selector"]["app"], "web");

    // The deployment's pods appear (the controllers read what protobuf wrote), and the JSON paths
    // kubectl uses for output still work.
    let mut pods = Value::Null;
    for _ in 0..300 {
        pods = get_json(url, &["pods", "-l", "app=web"]);
        if pods["items"].as_array().is_some_and(|i| i.len() == 2) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(2), "{pods}");
    let (ok, out, err) = kubectl(url, &["get", "pods", "-o", "yaml"], None);
    assert!(ok, "{err}");
    assert!(out.contains("kind: List") && out.contains("image: minimal"), "{out}");
}

#[test]
fn kubectl_drain_deletes_pods_with_a_protobuf_delete_options_body_that_is_honoured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start("server", dir.path(), &[]);
    let url = d.url.as_str();
    let manifests = "apiVersion: v1
kind: Node
metadata: {name: node-1}
---
apiVersion: v1
kind: Pod
metadata: {name: lone}
spec:
  nodeName: node-1
  containers: [{name: c, image: minimal}]
";
    let (ok, _, err) = kubectl(url, &["create", "--validate=false", "-f", "-"], Some(manifests));
    assert!(ok, "{err}");

    // Without an agent, a pod on a node waits out its grace period (30 s by default): drain finishes
    // within its time-out only if the body's `gracePeriodSeconds: 0` was read.
    let (ok, out, err) =
        kubectl(url, &["drain", "node-1", "--disable-eviction", "--force", "--grace-period=0", "--timeout=20s"], None);
    assert!(ok, "{out}{err}");
    assert!(out.contains("pod/lone deleted") && out.contains("node/node-1 drained"), "{out}");
    let (ok, _, err) = kubectl(url, &["get", "pod", "lone"], None);
    assert!(!ok && err.contains("not found"), "{err}");
    assert_eq!(get_json(url, &["node", "node-1"])["spec"]["unschedulable"], true);
}
