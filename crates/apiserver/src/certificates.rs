//! CertificateSigningRequests (`certificates.k8s.io/v1`): what the server checks and fills in when one
//! is created or approved, and the approver and signer that turn a joining node's request into its
//! client certificate, as kube-controller-manager's csrapproving and csrsigning controllers do.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::{ApiError, Cause, JsonPath, str_at, strings_at};

use crate::auth::{NODES_GROUP, UserInfo};
use crate::bootstrap_token::BOOTSTRAPPERS_GROUP;
use crate::pki::ClusterCa;
use crate::service::{ApiService, ListOptions, now_rfc3339};
use crate::write_options::WriteOptions;

/// Client certificates of node agents: `CN=system:node:NAME, O=system:nodes`, client auth only.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Client certificates of users, signed once an administrator approves them.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

/// Kubernetes' key usages, as `spec.usages` spells them.
const KNOWN_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// Usages a kubelet client certificate may ask for: client auth, with the signature and key
/// usages its key needs (Kubernetes allows the same set).
const KUBELET_CLIENT_USAGES: &[&str] = &["client auth", "digital signature", "key encipherment"];

/// Longest validity a signed certificate gets unless the server is told otherwise (the default of
/// kube-controller-manager's `--cluster-signing-duration`); a request may ask for less with
/// `spec.expirationSeconds`.
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// Shortest `spec.expirationSeconds` accepted, as in Kubernetes.
const MIN_EXPIRATION_SECONDS: i64 = 600;

/// The subject of a PEM certificate request whose signature checks out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSubject {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// Whether the request asks for subject alternative names (DNS, IP, email, URI).
    pub has_alt_names: bool,
}

/// Reads a PEM `CERTIFICATE REQUEST` and checks its self-signature; the error says what is wrong.
pub fn parse_request(pem: &[u8]) -> Result<RequestSubject, String> {
    let text = std::str::from_utf8(pem).map_err(|_| "the request is not PEM text".to_string())?;
    let (_, block) =
        x509_parser::pem::parse_x509_pem(text.as_bytes()).map_err(|e| format!("the request is not PEM: {e}"))?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err(format!("the PEM block is a {:?}, not a \"CERTIFICATE REQUEST\"", block.label));
    }
    use x509_parser::prelude::FromDer;
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| format!("the certificate request cannot be read: {e}"))?;
    csr.verify_signature().map_err(|_| "the certificate request's signature does not verify".to_string())?;
    let subject = &csr.certification_request_info.subject;
    let common_name = subject.iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or("").to_string();
    let organizations = subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_string).collect();
    let has_alt_names = csr.requested_extensions().into_iter().flatten().any(|e| {
        matches!(e, x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) if !san.general_names.is_empty())
    });
    Ok(RequestSubject { common_name, organizations, has_alt_names })
}

/// The PEM bytes of `spec.request` (base64 in JSON, as every `[]byte` field).
fn request_pem(csr: &Value) -> Result<Vec<u8>, String> {
    let encoded = csr.at("/spec/request").and_then(Value::as_str).unwrap_or("");
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "spec.request must be base64 of a PEM certificate request".to_string())
}

/// Why a kubelet client request cannot be signed, if it cannot: Kubernetes' `IsKubeletClientCSR` rules.
fn kubelet_client_problem(subject: &RequestSubject, usages: &[String]) -> Option<Cause> {
    if subject.organizations != [NODES_GROUP] {
        return Some(Cause::invalid(
            "spec.request",
            format!(
                "subject organization must be exactly \"{NODES_GROUP}\" for signer {KUBELET_CLIENT_SIGNER}, not {:?}",
                subject.organizations
            ),
        ));
    }
    if subject.common_name.strip_prefix("system:node:").is_none_or(str::is_empty) {
        return Some(Cause::invalid(
            "spec.request",
            format!(
                "subject common name must be \"system:node:NAME\" for signer {KUBELET_CLIENT_SIGNER}, not {:?}",
                subject.common_name
            ),
        ));
    }
    if subject.has_alt_names {
        return Some(Cause::invalid(
            "spec.request",
            format!("signer {KUBELET_CLIENT_SIGNER} signs no subject alternative names"),
        ));
    }
    if let Some(bad) = usages.iter().find(|u| !KUBELET_CLIENT_USAGES.contains(&u.as_str())) {
        return Some(Cause::not_supported(
            "spec.usages",
            format!(
                "usage {bad:?} is not allowed for signer {KUBELET_CLIENT_SIGNER}; allowed: {}",
                KUBELET_CLIENT_USAGES.join(", ")
            ),
        ));
    }
    if !usages.iter().any(|u| u == "client auth") {
        return Some(Cause::new(
            "FieldValueRequired",
            "spec.usages",
            format!("signer {KUBELET_CLIENT_SIGNER} needs the \"client auth\" usage"),
        ));
    }
    None
}

