//! `sheepctl scale`: sets `spec.replicas` through the `scale` subresource.

use anyhow::bail;
use serde_json::json;

use crate::connection::Cluster;
use crate::resource;

pub async fn run(cluster: &Cluster, target: &[String], replicas: i32) -> anyhow::Result<()> {
    let (res, names) = resource::kind_and_names(target)?;
    if !res.has_scale {
        bail!("{} cannot be scaled: only deployments and replicasets have a scale subresource", res.plural);
    }
    if names.is_empty() {
        bail!("name the object to scale: sheepctl scale {}/NAME --replicas=N", res.singular);
    }
    if replicas < 0 {
        bail!("--replicas must be 0 or more (got {replicas})");
    }
    for name in &names {
        let path = format!("{}/scale", resource::object_path(res, &cluster.namespace, name));
        cluster.merge_patch(&path, &json!({"spec": {"replicas": replicas}})).await?;
        println!("{} scaled", resource::object_ref(res, name));
    }
    Ok(())
}
