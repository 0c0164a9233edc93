//! The controller loop: turn informer events, resyncs or ticks into keys, and reconcile each key.
//!
//! Guarantees:
//! - a key is reconciled by at most one worker at a time, and a key enqueued many times before a
//!   worker takes it is reconciled once (the work queue's guarantees);
//! - an error requeues the key with per-key exponential backoff; `Action::RequeueAfter` requeues it
//!   after the given delay; success resets the key's backoff;
//! - a panic inside `reconcile` is caught, logged with the controller and key, counted, and treated
//!   as an error; the worker, the controller and every other controller keep running;
//! - every update event enqueues its key, including updates that change only metadata (an
//!   annotation such as `shepherd.io/force-resync` is how a user asks for a reconcile);
//! - trigger modes: `Level` enqueues nothing on events and every `interval` re-lists from the API
//!   and enqueues every key; `Edge` enqueues on events only; `Hybrid` (default) enqueues on events
//!   and every resync period (with jitter) brings the cache up to the server (a digest comparison
//!   that reads again only what differs) and enqueues every key, so a change whose event was lost
//!   is still reconciled within one period.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use rand::Rng;
use serde_json::Value;
use shepherd_api::{JsonPath, ResourceInfo};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, error, info_span, warn};

use crate::cache::{Change, controller_owner, object_key};
use crate::faults::{Fault, ReconcileFaults, WatchFaults};
use crate::informer::{HandlerId, Informer, InformerFactory};
use crate::metrics::{ControllerLabels, Metrics, ResultLabels};
use crate::ratelimit::{RateLimiter, default_rate_limiter};
use crate::cputime::CpuTimed;
use crate::workqueue::WorkQueue;

/// A key is not reconciled again before this multiple of the CPU time its last reconcile used has
/// passed, so one key that is expensive and triggered continuously (a ReplicaSet of 10,000 pods
/// while they start) gets at most half of a core, and the rest of the process keeps its share.
const COOL_DOWN_PER_CPU_SECOND: u32 = 1;
/// Cool-downs shorter than this are not worth a timer: cheap reconciles are never delayed.
const MIN_COOL_DOWN: Duration = Duration::from_millis(2);
/// However expensive a reconcile was, its key waits at most this long.
const MAX_COOL_DOWN: Duration = Duration::from_secs(1);
/// The shortest requeue: a reconciler that computes a wait of (nearly) zero, over and over, would
/// otherwise run back to back without ever waiting, and on a current-thread runtime (or a paused
/// test clock, which only advances when every task waits) nothing else would run.
const MIN_REQUEUE: Duration = Duration::from_millis(1);

/// What a reconcile failed with. Any error type converts into it with `?`.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// What to do with a key after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the next event (or resync).
    Done,
    /// Reconcile the key again after this delay (for example to re-check a timeout); delays under
    /// a millisecond count as one.
    RequeueAfter(Duration),
}

/// Brings one object (named by its key, `namespace/name` or `name`) to its desired state.
/// Must be idempotent. Closures `Fn(String) -> impl Future<Output = Result<Action, Error>>` qualify.
#[async_trait]
pub trait Reconciler: Send + Sync + 'static {
    async fn reconcile(&self, key: &str) -> Result<Action, Error>;
}

#[async_trait]
impl<F, Fut> Reconciler for F
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        self(key.to_string()).await
    }
}

/// When a controller looks at its objects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TriggerMode {
    /// No event-driven work: every `interval`, re-list from the API and enqueue every key.
    Level { interval: Duration },
    /// Events only. Fast, and stuck forever when an event is lost.
    Edge,
    /// Events, plus every `resync` (± `jitter` as a fraction) the cache brought up to the server
    /// (`Informer::resync`: by digest, reading again only what differs) and every key enqueued.
    Hybrid { resync: Duration, jitter: f64 },
    /// Events, plus every `check` a digest comparison with the server that repairs exactly the
    /// objects a lost event left stale (no object read when nothing was lost), plus a rare full
    /// `resync` for drift outside the API.
    AntiEntropy { check: Duration, resync: Duration },
}

impl TriggerMode {
    /// Level-triggered with the seed's 5 s ticker.
    pub fn level() -> Self {
        TriggerMode::Level { interval: Duration::from_secs(5) }
    }

    pub fn edge() -> Self {
        TriggerMode::Edge
    }

