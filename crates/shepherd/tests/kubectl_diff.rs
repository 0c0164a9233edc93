//! Dry runs through the real kubectl (`kubectl diff`), and the debug endpoints behind the token.

mod common;

use std::path::Path;

use common::Daemon;
use serde_json::{Value, json};

/// The manifest kubectl reads (JSON is YAML) and the body the test creates.
fn deployment(replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}})
}

/// Runs kubectl with `manifest` on stdin: its exit code, stdout and stderr. (`kubectl diff` exits
/// 1 when it found differences, 0 when none, above 1 on errors.)
fn kubectl(url: &str, args: &[&str], manifest: &Value) -> (i32, String, String) {
    let mut cmd = common::kubectl_command(Path::new("kubectl"), url);
    let (status, out, err) = common::run_with_stdin(cmd.args(args), Some(&manifest.to_string()));
    (status.code().unwrap_or(-1), out, err)
}

fn kubectl_diff(url: &str, manifest: &Value) -> (i32, String, String) {
    kubectl(url, &["diff", "-f", "-"], manifest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_diff_shows_the_change_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start("server", dir.path(), &["--controllers", "none"]);
    let http = reqwest::Client::new();
    let deployments = format!("{}/apis/apps/v1/namespaces/default/deployments", d.url);

    // Not there yet: the diff is the whole object as the server would create it.
    let (code, out, err) = kubectl_diff(&d.url, &deployment(3));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("+  replicas: 3") && out.contains("+  uid: "), "{out}");
    let list: Value = http.get(&deployments).send().await.expect("list").json().await.expect("json");
    assert_eq!(list["items"], json!([]), "the dry-run create wrote nothing");

    let (code, out, err) = kubectl(&d.url, &["apply", "--validate=false", "-f", "-"], &deployment(3));
    assert_eq!(code, 0, "{out}{err}");
    let before: Value = http.get(format!("{deployments}/web")).send().await.expect("get").json().await.expect("json");

    let (code, out, err) = kubectl_diff(&d.url, &deployment(5));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("-  replicas: 3") && out.contains("+  replicas: 5"), "{out}");
    assert!(out.contains("-  generation: 1") && out.contains("+  generation: 2"), "{out}");
    let (code, out, err) = kubectl_diff(&d.url, &deployment(3));
    assert_eq!(code, 0, "no difference: {out}{err}");

    let after: Value = http.get(format!("{deployments}/web")).send().await.expect("get").json().await.expect("json");
    assert_eq!(after, before, "the dry-run patch wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_controllers_needs_the_api_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start("server", dir.path(), &["--token", "t0ken"]);
    let http = reqwest::Client::new();
    let url = format!("{}/debug/controllers", d.url);
    let anonymous = http.get(&url).send().await.expect("get");
    assert_eq!(anonymous.status(), reqwest::StatusCode::UNAUTHORIZED);
    let wrong = http.get(&url).bearer_auth("guess").send().await.expect("get");
    assert_eq!(wrong.status(), reqwest::StatusCode::UNAUTHORIZED);
    let ok = http.get(&url).bearer_auth("t0ken").send().await.expect("get");
    assert_eq!(ok.status(), reqwest::StatusCode::OK);
    let body: Value = ok.json().await.expect("json");
    assert!(body["controllers"].is_array(), "{body}");
}
