//! The pod manager: the agent's reconciler. Desired state is the pods bound to its node(s);
//! actual state is what the runtime runs. One reconcile of a pod starts what should run,
//! restarts what exited (with back-off), stops what should not run, and reports the pod's status.
//!
//! Triggers: pod events from the engine's informer, plus runtime and probe events (an exit, a
//! readiness change) that arrive on channels and run the same reconcile at once. The engine has
//! no hook to enqueue a key from outside, so those run outside its work queue; a per-pod async
//! mutex held for the whole reconcile keeps the "one reconcile per key at a time" guarantee.
//!
//! A pod's identity on the node is its UID, as in the kubelet: a name is reused as soon as the API
//! has let go of it (a Deployment's `web-0..N`, a force delete), so one key may have several
//! incarnations at once. Only the one the API shows runs; the others are stopped and forgotten
//! without holding it up.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use shepherd_api::{JsonPath, str_at};
use shepherd_api::kinds;
use shepherd_runtime::{Cache, Client, DeleteParams, Patch};
use tokio::sync::{Mutex as AsyncMutex, mpsc};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::envvars;
use crate::network::PodNetwork;
use crate::probe::{self, ProbeEvent, ProbeKind, ProbeOutcome};
use crate::pullsecrets;
use crate::quantity;
use crate::runtime::{
    Adopted, ContainerId, ContainerSpec, Exit, ImagePull, ImageReady, ImageUnavailable, Interactive, Mount, Runtime,
    RuntimeEvent, Security,
};
use crate::sources::Sources;
use crate::volumes::{Prepared, Volumes};
use shepherd_controllers::events::EventType;

/// The annotation that makes the simulated runtime fail a pod's containers.
pub const SIMULATE_FAIL_ANNOTATION: &str = "shepherd.io/simulate-fail";
/// The annotation that makes the simulated runtime's containers exit 0 this many milliseconds
/// after they turn Running (short pods, such as a Job's, on simulated nodes).
pub const SIMULATE_EXIT_AFTER_MS_ANNOTATION: &str = "shepherd.io/simulate-exit-after-ms";

type Error = shepherd_runtime::controller::Error;

/// How often a container that cannot start yet (a missing ConfigMap or Secret) is looked at
/// again, beyond the re-sync a change of the object itself triggers.
const WAITING_RECHECK: Duration = Duration::from_secs(10);

/// How long a reconcile waits for the first list of the ConfigMaps and Secrets a pod names.
const SOURCES_SYNC_LIMIT: Duration = Duration::from_secs(10);

/// How often the usage of emptyDirs with a `sizeLimit` is measured (kubelet: every 10 s).
const DISK_USAGE_CHECK: Duration = Duration::from_secs(2);
/// The longest a runtime's promised report may take for a pod's ContainerCreating status to be
/// left unwritten (`Runtime::reports_within`): a user waits at most this long to see it started.
const COALESCE_CREATING: Duration = Duration::from_secs(1);

/// Where containers' environments and volumes come from.
pub(crate) struct ConfigInputs {
    pub sources: Arc<Sources>,
    /// `None` for simulated nodes, whose containers see no files.
    pub volumes: Option<Volumes>,
    /// Pods' own network namespaces and addresses; `None`: pods share the node's network.
    pub network: Option<Arc<PodNetwork>>,
    /// The cluster DNS pods are pointed at (no nameservers: the node's resolver, unless dnsConfig).
    pub dns: crate::dns::ClusterDns,
    /// The API server's address for containers' `KUBERNETES_SERVICE_*` variables.
    pub kubernetes_service: Option<(String, u16)>,
}

