//! The redb-only engine (the embedded store before its write-ahead log): every batch of writes
//! is a redb commit. Kept selectable for comparison; its file format is the embedded store's.
//!
//! One committer thread owns every write. It takes all requests waiting in its channel as one
//! batch, checks each against the state (and the earlier writes of the batch), writes the batch
//! in one redb transaction, fsyncs it, and only then applies it to memory, notifies watchers and
//! answers the callers. So an acknowledged write is on disk, a reader never sees a write that is
//! not, and N concurrent writers cost about one fsync rather than N.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use crate::snapshot::Snapshot;
use crate::state::{State, Write};
use crate::{Event, EventKind, HistoryLimits, KeyValue, Revision, StoreError};

pub(crate) const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const REVISION_KEY: &str = "revision";
/// Upper bound on writes sharing one commit, so one batch cannot hold up its first writer forever.
pub(crate) const MAX_BATCH: usize = 4096;
/// redb's page cache, by default. Every read is served from the in-memory state, and writes reach
/// the file in the background checkpoint's large batches, so redb's cache saves little: at
/// 10,000 pods the checkpoint thread spent 1.79 s of CPU with 16 MiB, 1.74 s with 4 MiB and
/// 1.55 s with 1 MiB, while the control plane's resident memory grew with the cache (its 1 GiB
/// default would grow towards a second copy of every object; BENCHMARKS.md section 3, 4, 5).
pub const DEFAULT_REDB_CACHE_BYTES: usize = 4 * 1024 * 1024;

static REDB_CACHE_BYTES: AtomicUsize = AtomicUsize::new(DEFAULT_REDB_CACHE_BYTES);

/// Sets redb's page cache for the store files this process opens from now on (a server option,
/// like the history limits, but one that every opener of the file shares: backups and restores
/// open it too).
pub fn set_redb_cache_bytes(bytes: usize) {
    REDB_CACHE_BYTES.store(bytes, Ordering::Relaxed);
}

pub(crate) type Reply = oneshot::Sender<Result<KeyValue, StoreError>>;

/// Where writes go: the committer thread's queue.
pub(crate) type Committer = mpsc::Sender<(Write, Reply)>;

/// `first` and every write waiting behind it, up to [`MAX_BATCH`]: what one commit takes.
pub(crate) fn gather(first: (Write, Reply), rx: &mpsc::Receiver<(Write, Reply)>) -> Vec<(Write, Reply)> {
    let mut batch = vec![first];
    take_waiting(&mut batch, rx);
    batch
}

/// Adds the writes waiting in `rx` to `batch`, up to [`MAX_BATCH`] in all.
fn take_waiting(batch: &mut Vec<(Write, Reply)>, rx: &mpsc::Receiver<(Write, Reply)>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(w) => batch.push(w),
            Err(_) => break,
        }
    }
}

/// Like [`gather`], but a batch of heartbeat writes only (keys under `heartbeats.prefix`) waits up
/// to `heartbeats.wait` for more writes to share its commit; any other write ends the wait.
pub(crate) fn gather_heartbeats(
    first: (Write, Reply),
    rx: &mpsc::Receiver<(Write, Reply)>,
    heartbeats: Heartbeats,
) -> Vec<(Write, Reply)> {
    let mut batch = gather(first, rx);
    if heartbeats.prefix.is_empty() || heartbeats.wait.is_zero() {
        return batch;
    }
    let beat = |(w, _): &(Write, Reply)| w.key().starts_with(heartbeats.prefix);
    if !batch.iter().all(beat) {
        return batch;
    }
    let deadline = Instant::now() + heartbeats.wait;
    while batch.len() < MAX_BATCH {
        // The time is up (or the store is closing): commit what came.
        let Ok(w) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else { break };
        let ends_wait = !beat(&w);
        batch.push(w);
        if ends_wait {
            take_waiting(&mut batch, rx);
            break;
        }
    }
    batch
}

/// Writes that may wait a little for company before they are committed: each commit is an
/// `fdatasync`, and heartbeats (node Leases, renewed by every node every few seconds) arrive one
/// by one, so without a wait nearly every renewal costs the disk a flush of its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct Heartbeats {
    /// Keys that start with this are heartbeats; empty: none are.
    pub prefix: &'static str,
    /// The longest a batch of heartbeats alone waits for more writes.
    pub wait: Duration,
}

