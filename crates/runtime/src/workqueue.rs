//! A de-duplicating, delaying, rate-limited queue of object keys, drained by a controller's workers.
//!
//! Guarantees (each tested below):
//! - **De-duplication**: a key added many times before a worker takes it is handed out once.
//! - **Stingy**: a key is never held by two workers at once. A key added while a worker holds it
//!   is handed out again after `done`, once, however many times it was added meanwhile.
//! - **Earliest wins**: `add_after` and `add` on the same key collapse into one entry due at the
//!   earliest of the requested times; the later request is dropped, never processed a second time.
//! - **Backoff**: `add_rate_limited` delays a key by its rate limiter (by default 5 ms doubling to
//!   1000 s per key, within an overall 10/s burst 100 bucket); `forget` resets the key's backoff.
//! - **Shutdown**: after `shut_down`, `get` returns `None` and adds are ignored; work already
//!   handed out can finish, and `wait_idle` tells when it has (or a deadline passed).
//! - **Fairness**: keys become available in the order they became due (FIFO).
//! - **Cool-down**: `done_cooling(key, until)` keeps `key` from being handed out again before
//!   `until`; adds meanwhile are kept (de-duplicated) and become due then. A key whose reconcile
//!   is expensive and which is triggered continuously (a ReplicaSet of 10,000 pods during a
//!   rollout) thereby cannot keep a worker busy all the time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::{InFlight, Metrics, QueueLabels};
use crate::ratelimit::RateLimiter;

/// Expired cool-downs are dropped once this many keys have one.
const COOLING_PRUNE_AT: usize = 1024;

pub(crate) struct WorkQueue {
    name: String,
    state: Mutex<State>,
    /// Woken on every change a waiting worker may care about (new key, earlier timer, shutdown).
    changed: Notify,
    /// Woken whenever a worker finishes a key, for `wait_idle`.
    finished: Notify,
    limiter: Box<dyn RateLimiter>,
    metrics: QueueMetrics,
}

#[derive(Default)]
struct State {
    /// Keys ready to hand out, in the order they became due. Never holds a key twice.
    ready: VecDeque<String>,
    /// Keys that need processing: every key in `ready`, plus keys added while a worker holds them.
    /// A key is in `ready` iff it is dirty and not processing.
    dirty: HashSet<String>,
    /// Keys held by a worker, with the time it took them.
    processing: HashMap<String, Instant>,
    /// Keys due later, with their due time. A key is never both dirty and waiting.
    waiting: HashMap<String, Instant>,
    /// Due times of `waiting`; an entry whose time no longer matches `waiting` is stale and skipped.
    timers: BinaryHeap<Reverse<(Instant, String)>>,
    /// When each dirty key was added, for the queue-duration histogram.
    added_at: HashMap<String, Instant>,
    /// Keys cooling down after an expensive reconcile, until the given time.
    cooling: HashMap<String, Instant>,
    shutting_down: bool,
}

impl State {
    /// Makes `key` (not dirty) due at `due`, unless it is already due sooner: earliest wins.
    /// Whether anything changed.
    fn delay_until(&mut self, key: &str, due: Instant) -> bool {
        if self.waiting.get(key).is_some_and(|&at| at <= due) {
            return false;
        }
        self.waiting.insert(key.to_string(), due);
        self.timers.push(Reverse((due, key.to_string())));
        true
    }
}

struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
}

/// What `try_get` found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Key(String),
    /// Nothing ready; the earliest delayed key is due at this time, if any.
    Wait(Option<Instant>),
    Shutdown,
}

