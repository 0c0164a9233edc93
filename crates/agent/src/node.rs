//! Node registration and heartbeat: the Node object (capacity, addresses, labels, Ready) and the
//! Lease in `kube-node-lease` renewed every interval. A deleted Node or Lease is recreated on the
//! next beat; a Ready condition someone else changed (the node lifecycle controller marking the
//! node Unknown) is set back to True.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::{ApiError, kinds};
use shepherd_runtime::{Client, Patch};
use tracing::{info, warn};

use crate::pods::k8s_time;

pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";

/// What a node reports about itself.
#[derive(Debug, Clone)]
pub(crate) struct NodeIdentity {
    pub name: String,
    pub ip: String,
    pub cpu: String,
    pub memory: String,
    pub lease_duration_seconds: i64,
    /// The streaming endpoint's port (`status.daemonEndpoints.kubeletEndpoint.Port`), 0 for none.
    pub streaming_port: u16,
}

impl NodeIdentity {
    /// This host's cpu count and memory.
    pub fn of_host(name: &str, ip: &str, lease_duration_seconds: i64) -> Self {
        let cpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).to_string();
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map(|kib| format!("{kib}Ki"))
            .unwrap_or_else(|| "0".into());
        NodeIdentity { name: name.into(), ip: ip.into(), cpu, memory, lease_duration_seconds, streaming_port: 0 }
    }
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn ready_condition(since: &str) -> Value {
    json!({
        "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "shepherd agent is posting ready status",
        "lastHeartbeatTime": k8s_time(Timestamp::now()), "lastTransitionTime": since,
    })
}

fn node_status(id: &NodeIdentity, since: &str) -> Value {
    let resources = json!({"cpu": id.cpu, "memory": id.memory, "pods": "110"});
    json!({
        "capacity": resources, "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": id.ip}, {"type": "Hostname", "address": id.name}],
        "conditions": [ready_condition(since)],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": id.streaming_port}},
        "nodeInfo": {
            "kubeletVersion": concat!("shepherd-", env!("CARGO_PKG_VERSION")),
            "operatingSystem": "linux", "architecture": arch(),
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
            "containerRuntimeVersion": "", "kubeProxyVersion": "",
        },
    })
}

/// Creates the Node if missing and makes sure it reports Ready=True.
pub(crate) async fn ensure_node(client: &dyn Client, id: &NodeIdentity) -> Result<(), ApiError> {
    let node = match client.get(&kinds::NODE, None, &id.name).await {
        Ok(n) => n,
        Err(e) if e.is_not_found() => {
            let obj = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": id.name, "labels": {
                    "kubernetes.io/hostname": id.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch(),
                }},
                "spec": {},
            });
            match client.create(&kinds::NODE, None, obj).await {
                Ok(n) => {
                    info!(node = %id.name, "node registered");
                    n
                }
                Err(ApiError::AlreadyExists { .. }) => client.get(&kinds::NODE, None, &id.name).await?,
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let ready = node
        .at("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned();
    let registered = node.at("/status/capacity/pods").is_some()
        && node.at("/status/daemonEndpoints/kubeletEndpoint/Port").and_then(Value::as_u64) == Some(u64::from(id.streaming_port));
    match ready {
        Some(r) if r["status"] == "True" && registered => Ok(()),
        _ => {
            let now = k8s_time(Timestamp::now());
            client.patch_status(&kinds::NODE, None, &id.name, Patch::Merge(json!({"status": node_status(id, &now)}))).await?;
            Ok(())
        }
    }
}

/// Renews (or creates) the node's Lease.
pub(crate) async fn renew_lease(client: &dyn Client, id: &NodeIdentity) -> Result<(), ApiError> {
    let renew = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string();
    let patch = json!({"spec": {"holderIdentity": id.name, "leaseDurationSeconds": id.lease_duration_seconds, "renewTime": renew}});
    match client.patch(&kinds::LEASE, Some(LEASE_NAMESPACE), &id.name, Patch::Merge(patch.clone())).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => {
            let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": id.name, "namespace": LEASE_NAMESPACE}});
            lease["spec"] = patch["spec"].clone();
            match client.create(&kinds::LEASE, Some(LEASE_NAMESPACE), lease.clone()).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) => Ok(()),
                Err(e) if e.is_not_found() => {
                    // The namespace itself is missing (a fresh cluster): create it, then the lease.
                    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}});
                    match client.create(&kinds::NAMESPACE, None, ns).await {
                        Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    match client.create(&kinds::LEASE, Some(LEASE_NAMESPACE), lease).await {
                        Ok(_) | Err(ApiError::AlreadyExists { .. }) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Registers the node, then beats every `interval` until the task is aborted.
pub(crate) async fn heartbeat(client: Arc<dyn Client>, id: NodeIdentity, interval: Duration, initial_jitter: Duration) {
    tokio::time::sleep(initial_jitter).await;
    loop {
        if let Err(e) = ensure_node(client.as_ref(), &id).await {
            warn!(node = %id.name, error = %e, "node registration failed; retrying next beat");
        }
        if let Err(e) = renew_lease(client.as_ref(), &id).await {
            warn!(node = %id.name, error = %e, "lease renewal failed; retrying next beat");
        }
        tokio::time::sleep(interval).await;
    }
}