    /// Hybrid with a 5 minute resync and ±10% jitter.
    pub fn hybrid() -> Self {
        TriggerMode::Hybrid { resync: Duration::from_secs(300), jitter: 0.1 }
    }

    /// Anti-entropy with a check every second and a full resync every 10 minutes.
    pub fn anti_entropy() -> Self {
        TriggerMode::AntiEntropy { check: Duration::from_secs(1), resync: Duration::from_secs(600) }
    }

    /// `level`, `edge`, `hybrid` or `anti-entropy`.
    pub fn name(&self) -> &'static str {
        match self {
            TriggerMode::Level { .. } => "level",
            TriggerMode::Edge => "edge",
            TriggerMode::Hybrid { .. } => "hybrid",
            TriggerMode::AntiEntropy { .. } => "anti-entropy",
        }
    }

    /// The level interval, the hybrid resync period or the anti-entropy check interval.
    pub fn period(&self) -> Option<Duration> {
        match self {
            TriggerMode::Level { interval } => Some(*interval),
            TriggerMode::Edge => None,
            TriggerMode::Hybrid { resync, .. } => Some(*resync),
            TriggerMode::AntiEntropy { check, .. } => Some(*check),
        }
    }

    /// The same mode with another period (ignored for `Edge`).
    pub fn with_period(self, period: Duration) -> Self {
        match self {
            TriggerMode::Level { .. } => TriggerMode::Level { interval: period },
            TriggerMode::Edge => TriggerMode::Edge,
            TriggerMode::Hybrid { jitter, .. } => TriggerMode::Hybrid { resync: period, jitter },
            TriggerMode::AntiEntropy { resync, .. } => TriggerMode::AntiEntropy { check: period, resync },
        }
    }
}

impl Default for TriggerMode {
    fn default() -> Self {
        TriggerMode::hybrid()
    }
}

impl FromStr for TriggerMode {
    type Err = String;

    /// Parses a flag value: `level`, `edge`, `hybrid` or `anti-entropy`, with their default periods.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "level" => Ok(TriggerMode::level()),
            "edge" => Ok(TriggerMode::edge()),
            "hybrid" => Ok(TriggerMode::hybrid()),
            "anti-entropy" => Ok(TriggerMode::anti_entropy()),
            other => Err(format!("unknown trigger mode {other:?}: expected level, edge, hybrid or anti-entropy")),
        }
    }
}

/// Maps an object of a watched kind to the keys of primary objects to reconcile.
pub type Mapper = Arc<dyn Fn(&Value) -> Vec<String> + Send + Sync>;

/// Which changes of a primary object enqueue it.
pub type ChangeFilter = Arc<dyn Fn(&Change) -> bool + Send + Sync>;

/// A controller declaration: its primary kind, what else it watches, how it reconciles and runs.
/// Run it by adding it to a `Manager`.
pub struct Controller {
    pub(crate) name: String,
    primary: ResourceInfo,
    reconciler: Arc<dyn Reconciler>,
    workers: usize,
    mode: TriggerMode,
    owns: Vec<ResourceInfo>,
    watches: Vec<(ResourceInfo, Mapper)>,
    rate_limiter: Option<Box<dyn RateLimiter>>,
    faults: ReconcileFaults,
    shutdown_grace: Duration,
    triggers: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
    primary_changes: Option<ChangeFilter>,
    runtime: Option<tokio::runtime::Handle>,
}

impl Controller {
    /// A controller named `name` (its queue and metrics label) reconciling objects of `primary`.
    /// Defaults: 1 worker, hybrid mode, the default rate limiter, 30 s shutdown grace.
    pub fn new(name: impl Into<String>, primary: &ResourceInfo, reconciler: impl Reconciler) -> Self {
        Controller::with_reconciler(name, primary, Arc::new(reconciler))
    }

    /// Like `new`, for a reconciler already shared as a trait object.
    pub fn with_reconciler(name: impl Into<String>, primary: &ResourceInfo, reconciler: Arc<dyn Reconciler>) -> Self {
        Controller {
            name: name.into(),
            primary: *primary,
            reconciler,
            workers: 1,
            mode: TriggerMode::default(),
            owns: Vec::new(),
            watches: Vec::new(),
            rate_limiter: None,
            faults: ReconcileFaults::default(),
            shutdown_grace: Duration::from_secs(30),
            triggers: None,
            primary_changes: None,
            runtime: None,
        }
    }