impl WorkQueue {
    pub(crate) fn new(name: &str, limiter: Box<dyn RateLimiter>, metrics: &Metrics) -> Arc<Self> {
        let labels = QueueLabels { name: name.to_string() };
        let m = metrics.inner();
        let queue = Arc::new(WorkQueue {
            name: name.to_string(),
            state: Mutex::default(),
            changed: Notify::new(),
            finished: Notify::new(),
            limiter,
            metrics: QueueMetrics {
                depth: m.queue_depth.get_or_create_owned(&labels),
                adds: m.queue_adds.get_or_create_owned(&labels),
                retries: m.queue_retries.get_or_create_owned(&labels),
                queue_duration: m.queue_duration.get_or_create_owned(&labels),
                work_duration: m.work_duration.get_or_create_owned(&labels),
            },
        });
        let weak: std::sync::Weak<dyn InFlight> = Arc::downgrade(&queue) as _;
        metrics.track_queue(weak);
        queue
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `key` as needing processing now.
    pub(crate) fn add(&self, key: &str) {
        let mut s = self.lock();
        if s.shutting_down {
            return;
        }
        let now = Instant::now();
        if let Some(&until) = s.cooling.get(key) {
            if until > now {
                drop(s);
                return self.add_after(key, until - now);
            }
            s.cooling.remove(key);
        }
        s.waiting.remove(key);
        self.insert_dirty(&mut s, key, now);
        drop(s);
        // One new key needs one worker: waking every idle one would send all but the first back
        // to sleep. A worker that was woken but took another key passes the wake-up on when it
        // drops its `Notified`, so none is lost.
        self.changed.notify_one();
    }

    fn insert_dirty(&self, s: &mut State, key: &str, now: Instant) {
        if !s.dirty.insert(key.to_string()) {
            return;
        }
        self.metrics.adds.inc();
        s.added_at.insert(key.to_string(), now);
        if !s.processing.contains_key(key) {
            s.ready.push_back(key.to_string());
            self.metrics.depth.set(s.ready.len() as i64);
        }
    }

    /// Marks `key` as needing processing after `delay`, unless it is already due sooner.
    pub(crate) fn add_after(&self, key: &str, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let mut s = self.lock();
        if s.shutting_down || s.dirty.contains(key) {
            return;
        }
        let mut due = Instant::now() + delay;
        if let Some(&until) = s.cooling.get(key) {
            due = due.max(until);
        }
        if !s.delay_until(key, due) {
            return;
        }
        drop(s);
        // One worker re-reads the earliest due time; the others sleep until a later one anyway.
        self.changed.notify_one();
    }

    /// Re-adds a failed key after its rate limiter's delay.
    pub(crate) fn add_rate_limited(&self, key: &str) {
        self.metrics.retries.inc();
        let delay = self.limiter.when(key);
        self.add_after(key, delay);
    }

    /// Resets the key's backoff after a success.
    pub(crate) fn forget(&self, key: &str) {
        self.limiter.forget(key);
    }

    /// Failures of `key` since it last succeeded.
    pub(crate) fn retries(&self, key: &str) -> u32 {
        self.limiter.retries(key)
    }

    /// Hands out the next ready key without waiting, moving due delayed keys to ready first.
    pub(crate) fn try_get(&self) -> Next {
        let mut s = self.lock();
        if s.shutting_down {
            return Next::Shutdown;
        }
        let now = Instant::now();
        while let Some(Reverse((at, _))) = s.timers.peek()
            && *at <= now
        {
            let Some(Reverse((at, key))) = s.timers.pop() else { break };
            if s.waiting.get(&key) == Some(&at) {
                s.waiting.remove(&key);
                self.insert_dirty(&mut s, &key, now);
            }
        }
        match s.ready.pop_front() {
            Some(key) => {
                s.dirty.remove(&key);
                s.processing.insert(key.clone(), now);
                if let Some(added) = s.added_at.remove(&key) {
                    self.metrics.queue_duration.observe(now.duration_since(added).as_secs_f64());
                }
                self.metrics.depth.set(s.ready.len() as i64);
                Next::Key(key)
            }
            None => Next::Wait(s.timers.peek().map(|Reverse((at, _))| *at)),
        }
    }

    /// Waits for the next key; `None` once the queue is shutting down.
    pub(crate) async fn get(&self) -> Option<String> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so a key added right after the look still wakes us.
            changed.as_mut().enable();
            match self.try_get() {
                Next::Key(key) => return Some(key),
                Next::Shutdown => return None,
                Next::Wait(Some(due)) => {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                Next::Wait(None) => changed.await,
            }
        }
    }

