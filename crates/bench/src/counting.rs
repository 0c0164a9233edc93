//! Counts the reads (get, list, watch) and writes a client makes: the "etcd load" a controller
//! manager puts on the API.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde::Serialize;
use shepherd_api::ApiError;
use shepherd_runtime::Client;
use shepherd_runtime::intercept::{Call, Intercepted, Interceptor, Reply};

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

/// Counts every call it sees into the shared counters.
struct Counting(Arc<Counters>);

#[async_trait]
impl Interceptor for Counting {
    async fn before(&self, call: &Call<'_>) -> Result<(), ApiError> {
        let c = &self.0;
        let counter = match call {
            Call::Get { .. } | Call::GetScale { .. } => &c.gets,
            Call::List { .. } => &c.lists,
            Call::Watch { .. } => &c.watches,
            Call::Digest { .. } => &c.digests,
            Call::CreateToken { .. } => return Ok(()),
            _ => &c.writes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn after(&self, _call: &Call<'_>, outcome: Result<Reply<'_>, &ApiError>) {
        if let Ok(Reply::List(list)) = outcome {
            self.0.listed_objects.fetch_add(list.items.len() as u64, Ordering::Relaxed);
        }
    }
}

/// `inner`, counting every call it passes on.
pub fn wrap(inner: Arc<dyn Client>) -> (Arc<dyn Client>, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    (Arc::new(Intercepted::new(inner, Counting(counters.clone()))), counters)
}
