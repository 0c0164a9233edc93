//! The embedded store: a write-ahead log in front of redb, checkpointed into it in the background.
//!
//! One committer thread owns every write. It takes all requests waiting in its channel as one
//! batch, checks each against the state, appends the batch's records to the log with one fsync,
//! and only then applies it to memory, notifies watchers and answers the callers. A small write
//! so costs one append and one fsync, shared with every write of its batch, instead of a B-tree
//! commit.
//!
//! Every five seconds (or once a segment holds half the in-memory history's budget, 2 MiB by
//! default: [`WalOptions::segment_bytes_for`]) the committer switches to the next log segment, which
//! a thread of its own has already created and synced (three fsyncs the committer never waits
//! for), and hands the writes of the old one to the checkpointer thread, which writes them into
//! redb in one transaction: the objects, the watch history (each event with the value before it)
//! and the revision. Once that commit is on disk the old segments are deleted. On open, redb
//! holds everything up to its revision and the log everything after: recovery replays the log's
//! complete records onto redb's state and history, so neither an acknowledged write nor the
//! history a watcher resumes from is lost to a `kill -9`, whether or not a checkpoint was running.
//!
//! While checkpoints fail (a full disk, an I/O error), the log keeps taking writes, up to
//! [`WalOptions::max_uncheckpointed_bytes`] beyond the last checkpoint; then writes are refused,
//! and readiness reports why, until a checkpoint (retried every second) succeeds.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, TableDefinition};

use crate::durable::{
    Health, Heartbeats, META, OBJECTS, Opened, RECOVERY_PROBE, REVISION_KEY, Reply, backend, check_batch, classify,
    gather_heartbeats, open_db, snapshot_of,
};
use crate::state::{DiskHistory, State, Write};
use crate::wal::{self, NextSegment, Record, Writer};
use crate::{Event, EventKind, HistoryLimits, KeyValue, Revision, Snapshot, StoreError};

/// Each retained event by revision: see `encode_event`.
const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
/// Identifies the log that belongs to this redb file: a file restored from a backup (which has
/// none) never replays the log of the file it replaced.
const EPOCH_KEY: &str = "wal_epoch";
/// Every event after this revision, up to the file's revision, is in `HISTORY`.
const HISTORY_FROM_KEY: &str = "history_from";

/// When the log is checkpointed into redb, and how far it may run ahead of redb. Tests make them
/// small to checkpoint constantly, or to reach the limit quickly.
#[derive(Debug, Clone, Copy)]
pub struct WalOptions {
    /// A segment this large is checkpointed. The writes since the last checkpoint stay in memory
    /// (the watch history lets none of them go before redb holds it), so under heavy writing this
    /// bounds how far the history runs above its in-memory limit: see [`WalOptions::segment_bytes_for`].
    pub segment_bytes: u64,
    /// A segment with records is checkpointed at least this often.
    pub checkpoint_interval: Duration,
    /// Bytes of log written since the last successful checkpoint beyond which writes are refused
    /// (503, or 507 when the disk is full, and `/readyz` false) until a checkpoint succeeds. While
    /// checkpoints fail, the log and the writes held for the checkpoint grow; this bounds them.
    pub max_uncheckpointed_bytes: u64,
    /// Writes that wait for company before their commit (none by default).
    pub heartbeats: Heartbeats,
}

impl WalOptions {
    /// The segment size for a watch history that keeps `history_memory_bytes` of objects in
    /// memory: half of it, from 1 to 16 MiB. Checkpoints come that much more often only while
    /// writes run faster than that many bytes a `checkpoint_interval`.
    pub fn segment_bytes_for(history_memory_bytes: usize) -> u64 {
        const MIB: u64 = 1024 * 1024;
        (history_memory_bytes as u64 / 2).clamp(MIB, 16 * MIB)
    }
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: Self::segment_bytes_for(HistoryLimits::default().memory_bytes),
            // An idle cluster's writes are its Lease renewals; every checkpoint is a redb commit
            // of the pages they touched, so checkpoints five seconds apart rewrite each page once
            // where one a second rewrote it five times (1,000 nodes renewing: the idle server 2.9%
            // of a core against 3.1%). Heavy writing is checkpointed by size long before this.
            checkpoint_interval: Duration::from_secs(5),
            // Many checkpoint intervals of writes at any rate measured, yet bounded; the log
            // holds each write once and the checkpointer's queue once more.
            max_uncheckpointed_bytes: 256 * 1024 * 1024,
            heartbeats: Heartbeats::default(),
        }
    }
}

