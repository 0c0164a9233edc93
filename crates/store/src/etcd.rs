//! The etcd backend: objects in etcd under a key prefix, watched through one cache per process.
//!
//! Writes are etcd transactions that compare the key's revisions, so the optimistic concurrency
//! of every API server sharing the etcd is etcd's own; a resourceVersion is the etcd revision of
//! the object's last write. `get`, `list` and `list_at` read etcd (reads after any server's write
//! see it; `list_at` reads etcd's MVCC history, `Expired` once compacted). `watch`, `count` and
//! `revision` are served by the watch cache: one etcd watch on the whole prefix, with progress
//! notifications, applied to the same in-memory state and bounded history the local store keeps,
//! so N watchers cost etcd one watch. A write returns once the cache has seen it, so a client of
//! this process reads its own writes in a watch and in `revision`.
//!
//! `compact` is etcd's compaction (and the cache's history follows it); `close` stops the
//! cache's watch and the compactor, ends the watches it serves, and lets go of the connections.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Certificate, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, Identity, KvClient,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchClient, WatchOptions, WatchResponse,
};
use futures::FutureExt;
use futures::future::ready;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::state::State;
use crate::{
    EtcdConfig, Event, EventKind, KeyValue, ListResult, Retention, Revision, Store, StoreError, StoreFuture,
    WatchStream,
};

/// Responses this large are a list of many objects; tonic's 4 MiB default refuses a list of a
/// few thousand pods.
const MAX_MESSAGE_BYTES: usize = 1 << 30;
/// Keys per range request while loading the cache.
const LOAD_PAGE: i64 = 1000;
/// How long a write waits for the cache to show it before it returns anyway.
const CACHE_WAIT: Duration = Duration::from_secs(5);

/// A store in etcd. Clones share one connection and one watch cache.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None` once closed: every request then fails with `Closed`, and the connections go when
    /// the requests in flight are done.
    members: RwLock<Option<Arc<Members>>>,
    /// The etcd key prefix, without a trailing slash.
    prefix: String,
    cache: Arc<RwLock<State>>,
    /// The revision the cache has reached; writes wait on it.
    seen: watch::Receiver<Revision>,
    /// `None` while the cache follows etcd; the failure otherwise (readiness reports it).
    health: Arc<RwLock<Option<StoreError>>>,
    /// The revision up to which etcd has compacted, as far as this process has heard.
    compacted: Arc<std::sync::atomic::AtomicU64>,
    /// The follower and the compactor, until `close`.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            tasks.iter().for_each(JoinHandle::abort);
        }
    }
}

