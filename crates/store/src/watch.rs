//! Watch streams: the retained history after a revision, then live events, filtered by prefix.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::future::ready;
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use crate::state::{DiskHistory, LiveEvents, State, WatchStart, read_from_disk};
use crate::{Event, Revision, StoreError, StoreFuture};

/// A stream of events under one prefix. A consumer that falls further behind than the store's
/// watcher buffer loses its place in the live events; the stream then picks up again from the
/// history after the last event it delivered, and ends with `Err(Lagged)` only if the history no
/// longer reaches back that far. Writers are never slowed by a watcher.
pub struct WatchStream {
    inner: BoxStream<'static, Result<Arc<Event>, StoreError>>,
}

impl WatchStream {
    /// A watch stream of `events`, for a backend that makes its events itself, a wrapper around
    /// another store's watch, or a test. `events` must keep the promise of `Store::watch`: the
    /// changes under the watched prefix after the watch's revision, in revision order, with no gap
    /// and no duplicate. The stream ends after its first error, whatever `events` does next:
    /// `Expired` or `Lagged` (the consumer lists and watches again), or `Closed` (the store closed).
    pub fn from_stream<S>(events: S) -> Self
    where
        S: Stream<Item = Result<Arc<Event>, StoreError>> + Send + 'static,
    {
        let inner = events.scan(false, |failed, item| {
            if *failed {
                return futures::future::ready(None);
            }
            *failed = item.is_err();
            futures::future::ready(Some(item))
        });
        WatchStream { inner: Box::pin(inner) }
    }

    /// The watch every in-memory state serves (the local store's, the etcd cache's): the events
    /// after `from` retained in `state`'s history, then its live events. A watcher dropped from
    /// the live buffer resumes from the history when it still can.
    pub(crate) fn following<'a>(
        state: &Arc<RwLock<State>>,
        prefix: &str,
        from: Revision,
    ) -> StoreFuture<'a, Result<Self, StoreError>> {
        let started = match state.read() {
            Ok(s) => s.start_watch(prefix, from),
            Err(_) => Err(StoreError::Closed),
        };
        match started {
            Err(e) => ready(Err(e)).left_future(),
            Ok(WatchStart { older: None, replay, rx }) => {
                ready(Ok(Self::follow(state.clone(), prefix.to_string(), from, replay.into(), rx))).left_future()
            }
            // Events that have left memory are read from disk first, off the async workers.
            Ok(WatchStart { older: Some(older), replay, rx }) => {
                let (state, prefix) = (state.clone(), prefix.to_string());
                async move {
                    let events = older_then(older, &prefix, from, replay).await?;
                    Ok(Self::follow(state, prefix, from, events, rx))
                }
                .boxed()
                .right_future()
            }
        }
    }

    /// The watch of `prefix` that has delivered everything up to `from`: `replay`, then the live
    /// events of `rx` after it, resuming from the history whenever it falls out of the live buffer.
    fn follow(state: Arc<RwLock<State>>, prefix: String, from: Revision, replay: VecDeque<Arc<Event>>, rx: LiveEvents) -> Self {
        struct S {
            state: Arc<RwLock<State>>,
            prefix: String,
            /// The last revision received: a watcher dropped from the live buffer resumes after
            /// it. Its feed carries only the events under its prefix (`State::start_watch`), so
            /// writes elsewhere neither push it out of the buffer nor leave it behind the history.
            last: Revision,
            replay: VecDeque<Arc<Event>>,
            rx: LiveEvents,
        }
        let state = S { state, prefix, last: from, replay, rx };
        let events = futures::stream::unfold(state, |mut s| async move {
            if let Some(e) = s.replay.pop_front() {
                s.last = e.revision();
                return Some((Ok(e), s));
            }
            loop {
                match s.rx.recv().await {
                    // Events up to `last` were already replayed from history.
                    Ok(e) if e.revision() <= s.last => continue,
                    Ok(e) => {
                        s.last = e.revision();
                        return Some((Ok(e), s));
                    }
                    // Closed: the events' state was replaced (an etcd cache reloaded after a
                    // compaction) or closed; a replaced one has them if nothing fell between the two.
                    Err(e @ (RecvError::Lagged(_) | RecvError::Closed)) => {
                        if let RecvError::Lagged(missed) = e {
                            // Which watches fall behind, for whoever tunes the buffer or the history.
                            tracing::debug!(prefix = %s.prefix, after = s.last, missed, "a watch fell out of its live buffer; resuming from the history");
                        }
                        match start(&s.state, &s.prefix, s.last).await {
                            Ok((replay, rx)) => {
                                s.replay = replay;
                                s.rx = rx;
                                if let Some(e) = s.replay.pop_front() {
                                    s.last = e.revision();
                                    return Some((Ok(e), s));
                                }
                            }
                            Err(StoreError::Closed) => return Some((Err(StoreError::Closed), s)),
                            Err(_) => return Some((Err(StoreError::Lagged), s)),
                        }
                    }
                }
            }
        });
        WatchStream::from_stream(events)
    }
}

/// The events after `from` under `prefix` that the history holds, those that left memory read
/// back from disk first, and the live subscription that continues where they end. Called only
/// when a watch resumes (it fell out of its live buffer, or the events' state was replaced), so
/// it counts the resume.
async fn start(state: &RwLock<State>, prefix: &str, from: Revision) -> Result<(VecDeque<Arc<Event>>, LiveEvents), StoreError> {
    let WatchStart { older, replay, rx } = {
        let s = state.read().map_err(|_| StoreError::Closed)?;
        s.note_resume();
        s.start_watch(prefix, from)?
    };
    let events = match older {
        Some(older) => older_then(older, prefix, from, replay).await?,
        None => replay.into(),
    };
    Ok((events, rx))
}

/// The events under `prefix` after `from` that have left memory, read from the disk history up to
/// its revision, followed by `replay`, the ones memory still holds.
async fn older_then(
    (disk, through): (Arc<dyn DiskHistory>, Revision),
    prefix: &str,
    from: Revision,
    replay: Vec<Arc<Event>>,
) -> Result<VecDeque<Arc<Event>>, StoreError> {
    let mut events = VecDeque::from(read_from_disk(disk, prefix, from, through).await?);
    events.extend(replay);
    Ok(events)
}

impl Stream for WatchStream {
    type Item = Result<Arc<Event>, StoreError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{EventKind, KeyValue};

    fn created(revision: Revision) -> Result<Arc<Event>, StoreError> {
        let kv = KeyValue {
            key: format!("/k{revision}"),
            value: Bytes::new(),
            create_revision: revision,
            mod_revision: revision,
        };
        Ok(Arc::new(Event { kind: EventKind::Created, kv, prev: None }))
    }

    #[tokio::test]
    async fn a_watch_stream_from_another_stream_passes_its_events_and_ends_after_its_first_error() {
        let source = futures::stream::iter([created(1), created(2), Err(StoreError::Lagged), created(3)]);
        let got: Vec<_> = WatchStream::from_stream(source).collect().await;
        let revisions: Vec<_> = got.into_iter().map(|e| e.map(|e| e.revision())).collect();
        assert_eq!(revisions, [Ok(1), Ok(2), Err(StoreError::Lagged)]);
    }
}
