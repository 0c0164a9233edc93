//! The in-memory state every backend serves reads from: current values, the revision, and the
//! bounded history that watches replay.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::broadcast;

use shepherd_pack::{Packed, Packer, kind_of};
use crate::{Event, EventKind, KeyValue, ListResult, PackedKeyValue, Retention, Revision, StoreError};

/// How much write history is kept for watches to replay.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    pub max_events: usize,
    pub max_age: Duration,
    /// Bytes of object values the history may hold (superseded versions of objects stay alive
    /// only through it, so this bounds its memory whatever the object sizes).
    pub max_bytes: usize,
    /// Bytes of object values of the newest part of the history kept in memory, where the
    /// backend keeps the whole history on disk too (the embedded store): older events are read
    /// back from its file when a watch or a list at a past revision reaches them. Memory always
    /// holds every event the file does not have yet, whatever this says.
    pub memory_bytes: usize,
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
            memory_bytes: 4 * 1024 * 1024,
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

/// The history's events that a backend keeps on disk as well as in memory, read back once they
/// have left memory.
pub(crate) trait DiskHistory: Send + Sync {
    /// The events under `prefix` after revision `after` up to `through`, oldest first. `Expired`
    /// when the file no longer reaches back to `after`.
    fn events(&self, prefix: &str, after: Revision, through: Revision) -> Result<Vec<Arc<Event>>, StoreError>;
    /// Reads of the file so far, and the events they returned.
    fn reads(&self) -> (u64, u64);
}

/// `disk.events(prefix, after, through)` on tokio's blocking threads (inline outside a runtime),
/// so a long read of the file holds up no async worker.
pub(crate) async fn read_from_disk(
    disk: Arc<dyn DiskHistory>,
    prefix: &str,
    after: Revision,
    through: Revision,
) -> Result<Vec<Arc<Event>>, StoreError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return disk.events(prefix, after, through);
    }
    let prefix = prefix.to_string();
    tokio::task::spawn_blocking(move || disk.events(&prefix, after, through))
        .await
        .map_err(|e| StoreError::Backend(format!("reading the watch history from the store file: {e}")))?
}

/// Where the history beyond memory is, and how far it reaches.
struct Spill {
    disk: Arc<dyn DiskHistory>,
    /// Every event up to this revision is on disk: such events may leave memory.
    durable: Revision,
}

/// One event of the whole history (in memory or not), for its limits.
struct Entry {
    revision: Revision,
    bytes: usize,
    at: Instant,
}

/// A watch's start: the retained events after its revision and the live subscription that
/// continues where they end. With `older`, the events up to that revision have left memory: the
/// disk history holds them, and they come before `replay`.
pub(crate) struct WatchStart {
    pub(crate) older: Option<(Arc<dyn DiskHistory>, Revision)>,
    pub(crate) replay: Vec<Arc<Event>>,
    pub(crate) rx: LiveEvents,
}

/// What `State::list_at` needs or gives.
pub(crate) enum ListAt<T> {
    Done(Result<ListResult<T>, StoreError>),
    /// The list needs the events under its prefix after the given revision up to the second one,
    /// which have left memory: read them from `disk` and ask again with them.
    Disk(Arc<dyn DiskHistory>, Revision, Revision),
}

/// One requested write.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    Create { key: String, value: Bytes },
    Update { key: String, value: Bytes, expected: Option<Revision> },
    Delete { key: String, expected: Option<Revision> },
}

impl Write {
    pub(crate) fn key(&self) -> &str {
        match self {
            Write::Create { key, .. } | Write::Update { key, .. } | Write::Delete { key, .. } => key,
        }
    }
}

/// A current object as the state holds it: its value packed (most of the state's memory is these),
/// and, while its latest write is still in the history in memory, the value as written too,
/// shared with that event, so the reads and the next write that come soon after a write unpack
/// nothing.
pub(crate) struct Stored {
    packed: Packed,
    recent: Option<Bytes>,
    create_revision: Revision,
    mod_revision: Revision,
}

impl Stored {
    fn value(&self) -> Bytes {
        match &self.recent {
            Some(v) => v.clone(),
            None => self.packed.unpack(),
        }
    }

