//! `kube-root-ca.crt` holds what verifies the server pods reach: the cluster CA when the server
//! serves the certificate it generated, `--root-ca-file` when given, else the root end of the
//! `--tls-cert` chain. A client holding only the published bundle reaches the server over TLS.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, ca_pem};
use serde_json::Value;
use shepherd_apiserver::pki::ClusterCa;

const TOKEN: &str = "adm1n-t0ken";

/// A TLS server running only the root-ca-cert-publisher, with `extra` flags.
fn server(data_dir: &Path, extra: &[&str]) -> Daemon {
    Daemon::spawn("server", data_dir, &["--controllers", "root-ca-cert-publisher", "--token", TOKEN], extra)
}

fn client_trusting(pem: &str) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().tls_built_in_root_certs(false);
    for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes()).expect("PEM bundle") {
        builder = builder.add_root_certificate(cert);
    }
    builder.build().expect("client")
}

/// The certificates of a PEM text, as their base64 bodies: equal bundles, whatever their line breaks.
fn bodies(pem: &str) -> Vec<String> {
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .map(|c| c.split("-----END CERTIFICATE-----").next().unwrap_or("").split_whitespace().collect())
        .collect()
}

/// The published bundle, once the publisher has written it into `default`; reads it with the
/// server's own CA so that the read does not depend on what is being tested.
async fn published(url: &str, server_ca: &str) -> String {
    let http = client_trusting(server_ca);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = http.get(format!("{url}/api/v1/namespaces/default/configmaps/kube-root-ca.crt")).bearer_auth(TOKEN).send().await;
        if let Ok(r) = r
            && r.status() == 200
        {
            let cm: Value = r.json().await.expect("ConfigMap");
            return cm["data"]["ca.crt"].as_str().expect("ca.crt").to_string();
        }
        assert!(Instant::now() < deadline, "kube-root-ca.crt never appeared in default");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a client holding only `bundle` verifies the server at `url`.
async fn verifies(url: &str, bundle: &str) -> bool {
    client_trusting(bundle).get(format!("{url}/version")).send().await.is_ok_and(|r| r.status() == 200)
}

#[tokio::test]
async fn pods_get_the_ca_that_verifies_the_serving_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Certificates of an outside CA, as an operator brings them with --tls-cert.
    let outside = ClusterCa::generate().expect("CA");
    let serving = outside.serving_cert(&["127.0.0.1".to_string(), "localhost".to_string()]).expect("serving cert");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("utf-8 path").to_string()
    };
    let leaf = write("leaf.crt", &serving.cert_pem);
    let full_chain = write("fullchain.crt", &format!("{}{}", serving.cert_pem, outside.cert_pem()));
    let key = write("serving.key", &serving.key_pem);
    let bundle = write("bundle.crt", outside.cert_pem());

    // The generated serving certificate: the cluster CA, as before.
    let own = dir.path().join("own");
    let s = server(&own, &[]);
    let ca = published(&s.url, &ca_pem(&own)).await;
    assert_eq!(bodies(&ca), bodies(&ca_pem(&own)));
    assert!(verifies(&s.url, &ca).await, "the cluster CA does not verify the generated certificate");
    drop(s);

    // --tls-cert with its full chain and no bundle: the chain's root, not the cluster CA.
    let chained = dir.path().join("chained");
    let s = server(&chained, &["--tls-cert", &full_chain, "--tls-key", &key]);
    let ca = published(&s.url, outside.cert_pem()).await;
    assert_eq!(bodies(&ca), bodies(outside.cert_pem()), "published: {ca}");
    assert_ne!(bodies(&ca), bodies(&ca_pem(&chained)), "the cluster CA does not verify --tls-cert");
    assert!(verifies(&s.url, &ca).await, "the published CA does not verify the server");
    drop(s);

    // --tls-cert without its chain, with --root-ca-file: the bundle as given.
    let bundled = dir.path().join("bundled");
    let s = server(&bundled, &["--tls-cert", &leaf, "--tls-key", &key, "--root-ca-file", &bundle]);
    let ca = published(&s.url, outside.cert_pem()).await;
    assert_eq!(ca, outside.cert_pem());
    assert!(verifies(&s.url, &ca).await, "the --root-ca-file bundle does not verify the server");
    drop(s);

    // A bundle that is not PEM stops the server with the flag named.
    let junk = write("junk.crt", "not a certificate");
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("server")
        .arg("--data-dir")
        .arg(dir.path().join("junk"))
        .args(["--listen", "127.0.0.1:0", "--controllers", "none", "--root-ca-file", &junk])
        .output()
        .expect("run shepherd");
    assert!(!out.status.success(), "started with a --root-ca-file that holds no certificate");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--root-ca-file"), "{err}");
}
