//! ServiceAccount tokens over real TLS: TokenRequest issues signed, audience-bound, expiring tokens
//! that authenticate as `system:serviceaccount:NS:NAME` until they expire or what they are bound to is
//! gone; `kubectl create token` gets one; and a pod reads its mounted token, namespace and CA and calls
//! the API with them, held to RBAC like any user. A user-supplied RSA key signs RS256 tokens.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{Daemon, https_client, kubectls_under_test, run_with_stdin};
use serde_json::{Value, json};

const ADMIN: &str = "admin-t0ken";

/// A `shepherd <mode>` over TLS with `--token` for the administrator.
fn secure(mode: &str, dir: &Path, extra: &[&str]) -> Daemon {
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg(mode)
        .arg("--data-dir")
        .arg(dir)
        .args(["--token", ADMIN])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start shepherd");
    let daemon = Daemon::from_child(child);
    assert!(daemon.url.starts_with("https://"), "served without TLS: {}", daemon.url);
    daemon
}

struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let code = resp.status().as_u16();
        (code, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, token, None).await
    }

    async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, token, Some(body)).await
    }

    async fn create_account(&self, name: &str) -> String {
        let (code, sa) =
            self.post("/api/v1/namespaces/default/serviceaccounts", ADMIN, json!({"metadata": {"name": name}})).await;
        assert_eq!(code, 201, "{sa}");
        sa["metadata"]["uid"].as_str().expect("uid").to_string()
    }

    /// `POST serviceaccounts/NAME/token` with `spec` as the administrator.
    async fn token_request(&self, account: &str, spec: Value) -> (u16, Value) {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
        self.post(&format!("/api/v1/namespaces/default/serviceaccounts/{account}/token"), ADMIN, body).await
    }

    async fn token(&self, account: &str, spec: Value) -> String {
        let (code, answer) = self.token_request(account, spec).await;
        assert_eq!(code, 201, "{answer}");
        answer["status"]["token"].as_str().expect("status.token").to_string()
    }

    /// The revision of the store, read through a list.
    async fn revision(&self) -> String {
        let (_, list) = self.get("/api/v1/namespaces/default/serviceaccounts", ADMIN).await;
        list["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string()
    }
}

fn api(dir: &Path, daemon: &Daemon) -> Api {
    Api { http: https_client(dir), url: daemon.url.clone() }
}

