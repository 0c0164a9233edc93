//! How `shepherd server --store etcd` reaches its etcd: started before etcd, or losing it while
//! serving, it listens, says why it is not ready and becomes ready once etcd answers; and it talks
//! TLS with client certificates to an etcd that requires them (--etcd-cafile, --etcd-certfile,
//! --etcd-keyfile).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use serde_json::json;
use shepherd_store::{LocalEtcd, LocalEtcdTls};

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

/// `shepherd server --store etcd` with `extra`, its log in `dir/server.log`.
fn server(dir: &Path, endpoint: &str, extra: &[&str]) -> Daemon {
    std::fs::create_dir_all(dir).expect("dir");
    let log = std::fs::File::create(dir.join("server.log")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--insecure-loopback", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--store", "etcd", "--etcd-endpoints", endpoint, "--controllers", "none"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start shepherd");
    Daemon::from_child(child)
}

async fn get(http: &reqwest::Client, url: &str) -> (u16, String) {
    let r = http.get(url).send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

async fn wait_ready(http: &reqwest::Client, url: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (code, body) = get(http, &format!("{url}/readyz?verbose")).await;
        if code == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "not ready within {within:?}: {code} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_configmap(http: &reqwest::Client, url: &str, name: &str) {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}});
    let r = http.post(format!("{url}{CONFIGMAPS}")).json(&cm).send().await.expect("create");
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap_or_default());
    let (code, body) = get(http, &format!("{url}{CONFIGMAPS}/{name}")).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_before_its_etcd_is_not_ready_until_etcd_answers() {
    let mut etcd = LocalEtcd::unstarted().unwrap_or_else(|e| panic!("this test runs a real etcd: {e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(dir.path(), &etcd.endpoint(), &[]);
    let http = reqwest::Client::new();

    // It listens and says what is missing, on /readyz and in its log; it is alive all the same.
    let (code, body) = get(&http, &format!("{}/readyz", s.url)).await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("[-]store failed") && body.contains(&format!("cannot reach etcd at {}", etcd.endpoint())),
        "{body}"
    );
    let (code, _) = get(&http, &format!("{}/livez", s.url)).await;
    assert_eq!(code, 200);
    let (code, body) = get(&http, &format!("{}{CONFIGMAPS}", s.url)).await;
    assert_eq!(code, 503, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("a Status");
    assert_eq!(status["reason"], "ServiceUnavailable", "{status}");
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
    assert!(log.contains("cannot reach etcd"), "the log says why: {log}");

    // A few retries later etcd comes up: the server becomes ready and serves.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, _) = get(&http, &format!("{}/readyz", s.url)).await;
    assert_eq!(code, 503, "still not ready while etcd is down");
    let started = tokio::task::spawn_blocking(move || etcd.restart().map(|()| etcd)).await.expect("join");
    let mut etcd = started.unwrap_or_else(|e| panic!("starting etcd: {e}"));
    wait_ready(&http, &s.url, Duration::from_secs(60)).await;
    create_configmap(&http, &s.url, "after-etcd").await;

    // etcd gone while serving: not ready again, naming the store, until etcd is back.
    etcd.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = get(&http, &format!("{}/readyz?verbose", s.url)).await;
        if code == 503 {
            assert!(body.contains("[-]store failed"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "still ready 30 s after etcd died: {code} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let restarted = tokio::task::spawn_blocking(move || etcd.restart().map(|()| etcd)).await.expect("join");
    let _etcd = restarted.unwrap_or_else(|e| panic!("restarting etcd: {e}"));
    wait_ready(&http, &s.url, Duration::from_secs(60)).await;
    create_configmap(&http, &s.url, "after-restart").await;
}

/// A CA, and certificates it signed for etcd (serving 127.0.0.1) and for a client, as PEM files
/// in `dir`.
fn make_pki(dir: &Path) -> (LocalEtcdTls, std::path::PathBuf, std::path::PathBuf) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "etcd test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("issuer");
    let sign = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        (params.signed_by(&key, &issuer).expect("sign").pem(), key.serialize_pem())
    };
    let (server_cert, server_key) =
        sign(vec!["127.0.0.1".into(), "localhost".into()], "etcd", ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = sign(vec![], "shepherd-apiserver", ExtendedKeyUsagePurpose::ClientAuth);
    let write = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).expect("write pem");
        path
    };
    let tls = LocalEtcdTls {
        ca_file: write("ca.crt", &ca_pem),
        cert_file: write("etcd.crt", &server_cert),
        key_file: write("etcd.key", &server_key),
    };
    (tls, write("client.crt", &client_cert), write("client.key", &client_key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_talks_tls_with_a_client_certificate_to_an_etcd_that_requires_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tls, client_cert, client_key) = make_pki(dir.path());
    let ca = tls.ca_file.clone();
    let etcd = LocalEtcd::start_tls(tls).unwrap_or_else(|e| panic!("this test runs a real etcd: {e}"));
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let http = reqwest::Client::new();
    let (ca, cert, key) =
        (ca.to_str().expect("path"), client_cert.to_str().expect("path"), client_key.to_str().expect("path"));

    // Without a client certificate etcd refuses the server: not ready, and the store check says so.
    let mut refused = server(&dir.path().join("refused"), &endpoint, &["--etcd-cafile", ca]);
    let (code, body) = get(&http, &format!("{}/readyz", refused.url)).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("[-]store failed"), "{body}");
    refused.kill9();

    // With one it is served, and what it writes is in etcd for the next server to read.
    let s = server(
        &dir.path().join("a"),
        &endpoint,
        &["--etcd-cafile", ca, "--etcd-certfile", cert, "--etcd-keyfile", key],
    );
    wait_ready(&http, &s.url, Duration::from_secs(60)).await;
    create_configmap(&http, &s.url, "over-tls").await;
    let other = server(
        &dir.path().join("b"),
        &endpoint,
        &["--etcd-cafile", ca, "--etcd-certfile", cert, "--etcd-keyfile", key],
    );
    wait_ready(&http, &other.url, Duration::from_secs(60)).await;
    let (code, body) = get(&http, &format!("{}{CONFIGMAPS}/over-tls", other.url)).await;
    assert_eq!(code, 200, "{body}");
}
