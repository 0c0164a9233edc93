//! Serving custom objects through a version other than their storage one: with the `None`
//! conversion strategy only `apiVersion` changes.

use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};


/// The `apiVersion` objects of `res` carry when read through it: objects are stored in the
/// storage version and, with the `None` conversion strategy, only their `apiVersion` changes.
pub(crate) fn read_as(res: &ResourceInfo) -> Option<String> {
    let custom = kinds::custom(res)?;
    (!custom.storage).then(|| res.api_version())
}

/// A response to a request through a version other than the storage one, with the objects it
/// carries (one, or a list's items) in that version.
pub(crate) async fn convert_response(api_version: &str, response: axum::response::Response) -> axum::response::Response {
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return axum::response::Response::from_parts(parts, axum::body::Body::empty());
    };
    let converted = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut obj) if obj.get("kind").and_then(Value::as_str) != Some("Status") => {
            let is_object = |o: &Value| o.get("metadata").is_some() && o.get("kind").is_some_and(|k| k != "Table");
            if let Some(items) = obj.get_mut("items").and_then(Value::as_array_mut) {
                for item in items {
                    item["apiVersion"] = json!(api_version);
                }
                obj["apiVersion"] = json!(api_version);
            } else if is_object(&obj) && obj.get("apiVersion").and_then(Value::as_str) != Some("autoscaling/v1") {
                obj["apiVersion"] = json!(api_version);
            }
            serde_json::to_vec(&obj).map(axum::body::Bytes::from).unwrap_or(bytes)
        }
        _ => bytes,
    };
    let mut parts = parts;
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    axum::response::Response::from_parts(parts, axum::body::Body::from(converted))
}

/// A watch event of a custom object, in the version it was watched through.
pub(crate) fn convert_event(api_version: &str, e: crate::watch::WireEvent) -> crate::watch::WireEvent {
    if !matches!(e.kind, "ADDED" | "MODIFIED" | "DELETED") {
        return e;
    }
    match serde_json::from_slice::<Value>(&e.object) {
        Ok(mut obj) => {
            obj["apiVersion"] = json!(api_version);
            match serde_json::to_vec(&obj) {
                Ok(object) => crate::watch::WireEvent { kind: e.kind, object },
                Err(_) => e,
            }
        }
        Err(_) => e,
    }
}
