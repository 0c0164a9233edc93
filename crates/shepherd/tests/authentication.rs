//! Secure by default: `shepherd server` serves TLS with a generated cluster CA, writes an admin
//! kubeconfig that kubectl and sheepctl use as they are, and answers 401 to anyone it cannot
//! authenticate (no credentials, a garbage token, a certificate from another CA, an expired one).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, ca_pem, https_client, kubectls_under_test, run_with_stdin, secure_server};
use shepherd_apiserver::pki::ClusterCa;

/// Writes a kubeconfig for `server` with a client certificate, trusting `dir`'s cluster CA.
fn kubeconfig_with_cert(path: &Path, dir: &Path, server: &str, cert: &shepherd_apiserver::pki::CertifiedKey) -> PathBuf {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: s\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {}\ncontexts:\n- name: c\n  context: {{cluster: s, user: u}}\nusers:\n- name: u\n  user:\n    \
         client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&ca_pem(dir)),
        b64(&cert.cert_pem),
        b64(&cert.key_pem)
    );
    std::fs::write(path, text).expect("write kubeconfig");
    path.to_path_buf()
}

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(bin);
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args).env_remove("KUBECONFIG");
    let (status, out, err) = run_with_stdin(&mut cmd, stdin);
    (status.success(), out, err)
}

#[test]
fn kubectl_with_the_admin_kubeconfig_gets_applies_and_deletes_over_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _server = secure_server(dir.path(), &[]);
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&kubeconfig).expect("admin.kubeconfig").permissions());
    assert_eq!(mode & 0o777, 0o600, "the admin kubeconfig holds a private key");
    for (version, bin) in kubectls_under_test() {
        let name = format!("cm-{}", version.replace('.', "-"));
        let manifest = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  k: v\n");
        let (ok, _, err) = kubectl(&bin, &kubeconfig, &["apply", "-f", "-"], Some(&manifest));
        assert!(ok, "kubectl {version} apply: {err}");
        let (ok, out, err) = kubectl(&bin, &kubeconfig, &["get", "configmap", &name, "-o", "jsonpath={.data.k}"], None);
        assert!(ok && out == "v", "kubectl {version} get: {out} {err}");
        let (ok, _, err) = kubectl(&bin, &kubeconfig, &["delete", "configmap", &name], None);
        assert!(ok, "kubectl {version} delete: {err}");
        let (ok, _, err) = kubectl(&bin, &kubeconfig, &["get", "configmap", &name], None);
        assert!(!ok && err.contains("NotFound"), "kubectl {version} get after delete: {err}");
    }
}

#[test]
fn kubectl_with_a_certificate_from_another_ca_or_an_expired_one_is_unauthorized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &[]);
    let cluster_ca = ClusterCa::from_pem(&ca_pem(dir.path()), &std::fs::read_to_string(dir.path().join("pki/ca.key")).expect("ca.key"))
        .expect("cluster CA");
    let other = ClusterCa::generate().expect("another CA").client_cert("shepherd-admin", &["system:masters".into()]).expect("cert");
    let past = time::OffsetDateTime::now_utc() - time::Duration::days(3);
    let expired = cluster_ca
        .client_cert_valid("shepherd-admin", &["system:masters".into()], past, past + time::Duration::days(1))
        .expect("expired cert");
    let valid = cluster_ca.client_cert("alice", &["dev".into()]).expect("cert");
    let (_, bin) = common::newest_kubectl();
    for (label, cert) in [("another CA", &other), ("expired", &expired)] {
        let config = kubeconfig_with_cert(&dir.path().join("bad.kubeconfig"), dir.path(), &server.url, cert);
        let (ok, out, err) = kubectl(&bin, &config, &["get", "namespaces"], None);
        assert!(!ok, "a certificate from {label} was accepted: {out}");
        assert!(err.contains("You must be logged in to the server"), "certificate from {label}: {err}");
    }
    // A user the CA signed is authenticated (what it may do is authorization's business).
    let config = kubeconfig_with_cert(&dir.path().join("alice.kubeconfig"), dir.path(), &server.url, &valid);
    let (_, _, err) = kubectl(&bin, &config, &["get", "namespaces"], None);
    assert!(!err.contains("You must be logged in"), "alice's certificate was refused: {err}");
}