/// What the committer tells the checkpointer: the writes logged since the last such message,
/// each with the time it was made (ms since the Unix epoch), which with the writes before them
/// are every write in segments up to `through`; those segments may go once redb has them.
/// `logged` counts the log's bytes up to there (see [`Backlog`]). The writes come with the
/// segment rather than one message per batch: a message per batch woke the checkpointer at every
/// write only to queue it.
struct ToCheckpoint {
    written: Vec<(Arc<Event>, u64)>,
    through: u64,
    history_from: Revision,
    logged: u64,
}

/// How far the log runs ahead of redb: shared by the committer, which refuses writes beyond
/// [`WalOptions::max_uncheckpointed_bytes`], and the threads that let it catch up.
#[derive(Default)]
struct Backlog {
    /// Of the bytes of records the committer has appended since the open, those a checkpoint has
    /// written into redb. The committer counts the appended ones itself.
    checkpointed: AtomicU64,
    /// Why the log is not being checkpointed, while it is not: the last checkpoint failed, or the
    /// next segment could not be prepared (without it, no segment is handed to a checkpoint).
    stalled: Mutex<Option<StoreError>>,
}

impl Backlog {
    fn stall(&self, cause: Option<StoreError>) {
        if let Ok(mut s) = self.stalled.lock() {
            *s = cause;
        }
    }
}

/// Opens (or creates) the redb file at `path` and its log, recovers every acknowledged write,
/// and starts the committer, checkpointer and segment-preparing threads. A second open of the
/// same file fails. Once every sender of the committer's queue is gone, the committer answers the
/// writes still queued, has the log checkpointed and stops (with it the segment-preparing
/// thread); the checkpointer stops after that checkpoint.
pub(crate) fn open(path: &Path, limits: HistoryLimits, options: WalOptions) -> Result<Opened, StoreError> {
    let db = open_db(path)?;
    let dir = wal::dir_of(path);
    let recovered = recover(&db, path, limits)?;
    let state = recovered.state;
    // Fold what the log held into redb now, so its segments can go before a new one starts.
    checkpoint(&db, &recovered.replayed, state.watchable_from(), recovered.epoch)?;
    remove_segments(&dir, recovered.last_seq)?;
    let (first, epoch) = (recovered.last_seq + 1, recovered.epoch);
    let writer = Writer::create(&dir, first, epoch, wal::FIRST_PREALLOCATE.min(options.segment_bytes))
        .map_err(|e| classify(&format!("creating a log segment in {}", dir.display()), &e.to_string()))?;
    tracing::info!(revision = state.revision, replayed = recovered.replayed.len(), "store opened");

    let file: DbSlot = Arc::new(RwLock::new(Some(Arc::new(db))));
    let mut state = state;
    // Everything up to here is in redb: the history's older events may leave memory.
    let revision = state.revision;
    state.spill_to(Arc::new(FileHistory { file: file.clone(), reads: AtomicU64::new(0), events: AtomicU64::new(0) }), revision);
    let state = Arc::new(RwLock::new(state));
    let health: Health = Arc::new(RwLock::new(None));
    let backlog = Arc::new(Backlog::default());
    let report = {
        let (backlog, dir) = (backlog.clone(), dir.clone());
        Box::new(move |outcome: Result<(), &std::io::Error>| match outcome {
            Ok(()) => {
                tracing::info!("the store's next log segment is ready again");
                backlog.stall(None);
            }
            Err(e) => {
                let failure = classify(&format!("preparing a log segment in {}", dir.display()), &e.to_string());
                tracing::warn!(error = %failure, "the current log segment grows until the next one can be made");
                backlog.stall(Some(failure));
            }
        })
    };
    let next = NextSegment::start(&dir, first + 1, epoch, options.segment_bytes, RECOVERY_PROBE, report)
        .map_err(|e| StoreError::Backend(format!("starting the log segment thread: {e}")))?;
    let (tx, rx) = mpsc::channel();
    let (ckpt_tx, ckpt_rx) = mpsc::channel();
    let db_path = path.to_path_buf();
    let checkpointer_backlog = backlog.clone();
    let checkpointer_state = state.clone();
    let checkpointer = thread::Builder::new()
        .name("store-checkpoint".into())
        .spawn(move || checkpoint_loop(&file, ckpt_rx, epoch, &db_path, &checkpointer_backlog, &checkpointer_state))
        .map_err(|e| StoreError::Backend(format!("starting checkpoint thread: {e}")))?;
    let committer = CommitLoop {
        writer,
        next,
        last_rotation: Instant::now(),
        logged: 0,
        written: Vec::new(),
        backlog,
        options,
        health: health.clone(),
        ckpt: ckpt_tx,
    };
    let committer_state = state.clone();
    let committer = thread::Builder::new()
        .name("store-committer".into())
        .spawn(move || committer.run(committer_state, rx))
        .map_err(|e| StoreError::Backend(format!("starting committer thread: {e}")))?;
    Ok(Opened { state, committer: tx, health, threads: vec![committer, checkpointer] })
}

