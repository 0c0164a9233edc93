//! Publishes the cluster CA as the ConfigMap `kube-root-ca.crt` (key `ca.crt`) in every namespace, as
//! Kubernetes' root-ca-cert-publisher does, so that pods can verify the API server they reach with their
//! mounted token. A ConfigMap changed or deleted by someone else is put back.

use std::sync::Arc;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::{Action, Cache, Client, Controller, Manager};

use crate::ControllerConfig;

/// The ConfigMap's name in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using \
    internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed \
    across distributions of Kubernetes clusters.";

struct RootCaPublisher {
    client: Arc<dyn Client>,
    namespaces: Arc<Cache>,
    config_maps: Arc<Cache>,
    ca_pem: String,
}

impl RootCaPublisher {
    async fn reconcile(&self, namespace: &str) -> Result<Action, shepherd_runtime::controller::Error> {
        let Some(ns) = self.namespaces.get(namespace) else { return Ok(Action::Done) };
        if ns.at("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
            || ns.at("/status/phase").and_then(Value::as_str) == Some("Terminating")
        {
            return Ok(Action::Done);
        }
        let current = self.config_maps.get(&format!("{namespace}/{ROOT_CA_CONFIG_MAP}"));
        match current {
            Some(cm) if cm.at("/data/ca.crt").and_then(Value::as_str) == Some(self.ca_pem.as_str()) => Ok(Action::Done),
            Some(cm) => {
                let mut cm = (*cm).clone();
                cm["data"] = json!({"ca.crt": self.ca_pem});
                match self.client.update(&kinds::CONFIGMAP, Some(namespace), cm).await {
                    Ok(_) => Ok(Action::Done),
                    // A newer version or a deletion is on its way through the cache; it brings us back.
                    Err(e) if e.is_not_found() || matches!(e, shepherd_api::ApiError::Conflict { .. }) => {
                        Ok(Action::Done)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            None => {
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": namespace,
                        "annotations": {"kubernetes.io/description": DESCRIPTION}},
                    "data": {"ca.crt": self.ca_pem}});
                match self.client.create(&kinds::CONFIGMAP, Some(namespace), cm).await {
                    Ok(_) => Ok(Action::Done),
                    Err(e) if e.is_already_exists() || e.is_not_found() => Ok(Action::Done),
                    // A namespace being deleted refuses new content: nothing to publish there.
                    Err(shepherd_api::ApiError::Forbidden(_)) => Ok(Action::Done),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// The controller that keeps `kube-root-ca.crt` holding `ca_pem` in every namespace.
pub fn root_ca_cert_publisher(
    client: Arc<dyn Client>,
    manager: &Manager,
    config: ControllerConfig,
    ca_pem: String,
) -> Controller {
    let namespaces = manager.informers().cache(&kinds::NAMESPACE);
    let config_maps = manager.informers().cache(&kinds::CONFIGMAP);
    let reconciler = Arc::new(RootCaPublisher { client, namespaces, config_maps, ca_pem });
    Controller::new("root-ca-cert-publisher", &kinds::NAMESPACE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    .watches(&kinds::CONFIGMAP, |cm| {
        let name = cm.at("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let ns = cm.at("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        if name == ROOT_CA_CONFIG_MAP { vec![ns.to_string()] } else { Vec::new() }
    })
    .workers(config.workers)
    .mode(config.mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_runtime::testing::MemoryClient;

    #[tokio::test]
    async fn every_namespace_gets_the_ca_and_a_changed_copy_is_put_back() {
        let client = Arc::new(MemoryClient::new());
        let c: Arc<dyn Client> = client.clone();
        for ns in ["default", "team-a"] {
            c.create(&kinds::NAMESPACE, None, json!({"metadata": {"name": ns}})).await.unwrap();
        }
        let manager = Manager::new(c.clone());
        let publisher = Arc::new(RootCaPublisher {
            client: c.clone(),
            namespaces: manager.informers().cache(&kinds::NAMESPACE),
            config_maps: manager.informers().cache(&kinds::CONFIGMAP),
            ca_pem: "PEM".into(),
        });
        manager.informers().start();
        manager.informers().informer(&kinds::NAMESPACE).wait_synced().await;
        manager.informers().informer(&kinds::CONFIGMAP).wait_synced().await;
        for ns in ["default", "team-a"] {
            publisher.reconcile(ns).await.unwrap();
            let cm = c.get(&kinds::CONFIGMAP, Some(ns), ROOT_CA_CONFIG_MAP).await.unwrap();
            assert_eq!(cm["data"]["ca.crt"], "PEM");
        }
        let mut cm = c.get(&kinds::CONFIGMAP, Some("team-a"), ROOT_CA_CONFIG_MAP).await.unwrap();
        cm["data"]["ca.crt"] = json!("tampered");
        c.update(&kinds::CONFIGMAP, Some("team-a"), cm).await.unwrap();
        // The cache sees the change (a positive signal) before the reconcile that answers it.
        let key = format!("team-a/{ROOT_CA_CONFIG_MAP}");
        let seen = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while publisher.config_maps.get(&key).is_none_or(|cm| cm["data"]["ca.crt"] != "tampered") {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        });
        seen.await.expect("the cache follows the change");
        publisher.reconcile("team-a").await.unwrap();
        let cm = c.get(&kinds::CONFIGMAP, Some("team-a"), ROOT_CA_CONFIG_MAP).await.unwrap();
        assert_eq!(cm["data"]["ca.crt"], "PEM");
    }
}