#[tokio::test]
async fn requests_without_valid_credentials_get_kubernetes_401_except_health_and_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "t0ken-of-bob,bob,1001,\"dev,ops\"\n").expect("token file");
    let server = secure_server(dir.path(), &["--token", "admin-t0ken", "--token-auth-file", tokens.to_str().expect("path")]);
    let http = https_client(dir.path());
    let get = |path: &str, token: Option<&str>| {
        let mut req = http.get(format!("{}{path}", server.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move { req.send().await.expect("request") }
    };
    for path in ["/healthz", "/readyz", "/livez", "/version"] {
        assert_eq!(get(path, None).await.status(), 200, "{path} without credentials");
    }
    for token in [None, Some("garbage"), Some("")] {
        let resp = get("/api/v1/namespaces", token).await;
        assert_eq!(resp.status(), 401, "token {token:?}");
        let status: serde_json::Value = resp.json().await.expect("Status body");
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "Unauthorized");
        assert_eq!(status["code"], 401);
    }
    assert_eq!(get("/api/v1/namespaces", Some("admin-t0ken")).await.status(), 200, "--token");
    // bob is authenticated by the token file, and may do nothing until RBAC says so.
    let refused = get("/api/v1/namespaces", Some("t0ken-of-bob")).await;
    assert_eq!(refused.status(), 403, "a token of --token-auth-file, without a role");
    let status: serde_json::Value = refused.json().await.expect("Status body");
    assert_eq!(
        status["message"],
        "namespaces is forbidden: User \"bob\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope"
    );
    let binding = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "bob-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "bob"}]});
    let bound = http
        .post(format!("{}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", server.url))
        .bearer_auth("admin-t0ken")
        .json(&binding)
        .send()
        .await
        .expect("bind");
    assert_eq!(bound.status(), 201);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while get("/api/v1/namespaces", Some("t0ken-of-bob")).await.status() != 200 {
        assert!(std::time::Instant::now() < deadline, "bob bound to view still cannot list namespaces");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let delete = http.delete(format!("{}/api/v1/namespaces/default", server.url)).bearer_auth("t0ken-of-bob").send().await.expect("delete");
    assert_eq!(delete.status(), 403, "view does not delete");
    // Nothing was written by the refused requests.
    let refused = http
        .post(format!("{}/api/v1/namespaces", server.url))
        .bearer_auth("garbage")
        .json(&serde_json::json!({"metadata": {"name": "intruder"}}))
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 401);
    assert_eq!(get("/api/v1/namespaces/intruder", Some("admin-t0ken")).await.status(), 404);
}

#[tokio::test]
async fn metrics_count_and_time_each_request_authenticated_and_authorized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &["--token", "admin-t0ken"]);
    let http = https_client(dir.path());
    let scrape = || async {
        let text = http.get(format!("{}/metrics", server.url)).bearer_auth("admin-t0ken").send().await.expect("metrics");
        let text = text.text().await.expect("body");
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
                .unwrap_or_else(|| panic!("{name} is not in /metrics"))
                .parse()
                .expect("a number")
        };
        [
            value("apiserver_authentication_duration_seconds_count"),
            value("apiserver_authorization_duration_seconds_count"),
            value("apiserver_authorization_duration_seconds_sum"),
        ]
    };
    let before = scrape().await;
    for token in ["admin-t0ken", "admin-t0ken", "garbage"] {
        http.get(format!("{}/api/v1/namespaces", server.url)).bearer_auth(token).send().await.expect("request");
    }
    let after = scrape().await;
    // Three requests and one scrape were authenticated; the two admitted ones and the scrape authorized.
    assert_eq!(after[0] - before[0], 4.0, "authenticated: {before:?} -> {after:?}");
    assert_eq!(after[1] - before[1], 3.0, "authorized: {before:?} -> {after:?}");
    assert!(after[2] > before[2], "authorizing took no time: {before:?} -> {after:?}");
}

