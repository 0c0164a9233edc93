//! Content negotiation: which encoding a client gets, and the rewriting of JSON answers into protobuf.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::Value;

use super::{MEDIA_TYPE, WATCH_MEDIA_TYPE, encode, watch_frame};

/// What a request's `Accept` header allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accept {
    /// JSON: the default, and whenever JSON (or a wildcard) comes first.
    Json,
    /// Protobuf first, JSON acceptable too (client-go's `application/vnd.kubernetes.protobuf, application/json`).
    Protobuf,
    /// Protobuf and nothing else.
    OnlyProtobuf,
}

impl Accept {
    pub(crate) fn of(headers: &HeaderMap) -> Accept {
        let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else { return Accept::Json };
        // (preference, position, is protobuf) of every range this server can answer.
        let mut ranges: Vec<(f32, usize, bool)> = Vec::new();
        for (i, range) in accept.split(',').enumerate() {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let mut q = 1.0f32;
            let mut other_params = false;
            for p in parts {
                match p.split_once('=') {
                    Some(("q", v)) => q = v.trim().parse().unwrap_or(0.0),
                    Some(("stream", "watch")) => {}
                    Some(_) => other_params = true,
                    None => {}
                }
            }
            if q <= 0.0 {
                continue;
            }
            match media.as_str() {
                // `as=Table` and friends name a JSON-only rendering: not ours to answer in protobuf.
                MEDIA_TYPE if !other_params => ranges.push((q, i, true)),
                "application/json" | "application/*" | "*/*" => ranges.push((q, i, false)),
                _ => {}
            }
        }
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        match ranges.first() {
            Some((_, _, true)) if ranges.iter().all(|r| r.2) => Accept::OnlyProtobuf,
            Some((_, _, true)) => Accept::Protobuf,
            _ => Accept::Json,
        }
    }
}

fn is_json(r: &Response) -> bool {
    r.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"))
}

/// Rewrites a JSON answer as protobuf when the client prefers it and the object has a protobuf form;
/// anything else (a Table, a kind without a protobuf message, text) is passed on as it is.
/// A watch is rewritten only when the client accepts nothing but protobuf.
pub(crate) async fn respond(accept: Accept, watching: bool, response: Response) -> Response {
    if accept == Accept::Json || !is_json(&response) {
        return response;
    }
    if watching {
        return if accept == Accept::OnlyProtobuf { watch_stream(response) } else { response };
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let encoded = serde_json::from_slice::<Value>(&bytes).ok().and_then(|obj| encode(&obj));
    match encoded {
        Some(Ok(pb)) => {
            parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(pb))
        }
        Some(Err(e)) => {
            tracing::warn!(error = %e, "answering in JSON: the object does not fit its protobuf message");
            Response::from_parts(parts, Body::from(bytes))
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

/// Turns a JSON watch stream (one event per line) into protobuf frames.
fn watch_stream(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let mut pending: Vec<u8> = Vec::new();
    let frames = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        pending.extend_from_slice(&chunk);
        let mut out = Vec::new();
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let event: Value = serde_json::from_slice(&line).map_err(std::io::Error::other)?;
            let kind = event.get("type").and_then(Value::as_str).unwrap_or("ERROR");
            let object = event.get("object").unwrap_or(&Value::Null);
            out.extend(watch_frame(kind, object).map_err(std::io::Error::other)?);
        }
        Ok::<_, std::io::Error>(Bytes::from(out))
    });
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(WATCH_MEDIA_TYPE));
    Response::from_parts(parts, Body::from_stream(frames))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> Accept {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(value).expect("header"));
        Accept::of(&h)
    }

    #[test]
    fn json_stays_the_default_and_protobuf_is_given_to_who_asks_for_it_first() {
        assert_eq!(Accept::of(&HeaderMap::new()), Accept::Json);
        assert_eq!(accept("application/json"), Accept::Json);
        assert_eq!(accept("*/*"), Accept::Json);
        assert_eq!(accept("application/json, application/vnd.kubernetes.protobuf"), Accept::Json);
        assert_eq!(accept("application/vnd.kubernetes.protobuf, application/json"), Accept::Protobuf);
        assert_eq!(accept("application/vnd.kubernetes.protobuf,*/*"), Accept::Protobuf);
        assert_eq!(accept("application/vnd.kubernetes.protobuf"), Accept::OnlyProtobuf);
        assert_eq!(accept("application/vnd.kubernetes.protobuf;stream=watch"), Accept::OnlyProtobuf);
        assert_eq!(accept("application/vnd.kubernetes.protobuf;q=0.5, application/json"), Accept::Json);
        assert_eq!(
            accept("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json"),
            Accept::Json
        );
    }
}
