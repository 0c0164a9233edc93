//! Revisioned key-value store with watch.
//!
//! One global revision counts every write; each value remembers the revision that created it and
//! the one that last modified it (`resourceVersion` in the API). Reads are served from memory;
//! the embedded backend appends every change to a write-ahead log and acknowledges only after
//! the append is fsync'd, with concurrent writers sharing one fsync, and checkpoints the log into
//! redb in the background; its watch history survives restarts. The etcd backend (feature `etcd`) keeps
//! the objects in etcd, shared by several API servers, and serves watches from a cache.
//!
//! Callers hold a `dyn Store` and never learn which backend they got: each answers the trait the
//! same way, including reads at a past revision (`list_at`) within the history, `compact` (after
//! which older ones are `Expired`), and `close` (after which writes and watches are refused).

mod durable;
mod embedded;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod local_etcd;
mod local;
mod snapshot;
mod state;
mod wal;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::{BoxFuture, Either, Ready};

#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
pub use local_etcd::{LocalEtcd, LocalEtcdTls};
pub use embedded::WalOptions;
pub use durable::{DEFAULT_REDB_CACHE_BYTES, Heartbeats, set_redb_cache_bytes};
pub use error::StoreError;
pub use local::LocalStore;
pub use snapshot::{Snapshot, SnapshotError};
pub use state::HistoryLimits;
pub use watch::WatchStream;
pub use shepherd_pack::Packed;

/// A global revision: strictly increasing, one per successful write.
pub type Revision = u64;

/// A stored value and the revisions of its creation and last modification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Updated,
    Deleted,
}

/// One write, as a watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// The value after the write; for `Deleted`, the last value, with `mod_revision` set to the
    /// revision of the delete.
    pub kv: KeyValue,
    /// The value before the write (`None` for `Created`).
    pub prev: Option<KeyValue>,
}