    /// How many keys may be reconciled at once (at least 1).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    pub fn mode(mut self, mode: TriggerMode) -> Self {
        self.mode = mode;
        self
    }

    /// Watches `owned`: a change to an object whose controller ownerReference points at a
    /// primary-kind object enqueues that owner (a pod change enqueues its ReplicaSet).
    pub fn owns(mut self, owned: &ResourceInfo) -> Self {
        self.owns.push(*owned);
        self
    }

    /// Watches `kind` and enqueues whatever keys `mapper` returns for a changed object (a node
    /// change can enqueue the pods bound to it, found through the pod cache's node index).
    pub fn watches(mut self, kind: &ResourceInfo, mapper: impl Fn(&Value) -> Vec<String> + Send + Sync + 'static) -> Self {
        self.watches.push((*kind, Arc::new(mapper)));
        self
    }

    /// Enqueues a primary object only for the changes `wanted` accepts, for a controller that
    /// looks at a part of its objects that most writes leave alone (the garbage collector and a
    /// Lease renewal). A resync still visits every key.
    pub fn primary_changes(mut self, wanted: impl Fn(&Change) -> bool + Send + Sync + 'static) -> Self {
        self.primary_changes = Some(Arc::new(wanted));
        self
    }

    /// Runs this controller's workers on `runtime` rather than on the manager's. The informers
    /// stay on the manager's runtime and wake the workers across threads; a controller that writes
    /// much in bursts (the scheduler) then works beside the others instead of queueing behind them.
    pub fn on_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The runtime given to [`Controller::on_runtime`], if any.
    pub(crate) fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.runtime.as_ref()
    }

    /// Replaces the default backoff (5 ms doubling to 1000 s, within a 10/s burst 100 bucket).
    pub fn rate_limiter(mut self, limiter: impl RateLimiter) -> Self {
        self.rate_limiter = Some(Box::new(limiter));
        self
    }

    /// Makes a fraction of reconcile calls fail or panic (tests and experiments only).
    pub fn faults(mut self, faults: ReconcileFaults) -> Self {
        self.faults = faults;
        self
    }

    /// How long in-flight reconciles may run after shutdown before they are abandoned.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Keys sent on `keys` are enqueued like events (de-duplicated, never reconciled by two workers
    /// at once), whatever the trigger mode: for changes the API does not see, such as a node
    /// agent's container exiting.
    pub fn triggered_by(mut self, keys: tokio::sync::mpsc::UnboundedReceiver<String>) -> Self {
        self.triggers = Some(keys);
        self
    }

    /// Sets up the queue and the state the manager reports; `run` does the rest.
    pub(crate) fn prepare(self, metrics: &Metrics) -> (Arc<ControllerState>, Prepared) {
        let limiter = self.rate_limiter.unwrap_or_else(|| Box::new(default_rate_limiter()));
        let labels = ControllerLabels { controller: self.name.clone() };
        let m = metrics.inner();
        let result = |result: &'static str| m.reconcile_total.get_or_create_owned(&ResultLabels { controller: self.name.clone(), result });
        let state = Arc::new(ControllerState {
            name: self.name.clone(),
            primary: self.primary,
            mode: watch::channel(self.mode).0,
            event_loss: WatchFaults::default(),
            workers: self.workers,
            queue: WorkQueue::new(&self.name, limiter, metrics),
            last_errors: Mutex::default(),
            last_resync: Mutex::default(),
            metrics: ControllerMetrics {
                success: result("success"),
                error: result("error"),
                requeue: result("requeue"),
                panic: result("panic"),
                errors: m.reconcile_errors.get_or_create_owned(&labels),
                panics: m.reconcile_panics.get_or_create_owned(&labels),
                time: m.reconcile_time.get_or_create_owned(&labels),
                recent: Mutex::default(),
            },
        });
        let prepared = Prepared {
            primary: self.primary,
            reconciler: self.reconciler,
            owns: self.owns,
            watches: self.watches,
            faults: self.faults,
            shutdown_grace: self.shutdown_grace,
            triggers: self.triggers,
            primary_changes: self.primary_changes,
        };
        (state, prepared)
    }
}

