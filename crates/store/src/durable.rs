//! The durable backend: redb on disk, with group commit.
//!
//! One committer thread owns every write. It takes all requests waiting in its channel as one
//! batch, checks each against the state (and the earlier writes of the batch), writes the batch
//! in one redb transaction, fsyncs it, and only then applies it to memory, notifies watchers and
//! answers the callers. So an acknowledged write is on disk, a reader never sees a write that is
//! not, and N concurrent writers cost about one fsync rather than N.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock, mpsc};
use std::thread;

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use crate::snapshot::Snapshot;
use crate::state::{State, Write};
use crate::{Event, EventKind, HistoryLimits, KeyValue, Revision, StoreError};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const REVISION_KEY: &str = "revision";
/// Upper bound on writes sharing one commit, so one batch cannot hold up its first writer forever.
const MAX_BATCH: usize = 4096;
/// redb's page cache. Every read is served from the in-memory state, so redb's cache only speeds
/// up its own commits; its 1 GiB default would grow towards a second copy of every object. At
/// 16 MiB the scale-out benchmark's commits cost ~10% more CPU; at 64 MiB they cost the same.
const REDB_CACHE_BYTES: usize = 64 * 1024 * 1024;

pub(crate) type Reply = oneshot::Sender<Result<KeyValue, StoreError>>;

/// Where writes go: the committer thread's queue.
pub(crate) type Committer = mpsc::Sender<(Write, Reply)>;

/// Opens (or creates) the redb file at `path`, loads it, and starts the committer thread that
/// will own every write. A second open of the same file fails with a clear error.
pub(crate) fn open(
    path: &Path,
    limits: HistoryLimits,
) -> Result<(Arc<RwLock<State>>, Committer), StoreError> {
    let db = Database::builder().set_cache_size(REDB_CACHE_BYTES).create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
            "{} is already open in another Shepherd process; stop it or use another --data-dir",
            path.display()
        )),
        e => StoreError::Backend(format!("opening {}: {e}", path.display())),
    })?;
    let (objects, revision) = load(&db)?;
    let state = Arc::new(RwLock::new(State::new(objects, revision, limits)));
    let (tx, rx) = mpsc::channel();
    let committer_state = state.clone();
    thread::Builder::new()
        .name("store-committer".into())
        .spawn(move || commit_loop(db, committer_state, rx))
        .map_err(|e| StoreError::Backend(format!("starting committer thread: {e}")))?;
    Ok((state, tx))
}

fn backend<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Backend(format!("{what}: {e}"))
}

fn load(db: &Database) -> Result<(BTreeMap<String, KeyValue>, Revision), StoreError> {
    // Create the tables on first open so reads below find them.
    let w = db.begin_write().map_err(backend("begin write"))?;
    w.open_table(OBJECTS).map_err(backend("open objects"))?;
    w.open_table(META).map_err(backend("open meta"))?;
    w.commit().map_err(backend("commit"))?;

    let r = db.begin_read().map_err(backend("begin read"))?;
    let meta = r.open_table(META).map_err(backend("open meta"))?;
    let revision = meta.get(REVISION_KEY).map_err(backend("read revision"))?.map(|v| v.value()).unwrap_or(0);
    let table = r.open_table(OBJECTS).map_err(backend("open objects"))?;
    let mut objects = BTreeMap::new();
    for entry in table.iter().map_err(backend("scan objects"))? {
        let (k, v) = entry.map_err(backend("scan objects"))?;
        let key = k.value().to_string();
        let kv = decode(&key, v.value())?;
        objects.insert(key, kv);
    }
    Ok((objects, revision))
}

/// Stored value layout: create revision (8 bytes LE), mod revision (8 bytes LE), then the value.
fn encode(kv: &KeyValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + kv.value.len());
    out.extend_from_slice(&kv.create_revision.to_le_bytes());
    out.extend_from_slice(&kv.mod_revision.to_le_bytes());
    out.extend_from_slice(&kv.value);
    out
}

fn decode(key: &str, raw: &[u8]) -> Result<KeyValue, StoreError> {
    if raw.len() < 16 {
        return Err(StoreError::Backend(format!("stored value of {key} is truncated")));
    }
    let (c, rest) = raw.split_at(8);
    let (m, value) = rest.split_at(8);
    let rev = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Ok(KeyValue { key: key.to_string(), value: Bytes::copy_from_slice(value), create_revision: rev(c), mod_revision: rev(m) })
}

fn commit_loop(db: Database, state: Arc<RwLock<State>>, rx: mpsc::Receiver<(Write, Reply)>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }

        // Check every write against the state; rejected ones are answered at once and take no
        // revision. Only this thread changes the state, so it cannot move under us.
        let mut accepted = Vec::with_capacity(batch.len());
        let mut rejected = Vec::new();
        {
            let Ok(s) = state.read() else { return };
            let mut pending: BTreeMap<String, Option<KeyValue>> = BTreeMap::new();
            let mut rev = s.revision;
            for (w, reply) in batch {
                match s.prepare(w, rev + 1, &pending) {
                    Ok(event) => {
                        rev += 1;
                        let after = (event.kind != EventKind::Deleted).then(|| event.kv.clone());
                        pending.insert(event.kv.key.clone(), after);
                        accepted.push((event, reply));
                    }
                    Err(e) => rejected.push((reply, e)),
                }
            }
        }
        for (reply, e) in rejected {
            let _ = reply.send(Err(e));
        }
        if accepted.is_empty() {
            continue;
        }

        if let Err(e) = persist(&db, &accepted) {
            tracing::error!(error = %e, "store commit failed; rejecting {} writes", accepted.len());
            for (_, reply) in accepted {
                let _ = reply.send(Err(e.clone()));
            }
            continue;
        }

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
    match redb::ReadOnlyDatabase::open(path) {
        Ok(db) => snapshot_of(&db),
        // A process that was killed leaves the file needing a repair of redb's allocation state
        // (committed data is intact); only a writable open performs it, as the next start would.
        Err(redb::DatabaseError::RepairAborted) => snapshot_of(&Database::open(path).map_err(opened)?),
        Err(e) => Err(opened(e)),
    }
}

fn snapshot_of(db: &impl ReadableDatabase) -> Result<Snapshot, StoreError> {
    let r = db.begin_read().map_err(backend("begin read"))?;
    let revision = match r.open_table(META) {
        Ok(meta) => meta.get(REVISION_KEY).map_err(backend("read revision"))?.map(|v| v.value()).unwrap_or(0),
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => return Err(StoreError::Backend(format!("open meta: {e}"))),
    };
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
