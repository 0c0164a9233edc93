//! A kube-rs operator: each `Greeting` custom object is served by a Deployment it owns.
//!
//! The operator installs its CustomResourceDefinition, then reconciles every Greeting: it
//! server-side applies the Greeting's Deployment (owned through an ownerReference, so the
//! garbage collector would remove it too), reports the Deployment's progress in the Greeting's
//! status (server-side apply on the status subresource), and holds each Greeting with a finalizer
//! until its Deployment is gone.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::{Controller, conditions, wait, watcher};
use kube::{Api, Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The field manager of every write the operator makes.
pub const MANAGER: &str = "greeting-operator";
/// Held on every Greeting until its Deployment is deleted.
pub const FINALIZER: &str = "example.shepherd.dev/cleanup";
/// The label that ties a Deployment and its pods to their Greeting.
pub const GREETING_LABEL: &str = "example.shepherd.dev/greeting";

/// What a Greeting asks for: `replicas` pods that each carry `message`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "example.shepherd.dev",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus",
    shortname = "greet",
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".spec.message"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GreetingSpec {
    pub message: String,
    pub replicas: i32,
}

/// What the operator last saw of the Greeting's Deployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GreetingStatus {
    /// The Greeting's `metadata.generation` this status describes.
    pub observed_generation: Option<i64>,
    /// The name of the Deployment serving the Greeting.
    pub deployment: String,
    /// The Deployment's ready pods.
    pub ready_replicas: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Greeting {0} has no namespace")]
    NoNamespace(String),
    #[error("Kubernetes API call failed: {0}")]
    Api(#[from] kube::Error),
    #[error("Deployment {0} is still being deleted")]
    ChildStillThere(String),
    #[error("CustomResourceDefinition {0} was not established within {1:?}")]
    CrdNotEstablished(String, Duration),
    #[error("waiting for CustomResourceDefinition {0}: {1}")]
    CrdWatch(String, #[source] wait::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

/// Installs (or updates) the Greeting CustomResourceDefinition with server-side apply and waits
/// until the server serves it.
pub async fn install_crd(client: Client, timeout: Duration) -> Result<(), Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let crd = Greeting::crd();
    let name = crd.name_any();
    crds.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd)).await?;
    let established = wait::await_condition(crds, &name, conditions::is_crd_established());
    match tokio::time::timeout(timeout, established).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::CrdWatch(name, e)),
        Err(_) => Err(Error::CrdNotEstablished(name, timeout)),
    }
}

struct Context {
    client: Client,
}

/// Runs the controller until `shutdown` completes; each reconcile's outcome is logged.
pub async fn run(client: Client, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let greetings: Api<Greeting> = Api::all(client.clone());
    let deployments: Api<Deployment> = Api::all(client.clone());
    Controller::new(greetings, watcher::Config::default())
        .owns(deployments, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|outcome| async move {
            match outcome {
                Ok((obj, action)) => tracing::debug!(greeting = %obj, ?action, "reconciled"),
                // error_policy has logged the reconciler's own errors.
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => tracing::warn!(error = %e, "controller error"),
            }
        })
        .await;
}

async fn reconcile(greeting: Arc<Greeting>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = greeting.namespace().ok_or_else(|| Error::NoNamespace(greeting.name_any()))?;
    let greetings: Api<Greeting> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&greetings, FINALIZER, greeting, |event| async {
        match event {
            Event::Apply(g) => apply(&g, &ctx.client, &ns).await,
            Event::Cleanup(g) => cleanup(&g, &ctx.client, &ns).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

impl Error {
    /// Whether the error only says that a cleanup is still waiting for the Deployment to go.
    fn is_waiting_for_cleanup(&self) -> bool {
        use kube::runtime::finalizer::Error::CleanupFailed;
        matches!(self, Error::Finalizer(e) if matches!(**e, CleanupFailed(Error::ChildStillThere(_))))
    }
}

fn error_policy(greeting: Arc<Greeting>, error: &Error, _ctx: Arc<Context>) -> Action {
    if !error.is_waiting_for_cleanup() {
        tracing::warn!(greeting = %greeting.name_any(), %error, "reconcile failed; retrying");
    }
    Action::requeue(Duration::from_millis(500))
}

/// The Deployment a Greeting asks for, owned by the Greeting.
pub fn deployment_for(greeting: &Greeting) -> Deployment {
    let name = greeting.name_any();
    let labels = json!({GREETING_LABEL: &name});
    let owner = greeting.controller_owner_ref(&()).map(|o| vec![o]);
    let manifest = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": &name, "labels": &labels, "ownerReferences": owner},
        "spec": {
            "replicas": greeting.spec.replicas,
            "selector": {"matchLabels": &labels},
            "template": {
                "metadata": {"labels": &labels},
                "spec": {"containers": [{
                    "name": "greeter",
                    "image": "minimal",
                    "env": [{"name": "GREETING", "value": &greeting.spec.message}],
                }]},
            },
        },
    });
    // The manifest is built from typed values above; it always fits the Deployment type.
    serde_json::from_value(manifest).unwrap_or_default()
}

async fn apply(greeting: &Greeting, client: &Client, ns: &str) -> Result<Action, Error> {
    let name = greeting.name_any();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let ssa = PatchParams::apply(MANAGER).force();
    let applied = deployments.patch(&name, &ssa, &Patch::Apply(&deployment_for(greeting))).await?;
    let ready = applied.status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let status = GreetingStatus {
        observed_generation: greeting.meta().generation,
        deployment: name.clone(),
        ready_replicas: ready,
    };
    if greeting.status.as_ref() != Some(&status) {
        let greetings: Api<Greeting> = Api::namespaced(client.clone(), ns);
        let patch = json!({"apiVersion": Greeting::api_version(&()), "kind": Greeting::kind(&()), "status": status});
        greetings.patch_status(&name, &ssa, &Patch::Apply(&patch)).await?;
    }
    // Changes to the Deployment wake the controller; the requeue only covers lost events.
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Deletes the Greeting's Deployment and its pods, and reports success only once they are gone,
/// so the finalizer keeps the Greeting until then.
async fn cleanup(greeting: &Greeting, client: &Client, ns: &str) -> Result<Action, Error> {
    let name = greeting.name_any();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    match deployments.delete(&name, &DeleteParams::foreground()).await {
        Ok(_) => Err(Error::ChildStillThere(name)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}
