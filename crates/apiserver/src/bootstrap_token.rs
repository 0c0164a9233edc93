//! Bootstrap tokens: `<id>.<secret>` bearer tokens kept in kube-system Secrets of type
//! `bootstrap.kubernetes.io/token`, with which a joining node asks for its client certificate, and
//! the signatures in `kube-public/cluster-info` with which it checks the server before trusting it.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_api::{ApiError, JsonPath};

use crate::auth::UserInfo;
use crate::service::{ApiService, DeleteOptions, ListOptions};

/// The group of every bootstrap token's user (`system:bootstrap:<id>`).
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
/// The `type` of a bootstrap token Secret.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Bootstrap token Secrets live here, named `bootstrap-token-<id>`.
pub const NAMESPACE: &str = "kube-system";
const NAME_PREFIX: &str = "bootstrap-token-";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;

/// A token `<id>.<secret>`: the id names the Secret, the secret proves the holder was given it.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    secret: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapToken").field("id", &self.id).finish_non_exhaustive()
    }
}

fn is_token_part(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Compares without stopping at the first difference, so the time taken does not tell an
/// attacker how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl BootstrapToken {
    /// `Some` when `token` has a bootstrap token's shape: `[a-z0-9]{6}.[a-z0-9]{16}`.
    pub fn parse(token: &str) -> Option<BootstrapToken> {
        let (id, secret) = token.split_once('.')?;
        (is_token_part(id, ID_LEN) && is_token_part(secret, SECRET_LEN))
            .then(|| BootstrapToken { id: id.to_string(), secret: secret.to_string() })
    }

    /// A new random token.
    pub fn generate() -> BootstrapToken {
        use rand::Rng;
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        let mut part =
            |n: usize| (0..n).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect::<String>();
        BootstrapToken { id: part(ID_LEN), secret: part(SECRET_LEN) }
    }

    /// `<id>.<secret>`, what a node is given.
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Whether `signature` is this token's detached JWS of `content` (see [`detached_signature`]).
    pub fn signed(&self, signature: &str, content: &str) -> bool {
        let expected = detached_signature(content, &self.id, &self.secret);
        constant_time_eq(expected.as_bytes(), signature.trim().as_bytes())
    }

    /// The Secret that makes this token valid for authentication until `expiration` (RFC 3339).
    pub fn secret_object(&self, expiration: Option<&str>, description: &str) -> Value {
        let mut data = json!({
            "token-id": self.id,
            "token-secret": self.secret,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "description": description,
        });
        if let Some(e) = expiration {
            data["expiration"] = json!(e);
        }
        json!({"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
            "metadata": {"name": format!("{NAME_PREFIX}{}", self.id), "namespace": NAMESPACE},
            "stringData": data})
    }

    /// The user this token authenticates as, or why it does not (unknown, expired, not for
    /// authentication); the reason is for the log, the client only sees 401.
    pub async fn authenticate(&self, svc: &ApiService) -> Result<UserInfo, String> {
        let name = format!("{NAME_PREFIX}{}", self.id);
        let kv = match svc.get(&kinds::SECRET, Some(NAMESPACE), &name).await {
            Ok(kv) => kv,
            Err(e) if e.is_not_found() => return Err(format!("no bootstrap token with id {:?}", self.id)),
            Err(e) => return Err(format!("reading bootstrap token {:?}: {e}", self.id)),
        };
        let secret = crate::codec::decode(&kv).map_err(|e| e.to_string())?;
        self.user_of(&secret, jiff::Timestamp::now())
    }

    fn user_of(&self, secret: &Value, now: jiff::Timestamp) -> Result<UserInfo, String> {
        if secret.at("/type").and_then(Value::as_str) != Some(SECRET_TYPE) {
            return Err(format!("secret {NAME_PREFIX}{} is not of type {SECRET_TYPE}", self.id));
        }
        if secret.at("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
            return Err(format!("bootstrap token {:?} is being deleted", self.id));
        }
        let field = |k: &str| data_field(secret, k);
        let stored = field("token-secret").unwrap_or_default();
        if field("token-id").as_deref() != Some(self.id.as_str())
            || !constant_time_eq(stored.as_bytes(), self.secret.as_bytes())
        {
            return Err(format!("bootstrap token {:?}: the secret does not match", self.id));
        }
        if is_expired(secret, now) {
            return Err(format!("bootstrap token {:?} has expired", self.id));
        }
        if field("usage-bootstrap-authentication").as_deref() != Some("true") {
            return Err(format!("bootstrap token {:?} is not for authentication", self.id));
        }
        let mut groups = vec![BOOTSTRAPPERS_GROUP.to_string()];
        for g in field("auth-extra-groups").unwrap_or_default().split(',').map(str::trim).filter(|g| !g.is_empty()) {
            // As in Kubernetes: a token may only name further bootstrapper groups, never, say, system:masters.
            if !g.starts_with("system:bootstrappers:") {
                return Err(format!(
                    "bootstrap token {:?}: extra group {g:?} is not a system:bootstrappers: group",
                    self.id
                ));
            }
            groups.push(g.to_string());
        }
        Ok(UserInfo::new(format!("system:bootstrap:{}", self.id), groups))
    }
}

