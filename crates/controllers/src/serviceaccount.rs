//! Keeps a `default` ServiceAccount in every namespace, as Kubernetes' serviceaccounts-controller
//! does: made when a namespace appears, made again when it is deleted, left alone once the
//! namespace is terminating.

use std::sync::Arc;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::{Action, Cache, Client, Controller, Manager};

use crate::ControllerConfig;

/// The ServiceAccount every namespace has.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

struct ServiceAccounts {
    client: Arc<dyn Client>,
    namespaces: Arc<Cache>,
    accounts: Arc<Cache>,
}

impl ServiceAccounts {
    async fn reconcile(&self, namespace: &str) -> Result<Action, shepherd_runtime::controller::Error> {
        let Some(ns) = self.namespaces.get(namespace) else { return Ok(Action::Done) };
        let terminating = ns.at("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
            || ns.at("/status/phase").and_then(Value::as_str) == Some("Terminating");
        if terminating || self.accounts.get(&format!("{namespace}/{DEFAULT_SERVICE_ACCOUNT}")).is_some() {
            return Ok(Action::Done);
        }
        // The namespace cache can lag its deletion, which removes the namespace's objects after
        // it: ask the server before making an account there.
        match self.client.get(&kinds::NAMESPACE, None, namespace).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(Action::Done),
            Err(e) => return Err(e.into()),
        }
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}});
        match self.client.create(&kinds::SERVICEACCOUNT, Some(namespace), sa).await {
            Ok(_) => Ok(Action::Done),
            // The cache was behind, or the namespace went away meanwhile.
            Err(e) if e.is_already_exists() || e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// The controller that gives every namespace its `default` ServiceAccount.
pub fn service_account_controller(client: Arc<dyn Client>, manager: &Manager, config: ControllerConfig) -> Controller {
    let namespaces = manager.informers().cache(&kinds::NAMESPACE);
    let accounts = manager.informers().cache(&kinds::SERVICEACCOUNT);
    let reconciler = Arc::new(ServiceAccounts { client, namespaces, accounts });
    Controller::new("serviceaccount", &kinds::NAMESPACE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    // A deleted `default` account is its namespace's business.
    .watches(&kinds::SERVICEACCOUNT, |sa| {
        let name = sa.at("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let ns = sa.at("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        if name == DEFAULT_SERVICE_ACCOUNT { vec![ns.to_string()] } else { Vec::new() }
    })
    .workers(config.workers)
    .mode(config.mode)
}
