//! Authentication: turns a request's client certificate or bearer token into a [`UserInfo`].
//!
//! TLS only asks for a client certificate and checks that the client holds its key; whether the
//! cluster CA signed it, and whether it is still valid, is decided here, so that a certificate
//! from another CA or an expired one gets Kubernetes' 401 instead of a failed handshake. The
//! chain is verified once per connection ([`PeerCertificates`] keeps the decision); that the
//! chain has not expired since is checked on every request, so a long-lived connection stops
//! working when its certificate does.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::auth::{MASTERS_GROUP, UserInfo};

/// The user `--token` authenticates as.
pub const ADMIN_USER: &str = "shepherd-admin";

#[derive(Debug, thiserror::Error)]
pub enum AuthnError {
    #[error("{0}")]
    Invalid(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// The certificates a TLS client presented, as the TLS layer hands them to each request of the
/// connection, with the authentication decision about them once it is made.
#[derive(Debug)]
pub struct PeerCertificates {
    chain: Vec<CertificateDer<'static>>,
    user: OnceLock<Result<Verified, String>>,
}

/// A verified chain's user, and when the first of its certificates expires (Unix seconds).
#[derive(Debug, Clone)]
struct Verified {
    user: UserInfo,
    not_after: i64,
}

impl PeerCertificates {
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Arc<PeerCertificates> {
        Arc::new(PeerCertificates { chain, user: OnceLock::new() })
    }

    /// Whether the client presented a certificate at all.
    pub fn presented(&self) -> bool {
        !self.chain.is_empty()
    }
}

/// Decides who a request is: client certificates signed by the client CAs, static bearer tokens.
pub struct Authenticator {
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    tokens: HashMap<String, UserInfo>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").field("tokens", &self.tokens.len()).finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM text.
pub fn certificates_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, AuthnError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| AuthnError::Invalid(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(AuthnError::Invalid("no certificate in the PEM text".into()));
    }
    Ok(certs)
}

/// Client CA certificates as a root store.
pub fn root_store(cas: &[CertificateDer<'static>]) -> Result<RootCertStore, AuthnError> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone()).map_err(|e| AuthnError::Invalid(format!("a client CA certificate cannot be used: {e}")))?;
    }
    Ok(roots)
}

impl Authenticator {
    /// Accepts client certificates signed by `client_cas` (none: no certificate is accepted) and
    /// the bearer tokens of `tokens`.
    pub fn new(client_cas: &[CertificateDer<'static>], tokens: Vec<(String, UserInfo)>) -> Result<Self, AuthnError> {
        let client_verifier = if client_cas.is_empty() {
            None
        } else {
            let roots = Arc::new(root_store(client_cas)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| AuthnError::Invalid(format!("client CAs: {e}")))?;
            Some(verifier)
        };
        Ok(Authenticator { client_verifier, tokens: tokens.into_iter().collect() })
    }

    /// The user of a bearer token, if it is one this server knows.
    pub fn token_user(&self, token: &str) -> Option<UserInfo> {
        self.tokens.get(token).cloned()
    }

    /// The user a client certificate names, or why it is not accepted.
    pub fn certificate_user(&self, peer: &PeerCertificates) -> Result<UserInfo, String> {
        let verified = peer.user.get_or_init(|| self.verify_certificate(&peer.chain)).as_ref()?;
        if UnixTime::now().as_secs() as i64 > verified.not_after {
            return Err("the client certificate is not valid: it expired during this connection".into());
        }
        Ok(verified.user.clone())
    }

    fn verify_certificate(&self, chain: &[CertificateDer<'static>]) -> Result<Verified, String> {
        let [end_entity, intermediates @ ..] = chain else { return Err("no client certificate".into()) };
        let verifier = self.client_verifier.as_ref().ok_or("client certificates are not accepted by this server")?;
        verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .map_err(|e| format!("the client certificate is not valid: {e}"))?;
        let mut not_after = i64::MAX;
        for cert in chain {
            let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
                .map_err(|e| format!("the client certificate cannot be read: {e}"))?;
            not_after = not_after.min(parsed.validity().not_after.timestamp());
        }
        Ok(Verified { user: user_of_certificate(end_entity)?, not_after })
    }
}

/// User = the subject's common name, groups = its organizations, as Kubernetes reads them.
fn user_of_certificate(cert: &CertificateDer<'_>) -> Result<UserInfo, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("the client certificate cannot be read: {e}"))?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or("the client certificate names no user (no subject common name)")?;
    let groups: Vec<String> =
        subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_string).collect();
    Ok(UserInfo::new(name, groups))
}

/// The user `--token` stands for: an administrator, as before authentication had users.
pub fn admin_token(token: &str) -> (String, UserInfo) {
    (token.to_string(), UserInfo::new(ADMIN_USER, [MASTERS_GROUP]))
}

/// Reads Kubernetes' static token file (`--token-auth-file`): CSV lines
/// `token,user,uid[,"group1,group2"]`. Blank lines and lines starting with `#` are skipped.
pub fn parse_token_file(text: &str) -> Result<Vec<(String, UserInfo)>, AuthnError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_start_matches('\u{feff}').trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = csv_fields(line).map_err(|e| AuthnError::Invalid(format!("line {}: {e}", n + 1)))?;
        let [token, user, uid, rest @ ..] = fields.as_slice() else {
            return Err(AuthnError::Invalid(format!("line {}: expected token,user,uid[,groups]", n + 1)));
        };
        if token.is_empty() || user.is_empty() {
            return Err(AuthnError::Invalid(format!("line {}: the token and the user must not be empty", n + 1)));
        }
        let groups = rest.first().map(|g| g.split(',').map(str::trim).filter(|g| !g.is_empty()).collect::<Vec<_>>());
        let mut info = UserInfo::new(user.as_str(), groups.unwrap_or_default());
        info.uid = uid.clone();
        out.push((token.clone(), info));
    }
    Ok(out)
}

/// One CSV record: fields separated by commas, a field in double quotes may hold commas and `""`.
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err("a quoted field is not closed".into()),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => return Err(format!("unexpected {c:?} after a quoted field")),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field.trim().to_string());
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field.trim().to_string());
        }
    }
}

