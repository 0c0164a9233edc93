//! Per-owner pod counts behind ReplicaSet status, adjusted from pod events instead of recounted per pass.
//!
//! Each pod's contribution (counted, fully labeled, ready, ready since) is kept beside the pod's
//! view (the one the pod cache keeps), and an event subtracts the old contribution and adds the new one, so a status read is
//! O(1) in the pods plus the number of distinct ready-since seconds (for `minReadySeconds`, whose
//! timed availability needs no event: a ready pod is available once `since + minReady <= now`).
//! What counts depends on the owner's selector and template labels, which the owner's reconcile
//! registers; a change of either recounts that owner's pods from the handles.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value};
use shepherd_api::selector::LabelSelector;
use shepherd_runtime::cache::{Change, object_key};
use shepherd_runtime::{Cache, PodView};

use crate::podutil;

/// What an owner's status counts: pods matching its selector, labelled as its template.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerSpec {
    pub selector: LabelSelector,
    pub template_labels: Map<String, Value>,
}

/// The counts of one owner at one moment, as its status reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub replicas: usize,
    pub fully_labeled: usize,
    pub ready: usize,
    pub available: usize,
    /// How long until the next ready pod becomes available (`minReadySeconds`), if one is waiting.
    pub wait: Option<Duration>,
    /// Pods the owner controls that its selector no longer matches (to release).
    pub strays: usize,
    /// Failed pods the owner controls (to delete and replace).
    pub failed: usize,
}

/// One pod's contribution to its owner's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Facts {
    counted: bool,
    fully_labeled: bool,
    stray: bool,
    failed: bool,
    /// `Some` for a counted ready pod: when it became ready (`Timestamp::MIN` when unknown, which
    /// counts as ready since forever).
    ready_since: Option<Timestamp>,
}

impl Facts {
    fn of(pod: &PodView, spec: Option<&OwnerSpec>) -> Facts {
        let Some(spec) = spec else { return Facts::default() };
        if pod.is_deleting() {
            return Facts::default();
        }
        if !pod.matches(&spec.selector) {
            return Facts { stray: true, ..Facts::default() };
        }
        if !pod.is_active() {
            return Facts { failed: pod.phase() == "Failed", ..Facts::default() };
        }
        let fully_labeled = podutil::fully_labeled(pod, &spec.template_labels);
        let ready_since = pod.is_ready().then(|| pod.ready_since().unwrap_or(Timestamp::MIN));
        Facts { counted: true, fully_labeled, ready_since, ..Facts::default() }
    }
}

#[derive(Debug, Default)]
struct Sums {
    replicas: usize,
    fully_labeled: usize,
    strays: usize,
    failed: usize,
    /// Counted ready pods by the second they became ready.
    ready_since: BTreeMap<Timestamp, usize>,
}

impl Sums {
    fn add(&mut self, f: Facts) {
        self.strays += usize::from(f.stray);
        self.failed += usize::from(f.failed);
        if !f.counted {
            return;
        }
        self.replicas += 1;
        self.fully_labeled += usize::from(f.fully_labeled);
        if let Some(at) = f.ready_since {
            *self.ready_since.entry(at).or_default() += 1;
        }
    }