/// Checks a new CSR and fills in what only the server may say: who asked (`spec.username`,
/// `uid`, `groups`, `extra` of `user`; kept as sent when the request has no user, on an
/// unauthenticated listener) and an empty status.
pub(crate) fn prepare_create(obj: &mut Value, user: Option<&UserInfo>) -> Result<(), ApiError> {
    let name = str_at(obj, "/metadata/name").to_string();
    let mut causes = Vec::new();
    let signer = str_at(obj, "/spec/signerName").to_string();
    if signer.is_empty() {
        causes.push(Cause::required("spec.signerName"));
    } else if signer
        .split_once('/')
        .is_none_or(|(domain, path)| domain.is_empty() || path.is_empty() || !domain.contains('.'))
    {
        causes.push(Cause::invalid(
            "spec.signerName",
            format!("Invalid value: {signer:?}: must be a fully qualified domain and path of the form 'example.com/signer-name'"),
        ));
    }
    let usages = strings_at(obj, "/spec/usages").map(str::to_string).collect::<Vec<_>>();
    if usages.is_empty() {
        causes.push(Cause::required("spec.usages"));
    }
    for u in &usages {
        if !KNOWN_USAGES.contains(&u.as_str()) {
            causes.push(Cause::not_supported("spec.usages", format!("Unsupported value: {u:?}")));
        }
    }
    if let Some(secs) = obj.at("/spec/expirationSeconds")
        && secs.as_i64().is_none_or(|s| s < MIN_EXPIRATION_SECONDS)
    {
        causes.push(Cause::invalid(
            "spec.expirationSeconds",
            format!("Invalid value: {secs}: may not specify a duration less than 600 seconds (10 minutes)"),
        ));
    }
    match request_pem(obj).and_then(|pem| parse_request(&pem)) {
        Err(_) if obj.at("/spec/request").is_none() => causes.push(Cause::required("spec.request")),
        Err(why) => causes.push(Cause::invalid("spec.request", format!("Invalid value: {why}"))),
        Ok(subject) if signer == KUBELET_CLIENT_SIGNER => causes.extend(kubelet_client_problem(&subject, &usages)),
        Ok(_) => {}
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(kinds::CERTIFICATESIGNINGREQUEST.kind, &name, causes));
    }
    if let Some(user) = user {
        let spec = &mut obj["spec"];
        spec["username"] = json!(user.name);
        spec["uid"] = json!(user.uid);
        spec["groups"] = json!(user.groups);
        if user.extra.is_empty() {
            if let Some(s) = spec.as_object_mut() {
                s.remove("extra");
            }
        } else {
            spec["extra"] = json!(user.extra);
        }
    }
    obj["status"] = json!({});
    Ok(())
}

