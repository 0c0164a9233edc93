//! The ReplicaSet controller: keeps `spec.replicas` active pods, named `<owner>-<ordinal>`, per
//! ReplicaSet, adopting matching orphans and releasing pods whose labels stop matching. The same
//! reconciler runs ReplicationControllers (core `v1`), whose selector is a plain label map.
//!
//! Pods are named after the Deployment that owns the ReplicaSet (else the ReplicaSet itself) with
//! the lowest ordinal no pod in the namespace uses, so the seed's Deployment `web` runs `web-0`,
//! `web-1`, `web-2`. Deterministic names make creation idempotent: a retried create meets
//! AlreadyExists, and a live read tells whether the pod is ours (counted) or another
//! ReplicaSet's (the next free ordinal is tried instead).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::selector::LabelSelector;
use shepherd_api::{ApiError, ResourceInfo, kinds};
use shepherd_api::{meta, opt_str_at, pod};
use shepherd_runtime::cache::object_key;
use shepherd_runtime::controller::Error;
use shepherd_runtime::ratelimit::WholeTokens;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager, Patch, PodView, Reconciler};
use tokio::time::Instant;
use tracing::warn;

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::podtally::{Counts, OwnerSpec, PodTally};
use crate::podutil::{self, POD_TEMPLATE_HASH};

/// Most pods created or deleted by one reconcile; the pods' own events bring the key back for more.
const BURST: usize = 500;
/// Creations start one at a time and double per successful batch up to this many at once, so a
/// ReplicaSet whose pods are all rejected fails after one request, not hundreds.
const MAX_BATCH: usize = 64;
/// How long a create or delete this controller made may go unseen by the cache before it stops
/// counting on it (the informer re-lists long before this; it only bounds a lost event).
const EXPECTATION_TTL: Duration = Duration::from_secs(60);
/// How often a ReplicaSet's status is recounted over all its pods, checking the tally kept from pod
/// events (and correcting it, should it have drifted).
const RECOUNT_EVERY: Duration = Duration::from_secs(60);
/// Status writes one ReplicaSet may make back to back, and how many a second after that: a small
/// ReplicaSet's status follows its pods at once, one whose thousands of pods change at once writes
/// it ten times a second instead of once per pod (each write is a durable commit and wakes the
/// Deployment controller).
const STATUS_BURST: u32 = 5;
const STATUS_WRITE_INTERVAL: Duration = Duration::from_millis(100);

/// Builds the ReplicaSet controller. It reads pods and ReplicaSets from the manager's shared caches.
pub fn replicaset_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    replica_controller(client, manager, config, &kinds::REPLICASET, "replicaset", true)
}

/// The ReplicaSet controller recounting every pass over all pods, with no tally: the reference the
/// incremental status is tested against.
pub fn replicaset_controller_recounting(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    replica_controller(client, manager, config, &kinds::REPLICASET, "replicaset", false)
}

/// Builds the ReplicationController controller: the ReplicaSet controller over `v1` ReplicationControllers.
pub fn replication_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    replica_controller(client, manager, config, &kinds::REPLICATIONCONTROLLER, "replication", true)
}

fn replica_controller(
    client: Arc<dyn Client>,
    manager: &Manager,
    config: &ControllerConfig,
    kind: &'static ResourceInfo,
    name: &str,
    incremental: bool,
) -> Controller {
    let replicasets = manager.informers().cache(kind);
    let tally = incremental.then(|| {
        let tally = Arc::new(PodTally::over(manager.informers().cache(&kinds::POD)));
        let feed = tally.clone();
        manager.informers().informer(&kinds::POD).subscribe(move |change| feed.apply(change));
        tally
    });
    let reconciler = ReplicaSetReconciler {
        tally,
        recounted: Mutex::default(),
        paces: Mutex::default(),
        events: EventRecorder::new(client.clone(), format!("{name}-controller")),
        client,
        kind,
        pods: manager.informers().cache(&kinds::POD),
        replicasets: replicasets.clone(),
        expectations: Mutex::default(),
    };
    Controller::new(name, kind, reconciler)
        .owns(&kinds::POD)
        // An orphan wakes every ReplicaSet whose selector it matches, so one of them adopts it.
        .watches(&kinds::POD, move |pod| {
            if meta::controller_ref(pod).is_some() {
                return Vec::new();
            }
            let Some(ns) = meta::namespace(pod) else { return Vec::new() };
            replicasets
                .by_namespace(ns)
                .iter()
                .filter(|rs| selector_of(rs, kind).is_ok_and(|s| s.matches_object(pod)))
                .filter_map(|rs| object_key(rs))
                .collect()
        })
        .workers(config.workers)
        .mode(config.mode)
}

