//! Shared informers: one list-then-watch per kind per process, feeding a cache and its subscribers.
//!
//! Guarantees:
//! - one `Informer` per kind per `InformerFactory`, shared by every controller that asks for it;
//! - it lists, then watches from exactly the list's revision, so nothing between the two is missed;
//! - on a watch error or `Expired` it lists again and diffs the cache against the list, delivering
//!   the adds, updates and deletes it missed as ordinary changes;
//! - `resync` does the same on request (the hybrid and level modes' safety net) and returns once
//!   the cache reflects a list taken after the call;
//! - a subscriber sees every change to the cache exactly once and in order; a subscriber added
//!   late first receives every cached object as `Added`. Subscribers run on the informer's task
//!   under its dispatch lock: they must be quick and must not subscribe or unsubscribe.
//! - the event source is the `Client` trait, so the same informer serves in-process and remote use;
//! - with anti-entropy on (`enable_anti_entropy`), every interval it compares the digest of its
//!   cache with the server's digest of the same list scope at the same revision; on a mismatch it
//!   narrows it down by buckets, fetches only the objects whose resourceVersion differs, drops the
//!   ones the server no longer has, and delivers both as ordinary changes. A check that matches
//!   reads no object at all. Checks run on the informer's own task, between events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use shepherd_api::digest::{BUCKETS, DigestDetail, ListDigest, parse_hex};
use shepherd_api::{ApiError, FieldSelector, LabelSelector, ResourceInfo};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::cache::{Cache, Change, Transform, resource_version};
use crate::client::{Client, ListParams, WatchEvent};
use crate::faults::WatchFaults;
use crate::metrics::{KindLabels, Metrics};
use crate::view::PodView;

/// A subscriber callback.
pub type Handler = Arc<dyn Fn(&Change) + Send + Sync>;

/// Identifies a subscription, to remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerId(u64);

type ResyncReply = oneshot::Sender<Result<(), ApiError>>;

/// A request to bring the cache up to the server: by digest (`Resync::Verify`) or by a full list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resync {
    Verify,
    List,
}

/// Keeps the cache of one kind in step with the API and tells subscribers what changed.
pub struct Informer {
    res: ResourceInfo,
    /// What is listed and watched: every object of the kind unless the factory was scoped.
    params: ListParams,
    client: Arc<dyn Client>,
    cache: Arc<Cache>,
    /// Held while applying a change to the cache and calling subscribers, so a new subscriber's
    /// replay of the cache and the live changes after it neither overlap nor leave a gap.
    handlers: Mutex<Vec<(HandlerId, Handler)>>,
    next_handler: AtomicU64,
    synced: watch::Sender<bool>,
    resync_tx: mpsc::UnboundedSender<(Resync, ResyncReply)>,
    resync_rx: Mutex<Option<mpsc::UnboundedReceiver<(Resync, ResyncReply)>>>,
    faults: Arc<WatchFaults>,
    metrics: InformerMetrics,
    last_list: Mutex<Option<jiff::Timestamp>>,
    started: AtomicBool,
    /// Time between anti-entropy checks; zero while off.
    anti_entropy: watch::Sender<Duration>,
    last_check: Mutex<Option<jiff::Timestamp>>,
    last_repair: Mutex<Option<jiff::Timestamp>>,
}

struct InformerMetrics {
    events: Counter,
    dropped: Counter,
    relists: Counter,
    last_resync: Gauge<f64, AtomicU64>,
    objects: Gauge,
    checks: Counter,
    mismatches: Counter,
    repairs: Counter,
}

impl Informer {
    fn new(res: ResourceInfo, params: ListParams, client: Arc<dyn Client>, faults: Arc<WatchFaults>, metrics: &Metrics) -> Self {
        let labels = KindLabels { kind: res.kind.to_string() };
        let m = metrics.inner();
        let (resync_tx, resync_rx) = mpsc::unbounded_channel();
        let cache = Arc::new(Self::cache_for(&res, &params));
        Informer {
            res,
            params,
            client,
            cache,
            handlers: Mutex::default(),
            next_handler: AtomicU64::new(0),
            synced: watch::Sender::new(false),
            resync_tx,
            resync_rx: Mutex::new(Some(resync_rx)),
            faults,
            metrics: InformerMetrics {
                events: m.informer_events.get_or_create_owned(&labels),
                dropped: m.informer_dropped_events.get_or_create_owned(&labels),
                relists: m.informer_relists.get_or_create_owned(&labels),
                last_resync: m.informer_last_resync.get_or_create_owned(&labels),
                objects: m.informer_objects.get_or_create_owned(&labels),
                checks: m.informer_anti_entropy_checks.get_or_create_owned(&labels),
                mismatches: m.informer_anti_entropy_mismatches.get_or_create_owned(&labels),
                repairs: m.informer_anti_entropy_repairs.get_or_create_owned(&labels),
            },
            last_list: Mutex::default(),
            started: AtomicBool::new(false),
            anti_entropy: watch::Sender::new(Duration::ZERO),
            last_check: Mutex::default(),
            last_repair: Mutex::default(),
        }
    }