/// Checks each write of `batch` against `state` as the writes before it in the batch left it, and
/// numbers the accepted ones from the next revision; a refused write is answered at once and takes
/// no revision. Only the committer thread changes the state, so it cannot move meanwhile.
pub(crate) fn check_batch(state: &State, batch: Vec<(Write, Reply)>) -> Vec<(Event, Reply)> {
    let mut accepted = Vec::with_capacity(batch.len());
    let mut pending: BTreeMap<String, Option<KeyValue>> = BTreeMap::new();
    let mut rev = state.revision;
    for (w, reply) in batch {
        match state.prepare(w, rev + 1, &pending) {
            Ok(event) => {
                rev += 1;
                let after = (event.kind != EventKind::Deleted).then(|| event.kv.clone());
                pending.insert(event.kv.key.clone(), after);
                accepted.push((event, reply));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
    accepted
}

/// An open on-disk store: the state its reads are served from, the queue to its committer, its
/// health, and its threads, which stop once every sender of the queue is gone.
pub(crate) struct Opened {
    pub(crate) state: Arc<RwLock<State>>,
    pub(crate) committer: Committer,
    pub(crate) health: Health,
    pub(crate) threads: Vec<thread::JoinHandle<()>>,
}

/// Whether the store can write: `None` while commits succeed, else the failure that stops them.
/// The committer sets and clears it; `/readyz` reads it.
pub(crate) type Health = Arc<RwLock<Option<StoreError>>>;

/// How often a store that cannot write tries again on its own (reopening redb and committing an
/// unchanged revision), so writes and readiness come back once the disk has room.
pub(crate) const RECOVERY_PROBE: Duration = Duration::from_secs(1);
/// How long a batch whose commit failed waits for the file to be reopened and read back before
/// its writers are answered "outcome unknown".
const RECOVERY_WAIT: Duration = Duration::from_secs(2);

/// Opens (or creates) the redb file at `path`, loads it, and starts the committer thread that
/// will own every write. A second open of the same file fails with a clear error.
pub(crate) fn open(path: &Path, limits: HistoryLimits) -> Result<Opened, StoreError> {
    let owned = path.to_path_buf();
    open_with(Box::new(move || open_db(&owned)), limits, RECOVERY_WAIT)
}

/// Opens the redb file anew; called again after every failed commit.
type Opener = Box<dyn Fn() -> Result<Database, StoreError> + Send>;

fn open_with(opener: Opener, limits: HistoryLimits, recovery_wait: Duration) -> Result<Opened, StoreError> {
    let db = opener()?;
    let (objects, revision) = load(&db)?;
    let state = Arc::new(RwLock::new(State::new(objects, revision, limits)));
    let health: Health = Arc::new(RwLock::new(None));
    let (tx, rx) = mpsc::channel();
    let disk = Disk { opener, db: Some(db), unresolved: None, health: health.clone(), recovery_wait };
    let committer_state = state.clone();
    let committer = thread::Builder::new()
        .name("store-committer".into())
        .spawn(move || commit_loop(disk, committer_state, rx))
        .map_err(|e| StoreError::Backend(format!("starting committer thread: {e}")))?;
    Ok(Opened { state, committer: tx, health, threads: vec![committer] })
}

/// Runs `f` on the file at `path`, turning a panic inside the storage library (a file damaged
/// in a way it does not check for) into an error that says the file is damaged.
pub(crate) fn without_panics<T>(path: &Path, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(StoreError::Backend(format!("{} is damaged: the storage library failed reading it ({what})", path.display())))
    })
}

/// Copies the file at `path` beside it, checks every page of the copy, removes the copy.
pub(crate) fn check_integrity(path: &Path) -> Result<(), StoreError> {
    let copy = path.with_extension("redb.checking");
    let _ = std::fs::remove_file(&copy);
    std::fs::copy(path, &copy).map_err(|e| StoreError::Backend(format!("copying {} to check it: {e}", path.display())))?;
    let checked = without_panics(path, || {
        let mut db = Database::builder().create(&copy).map_err(|e| StoreError::Backend(format!("opening {}: {e}", path.display())))?;
        match db.check_integrity() {
            Ok(true) => Ok(()),
            Ok(false) => Err(StoreError::Backend(format!(
                "{} failed its integrity check (redb could repair its copy: committed data may be missing)",
                path.display()
            ))),
            Err(e) => Err(StoreError::Backend(format!("{} failed its integrity check: {e}", path.display()))),
        }
    });
    let _ = std::fs::remove_file(&copy);
    checked
}

pub(crate) fn open_db(path: &Path) -> Result<Database, StoreError> {
    Database::builder().set_cache_size(REDB_CACHE_BYTES.load(Ordering::Relaxed)).create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
            "{} is already open in another Shepherd process; stop it or use another --data-dir",
            path.display()
        )),
        e => StoreError::Backend(format!("opening {}: {e}", path.display())),
    })
}

