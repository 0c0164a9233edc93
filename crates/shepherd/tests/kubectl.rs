//! A client nobody here wrote: the real kubectl against a real `shepherd server`.

mod common;

use std::path::Path;

use common::Daemon;

fn kubectl(url: &str, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let (status, out, err) = common::run_with_stdin(common::kubectl_command(Path::new("kubectl"), url).args(args), stdin);
    (status.success(), out, err)
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
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
      containers:
      - name: web
        image: minimal
";

#[test]
fn kubectl_creates_reads_scales_and_deletes_against_shepherd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start("server", dir.path(), &[]);
    let url = d.url.as_str();

    let (ok, out, err) = kubectl(url, &["get", "pods,deploy,nodes"], None);
    assert!(ok, "{err}");
    assert!(out.is_empty() || out.contains("No resources"), "{out}");

    let (ok, out, err) = kubectl(url, &["create", "--validate=false", "-f", "-"], Some(DEPLOYMENT));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "deployment.apps/web created");

    let (ok, out, err) = kubectl(url, &["get", "deploy", "web", "-o", "yaml"], None);
    assert!(ok, "{err}");
    for expected in ["kind: Deployment", "name: web", "replicas: 3", "image: minimal", "uid:", "resourceVersion:"] {
        assert!(out.contains(expected), "missing {expected:?} in\n{out}");
    }

    let (ok, out, err) = kubectl(url, &["get", "deploy"], None);
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"], "{out}");

    // The server runs the controllers: kubectl describe finds what they recorded.
    let mut described = String::new();
    for _ in 0..50 {
        described = kubectl(url, &["describe", "deployment", "web"], None).1;
        if described.contains("ScalingReplicaSet") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(described.contains("ScalingReplicaSet"), "{described}");

    let (ok, out, err) = kubectl(url, &["scale", "deployment/web", "--replicas=5"], None);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "deployment.apps/web scaled");
    let (_, out, _) = kubectl(url, &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"], None);
    assert_eq!(out.trim(), "5");

    let (ok, _, err) = kubectl(url, &["label", "deploy", "web", "tier=front"], None);
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(url, &["get", "deploy", "-l", "tier=front", "-o", "name"], None);
    assert_eq!(out.trim(), "deployment.apps/web");

    let (ok, _, err) = kubectl(url, &["create", "--validate=false", "-f", "-"], Some(DEPLOYMENT));
    assert!(!ok);
    assert!(err.contains("AlreadyExists") || err.contains("already exists"), "{err}");

    let (ok, out, err) = kubectl(url, &["delete", "deployment", "web"], None);
    assert!(ok, "{err}");
    assert!(out.contains("deployment.apps \"web\" deleted"), "{out}");
    let (ok, _, err) = kubectl(url, &["get", "deploy", "web"], None);
    assert!(!ok);
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");

    let (ok, out, err) = kubectl(url, &["api-resources"], None);
    assert!(ok, "{err}");
    assert!(out.lines().any(|l| l.starts_with("deployments") && l.contains("deploy")), "{out}");
}
