//! Watch streams: the retained history after a revision, then live events, filtered by prefix.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::{Event, Revision, StoreError};

/// Re-subscribes after a revision: the history after it, and a receiver of the live events.
pub(crate) type Resume =
    Box<dyn Fn(Revision) -> Result<(Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>), StoreError> + Send + Sync>;

/// A stream of events under one prefix. A consumer that falls further behind than the store's
/// watcher buffer loses its place in the live events; the stream then picks up again from the
/// history after the last event it delivered, and ends with `Err(Lagged)` only if the history no
/// longer reaches back that far. Writers are never slowed by a watcher.
pub struct WatchStream {
    inner: BoxStream<'static, Result<Arc<Event>, StoreError>>,
}

impl WatchStream {
    pub(crate) fn new(
        prefix: String,
        from: Revision,
        replay: Vec<Arc<Event>>,
        rx: broadcast::Receiver<Arc<Event>>,
        resume: Resume,
    ) -> Self {
        struct S {
            prefix: String,
            last: Revision,
            replay: VecDeque<Arc<Event>>,
            rx: broadcast::Receiver<Arc<Event>>,
            resume: Resume,
            done: bool,
        }
        let state = S { prefix, last: from, replay: replay.into(), rx, resume, done: false };
        let inner = futures::stream::unfold(state, |mut s| async move {
            if s.done {
                return None;
            }
            if let Some(e) = s.replay.pop_front() {
                s.last = e.revision();
                return Some((Ok(e), s));
            }
            loop {
                match s.rx.recv().await {
                    // Events up to `last` were already replayed from history.
                    Ok(e) if e.revision() <= s.last => continue,
                    Ok(e) if !e.kv.key.starts_with(&s.prefix) => continue,
                    Ok(e) => {
                        s.last = e.revision();
                        return Some((Ok(e), s));
                    }
                    // Closed: the events' state was replaced (an etcd cache reloaded after a
                    // compaction); the new one has them if nothing fell between the two.
                    Err(RecvError::Lagged(_) | RecvError::Closed) => match (s.resume)(s.last) {
                        Ok((replay, rx)) => {
                            s.replay = replay.into();
                            s.rx = rx;
                            if let Some(e) = s.replay.pop_front() {
                                s.last = e.revision();
                                return Some((Ok(e), s));
                            }
                        }
                        Err(StoreError::Closed) => {
                            s.done = true;
                            return Some((Err(StoreError::Closed), s));
                        }
                        Err(_) => {
                            s.done = true;
                            return Some((Err(StoreError::Lagged), s));
                        }
                    },
                }
            }
        });
        WatchStream { inner: Box::pin(inner) }
    }
}

impl Stream for WatchStream {
    type Item = Result<Arc<Event>, StoreError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