impl EtcdStore {
    /// Connects, loads every object under the prefix into the cache and starts following etcd.
    /// Retries until `connect_timeout` while etcd cannot be reached, then fails naming it.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        let endpoints = config.endpoints.join(",");
        if config.endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoints given".into()));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let options = match &config.tls {
            Some(tls) => {
                let mut t = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
                if let Some((cert, key)) = &tls.identity {
                    t = t.identity(Identity::from_pem(cert, key));
                }
                options.with_tls(t)
            }
            None => options,
        };
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        let (members, loaded) = loop {
            let attempt = async {
                let members = Members::connect(&config.endpoints, &options).await?;
                let loaded = load(&members, &config.prefix).await?;
                Ok::<_, etcd_client::Error>((members, loaded))
            };
            match attempt.await {
                Ok(done) => break done,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(endpoints, error = %e, "cannot reach etcd yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) if config.connect_timeout.is_zero() => {
                    return Err(StoreError::Unavailable(format!("cannot reach etcd at {endpoints}: {e}")));
                }
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot reach etcd at {endpoints} within {:?}: {e}",
                        config.connect_timeout
                    )));
                }
            }
        };
        let (objects, revision) = loaded;
        let cache = Arc::new(RwLock::new(State::new(
            objects.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
            revision,
            config.limits,
        )));
        let (seen_tx, seen) = watch::channel(revision);
        let health = Arc::new(RwLock::new(None));
        let compacted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let members = Arc::new(members);
        let follower = Follower {
            members: members.clone(),
            prefix: config.prefix.clone(),
            cache: cache.clone(),
            seen: seen_tx,
            health: health.clone(),
            compacted: compacted.clone(),
        };
        let mut tasks = vec![tokio::spawn(follower.run())];
        tasks.extend((!config.compaction_interval.is_zero()).then(|| {
            let compactor = Compactor {
                members: members.clone(),
                key: format!("{}{COMPACTION_KEY}", config.prefix),
                compacted: compacted.clone(),
            };
            tokio::spawn(compactor.run(config.compaction_interval))
        }));
        tracing::info!(endpoints, prefix = config.prefix, revision, "etcd store connected");
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                members: RwLock::new(Some(members)),
                prefix: config.prefix,
                cache,
                seen,
                health,
                compacted,
                tasks: Mutex::new(tasks),
            }),
        })
    }

    /// The members' clients, or `Closed`.
    fn members(&self) -> Result<Arc<Members>, StoreError> {
        self.inner.members.read().map_err(|_| StoreError::Closed)?.clone().ok_or(StoreError::Closed)
    }

    /// Runs a transaction on the current member, and on the next ones while a member cannot be
    /// reached before the transaction was sent.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        self.members()?
            .run(false, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await
            .map_err(|e| self.error(e, None))
    }

    /// A range read on the current member, and on the next ones while one cannot be reached.
    async fn get_range(
        &self,
        key: String,
        options: Option<GetOptions>,
        requested: Option<Revision>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        self.members()?
            .run(true, |mut kv| {
                let (key, options) = (key.clone(), options.clone());
                async move { kv.get(key, options).await }
            })
            .await
            .map_err(|e| self.error(e, requested))
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.inner.prefix)
    }

    /// Waits until the cache shows revision `rev` (bounded: the write is done either way).
    async fn cached(&self, rev: Revision) {
        let mut seen = self.inner.seen.clone();
        if tokio::time::timeout(CACHE_WAIT, seen.wait_for(|r| *r >= rev)).await.is_err() {
            tracing::warn!(revision = rev, "the etcd watch cache has not shown a write within {CACHE_WAIT:?}");
        }
    }

    fn error(&self, e: etcd_client::Error, requested: Option<Revision>) -> StoreError {
        classify(e, requested, self.inner.compacted.load(std::sync::atomic::Ordering::SeqCst))
    }

    async fn range(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Option<Revision>,
    ) -> Result<ListResult, StoreError> {
        // Every store key starts with '/', so the empty prefix is the etcd prefix's directory (and
        // not the keys of a neighbour whose prefix merely starts with ours).
        let full_prefix = if prefix.is_empty() { self.full("/") } else { self.full(prefix) };
        let start = match start_after {
            Some(after) if after >= prefix => format!("{}\0", self.full(after)),
            _ => full_prefix.clone(),
        };
        let mut options = GetOptions::new().with_range(prefix_end(full_prefix.as_bytes()));
        if let Some(l) = limit {
            // One more than asked tells whether more follow.
            options = options.with_limit(i64::try_from(l.saturating_add(1)).unwrap_or(i64::MAX));
        }
        if let Some(r) = revision {
            options = options.with_revision(rev_i64(r));
        }
        let mut resp = self.get_range(start, Some(options), revision).await?;
        let at = revision.unwrap_or_else(|| header_revision(resp.header()));
        let mut items = Vec::new();
        // Past the keys returned; with a skipped key (the compaction key) a page may be short.
        let mut more = resp.more();
        for kv in resp.take_kvs() {
            let Some(item) = decode(&self.inner.prefix, &kv) else { continue };
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push(item);
        }
        Ok(ListResult { items, revision: at, more })
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> Result<T, StoreError> {
        Ok(f(&*self.inner.cache.read().map_err(|_| StoreError::Closed)?))
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue, StoreError> {
        let k = self.full(key);
        let txn = Txn::new().when([Compare::create_revision(k.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            k.as_str(),
            value.to_vec(),
            None,
        )]);
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            return Err(StoreError::AlreadyExists { key: key.to_string() });
        }
        let rev = header_revision(resp.header());
        self.cached(rev).await;
        Ok(KeyValue { key: key.to_string(), value, create_revision: rev, mod_revision: rev })
    }

    async fn update(&self, key: &str, value: Bytes, expected: Option<Revision>) -> Result<KeyValue, StoreError> {
        let k = self.full(key);
        let txn = Txn::new()
            .when([precondition(&k, expected)])
            .and_then([TxnOp::put(k.as_str(), value.to_vec(), Some(PutOptions::new().with_prev_key()))])
            .or_else([TxnOp::get(k.as_str(), None)]);
        let resp = self.txn(txn).await?;
        let rev = header_revision(resp.header());
        let first = resp.op_responses().into_iter().next();
        if !resp.succeeded() {
            return Err(refusal(key, expected, first));
        }
        let create_revision = match first {
            Some(TxnOpResponse::Put(p)) => p.prev_key().map_or(rev, |kv| kv.create_revision().max(0) as Revision),
            _ => rev,
        };
        self.cached(rev).await;
        Ok(KeyValue { key: key.to_string(), value, create_revision, mod_revision: rev })
    }

    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<KeyValue, StoreError> {
        let k = self.full(key);
        let txn = Txn::new()
            .when([precondition(&k, expected)])
            .and_then([TxnOp::delete(k.as_str(), Some(DeleteOptions::new().with_prev_key()))])
            .or_else([TxnOp::get(k.as_str(), None)]);
        let resp = self.txn(txn).await?;
        let rev = header_revision(resp.header());
        let first = resp.op_responses().into_iter().next();
        if !resp.succeeded() {
            return Err(refusal(key, expected, first));
        }
        let prev = match first {
            Some(TxnOpResponse::Delete(d)) => d.prev_kvs().first().and_then(|kv| decode(&self.inner.prefix, kv)),
            _ => None,
        };
        let prev = prev.ok_or_else(|| StoreError::Backend(format!("etcd deleted {key} without its last value")))?;
        self.cached(rev).await;
        Ok(KeyValue { mod_revision: rev, ..prev })
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut resp = self.get_range(self.full(key), None, None).await?;
        Ok(resp.take_kvs().first().and_then(|kv| decode(&self.inner.prefix, kv)))
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<ListResult, StoreError> {
        self.range(prefix, start_after, limit, None).await
    }

    async fn list_at(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        revision: Revision,
    ) -> Result<ListResult, StoreError> {
        match self.range(prefix, start_after, limit, Some(revision)).await {
            // A revision etcd has not reached yet reads as now, as the local store does.
            Err(StoreError::Backend(m)) if m.contains("future revision") => self.list(prefix, start_after, limit).await,
            r => r,
        }
    }

    fn count<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Result<usize, StoreError>> {
        ready(self.read(|s| s.count(prefix))).left_future()
    }

    fn watch<'a>(&'a self, prefix: &'a str, from: Revision) -> StoreFuture<'a, Result<WatchStream, StoreError>> {
        WatchStream::following(&self.inner.cache, prefix, from)
    }

    fn revision(&self) -> StoreFuture<'_, Result<Revision, StoreError>> {
        ready(self.read(|s| s.revision)).left_future()
    }

    /// etcd's compaction, which every API server sharing the etcd sees (lists there at older
    /// revisions are `Expired` too); this cache's history follows it, the others' keep their own.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let compacted =
            self.members()?.run(true, |mut kv| async move { kv.compact(rev_i64(revision), None).await }).await;
        match compacted {
            Ok(_) => {}
            Err(e) if e.to_string().contains("future revision") => {
                let current = self.read(|s| s.revision)?;
                return Err(StoreError::FutureRevision { requested: revision, current });
            }
            // Compacted that far already (by this process's compactor or another server's).
            Err(e) if e.to_string().contains("has been compacted") => {}
            Err(e) => return Err(self.error(e, None)),
        }
        self.inner.compacted.fetch_max(revision, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut cache) = self.inner.cache.write() {
            cache.compact(revision);
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), StoreError> {
        let members = self.inner.members.write().map_err(|_| StoreError::Closed)?.take();
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().map_err(|_| StoreError::Closed)?);
        for task in tasks {
            task.abort();
            // Cancelled: it stopped at its next await, dropping its etcd watch stream.
            let _ = task.await;
        }
        if let Ok(mut cache) = self.inner.cache.write() {
            cache.close();
        }
        if members.is_some() {
            tracing::info!(prefix = self.inner.prefix, "etcd store closed");
        }
        Ok(())
    }

    fn retention(&self) -> Option<Retention> {
        self.read(State::retention).ok()
    }

    fn writable(&self) -> Result<(), StoreError> {
        self.members()?;
        self.inner.health.read().map_err(|_| StoreError::Closed)?.clone().map_or(Ok(()), Err)
    }
}

