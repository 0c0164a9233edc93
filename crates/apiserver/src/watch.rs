//! Watches as the API serves them: optional initial state, then every change in order, filtered
//! by selectors, with bookmarks and a timeout.

use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use serde_json::json;
use shepherd_api::ApiError;
use shepherd_api::kinds::ResourceInfo;
use shepherd_api::selector::Selection;
use shepherd_store::{EventKind, Revision, StoreError};
use tokio::time::Instant;

use crate::codec;
use crate::metrics::WatchGuard;
use crate::service::ApiService;

#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// `None` or `Some(0)`: start with ADDED for every existing object.
    pub resource_version: Option<Revision>,
    pub allow_bookmarks: bool,
    /// Send the current state first, then a bookmark marking its end (`sendInitialEvents=true`).
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    pub bookmark_interval: Option<Duration>,
}

/// One event of a watch, with its object already rendered as wire JSON.
#[derive(Debug, Clone)]
pub struct WireEvent {
    pub kind: &'static str,
    pub object: Vec<u8>,
}

impl WireEvent {
    /// One line of the watch response: `{"type":"ADDED","object":{...}}\n`.
    pub fn to_line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.object.len() + 32);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(self.kind.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        out.extend_from_slice(&self.object);
        out.extend_from_slice(b"}\n");
        out
    }

    fn error(e: &ApiError) -> Self {
        WireEvent { kind: "ERROR", object: e.to_status().to_string().into_bytes() }
    }

    fn bookmark(res: &ResourceInfo, revision: Revision, initial_events_end: bool) -> Self {
        let mut meta = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"apiVersion": res.api_version(), "kind": res.kind, "metadata": meta});
        WireEvent { kind: "BOOKMARK", object: obj.to_string().into_bytes() }
    }
}

/// Whether the stored object `value` is selected. Stored text is the wire JSON without its
/// resourceVersion, which no selector reads; text that is not JSON is not selected.
fn selects(selection: &Selection, value: &[u8]) -> bool {
    selection.matches_json(value).unwrap_or(false)
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);

impl ApiService {
    /// Starts a watch. Errors found before streaming (bad selectors) are returned; an expired
    /// resourceVersion becomes a single ERROR event carrying a 410 `Status`, as Kubernetes does.
    pub async fn watch(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        opts: WatchOptions,
    ) -> Result<BoxStream<'static, WireEvent>, ApiError> {
        let filter = Selection::parse(opts.label_selector.as_deref(), opts.field_selector.as_deref())?;
        let prefix = match (res.namespaced, ns) {
            (true, Some(ns)) => res.namespace_prefix(ns),
            _ => res.key_prefix(),
        };
        let store = self.store.clone();
        let guard = WatchGuard::new(self.metrics.clone());
        let initial = opts.send_initial_events || opts.resource_version.is_none_or(|rv| rv == 0);

        // Initial state: a consistent list, and the revision it was read at to watch from.
        let mut first: Vec<WireEvent> = Vec::new();
        let from = if initial {
            let listed = store.list(&prefix, None, None).await
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            for kv in &listed.items {
                if selects(&filter, &kv.value) {
                    first.push(WireEvent { kind: "ADDED", object: codec::render(kv) });
                }
            }
            if opts.send_initial_events {
                first.push(WireEvent::bookmark(res, listed.revision, true));
            }
            listed.revision
        } else {
            opts.resource_version.unwrap_or(0)
        };
        // A cluster-wide watch of the objects bound to given nodes is served by the kind's hub.
        // (Pods not bound, `spec.nodeName=`, have no node to be found under.)
        let nodes = filter.fields.as_ref().and_then(|f| f.values_of(crate::watch_hub::NODE_FIELD)).filter(|n| !n.contains(""));
        let by_node = match nodes {
            Some(nodes) if !res.namespaced || ns.is_none() => {
                self.node_watches.watch(&store, &prefix, nodes.iter().cloned().collect(), from).await.ok().flatten()
            }
            _ => None,
        };
        let events = match by_node {
            Some(events) => Ok(shepherd_store::WatchStream::from_stream(events)),
            None => store.watch(&prefix, from).await,
        };
        let events = match events {
            Ok(w) => w,
            Err(e) => {
                // A 410 for a revision gone from the history; a 503 for a store shutting down.
                let err = match e {
                    StoreError::Closed | StoreError::Unavailable(_) => crate::service::store_failure(e),
                    e => ApiError::Expired(e.to_string()),
                };
                return Ok(futures::stream::iter(vec![WireEvent::error(&err)]).boxed());
            }
        };

        let deadline = Instant::now() + opts.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let bookmark_every = opts.bookmark_interval.unwrap_or(DEFAULT_BOOKMARK_INTERVAL);
        let bookmarks = opts.allow_bookmarks;
        struct St {
            events: shepherd_store::WatchStream,
            filter: Selection,
            last: Revision,
            next_bookmark: Instant,
            deadline: Instant,
            done: bool,
            _guard: WatchGuard,
        }
        let st = St { events, filter, last: from, next_bookmark: Instant::now() + bookmark_every, deadline, done: false, _guard: guard };
        let live = futures::stream::unfold(st, move |mut st| async move {
            loop {
                if st.done {
                    return None;
                }
                let wake = if bookmarks { st.next_bookmark.min(st.deadline) } else { st.deadline };
                let next = tokio::select! {
                    e = st.events.next() => e,
                    _ = tokio::time::sleep_until(wake) => {
                        if Instant::now() >= st.deadline {
                            return None;
                        }
                        st.next_bookmark = Instant::now() + bookmark_every;
                        return Some((WireEvent::bookmark(res, st.last, false), st));
                    }
                };
                let event = match next {
                    // The store closed (the server is stopping): the watch ends as at its timeout, and
                    // the client watches again from its last revision, here after a restart or elsewhere.
                    None | Some(Err(StoreError::Closed)) => return None,
                    Some(Err(e)) => {
                        st.done = true;
                        let err = ApiError::Expired(format!("{e}"));
                        return Some((WireEvent::error(&err), st));
                    }
                    Some(Ok(e)) => e,
                };
                st.last = event.revision();
                let now_matches = event.kind != EventKind::Deleted && selects(&st.filter, &event.kv.value);
                let was_matching = event.prev.as_ref().is_some_and(|p| selects(&st.filter, &p.value));
                let kind = match (event.kind, was_matching, now_matches) {
                    (EventKind::Created, _, true) => "ADDED",
                    (EventKind::Updated, true, true) => "MODIFIED",
                    (EventKind::Updated, false, true) => "ADDED",
                    (EventKind::Updated, true, false) => "DELETED",
                    (EventKind::Deleted, true, _) => "DELETED",
                    _ => continue,
                };
                let object = codec::render(&event.kv);
                return Some((WireEvent { kind, object }, st));
            }
        });
        Ok(futures::stream::iter(first).chain(live).boxed())
    }
}