// Tokens are checked to the second with no leeway (the server checks the tokens it signed on its own
// clock), and the hidden `--service-account-min-expiration-seconds` lowers Kubernetes' 600 s floor so
// that a token can be watched to expire in seconds rather than ten minutes.
#[tokio::test]
async fn a_requested_token_authenticates_as_its_account_until_it_expires_then_gets_401() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = secure(
        "server",
        dir.path(),
        &["--listen", "127.0.0.1:0", "--controllers", "none", "--service-account-min-expiration-seconds", "4"],
    );
    let api = api(dir.path(), &daemon);
    api.create_account("bot").await;
    // Pods of the wrong shape reach the admission that mounts the account's token (it once panicked
    // on them: a 500): validation refuses them with a 422.
    for containers in [json!([1]), json!([{"name": "c", "image": "minimal", "volumeMounts": 7}])] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "odd"},
            "spec": {"serviceAccountName": "bot", "containers": containers}});
        let (code, refused) = api.post("/api/v1/namespaces/default/pods", ADMIN, pod).await;
        assert_eq!(code, 422, "{refused}");
    }
    let (code, refused) = api.token_request("bot", json!({"expirationSeconds": 2})).await;
    assert_eq!(code, 422, "{refused}");
    assert!(
        refused["message"].as_str().unwrap_or("").contains("spec.expirationSeconds: Invalid value: 2"),
        "{refused}"
    );

    let issued_at = Instant::now();
    let (code, answer) = api.token_request("bot", json!({"expirationSeconds": 4})).await;
    assert_eq!(code, 201, "{answer}");
    assert_eq!(answer["kind"], "TokenRequest");
    assert_eq!(answer["spec"]["audiences"], json!(["https://kubernetes.default.svc.cluster.local"]));
    assert!(answer["status"]["expirationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{answer}");
    let token = answer["status"]["token"].as_str().expect("token").to_string();

    // Authenticated as the account: discovery is open to every authenticated user, pods are not.
    assert_eq!(api.get("/api/v1", &token).await.0, 200);
    let (code, status) = api.get("/api/v1/namespaces/default/pods", &token).await;
    assert_eq!(code, 403);
    assert!(
        status["message"].as_str().unwrap_or("").contains("User \"system:serviceaccount:default:bot\" cannot list"),
        "{status}"
    );

    let expired = loop {
        let (code, body) = api.get("/api/v1", &token).await;
        if code != 200 {
            assert_eq!(code, 401, "{body}");
            assert_eq!(body["reason"], "Unauthorized");
            break issued_at.elapsed();
        }
        assert!(issued_at.elapsed() < Duration::from_secs(30), "the token outlived its expiry");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Issued at a whole second and valid through its last second: refused between 3 and 5 s after.
    assert!(expired >= Duration::from_secs(3), "refused after {expired:?}, before its expiry");
    assert!(expired <= Duration::from_secs(10), "refused only after {expired:?}");
}

/// A JWT with header `header` over the claims of `token`, with `signature`.
fn forged(token: &str, header: Value, signature: &str) -> String {
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let claims = token.split('.').nth(1).expect("claims");
    format!("{}.{claims}.{signature}", b64(&header))
}

#[tokio::test]
async fn tokens_for_another_audience_unsigned_forged_or_of_deleted_accounts_and_pods_get_401() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = secure("server", dir.path(), &["--listen", "127.0.0.1:0", "--controllers", "none"]);
    let api = api(dir.path(), &daemon);
    let uid = api.create_account("bot").await;
    let (code, refused) = api.token_request("bot", json!({"expirationSeconds": 60})).await;
    assert_eq!(code, 422);
    assert!(
        refused["message"].as_str().unwrap_or("").contains("may not specify a duration less than 10 minutes"),
        "{refused}"
    );

    let good = api.token("bot", json!({})).await;
    assert_eq!(api.get("/api/v1", &good).await.0, 200);
    let vault = api.token("bot", json!({"audiences": ["vault"]})).await;
    assert_eq!(api.get("/api/v1", &vault).await.0, 401, "a token for another audience");

    let before = api.revision().await;
    let header = |alg: &str| json!({"alg": alg, "typ": "JWT"});
    let signature = good.rsplit('.').next().expect("signature").to_string();
    let forgeries = [
        forged(&good, header("none"), ""),
        forged(&good, header("HS256"), &signature),
        forged(&good, header("RS256"), &signature),
        format!("{}x", good),
        "eyJhbGciOiJFUzI1NiJ9.e30.AAAA".to_string(),
        "eyJ.eyJ.eyJ".to_string(),
        "not-a-token".to_string(),
    ];
    for token in &forgeries {
        let (code, body) = api.get("/api/v1", token).await;
        assert_eq!(code, 401, "{token}: {body}");
        let (code, _) =
            api.post("/api/v1/namespaces/default/configmaps", token, json!({"metadata": {"name": "intruder"}})).await;
        assert_eq!(code, 401, "{token}");
    }
    assert_eq!(api.revision().await, before, "refused requests wrote nothing");

    // A pod-bound token lasts as long as its pod.
    let pod = json!({"metadata": {"name": "web"}, "spec": {"serviceAccountName": "bot", "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "minimal"}]}});
    let (code, pod) = api.post("/api/v1/namespaces/default/pods", ADMIN, pod).await;
    assert_eq!(code, 201, "{pod}");
    let bound = api
        .token("bot", json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": pod["metadata"]["uid"]}}))
        .await;
    let (code, wrong) = api
        .token_request(
            "bot",
            json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "other"}}),
        )
        .await;
    assert_eq!(code, 409, "{wrong}");
    assert_eq!(api.get("/api/v1", &bound).await.0, 200);
    let (code, _) = api
        .send(reqwest::Method::DELETE, "/api/v1/namespaces/default/pods/web?gracePeriodSeconds=0", ADMIN, None)
        .await;
    assert_eq!(code, 200);
    assert_eq!(api.get("/api/v1", &bound).await.0, 401, "the token of a deleted pod");
    assert_eq!(api.get("/api/v1", &good).await.0, 200, "the account's own token is unaffected");

    // Deleting the account ends its tokens, and an account re-made under the name does not revive them.
    let (code, _) =
        api.send(reqwest::Method::DELETE, "/api/v1/namespaces/default/serviceaccounts/bot", ADMIN, None).await;
    assert_eq!(code, 200);
    assert_eq!(api.get("/api/v1", &good).await.0, 401, "the token of a deleted account");
    let again = api.create_account("bot").await;
    assert_ne!(again, uid);
    assert_eq!(api.get("/api/v1", &good).await.0, 401, "the token of the account's predecessor");
    assert_eq!(api.token_request("nobody", json!({})).await.0, 404);
}

#[test]
fn kubectl_create_token_gives_a_token_for_the_account_and_audience_asked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = secure("server", dir.path(), &["--listen", "127.0.0.1:0", "--controllers", "none"]);
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let kubectl = |bin: &Path, args: &[&str]| {
        let mut cmd = Command::new(bin);
        cmd.arg("--kubeconfig").arg(&kubeconfig).args(args).env_remove("KUBECONFIG");
        let (status, out, err) = run_with_stdin(&mut cmd, None);
        assert!(status.success(), "kubectl {args:?}: {err}");
        out
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let api = api(dir.path(), &daemon);
    for (version, bin) in kubectls_under_test() {
        let account = format!("robot-{}", version.replace('.', "-"));
        kubectl(&bin, &["create", "serviceaccount", &account]);
        let token = kubectl(&bin, &["create", "token", &account, "--duration", "15m"]).trim().to_string();
        let claims =
            token.split('.').nth(1).and_then(|c| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).ok());
        let claims: Value = serde_json::from_slice(&claims.expect("a JWT")).expect("claims");
        assert_eq!(claims["sub"], format!("system:serviceaccount:default:{account}"), "kubectl {version}");
        let life = claims["exp"].as_i64().unwrap_or(0) - claims["iat"].as_i64().unwrap_or(0);
        assert_eq!(life, 900, "kubectl {version} --duration 15m");
        let vault = kubectl(&bin, &["create", "token", &account, "--audience", "vault"]).trim().to_string();
        runtime.block_on(async {
            let (code, _) = api.get("/api/v1", &token).await;
            assert_eq!(code, 200, "kubectl {version}'s token");
            let (code, status) = api.get("/api/v1/namespaces/default/secrets", &token).await;
            assert_eq!(code, 403, "{status}");
            assert_eq!(api.get("/api/v1", &vault).await.0, 401, "kubectl {version}'s token for vault");
        });
    }
}

