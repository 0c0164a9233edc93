//! ServiceAccount tokens: JWTs signed with the server's key, and the authenticator that accepts them.
//!
//! The key is ECDSA (ES256, what the server generates; or ES384) or RSA (RS256, as kube-apiserver
//! signs with a user's RSA key). A token is trusted only as far as what it names still exists:
//! verification checks the signature with the key's own algorithm (any other `alg`, `none` and HS256
//! included, is refused before a key is used), the
//! issuer, that one of its audiences is one this server accepts, `exp`/`nbf` on the server's clock, and
//! then that the ServiceAccount and (for a pod-bound token) the pod are still in the store with the uids
//! the token was issued for. A deleted and re-created account does not inherit its predecessor's tokens.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use rcgen::PublicKeyData;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest;
use shepherd_api::{ApiError, JsonPath, kinds};

use crate::auth::{AUTHENTICATED_GROUP, UserInfo};
use crate::service::ApiService;

/// Kubernetes' default issuer (and audience) of ServiceAccount tokens.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The group of every ServiceAccount.
pub const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// Kubernetes' shortest TokenRequest lifetime (`expirationSeconds`), in seconds.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the service account signing key cannot be read: {0}")]
    Unreadable(String),
    #[error(
        "the service account signing key is {0}; Shepherd signs tokens with ECDSA keys (P-256 or P-384, PKCS#8 PEM) \
         or RSA keys of 2048 to 8192 bits (PKCS#8 or PKCS#1 PEM)"
    )]
    Unsupported(String),
}

/// The claims of a token, in Kubernetes' layout (`kubernetes.io` holds the private claims).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: Vec<String>,
    exp: u64,
    iat: u64,
    nbf: u64,
    jti: String,
    #[serde(rename = "kubernetes.io")]
    kubernetes: PrivateClaims,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PrivateClaims {
    namespace: String,
    serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<ObjectRef>,
}

/// A name and uid, as the private claims name objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

/// What a new token stands for.
#[derive(Debug, Clone)]
pub struct TokenSpec<'a> {
    pub namespace: &'a str,
    pub service_account: ObjectRef,
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    pub pod: Option<ObjectRef>,
    pub node: Option<ObjectRef>,
}

/// Signs and verifies ServiceAccount tokens with one key.
pub struct ServiceAccountTokens {
    issuer: String,
    /// The audiences this server accepts, and gives a token that asks for none.
    audiences: Vec<String>,
    algorithm: Algorithm,
    signer: Signer,
    decoding: DecodingKey,
    /// Kubernetes' key id: the unpadded base64url SHA-256 of the public key's DER.
    key_id: String,
    /// The shortest lifetime a TokenRequest may ask for (Kubernetes: 10 minutes).
    min_expiration_seconds: i64,
}

impl std::fmt::Debug for ServiceAccountTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountTokens").field("issuer", &self.issuer).field("key_id", &self.key_id).finish()
    }
}

/// Seconds since the epoch on the server's clock.
fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A new ECDSA P-256 signing key, as PKCS#8 PEM.
pub fn generate_key_pem() -> Result<String, KeyError> {
    let key = rcgen::KeyPair::generate().map_err(|e| KeyError::Unreadable(e.to_string()))?;
    Ok(key.serialize_pem())
}

