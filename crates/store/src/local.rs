//! `LocalStore`: the store of one process, in memory or on disk (a write-ahead log and redb).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;

use async_trait::async_trait;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::ready;
use tokio::sync::oneshot;

use crate::durable::{self, Committer, Health, Opened};
use crate::embedded::{self, WalOptions};
use crate::state::{ListAt, Listed, State, Write, read_from_disk};
use crate::{
    HistoryLimits, KeyValue, ListResult, PackedKeyValue, Retention, Revision, Snapshot, Store, StoreError, StoreFuture, WatchStream,
};

/// Reads are served from memory in both backends. Writes either apply at once under the lock
/// (in-memory: nothing to wait for, so tests on tokio's paused clock see them immediately) or go
/// through the redb committer, which answers only after the fsync.
#[derive(Clone)]
pub struct LocalStore {
    state: Arc<RwLock<State>>,
    /// Where writes go; `None` once the store is closed. Shared by every clone, so closing one
    /// closes them all.
    engine: Arc<RwLock<Option<Engine>>>,
    health: Option<Health>,
}

enum Engine {
    /// Writes apply at once under the state's lock.
    Memory,
    /// Writes go to the committer thread. Once every sender of its queue is gone it answers the
    /// writes still queued, checkpoints the log and stops, and the threads behind it follow.
    Disk { committer: Committer, threads: Vec<JoinHandle<()>> },
}

impl LocalStore {
    /// A store that lives as long as the process.
    pub fn in_memory(limits: HistoryLimits) -> Self {
        LocalStore {
            state: Arc::new(RwLock::new(State::new(BTreeMap::new(), 0, limits))),
            engine: Arc::new(RwLock::new(Some(Engine::Memory))),
            health: None,
        }
    }

    fn on_disk(opened: Opened) -> Self {
        let Opened { state, committer, health, threads } = opened;
        LocalStore {
            state,
            engine: Arc::new(RwLock::new(Some(Engine::Disk { committer, threads }))),
            health: Some(health),
        }
    }

    /// A durable store in the redb file at `path` (created if absent), with its write-ahead log
    /// in the directory beside it (`store.redb` logs into `store.wal/`).
    pub fn open_redb(path: &Path, limits: HistoryLimits) -> Result<Self, StoreError> {
        Self::open_embedded(path, limits, WalOptions::default())
    }

    /// As `open_redb`, checkpointing the log as `options` say.
    pub fn open_embedded(path: &Path, limits: HistoryLimits, options: WalOptions) -> Result<Self, StoreError> {
        Ok(Self::on_disk(durable::without_panics(path, || embedded::open(path, limits, options))?))
    }

    /// The previous engine on the same file: every batch of writes a redb commit, no log, no
    /// history across restarts. A log left by the default engine is folded into the file first.
    pub fn open_redb_only(path: &Path, limits: HistoryLimits) -> Result<Self, StoreError> {
        durable::without_panics(path, || embedded::fold_log(path))?;
        Ok(Self::on_disk(durable::without_panics(path, || durable::open(path, limits))?))
    }

    /// Every object at the current revision: a consistent cut, since writes reach memory only
    /// after their commit and under the same lock this read takes.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.read(|s| Snapshot { revision: s.revision, items: s.all() })
    }

    /// Every object of the redb file at `path` (not open in any process), at its last revision.
    pub fn read_redb_snapshot(path: &Path) -> Result<Snapshot, StoreError> {
        durable::without_panics(path, || durable::read_snapshot(path))
    }

    /// Checks every page of the idle redb file at `path` against its checksum, on a copy made
    /// beside it (a check may repair, and the file itself is left as it is).
    pub fn check_redb_integrity(path: &Path) -> Result<(), StoreError> {
        durable::check_integrity(path)
    }

    /// Whether a process holds the redb file at `path` open.
    pub fn redb_is_held(path: &Path) -> bool {
        durable::is_held(path)
    }

    /// The write-ahead log directory of the redb file at `path` (`store.redb` logs into `store.wal/`).
    pub fn log_dir(path: &Path) -> std::path::PathBuf {
        crate::wal::dir_of(path)
    }

    /// Writes `snapshot` into a new redb file at `path`, which must not exist yet.
    pub fn write_redb_snapshot(path: &Path, snapshot: &Snapshot) -> Result<(), StoreError> {
        durable::write_snapshot(path, snapshot)
    }

    async fn write(&self, w: Write) -> Result<KeyValue, StoreError> {
        let answer = {
            let engine = self.engine.read().map_err(|_| StoreError::Closed)?;
            match engine.as_ref() {
                None => return Err(StoreError::Closed),
                Some(Engine::Memory) => {
                    let mut state = self.state.write().map_err(|_| StoreError::Closed)?;
                    let event = state.prepare(w, state.revision + 1, &BTreeMap::new())?;
                    let kv = event.kv.clone();
                    state.apply(event);
                    return Ok(kv);
                }
                Some(Engine::Disk { committer, .. }) => {
                    let (tx, rx) = oneshot::channel();
                    committer.send((w, tx)).map_err(|_| StoreError::Closed)?;
                    rx
                }
            }
        };
        answer.await.map_err(|_| StoreError::Closed)?
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> Result<T, StoreError> {
        Ok(f(&*self.state.read().map_err(|_| StoreError::Closed)?))
    }

    async fn list_at_as<T: Listed + Send>(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Revision,
    ) -> Result<ListResult<T>, StoreError> {
        // The events after `revision` that have left memory are read from disk outside the lock,
        // then the list is made under it; more are read if memory moved on meanwhile.
        let (mut older, mut read_through) = (Vec::new(), revision);
        loop {
            match self.read(|s| s.list_at(prefix, start_after, limit, revision, &older, read_through))? {
                ListAt::Done(answer) => return answer,
                ListAt::Disk(disk, after, through) => {
                    older.extend(read_from_disk(disk, prefix, after, through).await?);
                    read_through = through;
                }
            }
        }
    }
}

