//! Pods a controller created or deleted that its cache does not show yet, per owner, so that a
//! reconcile running before the cache catches up neither creates a pod twice nor counts a deleted
//! one as running.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
// Tokio's clock, so that paused-clock tests can age expectations.
use shepherd_api::meta;
use tokio::time::Instant;


/// How long an expectation may wait for the cache before it is given up on.
const TTL: Duration = Duration::from_secs(60);

/// By owner key; one worker reconciles a key at a time, so each entry has one writer.
#[derive(Default)]
pub(crate) struct PodExpectations(Mutex<HashMap<String, Pending>>);

#[derive(Default)]
struct Pending {
    /// A pod's slot (the node it runs on, or its name) to the revision it was created at.
    creating: HashMap<String, (u64, Instant)>,
    /// Uids of pods deleted, until the cache shows them terminating or gone.
    deleting: HashMap<String, Instant>,
}

impl PodExpectations {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Pending>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner is gone: nothing more to expect for it.
    pub(crate) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Drops what the cache now shows (creations up to its `observed` revision, deletions of pods
    /// no longer live among `pods`) and what waited too long; returns the slots still being
    /// created and the uids still being deleted.
    pub(crate) fn settle(
        &self,
        key: &str,
        observed: u64,
        pods: &[Arc<Value>],
    ) -> (HashSet<String>, HashSet<String>) {
        let mut all = self.lock();
        let pending = all.entry(key.to_string()).or_default();
        pending
            .creating
            .retain(|_, (rev, at)| *rev > observed && at.elapsed() < TTL);
        let live: HashSet<&str> = pods
            .iter()
            .filter(|p| !meta::is_deleting(p))
            .map(|p| meta::uid(p))
            .collect();
        pending
            .deleting
            .retain(|uid, at| live.contains(uid.as_str()) && at.elapsed() < TTL);
        (
            pending.creating.keys().cloned().collect(),
            pending.deleting.keys().cloned().collect(),
        )
    }

    /// A pod for `slot` was created at `revision`.
    pub(crate) fn created(&self, key: &str, slot: &str, revision: u64) {
        if let Some(pending) = self.lock().get_mut(key) {
            pending
                .creating
                .insert(slot.to_string(), (revision, Instant::now()));
        }
    }

    /// The pod with `uid` was deleted.
    pub(crate) fn deleted(&self, key: &str, uid: &str) {
        if let Some(pending) = self.lock().get_mut(key) {
            pending.deleting.insert(uid.to_string(), Instant::now());
        }
    }
}
