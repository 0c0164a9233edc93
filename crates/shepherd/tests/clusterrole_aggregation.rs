//! ClusterRole aggregation as kubectl shows it: a ClusterRole labelled
//! `rbac.authorization.k8s.io/aggregate-to-edit: "true"` has its rules written into `edit`, and
//! through `edit` into `admin`; they leave when it goes.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, newest_kubectl, run_with_stdin};
use serde_json::{Value, json};

const NODE_READER: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: node-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
rules:
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list"]
"#;

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let (_, bin) = newest_kubectl();
    let mut cmd = Command::new(bin);
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args).env_remove("KUBECONFIG");
    let (status, out, err) = run_with_stdin(&mut cmd, stdin);
    (status.success(), out, err)
}

fn rules_of(kubeconfig: &Path, role: &str) -> Vec<Value> {
    let (ok, out, err) = kubectl(kubeconfig, &["get", "clusterrole", role, "-o", "json"], None);
    assert!(ok, "kubectl get clusterrole {role}: {err}");
    let role: Value = serde_json::from_str(&out).expect("JSON");
    role["rules"].as_array().cloned().unwrap_or_default()
}

/// Waits until `role`'s rules, as kubectl prints them, satisfy `done`.
fn wait_for_rules(kubeconfig: &Path, role: &str, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rules = rules_of(kubeconfig, role);
        if done(&rules) {
            return rules;
        }
        assert!(Instant::now() < deadline, "clusterrole {role} never {what}: {rules:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_clusterrole_labelled_to_aggregate_shows_up_in_edit_and_admin_and_leaves_with_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("server")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--controllers", "clusterrole-aggregation"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start shepherd");
    let _server = Daemon::from_child(child);
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let nodes = json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]});
    let can_bob_list_nodes = || kubectl(&kubeconfig, &["auth", "can-i", "list", "nodes", "--as", "bob"], None).1.trim() == "yes";

    let edit_before = rules_of(&kubeconfig, "edit");
    assert!(!edit_before.is_empty(), "edit grants nothing");
    let (ok, out, err) = kubectl(&kubeconfig, &["create", "clusterrolebinding", "bob-edit", "--clusterrole", "edit", "--user", "bob"], None);
    assert!(ok, "kubectl create clusterrolebinding: {out}{err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while kubectl(&kubeconfig, &["auth", "can-i", "create", "pods", "--as", "bob"], None).1.trim() != "yes" {
        assert!(Instant::now() < deadline, "bob bound to edit cannot create pods");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!can_bob_list_nodes(), "edit lets bob list nodes before anything adds to it");
    let (ok, _, err) = kubectl(&kubeconfig, &["apply", "-f", "-"], Some(NODE_READER));
    assert!(ok, "kubectl apply: {err}");

    let edit = wait_for_rules(&kubeconfig, "edit", "gained the node rule", |r| r.contains(&nodes));
    assert!(edit_before.iter().all(|r| edit.contains(r)), "edit lost rules of its own: {edit:?}");
    wait_for_rules(&kubeconfig, "admin", "gained the node rule through edit", |r| r.contains(&nodes));
    let view = rules_of(&kubeconfig, "view");
    assert!(!view.contains(&nodes), "view selects only what is labelled aggregate-to-view");
    // What the role shows is what it grants.
    assert!(can_bob_list_nodes(), "bob bound to edit cannot list nodes");

    let (ok, _, err) = kubectl(&kubeconfig, &["delete", "clusterrole", "node-reader"], None);
    assert!(ok, "kubectl delete: {err}");
    wait_for_rules(&kubeconfig, "admin", "dropped the node rule", |r| !r.contains(&nodes));
    let edit = wait_for_rules(&kubeconfig, "edit", "dropped the node rule", |r| !r.contains(&nodes));
    assert_eq!(edit.len(), edit_before.len(), "edit is back to what it was: {edit:?}");
    assert!(!can_bob_list_nodes(), "bob still lists nodes after the role that granted it went");
}