    fn kv(&self, key: &str) -> KeyValue {
        KeyValue { key: key.to_string(), value: self.value(), create_revision: self.create_revision, mod_revision: self.mod_revision }
    }
}

/// What a list holds of each object: the value unpacked (`KeyValue`) or as kept (`PackedKeyValue`).
pub(crate) trait Listed: Sized {
    fn of_stored(key: &str, stored: &Stored) -> Self;
    fn of_written(kv: &KeyValue) -> Self;
}

impl Listed for KeyValue {
    fn of_stored(key: &str, stored: &Stored) -> Self {
        stored.kv(key)
    }
    fn of_written(kv: &KeyValue) -> Self {
        kv.clone()
    }
}

impl Listed for PackedKeyValue {
    fn of_stored(key: &str, stored: &Stored) -> Self {
        let value = match &stored.recent {
            Some(v) => Packed::Raw(v.clone()),
            None => stored.packed.clone(),
        };
        PackedKeyValue { key: key.to_string(), value, create_revision: stored.create_revision, mod_revision: stored.mod_revision }
    }
    fn of_written(kv: &KeyValue) -> Self {
        PackedKeyValue::from(kv.clone())
    }
}

pub(crate) struct State {
    objects: BTreeMap<String, Stored>,
    packer: Packer,
    pub(crate) revision: Revision,
    /// The whole history's events, oldest first: what the limits count.
    ledger: VecDeque<Entry>,
    /// Sum of the value sizes of the events in `ledger`.
    history_bytes: usize,
    /// Smallest `from_revision` a watch can start at: every event after it is still in the history.
    watchable_from: Revision,
    /// The newest events of the history, after `memory_from`: all of them unless `spill` lets the
    /// older ones go.
    history: VecDeque<Arc<Event>>,
    /// Sum of the value sizes of the events in `history`.
    memory_bytes: usize,
    memory_from: Revision,
    spill: Option<Spill>,
    limits: HistoryLimits,
    /// One per watched prefix; a feed nobody follows any more goes at the next write.
    feeds: Mutex<Vec<Feed>>,
    /// Set by `close`: no watch starts or resumes after it.
    closed: bool,
    /// Watches that fell out of their live buffer and resumed from the history.
    resumes: AtomicU64,
}

impl State {
    pub(crate) fn new(objects: BTreeMap<String, KeyValue>, revision: Revision, limits: HistoryLimits) -> Self {
        let mut packer = Packer::default();
        let objects = objects
            .into_iter()
            .map(|(key, kv)| {
                let packed = packer.pack(kind_of(&key), &kv.value);
                (key, Stored { packed, recent: None, create_revision: kv.create_revision, mod_revision: kv.mod_revision })
            })
            .collect();
        State {
            objects,
            packer,
            revision,
            ledger: VecDeque::new(),
            history_bytes: 0,
            watchable_from: revision,
            history: VecDeque::new(),
            memory_bytes: 0,
            memory_from: revision,
            spill: None,
            limits,
            feeds: Mutex::new(Vec::new()),
            closed: false,
            resumes: AtomicU64::new(0),
        }
    }