/// The revision a pod was written at (`metadata.resourceVersion`); when unreadable, one no cache
/// reaches, so the expectation waits for the pod itself or its TTL.
fn created_revision(pod: &Value) -> u64 {
    shepherd_runtime::cache::resource_version(pod).unwrap_or(u64::MAX)
}

/// A ReplicaSet's label selector; a ReplicationController's selector is a plain map of labels.
fn selector_of(rs: &Value, kind: &ResourceInfo) -> Result<LabelSelector, ApiError> {
    let selector = rs.at("/spec/selector").unwrap_or(&Value::Null);
    if kind.kind == "ReplicationController" {
        return LabelSelector::from_k8s(&json!({"matchLabels": selector}));
    }
    LabelSelector::from_k8s(selector)
}

/// Creates and deletes this controller made that the cache has not shown yet, by pod name and uid.
/// Without them a reconcile right after a create would see too few pods and create more.
#[derive(Default)]
struct Expectations {
    /// Pod name to its uid, the revision that created it, and when.
    creating: HashMap<String, (String, u64, Instant)>,
    deleting: HashMap<String, (String, Instant)>,
}

impl Expectations {
    /// Forgets what the cache now reflects (or what is too old to wait for). `observed` is the
    /// pod cache's revision: a creation at or below it was seen, even if the pod is gone again.
    fn prune(&mut self, pods: &HashMap<&str, &PodView>, observed: u64) {
        self.prune_by(|name| pods.get(name).copied(), observed)
    }

    /// `prune` with the owned pods looked up by name.
    fn prune_by<P: std::ops::Deref<Target = PodView>>(&mut self, pod: impl Fn(&str) -> Option<P>, observed: u64) {
        let fresh = |at: &Instant| at.elapsed() < EXPECTATION_TTL;
        self.creating.retain(|name, (uid, created, at)| {
            fresh(at) && *created > observed && pod(name.as_str()).is_none_or(|p| p.uid() != uid)
        });
        self.deleting.retain(|name, (uid, at)| {
            fresh(at) && pod(name.as_str()).is_some_and(|p| p.uid() == uid && !p.is_deleting())
        })
    }

    /// The deletions the cache has not shown yet, as pod keys in `namespace` with their uids.
    fn deleting_keys(&self, namespace: &str) -> Vec<(String, String)> {
        self.deleting.iter().map(|(name, (uid, _))| (format!("{namespace}/{name}"), uid.clone())).collect()
    }

    fn is_being_deleted(&self, pod: &PodView) -> bool {
        self.deleting.get(pod.name()).is_some_and(|(uid, _)| uid == pod.uid())
    }
}

struct ReplicaSetReconciler {
    client: Arc<dyn Client>,
    /// ReplicaSet or ReplicationController.
    kind: &'static ResourceInfo,
    pods: Arc<Cache>,
    replicasets: Arc<Cache>,
    events: EventRecorder,
    /// By ReplicaSet key. A key is reconciled by one worker at a time, so each entry has one writer.
    expectations: Mutex<HashMap<String, Expectations>>,
    /// Pod counts per owner kept from pod events; `None` recounts every pass.
    tally: Option<Arc<PodTally>>,
    /// When each key last had its status recounted over all its pods.
    recounted: Mutex<HashMap<String, Instant>>,
    /// Status writes allowed per key, with the tally only (the recounting pass is its own pace).
    paces: Mutex<HashMap<String, WholeTokens>>,
}

/// The least a key waits when a pass asks to be run again: a wait computed as (nearly) zero (an
/// availability due this instant, a token due in a microsecond) is rounded up to a pause that lets
/// the pod changes of that moment gather into one pass.
const LEAST_REQUEUE: Duration = Duration::from_millis(10);

/// The sooner of two optional waits, at least [`LEAST_REQUEUE`].
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    let wait = match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    wait.map(|w| w.max(LEAST_REQUEUE))
}

/// Which ordinals under a name prefix are in use, looked up by name in the pod cache rather than
/// by scanning the namespace, plus what this pass reserved or freed since the cache last changed.
struct Ordinals<'a> {
    pods: &'a Cache,
    namespace: &'a str,
    prefix: &'a str,
    reserved: BTreeSet<u64>,
    freed: BTreeSet<u64>,
}

impl Ordinals<'_> {
    fn is_taken(&self, ordinal: u64) -> bool {
        self.reserved.contains(&ordinal)
            || (!self.freed.contains(&ordinal)
                && self.pods.contains(&format!("{}/{}-{ordinal}", self.namespace, self.prefix)))
    }

    fn reserve(&mut self, ordinal: u64) {
        self.reserved.insert(ordinal);
    }

    fn free(&mut self, ordinal: u64) {
        self.reserved.remove(&ordinal);
        self.freed.insert(ordinal);
    }
}

