//! Watches that select by node, served from one store watch per kind.
//!
//! Every node's agent watches the pods bound to it (`fieldSelector=spec.nodeName=<node>`). Served
//! one store watch each, every pod event would be read by every agent's watch to be thrown away by
//! all but one: with a thousand nodes, a thousand looks per event. Here one store watch per kind
//! reads each event once, finds the node it is and was bound to, and hands it only to the watches
//! of those nodes (which then apply their whole selector, as any watch does).
//!
//! A hub keeps its last [`HISTORY`] events, at most [`HISTORY_BYTES`] of values, so that a watch starting a little in the past (after a
//! list, or resuming after a timeout) is served from it without a gap: the replay and the
//! registration happen under one lock. A watch from before that is served by the store directly.
//! A watch that falls [`QUEUE`] events behind is ended, as a timeout ends it; its client watches
//! again from its last resourceVersion. If the hub's own store watch ends, every watch it serves
//! ends with it, and the next one starts a new hub.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use futures::stream::BoxStream;
use shepherd_api::selector::selectable_field;
use shepherd_store::{Event, Revision, Store, StoreError};
use tokio::sync::mpsc;
use tracing::debug;

/// The field whose exact values index the watches.
pub(crate) const NODE_FIELD: &str = "spec.nodeName";
/// Events a hub keeps for watches that start in the past.
const HISTORY: usize = 10_000;
/// Bytes of object values (each event's value and the one before it) a hub keeps alive for them:
/// the store keeps its own history in memory to a like bound, and at 10,000 pods the last
/// 10,000 events would hold the last version of nearly every pod in full.
const HISTORY_BYTES: usize = 8 * 1024 * 1024;
/// Events a watch may fall behind before it is ended.
const QUEUE: usize = 1_000;

/// The hubs, one per kind's key prefix, made when a kind is first watched by node.
#[derive(Default)]
pub(crate) struct NodeWatches {
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
}

/// An event with the nodes it concerns: the one its object is bound to now and before.
struct Routed {
    event: Arc<Event>,
    now: Option<Box<str>>,
    before: Option<Box<str>>,
}

/// The bytes of object values `event` holds.
fn value_bytes(event: &Event) -> usize {
    event.kv.value.len() + event.prev.as_ref().map_or(0, |p| p.value.len())
}

impl Routed {
    fn new(event: Arc<Event>) -> Self {
        let node = |value: &[u8]| selectable_field(value, NODE_FIELD).filter(|n| !n.is_empty()).map(String::into_boxed_str);
        let now = node(&event.kv.value);
        let before = event.prev.as_ref().and_then(|p| node(&p.value)).filter(|b| Some(b) != now.as_ref());
        Routed { event, now, before }
    }

    fn concerns(&self, nodes: &HashSet<&str>) -> bool {
        [&self.now, &self.before].into_iter().flatten().any(|n| nodes.contains(&**n))
    }
}

struct Subscriber {
    nodes: Vec<String>,
    tx: mpsc::Sender<Arc<Event>>,
}

#[derive(Default)]
struct HubState {
    /// The revision after which this hub has dispatched every event of its kind.
    base: Revision,
    /// The last events dispatched, oldest first (all after `base`).
    history: VecDeque<Routed>,
    /// The bytes of values in `history`.
    history_bytes: usize,
    subscribers: HashMap<u64, Subscriber>,
    by_node: HashMap<String, Vec<u64>>,
    next_id: u64,
    ended: bool,
}

impl HubState {
    fn remove(&mut self, id: u64) {
        if let Some(sub) = self.subscribers.remove(&id) {
            for node in &sub.nodes {
                if let Some(ids) = self.by_node.get_mut(node) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        self.by_node.remove(node);
                    }
                }
            }
        }
    }

    fn dispatch(&mut self, routed: Routed) {
        let mut targets: Vec<u64> = [&routed.now, &routed.before]
            .into_iter()
            .flatten()
            .flat_map(|n| self.by_node.get(&**n).into_iter().flatten().copied())
            .collect();
        targets.sort_unstable();
        targets.dedup();
        for id in targets {
            let full = self.subscribers.get(&id).is_some_and(|s| s.tx.try_send(routed.event.clone()).is_err());
            if full {
                // Behind by a whole queue, or gone: its watch ends and its client watches again.
                debug!(id, "a watch by node fell behind; ending it");
                self.remove(id);
            }
        }
        self.history_bytes += value_bytes(&routed.event);
        self.history.push_back(routed);
        while self.history.len() > 1 && (self.history.len() > HISTORY || self.history_bytes > HISTORY_BYTES) {
            let Some(oldest) = self.history.pop_front() else { break };
            self.history_bytes -= value_bytes(&oldest.event);
            self.base = oldest.event.revision();
        }
    }
}