impl Event {
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

/// A listed object with its value as the store keeps it: packed, unpacked only when it is read. A
/// list of `KeyValue`s holds every value unpacked at once; a large list of these holds a few
/// hundred bytes per object until each is rendered.
#[derive(Debug, Clone)]
pub struct PackedKeyValue {
    pub key: String,
    pub value: Packed,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

impl PackedKeyValue {
    pub fn unpack(&self) -> KeyValue {
        KeyValue {
            key: self.key.clone(),
            value: self.value.unpack(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

impl From<KeyValue> for PackedKeyValue {
    fn from(kv: KeyValue) -> Self {
        let KeyValue { key, value, create_revision, mod_revision } = kv;
        PackedKeyValue { key, value: Packed::Raw(value), create_revision, mod_revision }
    }
}

/// A page of a list, read at one revision.
#[derive(Debug, Clone)]
pub struct ListResult<T = KeyValue> {
    pub items: Vec<T>,
    /// The revision the list was read at: a watch from here misses nothing.
    pub revision: Revision,
    /// More items follow the last one returned.
    pub more: bool,
}

/// What `count`, `revision` and `watch` return. A backend that answers from memory returns
/// `futures::future::ready(answer).left_future()`, which costs no allocation (an `async fn` of this
/// trait boxes its future on every call, and these three run on every list, every watch and every
/// read that waits for a revision); one that must ask a server returns
/// `async move { .. }.boxed().right_future()`.
pub type StoreFuture<'a, T> = Either<Ready<T>, BoxFuture<'a, T>>;

/// The store's operations. Every write is atomic; a write that returns `Ok` is durable (for
/// durable backends) and visible to every later read and watch. Callers hold a `dyn Store` and
/// do not know which backend they got: every backend answers these the same way.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates `key`; fails with `AlreadyExists` if it is present.
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError>;
    /// Replaces `key`; fails with `NotFound` if absent, and with `Conflict` if
    /// `expected_mod_revision` is given and differs from the stored one.
    async fn update(&self, key: &str, value: Bytes, expected_mod_revision: Option<Revision>)
    -> Result<KeyValue, StoreError>;
    /// Removes `key`, with the same precondition as `update`. Returns the removed value with
    /// `mod_revision` set to the revision of the delete.
    async fn delete(&self, key: &str, expected_mod_revision: Option<Revision>) -> Result<KeyValue, StoreError>;
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;
    /// Keys starting with `prefix`, in key order, after `start_after` when given, at most `limit`.
    async fn list(&self, prefix: &str, start_after: Option<&str>, limit: Option<usize>)
    -> Result<ListResult, StoreError>;
    /// As `list`, read as the store stood at `revision` (for a paginated list's later pages, and
    /// lists at an exact revision). `Expired` once writes after `revision` have left the history
    /// (by the history's limits or by `compact`). A revision the store has not reached reads as now.
    async fn list_at(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Revision,
    ) -> Result<ListResult, StoreError> {
        let now = self.revision().await?;
        if revision >= now {
            return self.list(prefix, start_after, limit).await;
        }
        Err(StoreError::Expired { requested: revision, oldest: now })
    }
    /// As `list`, or `list_at` when `revision` is given, with the values as the store keeps them
    /// (a backend that keeps them as written answers them unpacked).
    async fn list_packed(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Option<Revision>,
    ) -> Result<ListResult<PackedKeyValue>, StoreError> {
        let page = match revision {
            None => self.list(prefix, start_after, limit).await?,
            Some(rev) => self.list_at(prefix, start_after, limit, rev).await?,
        };
        let ListResult { items, revision, more } = page;
        Ok(ListResult { items: items.into_iter().map(PackedKeyValue::from).collect(), revision, more })
    }
    /// Number of keys starting with `prefix`.
    fn count<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Result<usize, StoreError>>;
    /// Every change to keys under `prefix` after `from_revision`, in order, with no gap and no
    /// duplicate. `Expired` if that revision is older than the retained history.
    fn watch<'a>(&'a self, prefix: &'a str, from_revision: Revision)
    -> StoreFuture<'a, Result<WatchStream, StoreError>>;
    /// The revision of the last write.
    fn revision(&self) -> StoreFuture<'_, Result<Revision, StoreError>>;
    /// Drops the history up to `revision`: afterwards a `list_at` or `watch` from a revision
    /// before it is `Expired`, while both still work from `revision` itself. The store's own
    /// limits may have dropped more already. `FutureRevision` if the store has not reached it.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;
    /// Stops the store: writes already taken are finished and made durable, later ones fail with
    /// `Closed`, open watches end with `Closed` after the events written before, and the
    /// backend's threads, tasks and connections stop. Reads of what the store held may still
    /// answer. Closing twice is fine.
    async fn close(&self) -> Result<(), StoreError>;
    /// What the store holds in memory and the bounds of it, for metrics. `None` for stores that
    /// keep nothing of their own (clients of another store).
    fn retention(&self) -> Option<Retention> {
        None
    }
    /// `Ok` while writes can succeed; the failure that stops them otherwise (a full disk, an I/O
    /// error being recovered from). Readiness probes report it.
    fn writable(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The sizes of what a store holds in memory, beside the limits that bound them.
#[derive(Debug, Clone, Default)]
pub struct Retention {
    pub objects: usize,
    /// Bytes of the objects' serialized values.
    pub object_bytes: usize,
    /// The bytes those values take in memory, compressed (their per-kind dictionaries not counted).
    pub object_memory_bytes: usize,
    /// Events kept for watchers to resume from, and the bytes of their values.
    pub history_events: usize,
    pub history_bytes: usize,
    /// Of `history_bytes`, those held in memory (the embedded store reads the rest from its file).
    pub history_memory_bytes: usize,
    /// Watches that fell out of their live buffer and resumed from the history, since the open.
    pub watch_resumes: u64,
    /// Reads of the history from the store file (watches and lists reaching past memory), and
    /// the events they returned, since the open.
    pub history_file_reads: u64,
    pub history_file_events: u64,
    /// Watch subscriptions following live events.
    pub live_watchers: usize,
    /// Events held in the live buffer for the slowest watcher.
    pub live_buffer_events: usize,
    pub limits: HistoryLimits,
}

/// Where the store lives in etcd, and how the cache is bounded.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members (`http://127.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// Prepended to every key, so several clusters (or tests) can share one etcd. No trailing
    /// slash: a store key `/registry/pods/a` is the etcd key `PREFIX/registry/pods/a`.
    pub prefix: String,
    pub limits: HistoryLimits,
    /// How long `connect` keeps trying to reach etcd before it gives up.
    pub connect_timeout: Duration,
    /// How often etcd's history is compacted (zero: never, by this process). Whichever API
    /// server comes first in an interval compacts to the revision of the interval before, so a
    /// paginated list or a watch has at least one interval's history.
    pub compaction_interval: Duration,
    /// TLS to etcd (endpoints `https://`); `None`: plain gRPC.
    pub tls: Option<EtcdTls>,
}

/// How this process proves itself to etcd and checks etcd's certificate, in PEM (kube-apiserver's
/// --etcd-cafile, --etcd-certfile and --etcd-keyfile).
#[derive(Clone, Default)]
pub struct EtcdTls {
    /// The CA that signed etcd's serving certificate.
    pub ca_pem: Vec<u8>,
    /// This client's certificate and private key, for an etcd that asks for one (--client-cert-auth).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("EtcdTls").field("client_certificate", &self.identity.is_some()).finish_non_exhaustive()
    }
}

impl EtcdConfig {
    pub fn new(endpoints: Vec<String>, prefix: &str) -> Self {
        EtcdConfig {
            endpoints,
            prefix: prefix.trim_end_matches('/').to_string(),
            limits: HistoryLimits::default(),
            connect_timeout: Duration::from_secs(60),
            compaction_interval: Duration::from_secs(5 * 60),
            tls: None,
        }
    }
}

/// How a binary built without the `etcd` feature starts its error for `--store etcd` (the benchmark
/// harness reads it to say why it has no etcd figures).
pub const ETCD_NOT_BUILT: &str = "this shepherd was built without the etcd backend";

/// Connects to the etcd store `config` names (see `EtcdStore`). A build without the `etcd` feature
/// refuses, saying how to get one.
pub async fn connect_etcd(config: EtcdConfig) -> Result<Arc<dyn Store>, StoreError> {
    #[cfg(feature = "etcd")]
    {
        Ok(Arc::new(EtcdStore::connect(config).await?))
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = config;
        Err(StoreError::Backend(format!(
            "{ETCD_NOT_BUILT}: build it with `cargo build --release --bin shepherd --features etcd` \
             (which needs protoc, from Debian's protobuf-compiler)"
        )))
    }
}