/// What a create of one pod name came to.
enum Created {
    /// Created now, or found already created for this ReplicaSet by an earlier try: its uid and
    /// the revision it was created at.
    Ours(String, u64),
    /// The name belongs to a pod of someone else; try another ordinal.
    Taken,
}

#[async_trait]
impl Reconciler for ReplicaSetReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let Some(rs) = self.replicasets.get(key) else {
            self.lock_expectations().remove(key);
            self.recounted.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
            self.paces.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
            return Ok(Action::Done);
        };
        self.sync(key, &rs).await
    }
}

impl ReplicaSetReconciler {
    fn lock_expectations(&self) -> std::sync::MutexGuard<'_, HashMap<String, Expectations>> {
        self.expectations.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn sync(&self, key: &str, rs: &Value) -> Result<Action, Error> {
        let ns = meta::namespace(rs).unwrap_or("default");
        let selector = match selector_of(rs, self.kind) {
            Ok(s) if !s.is_empty() => s,
            _ => {
                let msg = "spec.selector is empty or invalid; no pods are managed";
                self.events.record(rs, EventType::Warning, "InvalidSelector", msg).await;
                return Ok(Action::Done);
            }
        };
        let rs_uid = meta::uid(rs);
        let prefix = pod_name_prefix(rs);
        let min_ready = Duration::from_secs(rs.at("/spec/minReadySeconds").and_then(Value::as_u64).unwrap_or(0));
        let replicas = rs.at("/spec/replicas").and_then(Value::as_u64).unwrap_or(1) as usize;
        let orphans: Vec<Arc<PodView>> = self
            .pods
            .pod_views_unowned_in_namespace(ns)
            .into_iter()
            .filter(|pod| pod.matches(&selector) && !pod.is_deleting())
            .collect();
        if orphans.is_empty()
            && let Some(action) = self.sync_counted(key, rs, &selector, &prefix, replicas, min_ready).await?
        {
            return Ok(action);
        }
        let mut errors: Vec<String> = Vec::new();

        // Claim: keep what is ours and matches, release what stopped matching, adopt orphans. The
        // cache indexes pods by controller and keeps the unowned ones apart, so a reconcile reads
        // its own pods and the orphans, not the whole namespace. It reads the pods' views; only a
        // pod to release or adopt is read whole, for the patch.
        let mut owned: Vec<Arc<PodView>> = Vec::new();
        for pod in self.pods.pod_views_by_controller_uid(rs_uid) {
            if pod.matches(&selector) || pod.is_deleting() {
                owned.push(pod);
            } else if let Err(e) = self.release(&pod, rs_uid).await {
                errors.push(e.to_string());
            }
        }
        if !orphans.is_empty() && !meta::is_deleting(rs) {
            match self.adopt_all(rs, &orphans, &selector).await {
                Ok(adopted) => owned.extend(adopted),
                Err(e) => errors.push(e.to_string()),
            }
        }

        if !meta::is_deleting(rs)
            && let Err(e) = self.manage_replicas(key, rs, &owned, &prefix, replicas).await
        {
            errors.push(e);
        }

        let (status, wait) = {
            let expectations = self.lock_expectations();
            let exp = expectations.get(key);
            let active: Vec<&PodView> = owned
                .iter()
                .map(|p| p.as_ref())
                .filter(|p| p.is_active() && !exp.is_some_and(|e| e.is_being_deleted(p)))
                .collect();
            compute_status(rs, &active, min_ready, errors.first().map(String::as_str))
        };
        if let Some(tally) = &self.tally {
            // The safety net: this pass counted every pod; make the tally agree with its own pods.
            tally.set_spec(rs_uid, &owner_spec(rs, &selector));
            if tally.recount(rs_uid) {
                warn!(replicaset = %key, "pod tally had drifted from its pods; recounted");
            }
            self.recounted.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), Instant::now());
        }
        let deferred = self.write_status(key, rs, status).await?;
        if !errors.is_empty() {
            return Err(errors.join("; ").into());
        }
        Ok(sooner(wait, deferred).map_or(Action::Done, Action::RequeueAfter))
    }

    /// A pass that reads the tally instead of the pods, when all it has to do is create pods (or
    /// nothing) and write status: no strays to release, no failed pods, no excess to delete, and no
    /// full recount due. `None` when a full pass is needed.
    async fn sync_counted(
        &self,
        key: &str,
        rs: &Value,
        selector: &LabelSelector,
        prefix: &str,
        replicas: usize,
        min_ready: Duration,
    ) -> Result<Option<Action>, Error> {
        let Some(tally) = &self.tally else { return Ok(None) };
        let recount_due = |at: Option<&Instant>| at.is_none_or(|at| at.elapsed() >= RECOUNT_EVERY);
        if meta::is_deleting(rs) || recount_due(self.recounted.lock().unwrap_or_else(|e| e.into_inner()).get(key)) {
            return Ok(None);
        }
        let ns = meta::namespace(rs).unwrap_or("default");
        let rs_uid = meta::uid(rs);
        tally.set_spec(rs_uid, &owner_spec(rs, selector));
        let owned = |name: &str| {
            self.pods
                .pod_view(&format!("{ns}/{name}"))
                .filter(|p| p.controller_uid() == Some(rs_uid) && (p.matches(selector) || p.is_deleting()))
        };
        let (pending_creates, creating, excluded) = {
            let mut all = self.lock_expectations();
            let exp = all.entry(key.to_string()).or_default();
            exp.prune_by(owned, self.pods.observed_revision());
            let creating: Vec<u64> = exp.creating.keys().filter_map(|n| pod::ordinal(n, prefix)).collect();
            (exp.creating.len(), creating, exp.deleting_keys(ns))
        };
        let Some(counts) = tally.counts(rs_uid, min_ready, podutil::now(), &excluded) else { return Ok(None) };
        let have = counts.replicas + pending_creates;
        if counts.strays > 0 || counts.failed > 0 || have > replicas {
            return Ok(None);
        }
        let mut failure = None;
        if have < replicas {
            let mut taken =
                Ordinals { pods: &self.pods, namespace: ns, prefix, reserved: creating.into_iter().collect(), freed: BTreeSet::new() };
            failure = self.create_pods(key, rs, prefix, (replicas - have).min(BURST), &mut taken).await.err();
        }
        let (status, wait) = status_from_counts(rs, &counts, failure.as_deref());
        let deferred = self.write_status(key, rs, status).await?;
        if let Some(e) = failure {
            return Err(e.into());
        }
        Ok(Some(sooner(wait, deferred).map_or(Action::Done, Action::RequeueAfter)))
    }

    /// Creates or deletes pods so that active pods (plus creations the cache has not shown yet)
    /// equal `replicas`. Failed pods are deleted and replaced.
    async fn manage_replicas(
        &self,
        key: &str,
        rs: &Value,
        owned: &[Arc<PodView>],
        prefix: &str,
        replicas: usize,
    ) -> Result<(), String> {
        let by_name: HashMap<&str, &PodView> = owned.iter().map(|p| (p.name(), p.as_ref())).collect();
        let (pending_creates, mut active) = {
            let mut all = self.lock_expectations();
            let exp = all.entry(key.to_string()).or_default();
            exp.prune(&by_name, self.pods.observed_revision());
            let active: Vec<Arc<PodView>> =
                owned.iter().filter(|p| p.is_active() && !exp.is_being_deleted(p)).cloned().collect();
            (exp.creating.len(), active)
        };

        // Ordinals in use: pods of any owner in the namespace under this prefix, and names we are creating.
        let mut taken = Ordinals {
            pods: &self.pods,
            namespace: meta::namespace(rs).unwrap_or("default"),
            prefix,
            reserved: BTreeSet::new(),
            freed: BTreeSet::new(),
        };
        if let Some(exp) = self.lock_expectations().get(key) {
            taken.reserved.extend(exp.creating.keys().filter_map(|n| pod::ordinal(n, prefix)));
        }

        let failed: Vec<&Arc<PodView>> = owned.iter().filter(|p| p.phase() == "Failed" && !p.is_deleting()).collect();
        for pod in failed {
            match self.delete_pod(key, pod).await {
                Ok(gone) => {
                    let msg = format!("Deleted failed pod: {}", pod.name());
                    self.events.record(rs, EventType::Normal, "SuccessfulDelete", &msg).await;
                    if gone && let Some(o) = pod::ordinal(pod.name(), prefix) {
                        taken.free(o);
                    }
                }
                Err(e) => return Err(self.failed(rs, "FailedDelete", &e).await),
            }
        }

        let have = active.len() + pending_creates;
        if have < replicas {
            let want = (replicas - have).min(BURST);
            self.create_pods(key, rs, prefix, want, &mut taken).await?;
        } else if have > replicas {
            let excess = (have - replicas).min(BURST).min(active.len());
            active.sort_by(|a, b| podutil::victim_order(a, b, prefix));
            let victims: Vec<Arc<PodView>> = active.into_iter().take(excess).collect();
            let results = futures::future::join_all(victims.iter().map(|p| self.delete_pod(key, p))).await;
            for (pod, r) in victims.iter().zip(results) {
                match r {
                    Ok(_) => {
                        let msg = format!("Deleted pod: {}", pod.name());
                        self.events.record(rs, EventType::Normal, "SuccessfulDelete", &msg).await;
                    }
                    Err(e) => return Err(self.failed(rs, "FailedDelete", &e).await),
                }
            }
        }
        Ok(())
    }

    /// Creates `want` pods at the lowest free ordinals, in doubling batches.
    async fn create_pods(&self, key: &str, rs: &Value, prefix: &str, want: usize, taken: &mut Ordinals<'_>) -> Result<(), String> {
        let mut remaining = want;
        let mut batch = 1usize;
        let mut next = 0u64;
        while remaining > 0 {
            let mut names = Vec::new();
            for _ in 0..batch.min(remaining) {
                while taken.is_taken(next) {
                    next += 1;
                }
                taken.reserve(next);
                names.push(format!("{prefix}-{next}"));
            }
            let results = futures::future::join_all(names.iter().map(|n| self.create_pod(rs, n))).await;
            let mut failure = None;
            for (name, r) in names.iter().zip(results) {
                match r {
                    Ok(Created::Ours(uid, revision)) => {
                        remaining -= 1;
                        if let Some(exp) = self.lock_expectations().get_mut(key) {
                            exp.creating.insert(name.clone(), (uid, revision, Instant::now()));
                        }
                        let msg = format!("Created pod: {name}");
                        self.events.record(rs, EventType::Normal, "SuccessfulCreate", &msg).await;
                    }
                    Ok(Created::Taken) => {}
                    Err(e) => failure = Some(e),
                }
            }
            if let Some(e) = failure {
                return Err(self.failed(rs, "FailedCreate", &e).await);
            }
            batch = (batch * 2).min(MAX_BATCH);
        }
        Ok(())
    }

    async fn create_pod(&self, rs: &Value, name: &str) -> Result<Created, ApiError> {
        let ns = meta::namespace(rs);
        match self.client.create(&kinds::POD, ns, pod_from_template(rs, self.kind, name)).await {
            Ok(pod) => Ok(Created::Ours(meta::uid(&pod).to_string(), created_revision(&pod))),
            Err(e) if e.is_already_exists() => match self.client.get(&kinds::POD, ns, name).await {
                Ok(pod) if meta::controller_uid(&pod) == Some(meta::uid(rs)) && pod::is_active(&pod) => {
                    Ok(Created::Ours(meta::uid(&pod).to_string(), created_revision(&pod)))
                }
                Ok(_) => Ok(Created::Taken),
                // Gone again between the create and the read: let the next reconcile retry it.
                Err(e) if e.is_not_found() => Ok(Created::Taken),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Deletes a pod if it is still the one we saw; `Ok(true)` when it is gone at once (unbound
    /// pods), `Ok(false)` while its node agent stops it.
    async fn delete_pod(&self, key: &str, pod: &PodView) -> Result<bool, ApiError> {
        let params = DeleteParams { precondition_uid: Some(pod.uid().to_string()), ..Default::default() };
        let gone = match self.client.delete(&kinds::POD, pod.namespace(), pod.name(), &params).await {
            Ok(remaining) => remaining.is_none(),
            // Already gone, or replaced by another pod of the same name: either way not ours to delete.
            Err(e) if e.is_not_found() || e.is_conflict() => true,
            Err(e) => return Err(e),
        };
        if let Some(exp) = self.lock_expectations().get_mut(key) {
            exp.deleting.insert(pod.name().to_string(), (pod.uid().to_string(), Instant::now()));
        }
        Ok(gone)
    }

    async fn failed(&self, rs: &Value, reason: &str, e: &ApiError) -> String {
        let msg = format!("{reason} for {}: {e}", meta::name(rs));
        self.events.record(rs, EventType::Warning, reason, &e.to_string()).await;
        msg
    }

    /// Takes orphans after checking, live, that this ReplicaSet is still the one we cached and
    /// not being deleted. Each adoption is conditional on the pod's resourceVersion, so of two
    /// ReplicaSets racing for an orphan exactly one wins. The patch is made from the pod as the
    /// cache holds it now, which must still be an orphan the selector matches.
    async fn adopt_all(&self, rs: &Value, orphans: &[Arc<PodView>], selector: &LabelSelector) -> Result<Vec<Arc<PodView>>, ApiError> {
        let fresh = self.client.get(self.kind, meta::namespace(rs), meta::name(rs)).await?;
        if meta::uid(&fresh) != meta::uid(rs) || meta::is_deleting(&fresh) {
            return Ok(Vec::new());
        }
        let mut adopted = Vec::new();
        for orphan in orphans {
            let Some(pod) = self.pods.get(&orphan.key()).filter(|p| {
                meta::uid(p) == orphan.uid() && meta::controller_ref(p).is_none() && selector.matches_object(p) && !meta::is_deleting(p)
            }) else {
                continue;
            };
            let patch = podutil::adopt_patch(&pod, rs, self.kind);
            match self.client.patch(&kinds::POD, meta::namespace(&pod), meta::name(&pod), Patch::Merge(patch)).await {
                Ok(p) => {
                    let msg = format!("Adopted pod: {}", meta::name(&pod));
                    self.events.record(rs, EventType::Normal, "Adopted", &msg).await;
                    adopted.push(Arc::new(PodView::of(&p)));
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(adopted)
    }

    /// Removes `rs_uid` from the owner references of the pod as the cache holds it now.
    async fn release(&self, view: &PodView, rs_uid: &str) -> Result<(), ApiError> {
        let Some(pod) = self.pods.get(&view.key()).filter(|p| meta::uid(p) == view.uid()) else { return Ok(()) };
        let patch = podutil::release_patch(&pod, rs_uid);
        match self.client.patch(&kinds::POD, meta::namespace(&pod), meta::name(&pod), Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes `status` if it changed; `Some(wait)` when the key's pace put the write off that long.
    async fn write_status(&self, key: &str, rs: &Value, status: Value) -> Result<Option<Duration>, ApiError> {
        let current = rs.get("status").cloned().unwrap_or_else(|| json!({}));
        if same_status(&current, &status) {
            return Ok(None);
        }
        if self.tally.is_some() {
            let mut paces = self.paces.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let pace = paces.entry(key.to_string()).or_insert_with(|| WholeTokens::full(STATUS_BURST, STATUS_WRITE_INTERVAL, now));
            if let Err(wait) = pace.take(now) {
                return Ok(Some(wait));
            }
        }
        let patch = json!({"status": status});
        match self.client.patch_status(self.kind, meta::namespace(rs), meta::name(rs), Patch::Merge(patch)).await {
            Ok(_) => Ok(None),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The name pods of this ReplicaSet start with: its Deployment's name, else its own.
fn pod_name_prefix(rs: &Value) -> String {
    match meta::controller_ref(rs) {
        Some(r) if r.get("kind").and_then(Value::as_str) == Some("Deployment") => {
            r.get("name").and_then(Value::as_str).unwrap_or(meta::name(rs)).to_string()
        }
        _ => meta::name(rs).to_string(),
    }
}

/// A pod of `rs` named `name`: the template's labels (with the ReplicaSet's pod-template-hash),
/// annotations and spec, controlled by the ReplicaSet.
fn pod_from_template(rs: &Value, kind: &ResourceInfo, name: &str) -> Value {
    let template = rs.at("/spec/template").cloned().unwrap_or_else(|| json!({}));
    let mut labels = template.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(hash) = opt_str_at(rs, "/metadata/labels/pod-template-hash") {
        labels.entry(POD_TEMPLATE_HASH).or_insert_with(|| json!(hash));
    }
    let mut metadata = json!({
        "name": name,
        "labels": labels,
        "ownerReferences": [podutil::owner_reference_to(rs, kind)],
    });
    if let Some(ns) = meta::namespace(rs) {
        metadata["namespace"] = json!(ns);
    }
    if let Some(a) = template.at("/metadata/annotations").filter(|a| a.is_object()) {
        metadata["annotations"] = a.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))})
}

/// What `rs` counts as its pods, for the tally.
fn owner_spec(rs: &Value, selector: &LabelSelector) -> OwnerSpec {
    let template_labels = rs.at("/spec/template/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    OwnerSpec { selector: selector.clone(), template_labels }
}

/// The status `kubectl get rs` shows, and how long until a ready pod becomes available, counted
/// over all of `active`.
fn compute_status(rs: &Value, active: &[&PodView], min_ready: Duration, failure: Option<&str>) -> (Value, Option<Duration>) {
    let no_labels = serde_json::Map::new();
    let template_labels = rs.at("/spec/template/metadata/labels").and_then(Value::as_object).unwrap_or(&no_labels);
    let now = podutil::now();
    let mut ready = 0;
    let mut available = 0;
    let mut fully_labeled = 0;
    let mut wait: Option<Duration> = None;
    for pod in active {
        if podutil::fully_labeled(pod, template_labels) {
            fully_labeled += 1;
        }
        if pod.is_ready() {
            ready += 1;
        }
        match pod.availability(min_ready, now) {
            Ok(true) => available += 1,
            Ok(false) => {}
            Err(w) => wait = Some(wait.map_or(w, |cur| cur.min(w))),
        }
    }
    let counts = Counts { replicas: active.len(), fully_labeled, ready, available, wait, ..Counts::default() };
    status_from_counts(rs, &counts, failure)
}

/// The status of `rs` with these counts (and the failure of this pass, if any), and how long until
/// a ready pod becomes available.
fn status_from_counts(rs: &Value, counts: &Counts, failure: Option<&str>) -> (Value, Option<Duration>) {
    let now = podutil::now();
    let mut status = json!({
        "replicas": counts.replicas,
        "fullyLabeledReplicas": counts.fully_labeled,
        "readyReplicas": counts.ready,
        "availableReplicas": counts.available,
        "observedGeneration": meta::generation(rs),
    });
    let mut conditions: Vec<Value> = rs
        .at("/status/conditions")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter(|c| c.get("type").and_then(Value::as_str) != Some("ReplicaFailure")).cloned().collect())
        .unwrap_or_default();
    if let Some(message) = failure {
        let previous = rs.at("/status/conditions").and_then(Value::as_array).and_then(|c| {
            c.iter().find(|c| c.get("type").and_then(Value::as_str) == Some("ReplicaFailure")).cloned()
        });
        let since = previous
            .and_then(|p| p.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(podutil::format_time(now)));
        conditions.push(json!({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
            "message": message, "lastTransitionTime": since}));
    }
    if !conditions.is_empty() {
        status["conditions"] = json!(conditions);
    }
    // Rounded up to whole seconds: timestamps have second precision.
    let wait = counts.wait.map(|w| Duration::from_secs(w.as_secs() + u64::from(w.subsec_nanos() > 0)));
    (status, wait)
}

/// Equal in every field this controller writes.
fn same_status(current: &Value, new: &Value) -> bool {
    let fields = ["replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas", "observedGeneration"];
    let num = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).unwrap_or(0);
    fields.iter().all(|f| num(current, f) == num(new, f))
        && current.get("conditions").filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
            == new.get("conditions").filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_runtime::cache::Change;

    #[test]
    fn a_created_pod_deleted_before_any_reconcile_saw_it_stops_being_expected() {
        let mut exp = Expectations::default();
        exp.creating.insert("web-0".into(), ("uid-a".into(), 7, Instant::now()));
        exp.prune(&HashMap::new(), 6);
        assert_eq!(exp.creating.len(), 1, "the cache has not reached the create: still expected");
        exp.prune(&HashMap::new(), 9);
        assert!(exp.creating.is_empty(), "the cache passed the create and has no such pod: it was deleted");
    }

    #[test]
    fn pods_of_a_deployment_replicaset_are_named_after_the_deployment() {
        let rs = json!({"metadata": {"name": "web-5d8f7c", "namespace": "default", "uid": "u",
            "labels": {"pod-template-hash": "5d8f7c"},
            "ownerReferences": [{"kind": "Deployment", "name": "web", "uid": "d", "controller": true}]},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}}});
        assert_eq!(pod_name_prefix(&rs), "web");
        let pod = pod_from_template(&rs, &kinds::REPLICASET, "web-0");
        assert_eq!(pod["metadata"]["labels"], json!({"app": "web", "pod-template-hash": "5d8f7c"}));
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "u");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"], true);
        let bare = json!({"metadata": {"name": "cache", "uid": "u"}});
        assert_eq!(pod_name_prefix(&bare), "cache");
    }

    /// The recorded workload of `tally_equivalence`: pods of `rs-1` (and some not) going through
    /// every transition the status counts.
    struct Workload {
        pods: std::collections::BTreeMap<String, Arc<Value>>,
        tally: PodTally,
        rs: Value,
    }

    fn pod(name: &str, owner: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": owner, "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Pending"}})
    }

    fn ready_at(pod: &mut Value, ready: bool, ago: Option<u64>) {
        let mut cond = json!({"type": "Ready", "status": if ready { "True" } else { "False" }});
        if let Some(secs) = ago {
            let at = podutil::now().checked_sub(jiff::SignedDuration::from_secs(secs as i64)).expect("in range");
            cond["lastTransitionTime"] = json!(podutil::format_time(at));
        }
        pod["status"] = json!({"phase": "Running", "conditions": [cond]});
    }

    impl Workload {
        fn new(rs: Value) -> Self {
            Workload { pods: Default::default(), tally: PodTally::default(), rs }
        }

        fn put(&mut self, obj: Value) {
            let key = object_key(&obj).expect("named");
            let new = Arc::new(obj);
            let change = match self.pods.insert(key, new.clone()) {
                Some(old) => Change::Updated { old, new },
                None => Change::Added(new),
            };
            self.tally.apply(&change);
        }

        fn edit(&mut self, name: &str, f: impl FnOnce(&mut Value)) {
            let mut obj = self.pods[&format!("default/{name}")].as_ref().clone();
            f(&mut obj);
            self.put(obj);
        }

        fn delete(&mut self, name: &str) {
            let old = self.pods.remove(&format!("default/{name}")).expect("exists");
            self.tally.apply(&Change::Deleted(old));
        }

        /// The tally's status against a full recount over the pods, as the full pass makes it.
        fn check(&self, step: &str, excluded: &[&str]) {
            let selector = selector_of(&self.rs, &kinds::REPLICASET).expect("selector");
            let min_ready = Duration::from_secs(self.rs["spec"]["minReadySeconds"].as_u64().unwrap_or(0));
            let uid = meta::uid(&self.rs);
            let owned: Vec<&Value> = self
                .pods
                .values()
                .map(|p| p.as_ref())
                .filter(|p| meta::controller_uid(p) == Some(uid) && (selector.matches_object(p) || meta::is_deleting(p)))
                .collect();
            let active: Vec<PodView> = owned
                .iter()
                .copied()
                .filter(|p| pod::is_active(p) && !excluded.contains(&meta::name(p)))
                .map(PodView::of)
                .collect();
            let full = compute_status(&self.rs, &active.iter().collect::<Vec<_>>(), min_ready, None);

            self.tally.set_spec(uid, &owner_spec(&self.rs, &selector));
            let excluded: Vec<(String, String)> =
                excluded.iter().map(|n| (format!("default/{n}"), format!("uid-{n}"))).collect();
            let counts = self.tally.counts(uid, min_ready, podutil::now(), &excluded).expect("spec set");
            assert_eq!(status_from_counts(&self.rs, &counts, None), full, "{step}");
            let strays = self
                .pods
                .values()
                .filter(|p| meta::controller_uid(p) == Some(uid) && !selector.matches_object(p) && !meta::is_deleting(p))
                .count();
            let failed = owned.iter().filter(|p| pod::phase(p) == "Failed" && !meta::is_deleting(p)).count();
            assert_eq!((counts.strays, counts.failed), (strays, failed), "{step}: strays and failed pods");
            assert!(!self.tally.recount(uid), "{step}: the sums agree with the pods they were built from");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tally_equivalence_the_tally_gives_the_status_a_full_recount_gives_at_every_step() {
        let rs = json!({"metadata": {"name": "web", "namespace": "default", "uid": "rs-1", "generation": 3},
            "spec": {"replicas": 5, "minReadySeconds": 10, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web", "tier": "front"}}}}});
        let mut w = Workload::new(rs);
        let labels = json!({"app": "web", "tier": "front"});
        for i in 0..6 {
            w.put(pod(&format!("web-{i}"), "rs-1", labels.clone()));
        }
        w.check("created, none ready", &[]);
        w.edit("web-0", |p| ready_at(p, true, Some(30)));
        w.edit("web-1", |p| ready_at(p, true, Some(4)));
        w.edit("web-2", |p| ready_at(p, true, None));
        w.edit("web-5", |p| ready_at(p, true, Some(4)));
        w.check("ready: long enough, not yet available, since forever", &[]);
        w.edit("web-3", |p| p["metadata"]["labels"] = json!({"app": "web"}));
        w.check("a pod missing a template label", &[]);
        w.edit("web-4", |p| p["metadata"]["labels"] = json!({"app": "other"}));
        w.check("a pod the selector stopped matching", &[]);
        w.edit("web-1", |p| ready_at(p, false, Some(0)));
        w.check("a pod turned unready", &[]);
        w.edit("web-0", |p| p["metadata"]["deletionTimestamp"] = json!(podutil::format_time(podutil::now())));
        w.check("a pod terminating", &[]);
        w.edit("web-2", |p| p["status"]["phase"] = json!("Failed"));
        w.check("a pod failed", &[]);
        w.check("a deletion the cache has not shown", &["web-5"]);
        w.delete("web-3");
        w.put(pod("other-0", "rs-2", labels.clone()));
        let mut orphan = pod("stray-0", "rs-1", labels.clone());
        orphan["metadata"]["ownerReferences"] = json!([]);
        w.put(orphan);
        w.check("a pod gone, another owner's and an orphan added", &[]);
        tokio::time::advance(Duration::from_secs(7)).await;
        w.check("minReadySeconds passed for a ready pod: available with no pod event", &[]);
        w.edit("web-4", |p| p["metadata"]["labels"] = json!({"app": "web", "tier": "front"}));
        w.put(pod("web-6", "rs-1", labels.clone()));
        w.edit("web-6", |p| ready_at(p, true, Some(2)));
        w.check("a stray matching again, a new pod ready", &[]);
        w.rs["spec"]["template"]["metadata"]["labels"] = json!({"app": "web", "tier": "back"});
        w.rs["spec"]["minReadySeconds"] = json!(0);
        w.check("the template and minReadySeconds changed: recounted", &[]);
        for name in ["web-4", "web-5", "web-6", "web-0", "web-1", "web-2"] {
            w.delete(name);
        }
        w.check("all gone", &[]);
    }
}
