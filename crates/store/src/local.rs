//! `LocalStore`: the store of one process, in memory or on disk (a write-ahead log and redb).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::oneshot;

use crate::durable::{self, Committer, Health};
use crate::embedded::{self, WalOptions};
use crate::state::{State, Write};
use crate::{HistoryLimits, Snapshot, KeyValue, ListResult, Retention, Revision, Store, StoreError, WatchStream};

/// Reads are served from memory in both backends. Writes either apply at once under the lock
/// (in-memory: nothing to wait for, so tests on tokio's paused clock see them immediately) or go
/// through the redb committer, which answers only after the fsync.
#[derive(Clone)]
pub struct LocalStore {
    state: Arc<RwLock<State>>,
    committer: Option<Committer>,
    health: Option<Health>,
}

impl LocalStore {
    /// A store that lives as long as the process.
    pub fn in_memory(limits: HistoryLimits) -> Self {
        LocalStore { state: Arc::new(RwLock::new(State::new(BTreeMap::new(), 0, limits))), committer: None, health: None }
    }

    /// A durable store in the redb file at `path` (created if absent), with its write-ahead log
    /// in the directory beside it (`store.redb` logs into `store.wal/`).
    pub fn open_redb(path: &Path, limits: HistoryLimits) -> Result<Self, StoreError> {
        Self::open_embedded(path, limits, WalOptions::default())
    }

    /// As `open_redb`, checkpointing the log as `options` say.
    pub fn open_embedded(path: &Path, limits: HistoryLimits, options: WalOptions) -> Result<Self, StoreError> {
        let (state, committer, health) = embedded::open(path, limits, options)?;
        Ok(LocalStore { state, committer: Some(committer), health: Some(health) })
    }

    /// The previous engine on the same file: every batch of writes a redb commit, no log, no
    /// history across restarts. A log left by the default engine is folded into the file first.
    pub fn open_redb_only(path: &Path, limits: HistoryLimits) -> Result<Self, StoreError> {
        embedded::fold_log(path)?;
        let (state, committer, health) = durable::open(path, limits)?;
        Ok(LocalStore { state, committer: Some(committer), health: Some(health) })
    }

    /// Every object at the current revision: a consistent cut, since writes reach memory only
    /// after their commit and under the same lock this read takes.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.read(|s| Snapshot { revision: s.revision, items: s.objects.values().cloned().collect() })
    }

    /// Every object of the redb file at `path` (not open in any process), at its last revision.
    pub fn read_redb_snapshot(path: &Path) -> Result<Snapshot, StoreError> {
        durable::read_snapshot(path)
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
        match &self.committer {
            Some(committer) => {
                let (tx, rx) = oneshot::channel();
                committer.send((w, tx)).map_err(|_| StoreError::Closed)?;
                rx.await.map_err(|_| StoreError::Closed)?
            }
            None => {
                let mut state = self.state.write().map_err(|_| StoreError::Closed)?;
                let event = state.prepare(w, state.revision + 1, &BTreeMap::new())?;
                let kv = event.kv.clone();
                state.apply(event);
                Ok(kv)
            }
        }
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> Result<T, StoreError> {
        Ok(f(&*self.state.read().map_err(|_| StoreError::Closed)?))
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
        self.read(|s| s.list_at(prefix, start_after, limit, revision))?
    }
    fn count(&self, prefix: &str) -> usize {
        self.read(|s| s.count(prefix)).unwrap_or(0)
    }
    fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, StoreError> {
        let (replay, rx) = self.read(|s| s.start_watch(prefix, from))??;
        // A watcher dropped from the live buffer resumes from the history when it still can.
        let state = self.state.clone();
        let owned_prefix = prefix.to_string();
        let resume = move |after: Revision| match state.read() {
            Ok(s) => s.start_watch(&owned_prefix, after),
            Err(_) => Err(StoreError::Closed),
        };
        Ok(WatchStream::new(prefix.to_string(), from, replay, rx, Box::new(resume)))
    }
    fn revision(&self) -> Revision {
        self.read(|s| s.revision).unwrap_or(0)
    }
    fn retention(&self) -> Option<Retention> {
        self.read(State::retention).ok()
    }
    fn writable(&self) -> Result<(), StoreError> {
        match &self.health {
            Some(h) => h.read().map_err(|_| StoreError::Closed)?.clone().map_or(Ok(()), Err),
            None => Ok(()),
        }
    }
}