/// The compare a conditional write makes: the key's last write is `expected`, or it exists.
fn precondition(key: &str, expected: Option<Revision>) -> Compare {
    match expected {
        Some(rev) => Compare::mod_revision(key, CompareOp::Equal, rev_i64(rev)),
        None => Compare::create_revision(key, CompareOp::Greater, 0),
    }
}

/// Why a conditional write's compare failed, from the key as its `or_else` read it.
fn refusal(key: &str, expected: Option<Revision>, read: Option<TxnOpResponse>) -> StoreError {
    let current = match read {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.mod_revision().max(0) as Revision),
        _ => None,
    };
    match (current, expected) {
        (None, _) => StoreError::NotFound { key: key.to_string() },
        (Some(actual), Some(expected)) => StoreError::Conflict { key: key.to_string(), expected, actual },
        // The key exists and nothing was expected: the compare cannot have failed on it.
        (Some(actual), None) => StoreError::Conflict { key: key.to_string(), expected: 0, actual },
    }
}

fn rev_i64(rev: Revision) -> i64 {
    i64::try_from(rev).unwrap_or(i64::MAX)
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Revision {
    header.map_or(0, |h| h.revision().max(0) as Revision)
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd reads a range end of "\0" as "to the end".
    vec![0]
}

fn decode(prefix: &str, kv: &etcd_client::KeyValue) -> Option<KeyValue> {
    let key = kv.key_str().ok()?.strip_prefix(prefix).filter(|k| k.starts_with('/') && *k != COMPACTION_KEY)?;
    let key = key.to_string();
    Some(KeyValue {
        key,
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: kv.create_revision().max(0) as Revision,
        mod_revision: kv.mod_revision().max(0) as Revision,
    })
}

/// The store's error for an etcd failure: `Expired` for a compacted revision, `Unavailable`
/// (503) when etcd cannot be reached or has no leader, `Backend` otherwise.
fn classify(e: etcd_client::Error, requested: Option<Revision>, compacted: Revision) -> StoreError {
    let message = e.to_string();
    if message.contains("required revision has been compacted") {
        let requested = requested.unwrap_or(0);
        return StoreError::Expired { requested, oldest: compacted.max(requested + 1) };
    }
    let unreachable = match &e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
            ) || message.contains("no leader")
        }
        _ => false,
    };
    if unreachable {
        StoreError::Unavailable(format!("etcd: {message}"))
    } else {
        StoreError::Backend(format!("etcd: {message}"))
    }
}