impl ServiceAccountTokens {
    /// Tokens signed with `key_pem` (a private key, PEM: ECDSA in PKCS#8, RSA in PKCS#8 or PKCS#1)
    /// by `issuer`, accepted for `audiences` (none: the issuer).
    pub fn new(key_pem: &str, issuer: &str, audiences: Vec<String>) -> Result<Self, KeyError> {
        let key = SigningKey::from_pem(key_pem)?;
        let key_id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(&key.public_key_info));
        let audiences = if audiences.is_empty() { vec![issuer.to_string()] } else { audiences };
        Ok(ServiceAccountTokens {
            issuer: issuer.to_string(),
            audiences,
            algorithm: key.algorithm,
            signer: key.signer,
            decoding: key.decoding,
            key_id,
            min_expiration_seconds: MIN_EXPIRATION_SECONDS,
        })
    }

    /// Lets TokenRequests ask for lifetimes down to `seconds` (tests that watch a token expire).
    pub fn with_min_expiration_seconds(mut self, seconds: i64) -> Self {
        self.min_expiration_seconds = seconds.max(1);
        self
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The audiences a token gets when its request names none.
    pub fn default_audiences(&self) -> &[String] {
        &self.audiences
    }

    pub fn min_expiration_seconds(&self) -> i64 {
        self.min_expiration_seconds
    }

    /// A signed token for `spec` and the second it expires at.
    pub fn issue(&self, spec: &TokenSpec<'_>) -> Result<(String, u64), ApiError> {
        let iat = now();
        let exp = iat.saturating_add(u64::try_from(spec.expiration_seconds.max(1)).unwrap_or(1));
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: user_name(spec.namespace, &spec.service_account.name),
            aud: spec.audiences.clone(),
            exp,
            iat,
            nbf: iat,
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: PrivateClaims {
                namespace: spec.namespace.to_string(),
                serviceaccount: spec.service_account.clone(),
                pod: spec.pod.clone(),
                node: spec.node.clone(),
            },
        };
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.key_id.clone());
        let token =
            self.sign(&header, &claims).map_err(|e| ApiError::Internal(format!("signing a service account token: {e}")))?;
        Ok((token, exp))
    }

    /// The compact JWS of `claims` under `header`, signed with the key parsed once at start.
    fn sign(&self, header: &Header, claims: &impl Serialize) -> Result<String, String> {
        let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = serde_json::to_vec(header).map_err(|e| e.to_string())?;
        let claims = serde_json::to_vec(claims).map_err(|e| e.to_string())?;
        let message = format!("{}.{}", b64.encode(header), b64.encode(claims));
        let rng = ring::rand::SystemRandom::new();
        let signature = match &self.signer {
            Signer::Ecdsa(key) => key.sign(&rng, message.as_bytes()).map_err(|e| e.to_string())?.as_ref().to_vec(),
            Signer::Rsa(key) => {
                let mut signature = vec![0; key.public().modulus_len()];
                key.sign(&ring::signature::RSA_PKCS1_SHA256, &rng, message.as_bytes(), &mut signature)
                    .map_err(|e| e.to_string())?;
                signature
            }
        };
        Ok(format!("{message}.{}", b64.encode(signature)))
    }

    /// The claims of `token` if this server signed it for one of its audiences and it is in date.
    fn verified_claims(&self, token: &str) -> Result<Claims, String> {
        let mut validation = Validation::new(self.algorithm);
        validation.leeway = 0;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map_err(|e| format!("service account token not accepted: {e}"))?;
        let claims = data.claims;
        let private = &claims.kubernetes;
        if claims.sub != user_name(&private.namespace, &private.serviceaccount.name) {
            return Err("service account token names two different accounts".into());
        }
        Ok(claims)
    }

    /// The user a token authenticates as, once what it is bound to is found unchanged in the store.
    pub async fn authenticate(&self, svc: &ApiService, token: &str) -> Result<UserInfo, String> {
        let claims = self.verified_claims(token)?;
        let private = &claims.kubernetes;
        let ns = private.namespace.as_str();
        let sa = &private.serviceaccount;
        still_there(svc, &kinds::SERVICEACCOUNT, ns, sa).await?;
        if let Some(pod) = &private.pod {
            still_there(svc, &kinds::POD, ns, pod).await?;
        }
        let mut user = UserInfo::new(
            claims.sub.clone(),
            [SERVICE_ACCOUNTS_GROUP.to_string(), format!("{SERVICE_ACCOUNTS_GROUP}:{ns}"), AUTHENTICATED_GROUP.into()],
        );
        user.uid = sa.uid.clone();
        let mut extra = BTreeMap::new();
        extra.insert("authentication.kubernetes.io/credential-id".to_string(), vec![format!("JTI={}", claims.jti)]);
        if let Some(pod) = &private.pod {
            extra.insert("authentication.kubernetes.io/pod-name".to_string(), vec![pod.name.clone()]);
            extra.insert("authentication.kubernetes.io/pod-uid".to_string(), vec![pod.uid.clone()]);
        }
        if let Some(node) = &private.node {
            extra.insert("authentication.kubernetes.io/node-name".to_string(), vec![node.name.clone()]);
            extra.insert("authentication.kubernetes.io/node-uid".to_string(), vec![node.uid.clone()]);
        }
        user.extra = extra;
        Ok(user)
    }
}

