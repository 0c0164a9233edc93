//! `sheepctl info` and `sheepctl version`.

use serde_json::Value;
use shepherd_api::kinds;

use crate::connection::Cluster;
use crate::resource;

pub const CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");

pub async fn version(cluster: &Cluster) -> anyhow::Result<()> {
    println!("Client Version: sheepctl {CLIENT_VERSION}");
    let v = cluster.get("/version").await?;
    println!("Server Version: {}", v["gitVersion"].as_str().unwrap_or("unknown"));
    Ok(())
}

async fn items(cluster: &Cluster, res: &shepherd_api::ResourceInfo) -> anyhow::Result<Vec<Value>> {
    let list = cluster.get(&resource::collection_path(res, None)).await?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// The server, its version, and how many of each main kind it holds.
pub async fn info(cluster: &Cluster) -> anyhow::Result<()> {
    let v = cluster.get("/version").await?;
    let nodes = items(cluster, &kinds::NODE).await?;
    let ready = nodes.iter().filter(|n| {
        n.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    }).count();
    let pods = items(cluster, &kinds::POD).await?;
    let mut phases: std::collections::BTreeMap<String, usize> = Default::default();
    for p in &pods {
        *phases.entry(p.pointer("/status/phase").and_then(Value::as_str).unwrap_or("Pending").to_string()).or_default() += 1;
    }
    let phase_text: Vec<String> = phases.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!("Server:       {}", cluster.server);
    println!("Version:      {}", v["gitVersion"].as_str().unwrap_or("unknown"));
    println!("Namespaces:   {}", items(cluster, &kinds::NAMESPACE).await?.len());
    println!("Nodes:        {} ({ready} Ready)", nodes.len());
    if phase_text.is_empty() {
        println!("Pods:         0");
    } else {
        println!("Pods:         {} ({})", pods.len(), phase_text.join(", "));
    }
    println!("Deployments:  {}", items(cluster, &kinds::DEPLOYMENT).await?.len());
    println!("ReplicaSets:  {}", items(cluster, &kinds::REPLICASET).await?.len());
    println!("Services:     {}", items(cluster, &kinds::SERVICE).await?.len());
    Ok(())
}
