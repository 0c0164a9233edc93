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
use shepherd_runtime::{Cache, Client, Informer, Patch};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::pods::k8s_time;

use shepherd_api::kinds::NODE_LEASE_NAMESPACE;

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

/// How often a node writes its status when nothing in it changed (kubelet's
/// `nodeStatusReportFrequency`): the Ready condition's `lastHeartbeatTime` moves on that often.
/// Liveness is the Lease's business, and every status write is an event for every Node watcher.
pub(crate) const STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(5 * 60);

/// The node as the server has it, registering it if it does not exist.
async fn read_or_register(client: &dyn Client, id: &NodeIdentity) -> Result<Value, ApiError> {
    match client.get(&kinds::NODE, None, &id.name).await {
        Ok(n) => Ok(n),
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
                    Ok(n)
                }
                Err(ApiError::AlreadyExists { .. }) => client.get(&kinds::NODE, None, &id.name).await,
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// When the node's Ready condition turned True, if it is True.
fn ready_since(node: &Value) -> Option<&str> {
    node.at("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .filter(|c| c["status"] == "True")
        .map(|c| c["lastTransitionTime"].as_str().unwrap_or(""))
}

/// Whether the node's status already says what this agent would write, heartbeat time aside.
fn reports_as(node: &Value, id: &NodeIdentity) -> bool {
    let Some(have) = node.get("status") else { return false };
    let want = node_status(id, "");
    let ready = |status: &Value| {
        status["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).map(|c| (c["reason"].clone(), c["message"].clone()))
    };
    ["capacity", "allocatable", "addresses", "daemonEndpoints", "nodeInfo"].iter().all(|k| have.get(k) == want.get(k))
        && ready(have).is_some()
        && ready(have) == ready(&want)
}

/// Creates the Node if missing, and writes its status when it differs from what this agent
/// reports (Ready not True — the node lifecycle controller marked it Unknown —, capacity,
/// addresses, endpoints) or `STATUS_REPORT_FREQUENCY` has passed since `written`. The Node is
/// read from `nodes`, the agent's Node informer once synced, as kubelet reads its node from its
/// lister: a beat of an unchanged node sends nothing. Without a cache it is read from the server.
pub(crate) async fn ensure_node(
    client: &dyn Client,
    id: &NodeIdentity,
    nodes: Option<&Cache>,
    written: &mut Option<Instant>,
) -> Result<(), ApiError> {
    let node = match nodes.and_then(|c| c.get(&id.name)) {
        Some(n) => n,
        None => Arc::new(read_or_register(client, id).await?),
    };
    let now = Instant::now();
    let due = written.is_none_or(|at| now.duration_since(at) >= STATUS_REPORT_FREQUENCY);
    let since = ready_since(&node).filter(|t| !t.is_empty());
    if !due && since.is_some() && reports_as(&node, id) {
        return Ok(());
    }
    // A node that stays Ready keeps the time it became so.
    let since = since.map(str::to_string).unwrap_or_else(|| k8s_time(Timestamp::now()));
    client.patch_status(&kinds::NODE, None, &id.name, Patch::Merge(json!({"status": node_status(id, &since)}))).await?;
    *written = Some(now);
    Ok(())
}

/// Renews (or creates) the node's Lease. `last` is the Lease as the previous renewal wrote it: a
/// renewal is one PUT of it with a new `renewTime`, conditional on its resourceVersion, with no read
/// before it. A conflict (someone else wrote the Lease, or the server's store was replaced) re-reads
/// it once and retries; a missing Lease is created.
pub(crate) async fn renew_lease(client: &dyn Client, id: &NodeIdentity, last: &mut Option<Value>) -> Result<(), ApiError> {
    let renew = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string();
    let spec = json!({"holderIdentity": id.name, "leaseDurationSeconds": id.lease_duration_seconds, "renewTime": renew});
    let renewed = |mut lease: Value| {
        lease["spec"] = match lease.get("spec") {
            Some(Value::Object(have)) => {
                let mut merged = have.clone();
                merged.extend(spec.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
                Value::Object(merged)
            }
            _ => spec.clone(),
        };
        lease
    };
    let known = match last.take() {
        Some(lease) => Some(lease),
        None => match client.get(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), &id.name).await {
            Ok(lease) => Some(lease),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        },
    };
    if let Some(lease) = known {
        match client.update(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), renewed(lease.clone())).await {
            Ok(written) => {
                *last = Some(written);
                return Ok(());
            }
            Err(e) if e.is_conflict() => {
                let fresh = client.get(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), &id.name).await?;
                *last = Some(client.update(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), renewed(fresh)).await?);
                return Ok(());
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                // Unreachable server or a passing error: the kept Lease is still the best guess.
                *last = Some(lease);
                return Err(e);
            }
        }
    }
    let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": id.name, "namespace": NODE_LEASE_NAMESPACE}});
    lease["spec"] = spec;
    match client.create(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), lease.clone()).await {
        Ok(written) => {
            *last = Some(written);
            Ok(())
        }
        // Created meanwhile by someone else: the next beat reads it.
        Err(ApiError::AlreadyExists { .. }) => Ok(()),
        Err(e) if e.is_not_found() => {
            // The namespace itself is missing (a fresh cluster): create it, then the lease.
            let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NODE_LEASE_NAMESPACE}});
            match client.create(&kinds::NAMESPACE, None, ns).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
            match client.create(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), lease).await {
                Ok(written) => {
                    *last = Some(written);
                    Ok(())
                }
                Err(ApiError::AlreadyExists { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Registers the node, then beats every `interval` until the task is aborted. `nodes` is the
/// agent's Node informer: the node's status is compared with its cache once it has synced.
pub(crate) async fn heartbeat(client: Arc<dyn Client>, id: NodeIdentity, interval: Duration, initial_jitter: Duration, nodes: Arc<Informer>) {
    tokio::time::sleep(initial_jitter).await;
    let (mut lease, mut written) = (None, None);
    loop {
        // The Lease first: a node coming back is fresh by the time its Ready=True is seen, so the
        // node lifecycle controller does not judge that status by the expired Lease.
        if let Err(e) = renew_lease(client.as_ref(), &id, &mut lease).await {
            warn!(node = %id.name, error = %e, "lease renewal failed; retrying next beat");
        }
        let cache = nodes.is_synced().then(|| nodes.cache().as_ref());
        if let Err(e) = ensure_node(client.as_ref(), &id, cache, &mut written).await {
            warn!(node = %id.name, error = %e, "node registration failed; retrying next beat");
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use shepherd_apiserver::{ApiServer, HttpConfig};
    use shepherd_runtime::intercept::{Call, Intercepted, Interceptor};
    use shepherd_store::{HistoryLimits, LocalStore, Store};

    use super::*;

    /// Counts the reads and writes of one kind a client passes on.
    struct Calls {
        kind: &'static str,
        reads: AtomicUsize,
        writes: AtomicUsize,
    }

    #[async_trait]
    impl Interceptor for Calls {
        async fn before(&self, call: &Call<'_>) -> Result<(), ApiError> {
            if call.resource().kind != self.kind {
                return Ok(());
            }
            let counter = match call {
                Call::Get { .. } => &self.reads,
                Call::Create { .. } | Call::Update { .. } | Call::Patch { .. } | Call::UpdateStatus { .. } | Call::PatchStatus { .. } => {
                    &self.writes
                }
                _ => return Ok(()),
            };
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    type Counting = Intercepted<Calls>;

    fn counting(inner: Arc<dyn Client>) -> Counting {
        counting_kind(inner, "Lease")
    }

    fn counting_kind(inner: Arc<dyn Client>, kind: &'static str) -> Counting {
        Intercepted::new(inner, Calls { kind, reads: AtomicUsize::new(0), writes: AtomicUsize::new(0) })
    }

    /// (reads, writes) of the counted kind since the last call.
    fn take(client: &Counting) -> (usize, usize) {
        let calls = client.interceptor();
        (calls.reads.swap(0, Ordering::SeqCst), calls.writes.swap(0, Ordering::SeqCst))
    }

    async fn server(store: Arc<dyn Store>) -> Arc<dyn Client> {
        let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
        Arc::new(server.client())
    }

    fn identity() -> NodeIdentity {
        NodeIdentity { name: "n1".into(), ip: "10.0.0.1".into(), cpu: "2".into(), memory: "1Gi".into(), lease_duration_seconds: 40, streaming_port: 0 }
    }

    fn renew_time(lease: &Value) -> String {
        lease["spec"]["renewTime"].as_str().unwrap_or_default().to_string()
    }

    async fn stored_lease(client: &dyn Client) -> Value {
        client.get(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), "n1").await.expect("the lease exists")
    }

    #[tokio::test]
    async fn renewals_after_the_first_write_the_kept_lease_without_reading_it() {
        let api = server(Arc::new(LocalStore::in_memory(HistoryLimits::default()))).await;
        let client = counting(api.clone());
        let id = identity();
        let mut last = None;
        renew_lease(&client, &id, &mut last).await.expect("first renewal creates the lease");
        let (_, writes) = take(&client);
        assert!(writes >= 1, "the lease was created");
        let mut previous = renew_time(&stored_lease(api.as_ref()).await);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            renew_lease(&client, &id, &mut last).await.expect("renewal");
            assert_eq!(take(&client), (0, 1), "one write, no read");
            let now = renew_time(&stored_lease(api.as_ref()).await);
            assert!(now > previous, "renewTime moves on: {previous} -> {now}");
            previous = now;
        }
    }

    #[tokio::test]
    async fn a_lease_changed_by_someone_else_is_read_again_once_and_renewed() {
        let api = server(Arc::new(LocalStore::in_memory(HistoryLimits::default()))).await;
        let client = counting(api.clone());
        let id = identity();
        let mut last = None;
        renew_lease(&client, &id, &mut last).await.expect("first renewal");
        // Another writer (a node lifecycle controller, an operator) bumps the resourceVersion.
        let label = Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}}));
        api.patch(&kinds::LEASE, Some(NODE_LEASE_NAMESPACE), "n1", label).await.expect("someone else writes");
        take(&client);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let before = renew_time(&stored_lease(api.as_ref()).await);
        renew_lease(&client, &id, &mut last).await.expect("renewal after a conflict");
        assert_eq!(take(&client), (1, 2), "the stale write, one read, the write again");
        let lease = stored_lease(api.as_ref()).await;
        assert!(renew_time(&lease) > before, "renewed");
        assert_eq!(lease["metadata"]["labels"]["touched"], "yes", "the other writer's change is kept");
        renew_lease(&client, &id, &mut last).await.expect("next renewal");
        assert_eq!(take(&client), (0, 1), "back to one write");
    }

    #[tokio::test]
    async fn the_lease_keeps_renewing_across_a_server_restart_on_the_same_store_and_on_an_empty_one() {
        let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let id = identity();
        let mut last = None;
        let first = server(store.clone()).await;
        renew_lease(first.as_ref(), &id, &mut last).await.expect("first renewal");
        drop(first);
        // A new server on the same data: the kept resourceVersion is still current.
        let api = server(store).await;
        let client = counting(api.clone());
        let before = renew_time(&stored_lease(api.as_ref()).await);
        tokio::time::sleep(Duration::from_millis(2)).await;
        renew_lease(&client, &id, &mut last).await.expect("renewal after the restart");
        assert_eq!(take(&client), (0, 1));
        assert!(renew_time(&stored_lease(api.as_ref()).await) > before);
        drop((client, api));

        // A server with none of it: the lease is created again.
        let api = server(Arc::new(LocalStore::in_memory(HistoryLimits::default()))).await;
        renew_lease(api.as_ref(), &id, &mut last).await.expect("renewal against an empty store");
        let lease = stored_lease(api.as_ref()).await;
        assert_eq!(lease["spec"]["holderIdentity"], "n1");
        renew_lease(api.as_ref(), &id, &mut last).await.expect("and it keeps renewing");
        assert_eq!(last.as_ref().map(|l| l["metadata"]["resourceVersion"].clone()), Some(stored_lease(api.as_ref()).await["metadata"]["resourceVersion"].clone()));
    }

    fn ready(node: &Value) -> Value {
        node["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).cloned().unwrap_or(Value::Null)
    }

    /// Waits (on the paused clock) until the informer's copy of node n1 passes `check`.
    async fn cached(nodes: &Cache, check: impl Fn(&Value) -> bool) -> Arc<Value> {
        for _ in 0..1000 {
            if let Some(n) = nodes.get("n1").filter(|n| check(n)) {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the node informer never saw the expected node: {:?}", nodes.get("n1"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchanged_node_status_is_not_written_again_and_a_changed_one_is_at_the_next_beat() {
        let api = server(Arc::new(LocalStore::in_memory(HistoryLimits::default()))).await;
        let client = counting_kind(api.clone(), "Node");
        let manager = shepherd_runtime::Manager::new(api.clone());
        let informer = manager.informers().informer(&kinds::NODE);
        manager.informers().start();
        informer.wait_synced().await;
        let nodes = informer.cache().as_ref();
        let id = identity();
        let mut written = None;

        // Registration: no cached node yet, so it is read (missing), created and its status written.
        ensure_node(&client, &id, Some(nodes), &mut written).await.expect("registration");
        assert_eq!(take(&client), (1, 2), "a read, the create, the status");
        cached(nodes, |n| ready(n)["status"] == "True").await;

        // Beats of an unchanged node send nothing, read nothing.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            ensure_node(&client, &id, Some(nodes), &mut written).await.expect("beat");
            assert_eq!(take(&client), (0, 0), "an unchanged node is neither read nor written");
        }

        // The node lifecycle controller marks the node Unknown: the next beat sets it back.
        let unknown = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}});
        api.patch_status(&kinds::NODE, None, "n1", Patch::Merge(unknown)).await.expect("marked unknown");
        cached(nodes, |n| ready(n)["status"] == "Unknown").await;
        ensure_node(&client, &id, Some(nodes), &mut written).await.expect("beat");
        assert_eq!(take(&client), (0, 1), "one status write, no read");
        let back = api.get(&kinds::NODE, None, "n1").await.expect("node");
        assert_eq!(ready(&back)["status"], "True");
        assert_eq!(ready(&back)["reason"], "KubeletReady");

        // Someone changes what the node reports (its capacity): written back at the next beat too.
        let capacity = json!({"status": {"capacity": {"cpu": "64", "memory": "1Gi", "pods": "110"}}});
        api.patch_status(&kinds::NODE, None, "n1", Patch::Merge(capacity)).await.expect("capacity changed");
        cached(nodes, |n| n["status"]["capacity"]["cpu"] == "64").await;
        ensure_node(&client, &id, Some(nodes), &mut written).await.expect("beat");
        assert_eq!(take(&client), (0, 1));
        let fixed = cached(nodes, |n| n["status"]["capacity"]["cpu"] == "2").await;
        let since_back = ready(&fixed)["lastTransitionTime"].clone();

        // Nothing changes for a while: the status is written again once the report frequency has
        // passed (a new heartbeat time), its transition time kept.
        tokio::time::sleep(STATUS_REPORT_FREQUENCY - Duration::from_secs(20)).await;
        ensure_node(&client, &id, Some(nodes), &mut written).await.expect("beat");
        assert_eq!(take(&client), (0, 0), "not yet due");
        tokio::time::sleep(Duration::from_secs(20)).await;
        ensure_node(&client, &id, Some(nodes), &mut written).await.expect("beat");
        assert_eq!(take(&client), (0, 1), "due: one write");
        let reported = api.get(&kinds::NODE, None, "n1").await.expect("node");
        assert_eq!(ready(&reported)["lastTransitionTime"], since_back, "still Ready since the same time");
        manager.informers().shut_down();
    }

    #[tokio::test]
    async fn without_a_cache_the_node_is_read_from_the_server_and_a_deleted_one_registered_again() {
        let api = server(Arc::new(LocalStore::in_memory(HistoryLimits::default()))).await;
        let client = counting_kind(api.clone(), "Node");
        let id = identity();
        let mut written = None;
        ensure_node(&client, &id, None, &mut written).await.expect("registration");
        take(&client);
        ensure_node(&client, &id, None, &mut written).await.expect("beat");
        assert_eq!(take(&client), (1, 0), "read, unchanged, not written");
        api.delete(&kinds::NODE, None, "n1", &Default::default()).await.expect("node deleted");
        ensure_node(&client, &id, None, &mut written).await.expect("beat");
        assert_eq!(take(&client), (1, 2), "read (missing), created, status written");
        assert_eq!(ready(&api.get(&kinds::NODE, None, "n1").await.expect("node"))["status"], "True");
    }
}