/// The open redb file, shared by the checkpointer and the readers of the history on disk; `None`
/// while it is reopened after a failed checkpoint.
type DbSlot = Arc<RwLock<Option<Arc<Database>>>>;

/// The watch history in redb's `HISTORY` table, for the events that have left memory.
struct FileHistory {
    file: DbSlot,
    /// Reads so far, and the events they returned.
    reads: AtomicU64,
    events: AtomicU64,
}

impl DiskHistory for FileHistory {
    fn events(&self, prefix: &str, after: Revision, through: Revision) -> Result<Vec<Arc<Event>>, StoreError> {
        let db = self.file.read().ok().and_then(|f| f.clone()).ok_or_else(|| {
            StoreError::Unavailable("the store file is being reopened after a failed checkpoint".into())
        })?;
        let r = db.begin_read().map_err(backend("begin read"))?;
        let meta = r.open_table(META).map_err(backend("open meta"))?;
        let from = meta.get(HISTORY_FROM_KEY).map_err(backend("read meta"))?.map(|v| v.value());
        // A checkpoint may have dropped the start of the history since the caller looked.
        match from {
            Some(from) if from <= after => {}
            oldest => return Err(StoreError::Expired { requested: after, oldest: oldest.unwrap_or(through) }),
        }
        let table = r.open_table(HISTORY).map_err(backend("open history"))?;
        let mut events = Vec::new();
        let mut expected = after + 1;
        for entry in table.range(after + 1..=through).map_err(backend("scan history"))? {
            let (rev, raw) = entry.map_err(backend("scan history"))?;
            let damaged = || StoreError::Backend(format!("history event {} is damaged", rev.value()));
            if rev.value() != expected {
                return Err(damaged());
            }
            expected += 1;
            if !key_of_event(raw.value()).ok_or_else(damaged)?.starts_with(prefix.as_bytes()) {
                continue;
            }
            let (event, _) = decode_event(raw.value()).ok_or_else(damaged)?;
            events.push(Arc::new(event));
        }
        if expected != through + 1 {
            return Err(StoreError::Backend(format!(
                "the store file's history ends at revision {}, before revision {through}",
                expected - 1
            )));
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(events.len() as u64, Ordering::Relaxed);
        Ok(events)
    }

    fn reads(&self) -> (u64, u64) {
        (self.reads.load(Ordering::Relaxed), self.events.load(Ordering::Relaxed))
    }
}

/// Writes everything the log of the redb file at `path` holds into the file and removes the
/// log, so the redb-only engine can take the file over without losing a write.
pub(crate) fn fold_log(path: &Path) -> Result<(), StoreError> {
    let dir = wal::dir_of(path);
    if !dir.exists() {
        return Ok(());
    }
    let db = open_db(path)?;
    let recovered = recover(&db, path, HistoryLimits::default())?;
    checkpoint(&db, &recovered.replayed, recovered.state.watchable_from(), recovered.epoch)?;
    remove_segments(&dir, recovered.last_seq)?;
    // The redb-only engine keeps no history: drop it, so a later open with the log does not
    // resume watches across writes it never saw.
    let txn = db.begin_write().map_err(backend("begin write"))?;
    txn.delete_table(HISTORY).map_err(backend("drop history"))?;
    txn.open_table(META).map_err(backend("open meta"))?.remove(HISTORY_FROM_KEY).map_err(backend("meta"))?;
    txn.commit().map_err(backend("commit"))?;
    match fs::remove_dir(&dir) {
        // Gone already when it belonged to another file and was set aside.
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(StoreError::Backend(format!("removing {}: {e}", dir.display())))
        }
        _ => Ok(()),
    }
}