/// The key (after the prefix) whose version counts the compaction intervals that API servers
/// sharing the etcd have claimed. Not a store key; it is inside the watched range so that its
/// writes move the caches' revision too, which then stays equal to the revision lists report.
const COMPACTION_KEY: &str = "/.compaction";

/// Compacts etcd's history as Kubernetes' API servers do: every interval, each server tries to
/// bump the compaction key's version from the one it saw last; the one whose compare succeeds
/// compacts to the revision it saw one interval earlier, the others learn the new version. So
/// however many servers share the etcd, it is compacted once an interval.
struct Compactor {
    members: Arc<Members>,
    key: String,
    compacted: Arc<std::sync::atomic::AtomicU64>,
}

impl Compactor {
    async fn run(mut self, interval: Duration) {
        let mut version = 0;
        let mut revision = 0;
        loop {
            tokio::time::sleep(interval).await;
            match self.claim(version, revision).await {
                Ok((v, r)) => (version, revision) = (v, r),
                Err(e) => tracing::warn!(error = %e, "etcd compaction"),
            }
        }
    }

    /// One interval: claims it if the key is still at `version`, compacting to `revision` (the
    /// revision claimed one interval ago). Returns the key's version and the revision now.
    async fn claim(&mut self, version: i64, revision: i64) -> Result<(i64, i64), etcd_client::Error> {
        let txn = Txn::new()
            .when([Compare::version(self.key.as_str(), CompareOp::Equal, version)])
            .and_then([TxnOp::put(self.key.as_str(), revision.to_string(), None)])
            .or_else([TxnOp::get(self.key.as_str(), None)]);
        let resp = self
            .members
            .run(false, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        let now = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            let seen = match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().map_or(0, |kv| kv.version()),
                _ => 0,
            };
            return Ok((seen, now));
        }
        if revision > 0 {
            self.members.run(true, |mut kv| async move { kv.compact(revision, None).await }).await?;
            self.compacted.fetch_max(revision.max(0) as Revision, std::sync::atomic::Ordering::SeqCst);
            tracing::debug!(revision, "etcd compacted");
        }
        Ok((version + 1, now))
    }
}

