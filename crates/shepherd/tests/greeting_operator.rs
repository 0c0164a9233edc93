//! The example kube-rs operator (`examples/operator`) against `shepherd standalone`: CRD, SSA, finalizer.

mod common;

use std::future::Future;
use std::time::Duration;

use common::Daemon;
use futures::{StreamExt, TryStreamExt};
use greeting_operator::{FINALIZER, GREETING_LABEL, Greeting, GreetingSpec, MANAGER};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Polls `probe` until it yields a value; panics naming `what` and the last thing seen after `WAIT`.
async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() > deadline => {
                panic!("timed out waiting for {what}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The Deployment once it matches `replicas` and `message`, with every pod ready.
async fn deployment_following(deployments: &Api<Deployment>, replicas: i32, message: &str) -> Deployment {
    wait_for(&format!("the Deployment at {replicas} ready replicas saying {message:?}"), || async {
        let d = deployments.get_opt("hello").await.map_err(|e| e.to_string())?.ok_or("no Deployment")?;
        let spec = d.spec.as_ref().ok_or("no spec")?;
        let env = spec.template.spec.as_ref().and_then(|p| p.containers[0].env.clone()).unwrap_or_default();
        let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        let saying = env.iter().any(|e| e.name == "GREETING" && e.value.as_deref() == Some(message));
        if spec.replicas == Some(replicas) && saying && ready == replicas {
            Ok(d)
        } else {
            Err(format!("replicas {:?}, ready {ready}, env {env:?}", spec.replicas))
        }
    })
    .await
}

/// The Greeting once its status reports `generation` with `ready` replicas.
async fn greeting_status(greetings: &Api<Greeting>, generation: i64, ready: i32) -> Greeting {
    wait_for(&format!("the Greeting's status at generation {generation} with {ready} ready"), || async {
        let g = greetings.get("hello").await.map_err(|e| e.to_string())?;
        match &g.status {
            Some(s) if s.observed_generation == Some(generation) && s.ready_replicas == ready => Ok(g),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// The Greeting's Deployment as another field manager would apply it, with its own replica count.
fn rival_deployment(replicas: i32) -> serde_json::Value {
    let labels = json!({GREETING_LABEL: "hello"});
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hello"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": &labels},
            "template": {"metadata": {"labels": &labels},
                "spec": {"containers": [{"name": "greeter", "image": "minimal"}]}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_rs_operator_installs_its_crd_reconciles_with_server_side_apply_and_cleans_up_with_a_finalizer() {
    // The operator's own log lines (failed reconciles) show in the test's output.
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("greeting_operator=info").try_init();
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", dir.path(), &[]);
    let client = Client::try_from(kube::Config::new(daemon.url.parse().expect("url"))).expect("client");

    greeting_operator::install_crd(client.clone(), Duration::from_secs(30)).await.expect("install the Greeting CRD");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(greeting_operator::run(client.clone(), async {
        let _ = stopped.await;
    }));

    let greetings: Api<Greeting> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let spec = GreetingSpec { message: "hello".into(), replicas: 2 };
    let created = greetings.create(&PostParams::default(), &Greeting::new("hello", spec)).await.expect("create");

    // The child: applied by the operator's field manager, owned by the Greeting.
    let child = deployment_following(&deployments, 2, "hello").await;
    let owner = &child.metadata.owner_references.as_ref().expect("ownerReferences")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Greeting", "hello"));
    assert_eq!(Some(&owner.uid), created.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    let managers: Vec<_> = child.managed_fields().iter().map(|m| (m.manager.clone(), m.operation.clone())).collect();
    assert!(managers.contains(&(Some(MANAGER.into()), Some("Apply".into()))), "managedFields: {managers:?}");

    // The status, written through the status subresource, and the finalizer holding the Greeting.
    let g = greeting_status(&greetings, 1, 2).await;
    assert_eq!(g.finalizers(), [FINALIZER]);
    assert_eq!(g.status.as_ref().map(|s| s.deployment.as_str()), Some("hello"));

    // A spec change is followed by the child and reported in the status.
    let change = json!({"spec": {"message": "bonjour", "replicas": 3}});
    greetings.patch("hello", &PatchParams::default(), &Patch::Merge(&change)).await.expect("change the spec");
    deployment_following(&deployments, 3, "bonjour").await;
    greeting_status(&greetings, 2, 3).await;

    // The operator owns the child's fields: another manager's apply of them conflicts, naming it.
    let conflict = deployments.patch("hello", &PatchParams::apply("rival"), &Patch::Apply(&rival_deployment(5))).await;
    match conflict {
        Err(kube::Error::Api(s)) if s.code == 409 => {
            assert!(s.message.contains(MANAGER) && s.message.contains(".spec.replicas"), "{}", s.message);
        }
        other => panic!("expected a 409 conflict naming {MANAGER}, got {other:?}"),
    }

    // A child edited behind the operator's back is put back.
    let scale = json!({"spec": {"replicas": 1}});
    let scaled = deployments.patch("hello", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scale");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(1));
    deployment_following(&deployments, 3, "bonjour").await;

    // Delete: the finalizer holds the Greeting (deletionTimestamp set, still readable) while the
    // operator deletes the Deployment and its pods; only then is the Greeting gone.
    let rv = greetings.get("hello").await.expect("get").resource_version().expect("resourceVersion");
    let mut events = greetings.watch(&WatchParams::default().timeout(120), &rv).await.expect("watch").boxed();
    greetings.delete("hello", &DeleteParams::default()).await.expect("delete the Greeting");
    let mut held = false;
    loop {
        let event = tokio::time::timeout(WAIT, events.try_next())
            .await
            .expect("the Greeting is deleted in time")
            .expect("watch")
            .expect("the watch ended before the Greeting was deleted");
        match event {
            WatchEvent::Modified(g) if g.name_any() == "hello" => {
                held |= g.metadata.deletion_timestamp.is_some() && g.finalizers().iter().any(|f| f == FINALIZER);
            }
            WatchEvent::Deleted(g) if g.name_any() == "hello" => break,
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
            _ => {}
        }
    }
    assert!(held, "the finalizer held the deleted Greeting");
    assert!(deployments.get_opt("hello").await.expect("get").is_none(), "the Deployment went before the Greeting");
    let left = pods.list(&ListParams::default().labels(&format!("{GREETING_LABEL}=hello"))).await.expect("pods");
    assert_eq!(left.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(), Vec::<String>::new(), "pods left");

    // Uninstall: deleting the CRD deletes the remaining Greetings, each through its finalizer.
    let spec = GreetingSpec { message: "bye".into(), replicas: 1 };
    greetings.create(&PostParams::default(), &Greeting::new("bye", spec)).await.expect("create another");
    wait_for("the second Greeting's Deployment", || async {
        deployments.get_opt("bye").await.map_err(|e| e.to_string())?.ok_or_else(|| "no Deployment".to_string())
    })
    .await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = Greeting::crd().name_any();
    crds.delete(&crd_name, &DeleteParams::default()).await.expect("delete the CRD");
    wait_for("the CRD and the second Greeting's Deployment gone", || async {
        let crd = crds.get_opt(&crd_name).await.map_err(|e| e.to_string())?;
        let child = deployments.get_opt("bye").await.map_err(|e| e.to_string())?;
        match (crd, child) {
            (None, None) => Ok(()),
            (crd, child) => Err(format!("CRD there: {}, Deployment there: {}", crd.is_some(), child.is_some())),
        }
    })
    .await;

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), operator).await.expect("operator stops").expect("operator task");
}