struct Recovered {
    state: State,
    epoch: u64,
    /// The log's writes after redb's revision, now in `state`.
    replayed: Vec<(Arc<Event>, u64)>,
    /// The newest segment read (0: none).
    last_seq: u64,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn meta_value(db: &Database, key: &str) -> Result<Option<u64>, StoreError> {
    let r = db.begin_read().map_err(backend("begin read"))?;
    match r.open_table(META) {
        Ok(meta) => Ok(meta.get(key).map_err(backend("read meta"))?.map(|v| v.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(StoreError::Backend(format!("open meta: {e}"))),
    }
}

/// Loads redb's objects and history, then replays the log's complete records after redb's
/// revision.
fn recover(db: &Database, path: &Path, limits: HistoryLimits) -> Result<Recovered, StoreError> {
    let w = db.begin_write().map_err(backend("begin write"))?;
    w.open_table(OBJECTS).map_err(backend("open objects"))?;
    w.open_table(META).map_err(backend("open meta"))?;
    w.open_table(HISTORY).map_err(backend("open history"))?;
    w.commit().map_err(backend("commit"))?;

    let snapshot = snapshot_of(db)?;
    let objects = snapshot.items.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
    let mut state = State::new(objects, snapshot.revision, limits);
    let (now, now_ms) = (Instant::now(), unix_ms(SystemTime::now()));
    let when = |ms: u64| now.checked_sub(Duration::from_millis(now_ms.saturating_sub(ms)));
    if let Some(from) = meta_value(db, HISTORY_FROM_KEY)? {
        let r = db.begin_read().map_err(backend("begin read"))?;
        let table = r.open_table(HISTORY).map_err(backend("open history"))?;
        let mut events = Vec::new();
        for entry in table.range(from + 1..).map_err(backend("scan history"))? {
            let (rev, raw) = entry.map_err(backend("scan history"))?;
            let (event, ms) = decode_event(raw.value())
                .ok_or_else(|| StoreError::Backend(format!("history event {} is damaged", rev.value())))?;
            // An event older than this machine's uptime is past any age limit anyway.
            if let Some(at) = when(ms) {
                events.push((Arc::new(event), at));
            }
        }
        state.restore_history(from, events);
    }

    let dir = wal::dir_of(path);
    let epoch = match meta_value(db, EPOCH_KEY)? {
        Some(e) => e,
        None => new_epoch(),
    };
    let segments = wal::read_log(&dir).map_err(|e| StoreError::Backend(format!("reading {}: {e}", dir.display())))?;
    let mut replayed = Vec::new();
    let mut last_seq = 0;
    for segment in segments {
        let (seg, scan) = (&segment.path, segment.scan);
        match scan.epoch {
            // A segment being prepared when the process died: nothing was written to it.
            None if segment.at_end && !scan.records_after_damage => {}
            Some(e) if e == epoch => {}
            None => return Err(damaged(seg, 0)),
            Some(_) => {
                set_aside(&dir)?;
                return Ok(Recovered { state, epoch, replayed: Vec::new(), last_seq: 0 });
            }
        }
        if scan.torn && scan.epoch.is_some() {
            if !segment.at_end || scan.records_after_damage {
                return Err(damaged(seg, scan.valid_len));
            }
            tracing::warn!(segment = %seg.display(), bytes = scan.torn_bytes, "cutting off a torn log tail");
        }
        for record in scan.records {
            if record.revision <= state.revision {
                continue; // already in redb: the checkpoint landed but the segment was not removed
            }
            if record.revision != state.revision + 1 {
                return Err(StoreError::Backend(format!(
                    "the store file is at revision {}, behind its log {}, which continues at revision {}: \
                     writes were lost (an older copy of the file?)",
                    state.revision,
                    seg.display(),
                    record.revision
                )));
            }
            let ms = record.unix_ms;
            let event = event_of(state.get(&record.key), record)?;
            let event = state.apply_at(event, when(ms).unwrap_or(now));
            replayed.push((event, ms));
        }
        // Every segment goes once redb holds its writes, those holding no record too.
        last_seq = segment.seq;
    }
    Ok(Recovered { state, epoch, replayed, last_seq })
}

fn damaged(segment: &Path, offset: u64) -> StoreError {
    StoreError::Backend(format!(
        "the store's log segment {} is damaged at byte {offset}, with acknowledged writes after it: the log \
         cannot be replayed past it; restore from a backup or snapshot",
        segment.display()
    ))
}

/// A log that belongs to another redb file (this one was restored from a backup): kept aside,
/// never replayed.
fn set_aside(dir: &Path) -> Result<(), StoreError> {
    let secs = unix_ms(SystemTime::now()) / 1000;
    let aside = dir.with_extension(format!("wal.orphaned-{secs}"));
    tracing::warn!(log = %dir.display(), moved_to = %aside.display(), "the store's log belongs to another file");
    fs::rename(dir, &aside).map_err(|e| StoreError::Backend(format!("moving {} aside: {e}", dir.display())))
}

fn new_epoch() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (u64::from(std::process::id()) << 32)).max(1)
}

/// The event a log record makes on its key's value just before it, `prev`.
fn event_of(prev: Option<KeyValue>, r: Record) -> Result<Event, StoreError> {
    let inconsistent = |what: &str| {
        StoreError::Backend(format!("the store's log {what} {} at revision {}, which does not match", r.key, r.revision))
    };
    let kv = |prev: &Option<KeyValue>, value: Bytes| KeyValue {
        key: r.key.clone(),
        value,
        create_revision: prev.as_ref().map_or(r.revision, |p| p.create_revision),
        mod_revision: r.revision,
    };
    match r.kind {
        EventKind::Created if prev.is_none() => {
            Ok(Event { kind: EventKind::Created, kv: kv(&prev, r.value.clone()), prev: None })
        }
        EventKind::Updated if prev.is_some() => {
            Ok(Event { kind: EventKind::Updated, kv: kv(&prev, r.value.clone()), prev })
        }
        EventKind::Deleted => match prev {
            Some(p) => Ok(Event { kind: EventKind::Deleted, kv: KeyValue { mod_revision: r.revision, ..p.clone() }, prev: Some(p) }),
            None => Err(inconsistent("deletes")),
        },
        EventKind::Created => Err(inconsistent("creates")),
        EventKind::Updated => Err(inconsistent("updates")),
    }
}

/// History value layout: kind, time (ms), then the value after the write (create and mod
/// revision, key, value) and, if there was one, the value before it (create and mod revision,
/// value). Integers little-endian; lengths u32.
fn encode_event(e: &Event, unix_ms: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + e.kv.key.len() + e.kv.value.len() + e.prev.as_ref().map_or(0, |p| p.value.len()));
    out.push(match e.kind {
        EventKind::Created => 0,
        EventKind::Updated => 1,
        EventKind::Deleted => 2,
    });
    out.extend_from_slice(&unix_ms.to_le_bytes());
    out.extend_from_slice(&e.kv.create_revision.to_le_bytes());
    out.extend_from_slice(&e.kv.mod_revision.to_le_bytes());
    out.extend_from_slice(&(e.kv.key.len() as u32).to_le_bytes());
    out.extend_from_slice(e.kv.key.as_bytes());
    out.extend_from_slice(&(e.kv.value.len() as u32).to_le_bytes());
    out.extend_from_slice(&e.kv.value);
    if let Some(p) = &e.prev {
        out.push(1);
        out.extend_from_slice(&p.create_revision.to_le_bytes());
        out.extend_from_slice(&p.mod_revision.to_le_bytes());
        out.extend_from_slice(&(p.value.len() as u32).to_le_bytes());
        out.extend_from_slice(&p.value);
    } else {
        out.push(0);
    }
    out
}