    fn sub(&mut self, f: Facts) {
        self.strays -= usize::from(f.stray);
        self.failed -= usize::from(f.failed);
        if !f.counted {
            return;
        }
        self.replicas -= 1;
        self.fully_labeled -= usize::from(f.fully_labeled);
        if let Some(at) = f.ready_since
            && let Some(n) = self.ready_since.get_mut(&at)
        {
            *n -= 1;
            if *n == 0 {
                self.ready_since.remove(&at);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Owner {
    spec: Option<OwnerSpec>,
    pods: HashSet<String>,
    sums: Sums,
}

struct Entry {
    owner: String,
    pod: Arc<PodView>,
    facts: Facts,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, Entry>,
    owners: HashMap<String, Owner>,
}

impl State {
    fn forget(&mut self, key: &str) {
        let Some(old) = self.pods.remove(key) else { return };
        if let Some(owner) = self.owners.get_mut(&old.owner) {
            owner.sums.sub(old.facts);
            owner.pods.remove(key);
            // The next reconcile of a live owner sets its spec again, over no pods: cheap.
            if owner.pods.is_empty() {
                self.owners.remove(&old.owner);
            }
        }
    }

    fn put(&mut self, key: String, pod: Arc<PodView>) {
        let Some(uid) = pod.controller_uid().map(str::to_string) else {
            self.forget(&key);
            return;
        };
        if self.pods.get(&key).is_some_and(|e| e.owner != uid) {
            self.forget(&key);
        }
        let owner = self.owners.entry(uid.clone()).or_default();
        let facts = Facts::of(&pod, owner.spec.as_ref());
        match self.pods.get_mut(&key) {
            Some(entry) => {
                owner.sums.sub(entry.facts);
                entry.facts = facts;
                entry.pod = pod;
            }
            None => {
                owner.pods.insert(key.clone());
                self.pods.insert(key, Entry { owner: uid, pod, facts });
            }
        }
        owner.sums.add(facts);
    }
}

/// The tally of every controlled pod, fed by the pod informer.
#[derive(Default)]
pub struct PodTally {
    state: Mutex<State>,
    /// The pod cache whose views the tally keeps; without one it reads a view per change.
    pods: Option<Arc<Cache>>,
}

impl PodTally {
    /// A tally fed by the changes of `pods`, keeping the views that cache made.
    pub fn over(pods: Arc<Cache>) -> PodTally {
        PodTally { state: Mutex::default(), pods: Some(pods) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one change of the pod cache.
    pub fn apply(&self, change: &Change) {
        let Some(key) = object_key(change.object()) else { return };
        let view = match change {
            Change::Added(pod) | Change::Updated { new: pod, .. } => Some(
                self.pods
                    .as_ref()
                    .and_then(|c| c.pod_view_of(&key, pod))
                    .unwrap_or_else(|| Arc::new(PodView::of(pod))),
            ),
            Change::Deleted(_) => None,
        };
        let mut state = self.lock();
        match view {
            Some(view) => state.put(key, view),
            None => state.forget(&key),
        }
    }

    /// Records what `owner` counts; when that changed, recounts its pods.
    pub fn set_spec(&self, owner: &str, spec: &OwnerSpec) {
        let mut state = self.lock();
        let State { pods, owners } = &mut *state;
        let entry = owners.entry(owner.to_string()).or_default();
        if entry.spec.as_ref() == Some(spec) {
            return;
        }
        entry.spec = Some(spec.clone());
        entry.sums = Sums::default();
        for key in &entry.pods {
            if let Some(p) = pods.get_mut(key) {
                p.facts = Facts::of(&p.pod, Some(spec));
                entry.sums.add(p.facts);
            }
        }
    }

    /// The counts of `owner` at `now`, leaving out the pods in `excluded` (key and uid: deletions
    /// the cache has not shown yet). `None` until the owner's spec is set.
    pub fn counts(&self, owner: &str, min_ready: Duration, now: Timestamp, excluded: &[(String, String)]) -> Option<Counts> {
        let state = self.lock();
        let o = state.owners.get(owner)?;
        o.spec.as_ref()?;
        let mut replicas = o.sums.replicas;
        let mut fully_labeled = o.sums.fully_labeled;
        let mut not_ready = Vec::new();
        for (key, uid) in excluded {
            let ours = |e: &&Entry| e.owner == owner && e.facts.counted && e.pod.uid() == uid;
            if let Some(e) = state.pods.get(key).filter(ours) {
                replicas -= 1;
                fully_labeled -= usize::from(e.facts.fully_labeled);
                if let Some(at) = e.facts.ready_since {
                    not_ready.push(at);
                }
            }
        }
        let mut ready = 0;
        let mut available = 0;
        let mut wait: Option<Duration> = None;
        for (&since, &n) in &o.sums.ready_since {
            let n = n - not_ready.iter().filter(|&&at| at == since).count();
            ready += n;
            let ready_for = podutil::elapsed(since, now);
            if min_ready.is_zero() || since == Timestamp::MIN || ready_for >= min_ready {
                available += n;
            } else if n > 0 {
                let w = min_ready - ready_for;
                wait = Some(wait.map_or(w, |cur| cur.min(w)));
            }
        }
        let (strays, failed) = (o.sums.strays, o.sums.failed);
        Some(Counts { replicas, fully_labeled, ready, available, wait, strays, failed })
    }

    /// Recounts `owner` from the pods it keeps, correcting any drift in the sums; true if there was.
    pub fn recount(&self, owner: &str) -> bool {
        let mut state = self.lock();
        let State { pods, owners } = &mut *state;
        let Some(o) = owners.get_mut(owner) else { return false };
        let mut sums = Sums::default();
        for key in &o.pods {
            if let Some(p) = pods.get_mut(key) {
                p.facts = Facts::of(&p.pod, o.spec.as_ref());
                sums.add(p.facts);
            }
        }
        let drifted = sums.replicas != o.sums.replicas
            || sums.fully_labeled != o.sums.fully_labeled
            || sums.ready_since != o.sums.ready_since
            || (sums.strays, sums.failed) != (o.sums.strays, o.sums.failed);
        o.sums = sums;
        drifted
    }

    /// How many pods are tallied (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