struct Hub {
    state: Mutex<HubState>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl NodeWatches {
    /// The events under `prefix` after `from` that concern `nodes`, as a store watch would give
    /// them (the caller applies its selector to each); `None` when `from` is older than the hub
    /// remembers (the caller watches the store itself).
    pub(crate) async fn watch(
        &self,
        store: &Arc<dyn Store>,
        prefix: &str,
        nodes: Vec<String>,
        from: Revision,
    ) -> Result<Option<BoxStream<'static, Result<Arc<Event>, StoreError>>>, StoreError> {
        let hub = self.hub(store, prefix).await?;
        let mut state = hub.lock();
        if state.ended || from < state.base {
            return Ok(None);
        }
        let wanted: HashSet<&str> = nodes.iter().map(String::as_str).collect();
        let replay: Vec<Arc<Event>> = state
            .history
            .iter()
            .filter(|r| r.event.revision() > from && r.concerns(&wanted))
            .map(|r| r.event.clone())
            .collect();
        let (tx, rx) = mpsc::channel(QUEUE);
        let id = state.next_id;
        state.next_id += 1;
        for node in &nodes {
            state.by_node.entry(node.clone()).or_default().push(id);
        }
        state.subscribers.insert(id, Subscriber { nodes, tx });
        drop(state);
        let live = tokio_stream::wrappers::ReceiverStream::new(rx);
        let unsubscribe = Unsubscribe { hub: Arc::downgrade(&hub), id };
        // A watch from a revision the hub has yet to reach skips what comes before it.
        let live = live.filter(move |e| std::future::ready(e.revision() > from)).map(move |e| {
            let _keep = &unsubscribe;
            Ok(e)
        });
        Ok(Some(futures::stream::iter(replay.into_iter().map(Ok)).chain(live).boxed()))
    }

