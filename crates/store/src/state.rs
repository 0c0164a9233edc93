//! The in-memory state every backend serves reads from: current values, the revision, and the
//! bounded history that watches replay.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::broadcast;

use crate::{Event, EventKind, KeyValue, ListResult, Retention, Revision, StoreError};

/// How much write history is kept for watches to replay.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    pub max_events: usize,
    pub max_age: Duration,
    /// Bytes of object values the history may hold (superseded versions of objects stay alive
    /// only through it, so this bounds its memory whatever the object sizes).
    pub max_bytes: usize,
    /// Events of its prefix a live watcher may fall behind before it is dropped with `Lagged`
    /// (at most 1,024). A dropped watcher resumes from the history, so this can be
    /// much smaller than the history; each watched prefix's buffer holds this many recent events
    /// alive.
    pub watcher_buffer: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            max_events: 100_000,
            max_age: Duration::from_secs(15 * 60),
            max_bytes: 64 * 1024 * 1024,
            watcher_buffer: FEED_BUFFER_MAX,
        }
    }
}

impl HistoryLimits {
    /// The events each watched prefix's live buffer holds: `watcher_buffer` within 1..=1,024.
    pub fn live_buffer(&self) -> usize {
        self.watcher_buffer.clamp(1, FEED_BUFFER_MAX)
    }
}

/// Events as they are applied, for watchers to follow after replaying history.
pub(crate) type LiveEvents = broadcast::Receiver<Arc<Event>>;

/// The most events one watched prefix's live buffer holds, whatever `watcher_buffer` says: every
/// buffer is allocated in full when its prefix is first watched, and the control plane watches
/// dozens of prefixes (one per kind). A watcher beyond it resumes from the history.
pub(crate) const FEED_BUFFER_MAX: usize = 1024;

/// The live events of one watched prefix. Each prefix has its own channel, so a write wakes only
/// the watchers of the prefixes it falls under: with one channel for all, every Lease renewal woke
/// every informer of every kind, each to find the event was not for it.
struct Feed {
    prefix: String,
    tx: broadcast::Sender<Arc<Event>>,
}

/// One requested write.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    Create { key: String, value: Bytes },
    Update { key: String, value: Bytes, expected: Option<Revision> },
    Delete { key: String, expected: Option<Revision> },
}

pub(crate) struct State {
    pub(crate) objects: BTreeMap<String, KeyValue>,
    pub(crate) revision: Revision,
    history: VecDeque<(Arc<Event>, Instant)>,
    /// Sum of the value sizes of the events in `history`.
    history_bytes: usize,
    /// Smallest `from_revision` a watch can start at: every event after it is still in `history`.
    watchable_from: Revision,
    limits: HistoryLimits,
    /// One per watched prefix; a feed nobody follows any more goes at the next write.
    feeds: Mutex<Vec<Feed>>,
    /// Set by `close`: no watch starts or resumes after it.
    closed: bool,
}

impl State {
    pub(crate) fn new(objects: BTreeMap<String, KeyValue>, revision: Revision, limits: HistoryLimits) -> Self {
        State {
            objects,
            revision,
            history: VecDeque::new(),
            history_bytes: 0,
            watchable_from: revision,
            limits,
            feeds: Mutex::new(Vec::new()),
            closed: false,
        }
    }

    /// Checks `write` against the current state plus `pending` (writes earlier in the same batch,
    /// not applied yet) and returns the event it would produce at revision `rev`.
    pub(crate) fn prepare(
        &self,
        write: Write,
        rev: Revision,
        pending: &BTreeMap<String, Option<KeyValue>>,
    ) -> Result<Event, StoreError> {
        let current = |key: &str| -> Option<KeyValue> {
            match pending.get(key) {
                Some(v) => v.clone(),
                None => self.objects.get(key).cloned(),
            }
        };
        let check = |key: &str, cur: &KeyValue, expected: Option<Revision>| match expected {
            Some(e) if e != cur.mod_revision => {
                Err(StoreError::Conflict { key: key.to_string(), expected: e, actual: cur.mod_revision })
            }
            _ => Ok(()),
        };
        match write {
            Write::Create { key, value } => {
                if current(&key).is_some() {
                    return Err(StoreError::AlreadyExists { key });
                }
                let kv = KeyValue { key, value, create_revision: rev, mod_revision: rev };
                Ok(Event { kind: EventKind::Created, kv, prev: None })
            }
            Write::Update { key, value, expected } => {
                let Some(prev) = current(&key) else { return Err(StoreError::NotFound { key }) };
                check(&key, &prev, expected)?;
                let kv = KeyValue { key, value, create_revision: prev.create_revision, mod_revision: rev };
                Ok(Event { kind: EventKind::Updated, kv, prev: Some(prev) })
            }
            Write::Delete { key, expected } => {
                let Some(prev) = current(&key) else { return Err(StoreError::NotFound { key }) };
                check(&key, &prev, expected)?;
                let kv = KeyValue { mod_revision: rev, ..prev.clone() };
                Ok(Event { kind: EventKind::Deleted, kv, prev: Some(prev) })
            }
        }
    }