fn decode_event(b: &[u8]) -> Option<(Event, u64)> {
    struct Cur<'a>(&'a [u8]);
    impl Cur<'_> {
        fn take(&mut self, n: usize) -> Option<&[u8]> {
            let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
            self.0 = rest;
            Some(head)
        }
        fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }
        fn bytes(&mut self) -> Option<&[u8]> {
            let n = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
            self.take(n)
        }
    }
    let mut c = Cur(b);
    let kind = match c.take(1)?[0] {
        0 => EventKind::Created,
        1 => EventKind::Updated,
        2 => EventKind::Deleted,
        _ => return None,
    };
    let ms = c.u64()?;
    let (create_revision, mod_revision) = (c.u64()?, c.u64()?);
    let key = std::str::from_utf8(c.bytes()?).ok()?.to_string();
    let value = Bytes::copy_from_slice(c.bytes()?);
    let prev = match c.take(1)?[0] {
        1 => {
            let (create_revision, mod_revision) = (c.u64()?, c.u64()?);
            let value = Bytes::copy_from_slice(c.bytes()?);
            Some(KeyValue { key: key.clone(), value, create_revision, mod_revision })
        }
        _ => None,
    };
    Some((Event { kind, kv: KeyValue { key, value, create_revision, mod_revision }, prev }, ms))
}

