//! A request answered before its body was read (a 401, a 404, a 413, a refused write) leaves the
//! client still sending, and closing the connection then resets it: clients that send the whole
//! body before reading (Python's requests, for one) see a reset instead of the answer. So the rest
//! of such a body is read and dropped, up to a size and a time, before the answer goes out, as Go's
//! HTTP server (kube-apiserver's) reads on for a bounded amount.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use tokio::sync::oneshot;

/// The most of an unread body read and dropped; beyond it the connection is closed as before.
const DRAIN_MAX_BYTES: usize = 256 << 20;
/// How long a client may take to send the rest.
const DRAIN_MAX_TIME: Duration = Duration::from_secs(30);

/// The middleware: hands the handler a body that, dropped unfinished, comes back here to be read out.
pub(crate) async fn drain_unread_body(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let (tx, mut rx) = oneshot::channel();
    let watched = Body::new(Watched { inner: Some(body), left: Some(tx) });
    let response = next.run(Request::from_parts(parts, watched)).await;
    // The body still held elsewhere (a stream the answer goes on reading) is not waited for.
    if let Ok(mut rest) = rx.try_recv() {
        let drained = tokio::time::timeout(DRAIN_MAX_TIME, async {
            let mut read = 0usize;
            while let Some(Ok(frame)) = rest.frame().await {
                read += frame.data_ref().map_or(0, Bytes::len);
                if read > DRAIN_MAX_BYTES {
                    return false;
                }
            }
            true
        })
        .await;
        if !matches!(drained, Ok(true)) {
            tracing::debug!("an unread request body was too large or too slow to read out");
        }
    }
    response
}

/// A request body that gives what is left of it back through `left` when dropped unfinished.
struct Watched {
    inner: Option<Body>,
    left: Option<oneshot::Sender<Body>>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.inner = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(HttpBody::size_hint).unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let (Some(inner), Some(left)) = (self.inner.take(), self.left.take())
            && !inner.is_end_stream()
        {
            let _ = left.send(inner);
        }
    }
}