    /// Counts a watch that fell out of its live buffer and resumes from the history.
    pub(crate) fn note_resume(&self) {
        self.resumes.fetch_add(1, Ordering::Relaxed);
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
                None => self.get(key),
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
                let kv = &event.kv;
                let stored = Stored {
                    packed: self.packer.pack(kind_of(&kv.key), &kv.value),
                    recent: Some(kv.value.clone()),
                    create_revision: kv.create_revision,
                    mod_revision: kv.mod_revision,
                };
                self.objects.insert(kv.key.clone(), stored);
            }
        }
        let event = Arc::new(event);
        self.record(event.clone(), at);
        self.trim(Instant::now());
        let feeds = self.feeds.get_mut().unwrap_or_else(|e| e.into_inner());
        feeds.retain(|f| f.tx.receiver_count() > 0);
        for feed in feeds.iter().filter(|f| event.kv.key.starts_with(&f.prefix)) {
            // A feed whose last watcher went since the retain is fine: nobody is watching.
            let _ = feed.tx.send(event.clone());
        }
        event
    }

    fn record(&mut self, event: Arc<Event>, at: Instant) {
        let bytes = event.kv.value.len();
        self.ledger.push_back(Entry { revision: event.revision(), bytes, at });
        self.history_bytes += bytes;
        self.memory_bytes += bytes;
        self.history.push_back(event);
    }

    fn forget_history(&mut self) {
        self.ledger.clear();
        self.history.clear();
        (self.history_bytes, self.memory_bytes) = (0, 0);
    }

    /// Drops the oldest events beyond the limits, and lets the oldest ones in memory go beyond
    /// `memory_bytes` once they are on disk.
    fn trim(&mut self, now: Instant) {
        // The newest event always stays, so a watcher can follow even one huge write.
        while self.ledger.len() > 1
            && let Some(oldest) = self.ledger.front()
        {
            let over = self.ledger.len() > self.limits.max_events
                || self.history_bytes > self.limits.max_bytes
                || now.duration_since(oldest.at) > self.limits.max_age;
            if !over {
                break;
            }
            self.watchable_from = oldest.revision;
            self.history_bytes -= oldest.bytes;
            self.ledger.pop_front();
        }
        let durable = self.spill.as_ref().map_or(0, |s| s.durable);
        while let Some(oldest) = self.history.front() {
            let expired = oldest.revision() <= self.watchable_from;
            let spilled =
                self.history.len() > 1 && self.memory_bytes > self.limits.memory_bytes && oldest.revision() <= durable;
            if !expired && !spilled {
                break;
            }
            self.memory_from = oldest.revision();
            self.memory_bytes -= oldest.kv.value.len();
            // The object's value as written goes with its last write: the packed one stays.
            if let Some(current) = self.objects.get_mut(&oldest.kv.key)
                && current.mod_revision == oldest.revision()
            {
                current.recent = None;
            }
            self.history.pop_front();
        }
    }

    /// From now on, events up to `durable` may leave memory beyond the history's `memory_bytes`:
    /// `disk` holds them.
    pub(crate) fn spill_to(&mut self, disk: Arc<dyn DiskHistory>, durable: Revision) {
        self.spill = Some(Spill { disk, durable });
        self.trim(Instant::now());
    }

    /// Every event up to `revision` is on disk now.
    pub(crate) fn durable_through(&mut self, revision: Revision) {
        if let Some(spill) = &mut self.spill {
            spill.durable = spill.durable.max(revision);
            self.trim(Instant::now());
        }
    }

    /// Puts back a history read from disk: `events` are every write after `from` up to the
    /// current revision, oldest first, each with the time it was made. A history with a hole
    /// keeps only what follows the hole.
    pub(crate) fn restore_history(&mut self, from: Revision, events: Vec<(Arc<Event>, Instant)>) {
        let mut expected = from;
        for (event, at) in events {
            if event.revision() != expected + 1 {
                self.forget_history();
            }
            expected = event.revision();
            self.record(event, at);
        }
        if expected != self.revision {
            // The history does not reach the current revision: none of it can be replayed.
            self.forget_history();
            self.watchable_from = self.revision;
            self.memory_from = self.revision;
            return;
        }
        self.watchable_from = self.ledger.front().map_or(self.revision, |e| e.revision - 1);
        self.memory_from = self.watchable_from;
        self.trim(Instant::now());
    }

    /// Drops the history up to `through` (at most the current revision): lists and watches from
    /// a revision before it are `Expired` from now on.
    pub(crate) fn compact(&mut self, through: Revision) {
        let through = through.min(self.revision);
        while let Some(oldest) = self.ledger.front()
            && oldest.revision <= through
        {
            self.history_bytes -= oldest.bytes;
            self.ledger.pop_front();
        }
        self.watchable_from = self.watchable_from.max(through);
        // The events it dropped leave memory with the next trim.
        self.trim(Instant::now());
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
        let (history_file_reads, history_file_events) = self.spill.as_ref().map_or((0, 0), |s| s.disk.reads());
        let (object_bytes, object_memory_bytes) =
            self.objects.values().fold((0, 0), |(bytes, memory), s| (bytes + s.packed.unpacked_len(), memory + s.packed.memory()));
        Retention {
            objects: self.objects.len(),
            object_bytes,
            object_memory_bytes,
            history_events: self.ledger.len(),
            history_bytes: self.history_bytes,
            history_memory_bytes: self.memory_bytes,
            watch_resumes: self.resumes.load(Ordering::Relaxed),
            history_file_reads,
            history_file_events,
            live_watchers: feeds.iter().map(|f| f.tx.receiver_count()).sum(),
            live_buffer_events: feeds.iter().map(|f| f.tx.len()).max().unwrap_or(0),
            limits: self.limits,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<KeyValue> {
        self.objects.get(key).map(|s| s.kv(key))
    }

    /// Every current object, in key order.
    pub(crate) fn all(&self) -> Vec<KeyValue> {
        self.objects.iter().map(|(k, s)| s.kv(k)).collect()
    }

    pub(crate) fn list<T: Listed>(&self, prefix: &str, start_after: Option<&str>, limit: Option<usize>) -> ListResult<T> {
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
            items.push(T::of_stored(k, v));
        }
        ListResult { items, revision: self.revision, more }
    }

    /// The list as it stood at revision `at`: the current objects with the retained writes after
    /// `at` undone. `Expired` when those writes are no longer all retained. `older` are the events
    /// under `prefix` after `at` up to revision `read_through` that were read from disk: when
    /// memory no longer holds every event after `read_through`, the answer asks for more.
    pub(crate) fn list_at<T: Listed>(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at: Revision,
        older: &[Arc<Event>],
        read_through: Revision,
    ) -> ListAt<T> {
        if at >= self.revision {
            return ListAt::Done(Ok(self.list(prefix, start_after, limit)));
        }
        if at < self.watchable_from {
            return ListAt::Done(Err(StoreError::Expired { requested: at, oldest: self.watchable_from }));
        }
        let read_through = read_through.max(at);
        if let Some(spill) = &self.spill
            && read_through < self.memory_from
        {
            return ListAt::Disk(spill.disk.clone(), read_through, self.memory_from);
        }
        let after = |k: &str| k.starts_with(prefix) && start_after.is_none_or(|a| k > a);
        // Newest first, so the value that stays for a key is the one before its first later write.
        let mut then: BTreeMap<&str, Option<&KeyValue>> = BTreeMap::new();
        let first_later = self.history.partition_point(|e| e.revision() <= read_through);
        let in_memory = self.history.range(first_later..).rev();
        for e in in_memory.chain(older.iter().rev().filter(|e| e.revision() > at)) {
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
                (Some((k, _)), Some((c, _))) if k.as_str() < *c => now.next().map(|(k, v)| Some(T::of_stored(k, v))),
                (Some((k, _)), Some((c, _))) if k.as_str() == *c => {
                    now.next();
                    changed.next().map(|(_, v)| v.map(T::of_written))
                }
                (Some(_), None) => now.next().map(|(k, v)| Some(T::of_stored(k, v))),
                _ => changed.next().map(|(_, v)| v.map(T::of_written)),
            };
            let Some(Some(kv)) = next else { continue };
            if limit.is_some_and(|l| items.len() >= l) {
                return ListAt::Done(Ok(ListResult { items, revision: at, more: true }));
            }
            items.push(kv);
        }
        ListAt::Done(Ok(ListResult { items, revision: at, more: false }))
    }

    pub(crate) fn count(&self, prefix: &str) -> usize {
        let from: (Bound<&str>, Bound<&str>) = (Bound::Included(prefix), Bound::Unbounded);
        self.objects.range::<str, _>(from).take_while(|(k, _)| k.starts_with(prefix)).count()
    }

    /// The retained events after `from` under `prefix`, and a live subscription that continues
    /// exactly where they end (taken under the same lock, so nothing falls between them).
    pub(crate) fn start_watch(&self, prefix: &str, from: Revision) -> Result<WatchStart, StoreError> {
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
        let older = match &self.spill {
            Some(spill) if from < self.memory_from => Some((spill.disk.clone(), self.memory_from)),
            _ => None,
        };
        let start = self.history.partition_point(|e| e.revision() <= from);
        let replay = self.history.range(start..).filter(|e| e.kv.key.starts_with(prefix)).cloned().collect();
        Ok(WatchStart { older, replay, rx })
    }
}
