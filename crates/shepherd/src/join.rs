//! Joining nodes with bootstrap tokens: `shepherd token create|list`, and the agent's side of
//! `--join-token`, which trades the token for the node's own client certificate through a
//! CertificateSigningRequest, as a kubelet's TLS bootstrap does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use clap::{Args, Subcommand};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use shepherd_apiserver::bootstrap_token::{self, BootstrapToken};
use shepherd_apiserver::certificates::KUBELET_CLIENT_SIGNER;

/// `shepherd token`: bootstrap tokens for joining agents.
#[derive(Subcommand, Clone, Debug)]
pub enum TokenCommand {
    /// Creates a bootstrap token and prints it with the command that joins a node with it.
    Create(TokenCreateArgs),
    /// Lists the bootstrap tokens (their ids, expiry and description; never their secrets).
    List(TokenClientArgs),
}

#[derive(Args, Clone, Debug)]
pub struct TokenClientArgs {
    /// The server's data directory: its admin.kubeconfig is used, and pki/ca.crt named in the
    /// join command.
    #[arg(long, env = "SHEPHERD_DATA_DIR", default_value = "shepherd-data")]
    data_dir: PathBuf,
    /// An administrator's kubeconfig instead of <data-dir>/admin.kubeconfig.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args, Clone, Debug)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    client: TokenClientArgs,
    /// How long the token authenticates (`0`: until deleted).
    #[arg(long, default_value = "24h", value_parser = shepherd_api::duration::parse)]
    ttl: Duration,
    /// A note kept with the token.
    #[arg(long, default_value = "joins a node with `shepherd agent --join-token`")]
    description: String,
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    let api_version = if group.is_empty() { "v1".to_string() } else { format!("{group}/v1") };
    ApiResource { group: group.into(), version: "v1".into(), api_version, kind: kind.into(), plural: plural.into() }
}

fn secrets() -> ApiResource {
    resource("", "Secret", "secrets")
}

fn csrs() -> ApiResource {
    resource("certificates.k8s.io", "CertificateSigningRequest", "certificatesigningrequests")
}

async fn admin_client(args: &TokenClientArgs) -> anyhow::Result<(kube::Client, String)> {
    let path = args.kubeconfig.clone().unwrap_or_else(|| crate::credentials::admin_kubeconfig_path(&args.data_dir));
    let config = crate::credentials::agent_client_config("", Some(&path), None, None).await?;
    let url = config.cluster_url.to_string().trim_end_matches('/').to_string();
    Ok((kube::Client::try_from(config).context("building a client from the admin kubeconfig")?, url))
}

pub async fn run(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create(args) => create(args).await,
        TokenCommand::List(args) => list(args).await,
    }
}

async fn create(args: TokenCreateArgs) -> anyhow::Result<()> {
    let (client, url) = admin_client(&args.client).await?;
    let token = BootstrapToken::generate();
    let expiration = (!args.ttl.is_zero())
        .then(|| -> anyhow::Result<String> {
            let ttl = jiff::SignedDuration::try_from(args.ttl).context("--ttl is too long")?;
            Ok(jiff::Timestamp::now().checked_add(ttl).context("--ttl is too long")?.to_string())
        })
        .transpose()?;
    let secret: DynamicObject = serde_json::from_value(token.secret_object(expiration.as_deref(), &args.description))?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, bootstrap_token::NAMESPACE, &secrets());
    api.create(&PostParams::default(), &secret).await.context("writing the bootstrap token Secret")?;
    let ca = args.client.data_dir.join("pki").join("ca.crt");
    println!("{}", token.token());
    let until = expiration.map(|e| format!(" (valid until {e})")).unwrap_or_default();
    let hash = std::fs::read_to_string(&ca).ok().and_then(|pem| ca_cert_hash(&pem).ok());
    match hash {
        Some(hash) => eprintln!(
            "join a node{until} with:\n  shepherd agent --server {url} --join-token {} --discovery-token-ca-cert-hash {hash}\n\
             or, with the CA file copied to the node:\n  shepherd agent --server {url} --join-token {} --certificate-authority {}",
            token.token(),
            token.token(),
            ca.display()
        ),
        None => eprintln!(
            "join a node{until} with:\n  shepherd agent --server {url} --join-token {} --certificate-authority {}",
            token.token(),
            ca.display()
        ),
    }
    Ok(())
}

async fn list(args: TokenClientArgs) -> anyhow::Result<()> {
    let (client, _) = admin_client(&args).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, bootstrap_token::NAMESPACE, &secrets());
    let list = api.list(&ListParams::default()).await.context("listing bootstrap tokens")?;
    println!("{:<8} {:<26} DESCRIPTION", "ID", "EXPIRES");
    for s in
        list.items.iter().filter(|s| s.data.get("type").and_then(Value::as_str) == Some(bootstrap_token::SECRET_TYPE))
    {
        let field = |k: &str| {
            s.data
                .pointer(&format!("/data/{k}"))
                .and_then(Value::as_str)
                .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
        };
        let expires = field("expiration");
        let expires = if expires.is_empty() { "<never>".to_string() } else { expires };
        println!("{:<8} {:<26} {}", field("token-id"), expires, field("description"));
    }
    Ok(())
}

