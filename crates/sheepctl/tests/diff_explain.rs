//! `diff` (a server-side dry run of apply, shown as a unified diff) and `explain` (the server's
//! OpenAPI v3 schema), against a real `shepherd server`, with kubectl as the oracle.

mod common;

use std::process::Command;

use common::{Shepherd, redact};
use serde_json::Value;

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: cart
spec:
  replicas: 2
  selector:
    matchLabels: {app: cart}
  template:
    metadata:
      labels: {app: cart}
    spec:
      containers:
      - name: cart
        image: cart:v1
";

/// The store's revision, as the resourceVersion of a list.
fn revision(s: &Shepherd) -> Value {
    s.ok("GET", "/api/v1/namespaces", None)["metadata"]["resourceVersion"].clone()
}

/// kubectl run against the test server, with its cache in a fresh home directory.
fn kubectl(s: &Shepherd, home: &std::path::Path, args: &[&str]) -> (i32, String) {
    let out = Command::new("kubectl")
        .args(["--server", &s.url])
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .env("HOME", home)
        .output()
        .expect("kubectl is installed");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The hunks of a unified diff, without the header lines that name temporary files.
fn hunks(diff: &str) -> String {
    diff.lines().skip_while(|l| !l.starts_with("@@")).map(|l| format!("{l}\n")).collect()
}

#[test]
fn diff_of_an_applied_manifest_prints_nothing_and_exits_0() {
    let s = Shepherd::server();
    s.sheepctl_stdin(&["apply", "-f", "-"], DEPLOYMENT).ok();
    let run = s.sheepctl_stdin(&["diff", "-f", "-"], DEPLOYMENT);
    assert_eq!((run.code, run.stdout.as_str(), run.stderr.as_str()), (0, "", ""));
}

#[test]
fn diff_of_a_changed_image_shows_the_change_exits_1_and_writes_nothing() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cart.yaml");
    let path = file.to_str().expect("path");
    std::fs::write(&file, DEPLOYMENT).expect("write");
    s.sheepctl(&["apply", "-f", path]).ok();
    let before = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/cart", None);
    let revision_before = revision(&s);

    std::fs::write(&file, DEPLOYMENT.replace("cart:v1", "cart:v2")).expect("write");
    let run = s.sheepctl(&["diff", "-f", path]);
    assert_eq!(run.code, 1, "differences exit 1: {run:?}");
    for line in ["-      - image: cart:v1", "+      - image: cart:v2", "-  generation: 1", "+  generation: 2"] {
        assert!(run.stdout.lines().any(|l| l == line), "no line {line:?} in\n{}", run.stdout);
    }
    insta::assert_snapshot!("diff_changed_image", redact(&run.stdout));

    let after = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/cart", None);
    assert_eq!(after, before, "a diff changes nothing");
    assert_eq!(revision(&s), revision_before, "a diff writes nothing to the store");

    let home = tempfile::tempdir().expect("temp dir");
    let (code, by_kubectl) = kubectl(&s, home.path(), &["diff", "-f", path]);
    assert_eq!(code, 1, "kubectl diff finds the same difference");
    assert_eq!(hunks(&run.stdout), hunks(&by_kubectl), "the same hunks as kubectl diff");
}

#[test]
fn diff_of_a_new_object_shows_all_of_it_added_and_creates_nothing() {
    let s = Shepherd::server();
    let revision_before = revision(&s);
    let run = s.sheepctl_stdin(&["diff", "-f", "-"], DEPLOYMENT);
    assert_eq!(run.code, 1, "{run:?}");
    let mut lines = run.stdout.lines();
    assert_eq!(lines.next(), Some("diff -u -N LIVE/apps.v1.Deployment.default.cart MERGED/apps.v1.Deployment.default.cart"));
    assert_eq!(lines.next(), Some("--- LIVE/apps.v1.Deployment.default.cart"));
    assert_eq!(lines.next(), Some("+++ MERGED/apps.v1.Deployment.default.cart"));
    assert!(lines.next().is_some_and(|l| l.starts_with("@@ -0,0 +1,")), "{}", run.stdout);
    let added: Vec<&str> = lines.collect();
    assert!(added.iter().all(|l| l.starts_with('+')), "{}", run.stdout);
    for line in ["+kind: Deployment", "+  name: cart", "+      - image: cart:v1", "+  revisionHistoryLimit: 10"] {
        assert!(added.contains(&line), "no line {line:?} in\n{}", run.stdout);
    }
    let (code, _) = s.api("GET", "/apis/apps/v1/namespaces/default/deployments/cart", None);
    assert_eq!(code, 404, "a diff of a new object creates nothing");
    assert_eq!(revision(&s), revision_before);
}

