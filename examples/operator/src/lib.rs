//! A kube-rs operator: each `Greeting` custom object is served by a Deployment it owns.
//!
//! The operator installs its CustomResourceDefinition, then reconciles every Greeting: it
//! server-side applies the Greeting's Deployment (owned through an ownerReference, so the
//! garbage collector would remove it too), reports the Deployment's progress in the Greeting's
//! status (server-side apply on the status subresource), and holds each Greeting with a finalizer
//! until its Deployment is gone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
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
    let labels = BTreeMap::from([(GREETING_LABEL.to_string(), name.clone())]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(labels.clone()),
            owner_references: greeting.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(greeting.spec.replicas),
            selector: LabelSelector { match_labels: Some(labels.clone()), ..LabelSelector::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..ObjectMeta::default() }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "greeter".into(),
                        image: Some("minimal".into()),
                        env: Some(vec![EnvVar {
                            name: "GREETING".into(),
                            value: Some(greeting.spec.message.clone()),
                            ..EnvVar::default()
                        }]),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting(message: &str, replicas: i32) -> Greeting {
        let mut g = Greeting::new("hello", GreetingSpec { message: message.into(), replicas });
        g.metadata.namespace = Some("default".into());
        g.metadata.uid = Some("0b0e5b33-1b7c-4a5e-9d9a-000000000001".into());
        g
    }

    #[test]
    fn the_crd_has_a_status_subresource_and_a_schema_for_spec_and_status() {
        let crd = Greeting::crd();
        assert_eq!(crd.spec.group, "example.shepherd.dev");
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        let schema = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("schema");
        let properties = schema.properties.as_ref().expect("properties");
        assert!(properties.contains_key("spec") && properties.contains_key("status"), "{properties:?}");
    }

    #[test]
    fn the_deployment_is_controlled_by_its_greeting_and_carries_the_message() {
        let d = deployment_for(&greeting("bonjour", 3));
        let owner = &d.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("Greeting", "hello", Some(true)));
        let spec = d.spec.expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let env = spec.template.spec.expect("pod spec").containers[0].env.clone().unwrap_or_default();
        assert_eq!((env[0].name.as_str(), env[0].value.as_deref()), ("GREETING", Some("bonjour")));
        assert_eq!(spec.selector.match_labels, spec.template.metadata.and_then(|m| m.labels));
    }
}