/// Asks every client for a certificate and checks it holds the key, but lets the handshake
/// through whoever signed it: [`Authenticator`] decides, with a 401 a client can report.
#[derive(Debug)]
struct RequestClientCertificate {
    hints: Vec<DistinguishedName>,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for RequestClientCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The server side of TLS: `cert_pem` (the serving certificate, then its chain) with `key_pem`,
/// asking clients for certificates issued by `client_cas` (the subjects are a hint to the
/// client; the check is the [`Authenticator`]'s). HTTP/1.1 only, which ALPN tells clients.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_cas: &[CertificateDer<'static>],
) -> Result<Arc<ServerConfig>, AuthnError> {
    let chain = certificates_from_pem(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| AuthnError::Invalid(format!("not a PEM private key: {e}")))?;
    let provider = provider();
    let verifier = RequestClientCertificate { hints: root_store(client_cas)?.subjects(), provider: provider.clone() };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AUTHENTICATED_GROUP;
    use crate::pki::ClusterCa;

    #[test]
    fn a_token_file_line_names_user_uid_and_quoted_groups() {
        let tokens = parse_token_file("# tokens\n\nt1,alice,1001,\"dev,ops\"\nt2, bob ,1002\n").unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens[0].0, "t1");
        assert_eq!(tokens[0].1.name, "alice");
        assert_eq!(tokens[0].1.uid, "1001");
        assert_eq!(tokens[0].1.groups, vec!["dev", "ops", AUTHENTICATED_GROUP]);
        assert_eq!(tokens[1].1.name, "bob");
        assert_eq!(tokens[1].1.groups, vec![AUTHENTICATED_GROUP]);
    }

    #[test]
    fn a_token_file_with_too_few_columns_names_the_line() {
        let err = parse_token_file("t1,alice,1\nonly-a-token\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(parse_token_file("t1,alice,1,\"dev").unwrap_err().to_string().contains("not closed"));
    }

    fn peer(pem: &str) -> Arc<PeerCertificates> {
        PeerCertificates::new(certificates_from_pem(pem.as_bytes()).unwrap())
    }

    #[test]
    fn a_certificate_signed_by_the_cluster_ca_names_its_user_and_groups() {
        let ca = ClusterCa::generate().unwrap();
        let authn = Authenticator::new(&certificates_from_pem(ca.cert_pem().as_bytes()).unwrap(), vec![]).unwrap();
        let cert = ca.client_cert("alice", &["dev".into(), "ops".into()]).unwrap();
        let user = authn.certificate_user(&peer(&cert.cert_pem)).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, vec!["dev", "ops", AUTHENTICATED_GROUP]);
    }

    #[test]
    fn certificates_from_another_ca_or_expired_are_refused() {
        let ca = ClusterCa::generate().unwrap();
        let authn = Authenticator::new(&certificates_from_pem(ca.cert_pem().as_bytes()).unwrap(), vec![]).unwrap();
        let other = ClusterCa::generate().unwrap().client_cert("mallory", &[]).unwrap();
        assert!(authn.certificate_user(&peer(&other.cert_pem)).is_err());
        let past = time::OffsetDateTime::now_utc() - time::Duration::days(2);
        let expired = ca.client_cert_valid("alice", &[], past, past + time::Duration::days(1)).unwrap();
        let err = authn.certificate_user(&peer(&expired.cert_pem)).unwrap_err();
        assert!(err.contains("expired") || err.contains("Expired"), "{err}");
    }

    #[test]
    fn a_connection_whose_certificate_expires_is_refused_from_then_on() {
        let ca = ClusterCa::generate().unwrap();
        let authn = Authenticator::new(&certificates_from_pem(ca.cert_pem().as_bytes()).unwrap(), vec![]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        let short = ca.client_cert_valid("alice", &[], now - time::Duration::hours(1), now + time::Duration::seconds(1)).unwrap();
        let connection = peer(&short.cert_pem);
        assert_eq!(authn.certificate_user(&connection).unwrap().name, "alice");
        // The same connection (the decision already kept) once the certificate's end has passed.
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let err = authn.certificate_user(&connection).unwrap_err();
        assert!(err.contains("expired during this connection"), "{err}");
    }
}