    /// Releases `key` after processing; if it was added meanwhile it becomes ready again.
    pub(crate) fn done(&self, key: &str) {
        self.release(key, None)
    }

    /// Releases `key` like `done`, but does not hand it out again before `until`: if it was added
    /// meanwhile, or is added before then, it becomes due at `until`.
    pub(crate) fn done_cooling(&self, key: &str, until: Instant) {
        self.release(key, Some(until))
    }

    fn release(&self, key: &str, cool_until: Option<Instant>) {
        let mut s = self.lock();
        if let Some(started) = s.processing.remove(key) {
            self.metrics.work_duration.observe(started.elapsed().as_secs_f64());
        }
        let now = Instant::now();
        let cool_until = cool_until.filter(|&until| until > now && !s.shutting_down);
        if let Some(until) = cool_until {
            if s.cooling.len() >= COOLING_PRUNE_AT {
                s.cooling.retain(|_, &mut t| t > now);
            }
            s.cooling.insert(key.to_string(), until);
        }
        let mut wake = false;
        if s.dirty.contains(key) && !s.shutting_down {
            match cool_until {
                Some(until) => {
                    // Dirty and waiting are exclusive: the pending add becomes a delayed one.
                    s.dirty.remove(key);
                    s.added_at.remove(key);
                    wake = s.delay_until(key, until);
                }
                None => {
                    s.ready.push_back(key.to_string());
                    self.metrics.depth.set(s.ready.len() as i64);
                    wake = true;
                }
            }
        }
        drop(s);
        // Idle workers only need waking when the release made a key ready or due sooner.
        if wake {
            self.changed.notify_one();
        }
        self.finished.notify_waiters();
    }

    /// Stops handing out keys and ignores further adds. Keys already handed out may still finish.
    pub(crate) fn shut_down(&self) {
        let mut s = self.lock();
        s.shutting_down = true;
        s.ready.clear();
        s.waiting.clear();
        s.cooling.clear();
        s.timers.clear();
        self.metrics.depth.set(0);
        drop(s);
        self.changed.notify_waiters();
    }

    /// Waits until no key is being processed, or `deadline`; `true` if the queue went idle.
    pub(crate) async fn wait_idle(&self, deadline: Instant) -> bool {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.lock().processing.is_empty() {
                return true;
            }
            tokio::select! {
                _ = finished => {}
                _ = tokio::time::sleep_until(deadline) => return self.lock().processing.is_empty(),
            }
        }
    }

    /// Keys ready to hand out.
    pub(crate) fn len(&self) -> usize {
        self.lock().ready.len()
    }

    /// Delayed keys with their due time, soonest first.
    pub(crate) fn delayed(&self) -> Vec<(String, Instant)> {
        let mut v: Vec<(String, Instant)> = self.lock().waiting.iter().map(|(k, at)| (k.clone(), *at)).collect();
        v.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// Keys being processed now.
    /// Adds since the queue was made (the `workqueue_adds_total` counter).
    pub(crate) fn adds(&self) -> u64 {
        self.metrics.adds.get()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.lock().processing.len()
    }
}

impl InFlight for WorkQueue {
    fn queue_name(&self) -> &str {
        &self.name
    }