/// The private key, parsed and checked once: signing through `jsonwebtoken` would parse it for every
/// token, which for an RSA key costs more than the signature.
enum Signer {
    Ecdsa(ring::signature::EcdsaKeyPair),
    Rsa(ring::signature::RsaKeyPair),
}

/// A private key read for signing: the one algorithm its tokens are signed and verified with.
struct SigningKey {
    algorithm: Algorithm,
    signer: Signer,
    decoding: DecodingKey,
    /// The public key's DER SubjectPublicKeyInfo, of which the key id is the digest.
    public_key_info: Vec<u8>,
}

/// rsaEncryption, the algorithm of RSA keys in PKCS#8 and SubjectPublicKeyInfo.
const RSA_ENCRYPTION: &[u64] = &[1, 2, 840, 113549, 1, 1, 1];

impl SigningKey {
    fn from_pem(pem: &str) -> Result<SigningKey, KeyError> {
        use rustls::pki_types::PrivateKeyDer;
        use rustls::pki_types::pem::PemObject;
        let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| KeyError::Unreadable(e.to_string()))?;
        // The signer needs RSA keys as PKCS#1, the key reader as PKCS#8: each form is made from the other.
        let (pkcs8, rsa_pkcs1) = match &der {
            PrivateKeyDer::Pkcs8(k) => {
                let pkcs8 = k.secret_pkcs8_der().to_vec();
                let rsa = rsa_pkcs1_of_pkcs8(&pkcs8);
                (pkcs8, rsa)
            }
            PrivateKeyDer::Pkcs1(k) => (pkcs8_of_rsa_pkcs1(k.secret_pkcs1_der()), Some(k.secret_pkcs1_der().to_vec())),
            PrivateKeyDer::Sec1(_) => {
                return Err(KeyError::Unsupported(
                    "an EC key in SEC1 form (EC PRIVATE KEY); convert it with `openssl pkcs8 -topk8 -nocrypt`".into(),
                ));
            }
            _ => return Err(KeyError::Unsupported("a private key of an unknown form".into())),
        };
        let key = rcgen::KeyPair::try_from(pkcs8.as_slice()).map_err(|e| match rsa_pkcs1 {
            Some(_) => KeyError::Unsupported(format!("an RSA key that cannot sign here ({e}): fewer than 2048 bits?")),
            None => KeyError::Unreadable(e.to_string()),
        })?;
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair, RsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let ecdsa = |alg| {
            EcdsaKeyPair::from_pkcs8(alg, &pkcs8, &rng).map(Signer::Ecdsa).map_err(|e| KeyError::Unreadable(e.to_string()))
        };
        let (algorithm, signer, decoding) = match (key.algorithm(), rsa_pkcs1) {
            (a, _) if a == &rcgen::PKCS_ECDSA_P256_SHA256 => {
                (Algorithm::ES256, ecdsa(&ECDSA_P256_SHA256_FIXED_SIGNING)?, DecodingKey::from_ec_der(key.public_key_raw()))
            }
            (a, _) if a == &rcgen::PKCS_ECDSA_P384_SHA384 => {
                (Algorithm::ES384, ecdsa(&ECDSA_P384_SHA384_FIXED_SIGNING)?, DecodingKey::from_ec_der(key.public_key_raw()))
            }
            (a, Some(pkcs1)) if a == &rcgen::PKCS_RSA_SHA256 => {
                let signer = RsaKeyPair::from_der(&pkcs1).map_err(|e| KeyError::Unsupported(format!("an RSA key ring refuses: {e}")))?;
                (Algorithm::RS256, Signer::Rsa(signer), DecodingKey::from_rsa_der(key.public_key_raw()))
            }
            (a, _) => return Err(KeyError::Unsupported(format!("{a:?}"))),
        };
        Ok(SigningKey { algorithm, signer, decoding, public_key_info: key.subject_public_key_info() })
    }
}

/// The PKCS#1 RSAPrivateKey inside a PKCS#8 PrivateKeyInfo, if it holds an RSA key.
fn rsa_pkcs1_of_pkcs8(pkcs8: &[u8]) -> Option<Vec<u8>> {
    yasna::parse_der(pkcs8, |r| {
        r.read_sequence(|r| {
            r.next().read_u8()?;
            let oid = r.next().read_sequence(|r| {
                let oid = r.next().read_oid()?;
                r.read_optional(|r| r.read_der())?;
                Ok(oid)
            })?;
            let key = r.next().read_bytes()?;
            // PKCS#8 v2's optional attributes and public key.
            r.read_optional(|r| r.read_der())?;
            r.read_optional(|r| r.read_der())?;
            Ok((oid, key))
        })
    })
    .ok()
    .filter(|(oid, _)| oid.components().as_slice() == RSA_ENCRYPTION)
    .map(|(_, key)| key)
}