/// The key of an encoded history event, without decoding its values.
fn key_of_event(b: &[u8]) -> Option<&[u8]> {
    // Kind, time, create and mod revision, then the key's length and the key.
    const KEY_LEN_AT: usize = 1 + 8 + 8 + 8;
    let len = u32::from_le_bytes(b.get(KEY_LEN_AT..KEY_LEN_AT + 4)?.try_into().ok()?) as usize;
    b.get(KEY_LEN_AT + 4..KEY_LEN_AT + 4 + len)
}

/// Writes `events` into redb in one transaction (objects, history, revision), drops the history
/// at or before `history_from`, and records the log's epoch.
fn checkpoint(db: &Database, events: &[(Arc<Event>, u64)], history_from: Revision, epoch: u64) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(backend("begin write"))?;
    {
        let mut objects = txn.open_table(OBJECTS).map_err(backend("open objects"))?;
        let mut history = txn.open_table(HISTORY).map_err(backend("open history"))?;
        // Only a key's last write of the batch goes into the objects table: a pod created, bound
        // and started within a second is written there once, not three times. History keeps each.
        let mut last = HashMap::with_capacity(events.len());
        for (i, (event, _)) in events.iter().enumerate() {
            last.insert(event.kv.key.as_str(), i);
        }
        for (i, (event, ms)) in events.iter().enumerate() {
            if last.get(event.kv.key.as_str()) == Some(&i) {
                match event.kind {
                    EventKind::Deleted => {
                        objects.remove(event.kv.key.as_str()).map_err(backend("remove"))?;
                    }
                    _ => {
                        let raw = crate::durable::encode(&event.kv);
                        objects.insert(event.kv.key.as_str(), raw.as_slice()).map_err(backend("insert"))?;
                    }
                }
            }
            if event.revision() > history_from {
                history.insert(event.revision(), encode_event(event, *ms).as_slice()).map_err(backend("history"))?;
            }
        }
        history.retain_in(..=history_from, |_, _| false).map_err(backend("trim history"))?;
        let mut meta = txn.open_table(META).map_err(backend("open meta"))?;
        if let Some((last, _)) = events.last() {
            meta.insert(REVISION_KEY, last.revision()).map_err(backend("write revision"))?;
        }
        meta.insert(HISTORY_FROM_KEY, history_from).map_err(backend("write history start"))?;
        meta.insert(EPOCH_KEY, epoch).map_err(backend("write epoch"))?;
    }
    txn.commit().map_err(|e| classify("checkpoint", &e.to_string()))
}

/// Deletes the segments up to `through`: redb holds their writes.
fn remove_segments(dir: &Path, through: u64) -> Result<(), StoreError> {
    let segments = wal::segments(dir).map_err(|e| StoreError::Backend(format!("reading {}: {e}", dir.display())))?;
    let mut removed = false;
    for (seq, path) in segments {
        if seq <= through {
            fs::remove_file(&path).map_err(|e| StoreError::Backend(format!("removing {}: {e}", path.display())))?;
            removed = true;
        }
    }
    if removed {
        wal::sync_dir(dir).map_err(|e| StoreError::Backend(format!("syncing {}: {e}", dir.display())))?;
    }
    Ok(())
}

