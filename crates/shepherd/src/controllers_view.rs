//! `/debug/controllers`: the controllers' queues, backoffs and counters, once or as a live stream.
//!
//! With `?watch=true` the answer is a stream of JSON lines, one snapshot each time it changes
//! (looked at every quarter second, the dashboard's pace) and at least one every few seconds so a
//! reader can tell a quiet controller from a dead connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Query;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use shepherd_runtime::Manager;

const SAMPLE: Duration = Duration::from_millis(250);
const HEARTBEAT: Duration = Duration::from_secs(5);

pub fn route(manager: Arc<Manager>) -> axum::routing::MethodRouter {
    axum::routing::get(move |Query(q): Query<HashMap<String, String>>| {
        let manager = manager.clone();
        async move {
            let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
            if watch { stream(manager) } else { axum::Json(manager.snapshot().to_json()).into_response() }
        }
    })
}

fn stream(manager: Arc<Manager>) -> Response {
    let lines = futures::stream::unfold((manager, None::<String>, None::<tokio::time::Instant>), |(m, last, sent)| async move {
        loop {
            if last.is_some() {
                tokio::time::sleep(SAMPLE).await;
            }
            let line = m.snapshot().to_json().to_string();
            let stale = sent.is_none_or(|t| t.elapsed() >= HEARTBEAT);
            if last.as_deref() != Some(line.as_str()) || stale {
                let bytes = format!("{line}\n");
                return Some((Ok::<_, std::convert::Infallible>(bytes), (m, Some(line), Some(tokio::time::Instant::now()))));
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(lines),
    )
        .into_response()
}
