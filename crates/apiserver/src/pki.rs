//! The cluster's certificate authority: it signs the API server's serving certificate and the
//! client certificates that name users (CN) and their groups (O), as Kubernetes' cluster CA does.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot make a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
}

/// How long the generated CA is valid (kubeadm: ten years).
const CA_VALIDITY: Duration = Duration::days(3650);
/// How long generated serving and client certificates are valid (kubeadm: one year).
pub const LEAF_VALIDITY: Duration = Duration::days(365);

/// How far back certificates signed for requests start at most (Kubernetes' signer: five minutes).
const REQUEST_BACKDATE: Duration = Duration::minutes(5);

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The cluster CA: its certificate and the key that signs with it.
pub struct ClusterCa {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

/// Back-dated by an hour: a client whose clock is a little behind still accepts a fresh certificate.
fn not_before() -> OffsetDateTime {
    OffsetDateTime::now_utc() - Duration::hours(1)
}

impl ClusterCa {
    /// A new CA with a fresh ECDSA P-256 key.
    pub fn generate() -> Result<ClusterCa, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "shepherd-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = not_before();
        params.not_after = OffsetDateTime::now_utc() + CA_VALIDITY;
        let cert = params.self_signed(&key)?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        ClusterCa::from_pem(&cert_pem, &key_pem)
    }

    /// The CA written earlier (`ca.crt`, `ca.key`).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::Invalid(format!("the CA key is not a usable private key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| PkiError::Invalid(format!("the CA certificate cannot be read: {e}")))?;
        Ok(ClusterCa { cert_pem: cert_pem.to_string(), key_pem: key_pem.to_string(), issuer })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn serving_cert(&self, names: &[String]) -> Result<CertifiedKey, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "shepherd-apiserver");
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) if is_dns_name(n) => {
                    n.as_str().try_into().map(SanType::DnsName).map_err(|e| PkiError::Invalid(format!("{n:?}: {e}")))
                }
                Err(_) => Err(PkiError::Invalid(format!("{n:?} is not a DNS name or IP address for a certificate"))),
            })
            .collect::<Result<_, _>>()?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = not_before();
        params.not_after = OffsetDateTime::now_utc() + LEAF_VALIDITY;
        self.sign(&params)
    }

    /// A client certificate for user `user` in `groups`, valid from `not_before` to `not_after`.
    pub fn client_cert_valid(
        &self,
        user: &str,
        groups: &[String],
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<CertifiedKey, PkiError> {
        if user.is_empty() {
            return Err(PkiError::Invalid("a client certificate needs a user name".into()));
        }
        // rcgen keeps one value per attribute type; the organization OID spelled as a custom
        // type is a second key, which makes room for two groups.
        let organization = [DnType::OrganizationName, DnType::CustomDnType(vec![2, 5, 4, 10])];
        if groups.len() > organization.len() {
            return Err(PkiError::Invalid(format!(
                "a client certificate here holds at most {} groups, not {}; give further groups through --token-auth-file",
                organization.len(),
                groups.len()
            )));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for (group, ty) in groups.iter().zip(organization) {
            params.distinguished_name.push(ty, group.as_str());
        }
        params.distinguished_name.push(DnType::CommonName, user);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = not_before;
        params.not_after = not_after;
        self.sign(&params)
    }

    /// A client certificate for user `user` in `groups`, valid for a year.
    pub fn client_cert(&self, user: &str, groups: &[String]) -> Result<CertifiedKey, PkiError> {
        self.client_cert_valid(user, groups, not_before(), OffsetDateTime::now_utc() + LEAF_VALIDITY)
    }

    /// A client certificate for the subject of the PEM certificate request `csr_pem`, valid for
    /// `validity` from now. Only the subject and key come from the request: what the certificate may
    /// do (client auth, no CA, no alternative names) is the signer's decision.
    ///
    /// Backdated by five minutes for clients whose clock is behind, as Kubernetes' signer does, but
    /// by no more than half the validity: a client renews at a share of the whole span, and a short
    /// certificate must not be mostly spent when it is issued.
    pub fn sign_client_request(&self, csr_pem: &str, validity: std::time::Duration) -> Result<String, PkiError> {
        let mut request = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::Invalid(format!("the certificate request cannot be signed: {e}")))?;
        let params = &mut request.params;
        params.subject_alt_names.clear();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let validity = Duration::try_from(validity).map_err(|e| PkiError::Invalid(format!("validity: {e}")))?;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - REQUEST_BACKDATE.min(validity / 2);
        params.not_after = now + validity;
        Ok(request.signed_by(&self.issuer)?.pem())
    }

    fn sign(&self, params: &CertificateParams) -> Result<CertifiedKey, PkiError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertifiedKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// Letters, digits, `-` and `.` (and a leading `*.` wildcard), as a certificate's DNS name.
fn is_dns_name(name: &str) -> bool {
    let name = name.strip_prefix("*.").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty() && label.len() <= 63 && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_read_back_from_its_pem_signs_certificates_for_the_same_subject() {
        let ca = ClusterCa::generate().unwrap();
        let again = ClusterCa::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let cert = again.client_cert("alice", &["dev".into()]).unwrap();
        assert!(cert.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ClusterCa::from_pem(ca.cert_pem(), "not a key").is_err());
        let three = ["a".to_string(), "b".into(), "c".into()];
        assert!(ca.client_cert("alice", &three).unwrap_err().to_string().contains("at most 2 groups"));
    }

    #[test]
    fn a_serving_certificate_refuses_a_name_that_is_neither_dns_nor_ip() {
        let ca = ClusterCa::generate().unwrap();
        assert!(ca.serving_cert(&["localhost".into(), "127.0.0.1".into(), "::1".into()]).is_ok());
        let err = ca.serving_cert(&["bad name!".into()]).unwrap_err();
        assert!(err.to_string().contains("bad name!"), "{err}");
    }
}