/// Writes the log's writes into redb whenever the committer hands over a segment. A checkpoint
/// that fails is tried again every [`RECOVERY_PROBE`] even when no write comes (the committer may
/// be refusing them until one succeeds), and the next one takes everything since the last success.
fn checkpoint_loop(
    file: &DbSlot,
    rx: mpsc::Receiver<ToCheckpoint>,
    epoch: u64,
    path: &Path,
    backlog: &Backlog,
    state: &RwLock<State>,
) {
    let dir = wal::dir_of(path);
    let mut pending: Vec<(Arc<Event>, u64)> = Vec::new();
    // The newest checkpoint asked for, until one succeeds; and when to try again after a failure.
    let mut due: Option<(u64, Revision, u64)> = None;
    let mut retry_at: Option<Instant> = None;
    loop {
        let message = match retry_at {
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match message {
            Ok(ToCheckpoint { written, through, history_from, logged }) => {
                pending.extend(written);
                due = Some((through, history_from, logged));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // The store is closed: let go of the file, so it can be opened again at once.
                if let Ok(mut f) = file.write() {
                    *f = None;
                }
                return;
            }
        }
        let Some((through, history_from, logged)) = due else { continue };
        // redb refuses every write after an I/O error until it is reopened: a handle that
        // failed is let go, and the next try opens the file anew.
        let current = file.read().ok().and_then(|f| f.clone());
        let handle = match current {
            Some(handle) => Ok(handle),
            None => open_db(path).map(Arc::new).map_err(|e| classify("reopening the store file", &e.to_string())),
        };
        let started = Instant::now();
        let outcome = handle.and_then(|h| checkpoint(&h, &pending, history_from, epoch).map(|()| h));
        match outcome {
            Ok(handle) => {
                if let Ok(mut f) = file.write() {
                    *f = Some(handle);
                }
                tracing::debug!(writes = pending.len(), took = ?started.elapsed(), "store checkpoint");
                if let Some((last, _)) = pending.last()
                    && let Ok(mut s) = state.write()
                {
                    s.durable_through(last.revision());
                }
                pending.clear();
                (due, retry_at) = (None, None);
                backlog.checkpointed.store(logged, Ordering::Release);
                backlog.stall(None);
                if let Err(e) = remove_segments(&dir, through) {
                    tracing::warn!(error = %e, "removing checkpointed log segments");
                }
            }
            // The segments stay: the next checkpoint takes all of it.
            Err(e) => {
                if let Ok(mut f) = file.write() {
                    *f = None;
                }
                tracing::warn!(error = %e, writes = pending.len(), "store checkpoint failed; retrying in a second");
                backlog.stall(Some(e));
                retry_at = Some(Instant::now() + RECOVERY_PROBE);
            }
        }
    }
}

struct CommitLoop {
    writer: Writer,
    /// Dropped before `ckpt`: its thread is stopped before the checkpointer lets go of redb, so
    /// a store reopened in the same process never races it for a segment number.
    next: NextSegment,
    last_rotation: Instant,
    /// Bytes of records appended since the open; `backlog` says how many of them redb holds.
    logged: u64,
    /// The writes logged since the last segment was handed to the checkpointer.
    written: Vec<(Arc<Event>, u64)>,
    backlog: Arc<Backlog>,
    options: WalOptions,
    health: Health,
    ckpt: mpsc::Sender<ToCheckpoint>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl CommitLoop {
    fn set_health(&self, failure: Option<StoreError>) {
        if let Ok(mut h) = self.health.write() {
            if failure.is_none() && h.is_some() {
                tracing::info!("store writes again");
            }
            *h = failure;
        }
    }

    /// The answer to every write while the log is too far ahead of redb.
    fn backlog_refusal(&self) -> Option<StoreError> {
        let behind = self.logged.saturating_sub(self.backlog.checkpointed.load(Ordering::Acquire));
        if behind < self.options.max_uncheckpointed_bytes {
            return None;
        }
        let cause = self.backlog.stalled.lock().ok().and_then(|c| c.clone());
        let why = match &cause {
            Some(e) => format!("checkpoints fail: {e}"),
            None => "checkpoints are behind".to_string(),
        };
        let message = format!(
            "the store refuses writes until a checkpoint succeeds: {} of its log are not in its redb file yet, \
             the most it keeps ({why})",
            mib(behind)
        );
        Some(match cause {
            Some(StoreError::NoSpace(_)) => StoreError::NoSpace(message),
            _ => StoreError::Unavailable(message),
        })
    }

    /// Switches to the prepared segment and has the old ones checkpointed. Without one ready
    /// yet, the current segment grows a little longer: the committer never makes a segment.
    fn rotate(&mut self, state: &RwLock<State>) {
        if self.writer.is_broken() || !self.writer.has_records() {
            return;
        }
        let Some(next) = self.next.take(self.writer.len) else { return };
        let through = std::mem::replace(&mut self.writer, next).seq;
        self.last_rotation = Instant::now();
        self.checkpoint_through(through, state);
    }

    fn checkpoint_through(&mut self, through: u64, state: &RwLock<State>) {
        let history_from = state.read().map_or(0, |s| s.watchable_from());
        let written = std::mem::take(&mut self.written);
        let _ = self.ckpt.send(ToCheckpoint { written, through, history_from, logged: self.logged });
    }

    fn run(mut self, state: Arc<RwLock<State>>, rx: mpsc::Receiver<(Write, Reply)>) {
        loop {
            let failing = self.health.read().map(|h| h.is_some()).unwrap_or(false);
            let wait = if failing { RECOVERY_PROBE } else { self.options.checkpoint_interval };
            let first = match rx.recv_timeout(wait) {
                Ok(w) => w,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if failing && self.writer.reset().is_ok() {
                        self.set_health(self.backlog_refusal());
                    }
                    self.rotate(&state);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Leave redb up to date for the next open: the current segment is done with.
                    if self.writer.has_records() {
                        self.checkpoint_through(self.writer.seq, &state);
                    }
                    return;
                }
            };
            let batch = gather_heartbeats(first, &rx, self.options.heartbeats);
            if let Some(refusal) = self.backlog_refusal() {
                if !failing {
                    tracing::error!(error = %refusal, "store log backlog at its limit");
                }
                self.set_health(Some(refusal.clone()));
                for (_, reply) in batch {
                    let _ = reply.send(Err(refusal.clone()));
                }
                continue;
            }
            let accepted = {
                let Ok(s) = state.read() else { return };
                check_batch(&s, batch)
            };
            if accepted.is_empty() {
                continue;
            }

            let ms = unix_ms(SystemTime::now());
            let mut records = Vec::with_capacity(accepted.iter().map(|(e, _)| 64 + e.kv.key.len() + e.kv.value.len()).sum());
            for (event, _) in &accepted {
                wal::encode(&mut records, event, ms);
            }
            if let Err(e) = self.writer.append(&records) {
                let failure = classify("appending to the store's log", &e.to_string());
                let answer = match self.writer.reset() {
                    Ok(()) => failure,
                    Err(reset) => {
                        let message =
                            format!("{failure}; the log cannot be cut back ({reset}), so the outcome is unknown");
                        match failure {
                            StoreError::NoSpace(_) => StoreError::NoSpace(message),
                            _ => StoreError::Unavailable(message),
                        }
                    }
                };
                tracing::error!(error = %answer, "store log append failed; rejecting {} writes", accepted.len());
                self.set_health(Some(answer.clone()));
                for (_, reply) in accepted {
                    let _ = reply.send(Err(answer.clone()));
                }
                continue;
            }
            self.logged += records.len() as u64;
            // Readiness turns false as soon as the backlog reaches its limit, not at the next write.
            let refusal = self.backlog_refusal();
            if failing || refusal.is_some() {
                self.set_health(refusal);
            }

            let now = Instant::now();
            let Ok(mut s) = state.write() else { return };
            let mut replies = Vec::with_capacity(accepted.len());
            for (event, reply) in accepted {
                replies.push((event.kv.clone(), reply));
                self.written.push((s.apply_at(event, now), ms));
            }
            drop(s);
            for (kv, reply) in replies {
                let _ = reply.send(Ok(kv));
            }
            if self.writer.len >= self.options.segment_bytes
                || self.last_rotation.elapsed() >= self.options.checkpoint_interval
            {
                self.rotate(&state);
            }
        }
    }
}

/// The log's writes after `snapshot`'s revision, applied to it: what a reader of a file no
/// process holds must see. Changes nothing on disk.
pub(crate) fn overlay_log(path: &Path, db: &impl ReadableDatabase, snapshot: &mut Snapshot) -> Result<(), StoreError> {
    let r = db.begin_read().map_err(backend("begin read"))?;
    let epoch = match r.open_table(META) {
        Ok(meta) => meta.get(EPOCH_KEY).map_err(backend("read meta"))?.map(|v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(StoreError::Backend(format!("open meta: {e}"))),
    };
    let Some(epoch) = epoch else { return Ok(()) };
    let dir = wal::dir_of(path);
    let segments = wal::read_log(&dir).map_err(|e| StoreError::Backend(format!("reading {}: {e}", dir.display())))?;
    let mut objects: BTreeMap<String, KeyValue> =
        std::mem::take(&mut snapshot.items).into_iter().map(|kv| (kv.key.clone(), kv)).collect();
    for segment in segments {
        let (seg, scan) = (&segment.path, segment.scan);
        if scan.epoch.is_some_and(|e| e != epoch) {
            break;
        }
        if ((scan.torn || scan.epoch.is_none()) && !segment.at_end) || scan.records_after_damage {
            return Err(damaged(seg, scan.valid_len));
        }
        for record in scan.records {
            if record.revision <= snapshot.revision {
                continue;
            }
            if record.revision != snapshot.revision + 1 {
                return Err(StoreError::Backend(format!("the store's log {} has a gap", seg.display())));
            }
            snapshot.revision = record.revision;
            let event = event_of(objects.get(&record.key).cloned(), record)?;
            match event.kind {
                EventKind::Deleted => objects.remove(&event.kv.key),
                _ => objects.insert(event.kv.key.clone(), event.kv),
            };
        }
    }
    snapshot.items = objects.into_values().collect();
    Ok(())
}
