//! Joining a node with a bootstrap token, as kubeadm and the kubelet's TLS bootstrap do: `shepherd
//! token create`, then `shepherd agent --join-token` files a CertificateSigningRequest that the
//! server approves and signs; the agent then acts as `system:node:NAME`, held to node restriction.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{KillOnDrop, kubectls_under_test, run_with_stdin, secure_server};
use serde_json::{Value, json};

const NODE: &str = "joined-1";

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut cmd = Command::new(bin);
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args).env_remove("KUBECONFIG");
    let (status, out, err) = run_with_stdin(&mut cmd, stdin);
    (status.success(), out, err)
}

fn admin_ok(dir: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let (_, bin) = common::newest_kubectl();
    let (ok, out, err) = kubectl(&bin, &dir.join("admin.kubeconfig"), args, stdin);
    assert!(ok, "kubectl {args:?}: {err}{out}");
    out
}

/// Polls `check` every 200 ms until it returns `Some`, for at most `secs` seconds.
fn wait_for<T>(what: &str, secs: u64, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `shepherd token create` against the server of `dir`: the token, and the join command it printed.
fn create_token(dir: &Path, ttl: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["token", "create", "--ttl", ttl, "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("shepherd token create");
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (token, String::from_utf8_lossy(&out.stderr).to_string())
}

fn agent(agent_dir: &Path, server: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
    cmd.args(["agent", "--node-name", NODE, "--runtime", "simulated", "--server", server])
        .arg("--data-dir")
        .arg(agent_dir)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// A client that trusts the cluster CA, with the credentials of `kubeconfig`.
async fn kube_client(kubeconfig: &Path) -> kube::Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await.expect("config");
    kube::Client::try_from(config).expect("client")
}

/// The HTTP status of one request of `client` (200 for any success).
async fn status_of(client: &kube::Client, method: &str, path: &str, body: Option<Value>) -> u16 {
    let mut req = http::Request::builder().method(method).uri(path);
    let body = match body {
        Some(b) => {
            let ct = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
            req = req.header("Content-Type", ct);
            serde_json::to_vec(&b).expect("json")
        }
        None => Vec::new(),
    };
    match client.request_text(req.body(body).expect("request")).await {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

fn https(dir: &Path) -> reqwest::Client {
    let ca = std::fs::read(dir.join("pki/ca.crt")).expect("ca.crt");
    let ca = reqwest::Certificate::from_pem(&ca).expect("CA");
    reqwest::Client::builder().tls_built_in_root_certs(false).add_root_certificate(ca).build().expect("client")
}

fn pod(name: &str, node: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_joined_with_a_bootstrap_token_acts_only_as_its_own_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &[]);
    let (token, join_hint) = create_token(dir.path(), "1h");
    assert!(join_hint.contains(&format!("--join-token {token}")) && join_hint.contains(&server.url), "{join_hint}");
    let ca = dir.path().join("pki/ca.crt");
    let ca_arg = ca.to_str().expect("path");

    // Garbage and unknown tokens: 401, and no request is written.
    let http = https(dir.path());
    let (id, _) = token.split_once('.').expect("id.secret");
    let wrong_secret = format!("{id}.0000000000000000");
    let csr_body = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "intruder"}, "spec": {"request": "AAAA", "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
        "usages": ["client auth"]}});
    for bad in ["garbage", "abcdef.0123456789abcdef", wrong_secret.as_str(), "ABCDEF.0123456789ABCDEF", "a.b"] {
        let resp = http
            .post(format!("{}/apis/certificates.k8s.io/v1/certificatesigningrequests", server.url))
            .bearer_auth(bad)
            .json(&csr_body)
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status(), 401, "token {bad:?}");
    }

    // An expired token: 401, and an agent given it says why it cannot join.
    let expired = "expird.0123456789abcdef";
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": "bootstrap-token-expird", "namespace": "kube-system"},
        "stringData": {"token-id": "expird", "token-secret": "0123456789abcdef", "expiration": "2020-01-01T00:00:00Z",
            "usage-bootstrap-authentication": "true"}});
    admin_ok(dir.path(), &["apply", "-f", "-"], Some(&secret.to_string()));
    let resp = http.get(format!("{}/api/v1/namespaces", server.url)).bearer_auth(expired).send().await.expect("get");
    assert_eq!(resp.status(), 401, "an expired bootstrap token");
    let expired_dir = tempfile::tempdir().expect("tempdir");
    let refused = agent(expired_dir.path(), &server.url, &["--join-token", expired, "--certificate-authority", ca_arg])
        .output()
        .expect("agent with an expired token");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("401"), "an agent with an expired token: {err}");
    assert!(!expired_dir.path().join("node.kubeconfig").exists());

    // The real join.
    let agent_dir = tempfile::tempdir().expect("tempdir");
    let mut child = KillOnDrop(
        agent(agent_dir.path(), &server.url, &["--join-token", &token, "--certificate-authority", ca_arg])
            .spawn()
            .expect("start agent"),
    );
    let node_kubeconfig: PathBuf = agent_dir.path().join("node.kubeconfig");
    wait_for("the agent's node kubeconfig", 90, || node_kubeconfig.exists().then_some(()));
    wait_for("the joined node to register", 90, || {
        let (_, bin) = common::newest_kubectl();
        let (ok, out, _) =
            kubectl(&bin, &dir.path().join("admin.kubeconfig"), &["get", "node", NODE, "-o", "name"], None);
        (ok && out.trim() == format!("node/{NODE}")).then_some(())
    });

    // kubectl sees the request, approved and issued, from the bootstrap token's user.
    for (version, bin) in kubectls_under_test() {
        let (ok, out, err) = kubectl(&bin, &dir.path().join("admin.kubeconfig"), &["get", "csr"], None);
        assert!(ok, "kubectl {version} get csr: {err}");
        let row =
            out.lines().find(|l| l.contains(&format!("system:bootstrap:{id}"))).unwrap_or_else(|| panic!("{out}"));
        assert!(
            row.contains("Approved,Issued") && row.contains("kubernetes.io/kube-apiserver-client-kubelet"),
            "{out}"
        );
    }
    let csrs = admin_ok(dir.path(), &["get", "csr", "-o", "json"], None);
    let csrs: Value = serde_json::from_str(&csrs).expect("json");
    assert_eq!(csrs["items"].as_array().map(Vec::len), Some(1), "only the agent's request was written: {csrs}");

    // The node runs its pod and reports its status with its own identity.
    admin_ok(dir.path(), &["apply", "-f", "-"], Some(&pod("mine", NODE)));
    admin_ok(dir.path(), &["apply", "-f", "-"], Some(&pod("theirs", "other-node")));
    wait_for("the joined node's pod to run", 90, || {
        let out = admin_ok(dir.path(), &["get", "pod", "mine", "-o", "jsonpath={.status.phase}"], None);
        (out == "Running").then_some(())
    });
    let node = kube_client(&node_kubeconfig).await;
    let allowed = [
        ("PATCH", format!("/api/v1/nodes/{NODE}"), Some(json!({"metadata": {"annotations": {"joined": "yes"}}}))),
        ("PATCH", format!("/api/v1/nodes/{NODE}/status"), Some(json!({"status": {"capacity": {"pods": "110"}}}))),
        (
            "PATCH",
            format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"),
            Some(json!({"metadata": {"annotations": {"joined": "yes"}}})),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/pods/mine/status".to_string(),
            Some(json!({"status": {"message": "mine"}})),
        ),
    ];
    for (method, path, body) in allowed {
        assert_eq!(status_of(&node, method, &path, body).await, 200, "{method} {path} as the joined node");
    }
    let forbidden = [
        (
            "PATCH",
            "/api/v1/namespaces/default/pods/theirs/status".to_string(),
            Some(json!({"status": {"message": "x"}})),
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods/theirs/binding".to_string(),
            Some(
                json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "theirs"}, "target": {"kind": "Node", "name": NODE}}),
            ),
        ),
        (
            "POST",
            "/apis/apps/v1/namespaces/default/deployments".to_string(),
            Some(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
                "selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})),
        ),
        ("PATCH", "/api/v1/nodes/other-node".to_string(), Some(json!({"metadata": {"annotations": {"x": "y"}}}))),
    ];
    for (method, path, body) in forbidden {
        assert_eq!(status_of(&node, method, &path, body).await, 403, "{method} {path} as the joined node");
    }
    let theirs = admin_ok(dir.path(), &["get", "pod", "theirs", "-o", "json"], None);
    let theirs: Value = serde_json::from_str(&theirs).expect("json");
    assert_eq!(theirs["spec"]["nodeName"], "other-node");
    assert!(theirs["status"]["message"].is_null(), "a refused status write was kept: {theirs}");

    // A restart needs no token: the agent is its node from its data dir.
    drop(child);
    let lease_time = || {
        admin_ok(dir.path(), &["get", "lease", NODE, "-n", "kube-node-lease", "-o", "jsonpath={.spec.renewTime}"], None)
    };
    let before = lease_time();
    child = KillOnDrop(agent(agent_dir.path(), &server.url, &[]).spawn().expect("restart agent"));
    wait_for("the restarted agent to renew its lease", 90, || (lease_time() != before).then_some(()));
    drop(child);
}