/// The bootstrap token of a request's `Authorization: Bearer` header, if it has that shape.
pub(crate) fn of_request(headers: &axum::http::HeaderMap) -> Option<BootstrapToken> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))?;
    BootstrapToken::parse(token.trim())
}

/// A key of a Secret's `data` (base64) or, for one written without going through the API, `stringData`.
fn data_field(secret: &Value, key: &str) -> Option<String> {
    if let Some(encoded) = secret.at("/data").and_then(|d| d.get(key)).and_then(Value::as_str) {
        let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
        return String::from_utf8(bytes).ok();
    }
    secret.at("/stringData").and_then(|d| d.get(key)).and_then(Value::as_str).map(str::to_string)
}

/// Whether the token's `expiration` has passed; an unreadable one counts as expired.
fn is_expired(secret: &Value, now: jiff::Timestamp) -> bool {
    match data_field(secret, "expiration") {
        None => false,
        Some(e) => e.parse::<jiff::Timestamp>().map_or(true, |t| t <= now),
    }
}

/// Where a joining node finds the cluster's CA before it trusts the server (kubeadm's discovery):
/// a kubeconfig without credentials in ConfigMap `kube-public/cluster-info`, readable by anyone.
pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
pub const CLUSTER_INFO: &str = "cluster-info";
/// The key of cluster-info's kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// cluster-info holds, under this prefix and a token's id, that token's signature of the kubeconfig.
pub const JWS_KEY_PREFIX: &str = "jws-kubeconfig-";

/// Kubernetes' detached JWS (RFC 7515 appendix F) of `content` for token `id`: HS256 keyed by the
/// token's secret, the header `{"alg":"HS256","kid":ID}`, and the payload left out (`header..mac`).
/// The header's bytes are the ones kubeadm writes, so that signatures compare equal as strings.
pub fn detached_signature(content: &str, id: &str, secret: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "kid": id}).to_string());
    let signing_input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(content));
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
    // HMAC signing fails only for a key of another family, which this is not.
    let mac = jsonwebtoken::crypto::sign(signing_input.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
        .unwrap_or_default();
    format!("{header}..{mac}")
}

/// Why cluster-info does not vouch for the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterInfoError {
    /// No signature for the token (yet: the signer may not have seen a new token).
    #[error(
        "{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} holds no signature for token id {0:?}: the token is unknown to this \
         server, has expired, or is not for signing (usage-bootstrap-signing)"
    )]
    Unsigned(String),
    #[error(
        "{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} is not signed by token {0:?}: its kubeconfig was altered on the way, or \
         the token is not this cluster's; refusing to trust the server"
    )]
    BadSignature(String),
    #[error("{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO} has no {KUBECONFIG_KEY}")]
    NoKubeconfig,
}

/// cluster-info's kubeconfig, once `token`'s signature of it (in `data`, the ConfigMap's data)
/// checks out.
pub fn verified_kubeconfig<'a>(
    data: &'a serde_json::Map<String, Value>,
    token: &BootstrapToken,
) -> Result<&'a str, ClusterInfoError> {
    let kubeconfig = data.get(KUBECONFIG_KEY).and_then(Value::as_str).ok_or(ClusterInfoError::NoKubeconfig)?;
    let signature = data
        .get(&format!("{JWS_KEY_PREFIX}{}", token.id))
        .and_then(Value::as_str)
        .ok_or_else(|| ClusterInfoError::Unsigned(token.id.clone()))?;
    if !token.signed(signature, kubeconfig) {
        return Err(ClusterInfoError::BadSignature(token.id.clone()));
    }
    Ok(kubeconfig)
}