    /// Applies a prepared event: updates the objects and revision, records history, notifies
    /// watchers. Events must be applied in revision order; a local store's are consecutive, an
    /// etcd cache's skip the revisions of writes outside its prefix.
    pub(crate) fn apply(&mut self, event: Event) -> Arc<Event> {
        self.apply_at(event, Instant::now())
    }

    /// As `apply`, for an event written at `at` (earlier than now when it is replayed from disk,
    /// so the history's age limit counts from the original write).
    pub(crate) fn apply_at(&mut self, event: Event, at: Instant) -> Arc<Event> {
        debug_assert!(event.revision() > self.revision);
        self.revision = event.revision();
        match event.kind {
            EventKind::Deleted => {
                self.objects.remove(&event.kv.key);
            }
            _ => {
                self.objects.insert(event.kv.key.clone(), event.kv.clone());
            }
        }
        let event = Arc::new(event);
        self.history_bytes += event.kv.value.len();
        self.history.push_back((event.clone(), at));
        self.trim(Instant::now());
        let feeds = self.feeds.get_mut().unwrap_or_else(|e| e.into_inner());
        feeds.retain(|f| f.tx.receiver_count() > 0);
        for feed in feeds.iter().filter(|f| event.kv.key.starts_with(&f.prefix)) {
            // A feed whose last watcher went since the retain is fine: nobody is watching.
            let _ = feed.tx.send(event.clone());
        }
        event
    }

    /// Drops the oldest events beyond the limits.
    fn trim(&mut self, now: Instant) {
        // The newest event always stays, so a watcher can follow even one huge write.
        while self.history.len() > 1
            && let Some((oldest, at)) = self.history.front()
        {
            let over = self.history.len() > self.limits.max_events
                || self.history_bytes > self.limits.max_bytes
                || now.duration_since(*at) > self.limits.max_age;
            if !over {
                break;
            }
            self.watchable_from = oldest.revision();
            self.history_bytes -= oldest.kv.value.len();
            self.history.pop_front();
        }
    }

    /// Puts back a history read from disk: `events` are every write after `from` up to the
    /// current revision, oldest first, each with the time it was made. A history with a hole
    /// keeps only what follows the hole.
    pub(crate) fn restore_history(&mut self, from: Revision, events: Vec<(Arc<Event>, Instant)>) {
        let mut expected = from;
        for (event, at) in events {
            if event.revision() != expected + 1 {
                self.history.clear();
                self.history_bytes = 0;
            }
            expected = event.revision();
            self.history_bytes += event.kv.value.len();
            self.history.push_back((event, at));
        }
        if expected != self.revision {
            // The history does not reach the current revision: none of it can be replayed.
            self.history.clear();
            self.history_bytes = 0;
            self.watchable_from = self.revision;
            return;
        }
        self.watchable_from = self.history.front().map_or(self.revision, |(e, _)| e.revision() - 1);
        self.trim(Instant::now());
    }

    /// Drops the history up to `through` (at most the current revision): lists and watches from
    /// a revision before it are `Expired` from now on.
    pub(crate) fn compact(&mut self, through: Revision) {
        let through = through.min(self.revision);
        while let Some((oldest, _)) = self.history.front()
            && oldest.revision() <= through
        {
            self.history_bytes -= oldest.kv.value.len();
            self.history.pop_front();
        }
        self.watchable_from = self.watchable_from.max(through);
    }

    /// Ends every watch once it has the events applied so far (their live subscription closes and
    /// cannot be taken up again), and refuses new ones.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        // Dropping a feed's only sender closes its receivers after their buffered events.
        self.feeds.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Smallest revision a watch can start from.
    pub(crate) fn watchable_from(&self) -> Revision {
        self.watchable_from
    }