/// A pod's script: every half second, the codes of listing pods and listing secrets in its namespace,
/// read with its mounted token, namespace and CA at the address kubelet-style variables give.
const CALLER: &str = r#"
d=/var/run/secrets/kubernetes.io/serviceaccount
while true; do
  ns=$(cat $d/namespace)
  url=https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$ns
  auth="Authorization: Bearer $(cat $d/token)"
  pods=$(curl -s -o /dev/null -w '%{http_code}' --cacert $d/ca.crt -H "$auth" $url/pods)
  secrets=$(curl -s -o /dev/null -w '%{http_code}' --cacert $d/ca.crt -H "$auth" $url/secrets)
  echo "ns=$ns pods=$pods secrets=$secrets"
  sleep 0.5
done
"#;

#[test]
fn a_pod_calls_the_api_with_its_mounted_token_and_is_held_to_rbac() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let _daemon = secure("standalone", dir.path(), &["--listen", &listen, "--runtime", "process", "--pod-network", "host"]);
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let (_, bin) = common::newest_kubectl();
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        let mut cmd = Command::new(&bin);
        cmd.arg("--kubeconfig").arg(&kubeconfig).args(args).env_remove("KUBECONFIG");
        let (status, out, err) = run_with_stdin(&mut cmd, stdin);
        (status.success(), out, err)
    };
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "caller"}, "spec": {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "minimal", "command": ["sh", "-c", CALLER]}]}});
    // The default account appears a moment after the namespace; the pod is created once it is there.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kubectl(&["get", "serviceaccount", "default"], None).0 {
        assert!(Instant::now() < deadline, "no default ServiceAccount");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, _, err) = kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&["get", "pod", "caller", "-o", "json"], None);
    assert!(ok, "{err}");
    let stored: Value = serde_json::from_str(&out).expect("pod");
    let volume = &stored["spec"]["volumes"][0];
    assert!(volume["name"].as_str().is_some_and(|n| n.starts_with("kube-api-access-")), "{volume}");
    assert_eq!(
        stored["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );

    let wait_for_line = |wanted: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (_, logs, _) = kubectl(&["logs", "caller", "--tail", "3"], None);
            if logs.lines().any(|l| l == wanted) {
                return;
            }
            let (_, status, _) = kubectl(&["get", "pod", "caller", "-o", "jsonpath={.status}"], None);
            assert!(Instant::now() < deadline, "the pod never printed {wanted:?}; logs:\n{logs}\nstatus: {status}");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    wait_for_line("ns=default pods=403 secrets=403");
    let (ok, _, err) = kubectl(
        &["create", "rolebinding", "caller-view", "--clusterrole", "view", "--serviceaccount", "default:default"],
        None,
    );
    assert!(ok, "{err}");
    // view reads pods, never secrets.
    wait_for_line("ns=default pods=200 secrets=403");
    let (ok, _, err) = kubectl(&["delete", "pod", "caller", "--wait=false"], None);
    assert!(ok, "{err}");
}

#[test]
fn a_node_gets_tokens_only_for_pods_bound_to_it_and_with_their_uid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _daemon = secure("server", dir.path(), &["--listen", "127.0.0.1:0", "--controllers", "none"]);
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["kubeconfig", "--user", "system:node:n1", "--group", "system:nodes", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("shepherd kubeconfig");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let node_config = dir.path().join("n1.kubeconfig");
    std::fs::write(&node_config, &out.stdout).expect("write");
    let admin_config = dir.path().join("admin.kubeconfig");
    let (_, bin) = common::newest_kubectl();
    let kubectl = |config: &Path, args: &[&str], stdin: Option<&str>| {
        let mut cmd = Command::new(&bin);
        cmd.arg("--kubeconfig").arg(config).args(args).env_remove("KUBECONFIG");
        let (status, out, err) = run_with_stdin(&mut cmd, stdin);
        (status.success(), out, err)
    };
    let (ok, _, err) = kubectl(&admin_config, &["create", "serviceaccount", "bot"], None);
    assert!(ok, "{err}");
    let mut uids = std::collections::HashMap::new();
    for (pod, node) in [("on-n1", "n1"), ("on-n2", "n2")] {
        let manifest = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod}, "spec": {"nodeName": node,
            "serviceAccountName": "bot", "containers": [{"name": "c", "image": "minimal"}]}});
        let (ok, _, err) = kubectl(
            &admin_config,
            &["create", "-f", "-", "-o", "jsonpath={.metadata.uid}"],
            Some(&manifest.to_string()),
        );
        assert!(ok, "{err}");
        let (_, uid, _) = kubectl(&admin_config, &["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"], None);
        uids.insert(pod, uid);
    }
    let request = |pod: Option<(&str, &str)>| {
        let mut args = vec!["create", "token", "bot"];
        if let Some((name, uid)) = pod {
            args.extend(["--bound-object-kind", "Pod", "--bound-object-name", name]);
            if !uid.is_empty() {
                args.extend(["--bound-object-uid", uid]);
            }
        }
        kubectl(&node_config, &args, None)
    };
    let (ok, token, err) = request(Some(("on-n1", &uids["on-n1"])));
    assert!(ok && token.trim().starts_with("eyJ"), "a token for its own pod: {err}");
    for (pod, why) in [
        (Some(("on-n2", uids["on-n2"].as_str())), "bound to a pod scheduled on a different node"),
        (Some(("on-n1", "")), "with a pod binding without a uid"),
        (None, "not bound to a pod"),
    ] {
        let (ok, _, err) = request(pod);
        assert!(!ok && err.contains("forbidden") && err.contains(why), "{pod:?}: {err}");
    }
}

