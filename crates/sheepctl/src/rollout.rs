//! `sheepctl rollout status|restart` for deployments.

use std::io::Write;
use std::time::Duration;

use anyhow::bail;
use futures::{AsyncBufReadExt, StreamExt};
use serde_json::{Value, json};
use shepherd_api::int_at;

use crate::connection::Cluster;
use crate::resource;

/// Where a deployment's rollout stands, judged from its status the way kubectl does.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    Waiting(String),
    Done(String),
    Failed(String),
}

pub fn progress(d: &Value) -> Progress {
    let name = d.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    if int_at(d, "/metadata/generation") > int_at(d, "/status/observedGeneration") {
        return Progress::Waiting("Waiting for deployment spec update to be observed...".into());
    }
    let deadline_exceeded = d.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten()
        .any(|c| c["type"] == "Progressing" && c["reason"] == "ProgressDeadlineExceeded");
    if deadline_exceeded {
        return Progress::Failed(format!("deployment \"{name}\" exceeded its progress deadline"));
    }
    let desired = d.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let updated = int_at(d, "/status/updatedReplicas");
    let total = int_at(d, "/status/replicas");
    let available = int_at(d, "/status/availableReplicas");
    if updated < desired {
        Progress::Waiting(format!("Waiting for deployment \"{name}\" rollout to finish: {updated} out of {desired} new replicas have been updated..."))
    } else if total > updated {
        Progress::Waiting(format!("Waiting for deployment \"{name}\" rollout to finish: {} old replicas are pending termination...", total - updated))
    } else if available < updated {
        Progress::Waiting(format!("Waiting for deployment \"{name}\" rollout to finish: {available} of {updated} updated replicas are available..."))
    } else {
        Progress::Done(format!("deployment \"{name}\" successfully rolled out"))
    }
}

fn deployment_name(target: &[String]) -> anyhow::Result<String> {
    let (res, names) = resource::kind_and_names(target)?;
    if res.kind != "Deployment" {
        bail!("rollout is supported for deployments only (got {})", res.plural);
    }
    match names.as_slice() {
        [name] => Ok(name.clone()),
        _ => bail!("name one deployment: sheepctl rollout status deployment/NAME"),
    }
}

/// Follows the deployment through a watch, printing each new progress line, until it is done,
/// fails, or `timeout` passes.
pub async fn status(cluster: &Cluster, target: &[String], timeout: Option<Duration>) -> anyhow::Result<()> {
    let name = deployment_name(target)?;
    let res = &shepherd_api::kinds::DEPLOYMENT;
    let follow = async {
        let mut last = String::new();
        loop {
            let d = cluster.get(&resource::object_path(res, &cluster.namespace, &name)).await?;
            let rv = d.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("0").to_string();
            if report(&d, &mut last)? {
                return Ok(());
            }
            let path = format!("{}?fieldSelector={}&watch=true&resourceVersion={}", resource::collection_path(res, Some(&cluster.namespace)),
                resource::encode(&format!("metadata.name={name}")), resource::encode(&rv));
            let mut lines = cluster.stream(&path, "application/json").await?.lines();
            while let Some(line) = lines.next().await {
                let Ok(line) = line else { break };
                let Ok(event) = serde_json::from_str::<Value>(&line) else { continue };
                match event["type"].as_str() {
                    Some("MODIFIED") | Some("ADDED") if report(&event["object"], &mut last)? => return Ok(()),
                    Some("DELETED") => bail!("deployment \"{name}\" was deleted while waiting for its rollout"),
                    _ => {}
                }
            }
            // The server closed the watch (timeout or restart): read again and resume.
        }
    };
    match timeout {
        Some(t) => tokio::time::timeout(t, follow).await.map_err(|_| anyhow::anyhow!("timed out waiting for the rollout of deployment \"{name}\""))?,
        None => follow.await,
    }
}

/// Prints the progress line when it changed; true once the rollout finished.
fn report(d: &Value, last: &mut String) -> anyhow::Result<bool> {
    let (line, done) = match progress(d) {
        Progress::Waiting(l) => (l, false),
        Progress::Done(l) => (l, true),
        Progress::Failed(l) => bail!("{l}"),
    };
    if line != *last {
        println!("{line}");
        let _ = std::io::stdout().flush();
        *last = line;
    }
    Ok(done)
}

/// Changes a template annotation, so the deployment rolls out new pods.
pub async fn restart(cluster: &Cluster, target: &[String]) -> anyhow::Result<()> {
    let name = deployment_name(target)?;
    let res = &shepherd_api::kinds::DEPLOYMENT;
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": now}}}}});
    cluster.merge_patch(&resource::object_path(res, &cluster.namespace, &name), &patch).await?;
    println!("{} restarted", resource::object_ref(res, &name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_like_kubectl() {
        let d = json!({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 3},
            "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 1}});
        assert_eq!(progress(&d), Progress::Waiting("Waiting for deployment \"web\" rollout to finish: 1 of 3 updated replicas are available...".into()));
        let done = json!({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 3},
            "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}});
        assert_eq!(progress(&done), Progress::Done("deployment \"web\" successfully rolled out".into()));
        let stuck = json!({"metadata": {"name": "web", "generation": 1}, "spec": {"replicas": 3}, "status": {"observedGeneration": 1,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}});
        assert!(matches!(progress(&stuck), Progress::Failed(_)));
    }
}
