//! Renews a joined agent's client certificate before it expires, as the kubelet's certificate manager
//! does, and sends the agent's requests with whichever certificate is current.
//!
//! At a random 70–90% of the certificate's lifetime the agent files a new CertificateSigningRequest
//! as the node it is (the approver signs a node's request for its own name only), writes the new key,
//! certificate and kubeconfig over the old ones, and makes a new client from them: new requests open
//! new connections with the new certificate, while requests already under way finish on the old.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use base64::Engine;
use futures::future::BoxFuture;

use crate::join;

/// A `kube::Client` that sends each request through the client of the node's current certificate.
#[derive(Clone)]
pub struct RotatingClient {
    current: Arc<RwLock<kube::Client>>,
}

impl RotatingClient {
    fn new(client: kube::Client) -> Self {
        RotatingClient { current: Arc::new(RwLock::new(client)) }
    }

    fn current(&self) -> kube::Client {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, client: kube::Client) {
        match self.current.write() {
            Ok(mut c) => *c = client,
            Err(poisoned) => *poisoned.into_inner() = client,
        }
    }
}

impl tower::Service<http::Request<kube::client::Body>> for RotatingClient {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.current();
        Box::pin(async move { client.send(request).await })
    }
}

/// What the node kubeconfig in a data dir holds.
struct Identity {
    server: String,
    ca_pem: String,
    node: String,
    not_before: SystemTime,
    not_after: SystemTime,
}

fn decode_pem(data: Option<&str>, what: &str) -> anyhow::Result<String> {
    let data = data.with_context(|| format!("the node kubeconfig has no {what}"))?;
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .with_context(|| format!("the node kubeconfig's {what} is not base64 PEM"))
}

fn read_identity(kubeconfig: &Path) -> anyhow::Result<Identity> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading the node kubeconfig {}", kubeconfig.display()))?;
    let cluster = file.clusters.first().and_then(|c| c.cluster.as_ref()).context("the node kubeconfig names no cluster")?;
    let user = file.auth_infos.first().and_then(|u| u.auth_info.as_ref()).context("the node kubeconfig names no user")?;
    let ca_pem = decode_pem(cluster.certificate_authority_data.as_deref(), "certificate-authority-data")?;
    let cert_pem = decode_pem(user.client_certificate_data.as_deref(), "client-certificate-data")?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("the node's certificate is not PEM: {e}"))?;
    let cert = pem.parse_x509().map_err(|e| anyhow::anyhow!("the node's certificate cannot be read: {e}"))?;
    let node = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .and_then(|cn| cn.strip_prefix("system:node:"))
        .filter(|n| !n.is_empty())
        .context("the node's certificate does not name a node (CN=system:node:NAME)")?
        .to_string();
    let at = |t: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
    Ok(Identity {
        server: cluster.server.clone().unwrap_or_default(),
        ca_pem,
        node,
        not_before: at(cert.validity().not_before.timestamp()),
        not_after: at(cert.validity().not_after.timestamp()),
    })
}

/// Whether the certificate in the node kubeconfig `kubeconfig` has expired (or cannot be read), so
/// that the agent must join again.
pub fn expired(kubeconfig: &Path) -> bool {
    read_identity(kubeconfig).is_ok_and(|id| id.not_after <= SystemTime::now())
}

/// When to renew a certificate valid from `not_before` to `not_after`: at `share` (0.7 to 0.9) of
/// its lifetime, as the kubelet does, so that many nodes joined at once do not renew at once.
fn renewal_deadline(not_before: SystemTime, not_after: SystemTime, share: f64) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(share.clamp(0.0, 1.0))
}

/// Starts renewing the certificate of the node kubeconfig `kubeconfig` (in the agent's data dir),
/// waiting up to `wait` for each request to be signed; returns a client that always uses the
/// current certificate, starting with `client`.
pub fn keep_renewed(kubeconfig: PathBuf, client: kube::Client, wait: Duration) -> kube::Client {
    let rotating = RotatingClient::new(client);
    tokio::spawn(renew_forever(kubeconfig, rotating.clone(), wait));
    kube::Client::new(rotating, "default")
}