/// `openssl args...`, which must succeed.
fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn an_rsa_key_made_by_openssl_signs_rs256_tokens_in_either_form_and_other_algorithms_get_401() {
    let keys = tempfile::tempdir().expect("tempdir");
    let pkcs1 = keys.path().join("sa-pkcs1.key");
    let pkcs8 = keys.path().join("sa-pkcs8.key");
    let path = |p: &Path| p.to_str().expect("path").to_string();
    openssl(&["genrsa", "-traditional", "-out", &path(&pkcs1), "2048"]);
    openssl(&["pkcs8", "-topk8", "-nocrypt", "-in", &path(&pkcs1), "-out", &path(&pkcs8)]);
    assert!(std::fs::read_to_string(&pkcs1).expect("key").starts_with("-----BEGIN RSA PRIVATE KEY-----"));

    let dir = tempfile::tempdir().expect("tempdir");
    let flags = |key: &Path| {
        ["--listen", "127.0.0.1:0", "--controllers", "none", "--service-account-signing-key-file", &path(key)]
            .map(str::to_string)
    };
    let first = flags(&pkcs1);
    let mut daemon = secure("server", dir.path(), &first.iter().map(String::as_str).collect::<Vec<_>>());
    let mut client = api(dir.path(), &daemon);
    client.create_account("bot").await;
    let token = client.token("bot", json!({})).await;
    let header: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token.split('.').next().expect("header")).expect("b64"),
    )
    .expect("json");
    assert_eq!(header["alg"], "RS256", "{header}");
    assert_eq!(client.get("/api/v1", &token).await.0, 200);

    let before = client.revision().await;
    let signature = token.rsplit('.').next().expect("signature").to_string();
    for alg in ["none", "HS256", "RS512", "ES256"] {
        let forged = forged(&token, json!({"alg": alg, "typ": "JWT", "kid": header["kid"]}), &signature);
        assert_eq!(client.get("/api/v1", &forged).await.0, 401, "alg {alg}");
        let (code, _) =
            client.post("/api/v1/namespaces/default/configmaps", &forged, json!({"metadata": {"name": "intruder"}})).await;
        assert_eq!(code, 401, "alg {alg}");
    }
    assert_eq!(client.revision().await, before, "refused requests wrote nothing");

    // The same key in PKCS#8 is the same signer: tokens issued before the restart still work.
    daemon.terminate();
    drop(daemon);
    let second = flags(&pkcs8);
    let daemon = secure("server", dir.path(), &second.iter().map(String::as_str).collect::<Vec<_>>());
    client = api(dir.path(), &daemon);
    assert_eq!(client.get("/api/v1", &token).await.0, 200, "a token of the same key read in PKCS#8");
}