pub(crate) fn backend<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Backend(format!("{what}: {e}"))
}

fn load(db: &Database) -> Result<(BTreeMap<String, KeyValue>, Revision), StoreError> {
    // Create the tables on first open so later reads find them.
    let w = db.begin_write().map_err(backend("begin write"))?;
    w.open_table(OBJECTS).map_err(backend("open objects"))?;
    w.open_table(META).map_err(backend("open meta"))?;
    w.commit().map_err(backend("commit"))?;
    let snapshot = snapshot_of(db)?;
    Ok((snapshot.items.into_iter().map(|kv| (kv.key.clone(), kv)).collect(), snapshot.revision))
}

/// The revision a read transaction sees (0 in a file that has none yet).
pub(crate) fn revision_in(r: &redb::ReadTransaction) -> Result<Revision, StoreError> {
    match r.open_table(META) {
        Ok(meta) => Ok(meta.get(REVISION_KEY).map_err(backend("read revision"))?.map(|v| v.value()).unwrap_or(0)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(StoreError::Backend(format!("open meta: {e}"))),
    }
}

/// Stored value layout: create revision (8 bytes LE), mod revision (8 bytes LE), then the value.
pub(crate) fn encode(kv: &KeyValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + kv.value.len());
    out.extend_from_slice(&kv.create_revision.to_le_bytes());
    out.extend_from_slice(&kv.mod_revision.to_le_bytes());
    out.extend_from_slice(&kv.value);
    out
}

pub(crate) fn decode(key: &str, raw: &[u8]) -> Result<KeyValue, StoreError> {
    if raw.len() < 16 {
        return Err(StoreError::Backend(format!("stored value of {key} is truncated")));
    }
    let (c, rest) = raw.split_at(8);
    let (m, value) = rest.split_at(8);
    let rev = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Ok(KeyValue { key: key.to_string(), value: Bytes::copy_from_slice(value), create_revision: rev(c), mod_revision: rev(m) })
}

/// The redb file as the committer sees it.
///
/// The rule for a failed commit (the lesson of PostgreSQL's fsync bug: after an I/O error the
/// file's state is unknown, and retrying on the same handle can report success for data that is
/// not there): memory never takes a write before its commit succeeded, and a failed commit is
/// never retried on the handle that failed. The file is closed and reopened, and its revision
/// read back decides what happened: the batch's last revision means the commit did land (its
/// writers are answered success), the revision before it means it did not (they get the error).
/// If the file cannot be reopened in time, the writers are told the outcome is unknown and the
/// batch is remembered; when the file opens again, any of it that landed is rolled back to the
/// state in memory, so a write answered with an error never appears later.
struct Disk {
    opener: Opener,
    /// `None` after a failure, until the file is reopened.
    db: Option<Database>,
    /// A batch whose writers were answered with an error while the file's state was unknown.
    unresolved: Option<Unresolved>,
    health: Health,
    recovery_wait: Duration,
}

/// The keys a failed batch wrote and the revision the file had before it.
struct Unresolved {
    keys: Vec<String>,
    revision_before: Revision,
}

impl Disk {
    fn set_health(&self, failure: Option<StoreError>) {
        if let Ok(mut h) = self.health.write() {
            if failure.is_none() && h.is_some() {
                tracing::info!("store writes again");
            }
            *h = failure;
        }
    }