    fn in_flight_seconds(&self) -> (f64, f64) {
        let now = Instant::now();
        let s = self.lock();
        s.processing.values().map(|started| now.duration_since(*started).as_secs_f64()).fold(
            (0.0, 0.0),
            |(sum, longest), age| (sum + age, f64::max(longest, age)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::{ItemExponential, default_rate_limiter};
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn queue() -> Arc<WorkQueue> {
        WorkQueue::new("test", Box::new(default_rate_limiter()), &Metrics::new())
    }

    fn key(next: Next) -> Option<String> {
        match next {
            Next::Key(k) => Some(k),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cooling_key_waits_out_its_cool_down_and_others_do_not() {
        let q = queue();
        q.add("hot");
        assert_eq!(key(q.try_get()), Some("hot".into()));
        q.add("hot"); // while processing
        q.done_cooling("hot", Instant::now() + Duration::from_millis(50));
        q.add("hot"); // after: still one entry, still cooling
        q.add("cold");
        assert_eq!(key(q.try_get()), Some("cold".into()));
        q.done("cold");
        assert_eq!(q.try_get(), Next::Wait(Some(Instant::now() + Duration::from_millis(50))));
        tokio::time::advance(Duration::from_millis(49)).await;
        assert_eq!(key(q.try_get()), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(key(q.try_get()), Some("hot".into()));
        q.done("hot");
        assert_eq!(key(q.try_get()), None, "handed out once for all three adds");
        // Once the cool-down is over, an add is immediate again.
        q.add("hot");
        assert_eq!(key(q.try_get()), Some("hot".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_many_times_before_it_runs_runs_once() {
        let q = queue();
        for _ in 0..5 {
            q.add("a");
        }
        q.add("b");
        assert_eq!(key(q.try_get()).as_deref(), Some("a"));
        assert_eq!(key(q.try_get()).as_deref(), Some("b"));
        assert_eq!(q.try_get(), Next::Wait(None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_runs_again_after_done_once() {
        let q = queue();
        q.add("a");
        assert_eq!(key(q.try_get()).as_deref(), Some("a"));
        q.add("a");
        q.add("a");
        assert_eq!(q.try_get(), Next::Wait(None), "never handed to a second worker while held");
        q.done("a");
        assert_eq!(key(q.try_get()).as_deref(), Some("a"));
        q.done("a");
        assert_eq!(q.try_get(), Next::Wait(None));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_then_add_collapse_into_one_entry_and_the_earliest_wins() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10));
        q.add("a");
        assert_eq!(key(q.try_get()).as_deref(), Some("a"));
        q.done("a");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(q.try_get(), Next::Wait(None), "the later timer must not process the key again");

        q.add_after("b", Duration::from_secs(10));
        q.add_after("b", Duration::from_secs(2));
        q.add_after("b", Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(key(q.try_get()).as_deref(), Some("b"));
        q.done("b");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(q.try_get(), Next::Wait(None));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_follows_5ms_doubling_on_the_paused_clock_and_resets_after_forget() {
        let q = WorkQueue::new(
            "backoff",
            Box::new(ItemExponential::new(Duration::from_millis(5), Duration::from_secs(1000))),
            &Metrics::new(),
        );
        let mut waited = Vec::new();
        for _ in 0..4 {
            let start = Instant::now();
            q.add_rate_limited("k");
            let got = q.get().await;
            assert_eq!(got.as_deref(), Some("k"));
            waited.push(start.elapsed().as_millis());
            q.done("k");
        }
        assert_eq!(waited, [5, 10, 20, 40]);
        assert_eq!(q.retries("k"), 4);

        q.forget("k");
        let start = Instant::now();
        q.add_rate_limited("k");
        tokio::time::advance(Duration::from_millis(4)).await;
        assert_eq!(q.try_get(), Next::Wait(Some(start + Duration::from_millis(5))));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(key(q.try_get()).as_deref(), Some("k"), "after forget the delay is 5 ms again");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_handing_out_keys_and_waits_for_in_flight_work() {
        let q = queue();
        q.add("a");
        q.add("b");
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.shut_down();
        assert_eq!(q.get().await, None);
        q.add("c");
        assert_eq!(q.try_get(), Next::Shutdown);
        let deadline = Instant::now() + Duration::from_secs(1);
        assert!(!q.wait_idle(deadline).await, "a is still in flight at the deadline");
        let q2 = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            q2.done("a");
        });
        assert!(q.wait_idle(Instant::now() + Duration::from_secs(1)).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_workers_never_hold_the_same_key() {
        let q = queue();
        let held: Arc<Mutex<HashSet<String>>> = Arc::default();
        let processed = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (q, held, processed) = (q.clone(), held.clone(), processed.clone());
            workers.push(tokio::spawn(async move {
                while let Some(k) = q.get().await {
                    assert!(held.lock().unwrap().insert(k.clone()), "{k} held twice");
                    tokio::task::yield_now().await;
                    held.lock().unwrap().remove(&k);
                    processed.fetch_add(1, Ordering::Relaxed);
                    q.done(&k);
                }
            }));
        }
        for i in 0..2000 {
            q.add(&format!("k{}", i % 17));
            if i % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        while q.len() > 0 || q.in_flight() > 0 {
            tokio::task::yield_now().await;
        }
        q.shut_down();
        for w in workers {
            w.await.unwrap();
        }
        assert!(processed.load(Ordering::Relaxed) >= 17);
    }

    /// Keys per second through the queue with 4 workers and a trivial reconciler. A measurement:
    /// `cargo test --release -p shepherd-runtime -- --ignored --nocapture queue_throughput`.
    #[test]
    #[ignore]
    fn queue_throughput_with_four_workers_and_a_trivial_reconciler() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            const KEYS: usize = 200_000;
            let q = queue();
            let processed = Arc::new(AtomicUsize::new(0));
            let keys: Vec<String> = (0..KEYS).map(|i| format!("ns/obj-{i}")).collect();
            let started = std::time::Instant::now();
            let mut workers = Vec::new();
            for _ in 0..4 {
                let (q, processed) = (q.clone(), processed.clone());
                workers.push(tokio::spawn(async move {
                    while let Some(k) = q.get().await {
                        std::hint::black_box(&k);
                        q.forget(&k);
                        q.done(&k);
                        processed.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            for k in &keys {
                q.add(k);
            }
            while processed.load(Ordering::Relaxed) < KEYS {
                tokio::task::yield_now().await;
            }
            let elapsed = started.elapsed();
            q.shut_down();
            for w in workers {
                let _ = w.await;
            }
            println!(
                "work queue: {KEYS} distinct keys through 4 workers in {elapsed:?} = {:.0} keys/s",
                KEYS as f64 / elapsed.as_secs_f64()
            );
        });
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(u8),
        AddAfter(u8, u16),
        Get(u8),
        Done(u8),
        Advance(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4).prop_map(Op::Add),
            ((0u8..4), (1u16..50)).prop_map(|(k, ms)| Op::AddAfter(k, ms)),
            (0u8..3).prop_map(Op::Get),
            (0u8..3).prop_map(Op::Done),
            (1u16..30).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Three workers interleave at random. A key counts as "owed" from any add until a worker
        /// takes it: every hand-out must be owed (duplicates collapse, earliest wins), no key is held
        /// twice, and once everything is drained nothing is owed (no key lost).
        #[test]
        fn random_interleavings_keep_every_queue_guarantee(ops in proptest::collection::vec(op(), 1..120)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
            rt.block_on(async move {
                let q = queue();
                let mut held: [Option<String>; 3] = [None, None, None];
                let mut owed: HashSet<String> = HashSet::new();
                let take = |w: usize, held: &mut [Option<String>; 3], owed: &mut HashSet<String>, q: &WorkQueue| {
                    if held[w].is_some() { return; }
                    if let Next::Key(k) = q.try_get() {
                        assert!(owed.remove(&k), "{k} handed out without an add since its last hand-out");
                        assert!(!held.iter().flatten().any(|h| *h == k), "{k} held by two workers");
                        held[w] = Some(k);
                    }
                };
                for op in ops {
                    match op {
                        Op::Add(k) => { let k = format!("k{k}"); q.add(&k); owed.insert(k); }
                        Op::AddAfter(k, ms) => {
                            let k = format!("k{k}");
                            q.add_after(&k, Duration::from_millis(ms.into()));
                            owed.insert(k);
                        }
                        Op::Get(w) => take(w as usize, &mut held, &mut owed, &q),
                        Op::Done(w) => if let Some(k) = held[w as usize].take() { q.done(&k) },
                        Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms.into())).await,
                    }
                }
                // Drain: finish held work, let every timer fire, take everything left.
                for _ in 0..10 {
                    for slot in held.iter_mut() {
                        if let Some(k) = slot.take() { q.done(&k) }
                    }
                    tokio::time::advance(Duration::from_millis(100)).await;
                    for w in 0..3 { take(w, &mut held, &mut owed, &q); }
                }
                assert!(owed.is_empty(), "keys lost: {owed:?}");
            });
        }
    }
}