    /// Moves the revision forward without a write under this state's keys: etcd reported that
    /// every event up to `revision` has been delivered.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn advance(&mut self, revision: Revision) {
        self.revision = self.revision.max(revision);
    }

    pub(crate) fn retention(&self) -> Retention {
        let feeds = self.feeds.lock().unwrap_or_else(|e| e.into_inner());
        Retention {
            objects: self.objects.len(),
            object_bytes: self.objects.values().map(|kv| kv.value.len()).sum(),
            history_events: self.history.len(),
            history_bytes: self.history_bytes,
            live_watchers: feeds.iter().map(|f| f.tx.receiver_count()).sum(),
            live_buffer_events: feeds.iter().map(|f| f.tx.len()).max().unwrap_or(0),
            limits: self.limits,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<KeyValue> {
        self.objects.get(key).cloned()
    }

    pub(crate) fn list(&self, prefix: &str, start_after: Option<&str>, limit: Option<usize>) -> ListResult {
        let start = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        let mut items = Vec::new();
        let mut more = false;
        for (k, v) in self.objects.range((start, Bound::Unbounded)) {
            if !k.starts_with(prefix) {
                break;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push(v.clone());
        }
        ListResult { items, revision: self.revision, more }
    }

    /// The list as it stood at revision `at`: the current objects with the retained writes after
    /// `at` undone. `Expired` when those writes are no longer all retained.
    pub(crate) fn list_at(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at: Revision,
    ) -> Result<ListResult, StoreError> {
        if at >= self.revision {
            return Ok(self.list(prefix, start_after, limit));
        }
        if at < self.watchable_from {
            return Err(StoreError::Expired { requested: at, oldest: self.watchable_from });
        }
        let after = |k: &str| k.starts_with(prefix) && start_after.is_none_or(|a| k > a);
        // Newest first, so the value that stays for a key is the one before its first later write.
        let mut then: BTreeMap<&str, Option<&KeyValue>> = BTreeMap::new();
        let first_later = self.history.partition_point(|(e, _)| e.revision() <= at);
        for (e, _) in self.history.range(first_later..).rev() {
            if after(&e.kv.key) {
                then.insert(&e.kv.key, e.prev.as_ref());
            }
        }
        let start = match start_after {
            Some(a) if a >= prefix => Bound::Excluded(a.to_string()),
            _ => Bound::Included(prefix.to_string()),
        };
        let mut now = self.objects.range((start, Bound::Unbounded)).take_while(|(k, _)| k.starts_with(prefix)).peekable();
        let mut changed = then.into_iter().peekable();
        let mut items = Vec::new();
        loop {
            let next = match (now.peek(), changed.peek()) {
                (None, None) => break,
                (Some((k, _)), Some((c, _))) if k.as_str() < *c => now.next().map(|(_, v)| Some(v)),
                (Some((k, _)), Some((c, _))) if k.as_str() == *c => {
                    now.next();
                    changed.next().map(|(_, v)| v)
                }
                (Some(_), None) => now.next().map(|(_, v)| Some(v)),
                _ => changed.next().map(|(_, v)| v),
            };
            let Some(Some(kv)) = next else { continue };
            if limit.is_some_and(|l| items.len() >= l) {
                return Ok(ListResult { items, revision: at, more: true });
            }
            items.push(kv.clone());
        }
        Ok(ListResult { items, revision: at, more: false })
    }

    pub(crate) fn count(&self, prefix: &str) -> usize {
        let from: (Bound<&str>, Bound<&str>) = (Bound::Included(prefix), Bound::Unbounded);
        self.objects.range::<str, _>(from).take_while(|(k, _)| k.starts_with(prefix)).count()
    }

    /// The retained events after `from` under `prefix`, and a live subscription that continues
    /// exactly where they end (taken under the same lock, so nothing falls between them).
    pub(crate) fn start_watch(
        &self,
        prefix: &str,
        from: Revision,
    ) -> Result<(Vec<Arc<Event>>, LiveEvents), StoreError> {
        if self.closed {
            return Err(StoreError::Closed);
        }
        if from < self.watchable_from {
            return Err(StoreError::Expired { requested: from, oldest: self.watchable_from });
        }
        let rx = {
            let mut feeds = self.feeds.lock().unwrap_or_else(|e| e.into_inner());
            match feeds.iter().find(|f| f.prefix == prefix) {
                Some(feed) => feed.tx.subscribe(),
                None => {
                    let (tx, rx) = broadcast::channel(self.limits.live_buffer());
                    feeds.push(Feed { prefix: prefix.to_string(), tx });
                    rx
                }
            }
        };
        let start = self.history.partition_point(|(e, _)| e.revision() <= from);
        let replay =
            self.history.range(start..).filter(|(e, _)| e.kv.key.starts_with(prefix)).map(|(e, _)| e.clone()).collect();
        Ok((replay, rx))
    }
}