/// One client per etcd member, used one at a time as etcd's own client does: requests go to the
/// current member, and a member that cannot be reached makes the next one current. (A client
/// balanced over every endpoint keeps sending a share of its requests to a dead member.)
struct Members {
    kv: Vec<KvClient>,
    watch: Vec<WatchClient>,
    current: AtomicUsize,
}

impl Members {
    /// Connects lazily: a member that is down now is tried when its turn comes.
    async fn connect(endpoints: &[String], options: &ConnectOptions) -> Result<Members, etcd_client::Error> {
        let (mut kv, mut watch) = (Vec::new(), Vec::new());
        for endpoint in endpoints {
            let client = etcd_client::Client::connect([endpoint.as_str()], Some(options.clone())).await?;
            kv.push(client.kv_client().max_decoding_message_size(MAX_MESSAGE_BYTES));
            watch.push(client.watch_client().max_decoding_message_size(MAX_MESSAGE_BYTES));
        }
        Ok(Members { kv, watch, current: AtomicUsize::new(0) })
    }

    fn kv_client(&self) -> (usize, KvClient) {
        let at = self.current.load(Ordering::SeqCst) % self.kv.len();
        (at, self.kv[at].clone())
    }

    fn watch_client(&self) -> (usize, WatchClient) {
        let at = self.current.load(Ordering::SeqCst) % self.watch.len();
        (at, self.watch[at].clone())
    }

    /// Member `at` failed: the next one becomes current (unless another request moved on already).
    fn failed(&self, at: usize) {
        let next = (at + 1) % self.kv.len();
        if self.current.compare_exchange(at, next, Ordering::SeqCst, Ordering::SeqCst).is_ok() && self.kv.len() > 1 {
            tracing::warn!(member = at, next, "etcd member unreachable; using the next one");
        }
    }