/// The node escalation of issue 46, refused: a node (`system:node:evil`, from a token file) may
/// not create a mirror pod that runs as a cluster-admin ServiceAccount or reads a Secret, gets no
/// token through a mirror pod it may create, and cannot read the Secret.
#[tokio::test]
async fn a_node_cannot_reach_an_account_or_a_secret_through_a_mirror_pod() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "evil-node-t0ken,system:node:evil,evil,system:nodes\n").expect("token file");
    let data = dir.path().join("data");
    let daemon = secure(
        "server",
        &data,
        &["--listen", "127.0.0.1:0", "--controllers", "none", "--token-auth-file", tokens.to_str().expect("utf-8")],
    );
    let api = api(&data, &daemon);
    const NODE: &str = "evil-node-t0ken";
    let ks = "/api/v1/namespaces/kube-system";
    let (code, body) = api.post(&format!("{ks}/serviceaccounts"), ADMIN, json!({"metadata": {"name": "root"}})).await;
    assert_eq!(code, 201, "{body}");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "root"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "root", "namespace": "kube-system"}]});
    let (code, body) = api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", ADMIN, binding).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = api.post(&format!("{ks}/secrets"), ADMIN, json!({"metadata": {"name": "crown"}, "stringData": {"k": "jewels"}})).await;
    assert_eq!(code, 201, "{body}");

    let mirror = |name: &str, spec: Value| {
        let mut spec = spec;
        spec["nodeName"] = json!("evil");
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "c", "image": "minimal"}]);
        }
        json!({"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "annotations": {"kubernetes.io/config.mirror": "hash"}}})
    };
    let (code, body) = api.post(&format!("{ks}/pods"), NODE, mirror("as-root", json!({"serviceAccountName": "root"}))).await;
    assert_eq!(code, 403, "{body}");
    assert!(body["message"].as_str().unwrap_or("").ends_with("node \"evil\" can not create pods that reference a service account"), "{body}");
    let reads_secret = json!({"containers": [{"name": "c", "image": "minimal",
        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "crown", "key": "k"}}}]}]});
    let (code, body) = api.post(&format!("{ks}/pods"), NODE, mirror("reads", reads_secret)).await;
    assert_eq!(code, 403, "{body}");
    assert!(body["message"].as_str().unwrap_or("").ends_with("node \"evil\" can not create pods that reference secrets"), "{body}");

    // A mirror pod that references nothing is the node's to create; it opens nothing.
    let (code, made) = api.post(&format!("{ks}/pods"), NODE, mirror("static", json!({}))).await;
    assert_eq!(code, 201, "{made}");
    let uid = made["metadata"]["uid"].as_str().expect("uid");
    for account in ["root", "default"] {
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "static", "uid": uid}}});
        let (code, answer) = api.post(&format!("{ks}/serviceaccounts/{account}/token"), NODE, body).await;
        assert!(code == 403 || code == 400, "a token for {account} through a mirror pod: {code} {answer}");
        assert!(answer["status"]["token"].is_null(), "{answer}");
    }
    let (code, body) = api.get(&format!("{ks}/secrets/crown"), NODE).await;
    assert_eq!(code, 403, "{body}");
}
