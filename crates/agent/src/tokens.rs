//! Pod-bound ServiceAccount tokens for projected `serviceAccountToken` sources, as kubelet's token
//! manager keeps them: requested through TokenRequest with the node's own identity (bound to the pod and
//! its uid, which is all a node may ask for), held in memory only, and requested again once 80% of a
//! token's life has passed, so that the file in the pod is replaced well before the token expires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::{JsonPath, str_at};
use shepherd_runtime::Client;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Kubernetes' default lifetime of a projected token.
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// A token is replaced once this share of its life has passed.
const RENEW_AT: f64 = 0.8;

/// One projected token: the pod incarnation, its account, the audience and the lifetime asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    pod_uid: String,
    service_account: String,
    audience: String,
    expiration_seconds: i64,
}

#[derive(Debug, Clone)]
struct Issued {
    token: String,
    /// When to ask for a fresh one.
    renew_at: Instant,
    /// After this the token is useless; a failed renewal is retried until then.
    expires_at: Instant,
}

/// The tokens of the pods on this node.
pub(crate) struct PodTokens {
    client: Arc<dyn Client>,
    issued: Mutex<HashMap<Key, Issued>>,
    /// Why the last request of a token failed, shown while the pod waits for it.
    failures: Mutex<HashMap<Key, String>>,
}


fn key_of(pod: &Value, source: &Value) -> Key {
    let account = match str_at(pod, "/spec/serviceAccountName") {
        "" => "default",
        a => a,
    };
    Key {
        pod_uid: str_at(pod, "/metadata/uid").to_string(),
        service_account: account.to_string(),
        audience: str_at(source, "/audience").to_string(),
        expiration_seconds: source
            .get("expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_EXPIRATION_SECONDS),
    }
}

/// The `serviceAccountToken` sources of the pod's projected volumes.
fn token_sources(pod: &Value) -> Vec<&Value> {
    pod.at("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.at("/projected/sources").and_then(Value::as_array))
        .flatten()
        .filter_map(|s| s.get("serviceAccountToken").filter(|t| t.is_object()))
        .collect()
}

impl PodTokens {
    pub fn new(client: Arc<dyn Client>) -> Self {
        PodTokens { client, issued: Mutex::default(), failures: Mutex::default() }
    }

    /// Requests every token the pod's volumes need that is missing or due for renewal; returns when the
    /// next one is due (the pod is reconciled again then). A failed renewal keeps the current token
    /// while it lasts and is retried soon.
    pub async fn refresh(&self, pod: &Value) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for source in token_sources(pod) {
            let key = key_of(pod, source);
            let now = Instant::now();
            let current = self.issued.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
            if let Some(t) = current.as_ref().filter(|t| t.renew_at > now) {
                next = Some(next.map_or(t.renew_at, |n| n.min(t.renew_at)));
                continue;
            }
            match self.request(pod, &key).await {
                Ok(issued) => {
                    next = Some(next.map_or(issued.renew_at, |n| n.min(issued.renew_at)));
                    self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    self.issued.lock().unwrap_or_else(|e| e.into_inner()).insert(key, issued);
                }
                Err(why) => {
                    warn!(pod = %str_at(pod, "/metadata/name"), account = %key.service_account, reason = %why,
                        "cannot get a service account token");
                    let retry = now + Duration::from_secs(5);
                    next = Some(next.map_or(retry, |n| n.min(retry)));
                    if current.is_some_and(|t| t.expires_at <= now) {
                        self.issued.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    }
                    self.failures.lock().unwrap_or_else(|e| e.into_inner()).insert(key, why);
                }
            }
        }
        next
    }

    async fn request(&self, pod: &Value, key: &Key) -> Result<Issued, String> {
        let mut spec = json!({
            "expirationSeconds": key.expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": str_at(pod, "/metadata/name"), "uid": key.pod_uid},
        });
        if !key.audience.is_empty() {
            spec["audiences"] = json!([key.audience]);
        }
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
        let namespace = str_at(pod, "/metadata/namespace");
        let asked = std::time::Instant::now();
        let answer =
            self.client.create_token(namespace, &key.service_account, request).await.map_err(|e| e.to_string())?;
        debug!(pod = %str_at(pod, "/metadata/name"), took = ?asked.elapsed(), "service account token issued");
        let token = str_at(&answer, "/status/token");
        if token.is_empty() {
            return Err("the TokenRequest answer holds no token".into());
        }
        let now = Instant::now();
        let life = str_at(&answer, "/status/expirationTimestamp")
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| {
                let seconds = t.as_second() - jiff::Timestamp::now().as_second();
                u64::try_from(seconds).ok()
            })
            .map_or(Duration::from_secs(u64::try_from(key.expiration_seconds).unwrap_or(0)), Duration::from_secs);
        Ok(Issued { token: token.to_string(), renew_at: now + life.mul_f64(RENEW_AT), expires_at: now + life })
    }

    /// The token for one source of the pod, or why there is none yet.
    pub fn token(&self, pod: &Value, source: &Value) -> Result<String, String> {
        let key = key_of(pod, source);
        if let Some(t) = self.issued.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(t.token.clone());
        }
        let why = self.failures.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        Err(format!(
            "failed to fetch token: {}",
            why.unwrap_or_else(|| format!("no token for service account {:?} yet", key.service_account))
        ))
    }

    #[cfg(test)]
    pub fn insert_for_test(&self, pod: &Value, source: &Value, token: &str) {
        let now = Instant::now();
        let issued = Issued {
            token: token.into(),
            renew_at: now + Duration::from_secs(60),
            expires_at: now + Duration::from_secs(90),
        };
        self.issued.lock().unwrap_or_else(|e| e.into_inner()).insert(key_of(pod, source), issued);
    }

    /// Drops the tokens of a pod incarnation that is gone.
    pub fn forget(&self, pod_uid: &str) {
        self.issued.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| k.pod_uid != pod_uid);
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| k.pod_uid != pod_uid);
    }
}