/// The server's `--cluster-signing-duration`: a Go duration of a second or more.
pub fn signing_duration(text: &str) -> Result<Duration, String> {
    let duration = shepherd_api::duration::parse(text)?;
    if duration < Duration::from_secs(1) {
        return Err(format!("{text:?} is shorter than a second: certificates would expire as they are issued"));
    }
    Ok(duration)
}

/// kubeadm's pin of a CA: `sha256:` and the hex SHA-256 of the CA certificate's
/// SubjectPublicKeyInfo, so that a pin survives the CA being re-issued with the same key.
pub fn ca_cert_hash(ca_pem: &str) -> anyhow::Result<String> {
    use sha2::Digest;
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).map_err(|e| anyhow::anyhow!("the CA is not PEM: {e}"))?;
    let cert = pem.parse_x509().map_err(|e| anyhow::anyhow!("the CA certificate cannot be read: {e}"))?;
    let digest = sha2::Sha256::digest(cert.tbs_certificate.subject_pki.raw);
    Ok(format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// kubeadm's token discovery: reads `kube-public/cluster-info` from `server` before trusting it,
/// and keeps the CA there only if the cluster signed it for `token` (the detached JWS of its
/// kubeconfig, which only a holder of the token's secret can make) and, when `pin` is given
/// (`sha256:<hex>`, as `shepherd token create` prints it), if the CA's public key matches it. Waits
/// up to `wait` for the signature of a token the server has not signed yet. Writes the CA to
/// `<data_dir>/ca.crt`, once every check passed, and returns that path.
pub async fn discover_ca(
    server: &str,
    token: &str,
    pin: Option<&str>,
    data_dir: &Path,
    wait: Duration,
) -> anyhow::Result<PathBuf> {
    let token = parse_join_token(token)?;
    let want = pin.map(|p| p.trim().to_ascii_lowercase());
    if want.as_deref().is_some_and(|w| {
        w.strip_prefix("sha256:").is_none_or(|h| h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
    }) {
        bail!("--discovery-token-ca-cert-hash must be sha256: and 64 hex digits, as `shepherd token create` prints it");
    }
    let uri: http::Uri = server.parse().with_context(|| format!("--server {server:?} is not a URL"))?;
    let mut config = kube::Config::new(uri);
    // Nothing read here is trusted until the signature (and pin) check out; the token is not sent.
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("building a client for {server}: {e}"))?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, bootstrap_token::CLUSTER_INFO_NAMESPACE, &resource("", "ConfigMap", "configmaps"));
    let deadline = tokio::time::Instant::now() + wait;
    let mut told = false;
    let kubeconfig = loop {
        let info = api.get(bootstrap_token::CLUSTER_INFO).await.with_context(|| {
            format!("reading {}/{} from {server}", bootstrap_token::CLUSTER_INFO_NAMESPACE, bootstrap_token::CLUSTER_INFO)
        })?;
        let data = info.data.get("data").and_then(Value::as_object).cloned().unwrap_or_default();
        match bootstrap_token::verified_kubeconfig(&data, &token) {
            Ok(kubeconfig) => break kubeconfig.to_string(),
            Err(e @ bootstrap_token::ClusterInfoError::Unsigned(_)) if tokio::time::Instant::now() < deadline => {
                if !told {
                    tracing::warn!(server, "{e}; waiting for the server to sign it");
                    told = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => bail!("{e} (server {server})"),
        }
    };
    let kubeconfig: Value = serde_saphyr::from_str(&kubeconfig).context("cluster-info's kubeconfig is not YAML")?;
    let ca_pem = kubeconfig
        .pointer("/clusters/0/cluster/certificate-authority-data")
        .and_then(Value::as_str)
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .context("cluster-info's kubeconfig names no CA")?;
    let got = ca_cert_hash(&ca_pem)?;
    match &want {
        Some(want) if got != *want => bail!(
            "the CA that {server} presents does not match --discovery-token-ca-cert-hash: it is {got}; refusing to join"
        ),
        Some(_) => tracing::info!(server, "cluster-info is signed by the join token and its CA matches the pinned hash"),
        None => tracing::warn!(
            server,
            ca = %got,
            "cluster-info is signed by the join token; its CA is trusted without a pin \
             (--discovery-token-unsafe-skip-ca-verification)"
        ),
    }
    let path = data_dir.join("ca.crt");
    crate::credentials::write_private(&path, &ca_pem)?;
    Ok(path)
}

fn parse_join_token(token: &str) -> anyhow::Result<BootstrapToken> {
    BootstrapToken::parse(token).context(
        "--join-token must look like abcdef.0123456789abcdef (6 and 16 lower-case letters or digits)",
    )
}

/// Where a joined agent keeps its identity.
pub fn node_kubeconfig_path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.kubeconfig")
}

/// Trades `token` for a client certificate of node `node`: files a CSR for a key made here,
/// waits until it is signed, and writes key, certificate and a kubeconfig into `data_dir`.
/// Returns the kubeconfig's path.
pub async fn bootstrap(
    server: &str,
    token: &str,
    certificate_authority: &Path,
    data_dir: &Path,
    node: &str,
    wait: Duration,
) -> anyhow::Result<PathBuf> {
    parse_join_token(token)?;
    let ca_pem = std::fs::read_to_string(certificate_authority)
        .with_context(|| format!("reading --certificate-authority {}", certificate_authority.display()))?;
    let config =
        crate::credentials::agent_client_config(server, None, Some(token), Some(certificate_authority)).await?;
    let client = kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("building a client for {server}: {e}"))?;
    let issued = request_node_certificate(client, node, wait).await.map_err(|e| match e.downcast_ref() {
        Some(kube::Error::Api(s)) if s.code == 401 => anyhow::anyhow!(
            "the server refused the join token (401): it is unknown or has expired; \
             create a new one with `shepherd token create`"
        ),
        _ => e,
    })?;
    let path = write_node_identity(data_dir, server, &ca_pem, node, &issued)?;
    tracing::info!(csr = %issued.request, kubeconfig = %path.display(), "joined: the node's certificate is signed");
    Ok(path)
}