#[test]
fn kubectl_approves_and_denies_user_certificate_requests_and_bad_requests_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _server = secure_server(dir.path(), &[]);
    let admin = dir.path().join("admin.kubeconfig");
    let request = |cn: &str, org: &str| {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.distinguished_name.push(rcgen::DnType::OrganizationName, org);
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .encode(params.serialize_request(&key).expect("csr").pem().expect("pem"))
    };
    let csr = |name: &str, request: &str, signer: &str, usages: &[&str]| {
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
            "spec": {"request": request, "signerName": signer, "usages": usages}})
        .to_string()
    };
    for (version, bin) in kubectls_under_test() {
        let v = version.replace('.', "-");
        let (approve, deny) = (format!("alice-{v}"), format!("mallory-{v}"));
        for name in [&approve, &deny] {
            let body = csr(name, &request(name, "dev"), "kubernetes.io/kube-apiserver-client", &["client auth"]);
            let (ok, _, err) = kubectl(&bin, &admin, &["create", "-f", "-"], Some(&body));
            assert!(ok, "kubectl {version} create csr: {err}");
        }
        let (ok, out, err) = kubectl(&bin, &admin, &["certificate", "approve", &approve], None);
        assert!(ok && out.contains("approved"), "kubectl {version} certificate approve: {out}{err}");
        let (ok, out, err) = kubectl(&bin, &admin, &["certificate", "deny", &deny], None);
        assert!(ok && out.contains("denied"), "kubectl {version} certificate deny: {out}{err}");
        let issued = wait_for("the approved request to be signed", 30, || {
            let (_, out, _) =
                kubectl(&bin, &admin, &["get", "csr", &approve, "-o", "jsonpath={.status.certificate}"], None);
            (!out.is_empty()).then_some(out)
        });
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD.decode(issued.trim()).expect("base64");
        assert!(String::from_utf8_lossy(&pem).starts_with("-----BEGIN CERTIFICATE-----"));
        let (_, out, _) = kubectl(&bin, &admin, &["get", "csr", &deny], None);
        assert!(out.contains("Denied") && !out.contains("Issued"), "kubectl {version}: {out}");
    }
    // Refused with the field that is wrong: a node certificate asking for server auth, or for
    // another subject, and a request that is not a PEM CSR.
    let (_, bin) = common::newest_kubectl();
    let kubelet = "kubernetes.io/kube-apiserver-client-kubelet";
    for (body, field) in [
        (
            csr("bad-usage", &request("system:node:n1", "system:nodes"), kubelet, &["client auth", "server auth"]),
            "spec.usages",
        ),
        (csr("bad-subject", &request("system:node:n1", "system:masters"), kubelet, &["client auth"]), "spec.request"),
        (csr("not-pem", "bm90IGEgY3Ny", kubelet, &["client auth"]), "spec.request"),
    ] {
        let (ok, out, err) = kubectl(&bin, &admin, &["create", "-f", "-"], Some(&body));
        assert!(!ok && err.contains(field) && err.contains("is invalid"), "{field}: {out}{err}");
    }
    let (_, out, _) = kubectl(&bin, &admin, &["get", "csr", "-o", "name"], None);
    assert!(!out.contains("bad-") && !out.contains("not-pem"), "a refused request was written: {out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_trusts_the_server_by_the_pinned_ca_hash_and_refuses_a_wrong_pin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &[]);
    let (token, join_hint) = create_token(dir.path(), "10m");
    let pin = join_hint
        .split_whitespace()
        .skip_while(|w| *w != "--discovery-token-ca-cert-hash")
        .nth(1)
        .unwrap_or_else(|| panic!("no pin in the join command: {join_hint}"))
        .to_string();
    assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64, "{pin}");
    let listed = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["token", "list", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("shepherd token list");
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    let (id, secret) = token.split_once('.').expect("id.secret");
    assert!(listed.lines().any(|l| l.starts_with(id) && !l.contains("<never>")), "token list: {listed}");
    assert!(!listed.contains(secret), "token list shows a token's secret: {listed}");

    // cluster-info is the one thing an anonymous client may read, and only read.
    let anonymous = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let path = format!("{}/api/v1/namespaces/kube-public/configmaps/cluster-info", server.url);
    let info: Value = anonymous.get(&path).send().await.expect("get").json().await.expect("json");
    assert!(info["data"]["kubeconfig"].as_str().is_some_and(|k| k.contains(&server.url)), "{info}");
    assert_eq!(anonymous.delete(&path).send().await.expect("delete").status(), 401);
    let other = format!("{}/api/v1/namespaces/kube-public/configmaps", server.url);
    assert_eq!(anonymous.get(&other).send().await.expect("list").status(), 401);

    let wrong_dir = tempfile::tempdir().expect("tempdir");
    let wrong_pin = format!("sha256:{}", "0".repeat(64));
    let refused =
        agent(wrong_dir.path(), &server.url, &["--join-token", &token, "--discovery-token-ca-cert-hash", &wrong_pin])
            .output()
            .expect("agent with a wrong pin");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("does not match"), "{err}");
    assert!(!wrong_dir.path().join("node.kubeconfig").exists());
    let csrs = admin_ok(dir.path(), &["get", "csr", "-o", "name"], None);
    assert!(csrs.trim().is_empty(), "an agent that did not trust the server filed a request: {csrs}");

    let agent_dir = tempfile::tempdir().expect("tempdir");
    let _child = KillOnDrop(
        agent(agent_dir.path(), &server.url, &["--join-token", &token, "--discovery-token-ca-cert-hash", &pin])
            .spawn()
            .expect("start agent"),
    );
    wait_for("the node joined by the pinned hash to register", 90, || {
        let (_, bin) = common::newest_kubectl();
        let (ok, out, _) =
            kubectl(&bin, &dir.path().join("admin.kubeconfig"), &["get", "node", NODE, "-o", "name"], None);
        (ok && out.trim() == format!("node/{NODE}")).then_some(())
    });
}