    /// Reopens the file if a failure closed it, settling an unresolved batch against `state`.
    fn ensure_open(&mut self, state: &State) -> Result<&Database, StoreError> {
        if self.db.is_none() {
            let db = (self.opener)().map_err(|e| classify("reopening the store", &e.to_string()))?;
            if let Some(u) = &self.unresolved {
                roll_back(&db, u, state)?;
                tracing::warn!(revision = u.revision_before, "rolled back a batch whose writers were told it failed");
            }
            self.unresolved = None;
            self.db = Some(db);
        }
        self.db.as_ref().ok_or(StoreError::Closed)
    }

    /// Commits an unchanged revision: proves the file can take a write again.
    fn probe(&mut self, state: &State) -> Result<(), StoreError> {
        let db = self.ensure_open(state)?;
        let result = (|| {
            let txn = db.begin_write().map_err(backend("begin write"))?;
            txn.open_table(META)
                .map_err(backend("open meta"))?
                .insert(REVISION_KEY, state.revision)
                .map_err(backend("write revision"))?;
            txn.commit().map_err(backend("commit"))
        })();
        if let Err(e) = &result {
            self.db = None;
            return Err(classify("store probe", &e.to_string()));
        }
        result
    }
}

/// What a writer is told when the disk fails it: 507-style for a full disk, else 503.
pub(crate) fn classify(what: &str, message: &str) -> StoreError {
    let no_space = message.contains("No space left on device") || message.contains("Disk quota exceeded");
    if no_space {
        StoreError::NoSpace(format!("{what}: no space left on the store's disk ({message})"))
    } else {
        StoreError::Unavailable(format!("{what}: {message}"))
    }
}

/// Reads the revision the file holds.
fn disk_revision(db: &Database) -> Result<Revision, StoreError> {
    revision_in(&db.begin_read().map_err(backend("begin read"))?)
}

/// Puts the keys of an unresolved batch back to their values in memory, when the batch landed.
fn roll_back(db: &Database, u: &Unresolved, state: &State) -> Result<(), StoreError> {
    if disk_revision(db)? == u.revision_before {
        return Ok(());
    }
    let txn = db.begin_write().map_err(backend("begin write"))?;
    {
        let mut objects = txn.open_table(OBJECTS).map_err(backend("open objects"))?;
        for key in &u.keys {
            match state.get(key) {
                Some(kv) => objects.insert(key.as_str(), encode(&kv).as_slice()).map(drop),
                None => objects.remove(key.as_str()).map(drop),
            }
            .map_err(backend("roll back"))?;
        }
        let mut meta = txn.open_table(META).map_err(backend("open meta"))?;
        meta.insert(REVISION_KEY, u.revision_before).map_err(backend("write revision"))?;
    }
    txn.commit().map_err(|e| classify("rolling back a failed batch", &e.to_string()))
}