fn has_condition(csr: &Value, type_: &str) -> bool {
    csr.at("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| str_at(c, "/type") == type_ && str_at(c, "/status") == "True")
}

/// The object after a write to `/approval`: `old` with the conditions of `body`. Approved and
/// Denied exclude each other and, once given, stay, as in Kubernetes.
pub(crate) fn approval_update(old: &Value, body: &Value) -> Result<Value, ApiError> {
    let name = str_at(old, "/metadata/name");
    let mut conditions: Vec<Value> =
        body.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut causes = Vec::new();
    for (i, c) in conditions.iter_mut().enumerate() {
        let type_ = str_at(c, "/type").to_string();
        if type_.is_empty() {
            causes.push(Cause::required(format!("status.conditions[{i}].type")));
        }
        if matches!(type_.as_str(), "Approved" | "Denied") && str_at(c, "/status") != "True" {
            causes.push(Cause::not_supported(
                format!("status.conditions[{i}].status"),
                "Unsupported value: only \"True\" is allowed for Approved and Denied",
            ));
        }
        if c.get("status").is_none_or(Value::is_null) {
            c["status"] = json!("True");
        }
        if c.get("lastUpdateTime").is_none_or(Value::is_null) {
            c["lastUpdateTime"] = json!(now_rfc3339());
        }
        if c.get("lastTransitionTime").is_none_or(Value::is_null) {
            c["lastTransitionTime"] = json!(now_rfc3339());
        }
    }
    let new_status = json!({"conditions": conditions});
    if has_condition(&new_status, "Approved") && has_condition(&new_status, "Denied") {
        causes.push(Cause::invalid("status.conditions", "Approved and Denied conditions are mutually exclusive"));
    }
    for kept in ["Approved", "Denied"] {
        if has_condition(old, kept) && !has_condition(&new_status, kept) {
            causes.push(Cause::forbidden(
                "status.conditions",
                format!("updates may not remove a condition of type {kept:?}"),
            ));
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(kinds::CERTIFICATESIGNINGREQUEST.kind, name, causes));
    }
    let mut new = old.clone();
    if !new.get("status").is_some_and(Value::is_object) {
        new["status"] = json!({});
    }
    new["status"]["conditions"] = new_status["conditions"].clone();
    Ok(new)
}

/// A new request must name its requester as the server filled it in: a create that did not go
/// through [`prepare_create`] (server-side apply, a PUT that creates) cannot claim another user.
pub(crate) fn admit_requester(new: &Value, user: &UserInfo) -> Result<(), String> {
    let mut claimed = strings_at(new, "/spec/groups").map(str::to_string).collect::<Vec<_>>();
    let mut actual = user.groups.clone();
    claimed.sort();
    actual.sort();
    if str_at(new, "/spec/username") != user.name || claimed != actual {
        return Err(format!(
            "spec.username and spec.groups must be those of the requester ({:?}); create the request with POST",
            user.name
        ));
    }
    Ok(())
}

/// The Approved and Denied conditions of a request.
fn decision(csr: &Value) -> Vec<&str> {
    let mut out: Vec<&str> = ["Approved", "Denied"].into_iter().filter(|t| has_condition(csr, t)).collect();
    out.sort_unstable();
    out
}

/// Approving or denying is the signer's business: as in Kubernetes, a write that changes the
/// decision takes the `approve` verb on `certificates.k8s.io/signers` named after the signer (or
/// `<domain>/*`), whichever subresource it came through. `may_approve` answers for the requester.
pub(crate) fn admit_decision(old: Option<&Value>, new: &Value, may_approve: impl Fn(&str) -> bool) -> Result<(), String> {
    if old.map(decision).unwrap_or_default() == decision(new) {
        return Ok(());
    }
    let signer = str_at(new, "/spec/signerName");
    let wildcard = signer.split_once('/').map(|(domain, _)| format!("{domain}/*"));
    if may_approve(signer) || wildcard.is_some_and(|w| may_approve(&w)) {
        return Ok(());
    }
    Err(format!("user not permitted to approve requests with signerName {signer:?}"))
}

/// What the approver does with a pending request.
#[derive(Debug, PartialEq, Eq)]
pub enum Approval {
    Approve(&'static str),
    /// Left for an administrator (`kubectl certificate approve|deny`).
    Leave,
}

/// Kubernetes' csrapproving rules for kubelet client certificates: a bootstrapper asking for a
/// node's certificate, or a node renewing its own.
pub fn auto_approval(csr: &Value) -> Approval {
    if str_at(csr, "/spec/signerName") != KUBELET_CLIENT_SIGNER
        || has_condition(csr, "Approved")
        || has_condition(csr, "Denied")
    {
        return Approval::Leave;
    }
    let Ok(subject) = request_pem(csr).and_then(|pem| parse_request(&pem)) else { return Approval::Leave };
    if kubelet_client_problem(&subject, &strings_at(csr, "/spec/usages").map(str::to_string).collect::<Vec<_>>()).is_some() {
        return Approval::Leave;
    }
    let groups = strings_at(csr, "/spec/groups").map(str::to_string).collect::<Vec<_>>();
    let requester = str_at(csr, "/spec/username");
    if groups.iter().any(|g| g == BOOTSTRAPPERS_GROUP) {
        return Approval::Approve("Auto approving kubelet client certificate after SubjectAccessReview.");
    }
    if requester == subject.common_name && groups.iter().any(|g| g == NODES_GROUP) {
        return Approval::Approve("Auto approving self kubelet client certificate after SubjectAccessReview.");
    }
    Approval::Leave
}

/// The certificate for an approved request of one of our signers, valid for at most `duration`, or
/// why it cannot be signed (the reason of a `Failed` condition). `None`: nothing to do.
pub fn sign(csr: &Value, ca: &ClusterCa, duration: Duration) -> Option<Result<String, String>> {
    let signer = str_at(csr, "/spec/signerName");
    if !matches!(signer, KUBELET_CLIENT_SIGNER | CLIENT_SIGNER)
        || !has_condition(csr, "Approved")
        || has_condition(csr, "Failed")
        || csr.at("/status/certificate").and_then(Value::as_str).is_some_and(|c| !c.is_empty())
    {
        return None;
    }
    Some(sign_request(csr, ca, signer, duration))
}

fn sign_request(csr: &Value, ca: &ClusterCa, signer: &str, duration: Duration) -> Result<String, String> {
    let pem = request_pem(csr)?;
    let subject = parse_request(&pem)?;
    let usages = strings_at(csr, "/spec/usages").map(str::to_string).collect::<Vec<_>>();
    if signer == KUBELET_CLIENT_SIGNER {
        if let Some(problem) = kubelet_client_problem(&subject, &usages) {
            return Err(problem.message);
        }
    } else {
        if subject.common_name.is_empty() {
            return Err("a client certificate needs a subject common name (the user)".into());
        }
        if !usages.iter().any(|u| u == "client auth")
            || usages.iter().any(|u| matches!(u.as_str(), "server auth" | "cert sign" | "any"))
        {
            return Err(format!("signer {CLIENT_SIGNER} signs client auth certificates only; usages were {usages:?}"));
        }
    }
    let requested = csr
        .at("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(s as u64));
    let validity = requested.map_or(duration, |r| r.min(duration));
    let text = std::str::from_utf8(&pem).map_err(|_| "the request is not PEM text".to_string())?;
    ca.sign_client_request(text, validity).map_err(|e| e.to_string())
}

/// Approves and signs CertificateSigningRequests until `stop`, with certificates valid for at most
/// `duration`: woken by every change to one, and once a minute for what a missed wake-up left.
pub async fn run_controller(
    svc: ApiService,
    ca: Arc<ClusterCa>,
    duration: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let res = &kinds::CERTIFICATESIGNINGREQUEST;
    tokio::pin!(stop);
    loop {
        // The watch below starts after this revision: a request filed during the pass wakes the next.
        let revision = svc.store().revision().await;
        if let Err(e) = reconcile_all(&svc, &ca, duration).await {
            tracing::warn!(error = %e, "certificate signing requests: a pass failed");
        }
        let watched = match revision {
            Ok(revision) => svc.store().watch(&res.key_prefix(), revision).await,
            Err(e) => Err(e),
        };
        let mut changes = match watched {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "certificate signing requests: cannot watch; checking once a minute");
                None
            }
        };
        let next_change = async {
            match changes.as_mut() {
                Some(w) => {
                    w.next().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut stop => return,
            () = next_change => {}
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
}

async fn reconcile_all(svc: &ApiService, ca: &ClusterCa, duration: Duration) -> Result<(), ApiError> {
    let res: &ResourceInfo = &kinds::CERTIFICATESIGNINGREQUEST;
    let page = svc.list(res, None, &ListOptions::default()).await?;
    for kv in &page.items {
        let csr = crate::codec::decode_listed(kv)?;
        let name = str_at(&csr, "/metadata/name").to_string();
        if let Err(e) = reconcile(svc, ca, duration, &csr, &name).await {
            tracing::warn!(csr = %name, error = %e, "certificate signing request not handled");
        }
    }
    Ok(())
}

async fn reconcile(
    svc: &ApiService,
    ca: &ClusterCa,
    duration: Duration,
    csr: &Value,
    name: &str,
) -> Result<(), ApiError> {
    let res = &kinds::CERTIFICATESIGNINGREQUEST;
    let opts = WriteOptions::default();
    let mut csr = csr.clone();
    if let Approval::Approve(message) = auto_approval(&csr) {
        let kv = svc
            .mutate(res, None, name, None, "approval", &opts, |old| {
                let mut body = old.clone();
                let mut conditions =
                    old.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
                conditions
                    .push(json!({"type": "Approved", "status": "True", "reason": "AutoApproved", "message": message}));
                body["status"] = json!({"conditions": conditions});
                approval_update(old, &body)
            })
            .await?;
        tracing::info!(csr = %name, "approved a kubelet client certificate request");
        csr = crate::codec::decode(&kv)?;
    }
    match sign(&csr, ca, duration) {
        None => {}
        Some(Ok(cert)) => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(cert);
            svc.mutate(res, None, name, None, "status", &opts, |old| {
                let mut new = old.clone();
                new["status"]["certificate"] = json!(encoded);
                Ok(new)
            })
            .await?;
            tracing::info!(csr = %name, "signed a certificate");
        }
        Some(Err(why)) => {
            svc.mutate(res, None, name, None, "status", &opts, |old| {
                let mut new = old.clone();
                let mut conditions =
                    old.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
                let now = now_rfc3339();
                conditions.push(json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": why, "lastUpdateTime": now, "lastTransitionTime": now}));
                new["status"]["conditions"] = json!(conditions);
                Ok(new)
            })
            .await?;
            tracing::warn!(csr = %name, reason = %why, "refused to sign an approved certificate request");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cn: &str, orgs: &[&str]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(rcgen::DnType::OrganizationName, *o);
        }
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn csr(pem: &str, signer: &str, usages: &[&str]) -> Value {
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "c1"},
            "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem), "signerName": signer,
                "usages": usages}})
    }

    fn bootstrapper() -> UserInfo {
        UserInfo::new("system:bootstrap:abcdef", [BOOTSTRAPPERS_GROUP])
    }

    #[test]
    fn a_node_request_from_a_bootstrapper_is_filled_in_approved_and_signed_for_the_node() {
        let mut obj = csr(
            &request("system:node:n1", &[NODES_GROUP]),
            KUBELET_CLIENT_SIGNER,
            &["digital signature", "client auth"],
        );
        prepare_create(&mut obj, Some(&bootstrapper())).unwrap();
        assert_eq!(obj["spec"]["username"], "system:bootstrap:abcdef");
        assert_eq!(
            auto_approval(&obj),
            Approval::Approve("Auto approving kubelet client certificate after SubjectAccessReview.")
        );
        let body =
            json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved"}]}});
        let approved = approval_update(&obj, &body).unwrap();
        let ca = ClusterCa::generate().unwrap();
        let cert = sign(&approved, &ca, DEFAULT_SIGNING_DURATION).unwrap().unwrap();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer| c.to_vec())
            .unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(parsed.subject().iter_common_name().next().unwrap().as_str().unwrap(), "system:node:n1");
        let days = (parsed.validity().not_after.timestamp() - parsed.validity().not_before.timestamp()) / 86400;
        assert!(days <= 366, "validity of {days} days");
    }

    fn validity_of(pem: &str) -> (i64, i64) {
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer| c.to_vec())
            .unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        (parsed.validity().not_before.timestamp(), parsed.validity().not_after.timestamp())
    }

    #[test]
    fn a_node_renewing_its_own_certificate_is_approved_and_no_node_is_approved_for_another() {
        let node = |name: &str| UserInfo::new(format!("system:node:{name}"), [NODES_GROUP]);
        let renewal = |requester: &UserInfo, cn: &str| {
            let mut obj = csr(&request(cn, &[NODES_GROUP]), KUBELET_CLIENT_SIGNER, &["digital signature", "client auth"]);
            prepare_create(&mut obj, Some(requester)).unwrap();
            auto_approval(&obj)
        };
        assert_eq!(
            renewal(&node("n1"), "system:node:n1"),
            Approval::Approve("Auto approving self kubelet client certificate after SubjectAccessReview.")
        );
        assert_eq!(renewal(&node("n2"), "system:node:n1"), Approval::Leave, "a node asking for another's identity");
        let not_a_node = UserInfo::new("system:node:n1", ["dev"]);
        assert_eq!(renewal(&not_a_node, "system:node:n1"), Approval::Leave, "a user named like a node");
    }

    #[test]
    fn the_signing_duration_bounds_a_certificate_and_a_short_one_is_backdated_by_at_most_half() {
        let mut obj =
            csr(&request("system:node:n1", &[NODES_GROUP]), KUBELET_CLIENT_SIGNER, &["digital signature", "client auth"]);
        prepare_create(&mut obj, Some(&bootstrapper())).unwrap();
        let approved =
            approval_update(&obj, &json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}})).unwrap();
        let ca = ClusterCa::generate().unwrap();
        let now = jiff::Timestamp::now().as_second();
        let (not_before, not_after) = validity_of(&sign(&approved, &ca, Duration::from_secs(30)).unwrap().unwrap());
        assert!((now + 29..=now + 32).contains(&not_after), "{not_after} for 30 s from {now}");
        assert!((now - 16..=now).contains(&not_before), "{not_before} backdated from {now}");
        let mut asks_less = approved.clone();
        asks_less["spec"]["expirationSeconds"] = json!(3600);
        let (_, not_after) = validity_of(&sign(&asks_less, &ca, DEFAULT_SIGNING_DURATION).unwrap().unwrap());
        assert!((now + 3599..=now + 3602).contains(&not_after), "a request asking for an hour: {not_after}");
    }

    #[tokio::test]
    async fn the_controller_signs_a_node_request_filed_right_after_it_started() {
        let store = Arc::new(shepherd_store::LocalStore::in_memory(Default::default()));
        let svc = ApiService::new(store, Arc::new(crate::Metrics::default()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let ca = Arc::new(ClusterCa::generate().unwrap());
        let controller = tokio::spawn(run_controller(svc.clone(), ca, Duration::from_secs(3600), async move {
            let _ = stop_rx.await;
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut obj =
            csr(&request("system:node:n1", &[NODES_GROUP]), KUBELET_CLIENT_SIGNER, &["digital signature", "client auth"]);
        prepare_create(&mut obj, Some(&bootstrapper())).unwrap();
        svc.create(&kinds::CERTIFICATESIGNINGREQUEST, None, obj).await.unwrap();
        let issued = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let kv = svc.get(&kinds::CERTIFICATESIGNINGREQUEST, None, "c1").await.unwrap();
                let csr = crate::codec::decode(&kv).unwrap();
                if let Some(cert) = csr.at("/status/certificate").and_then(Value::as_str) {
                    return cert.to_string();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the request was not signed within 10 s");
        let pem = base64::engine::general_purpose::STANDARD.decode(issued).unwrap();
        let (not_before, not_after) = validity_of(std::str::from_utf8(&pem).unwrap());
        assert!((3590..=3600 + 300).contains(&(not_after - not_before)), "{}", not_after - not_before);
        let _ = stop_tx.send(());
        controller.await.unwrap();
    }

    #[test]
    fn a_kubelet_client_request_with_a_wrong_subject_or_server_auth_is_refused_naming_the_field() {
        for (pem, usages, field) in [
            (request("alice", &[NODES_GROUP]), vec!["client auth"], "spec.request"),
            (request("system:node:n1", &["system:masters"]), vec!["client auth"], "spec.request"),
            (request("system:node:n1", &[NODES_GROUP]), vec!["client auth", "server auth"], "spec.usages"),
        ] {
            let mut obj = csr(&pem, KUBELET_CLIENT_SIGNER, &usages);
            let err = prepare_create(&mut obj, Some(&bootstrapper())).unwrap_err();
            assert_eq!(err.code(), 422);
            assert!(err.to_string().contains(field), "{err}");
        }
        let mut garbage = csr(
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            KUBELET_CLIENT_SIGNER,
            &["client auth"],
        );
        let err = prepare_create(&mut garbage, Some(&bootstrapper())).unwrap_err();
        assert!(err.to_string().contains("spec.request"), "{err}");
    }

    #[test]
    fn a_user_client_request_waits_for_an_administrator_and_approval_cannot_be_taken_back() {
        let mut obj = csr(&request("alice", &["dev"]), CLIENT_SIGNER, &["client auth"]);
        prepare_create(&mut obj, Some(&UserInfo::new("alice", ["dev"]))).unwrap();
        assert_eq!(auto_approval(&obj), Approval::Leave);
        let ca = ClusterCa::generate().unwrap();
        assert!(sign(&obj, &ca, DEFAULT_SIGNING_DURATION).is_none());
        let approved =
            approval_update(&obj, &json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}}))
                .unwrap();
        assert!(sign(&approved, &ca, DEFAULT_SIGNING_DURATION).unwrap().is_ok());
        let err =
            approval_update(&approved, &json!({"status": {"conditions": [{"type": "Denied", "status": "True"}]}}))
                .unwrap_err();
        assert!(err.to_string().contains("may not remove"), "{err}");
    }
}
