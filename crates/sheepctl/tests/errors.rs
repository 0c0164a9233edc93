//! Every error a user meets: one line on stderr naming the object and the reason, exit code 1.

mod common;

use common::{Shepherd, redact, sheepctl};

fn report(run: &common::Run) -> String {
    assert_eq!(run.code, 1, "expected exit code 1, got {run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "expected one line on stderr, got {:?}", run.stderr);
    redact(&run.stderr)
}

#[test]
fn no_server_names_the_address_and_how_to_start_shepherd() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port");
    let url = format!("http://127.0.0.1:{port}");
    let run = sheepctl(Some(&url), &["get", "pods"], None);
    assert!(run.stderr.contains(&url), "{}", run.stderr);
    insta::assert_snapshot!(report(&run), @"Error: cannot connect to the Shepherd API at http://127.0.0.1:PORT (connection refused); start Shepherd with: cargo build --release -p shepherd && target/release/shepherd standalone");
}

#[test]
fn without_any_configuration_the_default_address_is_tried() {
    let mut cmd = common::command(None, &["get", "pods"]);
    let out = cmd.output().expect("run sheepctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Something may listen on 9876 on a developer machine; only check when nothing does.
    if std::net::TcpStream::connect("127.0.0.1:9876").is_err() {
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr.contains("https://127.0.0.1:9876"), "{stderr}");
    }
}

#[test]
fn shepherd_api_environment_variable_picks_the_server() {
    let s = Shepherd::server();
    let mut cmd = common::command(None, &["get", "ns", "-o", "name"]);
    cmd.env("SHEPHERD_API", &s.url);
    let out = cmd.output().expect("run sheepctl");
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"), "{out:?}");
}

#[test]
fn kubeconfig_current_context_picks_the_server() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config");
    std::fs::write(&path, format!("apiVersion: v1\nkind: Config\ncurrent-context: here\nclusters:\n- name: c\n  cluster:\n    server: {}\ncontexts:\n- name: here\n  context:\n    cluster: c\n    user: u\n    namespace: kube-system\nusers:\n- name: u\n  user: {{}}\n", s.url)).expect("write kubeconfig");
    s.ok("POST", "/api/v1/namespaces/kube-system/services", Some(serde_json::json!({"metadata": {"name": "dns"}, "spec": {"ports": [{"port": 53}]}})));
    let mut cmd = common::command(None, &["get", "svc", "-o", "name"]);
    cmd.env("KUBECONFIG", &path);
    let out = cmd.output().expect("run sheepctl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "service/dns\n", "{out:?}");
}

#[test]
fn unknown_kind() {
    let s = Shepherd::server();
    insta::assert_snapshot!(report(&s.sheepctl(&["get", "widgets"])), @r#"Error: the server doesn't have a resource type "widgets""#);
}

#[test]
fn not_found_names_the_object() {
    let s = Shepherd::server();
    insta::assert_snapshot!(report(&s.sheepctl(&["get", "deploy", "web"])), @r#"Error: deployments.apps "web" not found"#);
    insta::assert_snapshot!(report(&s.sheepctl(&["delete", "pod", "web-0"])), @r#"Error: pods "web-0" not found"#);
    insta::assert_snapshot!(report(&s.sheepctl(&["scale", "deploy", "web", "--replicas=2"])), @r#"Error: deployments.apps "web" not found"#);
    insta::assert_snapshot!(report(&s.sheepctl(&["describe", "pod", "nope"])), @r#"Error: pods "nope" not found"#);
}

#[test]
fn invalid_manifest_names_file_document_and_field() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("app.yaml");
    std::fs::write(&file, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ok\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: three\n").expect("write");
    let run = s.sheepctl(&["apply", "-f", file.to_str().expect("path")]);
    let text = report(&run).replace(dir.path().to_str().expect("path"), "DIR");
    insta::assert_snapshot!(text, @r#"Error: invalid manifest DIR/app.yaml (document 2): spec.replicas: Invalid value: invalid type: string "three", expected i32"#);
    // Nothing from the file was sent: the first document was not created either.
    assert_eq!(s.api("GET", "/api/v1/namespaces/ok", None).0, 404);

    let missing_name = s.sheepctl_stdin(&["apply", "-f", "-"], r#"{"kind":"Pod","spec":{"containers":[]}}"#);
    insta::assert_snapshot!(report(&missing_name), @"Error: invalid manifest <stdin> (document 1): metadata.name: Required value: name is required");
    let unknown_kind = s.sheepctl_stdin(&["apply", "-f", "-"], "kind: Widget\nmetadata: {name: w}\n");
    insta::assert_snapshot!(report(&unknown_kind), @r#"Error: invalid manifest <stdin> (document 1): kind: unknown kind "Widget""#);
    let in_list = s.sheepctl_stdin(&["apply", "-f", "-"], r#"{"kind":"List","items":[{"kind":"Namespace","metadata":{"name":"a"}},{"kind":"Namespace","metadata":{"name":7}}]}"#);
    insta::assert_snapshot!(report(&in_list), @"Error: invalid manifest <stdin> (document 1): items[1].metadata.name: Required value: name is required");
    let broken = s.sheepctl_stdin(&["apply", "-f", "-"], "{\"kind\": ");
    assert!(report(&broken).starts_with("Error: invalid manifest <stdin> (document 1): malformed JSON"), "{}", broken.stderr);
}

#[test]
fn server_rejection_gives_the_reason_and_field() {
    let s = Shepherd::server();
    let bad_replicas = r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":-1,"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#;
    insta::assert_snapshot!(report(&s.sheepctl_stdin(&["apply", "-f", "-"], bad_replicas)),
        @r#"Error: Deployment "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"#);
    let unknown_field = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: c, image: busybox, bogus: 1}\n";
    insta::assert_snapshot!(report(&s.sheepctl_stdin(&["apply", "-f", "-"], unknown_field)),
        @r#"Error: Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.containers[0].bogus" (BadRequest)"#);
}

#[test]
fn logs_without_a_node_agent_explain_why() {
    let s = Shepherd::server();
    s.ok("POST", "/api/v1/namespaces/default/pods", Some(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "minimal"}]}})));
    insta::assert_snapshot!(report(&s.sheepctl(&["logs", "p"])),
        @"Error: no node agent serves logs in this server; logs are available in standalone mode or with --node-streaming-token (ServiceUnavailable)");
}

#[test]
fn a_wrong_token_is_refused_and_the_right_one_accepted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = std::process::Command::new(common::shepherd_bin())
        .args(["server", "--insecure-loopback", "--listen", "127.0.0.1:0", "--token", "s3cret", "--data-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start shepherd");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut line).expect("address");
    let url = line.split_whitespace().last().unwrap_or("").to_string();
    let denied = sheepctl(Some(&url), &["get", "ns", "--token", "wrong"], None);
    let allowed = sheepctl(Some(&url), &["get", "ns", "-o", "name", "--token", "s3cret"], None);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(denied.code, 1);
    assert!(denied.stderr.starts_with("Error: the server did not accept the credentials"), "{}", denied.stderr);
    assert!(allowed.stdout.contains("namespace/default"), "{allowed:?}");
}