#[async_trait]
impl Store for LocalStore {
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError> {
        self.write(Write::Create { key: key.to_string(), value }).await
    }
    async fn update(&self, key: &str, value: Bytes, expected: Option<Revision>) -> Result<KeyValue, StoreError> {
        self.write(Write::Update { key: key.to_string(), value, expected }).await
    }
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue, StoreError> {
        self.write(Write::Delete { key: key.to_string(), expected }).await
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.read(|s| s.get(key))
    }
    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: Option<usize>) -> Result<ListResult, StoreError> {
        self.read(|s| s.list(prefix, start_after, limit))
    }
    async fn list_at(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Revision,
    ) -> Result<ListResult, StoreError> {
        self.list_at_as(prefix, start_after, limit, revision).await
    }
    async fn list_packed(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Option<Revision>,
    ) -> Result<ListResult<PackedKeyValue>, StoreError> {
        match revision {
            None => self.read(|s| s.list(prefix, start_after, limit)),
            Some(rev) => self.list_at_as(prefix, start_after, limit, rev).await,
        }
    }
    fn count<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Result<usize, StoreError>> {
        ready(self.read(|s| s.count(prefix))).left_future()
    }
    fn watch<'a>(&'a self, prefix: &'a str, from: Revision) -> StoreFuture<'a, Result<WatchStream, StoreError>> {
        WatchStream::following(&self.state, prefix, from)
    }
    fn revision(&self) -> StoreFuture<'_, Result<Revision, StoreError>> {
        ready(self.read(|s| s.revision)).left_future()
    }
    /// The history in memory goes at once; the embedded store's history on disk goes with its
    /// next checkpoint (within a second of the next write), so a restart before that brings the
    /// compacted events back for watches to resume from.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        if self.engine.read().map_err(|_| StoreError::Closed)?.is_none() {
            return Err(StoreError::Closed);
        }
        let mut state = self.state.write().map_err(|_| StoreError::Closed)?;
        if revision > state.revision {
            return Err(StoreError::FutureRevision { requested: revision, current: state.revision });
        }
        state.compact(revision);
        Ok(())
    }
    async fn close(&self) -> Result<(), StoreError> {
        // Writes racing this one either got into the queue before it goes (and are answered) or
        // find no engine (and are refused).
        let engine = self.engine.write().map_err(|_| StoreError::Closed)?.take();
        let stopped = match engine {
            Some(Engine::Disk { committer, threads }) => {
                drop(committer);
                let joined = tokio::task::spawn_blocking(move || threads.into_iter().all(|t| t.join().is_ok()));
                match joined.await {
                    Ok(true) => Ok(()),
                    _ => Err(StoreError::Backend(
                        "a store thread panicked while closing; the next open recovers what is on disk".into(),
                    )),
                }
            }
            Some(Engine::Memory) | None => Ok(()),
        };
        if let Ok(mut state) = self.state.write() {
            state.close();
        }
        stopped
    }
    fn retention(&self) -> Option<Retention> {
        self.read(State::retention).ok()
    }
    fn writable(&self) -> Result<(), StoreError> {
        if self.engine.read().map_err(|_| StoreError::Closed)?.is_none() {
            return Err(StoreError::Closed);
        }
        match &self.health {
            Some(h) => h.read().map_err(|_| StoreError::Closed)?.clone().map_or(Ok(()), Err),
            None => Ok(()),
        }
    }
}
