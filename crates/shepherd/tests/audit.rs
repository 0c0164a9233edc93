//! The audit log and per-user write limits on a real TLS `shepherd server`: every authenticated
//! request leaves an `audit.k8s.io/v1` Event at the level the policy gives it, and a user who
//! writes faster than the limit gets 429 with `Retry-After`, which kubectl waits out.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{https_client, newest_kubectl, run_with_stdin, secure_server};
use serde_json::{Value, json};

const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    nonResourceURLs: ["/healthz*"]
  - level: Metadata
    resources: [{group: "", resources: ["secrets"]}]
  - level: RequestResponse
    resources: [{group: "", resources: ["configmaps"]}]
  - level: Metadata
"#;

/// The log's Events, once `done` holds for them (the writer runs on a thread of its own).
async fn events_until(log: &Path, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let events: Vec<Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
        if done(&events) {
            return events;
        }
        assert!(Instant::now() < deadline, "the audit log never showed {what}; it holds:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn find(events: &[Value], f: impl Fn(&Value) -> bool) -> Option<&Value> {
    events.iter().find(|e| f(e))
}

#[tokio::test]
async fn requests_are_audited_at_the_policys_level_and_fast_writers_are_held_to_their_rate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "t0ken-of-bob,bob,1001,\"dev\"\n").expect("token file");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let log = dir.path().join("audit/audit.log");
    let p = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let server = secure_server(dir.path(), &[
        "--token", "admin-t0ken", "--token-auth-file", &p(&tokens),
        "--audit-log-path", &p(&log), "--audit-policy-file", &p(&policy),
        "--user-write-rate", "2", "--user-write-burst", "5",
    ]);
    let http = https_client(dir.path());
    let url = |path: &str| format!("{}{path}", server.url);

    let bob_as = |role: &str| json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("bob-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "bob"}]});
    let bound = http.post(url("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")).bearer_auth("admin-t0ken")
        .json(&bob_as("edit")).send().await.expect("bind");
    assert_eq!(bound.status(), 201);
    let deadline = Instant::now() + Duration::from_secs(10);
    while http.get(url("/api/v1/namespaces/default/configmaps")).bearer_auth("t0ken-of-bob").send().await.expect("get").status() != 200 {
        assert!(Instant::now() < deadline, "bob bound to edit still cannot list configmaps");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http.get(url("/healthz")).bearer_auth("admin-t0ken").send().await.expect("healthz").status(), 200);

    // A ConfigMap at RequestResponse: the request and the answer are both in the record.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"mode": "fast"}});
    let created = http.post(url("/api/v1/namespaces/default/configmaps")).bearer_auth("t0ken-of-bob")
        .header("user-agent", "audit-test/1.0").json(&cm).send().await.expect("create configmap");
    assert_eq!(created.status(), 201);
    let audit_id = created.headers().get("audit-id").expect("an Audit-Id header").to_str().expect("text").to_string();
    // A Secret at Metadata: who and what, never its data.
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
        "stringData": {"password": "hunter2-not-for-logs"}});
    let stored = http.post(url("/api/v1/namespaces/default/secrets")).bearer_auth("t0ken-of-bob").json(&secret)
        .send().await.expect("create secret");
    assert_eq!(stored.status(), 201);
    // Refused by RBAC: recorded with its 403.
    let refused = http.post(url("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")).bearer_auth("t0ken-of-bob")
        .json(&bob_as("cluster-admin")).send().await.expect("escalate");
    assert_eq!(refused.status(), 403);
    // A watch: started, and complete when it ends.
    let watched = http.get(url("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1"))
        .bearer_auth("t0ken-of-bob").send().await.expect("watch");
    assert_eq!(watched.status(), 200);
    watched.bytes().await.expect("the watch ends after its timeout");

    let is_watch = |e: &Value, stage: &str| e["verb"] == "watch" && e["stage"] == stage && e["user"]["username"] == "bob";
    let events = events_until(&log, "the watch's ResponseComplete", |events| {
        events.iter().any(|e| is_watch(e, "ResponseComplete"))
    })
    .await;
    let create = find(&events, |e| e["auditID"] == audit_id.as_str()).expect("the ConfigMap's create is recorded");
    assert_eq!(create["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(create["kind"], "Event");
    assert_eq!(create["level"], "RequestResponse");
    assert_eq!(create["stage"], "ResponseComplete");
    assert_eq!(create["verb"], "create");
    assert_eq!(create["user"]["username"], "bob");
    assert_eq!(create["user"]["groups"], json!(["dev", "system:authenticated"]));
    assert_eq!(create["userAgent"], "audit-test/1.0");
    assert_eq!(create["sourceIPs"], json!(["127.0.0.1"]));
    assert_eq!(create["objectRef"], json!({"resource": "configmaps", "namespace": "default", "apiGroup": "", "apiVersion": "v1"}));
    assert_eq!(create["responseStatus"]["code"], 201);
    assert_eq!(create["requestObject"]["data"]["mode"], "fast");
    assert_eq!(create["responseObject"]["metadata"]["name"], "settings");
    assert!(create["requestReceivedTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{create}");
    assert!(!events.iter().any(|e| e["stage"] == "RequestReceived"), "omitStages keeps RequestReceived out");

    let secret = find(&events, |e| e["objectRef"]["resource"] == "secrets" && e["verb"] == "create").expect("the Secret");
    assert_eq!(secret["level"], "Metadata");
    assert!(secret.get("requestObject").is_none() && secret.get("responseObject").is_none(), "{secret}");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!text.contains("hunter2-not-for-logs"), "a Secret's value reached the audit log");

    let denied = find(&events, |e| e["objectRef"]["name"].is_null() && e["objectRef"]["resource"] == "clusterrolebindings"
        && e["user"]["username"] == "bob").expect("the refused binding");
    assert_eq!(denied["responseStatus"]["code"], 403);
    assert!(find(&events, |e| is_watch(e, "ResponseStarted")).is_some(), "a watch records ResponseStarted");
    assert!(find(&events, |e| e["requestURI"] == "/healthz").is_none(), "the policy leaves /healthz out");

    // bob's burst is 5 and his rate 2/s: of 12 writes at once, the rest are told to come back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let burst = (0..12).map(|i| {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("burst-{i}")}});
        http.post(url("/api/v1/namespaces/default/configmaps")).bearer_auth("t0ken-of-bob").json(&cm).send()
    });
    let answers = futures::future::join_all(burst).await;
    let mut created = 0;
    let mut limited = 0;
    for answer in answers {
        let answer = answer.expect("post");
        match answer.status().as_u16() {
            201 => created += 1,
            429 => {
                limited += 1;
                let retry: u64 = answer.headers()["retry-after"].to_str().expect("text").parse().expect("seconds");
                assert!((1..=5).contains(&retry), "Retry-After {retry}");
                let status: Value = answer.json().await.expect("Status");
                assert_eq!(status["reason"], "TooManyRequests");
                assert_eq!(status["details"]["retryAfterSeconds"], retry);
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!((5..=7).contains(&created) && limited >= 5, "{created} created, {limited} limited");
    let list: Value = http.get(url("/api/v1/namespaces/default/configmaps")).bearer_auth("admin-t0ken").send().await
        .expect("list").json().await.expect("json");
    let burst_made = list["items"].as_array().expect("items").iter()
        .filter(|i| i["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("burst-"))).count();
    assert_eq!(burst_made, created, "a refused write wrote nothing");
    // An administrator is exempt; reads are never limited.
    for i in 0..12 {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("admin-{i}")}});
        let r = http.post(url("/api/v1/namespaces/default/configmaps")).bearer_auth("admin-t0ken").json(&cm).send().await.expect("post");
        assert_eq!(r.status(), 201);
    }
    // kubectl (client-go) waits out the Retry-After and succeeds.
    let kubeconfig = dir.path().join("bob.kubeconfig");
    let ca = dir.path().join("pki/ca.crt");
    std::fs::write(&kubeconfig, format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: s\n  cluster: {{server: {}, certificate-authority: {}}}\n\
         contexts:\n- name: c\n  context: {{cluster: s, user: bob}}\nusers:\n- name: bob\n  user: {{token: t0ken-of-bob}}\n",
        server.url, p(&ca))).expect("kubeconfig");
    let (version, kubectl) = newest_kubectl();
    for i in 0..8 {
        let mut cmd = std::process::Command::new(&kubectl);
        cmd.arg("--kubeconfig").arg(&kubeconfig).env_remove("KUBECONFIG")
            .args(["create", "configmap", &format!("kubectl-{i}"), "--from-literal=k=v"]);
        let (status, out, err) = run_with_stdin(&mut cmd, None);
        assert!(status.success(), "kubectl {version} create #{i} failed: {out}{err}");
    }
    let metrics = http.get(url("/metrics")).bearer_auth("admin-t0ken").send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.lines().any(|l| l.starts_with("shepherd_rate_limited_requests_total{user=\"bob\"}")), "no refusal counted");
    assert!(metrics.lines().any(|l| l.starts_with("apiserver_audit_event_total ")), "no audit events counted");
}