/// The pin `shepherd token create` printed in its join command.
fn pin_of(join_hint: &str) -> String {
    join_hint
        .split_whitespace()
        .skip_while(|w| *w != "--discovery-token-ca-cert-hash")
        .nth(1)
        .unwrap_or_else(|| panic!("no pin in the join command: {join_hint}"))
        .to_string()
}

/// A server that answers every request with `cluster_info`, as a man in the middle would: the
/// cluster's own ConfigMap, with what the test changed in it. Its address.
async fn impostor(cluster_info: Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let app = axum::Router::new().fallback(move || {
        let body = cluster_info.clone();
        async move { axum::Json(body) }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A CA certificate of nobody's cluster, PEM.
fn another_ca() -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).expect("CA").pem()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_join_trusts_cluster_info_only_as_signed_for_its_token_and_a_swapped_ca_fails_it() {
    use shepherd_apiserver::bootstrap_token::{BootstrapToken, verified_kubeconfig};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = secure_server(dir.path(), &[]);
    let (token, join_hint) = create_token(dir.path(), "10m");
    let pin = pin_of(&join_hint);
    let (id, _) = token.split_once('.').expect("id.secret");

    // The server signs cluster-info for the new token, as kube-controller-manager's bootstrapsigner.
    let anonymous = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let path = format!("{}/api/v1/namespaces/kube-public/configmaps/cluster-info", server.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    let info: Value = loop {
        let info: Value = anonymous.get(&path).send().await.expect("get").json().await.expect("json");
        if info["data"].get(format!("jws-kubeconfig-{id}")).is_some() {
            break info;
        }
        assert!(Instant::now() < deadline, "cluster-info was not signed for token {id}: {info}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let data = info["data"].as_object().expect("data").clone();
    let parsed = BootstrapToken::parse(&token).expect("token");
    assert!(verified_kubeconfig(&data, &parsed).is_ok(), "the signature does not check out: {info}");

    // A man in the middle serves cluster-info with its own CA and the cluster's signature.
    let kubeconfig = data["kubeconfig"].as_str().expect("kubeconfig");
    let real_ca = kubeconfig.lines().find_map(|l| l.trim().strip_prefix("certificate-authority-data: ")).expect("CA");
    use base64::Engine;
    let fake_ca = base64::engine::general_purpose::STANDARD.encode(another_ca());
    let mut tampered = info.clone();
    tampered["data"]["kubeconfig"] = json!(kubeconfig.replace(real_ca, &fake_ca));
    let fake = impostor(tampered).await;
    for trust in [vec!["--discovery-token-unsafe-skip-ca-verification"], vec!["--discovery-token-ca-cert-hash", &pin]] {
        let agent_dir = tempfile::tempdir().expect("tempdir");
        let mut args = vec!["--join-token", &token];
        args.extend(&trust);
        let out = agent(agent_dir.path(), &fake, &args).output().expect("agent against the impostor");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(&format!("is not signed by token \"{id}\"")), "{trust:?}: {err}");
        let left: Vec<_> = std::fs::read_dir(agent_dir.path()).expect("dir").flatten().map(|e| e.file_name()).collect();
        assert!(!left.iter().any(|f| f == "ca.crt" || f == "node.kubeconfig"), "written after a refused join: {left:?}");
    }

    // A token the cluster does not sign with is refused once the wait is over.
    let unsigning = json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": "bootstrap-token-nosign", "namespace": "kube-system"},
        "stringData": {"token-id": "nosign", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"}});
    admin_ok(dir.path(), &["apply", "-f", "-"], Some(&unsigning.to_string()));
    let agent_dir = tempfile::tempdir().expect("tempdir");
    let args = ["--join-token", "nosign.0123456789abcdef", "--discovery-token-unsafe-skip-ca-verification"];
    let out = agent(agent_dir.path(), &server.url, &[&args[..], &["--join-timeout", "2s"]].concat())
        .output()
        .expect("agent with a token not for signing");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("holds no signature for token id \"nosign\""), "{err}");
    let csrs = admin_ok(dir.path(), &["get", "csr", "-o", "name"], None);
    assert!(csrs.trim().is_empty(), "an agent that did not trust the server filed a request: {csrs}");

    // The genuine cluster-info, trusted on its signature alone, is enough to join.
    let agent_dir = tempfile::tempdir().expect("tempdir");
    let _child = KillOnDrop(
        agent(agent_dir.path(), &server.url, &["--join-token", &token, "--discovery-token-unsafe-skip-ca-verification"])
            .spawn()
            .expect("start agent"),
    );
    wait_for("the node joined on cluster-info's signature to register", 90, || {
        let (_, bin) = common::newest_kubectl();
        let (ok, out, _) =
            kubectl(&bin, &dir.path().join("admin.kubeconfig"), &["get", "node", NODE, "-o", "name"], None);
        (ok && out.trim() == format!("node/{NODE}")).then_some(())
    });
    assert_eq!(std::fs::read_to_string(agent_dir.path().join("ca.crt")).ok(), Some(common::ca_pem(dir.path())));
}

/// The serial, subject and expiry of the PEM certificate in `path`.
fn certificate_at(path: &Path) -> (Vec<u8>, String, i64) {
    let pem = std::fs::read_to_string(path).expect("certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
    let cert = pem.parse_x509().expect("certificate");
    (cert.raw_serial().to_vec(), cert.subject().to_string(), cert.validity().not_after.timestamp())
}

/// `shepherd server` over TLS on `port`, signing certificates for 30 s.
fn short_signing_server(dir: &Path, port: u16) -> common::Daemon {
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--controllers", "none", "--cluster-signing-duration", "30s", "--data-dir"])
        .arg(dir)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start shepherd");
    common::Daemon::from_child(child)
}

#[test]
fn a_joined_node_renews_its_certificate_before_it_expires_and_keeps_working_past_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let mut server = short_signing_server(dir.path(), port);
    let (token, _) = create_token(dir.path(), "10m");
    let ca = dir.path().join("pki/ca.crt");
    let agent_dir = tempfile::tempdir().expect("tempdir");
    let _child = KillOnDrop(
        agent(agent_dir.path(), &server.url, &["--join-token", &token, "--certificate-authority", ca.to_str().expect("path")])
            .args(["--lease-seconds", "1"])
            .spawn()
            .expect("start agent"),
    );
    let node_crt = agent_dir.path().join("node.crt");
    wait_for("the agent's first certificate", 90, || node_crt.exists().then_some(()));
    let (first_serial, subject, first_expiry) = certificate_at(&node_crt);
    assert!(subject.contains("CN=system:node:joined-1") && subject.contains("O=system:nodes"), "{subject}");
    let now = jiff::Timestamp::now().as_second();
    assert!(first_expiry <= now + 31, "the first certificate is valid until {first_expiry}, now is {now}");

    // Renewed before it expires, by a request of the node itself that the approver took as its own.
    let (serial, renewed_subject, expiry) = wait_for("a renewed certificate", 60, || {
        let c = certificate_at(&node_crt);
        (c.0 != first_serial).then_some(c)
    });
    assert!(jiff::Timestamp::now().as_second() < first_expiry, "renewed only after the first certificate expired");
    assert_eq!(renewed_subject, subject);
    assert!(expiry > first_expiry && serial != first_serial);
    let csrs: Value = serde_json::from_str(&admin_ok(dir.path(), &["get", "csr", "-o", "json"], None)).expect("json");
    let renewals: Vec<&Value> = csrs["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|c| c["spec"]["username"] == "system:node:joined-1")
        .collect();
    assert!(!renewals.is_empty(), "no request from the node itself: {csrs}");
    let approved = &renewals[0]["status"]["conditions"][0];
    assert_eq!(approved["type"], "Approved", "{csrs}");
    assert!(approved["message"].as_str().is_some_and(|m| m.contains("self kubelet client certificate")), "{csrs}");
    let kubeconfig = std::fs::read_to_string(agent_dir.path().join("node.kubeconfig")).expect("kubeconfig");
    let on_disk = std::fs::read_to_string(&node_crt).expect("certificate");
    use base64::Engine;
    assert!(kubeconfig.contains(&base64::engine::general_purpose::STANDARD.encode(&on_disk)), "the kubeconfig lags");

    // Past the first certificate's expiry, a server restart closes every connection: the node's new
    // ones must present a certificate still valid.
    wait_for("the first certificate to expire", 60, || (jiff::Timestamp::now().as_second() > first_expiry + 1).then_some(()));
    server.terminate();
    // Dropped before the restart: a Daemon's drop ends every process with its command line.
    drop(server);
    let restarted_at = jiff::Timestamp::now();
    let server = short_signing_server(dir.path(), port);
    let renew_time = || {
        let out = admin_ok(
            dir.path(),
            &["get", "lease", NODE, "-n", "kube-node-lease", "-o", "jsonpath={.spec.renewTime}"],
            None,
        );
        out.parse::<jiff::Timestamp>().ok()
    };
    wait_for("the node to renew its lease through the restarted server", 60, || {
        renew_time().filter(|t| *t > restarted_at).map(|_| ())
    });
    let (_, bin) = common::newest_kubectl();
    let (ok, out, err) =
        kubectl(&bin, &agent_dir.path().join("node.kubeconfig"), &["get", "node", NODE, "-o", "name"], None);
    assert!(ok && out.trim() == format!("node/{NODE}"), "the node kubeconfig on disk: {out}{err}");
    drop(server);
}