fn commit_loop(mut disk: Disk, state: Arc<RwLock<State>>, rx: mpsc::Receiver<(Write, Reply)>) {
    loop {
        let failing = disk.health.read().map(|h| h.is_some()).unwrap_or(false);
        let first = if failing {
            match rx.recv_timeout(RECOVERY_PROBE) {
                Ok(w) => w,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let Ok(s) = state.read() else { return };
                    let outcome = disk.probe(&s);
                    drop(s);
                    if outcome.is_ok() {
                        disk.set_health(None);
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(w) => w,
                Err(_) => return,
            }
        };
        let batch = gather(first, &rx);
        let (revision_before, accepted) = {
            let Ok(s) = state.read() else { return };
            (s.revision, check_batch(&s, batch))
        };
        if accepted.is_empty() {
            continue;
        }

        let committed = {
            let Ok(s) = state.read() else { return };
            commit(&mut disk, &s, &accepted, revision_before)
        };
        if let Err(e) = committed {
            tracing::error!(error = %e, "store commit failed; rejecting {} writes", accepted.len());
            disk.set_health(Some(e.clone()));
            for (_, reply) in accepted {
                let _ = reply.send(Err(e.clone()));
            }
            continue;
        }
        disk.set_health(None);

        let Ok(mut s) = state.write() else { return };
        let mut replies = Vec::with_capacity(accepted.len());
        for (event, reply) in accepted {
            replies.push((event.kv.clone(), reply));
            s.apply(event);
        }
        drop(s);
        for (kv, reply) in replies {
            let _ = reply.send(Ok(kv));
        }
    }
}

/// Commits a batch; on failure, finds out from a reopened file whether it landed after all.
fn commit(disk: &mut Disk, state: &State, accepted: &[(Event, Reply)], revision_before: Revision) -> Result<(), StoreError> {
    let db = disk.ensure_open(state)?;
    let Err(e) = persist(db, accepted) else { return Ok(()) };
    let failure = classify("commit", &e.to_string());
    // Never reuse the handle that failed: its view of the file may not be the file's.
    disk.db = None;
    let last = accepted.last().map_or(revision_before, |(ev, _)| ev.revision());
    let deadline = Instant::now() + disk.recovery_wait;
    loop {
        match (disk.opener)().and_then(|db| disk_revision(&db).map(|r| (db, r))) {
            Ok((db, r)) if r == last => {
                tracing::warn!(revision = r, "a commit that reported {e} is on disk; keeping it");
                disk.db = Some(db);
                return Ok(());
            }
            Ok((db, r)) if r == revision_before => {
                disk.db = Some(db);
                return Err(failure);
            }
            Ok((_, r)) => {
                // Neither before nor after: not a state this process wrote. Stop writing.
                return Err(StoreError::Unavailable(format!(
                    "the store file is at revision {r}, expected {revision_before} or {last}; restart to reload it"
                )));
            }
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
            Err(reopen) => {
                disk.unresolved = Some(Unresolved {
                    keys: accepted.iter().map(|(ev, _)| ev.kv.key.clone()).collect(),
                    revision_before,
                });
                let message = format!("{failure}; the store cannot be reopened ({reopen}), so this write was not applied");
                return Err(match failure {
                    StoreError::NoSpace(_) => StoreError::NoSpace(message),
                    _ => StoreError::Unavailable(message),
                });
            }
        }
    }
}

fn persist(db: &Database, accepted: &[(Event, Reply)]) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(backend("begin write"))?;
    {
        let mut objects = txn.open_table(OBJECTS).map_err(backend("open objects"))?;
        for (event, _) in accepted {
            match event.kind {
                EventKind::Deleted => {
                    objects.remove(event.kv.key.as_str()).map_err(backend("remove"))?;
                }
                _ => {
                    objects.insert(event.kv.key.as_str(), encode(&event.kv).as_slice()).map_err(backend("insert"))?;
                }
            }
        }
        let mut meta = txn.open_table(META).map_err(backend("open meta"))?;
        if let Some((last, _)) = accepted.last() {
            meta.insert(REVISION_KEY, last.revision()).map_err(backend("write revision"))?;
        }
    }
    // Durability::Immediate is redb's default: commit returns after fsync.
    txn.commit().map_err(backend("commit"))
}

/// Reads every object of the redb file at `path` at its last committed revision, changing
/// nothing but what a start would repair. Fails if another process holds the file open.
pub(crate) fn read_snapshot(path: &Path) -> Result<Snapshot, StoreError> {
    if !path.exists() {
        return Err(StoreError::Backend(format!("{} does not exist", path.display())));
    }
    let opened = |e: redb::DatabaseError| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
            "{} is held by a running Shepherd process; back it up through its API (--server) instead",
            path.display()
        )),
        e => StoreError::Backend(format!("opening {}: {e}", path.display())),
    };
    // The writes in the log that a checkpoint has not moved into the file yet count too.
    fn with_log(path: &Path, db: &impl ReadableDatabase) -> Result<Snapshot, StoreError> {
        let mut snapshot = snapshot_of(db)?;
        crate::embedded::overlay_log(path, db, &mut snapshot)?;
        Ok(snapshot)
    }
    match redb::ReadOnlyDatabase::open(path) {
        Ok(db) => with_log(path, &db),
        // A process that was killed leaves the file needing a repair of redb's allocation state
        // (committed data is intact); only a writable open performs it, as the next start would.
        Err(redb::DatabaseError::RepairAborted) => with_log(path, &Database::open(path).map_err(opened)?),
        Err(e) => Err(opened(e)),
    }
}