#[test]
fn diff_of_several_objects_prints_what_kubectl_diff_prints() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("shop.yaml");
    let path = file.to_str().expect("path");
    std::fs::write(&file, DEPLOYMENT).expect("write");
    s.sheepctl(&["apply", "-f", path]).ok();
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: cart}\nspec:\n  selector: {app: cart}\n  ports: [{port: 80}]\n";
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n";
    let changed = DEPLOYMENT.replace("replicas: 2", "replicas: 3");
    std::fs::write(&file, format!("{changed}---\n{service}---\n{namespace}")).expect("write");

    let ours = s.sheepctl(&["diff", "-f", path]);
    assert_eq!(ours.code, 1, "{ours:?}");
    let home = tempfile::tempdir().expect("temp dir");
    let (code, theirs) = kubectl(&s, home.path(), &["diff", "-f", path]);
    assert_eq!(code, 1);
    // kubectl compares two temporary directories and prints the time of each file.
    let temporary = regex::Regex::new(r"/tmp/(LIVE|MERGED)-\d+/").expect("regex");
    let stamp = regex::Regex::new(r"(?m)^((---|\+\+\+) \S+)\t.*$").expect("regex");
    let theirs = stamp.replace_all(&temporary.replace_all(&theirs, "$1/"), "$1").into_owned();
    assert_eq!(redact(&ours.stdout), redact(&theirs));
    assert!(ours.stdout.contains("diff -u -N LIVE/v1.Namespace..shop MERGED/v1.Namespace..shop\n"), "{}", ours.stdout);
}

#[test]
fn diff_that_fails_exits_2_as_kubectl_diff_does() {
    let s = Shepherd::server();
    let run = s.sheepctl(&["diff", "-f", "/nonexistent/cart.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("/nonexistent/cart.yaml"), "{}", run.stderr);
    let invalid = DEPLOYMENT.replace("replicas: 2", "replicas: -1");
    let run = s.sheepctl_stdin(&["diff", "-f", "-"], &invalid);
    assert_eq!(run.code, 2, "the server's validation error is an error: {run:?}");
    assert!(run.stderr.contains("spec.replicas"), "{}", run.stderr);
}

#[test]
fn explain_prints_exactly_what_kubectl_explain_prints() {
    let s = Shepherd::server();
    let home = tempfile::tempdir().expect("temp dir");
    let cases: [&[&str]; 8] = [
        &["pod"],
        &["deploy.spec.replicas"],
        &["deployments.spec.template.spec.containers"],
        &["svc.spec.ports.targetPort"],
        &["ep"],
        &["deploy.spec.strategy", "--recursive"],
        &["deployments.apps.spec.replicas"],
        &["leases.coordination.k8s.io.spec"],
    ];
    for args in cases {
        let mut full = vec!["explain"];
        full.extend(args);
        let ours = s.sheepctl(&full);
        let (code, theirs) = kubectl(&s, home.path(), &full);
        assert_eq!(code, 0, "kubectl {full:?}");
        assert_eq!(ours.ok(), theirs, "sheepctl {full:?}");
    }
    insta::assert_snapshot!("explain_replicas", s.sheepctl(&["explain", "deploy.spec.replicas"]).ok());
}

#[test]
fn explain_recursive_prints_the_field_tree() {
    let s = Shepherd::server();
    let out = s.sheepctl(&["explain", "pods", "--recursive"]).ok().to_string();
    for line in ["  metadata\t<ObjectMeta> -required-", "    labels\t<map[string]string>", "  spec\t<PodSpec>",
        "    containers\t<[]Container> -required-", "      image\t<string>"] {
        assert!(out.lines().any(|l| l == line), "no line {line:?} in\n{out}");
    }
}

#[test]
fn explain_of_a_field_that_does_not_exist_names_the_first_unknown_segment() {
    let s = Shepherd::server();
    let run = s.sheepctl(&["explain", "deploy.spec.bogus.deeper"]);
    assert_eq!(run.code, 1);
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr, "Error: field \"bogus\" does not exist in Deployment.spec\n");
    let run = s.sheepctl(&["explain", "widgets"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("\"widgets\""), "{}", run.stderr);
}