async fn renew_forever(kubeconfig: PathBuf, client: RotatingClient, wait: Duration) {
    const FIRST_RETRY: Duration = Duration::from_secs(1);
    const LAST_RETRY: Duration = Duration::from_secs(60);
    let mut retry = FIRST_RETRY;
    loop {
        let identity = match read_identity(&kubeconfig) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot renew the node's certificate");
                return;
            }
        };
        let share = rand::random_range(0.7..0.9);
        let deadline = renewal_deadline(identity.not_before, identity.not_after, share);
        let expires = jiff::Timestamp::try_from(identity.not_after).map(|t| t.to_string()).unwrap_or_default();
        let renew_at = jiff::Timestamp::try_from(deadline).map(|t| t.to_string()).unwrap_or_default();
        tracing::info!(node = %identity.node, %expires, %renew_at, "the node's client certificate will be renewed");
        tokio::time::sleep(deadline.duration_since(SystemTime::now()).unwrap_or_default()).await;
        loop {
            match renew(&kubeconfig, &identity, &client, wait).await {
                Ok(()) => {
                    retry = FIRST_RETRY;
                    break;
                }
                Err(e) => {
                    let hint = if identity.not_after <= SystemTime::now() {
                        "; it has expired: restart the agent with a new --join-token to join again"
                    } else {
                        ""
                    };
                    tracing::warn!(error = %format!("{e:#}"), retry_in = ?retry, "cannot renew the node's client certificate{hint}");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(LAST_RETRY);
                }
            }
        }
    }
}

/// Files a request for a new certificate as the node, writes the result over the node kubeconfig,
/// and switches `client` to it.
async fn renew(kubeconfig: &Path, identity: &Identity, client: &RotatingClient, wait: Duration) -> anyhow::Result<()> {
    let issued = join::request_node_certificate(client.current(), &identity.node, wait).await?;
    let data_dir = kubeconfig.parent().context("the node kubeconfig is in no directory")?;
    let path = join::write_node_identity(data_dir, &identity.server, &identity.ca_pem, &identity.node, &issued)?;
    let config = crate::credentials::agent_client_config(&identity.server, Some(&path), None, None).await?;
    let renewed = kube::Client::try_from(config).context("a client with the renewed certificate")?;
    client.replace(renewed);
    tracing::info!(csr = %issued.request, node = %identity.node, "renewed the node's client certificate");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_renewed_between_seventy_and_ninety_percent_of_its_lifetime() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = start + Duration::from_secs(1000);
        assert_eq!(renewal_deadline(start, end, 0.7), start + Duration::from_secs(700));
        assert_eq!(renewal_deadline(start, end, 0.9), start + Duration::from_secs(900));
        assert_eq!(renewal_deadline(end, start, 0.8), end, "a certificate that ends before it starts: renew now");
    }

    #[test]
    fn the_identity_and_validity_are_read_from_the_node_kubeconfig_and_an_expired_one_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let ca = shepherd_apiserver::pki::ClusterCa::generate().unwrap();
        let cert = ca.client_cert("system:node:n1", &["system:nodes".into()]).unwrap();
        let issued = join::IssuedCertificate { key_pem: cert.key_pem, cert_pem: cert.cert_pem, request: "r".into() };
        let path = join::write_node_identity(dir, "https://127.0.0.1:1", ca.cert_pem(), "n1", &issued).unwrap();
        let id = read_identity(&path).unwrap();
        assert_eq!((id.node.as_str(), id.server.as_str(), id.ca_pem.as_str()), ("n1", "https://127.0.0.1:1", ca.cert_pem()));
        assert!(id.not_after > SystemTime::now() + Duration::from_secs(300 * 86400));
        assert!(!expired(&path));

        let past = time::OffsetDateTime::now_utc() - time::Duration::days(2);
        let old = ca.client_cert_valid("system:node:n1", &["system:nodes".into()], past, past + time::Duration::days(1));
        let old = old.unwrap();
        let issued = join::IssuedCertificate { key_pem: old.key_pem, cert_pem: old.cert_pem, request: "r".into() };
        let path = join::write_node_identity(dir, "https://127.0.0.1:1", ca.cert_pem(), "n1", &issued).unwrap();
        assert!(expired(&path), "a node whose certificate expired joins again");
    }
}