    /// Pods are what controllers scan by the thousand: their cache keeps views. A cluster-wide
    /// pod cache (a controller manager's: every pod of the cluster, read mostly through views) is
    /// compact; a scoped one (a node agent's pods, each read whole on every sync) stays parsed.
    /// In a compact cache the pods of DaemonSets, StatefulSets and Jobs stay parsed too: their
    /// controllers read every pod of an owner whole on each of its reconciles.
    /// Events are the other kind a cluster holds by the thousand (two or more per pod), and their
    /// only reader, the Event TTL controller, reads each once when it expires: kept as text.
    fn cache_for(res: &ResourceInfo, params: &ListParams) -> Cache {
        if res.kind == "Event" && matches!(res.group, "" | "events.k8s.io") {
            return Cache::compact();
        }
        if !res.group.is_empty() || res.kind != "Pod" {
            return Cache::default();
        }
        let cluster_wide = params.namespace.is_none() && params.label_selector.is_none() && params.field_selector.is_none();
        if cluster_wide { Cache::compact_pods(read_through_views) } else { Cache::with_pod_views() }
    }

    /// The kind this informer watches.
    pub fn resource(&self) -> &ResourceInfo {
        &self.res
    }

    /// The cache this informer fills.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// Waits until the first list has reached the cache.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// Whether the first list has reached the cache (its contents can stand in for a read).
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// When the last full list completed (start, recovery or resync).
    pub fn last_list(&self) -> Option<jiff::Timestamp> {
        *self.last_list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns on anti-entropy checks every `every` (the shortest interval asked for wins).
    pub fn enable_anti_entropy(&self, every: Duration) {
        let every = every.max(Duration::from_millis(10));
        self.anti_entropy.send_if_modified(|current| {
            let shorter = current.is_zero() || every < *current;
            if shorter {
                *current = every;
            }
            shorter
        });
    }

    /// When the last anti-entropy check ran, and when one last repaired something.
    pub fn anti_entropy_times(&self) -> (Option<jiff::Timestamp>, Option<jiff::Timestamp>) {
        (*lock(&self.last_check), *lock(&self.last_repair))
    }

    /// Subscribes to changes; the subscriber first receives every cached object as `Added`.
    pub fn subscribe(&self, handler: impl Fn(&Change) + Send + Sync + 'static) -> HandlerId {
        let id = HandlerId(self.next_handler.fetch_add(1, Ordering::Relaxed));
        let mut handlers = self.lock_handlers();
        for obj in self.cache.list() {
            handler(&Change::Added(obj));
        }
        handlers.push((id, Arc::new(handler)));
        id
    }

    pub fn unsubscribe(&self, id: HandlerId) {
        self.lock_handlers().retain(|(h, _)| *h != id);
    }

    /// Brings the cache up to the server as it stands now, and returns once it is: compares the
    /// digests of the cache and of the server's list (subscribers get what differed, read again
    /// object by object), or, where the server gives no digest, relists as `relist` does.
    pub async fn resync(&self) -> Result<(), ApiError> {
        self.request(Resync::Verify).await
    }

    /// Lists from the API now, diffs the cache against the list (subscribers get what changed),
    /// and restarts the watch from the list's revision. Returns once the cache reflects the list.
    pub async fn relist(&self) -> Result<(), ApiError> {
        self.request(Resync::List).await
    }

    async fn request(&self, how: Resync) -> Result<(), ApiError> {
        if !self.started.load(Ordering::Acquire) {
            return Err(ApiError::ServiceUnavailable(format!("the {} informer is not running", self.res.kind)));
        }
        let (tx, rx) = oneshot::channel();
        self.resync_tx
            .send((how, tx))
            .map_err(|_| ApiError::ServiceUnavailable(format!("the {} informer has stopped", self.res.kind)))?;
        rx.await.unwrap_or_else(|_| Err(ApiError::ServiceUnavailable(format!("the {} informer has stopped", self.res.kind))))
    }

    fn lock_handlers(&self) -> MutexGuard<'_, Vec<(HandlerId, Handler)>> {
        self.handlers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spawns the list-watch loop once; later calls do nothing.
    fn start(self: &Arc<Self>, shutdown: watch::Receiver<bool>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(resync_rx) = self.resync_rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        tokio::spawn(self.clone().run(resync_rx, shutdown));
    }

    async fn run(
        self: Arc<Self>,
        mut resync_rx: mpsc::UnboundedReceiver<(Resync, ResyncReply)>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let kind = self.res.kind;
        let mut waiters: Vec<ResyncReply> = Vec::new();
        let mut retry = Retry::default();
        // The cache strips managedFields from everything it admits.
        let all = self.params.clone().without_managed_fields();
        loop {
            if *shutdown.borrow() {
                return;
            }
            let listed = tokio::select! {
                _ = shutdown.changed() => return,
                r = self.client.list(&self.res, &all) => r,
            };
            let list = match listed {
                Ok(list) => list,
                Err(e) => {
                    warn!(kind, error = %e, "listing failed; retrying");
                    waiters.drain(..).for_each(|w| drop(w.send(Err(e.clone()))));
                    if !pause(&mut shutdown, retry.next()).await {
                        return;
                    }
                    continue;
                }
            };
            let mut revision = list.resource_version;
            self.apply_list(list.items);
            waiters.drain(..).for_each(|w| drop(w.send(Ok(()))));
            debug!(kind, revision, "listed; watching");
            let mut interval = self.anti_entropy.subscribe();
            let mut next_check = tokio::time::Instant::now() + *interval.borrow_and_update();
            // The server's revision at the last check that found the cache behind it.
            let mut tail = None;

            let mut stream = None;
            loop {
                if stream.is_none() {
                    let opened = tokio::select! {
                        _ = shutdown.changed() => return,
                        r = self.client.watch(&self.res, &all, revision) => r,
                    };
                    match opened {
                        Ok(events) => stream = Some(events),
                        Err(ApiError::Expired(_)) => {
                            info!(kind, revision, "watch revision expired; relisting");
                            break;
                        }
                        Err(e) => {
                            warn!(kind, error = %e, "opening the watch failed; relisting");
                            if !pause(&mut shutdown, retry.next()).await {
                                return;
                            }
                            break;
                        }
                    }
                }
                let Some(events) = stream.as_mut() else { continue };
                let every = *interval.borrow();
                let check_due = async {
                    if every.is_zero() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep_until(next_check).await;
                };
                let outcome = tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = interval.changed() => {
                        next_check = tokio::time::Instant::now() + *interval.borrow_and_update();
                        Outcome::Continue
                    }
                    _ = check_due => {
                        next_check = tokio::time::Instant::now() + every;
                        match self.check(&mut tail).await {
                            Ok(Recheck::AtInterval) => Outcome::Continue,
                            Ok(Recheck::Soon) => {
                                next_check = tokio::time::Instant::now() + every / 10;
                                Outcome::Continue
                            }
                            Err(ApiError::Expired(msg)) => {
                                info!(kind, %msg, "digest revision expired; relisting");
                                Outcome::Relist
                            }
                            Err(e) => {
                                warn!(kind, error = %e, "anti-entropy check failed; trying again at the next one");
                                Outcome::Continue
                            }
                        }
                    }
                    Some((how, reply)) = resync_rx.recv() => {
                        let mut list = how == Resync::List;
                        waiters.push(reply);
                        while let Ok((how, reply)) = resync_rx.try_recv() {
                            list |= how == Resync::List;
                            waiters.push(reply);
                        }
                        if list {
                            Outcome::Relist
                        } else if let Err(e) = self.verify().await {
                            debug!(kind, error = %e, "resync by digest not possible; relisting");
                            Outcome::Relist
                        } else {
                            waiters.drain(..).for_each(|w| drop(w.send(Ok(()))));
                            Outcome::Continue
                        }
                    }
                    event = events.next() => match event {
                        Some(Ok(event)) => {
                            retry.reset();
                            if let Some(rv) = self.apply_event(event) {
                                revision = revision.max(rv);
                            }
                            Outcome::Continue
                        }
                        Some(Err(ApiError::Expired(msg))) => {
                            info!(kind, revision, %msg, "watch expired; relisting");
                            Outcome::Relist
                        }
                        Some(Err(e)) => {
                            warn!(kind, error = %e, "watch failed; relisting");
                            Outcome::Relist
                        }
                        None => Outcome::Ended,
                    },
                };
                match outcome {
                    Outcome::Continue => {}
                    Outcome::Relist => break,
                    Outcome::Ended => {
                        // The server ended the watch cleanly: resume from the revision reached.
                        stream = None;
                        if !pause(&mut shutdown, retry.next()).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Diffs the cache against a full list and tells subscribers what differed.
    fn apply_list(&self, items: Vec<Value>) {
        let handlers = self.lock_handlers();
        let changes = self.cache.replace(items);
        for change in &changes {
            handlers.iter().for_each(|(_, h)| h(change));
        }
        drop(handlers);
        let now = jiff::Timestamp::now();
        *self.last_list.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        self.metrics.relists.inc();
        self.metrics.last_resync.set(now.as_millisecond() as f64 / 1000.0);
        self.metrics.objects.set(self.cache.len() as i64);
        self.synced.send_replace(true);
        if !changes.is_empty() {
            debug!(kind = self.res.kind, missed = changes.len(), "list found changes the watch had not delivered");
        }
    }

    /// A resync without a full list: the server's digest of this informer's scope at its current
    /// revision against the cache's, and where they differ, the differing objects read again (or
    /// dropped) as `repair` does. Afterwards every cached object is the server's at that revision
    /// or a later one, as after a relist; an event still in flight finds a copy as new as itself
    /// and changes nothing. A relist of every object (150,000 pods) parsed the whole list at once
    /// for each controller's resync; this reads only digests while nothing was lost. Errors (a
    /// client without digests, a revision already compacted) leave the caller to relist.
    async fn verify(&self) -> Result<(), ApiError> {
        let server = self.client.digest(&self.res, &self.params, 0, DigestDetail::Total).await?;
        let revision = parse_revision(&server.resource_version)?;
        let (_, count, sum) = self.cache.digest();
        if !same(&server, count, sum) {
            let repaired = self.repair(revision).await?;
            if repaired > 0 {
                debug!(kind = self.res.kind, revision, repaired, "resync repaired the cache");
            }
        }
        self.cache.mark_verified(revision);
        self.metrics.last_resync.set(jiff::Timestamp::now().as_millisecond() as f64 / 1000.0);
        Ok(())
    }

    /// One anti-entropy check: compare the cache's digest with the server's and repair what
    /// differs. `tail` carries the server's revision from one check to the next: writes up to it
    /// that have still not arrived by the next check (a tenth of the interval later) count as lost.
    async fn check(&self, tail: &mut Option<u64>) -> Result<Recheck, ApiError> {
        self.metrics.checks.inc();
        *lock(&self.last_check) = Some(jiff::Timestamp::now());
        let (at, count, sum) = self.cache.digest();
        let now = self.client.digest(&self.res, &self.params, 0, DigestDetail::Total).await?;
        let now_revision = parse_revision(&now.resource_version)?;
        if same(&now, count, sum) {
            // Nothing in this scope changed since the cache's revision, or all of it arrived.
            self.cache.mark_verified(now_revision);
            *tail = None;
            return Ok(Recheck::AtInterval);
        }
        // The server is ahead. Writes up to the cache's revision should all be here; writes up
        // to the previous check's server revision should have arrived by now.
        let overdue = tail.filter(|t| *t > at);
        // The first time the server is seen ahead, look again soon; while it stays ahead (writes
        // keep coming), at the normal interval.
        let first_behind = tail.is_none();
        *tail = Some(now_revision);
        let at = overdue.unwrap_or(at);
        let server = if at == now_revision { now } else { self.client.digest(&self.res, &self.params, at, DigestDetail::Total).await? };
        if same(&server, count, sum) {
            self.cache.mark_verified(at);
            // Right up to its own revision; what the server has beyond it is in flight or lost.
            return Ok(if first_behind { Recheck::Soon } else { Recheck::AtInterval });
        }
        self.metrics.mismatches.inc();
        let repaired = self.repair(at).await?;
        self.cache.mark_verified(at);
        if repaired > 0 {
            info!(kind = self.res.kind, revision = at, repaired, "anti-entropy repaired the cache");
        }
        // A loss rarely comes alone (a change's chain of events runs through several objects):
        // after a repair, look again soon rather than a whole interval later.
        Ok(if first_behind || repaired > 0 { Recheck::Soon } else { Recheck::AtInterval })
    }

    /// Finds the buckets whose digests differ at `at`, and in them the keys whose versions
    /// differ; fetches those objects (or drops them) and delivers the changes. Returns how many,
    /// and counts them as repairs.
    async fn repair(&self, at: u64) -> Result<u64, ApiError> {
        let server = self.client.digest(&self.res, &self.params, at, DigestDetail::Buckets).await?;
        let local = self.cache.digest_buckets();
        let differing = (0..BUCKETS).filter(|b| server.buckets.get(*b).and_then(|h| parse_hex(h)) != local.get(*b).copied());
        let mut repaired = 0;
        for bucket in differing.collect::<Vec<_>>() {
            let listed = self.client.digest(&self.res, &self.params, at, DigestDetail::Bucket(bucket)).await?;
            let theirs: HashMap<String, u64> =
                listed.items.into_iter().filter_map(|i| Some((i.key, i.resource_version.parse().ok()?))).collect();
            let ours: HashMap<String, u64> = self.cache.bucket_members(bucket).into_iter().collect();
            for (key, version) in &theirs {
                // A cached copy newer than `at` arrived after it: nothing to learn from `at`.
                if ours.get(key).is_some_and(|mine| mine == version || *mine > at) {
                    continue;
                }
                repaired += u64::from(self.refetch(key).await?);
            }
            for (key, mine) in &ours {
                if !theirs.contains_key(key) && *mine <= at {
                    repaired += u64::from(self.deliver(self.cache.apply_repair_delete(key, at)));
                }
            }
        }
        self.metrics.repairs.inc_by(repaired);
        if repaired > 0 {
            *lock(&self.last_repair) = Some(jiff::Timestamp::now());
        }
        Ok(repaired)
    }

    /// Reads one object again and delivers what it says: its current state, or its absence
    /// (gone, or no longer matching this informer's selectors).
    async fn refetch(&self, key: &str) -> Result<bool, ApiError> {
        let (namespace, name) = match key.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, key),
        };
        match self.client.get(&self.res, namespace, name).await {
            Ok(obj) if self.in_scope(&obj) => Ok(self.deliver(self.cache.apply_repair(obj))),
            Ok(_) | Err(ApiError::NotFound { .. }) => Ok(self.deliver(self.cache.apply_repair_delete(key, u64::MAX))),
            Err(e) => Err(e),
        }
    }

    /// Whether an object matches the selectors this informer lists with.
    fn in_scope(&self, obj: &Value) -> bool {
        let labels = self.params.label_selector.as_deref().map(LabelSelector::parse);
        let fields = self.params.field_selector.as_deref().map(FieldSelector::parse);
        labels.is_none_or(|l| l.is_ok_and(|l| l.matches_object(obj))) && fields.is_none_or(|f| f.is_ok_and(|f| f.matches(obj)))
    }

    /// Tells subscribers of a change the cache went through; true if there was one.
    fn deliver(&self, change: Option<Change>) -> bool {
        let Some(change) = change else { return false };
        let handlers = self.lock_handlers();
        handlers.iter().for_each(|(_, h)| h(&change));
        drop(handlers);
        self.metrics.objects.set(self.cache.len() as i64);
        true
    }

    /// Applies one watch event (unless fault injection drops it); returns the revision it carries.
    fn apply_event(&self, event: WatchEvent) -> Option<u64> {
        let (obj, deleted) = match event {
            WatchEvent::Bookmark(rv) => return Some(rv),
            WatchEvent::Added(o) | WatchEvent::Modified(o) => (o, false),
            WatchEvent::Deleted(o) => (o, true),
        };
        let rv = resource_version(&obj);
        self.metrics.events.inc();
        if self.faults.should_drop() {
            self.metrics.dropped.inc();
            return rv;
        }
        let handlers = self.lock_handlers();
        let change = if deleted { self.cache.apply_delete(obj) } else { self.cache.apply_upsert(obj) };
        if let Some(change) = change {
            handlers.iter().for_each(|(_, h)| h(&change));
        }
        drop(handlers);
        self.metrics.objects.set(self.cache.len() as i64);
        rv
    }
}

enum Outcome {
    Continue,
    Relist,
    Ended,
}

/// When the next anti-entropy check should come.
enum Recheck {
    AtInterval,
    /// The server was ahead of the cache (look again shortly, and repair what has not arrived),
    /// or a repair was needed (another loss may follow it).
    Soon,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a server digest equals the cache's count and sum.
fn same(d: &ListDigest, count: u64, sum: u64) -> bool {
    d.count == count && parse_hex(&d.digest) == Some(sum)
}

fn parse_revision(rv: &str) -> Result<u64, ApiError> {
    rv.parse().map_err(|_| ApiError::Internal(format!("the server sent a digest at revision {rv:?}")))
}

/// Sleeps `delay` unless shutdown comes first; `false` on shutdown.
async fn pause(shutdown: &mut watch::Receiver<bool>, delay: Duration) -> bool {
    tokio::select! {
        _ = shutdown.changed() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

/// Delay between failed list/watch attempts: 200 ms doubling to 30 s, reset by a received event.
#[derive(Default)]
struct Retry {
    failures: u32,
}

impl Retry {
    fn next(&mut self) -> Duration {
        let delay = Duration::from_millis(200).saturating_mul(1u32 << self.failures.min(8));
        self.failures = self.failures.saturating_add(1);
        delay.min(Duration::from_secs(30))
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Whether a pod is read only through its view or one key at a time (the pods of ReplicaSets and
/// ReplicationControllers, and pods without a controller), so it can be kept as text.
fn read_through_views(pod: &PodView) -> bool {
    !matches!(pod.controller().map(|c| &*c.kind), Some("DaemonSet" | "StatefulSet" | "Job"))
}

/// Hands out one shared `Informer` per kind. Informers run from `start` until the factory shuts down.
pub struct InformerFactory {
    client: Arc<dyn Client>,
    metrics: Metrics,
    faults: Arc<WatchFaults>,
    informers: Mutex<HashMap<(&'static str, &'static str), Arc<Informer>>>,
    /// Per kind, what its informer lists and watches (default: everything).
    scopes: Mutex<HashMap<(&'static str, &'static str), ListParams>>,
    started: AtomicBool,
    shutdown: watch::Sender<bool>,
}

impl InformerFactory {
    pub fn new(client: Arc<dyn Client>, metrics: Metrics) -> Self {
        InformerFactory {
            client,
            metrics,
            faults: Arc::default(),
            informers: Mutex::default(),
            scopes: Mutex::default(),
            started: AtomicBool::new(false),
            shutdown: watch::Sender::new(false),
        }
    }

    /// The client informers list and watch through.
    pub fn client(&self) -> &Arc<dyn Client> {
        &self.client
    }

    /// Restricts what the informer of `res` lists and watches (a node agent: only the pods bound
    /// to its node, `spec.nodeName=NAME`). Takes effect only before that informer is first used;
    /// returns false if it already exists.
    pub fn scope(&self, res: &ResourceInfo, params: ListParams) -> bool {
        let informers = self.informers.lock().unwrap_or_else(|e| e.into_inner());
        if informers.contains_key(&(res.group, res.kind)) {
            return false;
        }
        self.scopes.lock().unwrap_or_else(|e| e.into_inner()).insert((res.group, res.kind), params);
        true
    }

    /// The informer of `res`, created on first use (and started at once if the factory runs).
    pub fn informer(&self, res: &ResourceInfo) -> Arc<Informer> {
        let mut informers = self.informers.lock().unwrap_or_else(|e| e.into_inner());
        let params = self.scopes.lock().unwrap_or_else(|e| e.into_inner()).get(&(res.group, res.kind)).cloned().unwrap_or_default();
        let informer = informers
            .entry((res.group, res.kind))
            .or_insert_with(|| Arc::new(Informer::new(*res, params, self.client.clone(), self.faults.clone(), &self.metrics)))
            .clone();
        if self.started.load(Ordering::Acquire) {
            informer.start(self.shutdown.subscribe());
        }
        informer
    }

    /// Makes the cache of `res` keep `transform(object)` of each object (client-go's
    /// `SetTransform`), for a kind of which this process reads only a few fields: subscribers and
    /// readers of that kind then see only the projection. Only before the kind's informer has
    /// started; returns whether the projection was set.
    pub fn set_transform(&self, res: &ResourceInfo, transform: Transform) -> bool {
        let mut informers = self.informers.lock().unwrap_or_else(|e| e.into_inner());
        let params = self.scopes.lock().unwrap_or_else(|e| e.into_inner()).get(&(res.group, res.kind)).cloned().unwrap_or_default();
        let informer = informers
            .entry((res.group, res.kind))
            .or_insert_with(|| Arc::new(Informer::new(*res, params, self.client.clone(), self.faults.clone(), &self.metrics)));
        !informer.started.load(Ordering::Acquire) && informer.cache.set_transform(transform)
    }

    /// The cache of `res` (shorthand for `informer(res).cache()`).
    pub fn cache(&self, res: &ResourceInfo) -> Arc<Cache> {
        self.informer(res).cache().clone()
    }

    /// Starts every informer created so far and any created later. Needs a Tokio runtime.
    pub fn start(&self) {
        self.started.store(true, Ordering::Release);
        let informers: Vec<Arc<Informer>> =
            self.informers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for informer in informers {
            informer.start(self.shutdown.subscribe());
        }
    }

    /// Fault injection on every informer of this factory (off by default).
    pub fn watch_faults(&self) -> &Arc<WatchFaults> {
        &self.faults
    }

    /// Stops every informer's list-watch loop.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{DeleteParams, Patch};
    use crate::cache::object_key;
    use crate::testing::MemoryClient;
    use serde_json::json;
    use shepherd_api::JsonPath;
    use shepherd_api::kinds::POD;

    fn pod(name: &str) -> Value {
        json!({ "metadata": { "name": name, "namespace": "ns" }, "spec": { "nodeName": "n1" } })
    }

    /// A synced pod informer over the pods `names`, and a recorder of the changes after its sync.
    async fn synced_with(client: &Arc<MemoryClient>, names: &[&str]) -> (InformerFactory, Arc<Informer>, Arc<Mutex<Vec<String>>>) {
        for n in names {
            client.create(&POD, None, pod(n)).await.unwrap();
        }
        let factory = InformerFactory::new(client.clone(), Metrics::new());
        let informer = factory.informer(&POD);
        factory.start();
        informer.wait_synced().await;
        let seen = recorder(&informer);
        seen.lock().unwrap().clear();
        (factory, informer, seen)
    }

    #[test]
    fn events_and_a_cluster_wide_informers_pods_are_cached_as_text_other_kinds_parsed() {
        let compact = |res: &ResourceInfo, params: &ListParams| {
            format!("{:?}", Informer::cache_for(res, params)).contains("compact: true")
        };
        let everything = ListParams::default();
        assert!(compact(&shepherd_api::kinds::EVENT, &everything));
        assert!(compact(&POD, &everything));
        assert!(!compact(&POD, &ListParams::namespace("ns")), "a scoped pod cache is read whole: parsed");
        assert!(!compact(&shepherd_api::kinds::NODE, &everything));
    }

    fn recorder(informer: &Informer) -> Arc<Mutex<Vec<String>>> {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = seen.clone();
        informer.subscribe(move |c| {
            let name = c.object()["metadata"]["name"].as_str().unwrap_or("?").to_string();
            let what = match c {
                Change::Added(_) => "add",
                Change::Updated { .. } => "update",
                Change::Deleted(_) => "delete",
            };
            s.lock().unwrap().push(format!("{what} {name}"));
        });
        seen
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_informer_per_kind_is_shared_and_replays_the_cache_to_late_subscribers() {
        let client = Arc::new(MemoryClient::new());
        client.create(&POD, None, pod("a")).await.unwrap();
        let factory = InformerFactory::new(client.clone(), Metrics::new());
        let first = factory.informer(&POD);
        assert!(Arc::ptr_eq(&first, &factory.informer(&POD)));
        factory.start();
        first.wait_synced().await;
        let seen = recorder(&first);
        client.create(&POD, None, pod("b")).await.unwrap();
        settle().await;
        assert_eq!(*seen.lock().unwrap(), ["add a", "add b"]);
        assert_eq!(first.cache().by_node_name("n1").len(), 2);
        assert_eq!(client.open_watches(), 1, "one watch per kind, however many users");
    }

    #[tokio::test(start_paused = true)]
    async fn a_scoped_informer_sees_only_the_objects_its_selector_names() {
        let client = Arc::new(MemoryClient::new());
        let on = |name: &str, node: &str| json!({ "metadata": { "name": name, "namespace": "ns" }, "spec": { "nodeName": node } });
        client.create(&POD, None, on("mine", "n1")).await.unwrap();
        client.create(&POD, None, on("theirs", "n2")).await.unwrap();
        let factory = InformerFactory::new(client.clone(), Metrics::new());
        assert!(factory.scope(&POD, ListParams::default().fields("spec.nodeName=n1")));
        let informer = factory.informer(&POD);
        assert!(!factory.scope(&POD, ListParams::default()), "too late once the informer exists");
        factory.start();
        informer.wait_synced().await;
        client.create(&POD, None, on("mine-too", "n1")).await.unwrap();
        client.create(&POD, None, on("theirs-too", "n2")).await.unwrap();
        settle().await;
        let mut names: Vec<String> = informer.cache().keys();
        names.sort();
        assert_eq!(names, ["ns/mine", "ns/mine-too"]);
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_expired_watch_the_relist_delivers_exactly_what_was_missed() {
        let client = Arc::new(MemoryClient::new());
        let (_factory, informer, seen) = synced_with(&client, &["keep", "change", "remove"]).await;

        client.set_drop_watch_events(true);
        client.patch(&POD, Some("ns"), "change", Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}))).await.unwrap();
        client.delete(&POD, Some("ns"), "remove", &DeleteParams::default()).await.unwrap();
        client.create(&POD, None, pod("new")).await.unwrap();
        client.set_drop_watch_events(false);
        settle().await;
        assert!(seen.lock().unwrap().is_empty(), "the lost events are not seen yet");

        client.compact();
        client.break_watches(ApiError::Expired("too old".into()));
        settle().await;
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, ["add new", "delete remove", "update change"]);
        assert_eq!(informer.cache().keys(), ["ns/change", "ns/keep", "ns/new"]);
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_watch_events_never_reach_the_cache_until_a_resync() {
        let client = Arc::new(MemoryClient::new());
        let factory = InformerFactory::new(client.clone(), Metrics::new());
        let informer = factory.informer(&POD);
        factory.start();
        informer.wait_synced().await;
        factory.watch_faults().set_drop_fraction(1.0);
        client.create(&POD, None, pod("a")).await.unwrap();
        settle().await;
        assert!(informer.cache().is_empty());
        informer.resync().await.unwrap();
        assert_eq!(informer.cache().keys(), ["ns/a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resync_lists_nothing_and_reads_again_only_what_the_watch_lost() {
        let client = Arc::new(MemoryClient::new());
        let (_factory, informer, seen) = synced_with(&client, &["a", "b", "c"]).await;
        let reads = client.reads();

        informer.resync().await.unwrap();
        assert_eq!(client.reads(), reads, "nothing was lost: the resync compared digests and read no object");

        client.set_drop_watch_events(true);
        client.patch(&POD, Some("ns"), "a", Patch::Merge(json!({"metadata": {"labels": {"x": "lost"}}}))).await.unwrap();
        client.delete(&POD, Some("ns"), "b", &DeleteParams::default()).await.unwrap();
        client.set_drop_watch_events(false);
        settle().await;
        assert_eq!(label_of(&informer, "a"), None, "the change is not seen yet");

        informer.resync().await.unwrap();
        assert_eq!(label_of(&informer, "a").as_deref(), Some("lost"));
        assert!(informer.cache().get("ns/b").is_none(), "the lost deletion is repaired too");
        assert_eq!(*seen.lock().unwrap(), ["update a", "delete b"], "as ordinary changes, once");
        assert_eq!(client.reads() - reads, 1, "one object read again, no list");
    }

    /// An informer of pods with anti-entropy checks every second, synced.
    async fn checked(client: &Arc<MemoryClient>) -> (InformerFactory, Arc<Informer>) {
        let factory = InformerFactory::new(client.clone(), Metrics::new());
        let informer = factory.informer(&POD);
        informer.enable_anti_entropy(Duration::from_secs(1));
        factory.start();
        informer.wait_synced().await;
        (factory, informer)
    }

    fn label_of(informer: &Informer, name: &str) -> Option<String> {
        informer.cache().get(&format!("ns/{name}"))?.at("/metadata/labels/x").and_then(Value::as_str).map(str::to_string)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_change_is_repaired_at_the_next_check_and_only_that_object_is_read() {
        let client = Arc::new(MemoryClient::new());
        for n in ["a", "b", "c"] {
            client.create(&POD, None, pod(n)).await.unwrap();
        }
        let (_factory, informer) = checked(&client).await;
        let seen = recorder(&informer);
        seen.lock().unwrap().clear();
        let reads = client.reads();

        client.set_drop_watch_events(true);
        client.patch(&POD, Some("ns"), "a", Patch::Merge(json!({"metadata": {"labels": {"x": "lost"}}}))).await.unwrap();
        client.delete(&POD, Some("ns"), "b", &DeleteParams::default()).await.unwrap();
        client.set_drop_watch_events(false);
        client.create(&POD, None, pod("d")).await.unwrap();
        settle().await;
        assert_eq!(label_of(&informer, "a"), None, "the change is not seen yet");
        assert!(informer.cache().get("ns/b").is_some());

        tokio::time::sleep(Duration::from_millis(1_001)).await;
        settle().await;
        assert_eq!(label_of(&informer, "a").as_deref(), Some("lost"));
        assert!(informer.cache().get("ns/b").is_none(), "the lost deletion is repaired too");
        assert_eq!(*seen.lock().unwrap(), ["add d", "update a", "delete b"], "as ordinary changes, once");
        assert_eq!(client.reads() - reads, 1, "one get (a); b's absence needs no read");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_last_change_is_repaired_shortly_after_the_first_check_that_sees_the_server_ahead() {
        let client = Arc::new(MemoryClient::new());
        client.create(&POD, None, pod("a")).await.unwrap();
        let (_factory, informer) = checked(&client).await;
        client.set_drop_watch_events(true);
        client.patch(&POD, Some("ns"), "a", Patch::Merge(json!({"metadata": {"labels": {"x": "lost"}}}))).await.unwrap();
        client.set_drop_watch_events(false);
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        settle().await;
        assert_eq!(label_of(&informer, "a"), None, "one check: maybe still in flight");
        tokio::time::sleep(Duration::from_millis(100)).await;
        settle().await;
        assert_eq!(label_of(&informer, "a").as_deref(), Some("lost"), "a tenth of an interval later it counts as lost");
    }

    #[tokio::test(start_paused = true)]
    async fn with_nothing_lost_checks_read_no_object() {
        let client = Arc::new(MemoryClient::new());
        let (_factory, informer) = checked(&client).await;
        let reads = client.reads();
        for i in 0..20 {
            client.create(&POD, None, pod(&format!("p{i}"))).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        settle().await;
        assert_eq!(informer.cache().len(), 20);
        assert!(client.digest_requests() >= 10, "checks ran: {}", client.digest_requests());
        assert_eq!(client.reads(), reads, "no get and no list");
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_at_a_revision_the_history_no_longer_has_relists() {
        let client = Arc::new(MemoryClient::new());
        client.create(&POD, None, pod("a")).await.unwrap();
        let (_factory, informer) = checked(&client).await;
        client.set_drop_watch_events(true);
        client.create(&POD, None, pod("lost")).await.unwrap();
        client.set_drop_watch_events(false);
        client.compact();
        let reads = client.reads();
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        settle().await;
        assert_eq!(informer.cache().keys(), ["ns/a", "ns/lost"]);
        assert_eq!(client.reads() - reads, 1, "one list");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Whatever was written and whatever of it was lost, one check (and its follow-up) makes
        /// the cache equal the server.
        #[test]
        fn after_a_check_the_cache_equals_the_server(ops in proptest::collection::vec((0u8..3, 0u8..6, proptest::bool::ANY), 1..40)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
            rt.block_on(async {
                let client = Arc::new(MemoryClient::new());
                let (_factory, informer) = checked(&client).await;
                for (op, n, lost) in ops {
                    let name = format!("p{n}");
                    client.set_drop_watch_events(lost);
                    let exists = client.get(&POD, Some("ns"), &name).await.is_ok();
                    match (op, exists) {
                        (0, false) | (1, false) => drop(client.create(&POD, None, pod(&name)).await),
                        (0, true) | (1, true) => drop(client
                            .patch(&POD, Some("ns"), &name, Patch::Merge(json!({"metadata": {"labels": {"x": format!("{op}{n}")}}})))
                            .await),
                        _ => drop(client.delete(&POD, Some("ns"), &name, &DeleteParams::default()).await),
                    }
                    client.set_drop_watch_events(false);
                    settle().await;
                }
                tokio::time::sleep(Duration::from_millis(1_150)).await;
                settle().await;
                let server = client.list(&POD, &ListParams::default()).await.unwrap();
                let mut want: Vec<(String, Option<u64>)> =
                    server.items.iter().map(|o| (object_key(o).unwrap(), resource_version(o))).collect();
                want.sort();
                let mut got: Vec<(String, Option<u64>)> =
                    informer.cache().list().iter().map(|o| (object_key(o).unwrap(), resource_version(o))).collect();
                got.sort();
                assert_eq!(got, want);
            });
        }
    }
}