#[derive(Debug, Clone)]
pub(crate) struct PodConfig {
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

#[derive(Debug, Clone)]
enum CState {
    NotStarted,
    Creating { instance: u64, started_at: Timestamp },
    Running { instance: u64, started_at: Timestamp },
    Exited { instance: u64, exit: Exit, message: Option<String> },
}

struct ContainerRecord {
    id: ContainerId,
    image: String,
    state: CState,
    /// The exit before the current instance (`lastState`).
    last: Option<Exit>,
    restart_count: u32,
    backoff: Backoff,
    restart_at: Option<Instant>,
    ready: bool,
    probes: Vec<AbortHandle>,
    probes_for: Option<u64>,
    /// The instance a stop was asked for and the deadline it was given: asked again only to
    /// shorten the deadline (a force delete during a graceful termination).
    stop_sent: Option<(u64, Instant)>,
    /// Why the container cannot start yet (`CreateContainerConfigError`, or `ContainerCreating`
    /// while a volume is not ready) and the message, shown while it waits; an Event is recorded
    /// when it first appears or changes.
    waiting: Option<(&'static str, String)>,
    /// The last image pull failed: (`ErrImagePull` or `ImagePullBackOff`, message, when). The
    /// retry waits for `restart_at`, on its own back-off.
    pull_failure: Option<(&'static str, String, Instant)>,
    pull_backoff: Backoff,
}

impl ContainerRecord {
    fn new(id: ContainerId, image: String, config: &PodConfig) -> Self {
        ContainerRecord {
            id,
            image,
            state: CState::NotStarted,
            last: None,
            restart_count: 0,
            backoff: Backoff::new(config.backoff_initial, config.backoff_max),
            restart_at: None,
            ready: false,
            probes: Vec::new(),
            probes_for: None,
            stop_sent: None,
            waiting: None,
            pull_failure: None,
            pull_backoff: Backoff::new(config.backoff_initial, config.backoff_max),
        }
    }

    fn live_instance(&self) -> Option<u64> {
        match self.state {
            CState::Creating { instance, .. } | CState::Running { instance, .. } => Some(instance),
            _ => None,
        }
    }

    fn stop_probes(&mut self) {
        self.probes.drain(..).for_each(|p| p.abort());
        self.probes_for = None;
    }
}

struct PodRecord {
    uid: String,
    grace: Duration,
    containers: Vec<ContainerRecord>,
    /// The pod's own address, once its network is set up.
    pod_ip: Option<String>,
}

impl PodRecord {
    fn container(&mut self, name: &str) -> Option<&mut ContainerRecord> {
        self.containers.iter_mut().find(|c| c.id.name == name)
    }
}

/// The records of one pod key's incarnations on the node, by UID.
type Incarnations = HashMap<String, Arc<AsyncMutex<PodRecord>>>;

pub(crate) struct PodManager {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    /// Node name to the address its pods report (hostIP and podIP).
    nodes: HashMap<String, String>,
    runtime: Arc<dyn Runtime>,
    config: PodConfig,
    /// ConfigMaps and Secrets for environments and volumes.
    sources: Arc<Sources>,
    /// Volume directories on the node; `None` for simulated nodes, whose containers see no files.
    volumes: Option<Volumes>,
    /// Pods' own networks; `None` when pods share the node's.
    network: Option<Arc<PodNetwork>>,
    dns: crate::dns::ClusterDns,
    kubernetes_service: Option<(String, u16)>,
    /// Pod key to its incarnations on this node, by UID.
    records: Mutex<HashMap<String, Incarnations>>,
    /// The earliest pending timer per pod key, so timers do not pile up. By key, not UID: one
    /// reconcile of a key settles every incarnation of it.
    timers: Mutex<HashMap<String, Instant>>,
    /// The engine's trigger channel, once the agent's controller runs.
    engine: std::sync::OnceLock<mpsc::UnboundedSender<String>>,
    probe_tx: mpsc::UnboundedSender<ProbeEvent>,
    /// Set once the agent stops its containers on the way out: nothing starts any more.
    shutting_down: std::sync::atomic::AtomicBool,
    /// Events about pods, as kubelet writes them (image pulls).
    events: shepherd_controllers::events::EventRecorder,
    this: Weak<PodManager>,
}

/// How long `ErrImagePull` shows before the status turns to `ImagePullBackOff`, as kubelet's next
/// pod sync turns it.
const ERR_IMAGE_PULL_SHOWN: Duration = Duration::from_secs(2);


/// Kubernetes `Time`: RFC 3339 in UTC, whole seconds.
pub(crate) fn k8s_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The container's `securityContext` over the pod's (only ids are inherited from the pod).
fn security_of(pod: &Value, container: &Value) -> Security {
    let (p, c) = (pod.at("/spec/securityContext"), container.get("securityContext"));
    let id = |field: &str| {
        let of = |sc: Option<&Value>| sc.and_then(|s| s.get(field)).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
        of(c).or_else(|| of(p))
    };
    let flag = |field: &str| c.and_then(|s| s.get(field)).and_then(Value::as_bool);
    let caps = |list: &str| -> Vec<String> {
        c.and_then(|s| s.at(&format!("/capabilities/{list}")))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    Security {
        run_as_user: id("runAsUser"),
        run_as_group: id("runAsGroup"),
        read_only_root: flag("readOnlyRootFilesystem") == Some(true),
        privileged: flag("privileged") == Some(true),
        no_new_privileges: flag("allowPrivilegeEscalation") == Some(false),
        cap_add: caps("add"),
        cap_drop: caps("drop"),
    }
}

fn should_restart(policy: &str, code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    }
}

impl PodManager {
    /// Builds the manager, taking over the containers the runtime found from an earlier run.
    pub fn new(
        client: Arc<dyn Client>,
        pods: Arc<Cache>,
        nodes: HashMap<String, String>,
        runtime: Arc<dyn Runtime>,
        config: PodConfig,
        runtime_events: mpsc::UnboundedReceiver<RuntimeEvent>,
        inputs: ConfigInputs,
    ) -> Arc<PodManager> {
        let (probe_tx, probe_rx) = mpsc::unbounded_channel();
        let adopted = runtime.adopt();
        let events = shepherd_controllers::events::EventRecorder::for_node_agent(client.clone());
        let manager = Arc::new_cyclic(|this| PodManager {
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            events,
            client,
            pods,
            nodes,
            runtime,
            config,
            sources: inputs.sources,
            volumes: inputs.volumes,
            network: inputs.network,
            dns: inputs.dns,
            kubernetes_service: inputs.kubernetes_service,
            records: Mutex::default(),
            timers: Mutex::default(),
            engine: std::sync::OnceLock::new(),
            probe_tx,
            this: this.clone(),
        });
        manager.take_over(adopted);
        tokio::spawn(dispatch(manager.this.clone(), runtime_events, probe_rx));
        manager
    }

    fn take_over(&self, adopted: Vec<Adopted>) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        for a in adopted {
            let rec = records.entry(a.id.pod_key.clone()).or_default().entry(a.id.pod_uid.clone()).or_insert_with(|| {
                Arc::new(AsyncMutex::new(PodRecord {
                    uid: a.id.pod_uid.clone(),
                    grace: Duration::from_secs(30),
                    containers: Vec::new(),
                    pod_ip: None,
                }))
            });
            let Ok(mut rec) = rec.try_lock() else { continue };
            let mut c = ContainerRecord::new(a.id.clone(), a.image, &self.config);
            c.restart_count = a.restart_count;
            c.state = match a.exited {
                None => CState::Running { instance: a.instance, started_at: a.started_at },
                Some(exit) => CState::Exited { instance: a.instance, exit, message: None },
            };
            rec.containers.push(c);
        }
    }

    /// Pod keys the manager holds state for (adopted or running), to reconcile after a restart.
    pub fn known_keys(&self) -> Vec<String> {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    /// Routes runtime and probe events and timers through the engine's queue from now on.
    pub fn route_through(&self, keys: mpsc::UnboundedSender<String>) {
        let _ = self.engine.set(keys);
    }

    /// Reconciles `key` soon: through the engine's queue once the agent runs (de-duplicated,
    /// never concurrent with another reconcile of the key, retried with the engine's back-off),
    /// directly before that.
    pub fn kick(&self, key: &str) {
        if let Some(engine) = self.engine.get()
            && engine.send(key.to_string()).is_ok()
        {
            return;
        }
        let Some(this) = self.this.upgrade() else { return };
        let key = key.to_string();
        tokio::spawn(async move {
            if let Err(e) = this.reconcile(&key).await {
                warn!(pod = %key, error = %e, "reconcile after a runtime event failed; retrying in 1 s");
                this.wake_at(&key, Instant::now() + Duration::from_secs(1));
            }
        });
    }

    /// Reconciles `key` again at `at` (or earlier if already due earlier).
    fn wake_at(&self, key: &str, at: Instant) {
        {
            let mut timers = self.timers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = timers.get(key)
                && *t <= at
                && *t > Instant::now()
            {
                return;
            }
            timers.insert(key.to_string(), at);
        }
        let (this, key) = (self.this.clone(), key.to_string());
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(this) = this.upgrade() else { return };
            {
                let mut timers = this.timers.lock().unwrap_or_else(|e| e.into_inner());
                if timers.get(&key) == Some(&at) {
                    timers.remove(&key);
                }
            }
            this.kick(&key);
        });
    }

    fn mine(&self, pod: &Value) -> bool {
        self.nodes.contains_key(str_at(pod, "/spec/nodeName"))
    }