pub(crate) fn snapshot_of(db: &impl ReadableDatabase) -> Result<Snapshot, StoreError> {
    let r = db.begin_read().map_err(backend("begin read"))?;
    let revision = revision_in(&r)?;
    let mut items = Vec::new();
    match r.open_table(OBJECTS) {
        Ok(table) => {
            for entry in table.iter().map_err(backend("scan objects"))? {
                let (k, v) = entry.map_err(backend("scan objects"))?;
                items.push(decode(k.value(), v.value())?);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(StoreError::Backend(format!("open objects: {e}"))),
    }
    Ok(Snapshot { revision, items })
}

/// Whether a process holds the redb file at `path` open (a running server).
pub(crate) fn is_held(path: &Path) -> bool {
    matches!(redb::ReadOnlyDatabase::open(path), Err(redb::DatabaseError::DatabaseAlreadyOpen))
}

/// Writes `snapshot` as a new redb file at `path` (which must not exist), committed and fsync'd,
/// with the store revision set to the snapshot's so revisions stay monotonic for clients.
pub(crate) fn write_snapshot(path: &Path, snapshot: &Snapshot) -> Result<(), StoreError> {
    if path.exists() {
        return Err(StoreError::Backend(format!("{} already exists", path.display())));
    }
    let db = Database::create(path).map_err(|e| StoreError::Backend(format!("creating {}: {e}", path.display())))?;
    let txn = db.begin_write().map_err(backend("begin write"))?;
    {
        let mut objects = txn.open_table(OBJECTS).map_err(backend("open objects"))?;
        for kv in &snapshot.items {
            objects.insert(kv.key.as_str(), encode(kv).as_slice()).map_err(backend("insert"))?;
        }
        let mut meta = txn.open_table(META).map_err(backend("open meta"))?;
        meta.insert(REVISION_KEY, snapshot.revision).map_err(backend("write revision"))?;
    }
    txn.commit().map_err(backend("commit"))
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    /// What the next operations of a [`Flaky`] file do wrong.
    #[derive(Debug, Default)]
    struct Faults {
        syncs: AtomicUsize,
        /// The sync (counted from 1) that completes and then reports an error: a commit that
        /// lands on disk while its writer is told it failed.
        fail_sync: AtomicUsize,
        /// Opening the file fails, as it can while the disk is full.
        refuse_open: AtomicBool,
        /// Writes fail with ENOSPC and write nothing.
        disk_full: AtomicBool,
    }

    /// A redb file whose fsyncs and opens fail when told to.
    #[derive(Debug)]
    struct Flaky {
        file: File,
        faults: Arc<Faults>,
    }

    impl redb::StorageBackend for Flaky {
        fn len(&self) -> Result<u64, std::io::Error> {
            Ok(self.file.metadata()?.len())
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.file.read_exact_at(out, offset)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.file.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            self.file.sync_data()?;
            let n = self.faults.syncs.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.faults.fail_sync.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("injected: fsync reported an error after writing"));
            }
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            if self.faults.disk_full.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(libc_enospc()));
            }
            self.file.write_all_at(data, offset)
        }
    }

    /// ENOSPC on Linux.
    fn libc_enospc() -> i32 {
        28
    }

    fn flaky_store(path: &Path, faults: &Arc<Faults>) -> (Arc<RwLock<State>>, Committer, Health, Vec<thread::JoinHandle<()>>) {
        let (path, faults) = (path.to_path_buf(), faults.clone());
        let opener: Opener = Box::new(move || {
            if faults.refuse_open.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("injected: cannot open".into()));
            }
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path);
            let file = file.map_err(|e| StoreError::Backend(e.to_string()))?;
            Database::builder()
                .create_with_backend(Flaky { file, faults: faults.clone() })
                .map_err(|e| StoreError::Backend(e.to_string()))
        });
        let opened = open_with(opener, HistoryLimits::default(), Duration::from_millis(200)).expect("open");
        (opened.state, opened.committer, opened.health, opened.threads)
    }

    /// Drops the last sender and waits for the committer to drop its database: redb takes no
    /// file lock through a custom backend, so an open while the committer still closes its
    /// file would read a half-written header.
    fn close(c: Committer, threads: Vec<thread::JoinHandle<()>>) {
        drop(c);
        for t in threads {
            t.join().expect("the committer ends cleanly");
        }
    }

    fn create(c: &Committer, key: &str) -> Result<KeyValue, StoreError> {
        let (tx, rx) = oneshot::channel();
        c.send((Write::Create { key: key.into(), value: Bytes::from_static(b"v") }, tx)).expect("send");
        rx.blocking_recv().expect("reply")
    }

    /// The syncs one commit makes, so a test can fail exactly the last of them.
    fn syncs_per_commit(c: &Committer, faults: &Faults) -> usize {
        let before = faults.syncs.load(Ordering::SeqCst);
        create(c, "/probe").expect("a commit");
        faults.syncs.load(Ordering::SeqCst) - before
    }

    /// Waits up to 5 s for the committer's probe to find the store writable again.
    fn wait_until_writable(health: &Health) {
        for _ in 0..100 {
            if health.read().expect("health").is_none() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reads the file fresh; the store that held it has been closed.
    fn keys_on_disk(path: &Path) -> Vec<String> {
        let db = Database::open(path).expect("the closed store's file opens");
        let r = db.begin_read().expect("read");
        let t = r.open_table(OBJECTS).expect("objects");
        t.iter().expect("iter").map(|e| e.expect("entry").0.value().to_string()).collect()
    }

    #[test]
    fn a_commit_that_reports_an_error_after_landing_is_kept_and_acknowledged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let faults = Arc::new(Faults::default());
        let (state, c, health, threads) = flaky_store(&path, &faults);
        let n = syncs_per_commit(&c, &faults);
        faults.fail_sync.store(faults.syncs.load(Ordering::SeqCst) + n, Ordering::SeqCst);

        let kv = create(&c, "/a").expect("the reopened file shows the write landed, so it succeeds");
        assert_eq!(state.read().expect("state").get("/a"), Some(kv.clone()));
        assert!(health.read().expect("health").is_none(), "the store writes again");
        create(&c, "/b").expect("later writes go on");
        close(c, threads);
        assert_eq!(keys_on_disk(&path), ["/a", "/b", "/probe"]);
    }

    #[test]
    fn a_commit_on_a_full_disk_is_refused_everywhere_and_writes_resume_when_it_has_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let faults = Arc::new(Faults::default());
        let (state, c, health, threads) = flaky_store(&path, &faults);
        syncs_per_commit(&c, &faults);
        faults.disk_full.store(true, Ordering::SeqCst);

        let e = create(&c, "/a").expect_err("nothing can be written");
        assert!(matches!(e, StoreError::NoSpace(_)), "a full disk is told apart: {e:?}");
        assert_eq!(state.read().expect("state").get("/a"), None);
        assert!(matches!(*health.read().expect("health"), Some(StoreError::NoSpace(_))));

        faults.disk_full.store(false, Ordering::SeqCst);
        wait_until_writable(&health);
        assert!(health.read().expect("health").is_none(), "the probe finds room again without a write");
        create(&c, "/b").expect("writes resume");
        close(c, threads);
        assert_eq!(keys_on_disk(&path), ["/b", "/probe"]);
    }

    #[test]
    fn a_write_answered_unknown_is_rolled_back_when_the_file_opens_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let faults = Arc::new(Faults::default());
        let (state, c, health, threads) = flaky_store(&path, &faults);
        let n = syncs_per_commit(&c, &faults);
        // The commit lands but reports an error, and the file cannot be reopened to find out.
        faults.fail_sync.store(faults.syncs.load(Ordering::SeqCst) + n, Ordering::SeqCst);
        faults.refuse_open.store(true, Ordering::SeqCst);

        let e = create(&c, "/a").expect_err("the outcome cannot be known");
        assert!(e.to_string().contains("not applied"), "{e}");
        assert!(health.read().expect("health").is_some(), "/readyz reports it");
        assert!(create(&c, "/b").is_err(), "no write while the file cannot be opened");

        faults.refuse_open.store(false, Ordering::SeqCst);
        // The committer's probe reopens the file by itself within a second.
        wait_until_writable(&health);
        assert!(health.read().expect("health").is_none(), "the store recovered on its own");
        assert_eq!(state.read().expect("state").get("/a"), None);
        create(&c, "/c").expect("writes resume");
        close(c, threads);
        assert_eq!(keys_on_disk(&path), ["/c", "/probe"], "the write answered with an error never comes back");
    }
}