pub(crate) struct Prepared {
    primary: ResourceInfo,
    reconciler: Arc<dyn Reconciler>,
    owns: Vec<ResourceInfo>,
    watches: Vec<(ResourceInfo, Mapper)>,
    faults: ReconcileFaults,
    shutdown_grace: Duration,
    triggers: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
    primary_changes: Option<ChangeFilter>,
}

/// What a running controller shares with the manager's debug view.
pub(crate) struct ControllerState {
    pub name: String,
    pub primary: ResourceInfo,
    /// The trigger mode, changeable while running (`Manager::set_mode`).
    pub mode: watch::Sender<TriggerMode>,
    /// Events this controller's handlers lose (a demonstration of edge mode's weakness); the
    /// informers' caches still see them, so a resync repairs what was lost.
    pub event_loss: WatchFaults,
    pub workers: usize,
    pub queue: Arc<WorkQueue>,
    /// The last error of every key currently failing.
    pub last_errors: Mutex<HashMap<String, String>>,
    pub last_resync: Mutex<Option<jiff::Timestamp>>,
    pub metrics: ControllerMetrics,
}

pub(crate) struct ControllerMetrics {
    pub success: Counter,
    pub error: Counter,
    pub requeue: Counter,
    pub panic: Counter,
    pub errors: Counter,
    pub panics: Counter,
    time: Histogram,
    /// The latest reconcile durations, for the percentiles `/debug/controllers` shows.
    pub recent: Mutex<crate::debug::RecentDurations>,
}

impl ControllerState {
    pub(crate) fn mode(&self) -> TriggerMode {
        *self.mode.borrow()
    }

    /// Whether an event should reach this controller's queue now.
    fn wants_event(&self) -> bool {
        !matches!(self.mode(), TriggerMode::Level { .. }) && !self.event_loss.should_drop()
    }

    fn set_error(&self, key: &str, error: Option<String>) {
        let mut errors = self.last_errors.lock().unwrap_or_else(|e| e.into_inner());
        match error {
            Some(e) => errors.insert(key.to_string(), e),
            None => errors.remove(key),
        };
    }

    fn enqueue_all(&self, informer: &Informer) {
        for key in informer.cache().keys() {
            self.queue.add(&key);
        }
        *self.last_resync.lock().unwrap_or_else(|e| e.into_inner()) = Some(jiff::Timestamp::now());
    }
}

/// The key of the primary-kind object that controls `obj`, if any.
fn owner_key(obj: &Value, primary: &ResourceInfo) -> Option<String> {
    let (kind, name, _) = controller_owner(obj)?;
    if kind != primary.kind {
        return None;
    }
    match obj.at("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if primary.namespaced => Some(format!("{ns}/{name}")),
        _ => Some(name.to_string()),
    }
}

/// The objects a change concerns: the new state, and for updates the old one too (an object
/// that moved away from an owner or node must still wake the one it left).
fn touched(change: &Change) -> Vec<&Value> {
    match change {
        Change::Updated { old, new } => vec![new.as_ref(), old.as_ref()],
        other => vec![other.object().as_ref()],
    }
}