/// A PKCS#8 PrivateKeyInfo holding the PKCS#1 RSAPrivateKey `pkcs1`.
fn pkcs8_of_rsa_pkcs1(pkcs1: &[u8]) -> Vec<u8> {
    yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(0);
            w.next().write_sequence(|w| {
                w.next().write_oid(&yasna::models::ObjectIdentifier::from_slice(RSA_ENCRYPTION));
                w.next().write_null();
            });
            w.next().write_bytes(pkcs1);
        })
    })
}

/// `system:serviceaccount:NS:NAME`.
pub fn user_name(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Whether a bearer token has a JWT's shape (three base64url parts), so that only those are
/// checked as ServiceAccount tokens.
pub fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts[0].starts_with("eyJ")
        && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

/// `Ok` when the object `what` names exists with that uid.
async fn still_there(
    svc: &ApiService,
    res: &shepherd_api::ResourceInfo,
    ns: &str,
    what: &ObjectRef,
) -> Result<(), String> {
    let kind = res.kind.to_ascii_lowercase();
    let kv = match svc.get(res, Some(ns), &what.name).await {
        Ok(kv) => kv,
        Err(e) if e.code() == 404 => return Err(format!("{kind} {ns}/{} has been deleted", what.name)),
        Err(e) => return Err(format!("looking up {kind} {ns}/{}: {e}", what.name)),
    };
    let obj = crate::codec::decode(&kv).map_err(|e| e.to_string())?;
    let uid = obj.at("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    if uid != what.uid {
        return Err(format!("{kind} {ns}/{} has uid {uid}, not {} as the token says", what.name, what.uid));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> ServiceAccountTokens {
        ServiceAccountTokens::new(&generate_key_pem().unwrap(), DEFAULT_ISSUER, vec![]).unwrap()
    }

    fn spec(audiences: &[&str], seconds: i64) -> TokenSpec<'static> {
        TokenSpec {
            namespace: "default",
            service_account: ObjectRef { name: "bot".into(), uid: "u-1".into() },
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration_seconds: seconds,
            pod: None,
            node: None,
        }
    }

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }

    #[test]
    fn a_token_carries_kubernetes_claims_and_verifies_for_the_default_audience() {
        let t = tokens();
        let (token, exp) = t.issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        assert!(looks_like_jwt(&token));
        let claims = t.verified_claims(&token).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:default:bot");
        assert_eq!(claims.exp, exp);
        assert_eq!(claims.kubernetes.serviceaccount.uid, "u-1");
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.alg, Algorithm::ES256);
        assert_eq!(header.kid.as_deref(), Some(t.key_id.as_str()));
    }

    #[test]
    fn tokens_for_another_audience_another_key_or_past_their_expiry_are_refused() {
        let t = tokens();
        let (other_audience, _) = t.issue(&spec(&["vault"], 600)).unwrap();
        assert!(t.verified_claims(&other_audience).unwrap_err().contains("InvalidAudience"));
        let (foreign, _) = tokens().issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        assert!(t.verified_claims(&foreign).unwrap_err().contains("InvalidSignature"));
        let (mut expired, _) = t.issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        // Re-sign claims that ended a second ago with the same key.
        let mut claims = t.verified_claims(&expired).unwrap();
        claims.exp = now() - 1;
        claims.nbf = now() - 10;
        expired = t.sign(&Header::new(Algorithm::ES256), &claims).unwrap();
        assert!(t.verified_claims(&expired).unwrap_err().contains("ExpiredSignature"));
    }

    #[test]
    fn unsigned_or_differently_signed_tokens_are_refused_before_any_key_is_used() {
        let t = tokens();
        let (token, _) = t.issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        let payload = token.split('.').nth(1).unwrap();
        for alg in ["none", "HS256", "RS256", "ES384"] {
            let forged = format!("{}.{payload}.", b64(&serde_json::json!({"alg": alg, "typ": "JWT"})));
            assert!(t.verified_claims(&forged).is_err(), "alg {alg} accepted");
            let forged = format!("{}.{payload}.c2ln", b64(&serde_json::json!({"alg": alg, "typ": "JWT"})));
            assert!(t.verified_claims(&forged).is_err(), "alg {alg} accepted");
        }
        for garbage in ["", "a.b.c", "eyJ.eyJ.x", "eyJhbGciOiJFUzI1NiJ9.!!.x", &"eyJ".repeat(10_000)] {
            assert!(t.verified_claims(garbage).is_err());
        }
    }

    #[test]
    fn a_p384_key_signs_es384_tokens_that_verify() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap().serialize_pem();
        let t = ServiceAccountTokens::new(&key, DEFAULT_ISSUER, vec![]).unwrap();
        let (token, _) = t.issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        assert_eq!(jsonwebtoken::decode_header(&token).unwrap().alg, Algorithm::ES384);
        assert_eq!(t.verified_claims(&token).unwrap().kubernetes.serviceaccount.uid, "u-1");
        assert!(tokens().verified_claims(&token).is_err(), "verified by another key");
    }

    #[test]
    fn a_signing_key_that_is_neither_ecdsa_nor_rsa_is_refused_by_name() {
        assert!(ServiceAccountTokens::new("not a key", DEFAULT_ISSUER, vec![]).is_err());
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap().serialize_pem();
        let err = ServiceAccountTokens::new(&ed, DEFAULT_ISSUER, vec![]).unwrap_err().to_string();
        assert!(err.contains("ECDSA") && err.contains("RSA"), "{err}");
        let short = include_str!("testdata/test-only-rsa-1024.pem");
        let err = ServiceAccountTokens::new(short, DEFAULT_ISSUER, vec![]).unwrap_err().to_string();
        assert!(err.contains("2048"), "{err}");
    }

    // Made with `openssl genrsa 2048` and `openssl rsa -traditional`: one key, PKCS#8 and PKCS#1.
    const RSA_PKCS8: &str = include_str!("testdata/test-only-rsa-2048.pem");
    const RSA_PKCS1: &str = include_str!("testdata/test-only-rsa-2048-pkcs1.pem");

    #[test]
    fn an_rsa_key_in_either_form_signs_rs256_tokens_under_one_key_id() {
        let pkcs8 = ServiceAccountTokens::new(RSA_PKCS8, DEFAULT_ISSUER, vec![]).unwrap();
        let pkcs1 = ServiceAccountTokens::new(RSA_PKCS1, DEFAULT_ISSUER, vec![]).unwrap();
        assert_eq!(pkcs8.key_id, pkcs1.key_id, "the same key, whatever its file form");
        let (token, _) = pkcs1.issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!((header.alg, header.kid.as_deref()), (Algorithm::RS256, Some(pkcs8.key_id.as_str())));
        assert_eq!(pkcs8.verified_claims(&token).unwrap().sub, "system:serviceaccount:default:bot");
        let (foreign, _) = tokens().issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        assert!(pkcs8.verified_claims(&foreign).is_err(), "an ES256 token of another key");
    }

    #[test]
    fn an_rsa_keyed_server_refuses_tokens_of_any_other_algorithm_or_keyed_with_its_public_key() {
        let t = ServiceAccountTokens::new(RSA_PKCS8, DEFAULT_ISSUER, vec![]).unwrap();
        let (token, _) = t.issue(&spec(&[DEFAULT_ISSUER], 600)).unwrap();
        let claims = t.verified_claims(&token).unwrap();
        let key = rcgen::KeyPair::from_pem(RSA_PKCS8).unwrap();
        // The confusion attack: HS256 keyed with what a verifier might take for a secret, the public key.
        for public in [key.public_key_raw().to_vec(), key.public_key_pem().into_bytes()] {
            let forged =
                jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &jsonwebtoken::EncodingKey::from_secret(&public)).unwrap();
            assert!(t.verified_claims(&forged).unwrap_err().contains("InvalidAlgorithm"), "HS256 accepted");
        }
        let payload = token.split('.').nth(1).unwrap();
        let signature = token.split('.').nth(2).unwrap();
        for alg in ["none", "RS384", "RS512", "PS256", "ES256"] {
            let forged = format!("{}.{payload}.{signature}", b64(&serde_json::json!({"alg": alg, "typ": "JWT"})));
            assert!(t.verified_claims(&forged).is_err(), "alg {alg} accepted");
        }
    }
}