    /// Runs `op` on the current member; while a member cannot be reached, on the next one, each
    /// member once. A request that may have reached etcd is only sent again if it is `idempotent`
    /// (a read): a write that failed on the way back is the caller's to judge.
    async fn run<T, F, Fut>(&self, idempotent: bool, mut op: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tried = 0;
        loop {
            let (at, kv) = self.kv_client();
            let e = match op(kv).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let (unreachable, unsent) = reachability(&e);
            if unreachable {
                self.failed(at);
            }
            tried += 1;
            if !(unsent || (unreachable && idempotent)) || tried >= self.kv.len() {
                return Err(e);
            }
        }
    }
}

/// Whether an error means the member could not be reached, and whether the request surely never
/// got to it (the connection could not be made).
fn reachability(e: &etcd_client::Error) -> (bool, bool) {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => (true, false),
        etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unavailable => {
            let unsent = s.message().contains("connect") || format!("{s:?}").contains("ConnectError");
            (true, unsent)
        }
        _ => (false, false),
    }
}

/// Every object under `prefix`, read page by page at one revision, and that revision.
async fn load(members: &Members, prefix: &str) -> Result<(Vec<KeyValue>, Revision), etcd_client::Error> {
    let end = prefix_end(format!("{prefix}/").as_bytes());
    let mut start = format!("{prefix}/").into_bytes();
    let mut revision = None;
    let mut items = Vec::new();
    loop {
        let mut options = GetOptions::new().with_range(end.clone()).with_limit(LOAD_PAGE);
        if let Some(r) = revision {
            options = options.with_revision(r);
        }
        let mut resp = members
            .run(true, |mut kv| {
                let (start, options) = (start.clone(), options.clone());
                async move { kv.get(start, Some(options)).await }
            })
            .await?;
        let at = *revision.get_or_insert_with(|| resp.header().map_or(0, |h| h.revision()));
        let more = resp.more();
        let kvs = resp.take_kvs();
        if let Some(last) = kvs.last() {
            start = last.key().to_vec();
            start.push(0);
        }
        items.extend(kvs.iter().filter_map(|kv| decode(prefix, kv)));
        if !more || kvs.is_empty() {
            return Ok((items, at.max(0) as Revision));
        }
    }
}

/// The task that keeps the cache in step with etcd: one watch on the prefix from the cache's
/// revision; on a broken stream it watches again from where it was, and when etcd has compacted
/// past that point it reloads the cache (its watchers end with `Lagged`, a 410 to their
/// clients, which re-list as Kubernetes' clients do).
///
/// It sends etcd no progress requests: etcd before 3.4.24 and 3.5.8 may answer one with a
/// revision whose events are still on their way (etcd issue 15220), and Debian ships 3.4.23. It
/// relies on the events of its prefix and on etcd's timed progress notifications, so `revision`
/// stays behind writes made outside the prefix (by other users of the etcd) until the next write
/// under the prefix or the next notification.
struct Follower {
    members: Arc<Members>,
    prefix: String,
    cache: Arc<RwLock<State>>,
    seen: watch::Sender<Revision>,
    health: Arc<RwLock<Option<StoreError>>>,
    compacted: Arc<std::sync::atomic::AtomicU64>,
}

/// How one watch stream ended.
enum Ended {
    /// etcd compacted past the cache's revision: the events in between are gone.
    Compacted(Revision),
    Failed(String),
}

