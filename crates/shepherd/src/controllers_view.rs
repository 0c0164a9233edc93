//! `/debug/controllers`: the controllers' queues, backoffs and counters, once or as a live stream,
//! and in demo mode (`--dashboard-demo`) `POST /debug/controllers/NAME` to change a running
//! controller's trigger mode and event loss.
//!
//! With `?watch=true` the answer is a stream of JSON lines, one snapshot each time it changes
//! (looked at every quarter second, the dashboard's pace) and at least one every few seconds so a
//! reader can tell a quiet controller from a dead connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use shepherd_runtime::{Manager, TriggerMode, TuneError};

const SAMPLE: Duration = Duration::from_millis(250);
const HEARTBEAT: Duration = Duration::from_secs(5);

pub fn routes(manager: Arc<Manager>, demo: bool) -> axum::Router {
    let reader = manager.clone();
    axum::Router::new()
        .route(
            "/debug/controllers",
            axum::routing::get(move |Query(q): Query<HashMap<String, String>>| {
                let manager = reader.clone();
                async move {
                    let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
                    if watch { stream(manager, demo) } else { axum::Json(view(&manager, demo)).into_response() }
                }
            }),
        )
        .route(
            "/debug/controllers/{name}",
            axum::routing::post(move |Path(name): Path<String>, body: Bytes| {
                let manager = manager.clone();
                async move { tune(&manager, demo, &name, &body) }
            }),
        )
}

fn view(manager: &Manager, demo: bool) -> Value {
    let mut v = manager.snapshot().to_json();
    v["demo"] = json!(demo);
    v
}

fn stream(manager: Arc<Manager>, demo: bool) -> Response {
    let lines = futures::stream::unfold((manager, None::<String>, None::<tokio::time::Instant>), move |(m, last, sent)| async move {
        loop {
            if last.is_some() {
                tokio::time::sleep(SAMPLE).await;
            }
            let line = view(&m, demo).to_string();
            let stale = sent.is_none_or(|t| t.elapsed() >= HEARTBEAT);
            if last.as_deref() != Some(line.as_str()) || stale {
                let bytes = format!("{line}\n");
                return Some((Ok::<_, std::convert::Infallible>(bytes), (m, Some(line), Some(tokio::time::Instant::now()))));
            }
        }
    });
    ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache")], Body::from_stream(lines)).into_response()
}

/// What a demo may change: any of the three, each optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Tune {
    mode: Option<String>,
    period_seconds: Option<f64>,
    event_loss: Option<f64>,
}

fn tune(manager: &Manager, demo: bool, name: &str, body: &[u8]) -> Response {
    let fail = |code: StatusCode, reason: &str, message: String| {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code.as_u16()});
        (code, axum::Json(status)).into_response()
    };
    if !demo {
        return fail(StatusCode::FORBIDDEN, "Forbidden",
            "changing controllers while they run is off: start the server with --dashboard-demo".into());
    }
    let t: Tune = match serde_json::from_slice(body) {
        Ok(t) => t,
        Err(e) => return fail(StatusCode::BAD_REQUEST, "BadRequest", format!("expected {{mode, periodSeconds, eventLoss}}: {e}")),
    };
    let invalid = |m: String| fail(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", m);
    let mode = match (&t.mode, t.period_seconds) {
        (None, None) => None,
        (None, Some(_)) => return invalid("periodSeconds needs a mode".into()),
        (Some(m), period) => {
            let mode: TriggerMode = match m.parse() {
                Ok(mode) => mode,
                Err(e) => return invalid(e),
            };
            match period {
                Some(p) if !(p.is_finite() && p > 0.0 && p <= 86_400.0) => {
                    return invalid(format!("periodSeconds must be more than 0 and at most a day, not {p}"));
                }
                Some(p) => Some(mode.with_period(Duration::from_secs_f64(p))),
                None => Some(mode),
            }
        }
    };
    match manager.tune(name, mode, t.event_loss) {
        Ok(()) => {
            tracing::warn!(controller = name, mode = ?t.mode, period = ?t.period_seconds, event_loss = ?t.event_loss,
                "controller changed by a demonstration");
            axum::Json(view(manager, demo)).into_response()
        }
        Err(e @ TuneError::NotFound(_)) => fail(StatusCode::NOT_FOUND, "NotFound", e.to_string()),
        Err(e) => invalid(e.to_string()),
    }
}
