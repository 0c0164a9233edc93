//! A `Client` that delegates every call and counts the reads (get, list, watch) and writes it
//! makes: the "etcd load" a controller manager puts on the API.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::Serialize;
use serde_json::Value;
use shepherd_api::digest::{DigestDetail, ListDigest};
use shepherd_api::{ApiError, ResourceInfo};
use shepherd_runtime::{Client, DeleteParams, ListParams, ObjectList, Patch, WatchEvent};

#[derive(Default)]
pub struct Counters {
    gets: AtomicU64,
    lists: AtomicU64,
    listed_objects: AtomicU64,
    watches: AtomicU64,
    writes: AtomicU64,
    digests: AtomicU64,
}

/// The counters at one moment; subtract two to get what happened in between.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counts {
    pub gets: u64,
    pub lists: u64,
    pub listed_objects: u64,
    pub watches: u64,
    pub writes: u64,
    /// Digest checks (anti-entropy): reads without object bodies.
    pub digests: u64,
}

impl Counts {
    /// API read calls: get + list + watch.
    pub fn reads(&self) -> u64 {
        self.gets + self.lists + self.watches
    }

    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            gets: self.gets - earlier.gets,
            lists: self.lists - earlier.lists,
            listed_objects: self.listed_objects - earlier.listed_objects,
            watches: self.watches - earlier.watches,
            writes: self.writes - earlier.writes,
            digests: self.digests - earlier.digests,
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> Counts {
        Counts {
            gets: self.gets.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            listed_objects: self.listed_objects.load(Ordering::Relaxed),
            watches: self.watches.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            digests: self.digests.load(Ordering::Relaxed),
        }
    }
}

pub struct CountingClient {
    inner: Arc<dyn Client>,
    pub counters: Arc<Counters>,
}

impl CountingClient {
    pub fn wrap(inner: Arc<dyn Client>) -> (Arc<dyn Client>, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        (Arc::new(CountingClient { inner, counters: counters.clone() }), counters)
    }

    fn wrote(&self) {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Client for CountingClient {
    async fn get(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(res, ns, name).await
    }
    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let list = self.inner.list(res, params).await?;
        self.counters.listed_objects.fetch_add(list.items.len() as u64, Ordering::Relaxed);
        Ok(list)
    }
    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        rv: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError> {
        self.counters.watches.fetch_add(1, Ordering::Relaxed);
        self.inner.watch(res, params, rv).await
    }
    async fn create(&self, res: &ResourceInfo, ns: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.wrote();
        self.inner.create(res, ns, obj).await
    }
    async fn update(&self, res: &ResourceInfo, ns: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.wrote();
        self.inner.update(res, ns, obj).await
    }
    async fn update_status(&self, res: &ResourceInfo, ns: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.wrote();
        self.inner.update_status(res, ns, obj).await
    }
    async fn patch(&self, res: &ResourceInfo, ns: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        self.wrote();
        self.inner.patch(res, ns, name, patch).await
    }
    async fn patch_status(&self, res: &ResourceInfo, ns: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        self.wrote();
        self.inner.patch_status(res, ns, name, patch).await
    }
    async fn delete(&self, res: &ResourceInfo, ns: Option<&str>, name: &str, params: &DeleteParams) -> Result<Option<Value>, ApiError> {
        self.wrote();
        self.inner.delete(res, ns, name, params).await
    }
    async fn get_scale(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get_scale(res, ns, name).await
    }
    async fn update_scale(&self, res: &ResourceInfo, ns: Option<&str>, name: &str, scale: Value) -> Result<Value, ApiError> {
        self.wrote();
        self.inner.update_scale(res, ns, name, scale).await
    }
    async fn bind_pod(&self, ns: &str, name: &str, node: &str) -> Result<(), ApiError> {
        self.wrote();
        self.inner.bind_pod(ns, name, node).await
    }

    async fn digest(&self, res: &ResourceInfo, params: &ListParams, revision: u64, detail: DigestDetail) -> Result<ListDigest, ApiError> {
        self.counters.digests.fetch_add(1, Ordering::Relaxed);
        self.inner.digest(res, params, revision, detail).await
    }
}