#[tokio::test]
async fn a_one_mebibyte_header_is_refused_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &[]);
    let http = https_client(dir.path());
    let huge = "x".repeat(1 << 20);
    match http.get(format!("{}/api/v1/namespaces", server.url)).header("X-Huge", huge).send().await {
        Ok(resp) => assert!(matches!(resp.status().as_u16(), 400 | 431), "{}", resp.status()),
        // hyper may close the connection without an answer once its buffer is full.
        Err(e) => assert!(!e.is_timeout(), "{e}"),
    }
    let health = http.get(format!("{}/healthz", server.url)).send().await.expect("healthz after");
    assert_eq!(health.status(), 200);
}

#[test]
fn insecure_loopback_off_loopback_is_refused_before_anything_is_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--in-memory", "--insecure-loopback", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("run shepherd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("--insecure-loopback") && lines[0].contains("loopback address, not 0.0.0.0:0"), "{err}");
    assert!(out.stdout.is_empty(), "it printed an address: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_seed_session_works_with_no_flags_from_the_directory_standalone_ran_in() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["standalone", "--runtime", "process", "--pod-network", "host", "--listen", "127.0.0.1:0"])
        .current_dir(cwd.path())
        .env_remove("SHEPHERD_DATA_DIR")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start standalone");
    let mut daemon = Daemon::from_child(child);
    let sheepctl = |args: &[&str], stdin: Option<&str>| {
        // Built by `cargo build -p sheepctl` (scripts/test.sh builds the workspace first).
        let mut cmd = Command::new(Path::new(env!("CARGO_BIN_EXE_shepherd")).with_file_name("sheepctl"));
        cmd.args(args)
            .current_dir(cwd.path())
            .env_remove("KUBECONFIG")
            .env_remove("SHEPHERD_API")
            .env_remove("SHEPHERD_DATA_DIR")
            .env("HOME", cwd.path());
        run_with_stdin(&mut cmd, stdin)
    };
    let deployment = r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#;
    let (status, _, err) = sheepctl(&["apply", "-f", "-"], Some(deployment));
    assert!(status.success(), "sheepctl apply: {err}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out, err) = sheepctl(&["get", "pods"], None);
        if out.lines().filter(|l| l.contains("Running")).count() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "three web pods are not Running: {out} {err}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Stopped as a person stops it (Ctrl-C): standalone then stops its pods' containers, which the
    // SIGKILL of the daemon's drop would leave running (their shims name a relative data dir).
    let _ = Command::new("kill").arg("-TERM").arg(daemon.child.id().to_string()).status();
    let stop_by = Instant::now() + Duration::from_secs(30);
    while daemon.child.try_wait().ok().flatten().is_none() && Instant::now() < stop_by {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_remote_agent_joins_over_tls_with_a_kubeconfig_from_shepherd_kubeconfig() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["kubeconfig", "--user", "system:node:remote-1", "--group", "system:nodes", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("shepherd kubeconfig");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains(&format!("server: {}", server.url)), "{text}");
    let node_config = dir.path().join("node.kubeconfig");
    std::fs::write(&node_config, &text).expect("write");
    let agent_dir = tempfile::tempdir().expect("tempdir");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["agent", "--node-name", "remote-1", "--runtime", "simulated", "--kubeconfig"])
        .arg(&node_config)
        .arg("--data-dir")
        .arg(agent_dir.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start agent");
    let admin = dir.path().join("admin.kubeconfig");
    let (_, bin) = common::newest_kubectl();
    let deadline = Instant::now() + Duration::from_secs(60);
    let registered = loop {
        let (ok, out, _) = kubectl(&bin, &admin, &["get", "node", "remote-1", "-o", "name"], None);
        if ok && out.trim() == "node/remote-1" {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(registered, "the agent did not register its node over TLS");
}

#[test]
fn a_backup_is_taken_over_tls_with_the_cluster_ca_and_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &["--token", "backup-t0ken"]);
    let to = dir.path().join("cluster.backup");
    let backup = |token: &str| {
        Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["backup", "--server", &server.url, "--token", token, "--certificate-authority"])
            .arg(dir.path().join("pki/ca.crt"))
            .arg("--to")
            .arg(&to)
            .env("RUST_LOG", "warn")
            .output()
            .expect("shepherd backup")
    };
    let refused = backup("wrong");
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("401"), "{refused:?}");
    let out = backup("backup-t0ken");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::metadata(&to).expect("backup file").len() > 0);
}