/// Runs a prepared controller until `shutdown` turns true, then drains within the grace period.
pub(crate) async fn run(
    state: Arc<ControllerState>,
    prepared: Prepared,
    factory: Arc<InformerFactory>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Prepared { primary, reconciler, owns, watches, faults, shutdown_grace, triggers, primary_changes } = prepared;
    let queue = state.queue.clone();
    if let Some(mut keys) = triggers {
        let queue = queue.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    k = keys.recv() => match k {
                        Some(k) => queue.add(&k),
                        None => return,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
    }
    let primary_informer = factory.informer(&primary);
    let mut all_informers = vec![primary_informer.clone()];
    let mut subscriptions: Vec<(Arc<Informer>, HandlerId)> = Vec::new();

    // Handlers are installed whatever the mode, which may change while running; a level
    // controller's handlers ignore what they hear.
    {
        let (q, st) = (queue.clone(), state.clone());
        let id = primary_informer.subscribe(move |change| {
            if st.wants_event()
                && primary_changes.as_ref().is_none_or(|wanted| wanted(change))
                && let Some(key) = object_key(change.object())
            {
                q.add(&key);
            }
        });
        subscriptions.push((primary_informer.clone(), id));
    }
    for owned in &owns {
        let informer = factory.informer(owned);
        let (q, st) = (queue.clone(), state.clone());
        let id = informer.subscribe(move |change| {
            if !st.wants_event() {
                return;
            }
            for obj in touched(change) {
                if let Some(key) = owner_key(obj, &primary) {
                    q.add(&key);
                }
            }
        });
        subscriptions.push((informer.clone(), id));
        all_informers.push(informer);
    }
    for (kind, mapper) in &watches {
        let informer = factory.informer(kind);
        let (q, mapper, st) = (queue.clone(), mapper.clone(), state.clone());
        let id = informer.subscribe(move |change| {
            if !st.wants_event() {
                return;
            }
            for obj in touched(change) {
                mapper(obj).iter().for_each(|key| q.add(key));
            }
        });
        subscriptions.push((informer.clone(), id));
        all_informers.push(informer);
    }
    if let TriggerMode::AntiEntropy { check, .. } = state.mode() {
        all_informers.iter().for_each(|i| i.enable_anti_entropy(check));
    }
    factory.start();

    let synced = futures::future::join_all(all_informers.iter().map(|i| i.wait_synced()));
    tokio::select! {
        _ = synced => {}
        _ = shutdown.changed() => {
            queue.shut_down();
            subscriptions.iter().for_each(|(i, id)| i.unsubscribe(*id));
            return;
        }
    }

    let ticker = tokio::spawn(tick(state.clone(), primary_informer.clone(), all_informers));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..state.workers {
        workers.spawn(work(state.clone(), reconciler.clone(), faults));
    }

    let _ = shutdown.wait_for(|stop| *stop).await;
    ticker.abort();
    queue.shut_down();
    subscriptions.iter().for_each(|(i, id)| i.unsubscribe(*id));
    if !queue.wait_idle(Instant::now() + shutdown_grace).await {
        warn!(controller = %state.name, grace = ?shutdown_grace, "abandoning reconciles still running after the shutdown grace period");
    }
    workers.abort_all();
    while workers.join_next().await.is_some() {}
}

/// The level ticker or the hybrid resync loop, following the mode as it changes; idle in edge mode.
async fn tick(state: Arc<ControllerState>, primary: Arc<Informer>, informers: Vec<Arc<Informer>>) {
    let mut modes = state.mode.subscribe();
    let mut first = true;
    loop {
        let mode = *modes.borrow_and_update();
        tokio::select! {
            _ = tick_in(&state, mode, first, &primary, &informers) => return,
            changed = modes.changed() => if changed.is_err() { return },
        }
        first = false;
    }
}

/// One mode's periodic work, forever (edge: nothing). `first`: the informers' initial lists are
/// fresh, so a level controller enqueues at once without re-listing.
async fn tick_in(state: &ControllerState, mode: TriggerMode, first: bool, primary: &Informer, informers: &[Arc<Informer>]) {
    // Level and anti-entropy's rare resync read everything again (level polls by definition;
    // anti-entropy's full resync is for what a digest of versions cannot see); hybrid's resync
    // compares digests and reads only what differs.
    let resync_and_enqueue = |full: bool| async move {
        for informer in informers {
            let done = if full { informer.relist().await } else { informer.resync().await };
            if let Err(e) = done {
                warn!(controller = %state.name, kind = informer.resource().kind, error = %e, "resync failed; using the cache as it is");
            }
        }
        state.enqueue_all(primary);
    };
    let relist_and_enqueue = || resync_and_enqueue(true);
    match mode {
        TriggerMode::Edge => std::future::pending().await,
        TriggerMode::Level { interval } => {
            if first {
                state.enqueue_all(primary);
            } else {
                relist_and_enqueue().await;
            }
            loop {
                tokio::time::sleep(interval).await;
                relist_and_enqueue().await;
            }
        }
        TriggerMode::Hybrid { resync, jitter } => loop {
            tokio::time::sleep(jittered(resync, jitter)).await;
            resync_and_enqueue(false).await;
        },
        // The informers check their digests on their own; this is only the rare full resync.
        TriggerMode::AntiEntropy { resync, .. } => loop {
            tokio::time::sleep(jittered(resync, 0.1)).await;
            relist_and_enqueue().await;
        },
    }
}

fn jittered(period: Duration, jitter: f64) -> Duration {
    let j = jitter.clamp(0.0, 1.0);
    if j == 0.0 {
        return period;
    }
    let factor = 1.0 + rand::rng().random_range(-j..=j);
    period.mul_f64(factor)
}

/// One worker: take a key, reconcile it under `catch_unwind`, record the outcome, release the key.
async fn work(state: Arc<ControllerState>, reconciler: Arc<dyn Reconciler>, faults: ReconcileFaults) {
    while let Some(key) = state.queue.get().await {
        let span = info_span!("reconcile", controller = %state.name, key = %key);
        let started = Instant::now();
        let call = {
            let (reconciler, key) = (reconciler.clone(), key.clone());
            async move {
                match faults.roll() {
                    Some(Fault::Panic) => panic!("injected panic (fault injection)"),
                    Some(Fault::Fail) => Err::<Action, Error>("injected failure (fault injection)".into()),
                    None => reconciler.reconcile(&key).await,
                }
            }
        };
        let timed = CpuTimed::new(AssertUnwindSafe(call).catch_unwind().instrument(span));
        let (outcome, cpu) = timed.await;
        let took = started.elapsed().as_secs_f64();
        state.metrics.time.observe(took);
        state.metrics.recent.lock().unwrap_or_else(|e| e.into_inner()).record(took);
        let q = &state.queue;
        let succeeded = matches!(outcome, Ok(Ok(_)));
        match outcome {
            Ok(Ok(Action::Done)) => {
                state.metrics.success.inc();
                q.forget(&key);
                state.set_error(&key, None);
            }
            Ok(Ok(Action::RequeueAfter(delay))) => {
                state.metrics.requeue.inc();
                q.forget(&key);
                state.set_error(&key, None);
                q.add_after(&key, delay.max(MIN_REQUEUE));
            }
            Ok(Err(e)) => {
                state.metrics.error.inc();
                state.metrics.errors.inc();
                warn!(controller = %state.name, %key, error = %e, retries = q.retries(&key), "reconcile failed; backing off");
                state.set_error(&key, Some(e.to_string()));
                q.add_rate_limited(&key);
            }
            Err(payload) => {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_string());
                state.metrics.panic.inc();
                state.metrics.panics.inc();
                state.metrics.errors.inc();
                error!(controller = %state.name, %key, panic = %message, "reconcile panicked; treating it as an error");
                state.set_error(&key, Some(format!("panic: {message}")));
                q.add_rate_limited(&key);
            }
        }
        // Failed keys are paced by their backoff instead; a cool-down applies to successes only.
        let cool_down = if succeeded { (cpu * COOL_DOWN_PER_CPU_SECOND).min(MAX_COOL_DOWN) } else { Duration::ZERO };
        if cool_down >= MIN_COOL_DOWN {
            q.done_cooling(&key, Instant::now() + cool_down);
        } else {
            q.done(&key);
        }
        // A queue full of ready keys whose reconciles never wait would otherwise hold the thread:
        // give the runtime its turn whenever this task's cooperative budget is spent.
        tokio::task::consume_budget().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use shepherd_api::kinds::REPLICASET;

    #[test]
    fn trigger_modes_parse_from_flags_with_their_default_periods() {
        assert_eq!("level".parse::<TriggerMode>(), Ok(TriggerMode::Level { interval: Duration::from_secs(5) }));
        assert_eq!("hybrid".parse::<TriggerMode>().map(|m| m.period()), Ok(Some(Duration::from_secs(300))));
        assert_eq!("edge".parse::<TriggerMode>(), Ok(TriggerMode::Edge));
        assert!("sometimes".parse::<TriggerMode>().is_err());
        assert_eq!(TriggerMode::default().name(), "hybrid");
    }

    #[test]
    fn a_pod_maps_to_its_controlling_replicaset_only() {
        let pod = json!({"metadata": {"name": "web-0", "namespace": "ns", "ownerReferences": [
            {"kind": "Deployment", "name": "d", "uid": "1"},
            {"kind": "ReplicaSet", "name": "web", "uid": "2", "controller": true},
        ]}});
        assert_eq!(owner_key(&pod, &REPLICASET).as_deref(), Some("ns/web"));
        let orphan = json!({"metadata": {"name": "x", "namespace": "ns"}});
        assert_eq!(owner_key(&orphan, &REPLICASET), None);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(300), 0.1);
            assert!(d >= Duration::from_secs(270) && d <= Duration::from_secs(330), "{d:?}");
        }
    }
}