/// The tokens that sign cluster-info, id to secret: bootstrap token Secrets named after their id,
/// in date, with `usage-bootstrap-signing: "true"` (kube-controller-manager's bootstrapsigner rules).
fn signing_tokens(secrets: &[Value], now: jiff::Timestamp) -> std::collections::BTreeMap<String, String> {
    let mut tokens = std::collections::BTreeMap::new();
    for secret in secrets {
        let field = |k: &str| data_field(secret, k).unwrap_or_default();
        let name = secret.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let (id, token_secret) = (field("token-id"), field("token-secret"));
        if secret.at("/type").and_then(Value::as_str) != Some(SECRET_TYPE)
            || id.is_empty()
            || name.strip_prefix(NAME_PREFIX) != Some(id.as_str())
            || token_secret.is_empty()
            || is_expired(secret, now)
            || field("usage-bootstrap-signing") != "true"
        {
            continue;
        }
        tokens.insert(id, token_secret);
    }
    tokens
}

/// cluster-info's `data` with exactly the signatures of `tokens` over its kubeconfig; `None` when it
/// has them already (or has no kubeconfig to sign).
fn with_signatures(
    data: &serde_json::Map<String, Value>,
    tokens: &std::collections::BTreeMap<String, String>,
) -> Option<serde_json::Map<String, Value>> {
    let kubeconfig = data.get(KUBECONFIG_KEY).and_then(Value::as_str)?;
    let mut signed: serde_json::Map<String, Value> =
        data.iter().filter(|(k, _)| !k.starts_with(JWS_KEY_PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect();
    for (id, secret) in tokens {
        signed.insert(format!("{JWS_KEY_PREFIX}{id}"), json!(detached_signature(kubeconfig, id, secret)));
    }
    (&signed != data).then_some(signed)
}

/// Brings cluster-info's signatures up to date with the bootstrap tokens; whether it wrote.
pub async fn sign_cluster_info(svc: &ApiService) -> Result<bool, ApiError> {
    let res = &kinds::CONFIGMAP;
    let info = match svc.get(res, Some(CLUSTER_INFO_NAMESPACE), CLUSTER_INFO).await {
        Ok(kv) => crate::codec::decode(&kv)?,
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e),
    };
    let page = svc.list(&kinds::SECRET, Some(NAMESPACE), &ListOptions::default()).await?;
    let secrets = page.items.iter().map(crate::codec::decode_listed).collect::<Result<Vec<_>, _>>()?;
    let tokens = signing_tokens(&secrets, jiff::Timestamp::now());
    let data_of = |cm: &Value| cm.get("data").and_then(Value::as_object).cloned().unwrap_or_default();
    if with_signatures(&data_of(&info), &tokens).is_none() {
        return Ok(false);
    }
    let opts = crate::write_options::WriteOptions::default();
    svc.mutate(res, Some(CLUSTER_INFO_NAMESPACE), CLUSTER_INFO, None, "", &opts, |old| {
        let mut new = old.clone();
        if let Some(data) = with_signatures(&data_of(old), &tokens) {
            new["data"] = Value::Object(data);
        }
        Ok(new)
    })
    .await?;
    tracing::info!(tokens = tokens.len(), "signed kube-public/cluster-info for the bootstrap tokens");
    Ok(true)
}

/// Keeps cluster-info signed by every signing bootstrap token until `stop` (kube-controller-manager's
/// bootstrapsigner): woken by changes to the tokens or to cluster-info, and once a minute for tokens
/// that expired without a change.
pub async fn run_signer(svc: ApiService, stop: impl std::future::Future<Output = ()>) {
    use futures::StreamExt;
    tokio::pin!(stop);
    let tokens_prefix = kinds::SECRET.namespace_prefix(NAMESPACE);
    let info_key = kinds::CONFIGMAP.key(Some(CLUSTER_INFO_NAMESPACE), CLUSTER_INFO);
    loop {
        let revision = svc.store().revision().await;
        if let Err(e) = sign_cluster_info(&svc).await {
            tracing::warn!(error = %e, "cannot sign kube-public/cluster-info");
        }
        let mut watches = Vec::new();
        for prefix in [&tokens_prefix, &info_key] {
            watches.push(match &revision {
                Ok(revision) => svc.store().watch(prefix, *revision).await,
                Err(e) => Err(e.clone()),
            });
        }
        let mut changes = futures::stream::select_all(watches.into_iter().filter_map(|w| match w {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cluster-info signer: cannot watch; checking once a minute");
                None
            }
        }));
        let next_change = async {
            if changes.is_empty() {
                std::future::pending::<()>().await;
            }
            if changes.next().await.is_none() {
                // Every watch ended (history compacted, store closing): look again in a moment.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            () = &mut stop => return,
            () = next_change => {}
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
}

/// The path anonymous clients may GET to read `cluster-info`.
pub fn cluster_info_path() -> String {
    format!("/api/v1/namespaces/{CLUSTER_INFO_NAMESPACE}/configmaps/{CLUSTER_INFO}")
}

/// Writes `cluster-info` for a server reached at `server` whose certificate `ca_pem` signed.
pub async fn publish_cluster_info(svc: &ApiService, server: &str, ca_pem: &str) -> Result<(), ApiError> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {b64}\ncontexts: []\nusers: []\npreferences: {{}}\n"
    );
    let res = &kinds::CONFIGMAP;
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_INFO, "namespace": CLUSTER_INFO_NAMESPACE}, "data": {"kubeconfig": kubeconfig}});
    match svc.create(res, Some(CLUSTER_INFO_NAMESPACE), obj).await {
        Ok(_) => Ok(()),
        Err(ApiError::AlreadyExists { .. }) => {
            let opts = crate::write_options::WriteOptions::default();
            svc.mutate(res, Some(CLUSTER_INFO_NAMESPACE), CLUSTER_INFO, None, "", &opts, |old| {
                let mut new = old.clone();
                new["data"]["kubeconfig"] = json!(kubeconfig);
                Ok(new)
            })
            .await
            .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Deletes the bootstrap token Secrets whose expiration has passed (kube-controller-manager's
/// tokencleaner); returns how many.
pub async fn remove_expired(svc: &ApiService) -> Result<usize, ApiError> {
    let page = svc.list(&kinds::SECRET, Some(NAMESPACE), &ListOptions::default()).await?;
    let now = jiff::Timestamp::now();
    let mut removed = 0;
    for kv in &page.items {
        let secret = crate::codec::decode_listed(kv)?;
        let name = secret.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
        if secret.at("/type").and_then(Value::as_str) != Some(SECRET_TYPE) || !is_expired(&secret, now) {
            continue;
        }
        match svc.delete(&kinds::SECRET, Some(NAMESPACE), name, &DeleteOptions::default()).await {
            Ok(_) => {
                tracing::info!(secret = %name, "removed an expired bootstrap token");
                removed += 1;
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

/// Removes expired bootstrap tokens every `period` until `stop`.
pub async fn run_cleaner(svc: ApiService, period: Duration, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        if let Err(e) = remove_expired(&svc).await {
            tracing::warn!(error = %e, "cannot remove expired bootstrap tokens");
        }
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AUTHENTICATED_GROUP;

    fn stored(token: &BootstrapToken, expiration: Option<&str>, extra_groups: Option<&str>) -> Value {
        let mut s = token.secret_object(expiration, "test");
        if let Some(g) = extra_groups {
            s["stringData"]["auth-extra-groups"] = json!(g);
        }
        let b64 = |v: &Value| json!(base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap()));
        let data: serde_json::Map<String, Value> =
            s["stringData"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), b64(v))).collect();
        s["data"] = Value::Object(data);
        s.as_object_mut().unwrap().remove("stringData");
        s
    }

    #[tokio::test]
    async fn the_cleaner_removes_expired_bootstrap_tokens_and_keeps_the_rest() {
        let store = std::sync::Arc::new(shepherd_store::LocalStore::in_memory(Default::default()));
        let svc = ApiService::new(store, std::sync::Arc::new(crate::Metrics::default()));
        svc.ensure_system_namespaces().await.unwrap();
        let (old, fresh, forever) = (BootstrapToken::generate(), BootstrapToken::generate(), BootstrapToken::generate());
        svc.create(&kinds::SECRET, Some(NAMESPACE), old.secret_object(Some("2001-01-01T00:00:00Z"), "")).await.unwrap();
        svc.create(&kinds::SECRET, Some(NAMESPACE), fresh.secret_object(Some("2999-01-01T00:00:00Z"), "")).await.unwrap();
        svc.create(&kinds::SECRET, Some(NAMESPACE), forever.secret_object(None, "")).await.unwrap();
        let opaque = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other"},
            "stringData": {"expiration": "2001-01-01T00:00:00Z"}});
        svc.create(&kinds::SECRET, Some(NAMESPACE), opaque).await.unwrap();
        assert_eq!(remove_expired(&svc).await.unwrap(), 1);
        let gone = svc.get(&kinds::SECRET, Some(NAMESPACE), &format!("{NAME_PREFIX}{}", old.id)).await.unwrap_err();
        assert!(gone.is_not_found());
        assert!(old.authenticate(&svc).await.is_err());
        assert_eq!(fresh.authenticate(&svc).await.unwrap().name, format!("system:bootstrap:{}", fresh.id));
        assert!(forever.authenticate(&svc).await.is_ok());
        assert!(svc.get(&kinds::SECRET, Some(NAMESPACE), "other").await.is_ok(), "only bootstrap tokens are cleaned");
    }

    #[test]
    fn a_detached_signature_is_kubeadms_header_and_hmac_of_the_token_secret() {
        let signature = detached_signature("apiVersion: v1\nkind: Config\n", "abcdef", "0123456789abcdef");
        // Computed independently: HMAC-SHA256 keyed by the secret over base64url(header).base64url(content).
        assert_eq!(
            signature,
            "eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiY2RlZiJ9..vH_kT4yiol-nrAWgjfCYqvum5wsKETXe0S7OOp1VgnE"
        );
        let token = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        assert!(token.signed(&signature, "apiVersion: v1\nkind: Config\n"));
        assert!(!token.signed(&signature, "apiVersion: v1\nkind: Config\n "), "other content");
        let other = BootstrapToken::parse("abcdef.0123456789abcdee").unwrap();
        assert!(!other.signed(&signature, "apiVersion: v1\nkind: Config\n"), "another secret");
        for forged in ["", "..", "eyJhbGciOiJub25lIn0..", &signature.replace("..", ".e30.")] {
            assert!(!token.signed(forged, "apiVersion: v1\nkind: Config\n"), "{forged:?}");
        }
    }

    #[tokio::test]
    async fn cluster_info_carries_a_signature_for_each_signing_token_and_loses_it_with_the_token() {
        let store = std::sync::Arc::new(shepherd_store::LocalStore::in_memory(Default::default()));
        let svc = ApiService::new(store, std::sync::Arc::new(crate::Metrics::default()));
        svc.ensure_system_namespaces().await.unwrap();
        assert!(!sign_cluster_info(&svc).await.unwrap(), "nothing to sign before cluster-info exists");
        publish_cluster_info(&svc, "https://10.0.0.1:6443", "-----BEGIN CERTIFICATE-----\n").await.unwrap();
        let (signing, auth_only, expired) =
            (BootstrapToken::generate(), BootstrapToken::generate(), BootstrapToken::generate());
        svc.create(&kinds::SECRET, Some(NAMESPACE), signing.secret_object(None, "")).await.unwrap();
        let mut not_for_signing = auth_only.secret_object(None, "");
        not_for_signing["stringData"]["usage-bootstrap-signing"] = json!("false");
        svc.create(&kinds::SECRET, Some(NAMESPACE), not_for_signing).await.unwrap();
        svc.create(&kinds::SECRET, Some(NAMESPACE), expired.secret_object(Some("2001-01-01T00:00:00Z"), ""))
            .await
            .unwrap();

        assert!(sign_cluster_info(&svc).await.unwrap());
        assert!(!sign_cluster_info(&svc).await.unwrap(), "a second pass has nothing to change");
        let data = || async {
            let kv = svc.get(&kinds::CONFIGMAP, Some(CLUSTER_INFO_NAMESPACE), CLUSTER_INFO).await.unwrap();
            crate::codec::decode(&kv).unwrap()["data"].as_object().cloned().unwrap()
        };
        let signed = data().await;
        let kubeconfig = verified_kubeconfig(&signed, &signing).unwrap();
        assert!(kubeconfig.contains("https://10.0.0.1:6443"), "{kubeconfig}");
        assert_eq!(signed.keys().filter(|k| k.starts_with(JWS_KEY_PREFIX)).count(), 1, "{signed:?}");
        for unsigned in [&auth_only, &expired] {
            assert_eq!(verified_kubeconfig(&signed, unsigned), Err(ClusterInfoError::Unsigned(unsigned.id.clone())));
        }
        let mut swapped = signed.clone();
        swapped.insert(KUBECONFIG_KEY.into(), json!(kubeconfig.replace("10.0.0.1", "10.6.6.6")));
        assert_eq!(verified_kubeconfig(&swapped, &signing), Err(ClusterInfoError::BadSignature(signing.id.clone())));

        // A new kubeconfig is signed again; a deleted token's signature goes.
        publish_cluster_info(&svc, "https://10.0.0.2:6443", "-----BEGIN CERTIFICATE-----\n").await.unwrap();
        assert!(sign_cluster_info(&svc).await.unwrap());
        assert!(verified_kubeconfig(&data().await, &signing).unwrap().contains("10.0.0.2"));
        let name = format!("{NAME_PREFIX}{}", signing.id);
        svc.delete(&kinds::SECRET, Some(NAMESPACE), &name, &DeleteOptions::default()).await.unwrap();
        assert!(sign_cluster_info(&svc).await.unwrap());
        let after = data().await;
        assert!(after.keys().all(|k| !k.starts_with(JWS_KEY_PREFIX)), "{after:?}");
        assert!(after.contains_key(KUBECONFIG_KEY));
    }

    #[tokio::test]
    async fn the_signer_signs_cluster_info_as_soon_as_a_token_is_created() {
        let store = std::sync::Arc::new(shepherd_store::LocalStore::in_memory(Default::default()));
        let svc = ApiService::new(store, std::sync::Arc::new(crate::Metrics::default()));
        svc.ensure_system_namespaces().await.unwrap();
        publish_cluster_info(&svc, "https://10.0.0.1:6443", "-----BEGIN CERTIFICATE-----\n").await.unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let signer = tokio::spawn(run_signer(svc.clone(), async move {
            let _ = stop_rx.await;
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let token = BootstrapToken::generate();
        svc.create(&kinds::SECRET, Some(NAMESPACE), token.secret_object(None, "")).await.unwrap();
        let signed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let kv = svc.get(&kinds::CONFIGMAP, Some(CLUSTER_INFO_NAMESPACE), CLUSTER_INFO).await.unwrap();
                let data = crate::codec::decode(&kv).unwrap()["data"].as_object().cloned().unwrap();
                if verified_kubeconfig(&data, &token).is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(signed.is_ok(), "cluster-info was not signed for a new token within 10 s");
        let _ = stop_tx.send(());
        signer.await.unwrap();
    }

    #[test]
    fn only_the_bootstrap_token_shape_is_taken_for_one() {
        assert!(BootstrapToken::parse("abcdef.0123456789abcdef").is_some());
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde!",
            "",
        ] {
            assert!(BootstrapToken::parse(bad).is_none(), "{bad}");
        }
        let t = BootstrapToken::generate();
        assert_eq!(BootstrapToken::parse(&t.token()), Some(t));
    }

    #[test]
    fn a_valid_token_authenticates_as_its_bootstrap_user_with_extra_groups() {
        let t = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        let secret = stored(&t, Some("2999-01-01T00:00:00Z"), Some("system:bootstrappers:worker"));
        let user = t.user_of(&secret, jiff::Timestamp::now()).unwrap();
        assert_eq!(user.name, "system:bootstrap:abcdef");
        assert_eq!(user.groups, vec![BOOTSTRAPPERS_GROUP, "system:bootstrappers:worker", AUTHENTICATED_GROUP]);
    }

    #[test]
    fn an_expired_wrong_or_over_reaching_token_is_refused() {
        let t = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        let now = jiff::Timestamp::now();
        let expired = stored(&t, Some("2000-01-01T00:00:00Z"), None);
        assert!(t.user_of(&expired, now).unwrap_err().contains("expired"));
        let wrong = BootstrapToken::parse("abcdef.0123456789abcdee").unwrap();
        assert!(wrong.user_of(&stored(&t, None, None), now).unwrap_err().contains("does not match"));
        let masters = stored(&t, None, Some("system:masters"));
        assert!(t.user_of(&masters, now).unwrap_err().contains("system:masters"));
        let mut not_for_auth = stored(&t, None, None);
        not_for_auth["data"]["usage-bootstrap-authentication"] = json!("");
        assert!(t.user_of(&not_for_auth, now).is_err());
    }
}