    /// The record of incarnation `uid` of `key`, if the manager holds one.
    fn record(&self, key: &str, uid: &str) -> Option<Arc<AsyncMutex<PodRecord>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).get(key)?.get(uid).cloned()
    }

    /// Drops the record of incarnation `uid` of `key` if it is still `rec`.
    fn forget(&self, key: &str, uid: &str, rec: &Arc<AsyncMutex<PodRecord>>) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let Some(incarnations) = records.get_mut(key) else { return };
        if incarnations.get(uid).is_some_and(|r| Arc::ptr_eq(r, rec)) {
            incarnations.remove(uid);
        }
        if incarnations.is_empty() {
            records.remove(key);
        }
    }

    /// One reconcile of one pod key: every incarnation of it on this node. Idempotent.
    pub async fn reconcile(&self, key: &str) -> Result<(), Error> {
        if self.shutting_down.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let pod = self.pods.get(key).filter(|p| self.mine(p));
        let current_uid = pod.as_ref().map(|p| str_at(p, "/metadata/uid").to_string());
        let earlier: Vec<(String, Arc<AsyncMutex<PodRecord>>)> = self
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|incarnations| {
                incarnations.iter().filter(|(uid, _)| Some(*uid) != current_uid.as_ref()).map(|(u, r)| (u.clone(), r.clone())).collect()
            })
            .unwrap_or_default();

        // Incarnations the API no longer shows: stop and forget them. The agent removes a pod from
        // the API only once its containers have ended, so containers still running here belong to
        // a pod that was force deleted (or deleted by someone else while the agent was away):
        // they are killed at once, cutting short any graceful termination under way.
        for (uid, rec_arc) in earlier {
            let mut rec = rec_arc.lock().await;
            if self.stop_all(&mut rec, Duration::ZERO) {
                for c in &rec.containers {
                    self.runtime.remove(&c.id);
                }
                if let Some(v) = &self.volumes {
                    v.remove(&uid);
                }
                if let Some(n) = &self.network {
                    n.teardown(&uid).await;
                }
                info!(pod = %key, uid = %uid, "pod gone: its containers are stopped and removed");
                drop(rec);
                self.forget(key, &uid, &rec_arc);
            } else {
                self.wake_at(key, Instant::now() + Duration::from_secs(2));
            }
        }
        let Some(pod) = pod else { return Ok(()) };
        let uid = current_uid.unwrap_or_default();
        let rec_arc = {
            let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            records
                .entry(key.to_string())
                .or_default()
                .entry(uid.clone())
                .or_insert_with(|| {
                    Arc::new(AsyncMutex::new(PodRecord { uid: uid.clone(), grace: Duration::from_secs(30), containers: Vec::new(), pod_ip: None }))
                })
                .clone()
        };
        let mut rec = rec_arc.lock().await;
        rec.grace = Duration::from_secs(pod.at("/spec/terminationGracePeriodSeconds").and_then(Value::as_u64).unwrap_or(30));
        self.sync_containers(&mut rec, &pod, key);

        let deleting = pod.at("/metadata/deletionTimestamp").is_some();
        let phase = str_at(&pod, "/status/phase");
        if deleting {
            let grace = pod
                .at("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_u64)
                .map(Duration::from_secs)
                .unwrap_or(rec.grace);
            let stopping: Vec<String> = rec
                .containers
                .iter()
                .filter(|c| c.stop_sent.is_none() && c.live_instance().is_some())
                .map(|c| c.id.name.clone())
                .collect();
            let ended = self.stop_all_after_hooks(&mut rec, grace, Some(&pod));
            for name in stopping {
                self.events.record(&pod, EventType::Normal, "Killing", &format!("Stopping container {name}")).await;
            }
            if !ended {
                self.wake_at(key, Instant::now() + grace + Duration::from_secs(2));
                return Ok(());
            }
            let (ns, name) = key.split_once('/').ok_or("pod key without a namespace")?;
            let params = DeleteParams { grace_period_seconds: Some(0), precondition_uid: Some(uid.clone()), ..Default::default() };
            match self.client.delete(&kinds::POD, Some(ns), name, &params).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(shepherd_api::ApiError::Conflict { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            info!(pod = %key, "containers stopped; pod removed");
            for c in &rec.containers {
                self.runtime.remove(&c.id);
            }
            if let Some(v) = &self.volumes {
                v.remove(&uid);
            }
            if let Some(n) = &self.network {
                n.teardown(&uid).await;
            }
            drop(rec);
            self.forget(key, &uid, &rec_arc);
            return Ok(());
        }

        let terminal_in_api = phase == "Failed" || phase == "Succeeded";
        if terminal_in_api {
            // Set by the agent itself (nothing left to run) or by the node lifecycle controller
            // (eviction): either way nothing runs or restarts any more.
            let grace = rec.grace;
            self.stop_all(&mut rec, grace);
            return Ok(());
        }

        let policy = str_at(&pod, "/spec/restartPolicy").to_string();
        let now = Instant::now();
        let mut wake: Option<Instant> = None;
        self.sources.wait_synced_for(&pod, SOURCES_SYNC_LIMIT).await;
        if let Some(renew) = match &self.volumes {
            Some(v) => v.tokens().refresh(&pod).await,
            None => None,
        } {
            wake = Some(wake.map_or(renew, |w| w.min(renew)));
        }
        let prepared = self.sync_volumes(&pod, &mut rec);
        let prepared = if self.sync_network(&pod, &mut rec).await { prepared } else { None };
        if prepared.is_none() {
            wake = Some(now + WAITING_RECHECK);
        }
        if let Some(v) = self.volumes.as_ref().filter(|_| Volumes::has_disk_limits(&pod)) {
            if let Some(message) = v.over_limit(&pod) {
                return self.evict(&pod, &mut rec, &message).await;
            }
            wake = Some(wake.map_or(now + DISK_USAGE_CHECK, |w| w.min(now + DISK_USAGE_CHECK)));
        }
        let specs: Vec<Value> = pod.at("/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
        let pod_ip = rec.pod_ip.clone();
        for spec in &specs {
            let name = spec.get("name").and_then(Value::as_str).unwrap_or("");
            let Some(c) = rec.container(name) else { continue };
            let start = match &c.state {
                CState::NotStarted => match c.restart_at {
                    Some(at) if at > now => {
                        let mut due = at;
                        if let Some((reason, _, since)) = &mut c.pull_failure {
                            let flip = *since + ERR_IMAGE_PULL_SHOWN;
                            if *reason == "ErrImagePull" && flip <= now {
                                *reason = "ImagePullBackOff";
                                let message = format!("Back-off pulling image {:?}", c.image);
                                self.events.record(&pod, EventType::Normal, "BackOff", &message).await;
                            } else if *reason == "ErrImagePull" {
                                due = due.min(flip);
                            }
                        }
                        wake = Some(wake.map_or(due, |w| w.min(due)));
                        false
                    }
                    _ => true,
                },
                CState::Exited { exit, .. } if should_restart(&policy, exit.code) => match c.restart_at {
                    Some(at) if at > now => {
                        wake = Some(wake.map_or(at, |w| w.min(at)));
                        false
                    }
                    _ => true,
                },
                _ => false,
            };
            if let (true, Some(prepared)) = (start, &prepared) {
                self.start_container(&pod, spec, c, prepared, pod_ip.as_deref()).await;
                if c.waiting.is_some() {
                    let at = now + WAITING_RECHECK;
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
                if let Some(at) = c.restart_at.filter(|_| matches!(c.state, CState::Exited { .. })) {
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
                if let (Some(at), Some((_, _, since))) = (c.restart_at, &c.pull_failure) {
                    let at = at.min(*since + ERR_IMAGE_PULL_SHOWN);
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
            }
            if let CState::Running { instance, .. } = c.state
                && c.probes_for != Some(instance)
            {
                self.start_probes(&pod, spec, c, instance, pod_ip.as_deref());
            }
        }
        // A runtime that reports its containers within moments (the simulated one) would have
        // each pod's status written twice in quick succession, ContainerCreating then Running.
        // As kubelet's status manager replaces a status not yet sent by the newer one, the first
        // is not written: the report's reconcile writes Running (and Ready) in one patch. At
        // 10,000 pods that is 10,000 fewer writes, each fanned out to every pod informer.
        let report_due = self.runtime.reports_within().is_some_and(|d| d <= COALESCE_CREATING)
            && !rec.containers.is_empty()
            && rec.containers.iter().all(|c| matches!(c.state, CState::Creating { .. }) && c.waiting.is_none());
        if !report_due {
            self.write_status(&pod, &rec, &policy).await?;
        }
        if let Some(at) = wake {
            self.wake_at(key, at);
        }
        Ok(())
    }

    /// Evicts the pod as kubelet does when it uses more local storage than it may: an Event, the
    /// pod `Failed` with reason `Evicted`, its containers killed.
    async fn evict(&self, pod: &Value, rec: &mut PodRecord, message: &str) -> Result<(), Error> {
        warn!(pod = %str_at(pod, "/metadata/name"), reason = %message, "evicting pod");
        self.events.record(pod, EventType::Warning, "Evicted", message).await;
        // Kubelet gives a pod evicted for its local storage no grace period.
        self.stop_all(rec, Duration::ZERO);
        let status = json!({"status": {"phase": "Failed", "reason": "Evicted", "message": message}});
        let (ns, name) = (str_at(pod, "/metadata/namespace"), str_at(pod, "/metadata/name"));
        self.client.patch_status(&kinds::POD, Some(ns), name, Patch::Merge(status)).await?;
        Ok(())
    }

    /// Gives the pod its own network namespace and address, unless it asked for the node's
    /// (`hostNetwork`) or pods share the node's network; false (a `FailedCreatePodSandBox` Event
    /// says why, containers wait) when that cannot be done yet.
    async fn sync_network(&self, pod: &Value, rec: &mut PodRecord) -> bool {
        let Some(network) = &self.network else { return true };
        if pod.at("/spec/hostNetwork").and_then(Value::as_bool) == Some(true) {
            return true;
        }
        match network.setup(&rec.uid).await {
            Ok((ip, _)) => {
                rec.pod_ip = Some(ip.to_string());
                true
            }
            Err(e) => {
                warn!(pod_uid = %rec.uid, error = %e, "cannot set up the pod's network");
                let message = format!("Failed to create pod sandbox: {e}");
                self.events.record(pod, EventType::Warning, "FailedCreatePodSandBox", &message).await;
                false
            }
        }
    }

    /// Sets up or refreshes the pod's volumes; `None` (containers wait, an Event says why) when
    /// one cannot be set up yet.
    fn sync_volumes(&self, pod: &Value, rec: &mut PodRecord) -> Option<Prepared> {
        let Some(volumes) = &self.volumes else { return Some(Prepared::default()) };
        if pod.at("/spec/volumes").and_then(Value::as_array).is_none_or(Vec::is_empty) {
            return Some(Prepared::default());
        }
        // The downward API's files carry no pod address (Kubernetes allows it in env only).
        match volumes.sync(pod, &self.node_of(pod, None)) {
            Ok(p) => {
                for c in &mut rec.containers {
                    if c.waiting.as_ref().is_some_and(|(r, _)| *r == "ContainerCreating") {
                        c.waiting = None;
                    }
                }
                Some(p)
            }
            Err(why) => {
                let mut new = false;
                for c in rec.containers.iter_mut().filter(|c| matches!(c.state, CState::NotStarted)) {
                    new |= c.waiting.as_ref().is_none_or(|(_, m)| *m != why);
                    c.waiting = Some(("ContainerCreating", why.clone()));
                }
                if new {
                    warn!(pod = %str_at(pod, "/metadata/name"), reason = %why, "volume not ready");
                    self.events.record_in_background(pod, EventType::Warning, "FailedMount", &why);
                }
                None
            }
        }
    }

    fn node_of<'a>(&'a self, pod: &Value, pod_ip: Option<&'a str>) -> envvars::Node<'a> {
        let ip = self.nodes.get(str_at(pod, "/spec/nodeName")).map_or("127.0.0.1", String::as_str);
        let (cpu_millis, memory_bytes) = envvars::host_allocatable();
        envvars::Node { ip, pod_ip, cpu_millis, memory_bytes }
    }

    /// Records why `c` cannot start; an Event only when the reason is new.
    fn hold(&self, pod: &Value, c: &mut ContainerRecord, message: String) {
        if c.waiting.as_ref().is_none_or(|(_, m)| *m != message) {
            warn!(pod = %c.id.pod_key, container = %c.id.name, reason = %message, "container cannot be configured");
            self.events.record_in_background(pod, EventType::Warning, "Failed", &format!("Error: {message}"));
        }
        c.waiting = Some(("CreateContainerConfigError", message));
    }

    /// Adds records for containers in the spec that have none yet.
    fn sync_containers(&self, rec: &mut PodRecord, pod: &Value, key: &str) {
        let api_restarts: HashMap<&str, u32> = pod
            .at("/status/containerStatuses")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| Some((s.get("name")?.as_str()?, s.get("restartCount")?.as_u64()? as u32)))
                    .collect()
            })
            .unwrap_or_default();
        let specs = pod.at("/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
        for spec in &specs {
            let name = spec.get("name").and_then(Value::as_str).unwrap_or("");
            let image = spec.get("image").and_then(Value::as_str).unwrap_or("").to_string();
            let api_count = api_restarts.get(name).copied().unwrap_or(0);
            match rec.container(name) {
                Some(c) => {
                    c.restart_count = c.restart_count.max(api_count);
                    c.image = image;
                }
                None => {
                    let id = ContainerId { pod_key: key.to_string(), pod_uid: rec.uid.clone(), name: name.to_string() };
                    let mut c = ContainerRecord::new(id, image, &self.config);
                    c.restart_count = api_count;
                    rec.containers.push(c);
                }
            }
        }
        // Keep spec order for status reporting.
        let order: Vec<&str> = specs.iter().filter_map(|s| s.get("name").and_then(Value::as_str)).collect();
        rec.containers.sort_by_key(|c| order.iter().position(|n| *n == c.id.name).unwrap_or(usize::MAX));
    }

    /// Registry credentials from the pod's `imagePullSecrets`; a Secret that is missing or not
    /// a docker config is skipped (the pull may still work anonymously), as kubelet does.
    async fn pull_credentials(&self, pod: &Value) -> Vec<(String, String, String)> {
        let Some(refs) = pod.at("/spec/imagePullSecrets").and_then(Value::as_array) else { return Vec::new() };
        let ns = str_at(pod, "/metadata/namespace");
        let mut out = Vec::new();
        for name in refs.iter().filter_map(|r| r.get("name").and_then(Value::as_str)) {
            match self.client.get(&kinds::SECRET, Some(ns), name).await {
                Ok(secret) => out.extend(pullsecrets::credentials_of(&secret)),
                Err(e) => warn!(pod = %str_at(pod, "/metadata/name"), secret = %name, error = %e, "cannot read image pull secret"),
            }
        }
        out
    }

    /// Makes the container's image available, with kubelet's Events; false (and the container
    /// waiting in `ErrImagePull`) when that failed.
    async fn pull_image(&self, pod: &Value, spec: &Value, c: &mut ContainerRecord) -> bool {
        let pull = ImagePull {
            image: c.image.clone(),
            policy: spec.get("imagePullPolicy").and_then(Value::as_str).map(str::to_string),
            credentials: self.pull_credentials(pod).await,
        };
        if self.runtime.will_pull(&pull) {
            self.events.record(pod, EventType::Normal, "Pulling", &format!("Pulling image {:?}", c.image)).await;
        }
        match self.runtime.ensure_image(&pull).await {
            Ok(ready) => {
                c.pull_failure = None;
                c.restart_at = None;
                let message = match ready {
                    ImageReady::Unused => None,
                    ImageReady::Present => Some(format!("Container image {:?} already present on machine", c.image)),
                    ImageReady::Pulled { size, duration, via } => Some(format!(
                        "Successfully pulled image {:?} in {duration:.3?}{}. Image size: {size} bytes.",
                        c.image,
                        via.map(|v| format!(" ({v})")).unwrap_or_default()
                    )),
                };
                if let Some(m) = message {
                    self.events.record(pod, EventType::Normal, "Pulled", &m).await;
                }
                true
            }
            Err(e) => {
                warn!(pod = %c.id.pod_key, container = %c.id.name, image = %c.image, error = e.message(), "image pull failed");
                let (reason, message) = match &e {
                    ImageUnavailable::InvalidName(m) => ("InspectFailed", format!("Failed to apply default image tag {:?}: {m}", c.image)),
                    ImageUnavailable::NeverPull(m) => ("ErrImageNeverPull", m.clone()),
                    ImageUnavailable::PullFailed(m) => ("Failed", format!("Failed to pull image {:?}: {m}", c.image)),
                };
                self.events.record(pod, EventType::Warning, reason, &message).await;
                self.events.record(pod, EventType::Warning, "Failed", &format!("Error: {}", e.reason())).await;
                let delay = c.pull_backoff.next(Duration::ZERO);
                c.restart_at = Some(Instant::now() + delay);
                c.pull_failure = Some((e.reason(), message, Instant::now()));
                false
            }
        }
    }

    /// `pod_ip`: the pod's own address, when it has a network of its own.
    async fn start_container(&self, pod: &Value, spec: &Value, c: &mut ContainerRecord, prepared: &Prepared, pod_ip: Option<&str>) {
        // Every start, restarts included, goes through the pull policy, as kubelet's: under
        // `Always` a tag moved in the registry gives the restarted container the new image.
        if !self.pull_image(pod, spec, c).await {
            return;
        }
        let strings = |field: &str| -> Vec<String> {
            spec.get(field)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        let mut env = match envvars::container_env(pod, spec, &self.node_of(pod, pod_ip), &self.sources) {
            Ok(env) => env,
            Err(e) => return self.hold(pod, c, e.to_string()),
        };
        if let Some((host, port)) = &self.kubernetes_service {
            envvars::add_kubernetes_service(&mut env.vars, host, *port);
        }
        let mut mounts = match self.volumes.as_ref().map(|v| v.mounts(spec, prepared)).transpose() {
            Ok(m) => m.unwrap_or_default(),
            Err(e) => return self.hold(pod, c, e),
        };
        // First, so a volume the pod mounts at /etc/resolv.conf itself still wins.
        if let (Some(volumes), Some(text)) = (&self.volumes, self.dns.resolv_conf(pod)) {
            match volumes.pod_file(str_at(pod, "/metadata/uid"), "resolv.conf", text.as_bytes()) {
                Ok(source) => mounts.insert(0, Mount { source, destination: "/etc/resolv.conf".into(), read_only: true }),
                Err(e) => return self.hold(pod, c, format!("cannot write the pod's resolv.conf: {e}")),
            }
        }
        if let Err(e) = self.runtime.check_mounts(&mounts) {
            return self.hold(pod, c, e);
        }
        c.waiting = None;
        for skipped in &env.skipped {
            self.events.record_in_background(pod, EventType::Warning, "InvalidEnvironmentVariableNames", skipped);
        }
        let env = env.vars;
        let restarting = !matches!(c.state, CState::NotStarted);
        let restart_count = if restarting { c.restart_count + 1 } else { c.restart_count };
        let hostname = pod
            .at("/spec/hostname")
            .and_then(Value::as_str)
            .unwrap_or_else(|| str_at(pod, "/metadata/name"))
            .to_string();
        let (memory_limit_bytes, cpu_limit_millis) = quantity::limits(spec);
        let cs = ContainerSpec {
            id: c.id.clone(),
            image: c.image.clone(),
            command: envvars::expand_all(strings("command"), &env),
            args: envvars::expand_all(strings("args"), &env),
            env,
            working_dir: spec.get("workingDir").and_then(Value::as_str).map(str::to_string),
            hostname,
            memory_limit_bytes,
            cpu_limit_millis,
            simulate_fail: pod.at(&format!("/metadata/annotations/{}", SIMULATE_FAIL_ANNOTATION.replace('/', "~1"))).and_then(Value::as_str)
                == Some("true"),
            simulate_exit_after: pod
                .at(&format!("/metadata/annotations/{}", SIMULATE_EXIT_AFTER_MS_ANNOTATION.replace('/', "~1")))
                .and_then(Value::as_str)
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
            restart_count,
            mounts,
            security: security_of(pod, spec),
            interactive: Interactive {
                stdin: spec.get("stdin").and_then(Value::as_bool).unwrap_or(false),
                stdin_once: spec.get("stdinOnce").and_then(Value::as_bool).unwrap_or(false),
                tty: spec.get("tty").and_then(Value::as_bool).unwrap_or(false),
            },
        };
        let previous = match &c.state {
            CState::Exited { exit, .. } => Some(exit.clone()),
            _ => None,
        };
        match self.runtime.start(&cs).await {
            Ok(started) => {
                if let Some(p) = previous {
                    c.last = Some(p);
                }
                c.restart_count = restart_count;
                c.ready = false;
                c.stop_sent = None;
                c.stop_probes();
                c.state = if started.running {
                    CState::Running { instance: started.instance, started_at: started.started_at }
                } else {
                    CState::Creating { instance: started.instance, started_at: started.started_at }
                };
            }
            Err(message) => {
                warn!(pod = %c.id.pod_key, container = %c.id.name, error = %message, "container could not start");
                // As kubelet: the cause in a Warning Event, which `kubectl describe pod` lists (it
                // shows a waiting container's reason, not its message).
                self.events.record_in_background(pod, EventType::Warning, "Failed", &format!("Error: {message}"));
                let now = Timestamp::now();
                if let Some(p) = previous {
                    c.last = Some(p);
                }
                c.restart_count = restart_count;
                let exit = Exit { code: 128, reason: "StartError".into(), started_at: now, finished_at: now };
                let delay = c.backoff.next(Duration::ZERO);
                c.restart_at = Some(Instant::now() + delay);
                c.state = CState::Exited { instance: 0, exit, message: Some(message) };
            }
        }
    }

    /// Probes reach the pod at `pod_ip`, its own address, or else the node's.
    fn start_probes(&self, pod: &Value, spec: &Value, c: &mut ContainerRecord, instance: u64, pod_ip: Option<&str>) {
        c.stop_probes();
        c.probes_for = Some(instance);
        let node_ip = || self.nodes.get(str_at(pod, "/spec/nodeName")).cloned().unwrap_or_else(|| "127.0.0.1".into());
        let ip = pod_ip.map_or_else(node_ip, str::to_string);
        for (field, kind) in [("readinessProbe", ProbeKind::Readiness), ("livenessProbe", ProbeKind::Liveness)] {
            if let Some(p) = spec.get(field).filter(|p| p.is_object()) {
                let prefix = self.runtime.exec_prefix(&c.id);
                c.probes.push(probe::spawn(kind, p, spec, &ip, c.id.clone(), instance, self.probe_tx.clone(), prefix));
            }
        }
        if spec.get("readinessProbe").is_none_or(Value::is_null) {
            c.ready = true;
        }
    }

    /// Asks every live container to stop within `grace`; true once none is live.
    fn stop_all(&self, rec: &mut PodRecord, grace: Duration) -> bool {
        self.stop_all_after_hooks(rec, grace, None)
    }

    /// As `stop_all`, running first the preStop hooks `pod` gives its containers (a deleted pod's,
    /// as kubelet does): a container whose hook sleeps gets its stop signal once the sleep is over,
    /// within the same grace period, while the pod is already out of its Services' endpoints.
    fn stop_all_after_hooks(&self, rec: &mut PodRecord, grace: Duration, pod: Option<&Value>) -> bool {
        let mut all_ended = true;
        let deadline = Instant::now() + grace;
        for c in &mut rec.containers {
            c.restart_at = None;
            if let Some(instance) = c.live_instance() {
                all_ended = false;
                if c.stop_sent.is_none_or(|(i, d)| i != instance || deadline < d) {
                    let first = c.stop_sent.is_none_or(|(i, _)| i != instance);
                    c.stop_sent = Some((instance, deadline));
                    c.stop_probes();
                    c.ready = false;
                    let sleep = pod.filter(|_| first).and_then(|p| pre_stop_sleep(p, &c.id.name)).map(|s| s.min(grace));
                    match sleep {
                        Some(sleep) if !sleep.is_zero() => {
                            let (runtime, id) = (self.runtime.clone(), c.id.clone());
                            debug!(pod = %id.pod_key, container = %id.name, ?sleep, "preStop hook: sleeping before the stop signal");
                            tokio::spawn(async move {
                                tokio::time::sleep(sleep).await;
                                runtime.stop(&id, instance, grace.saturating_sub(sleep));
                            });
                        }
                        _ => self.runtime.stop(&c.id, instance, grace),
                    }
                }
            }
        }
        all_ended
    }

    /// Applies a runtime event to its container's record; returns the pod key to reconcile.
    async fn apply_runtime_event(&self, event: RuntimeEvent) -> Option<String> {
        let id = match &event {
            RuntimeEvent::Running { id, .. } | RuntimeEvent::Exited { id, .. } => id.clone(),
        };
        let rec = self.record(&id.pod_key, &id.pod_uid)?;
        let mut rec = rec.lock().await;
        let c = rec.container(&id.name)?;
        match event {
            RuntimeEvent::Running { instance, .. } => {
                if let CState::Creating { instance: i, started_at } = c.state
                    && i == instance
                {
                    c.state = CState::Running { instance, started_at };
                }
            }
            RuntimeEvent::Exited { instance, exit, .. } => {
                if c.live_instance() != Some(instance) {
                    return None;
                }
                let ran_for = exit.finished_at.duration_since(exit.started_at).unsigned_abs();
                let delay = c.backoff.next(ran_for);
                c.restart_at = Some(Instant::now() + delay);
                c.stop_probes();
                c.ready = false;
                debug!(pod = %id.pod_key, container = %id.name, code = exit.code, "container exited; restart back-off {delay:?}");
                c.state = CState::Exited { instance, exit, message: None };
            }
        }
        Some(id.pod_key)
    }

    async fn apply_probe_event(&self, event: ProbeEvent) -> Option<String> {
        let rec = self.record(&event.id.pod_key, &event.id.pod_uid)?;
        let mut rec = rec.lock().await;
        let grace = rec.grace;
        let c = rec.container(&event.id.name)?;
        if c.live_instance() != Some(event.instance) {
            return None;
        }
        match event.outcome {
            ProbeOutcome::Ready(r) => c.ready = r,
            ProbeOutcome::LivenessFailed(why) => {
                info!(pod = %event.id.pod_key, container = %event.id.name, reason = %why, "liveness probe failed; restarting the container");
                c.ready = false;
                c.stop_probes();
                self.runtime.stop(&c.id, event.instance, grace);
            }
        }
        Some(event.id.pod_key)
    }

    fn container_status(&self, c: &ContainerRecord, policy: &str) -> Value {
        let terminated = |e: &Exit, message: &Option<String>| {
            let mut t = json!({
                "exitCode": e.code, "reason": e.reason,
                "startedAt": k8s_time(e.started_at), "finishedAt": k8s_time(e.finished_at),
            });
            if let Some(m) = message {
                t["message"] = json!(m);
            }
            json!({ "terminated": t })
        };
        let held = c.waiting.as_ref().map(|(reason, message)| json!({"waiting": {"reason": reason, "message": message}}));
        let creating = || json!({"waiting": {"reason": "ContainerCreating"}});
        let (state, started, instance) = match &c.state {
            CState::NotStarted => match (held, &c.pull_failure) {
                (Some(held), _) => (held, false, None),
                (None, Some((reason, message, _))) => (json!({"waiting": {"reason": reason, "message": message}}), false, None),
                (None, None) => (creating(), false, None),
            },
            CState::Exited { instance, exit, .. } if held.is_some() && should_restart(policy, exit.code) => {
                (held.unwrap_or_default(), false, Some(*instance))
            }
            CState::Creating { instance, .. } => (json!({"waiting": {"reason": "ContainerCreating"}}), false, Some(*instance)),
            CState::Running { instance, started_at } => {
                (json!({"running": {"startedAt": k8s_time(*started_at)}}), true, Some(*instance))
            }
            CState::Exited { instance, exit, .. } if should_restart(policy, exit.code) && c.pull_failure.is_some() => {
                let waiting = c.pull_failure.as_ref().map(|(reason, message, _)| json!({"reason": reason, "message": message}));
                (json!({"waiting": waiting}), false, Some(*instance))
            }
            CState::Exited { exit, message, instance } if should_restart(policy, exit.code) && c.restart_at.is_some() => {
                let reason = if exit.reason == "StartError" { "RunContainerError" } else { "CrashLoopBackOff" };
                let mut waiting = json!({"reason": reason, "message": format!("back-off restarting failed container {} of pod {}", c.id.name, c.id.pod_key)});
                if let Some(m) = message {
                    waiting["message"] = json!(m);
                }
                (json!({"waiting": waiting}), false, Some(*instance))
            }
            CState::Exited { exit, message, instance } => (terminated(exit, message), false, Some(*instance)),
        };
        let last = match (&c.state, &c.last) {
            (CState::Exited { exit, message, .. }, _) if should_restart(policy, exit.code) && c.restart_at.is_some() => {
                terminated(exit, message)
            }
            (_, Some(l)) => terminated(l, &None),
            _ => json!({}),
        };
        let mut s = json!({
            "name": c.id.name, "image": c.image, "imageID": "",
            "state": state, "lastState": last,
            "ready": c.ready && started, "restartCount": c.restart_count, "started": started,
        });
        if let Some(i) = instance.filter(|i| *i > 0) {
            s["containerID"] = json!(format!("shepherd://{}/{}/{}", c.id.pod_uid, c.id.name, i));
        }
        s
    }

    async fn write_status(&self, pod: &Value, rec: &PodRecord, policy: &str) -> Result<(), Error> {
        let statuses: Vec<Value> = rec.containers.iter().map(|c| self.container_status(c, policy)).collect();
        let will_run = |c: &ContainerRecord| match &c.state {
            CState::Exited { exit, .. } => should_restart(policy, exit.code),
            _ => true,
        };
        let all_done = !rec.containers.is_empty() && rec.containers.iter().all(|c| !will_run(c));
        let phase = if all_done {
            let ok = rec.containers.iter().all(|c| matches!(&c.state, CState::Exited { exit, .. } if exit.code == 0));
            if ok { "Succeeded" } else { "Failed" }
        } else if rec.containers.iter().any(|c| {
            matches!(c.state, CState::Running { .. } | CState::Exited { .. }) || c.restart_count > 0
        }) {
            "Running"
        } else {
            "Pending"
        };
        let unready: Vec<&str> = statuses
            .iter()
            .filter(|s| s["ready"] != json!(true))
            .filter_map(|s| s["name"].as_str())
            .collect();
        let ready = unready.is_empty() && !rec.containers.is_empty();
        let old_conditions = pod.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let condition = |kind: &str, status: bool, reason: Option<String>, message: Option<String>| {
            let status = if status { "True" } else { "False" };
            let old = old_conditions.iter().find(|c| c["type"] == kind);
            let since = match old {
                Some(o) if o["status"] == status => o["lastTransitionTime"].clone(),
                _ => json!(k8s_time(Timestamp::now())),
            };
            let mut c = json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": since});
            if let Some(r) = reason {
                c["reason"] = json!(r);
            }
            if let Some(m) = message {
                c["message"] = json!(m);
            }
            c
        };
        let (reason, message) = if ready {
            (None, None)
        } else if all_done {
            (Some("PodCompleted".to_string()), None)
        } else {
            (Some("ContainersNotReady".to_string()), Some(format!("containers with unready status: [{}]", unready.join(" "))))
        };
        let conditions = vec![
            condition("PodScheduled", true, None, None),
            condition("Initialized", true, None, None),
            condition("ContainersReady", ready, reason.clone(), message.clone()),
            condition("Ready", ready, reason, message),
        ];
        let ip = self.nodes.get(str_at(pod, "/spec/nodeName")).cloned().unwrap_or_else(|| "127.0.0.1".into());
        let pod_ip = match (&self.network, &rec.pod_ip) {
            (Some(_), Some(own)) => json!(own),
            // No address yet: Kubernetes leaves podIP unset until the sandbox has one.
            (Some(_), None) if pod.at("/spec/hostNetwork").and_then(Value::as_bool) != Some(true) => Value::Null,
            _ => json!(ip),
        };
        let pod_ips = if pod_ip.is_null() { json!([]) } else { json!([{"ip": pod_ip}]) };
        let start_time = pod
            .at("/status/startTime")
            .cloned()
            .filter(|v| v.is_string())
            .unwrap_or_else(|| json!(k8s_time(Timestamp::now())));
        let desired = json!({
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": statuses,
            "hostIP": ip, "hostIPs": [{"ip": ip}],
            "podIP": pod_ip, "podIPs": pod_ips,
            "startTime": start_time,
        });
        let current = pod.get("status").cloned().unwrap_or(Value::Null);
        let changed = desired.as_object().is_some_and(|d| d.iter().any(|(k, v)| current.get(k) != Some(v)));
        if !changed {
            return Ok(());
        }
        let (ns, name) = (str_at(pod, "/metadata/namespace"), str_at(pod, "/metadata/name"));
        // The uid makes the patch a precondition (as the kubelet's status manager sends it): a
        // status meant for this incarnation never lands on a newer pod of the same name.
        let patch = json!({"metadata": {"uid": rec.uid}, "status": desired});
        match self.client.patch_status(&kinds::POD, Some(ns), name, Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Stops every container on the node (each pod's grace period, SIGKILL after it, or at once
    /// when `stopping.hurry` completes) and retires them; no reconcile starts anything afterwards.
    /// For a node going down with its pods.
    pub async fn stop_everything(&self, stopping: crate::Stopping) {
        self.shutting_down.store(true, std::sync::atomic::Ordering::Relaxed);
        let records: Vec<Arc<AsyncMutex<PodRecord>>> = self
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .flat_map(|incarnations| incarnations.values().cloned())
            .collect();
        let (mut longest, mut running, mut longest_running) = (Duration::ZERO, 0, Duration::ZERO);
        for r in &records {
            let mut rec = r.lock().await;
            let grace = rec.grace;
            longest = longest.max(grace);
            if !self.stop_all(&mut rec, grace) {
                running += 1;
                longest_running = longest_running.max(grace);
            }
        }
        if running > 0 {
            (stopping.notice)(running, longest_running);
        }
        let deadline = Instant::now() + longest + Duration::from_secs(5);
        let mut hurry = Some(stopping.hurry);
        for r in &records {
            loop {
                let live = r.lock().await.containers.iter().any(|c| c.live_instance().is_some());
                if !live || Instant::now() >= deadline {
                    break;
                }
                let pause = tokio::time::sleep(Duration::from_millis(50));
                match hurry.as_mut() {
                    Some(h) => tokio::select! {
                        () = h => {
                            hurry = None;
                            for r in &records {
                                self.stop_all(&mut *r.lock().await, Duration::ZERO);
                            }
                        }
                        () = pause => {}
                    },
                    None => pause.await,
                }
            }
            // Their records and logs stay for the next agent, as a node's do across its restart.
            for c in &r.lock().await.containers {
                self.runtime.retire(&c.id);
            }
        }
    }

    /// Reconciles every pod key the manager holds state for but the cache does not show (pods
    /// deleted while the agent was away): the safety net behind the informer's events.
    /// The uids of every pod this manager runs or knows of: those the API shows on its nodes
    /// and those it still holds records for (stopping, or adopted).
    pub fn live_uids(&self) -> HashSet<String> {
        let mut uids: HashSet<String> =
            self.pods.list().iter().filter(|p| self.mine(p)).map(|p| str_at(p, "/metadata/uid").to_string()).collect();
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        uids.extend(records.values().flat_map(|incarnations| incarnations.keys().cloned()));
        uids
    }

    pub fn sweep_orphans(&self) {
        let cached: HashSet<String> = self.known_keys().into_iter().filter(|k| self.pods.get(k).is_none()).collect();
        for key in cached {
            self.kick(&key);
        }
    }
}

async fn dispatch(
    manager: Weak<PodManager>,
    mut runtime_events: mpsc::UnboundedReceiver<RuntimeEvent>,
    mut probe_events: mpsc::UnboundedReceiver<ProbeEvent>,
) {
    loop {
        let key = tokio::select! {
            Some(e) = runtime_events.recv() => {
                let Some(m) = manager.upgrade() else { return };
                m.apply_runtime_event(e).await
            }
            Some(e) = probe_events.recv() => {
                let Some(m) = manager.upgrade() else { return };
                m.apply_probe_event(e).await
            }
            else => return,
        };
        if let (Some(key), Some(m)) = (key, manager.upgrade()) {
            m.kick(&key);
        }
    }
}

impl PodManager {
    /// The pod's uid and its containers' names, as the agent knows them: the incarnation the API
    /// shows, else (a pod just gone) any one still on the node.
    pub async fn containers_of(&self, key: &str) -> Option<(String, Vec<String>)> {
        let current = self.pods.get(key).map(|p| str_at(&p, "/metadata/uid").to_string());
        let rec = {
            let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            let incarnations = records.get(key)?;
            current.and_then(|u| incarnations.get(&u)).or_else(|| incarnations.values().next())?.clone()
        };
        let rec = rec.lock().await;
        Some((rec.uid.clone(), rec.containers.iter().map(|c| c.id.name.clone()).collect()))
    }
}

impl PodManager {
    /// The pods of this manager's nodes with the containers now running, for usage sampling.
    pub async fn running_containers(&self) -> Vec<(Arc<Value>, Vec<ContainerId>)> {
        let mut out = Vec::new();
        for pod in self.pods.list().into_iter().filter(|p| self.mine(p)) {
            let key = format!("{}/{}", str_at(&pod, "/metadata/namespace"), str_at(&pod, "/metadata/name"));
            let Some(rec) = self.record(&key, str_at(&pod, "/metadata/uid")) else { continue };
            let running: Vec<ContainerId> = {
                let rec = rec.lock().await;
                rec.containers.iter().filter(|c| matches!(c.state, CState::Running { .. })).map(|c| c.id.clone()).collect()
            };
            if !running.is_empty() {
                out.push((pod, running));
            }
        }
        out
    }
}

/// The seconds the preStop hook of container `name` sleeps (`lifecycle.preStop.sleep`), if any.
fn pre_stop_sleep(pod: &Value, name: &str) -> Option<Duration> {
    let containers = pod.at("/spec/containers").and_then(Value::as_array)?;
    let container = containers.iter().find(|c| str_at(c, "/name") == name)?;
    container.at("/lifecycle/preStop/sleep/seconds").and_then(Value::as_u64).map(Duration::from_secs)
}