    /// The running hub of `prefix`, started at the store's current revision if there is none.
    async fn hub(&self, store: &Arc<dyn Store>, prefix: &str) -> Result<Arc<Hub>, StoreError> {
        let running = |hubs: &HashMap<String, Arc<Hub>>| hubs.get(prefix).filter(|h| !h.lock().ended).cloned();
        if let Some(hub) = running(&self.lock()) {
            return Ok(hub);
        }
        let base = store.revision().await?;
        let events = store.watch(prefix, base).await?;
        let mut hubs = self.lock();
        // Another watch may have started one meanwhile.
        if let Some(hub) = running(&hubs) {
            return Ok(hub);
        }
        let hub = Arc::new(Hub { state: Mutex::new(HubState { base, ..Default::default() }) });
        hubs.insert(prefix.to_string(), hub.clone());
        tokio::spawn(run(Arc::downgrade(&hub), events));
        Ok(hub)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Hub>>> {
        self.hubs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Takes a watch out of its hub when its stream is dropped (the client went away).
struct Unsubscribe {
    hub: std::sync::Weak<Hub>,
    id: u64,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.lock().remove(self.id);
        }
    }
}

/// Reads the hub's store watch and dispatches each event, until the watch ends or the hub is gone.
async fn run(hub: std::sync::Weak<Hub>, mut events: shepherd_store::WatchStream) {
    loop {
        let next = events.next().await;
        let Some(hub) = hub.upgrade() else { return };
        match next {
            Some(Ok(event)) => {
                let routed = Routed::new(event);
                hub.lock().dispatch(routed);
            }
            end => {
                debug!(?end, "the store watch behind watches by node ended");
                let mut state = hub.lock();
                state.ended = true;
                // Dropping the senders ends every watch served.
                state.subscribers.clear();
                state.by_node.clear();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use shepherd_store::LocalStore;

    use super::*;

    const PREFIX: &str = "/registry/pods/";

    async fn put(store: &Arc<dyn Store>, name: &str, node: &str) -> Revision {
        let value = json!({"metadata": {"name": name}, "spec": {"nodeName": node}}).to_string();
        let key = format!("{PREFIX}default/{name}");
        match store.get(&key).await.expect("get") {
            Some(kv) => store.update(&key, value.into(), Some(kv.mod_revision)).await.expect("update").mod_revision,
            None => store.create(&key, value.into()).await.expect("create").mod_revision,
        }
    }

    async fn names(stream: &mut BoxStream<'static, Result<Arc<Event>, StoreError>>, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        for _ in 0..n {
            let e = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("an event in time");
            let e = e.expect("stream open").expect("event");
            got.push(e.kv.key.trim_start_matches(PREFIX).to_string());
        }
        got
    }

    #[tokio::test]
    async fn each_watch_gets_only_its_nodes_events_in_order_from_the_revision_it_asked() {
        let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory(Default::default()));
        let hubs = NodeWatches::default();
        put(&store, "p0", "a").await; // before the hub: a watch from earlier is the store's
        let start = store.revision().await.expect("revision");
        let mut a = hubs.watch(&store, PREFIX, vec!["a".into()], start).await.expect("watch").expect("served");
        let mut ab = hubs.watch(&store, PREFIX, vec!["a".into(), "b".into()], start).await.expect("watch").expect("served");
        put(&store, "p1", "a").await;
        let after_p1 = put(&store, "p2", "b").await;
        put(&store, "p3", "").await;
        put(&store, "p3", "a").await; // bound later: the node's watch learns of it then
        put(&store, "p4", "c").await;
        put(&store, "p2", "c").await; // moved away: the old node's watch sees it leave
        assert_eq!(names(&mut a, 2).await, ["default/p1", "default/p3"]);
        assert_eq!(names(&mut ab, 4).await, ["default/p1", "default/p2", "default/p3", "default/p2"]);
        // A watch starting in the hub's memory gets what followed, then the live events.
        let mut late = hubs.watch(&store, PREFIX, vec!["b".into(), "a".into()], after_p1).await.expect("watch").expect("served");
        put(&store, "p5", "b").await;
        assert_eq!(names(&mut late, 3).await, ["default/p3", "default/p2", "default/p5"]);
        // Nothing else was delivered to the first watch.
        assert!(tokio::time::timeout(Duration::from_millis(100), a.next()).await.is_err());
        // A revision before the hub started is the store's to serve.
        assert!(hubs.watch(&store, PREFIX, vec!["a".into()], start - 1).await.expect("watch").is_none());
    }

    #[tokio::test]
    async fn a_watch_that_falls_a_queue_behind_is_ended_and_the_others_go_on() {
        let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory(Default::default()));
        let hubs = NodeWatches::default();
        let start = store.revision().await.expect("revision");
        let mut slow = hubs.watch(&store, PREFIX, vec!["a".into()], start).await.expect("watch").expect("served");
        let mut other = hubs.watch(&store, PREFIX, vec!["b".into()], start).await.expect("watch").expect("served");
        for i in 0..=QUEUE {
            put(&store, &format!("p{i}"), "a").await;
        }
        put(&store, "q", "b").await;
        assert_eq!(names(&mut other, 1).await, ["default/q"]);
        let mut delivered = 0;
        while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(5), slow.next()).await {
            e.expect("event");
            delivered += 1;
        }
        assert_eq!(delivered, QUEUE, "the slow watch got its queue, then ended");
        // Its client watches again from where it was: served from the hub's memory.
        let again = hubs.watch(&store, PREFIX, vec!["a".into()], start).await.expect("watch");
        assert!(again.is_some());
    }

    #[tokio::test]
    async fn a_hub_remembers_values_up_to_its_byte_bound_and_leaves_older_watches_to_the_store() {
        let store: Arc<dyn Store> = Arc::new(LocalStore::in_memory(Default::default()));
        let hubs = NodeWatches::default();
        let start = store.revision().await.expect("revision");
        let mut live = hubs.watch(&store, PREFIX, vec!["a".into()], start).await.expect("watch").expect("served");
        // Each create holds a 100 KiB value: the hub keeps the newest 8 MiB of them.
        let big = "x".repeat(100 * 1024);
        let mut revisions = Vec::new();
        for i in 0..120 {
            let value = json!({"metadata": {"name": format!("p{i}")}, "spec": {"nodeName": "a"}, "data": big}).to_string();
            revisions.push(store.create(&format!("{PREFIX}default/p{i}"), value.into()).await.expect("create").mod_revision);
            names(&mut live, 1).await;
        }
        let hub = hubs.hub(&store, PREFIX).await.expect("hub");
        let (kept, bytes) = {
            let state = hub.lock();
            (state.history.len(), state.history_bytes)
        };
        assert!(bytes <= HISTORY_BYTES && kept < 120 && kept > 60, "{kept} events, {bytes} bytes kept");
        // A watch from within what is kept is served by the hub, from before it by the store.
        let recent = revisions[120 - kept];
        assert!(hubs.watch(&store, PREFIX, vec!["a".into()], recent).await.expect("watch").is_some());
        assert!(hubs.watch(&store, PREFIX, vec!["a".into()], recent - 2).await.expect("watch").is_none());
    }
}
