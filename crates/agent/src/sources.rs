//! The ConfigMaps and Secrets pods read (environment and volumes), from the agent's informer
//! caches, and which pods read which object, so that a change re-syncs exactly those pods.
//!
//! Cost: one cluster-wide watch per kind per agent, rather than the kubelet's per-object watches;
//! a lookup is a hash-map read, so pods never make API calls to start. The caches hold every
//! ConfigMap and Secret of the cluster on every node, which is the price of that simplicity.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use serde_json::Value;
use shepherd_runtime::Informer;

/// ConfigMap or Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceKind {
    ConfigMap,
    Secret,
}

impl SourceKind {
    /// The word kubelet uses in its messages (`configmap "app" not found`).
    pub fn word(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "configmap",
            SourceKind::Secret => "secret",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "ConfigMap",
            SourceKind::Secret => "Secret",
        }
    }
}

/// Why a container or volume cannot be set up yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceError {
    #[error("{} \"{name}\" not found", kind.word())]
    Missing { kind: SourceKind, name: String },
    #[error("couldn't find key {key} in {} {namespace}/{name}", kind.kind())]
    MissingKey { kind: SourceKind, namespace: String, name: String, key: String },
}

type Lookup = dyn Fn(SourceKind, &str) -> Option<Arc<Value>> + Send + Sync;

pub(crate) struct Sources {
    /// `namespace/name` to the object, if it exists.
    lookup: Box<Lookup>,
    /// The informers filling the caches: until they have listed once, "not found" means nothing.
    informers: Vec<Arc<Informer>>,
}

/// Decoded contents of a ConfigMap (`data` and `binaryData`) or a Secret (`data`).
pub(crate) type Contents = BTreeMap<String, Vec<u8>>;

fn decode_map(obj: &Value, key: &str, base64: bool, out: &mut Contents) {
    for (k, v) in obj.get(key).and_then(Value::as_object).into_iter().flatten() {
        let Some(s) = v.as_str() else { continue };
        let bytes = if base64 {
            base64::engine::general_purpose::STANDARD.decode(s).unwrap_or_else(|_| s.as_bytes().to_vec())
        } else {
            s.as_bytes().to_vec()
        };
        out.insert(k.clone(), bytes);
    }
}

impl Sources {
    pub fn new(configmaps: Arc<Informer>, secrets: Arc<Informer>) -> Self {
        let (cm, sec) = (configmaps.cache().clone(), secrets.cache().clone());
        Sources {
            lookup: Box::new(move |kind, key| match kind {
                SourceKind::ConfigMap => cm.get(key),
                SourceKind::Secret => sec.get(key),
            }),
            informers: vec![configmaps, secrets],
        }
    }

    /// Waits (at most `limit`) until both caches hold a full list, so that an agent that just
    /// started does not report a ConfigMap missing that it simply has not read yet.
    pub async fn wait_synced(&self, limit: std::time::Duration) {
        let all = futures::future::join_all(self.informers.iter().map(|i| i.wait_synced()));
        let _ = tokio::time::timeout(limit, all).await;
    }

    /// Objects from a fixed list (`kind`, `namespace/name`, object), for tests.
    #[cfg(test)]
    pub fn fixed(objects: Vec<(SourceKind, &str, Value)>) -> Self {
        let map: std::collections::HashMap<(String, String), Arc<Value>> =
            objects.into_iter().map(|(k, key, v)| ((k.kind().to_string(), key.to_string()), Arc::new(v))).collect();
        let lookup = Box::new(move |kind: SourceKind, key: &str| map.get(&(kind.kind().to_string(), key.to_string())).cloned());
        Sources { lookup, informers: Vec::new() }
    }