/// A node's key and the certificate signed for it.
pub struct IssuedCertificate {
    pub key_pem: String,
    pub cert_pem: String,
    /// The CertificateSigningRequest it came from.
    pub request: String,
}

/// Files a CertificateSigningRequest for `system:node:<node>` (group `system:nodes`) with a key made
/// here, as `client` (a bootstrap token at join, the node itself when it renews), and waits up to
/// `wait` for it to be signed.
pub async fn request_node_certificate(
    client: kube::Client,
    node: &str,
    wait: Duration,
) -> anyhow::Result<IssuedCertificate> {
    let key = rcgen::KeyPair::generate().context("making the node's key")?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationName, shepherd_apiserver::auth::NODES_GROUP);
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    let request = params.serialize_request(&key).and_then(|r| r.pem()).context("making the certificate request")?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let csr: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {"request": b64(&request), "signerName": KUBELET_CLIENT_SIGNER,
            "usages": ["digital signature", "client auth"]},
    }))
    .context("the certificate signing request")?;
    let api: Api<DynamicObject> = Api::all_with(client, &csrs());
    let created = api.create(&PostParams::default(), &csr).await.context("filing the certificate signing request")?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, node, "filed a certificate signing request; waiting for it to be signed");
    let deadline = tokio::time::Instant::now() + wait;
    let cert_pem = loop {
        let csr = api.get(&name).await.with_context(|| format!("reading certificate signing request {name}"))?;
        let status = csr.data.get("status").cloned().unwrap_or(Value::Null);
        let conditions = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(c) = conditions.iter().find(|c| matches!(c["type"].as_str(), Some("Denied" | "Failed"))) {
            bail!(
                "certificate signing request {name} was {}: {}",
                c["type"].as_str().unwrap_or("").to_lowercase(),
                c["message"].as_str().or(c["reason"].as_str()).unwrap_or("no reason given")
            );
        }
        if let Some(cert) = status.get("certificate").and_then(Value::as_str).filter(|c| !c.is_empty()) {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(cert)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .with_context(|| format!("the certificate of {name} is not base64 PEM"))?;
            break pem;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "certificate signing request {name} was not signed within {wait:?}; is it approved? (kubectl get csr)"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    Ok(IssuedCertificate { key_pem: key.serialize_pem(), cert_pem, request: name })
}

/// Writes `issued` as the node's identity in `data_dir`: `node.key`, `node.crt`, and the kubeconfig
/// that carries both, which is what the agent reads; each file is replaced whole (written beside and
/// renamed), the kubeconfig last. Returns the kubeconfig's path.
pub fn write_node_identity(
    data_dir: &Path,
    server: &str,
    ca_pem: &str,
    node: &str,
    issued: &IssuedCertificate,
) -> anyhow::Result<PathBuf> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "shepherd", "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": format!("system:node:{node}"), "user": {
            "client-certificate-data": b64(&issued.cert_pem), "client-key-data": b64(&issued.key_pem)}}],
        "contexts": [{"name": "node", "context": {"cluster": "shepherd", "user": format!("system:node:{node}")}}],
        "current-context": "node",
    });
    let kubeconfig = serde_saphyr::to_string(&kubeconfig).context("writing the node kubeconfig")?;
    crate::credentials::write_private(&data_dir.join("node.key"), &issued.key_pem)?;
    crate::credentials::write_private(&data_dir.join("node.crt"), &issued.cert_pem)?;
    let path = node_kubeconfig_path(data_dir);
    crate::credentials::write_private(&path, &kubeconfig)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signing_duration_under_a_second_is_refused() {
        assert_eq!(signing_duration("8760h"), Ok(Duration::from_secs(8760 * 3600)));
        assert_eq!(signing_duration("30s"), Ok(Duration::from_secs(30)));
        for bad in ["0", "500ms", "soon"] {
            assert!(signing_duration(bad).is_err(), "{bad}");
        }
    }
}