impl Follower {
    async fn run(mut self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let ended = self.follow().await;
            match ended {
                Ended::Compacted(at) => {
                    self.compacted.fetch_max(at, std::sync::atomic::Ordering::SeqCst);
                    tracing::warn!(compacted = at, "etcd compacted past the watch cache; reloading it");
                    if let Err(e) = self.reload().await {
                        self.set_health(Some(StoreError::Unavailable(format!("reloading the etcd watch cache: {e}"))));
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
                Ended::Failed(e) => {
                    tracing::warn!(error = e, "etcd watch broke; watching again");
                    self.set_health(Some(StoreError::Unavailable(format!("etcd watch: {e}"))));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    fn set_health(&self, failure: Option<StoreError>) {
        if let Ok(mut h) = self.health.write() {
            if failure.is_none() && h.is_some() {
                tracing::info!("etcd watch cache follows etcd again");
            }
            *h = failure;
        }
    }

    fn revision(&self) -> Revision {
        self.cache.read().map(|s| s.revision).unwrap_or(0)
    }

    async fn reload(&mut self) -> Result<(), etcd_client::Error> {
        let (objects, revision) = load(&self.members, &self.prefix).await?;
        let Ok(mut cache) = self.cache.write() else { return Ok(()) };
        let limits = cache.retention().limits;
        // The old state's event sender goes with it, ending its watchers.
        *cache = State::new(objects.into_iter().map(|kv| (kv.key.clone(), kv)).collect(), revision, limits);
        drop(cache);
        self.seen.send_replace(revision);
        Ok(())
    }

    async fn follow(&mut self) -> Ended {
        let from = self.revision();
        let options = WatchOptions::new().with_prefix().with_start_revision(rev_i64(from + 1)).with_progress_notify();
        // A watch that breaks is taken up on the next member: the one it was on may be gone.
        let (at, mut client) = self.members.watch_client();
        let mut stream = match client.watch(format!("{}/", self.prefix), Some(options)).await {
            Ok(s) => s,
            Err(e) => {
                self.members.failed(at);
                return Ended::Failed(e.to_string());
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        let at = resp.compact_revision();
                        if at > 0 {
                            return Ended::Compacted(at as Revision);
                        }
                        return Ended::Failed(format!("etcd cancelled the watch: {}", resp.cancel_reason()));
                    }
                    if resp.created() {
                        self.set_health(None);
                    }
                    self.apply(resp);
                }
                Ok(None) => {
                    self.members.failed(at);
                    return Ended::Failed("etcd closed the watch stream".into());
                }
                Err(e) => {
                    self.members.failed(at);
                    return Ended::Failed(e.to_string());
                }
            }
        }
    }

    /// Applies a watch response's events to the cache, or a progress notification's revision.
    fn apply(&self, resp: WatchResponse) {
        let Ok(mut cache) = self.cache.write() else { return };
        if resp.events().is_empty() {
            // A progress notification: every event up to this revision has been delivered. The
            // response that confirms the watch carries the current revision too, but events
            // from before it may still follow, so it moves nothing.
            if !resp.created() {
                cache.advance(header_revision(resp.header()));
            }
        }
        for e in resp.events() {
            let Some(kv) = e.kv().and_then(|kv| decode(&self.prefix, kv)) else {
                // The compaction key: a revision with nothing for watchers.
                if let Some(kv) = e.kv() {
                    cache.advance(kv.mod_revision().max(0) as Revision);
                }
                continue;
            };
            if kv.mod_revision <= cache.revision {
                continue;
            }
            // The cache holds every key's value before this event: etcd need not send it again.
            let prev = cache.get(&kv.key);
            let event = match e.event_type() {
                EventType::Put => {
                    let kind = if prev.is_some() { EventKind::Updated } else { EventKind::Created };
                    Event { kind, kv, prev }
                }
                EventType::Delete => match prev {
                    Some(prev) => Event {
                        kind: EventKind::Deleted,
                        kv: KeyValue { mod_revision: kv.mod_revision, ..prev.clone() },
                        prev: Some(prev),
                    },
                    // Deleted before this cache saw it: nothing to tell anyone.
                    None => {
                        cache.advance(kv.mod_revision);
                        continue;
                    }
                },
            };
            cache.apply(event);
        }
        let revision = cache.revision;
        drop(cache);
        self.seen.send_replace(revision);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_the_next_key_that_does_not_start_with_it() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }
}