    /// The contents of `namespace/name`, or `None` when it does not exist (yet).
    pub fn contents(&self, kind: SourceKind, namespace: &str, name: &str) -> Option<Contents> {
        let key = format!("{namespace}/{name}");
        let mut out = Contents::new();
        match kind {
            SourceKind::ConfigMap => {
                let obj = (self.lookup)(kind, &key)?;
                decode_map(&obj, "data", false, &mut out);
                decode_map(&obj, "binaryData", true, &mut out);
            }
            SourceKind::Secret => {
                let obj = (self.lookup)(kind, &key)?;
                decode_map(&obj, "data", true, &mut out);
            }
        }
        Some(out)
    }

    /// Like `contents`, with a missing object an error unless `optional` (then empty).
    pub fn require(&self, kind: SourceKind, ns: &str, name: &str, optional: bool) -> Result<Contents, SourceError> {
        match self.contents(kind, ns, name) {
            Some(c) => Ok(c),
            None if optional => Ok(Contents::new()),
            None => Err(SourceError::Missing { kind, name: name.to_string() }),
        }
    }

    /// One key of `namespace/name`: `Ok(None)` when optional and missing.
    pub fn key(&self, kind: SourceKind, namespace: &str, r: &Value) -> Result<Option<Vec<u8>>, SourceError> {
        let name = r.get("name").and_then(Value::as_str).unwrap_or("");
        let key = r.get("key").and_then(Value::as_str).unwrap_or("");
        let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
        match self.contents(kind, namespace, name) {
            None if optional => Ok(None),
            None => Err(SourceError::Missing { kind, name: name.to_string() }),
            Some(c) => match c.get(key) {
                Some(v) => Ok(Some(v.clone())),
                None if optional => Ok(None),
                None => Err(SourceError::MissingKey {
                    kind,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    key: key.to_string(),
                }),
            },
        }
    }
}

/// Whether `pod` reads ConfigMap or Secret `name` (in its own namespace) anywhere: env, envFrom,
/// volumes, projected sources.
pub(crate) fn references(pod: &Value, kind: SourceKind, name: &str) -> bool {
    let is = |v: Option<&Value>, field: &str| v.and_then(|r| r.get(field)).and_then(Value::as_str) == Some(name);
    let (key_ref, env_ref, volume, volume_field) = match kind {
        SourceKind::ConfigMap => ("configMapKeyRef", "configMapRef", "configMap", "name"),
        SourceKind::Secret => ("secretKeyRef", "secretRef", "secret", "secretName"),
    };
    let spec = &pod["spec"];
    let containers = spec.get("containers").and_then(Value::as_array).into_iter().flatten();
    for ct in containers {
        let env = ct.get("env").and_then(Value::as_array).into_iter().flatten();
        if env.into_iter().any(|e| is(e.get("valueFrom").and_then(|f| f.get(key_ref)), "name")) {
            return true;
        }
        let env_from = ct.get("envFrom").and_then(Value::as_array).into_iter().flatten();
        if env_from.into_iter().any(|e| is(e.get(env_ref), "name")) {
            return true;
        }
    }
    spec.get("volumes").and_then(Value::as_array).into_iter().flatten().any(|v| {
        is(v.get(volume), volume_field)
            || v.pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|s| is(s.get(volume), "name"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pod_references_the_objects_its_env_and_volumes_name() {
        let pod = json!({"spec": {
            "containers": [{"name": "c", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
                "envFrom": [{"configMapRef": {"name": "app"}}]}],
            "volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "extra"}}]}},
                {"name": "s", "secret": {"secretName": "tls"}}]}});
        assert!(references(&pod, SourceKind::Secret, "db"));
        assert!(references(&pod, SourceKind::Secret, "tls"));
        assert!(references(&pod, SourceKind::ConfigMap, "app"));
        assert!(references(&pod, SourceKind::ConfigMap, "extra"));
        assert!(!references(&pod, SourceKind::ConfigMap, "db"), "a Secret's name is not a ConfigMap's");
        assert!(!references(&pod, SourceKind::Secret, "app"));
    }
}
