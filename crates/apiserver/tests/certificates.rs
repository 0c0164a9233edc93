//! CertificateSigningRequests over real HTTP: the server, not the client, says who asked, and
//! approving takes the `approve` verb on the request's signer, as in Kubernetes.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

fn request_pem(cn: &str, org: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name.push(rcgen::DnType::OrganizationName, org);
    base64::engine::general_purpose::STANDARD.encode(params.serialize_request(&key).expect("csr").pem().expect("pem"))
}

fn csr(name: &str, cn: &str, org: &str, signer: &str) -> Value {
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
        "spec": {"request": request_pem(cn, org), "signerName": signer, "usages": ["digital signature", "client auth"],
            "username": "system:admin", "groups": ["system:masters"]}})
}

async fn cluster_role(s: &Server, name: &str, rules: Value, user: &str) {
    s.create(
        &format!("{RBAC}/clusterroles"),
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules}),
    )
    .await;
    s.create(
        &format!("{RBAC}/clusterrolebindings"),
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]}),
    )
    .await;
}

fn approved(obj: &Value) -> Value {
    let mut body = obj.clone();
    body["status"] = json!({"conditions": [{"type": "Approved", "status": "True", "reason": "ByCarol"}]});
    body
}

#[tokio::test]
async fn a_bootstrapper_cannot_claim_another_requester_and_files_only_node_requests() {
    let s = start().await;
    let bootstrapper = s.user("system:bootstrap:abcdef", &["system:bootstrappers"]);
    let kubelet = "kubernetes.io/kube-apiserver-client-kubelet";
    let r = bootstrapper.post(CSRS, &csr("node-csr-1", "system:node:n1", "system:nodes", kubelet)).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["spec"]["username"], "system:bootstrap:abcdef");
    let groups = r.body["spec"]["groups"].as_array().expect("groups");
    assert!(
        !groups.contains(&json!("system:masters")) && groups.contains(&json!("system:bootstrappers")),
        "{groups:?}"
    );
    // Bootstrappers may file requests, nothing else.
    assert_eq!(bootstrapper.get("/api/v1/namespaces/default/pods").await.code, StatusCode::FORBIDDEN);
    let r = bootstrapper.put(&format!("{CSRS}/node-csr-1/approval"), &approved(&r.body)).await;
    assert_eq!(r.code, StatusCode::FORBIDDEN, "a bootstrapper approved its own request: {}", r.body);
}

#[tokio::test]
async fn approving_takes_the_approve_verb_on_the_signer_not_only_the_approval_subresource() {
    let s = start().await;
    let signer = "kubernetes.io/kube-apiserver-client";
    let created = s.create(CSRS, &csr("alice", "alice", "dev", signer)).await;
    cluster_role(&s, "csr-approval", json!([
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["update"]}]),
        "carol")
    .await;
    let carol = s.user("carol", &[]);
    let path = format!("{CSRS}/alice/approval");
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let r = carol.put(&path, &approved(&created)).await;
        if r.code != StatusCode::FORBIDDEN || r.body["message"].as_str().is_some_and(|m| m.contains("signerName")) {
            break r;
        }
        assert!(Instant::now() < deadline, "carol's role never took effect: {}", r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.code, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body["message"].as_str().unwrap_or("").contains(signer), "{}", refused.body);
    assert!(
        s.get(&format!("{CSRS}/alice")).await.body["status"]["conditions"].is_null(),
        "a refused approval was kept"
    );

    cluster_role(
        &s,
        "client-signer",
        json!([{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
        "resourceNames": ["kubernetes.io/*"], "verbs": ["approve"]}]),
        "carol",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = carol.put(&path, &approved(&created)).await;
        if r.code == StatusCode::OK {
            assert_eq!(r.body["status"]["conditions"][0]["type"], "Approved");
            assert_eq!(r.body["spec"], created["spec"], "approval changed the request");
            break;
        }
        assert!(Instant::now() < deadline, "carol may approve for kubernetes.io/* and still cannot: {}", r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_request_created_by_server_side_apply_cannot_claim_to_be_a_bootstrapper() {
    let s = start().await;
    let mallory = s.user("mallory", &["dev"]);
    let kubelet = "kubernetes.io/kube-apiserver-client-kubelet";
    let mut spoofed = csr("spoofed", "system:node:n1", "system:nodes", kubelet);
    spoofed["spec"]["username"] = json!("system:bootstrap:abcdef");
    spoofed["spec"]["groups"] = json!(["system:bootstrappers", "system:authenticated"]);
    cluster_role(
        &s,
        "csr-writer",
        json!([{"apiGroups": ["certificates.k8s.io"],
        "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "patch", "update"]}]),
        "mallory",
    )
    .await;
    let path = format!("{CSRS}/spoofed?fieldManager=mallory");
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = mallory.patch(&path, &spoofed, "application/apply-patch+yaml").await;
        if r.body["message"].as_str().is_some_and(|m| m.contains("spec.username")) || r.code != StatusCode::FORBIDDEN {
            break r;
        }
        assert!(Instant::now() < deadline, "mallory's role never took effect: {}", r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.code, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(s.get(&format!("{CSRS}/spoofed")).await.code, StatusCode::NOT_FOUND, "the spoofed request was written");
}
