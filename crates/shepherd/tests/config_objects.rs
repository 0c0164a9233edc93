//! ConfigMaps, Secrets and ServiceAccounts on a real `shepherd server`: every namespace gets its
//! `default` ServiceAccount (back again if deleted), `stringData` is write-only, and immutable
//! objects, oversized Secrets and bad keys are refused naming the field.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

async fn wait_for_default_account(http: &reqwest::Client, url: &str, ns: &str, not_uid: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = http.get(format!("{url}/api/v1/namespaces/{ns}/serviceaccounts/default")).send().await.expect("get");
        if r.status() == 200 {
            let sa: Value = r.json().await.expect("json");
            if sa["metadata"]["uid"] != not_uid {
                return sa;
            }
        }
        assert!(Instant::now() < deadline, "no default ServiceAccount in {ns} after 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("request");
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

fn causes(status: &Value) -> Vec<String> {
    status["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| format!("{}: {}", c["field"].as_str().unwrap_or(""), c["message"].as_str().unwrap_or("")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_namespace_has_a_default_service_account_and_gets_it_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("server", &dir.path().join("data"), &[]);
    let (http, url) = (reqwest::Client::new(), daemon.url.clone());

    wait_for_default_account(&http, &url, "default", "").await;
    let (code, _) = send(http.post(format!("{url}/api/v1/namespaces")).json(&json!({"metadata": {"name": "team"}}))).await;
    assert_eq!(code, 201);
    let first = wait_for_default_account(&http, &url, "team", "").await;
    let uid = first["metadata"]["uid"].as_str().expect("uid").to_string();

    let (code, _) = send(http.delete(format!("{url}/api/v1/namespaces/team/serviceaccounts/default"))).await;
    assert_eq!(code, 200);
    wait_for_default_account(&http, &url, "team", &uid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_and_config_maps_follow_kubernetes_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("server", &dir.path().join("data"), &["--controllers", "none"]);
    let (http, url) = (reqwest::Client::new(), daemon.url.clone());
    let secrets = format!("{url}/api/v1/namespaces/default/secrets");
    let configmaps = format!("{url}/api/v1/namespaces/default/configmaps");

    // stringData is folded into data, base64, and never stored.
    let (code, s) = send(http.post(&secrets).json(&json!({"metadata": {"name": "db"},
        "data": {"user": "YWRtaW4="}, "stringData": {"password": "s3cret!", "user": "root"}}))).await;
    assert_eq!(code, 201, "{s}");
    assert_eq!(s["data"], json!({"password": "czNjcmV0IQ==", "user": "cm9vdA=="}), "stringData wins over data");
    assert!(s.get("stringData").is_none(), "{s}");
    assert_eq!(s["type"], "Opaque");
    let (_, stored) = send(http.get(format!("{secrets}/db"))).await;
    assert_eq!(stored["data"], s["data"]);
    assert!(stored.get("stringData").is_none());

    // A Secret's type never changes; a typed Secret needs its keys.
    let (code, st) = send(http.patch(format!("{secrets}/db")).header("content-type", "application/merge-patch+json")
        .body(r#"{"type":"kubernetes.io/tls"}"#)).await;
    assert_eq!(code, 422, "{st}");
    assert!(causes(&st).iter().any(|c| c.starts_with("type: Invalid value")), "{st}");
    let (code, st) = send(http.post(&secrets).json(&json!({"metadata": {"name": "tls"}, "type": "kubernetes.io/tls",
        "data": {"tls.crt": "eA=="}}))).await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(causes(&st), ["data[tls.key]: Required value"]);

    // More than 1 MiB is refused, and so is a key no file could be named.
    let big = "x".repeat(1024 * 1024 + 1);
    let (code, st) = send(http.post(&secrets).json(&json!({"metadata": {"name": "big"}, "stringData": {"blob": big}}))).await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(causes(&st), ["data: Too long: must have at most 1048576 bytes"]);
    let (code, st) = send(http.post(&configmaps).json(&json!({"metadata": {"name": "bad"}, "data": {"a b": "1"}}))).await;
    assert_eq!(code, 422, "{st}");
    assert!(causes(&st)[0].starts_with("data[a b]: Invalid value: \"a b\": a valid config key"), "{st}");

    // Immutable: the data and the flag stay as they are; deleting is still allowed.
    let (code, _) = send(http.post(&configmaps).json(&json!({"metadata": {"name": "frozen"}, "immutable": true,
        "data": {"a": "1"}}))).await;
    assert_eq!(code, 201);
    for patch in [r#"{"data":{"a":"2"}}"#, r#"{"immutable":false}"#] {
        let (code, st) = send(http.patch(format!("{configmaps}/frozen"))
            .header("content-type", "application/merge-patch+json").body(patch)).await;
        assert_eq!(code, 422, "{patch}: {st}");
        assert!(causes(&st).iter().all(|c| c.contains("Forbidden: field is immutable when `immutable` is set")), "{st}");
    }
    let (code, _) = send(http.patch(format!("{configmaps}/frozen")).header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"ok":"yes"}}}"#)).await;
    assert_eq!(code, 200, "metadata of an immutable ConfigMap can change");
    let (code, _) = send(http.delete(format!("{configmaps}/frozen"))).await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_sees_the_downward_api_in_its_environment_and_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", &dir.path().join("data"), &[]);
    let (http, url) = (reqwest::Client::new(), daemon.url.clone());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "env-demo", "labels": {"app": "demo"}},
        "spec": {"containers": [{"name": "c", "image": "minimal",
            "command": ["sh", "-c", "echo \"name=$POD ns=$NS app=$APP mem=$MEM_MI greeting=$GREETING arg=$0\"; sleep 1000", "$(POD)"],
            "resources": {"limits": {"memory": "64Mi"}},
            "env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "GREETING", "value": "hello $(POD)"},
            ]}]}});
    let (code, body) = send(http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod)).await;
    assert_eq!(code, 201, "{body}");
    let want = "name=env-demo ns=default app=demo mem=64 greeting=hello env-demo arg=env-demo";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = http.get(format!("{url}/api/v1/namespaces/default/pods/env-demo/log")).send().await.expect("log");
        let text = r.text().await.unwrap_or_default();
        if text.contains(want) {
            break;
        }
        assert!(Instant::now() < deadline, "the container printed {text:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
