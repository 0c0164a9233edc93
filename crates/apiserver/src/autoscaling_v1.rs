//! `autoscaling/v1` HorizontalPodAutoscalers, served as a conversion of the stored `autoscaling/v2`
//! objects (kubectl before 1.28 creates v1 with `kubectl autoscale`): a request body is converted to
//! v2 and handled there, the answer converted back. v1 knows only a CPU utilization target, so a v1
//! view of a v2 object shows its first CPU Utilization metric; watches are served in v2 only.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, header};
use axum::response::Response;
use serde_json::{Map, Value, json};
use shepherd_api::{ApiError, JsonPath};

use crate::http::{AppState, error_response};

pub(crate) const VERSION: &str = "v1";
const V1: &str = "autoscaling/v1";
const V2: &str = "autoscaling/v2";
const HPA: &str = "HorizontalPodAutoscaler";

/// A v1 object as v2: `targetCPUUtilizationPercentage` becomes a Resource metric.
pub(crate) fn to_v2(v1: &Value) -> Value {
    let mut out = v1.clone();
    out["apiVersion"] = json!(V2);
    if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut)
        && let Some(target) = spec.remove("targetCPUUtilizationPercentage")
        && !target.is_null()
    {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": target}}}]),
        );
    }
    if let Some(m) = out.as_object_mut() {
        m.remove("status");
    }
    out
}

fn cpu_utilization(list: Option<&Value>, ptr: &str) -> Option<Value> {
    list?.as_array()?.iter().find(|m| m["type"] == "Resource" && m.at("/resource/name") == Some(&json!("cpu"))).and_then(|m| m.at(ptr).cloned())
}

/// A v2 object as v1 shows it.
pub(crate) fn to_v1(v2: &Value) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(V1));
    out.insert("kind".into(), json!(HPA));
    out.insert("metadata".into(), v2.get("metadata").cloned().unwrap_or_else(|| json!({})));
    let spec = v2.get("spec").cloned().unwrap_or(Value::Null);
    let mut s = Map::new();
    for key in ["scaleTargetRef", "minReplicas", "maxReplicas"] {
        if let Some(v) = spec.get(key) {
            s.insert(key.into(), v.clone());
        }
    }
    if let Some(t) = cpu_utilization(spec.get("metrics"), "/resource/target/averageUtilization") {
        s.insert("targetCPUUtilizationPercentage".into(), t);
    }
    out.insert("spec".into(), Value::Object(s));
    let status = v2.get("status").cloned().unwrap_or(Value::Null);
    let mut st = Map::new();
    for key in ["observedGeneration", "lastScaleTime", "currentReplicas", "desiredReplicas"] {
        if let Some(v) = status.get(key) {
            st.insert(key.into(), v.clone());
        }
    }
    if let Some(u) = cpu_utilization(status.get("currentMetrics"), "/resource/current/averageUtilization") {
        st.insert("currentCPUUtilizationPercentage".into(), u);
    }
    st.entry("currentReplicas").or_insert(json!(0));
    st.entry("desiredReplicas").or_insert(json!(0));
    out.insert("status".into(), Value::Object(st));
    Value::Object(out)
}

/// A v2 answer (object or list) as v1; Status, Table and anything else pass through.
fn response_to_v1(mut body: Value) -> Value {
    match body.get("kind").and_then(Value::as_str) {
        Some("HorizontalPodAutoscaler") => to_v1(&body),
        Some("HorizontalPodAutoscalerList") => {
            if let Some(items) = body.get_mut("items").and_then(Value::as_array_mut) {
                for item in items.iter_mut() {
                    *item = to_v1(item);
                }
            }
            body["apiVersion"] = json!(V1);
            body
        }
        _ => body,
    }
}

/// `/apis/autoscaling/v1/...`: rewritten to v2, handled, answered in v1.
pub(crate) async fn serve(app: AppState, rest: &[&str], req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let watching = parts.uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    if watching {
        return error_response(&ApiError::BadRequest(format!("watch {HPA}s through {V2}; {V1} serves no watch")));
    }
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let path = format!("/apis/autoscaling/v2/{}{query}", rest.join("/"));
    parts.uri = match path.parse() {
        Ok(u) => u,
        Err(_) => return error_response(&ApiError::resource_not_found()),
    };
    let body = if matches!(parts.method, Method::POST | Method::PUT) {
        let limit = app.config.max_body_bytes;
        let bytes = match axum::body::to_bytes(body, limit).await {
            Ok(b) => b,
            Err(_) => return error_response(&ApiError::RequestEntityTooLarge(format!("request body is larger than {limit} bytes"))),
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v.get("kind").and_then(Value::as_str) == Some(HPA) => {
                parts.headers.remove(header::CONTENT_LENGTH);
                Body::from(to_v2(&v).to_string())
            }
            Ok(_) => Body::from(bytes),
            Err(e) => return error_response(&ApiError::BadRequest(format!("{V1} takes JSON bodies: {e}"))),
        }
    } else {
        body
    };
    let segs: Vec<&str> = rest.to_vec();
    let response = crate::http::serve_group_version(app, "autoscaling", "v2", &segs, Request::from_parts(parts, body)).await;
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let converted = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => Bytes::from(response_to_v1(v).to_string()),
        Err(_) => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(converted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_target_round_trips_between_v1_and_v2() {
        let v1 = json!({"apiVersion": V1, "kind": HPA, "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 5, "minReplicas": 1,
                "targetCPUUtilizationPercentage": 50}});
        let v2 = to_v2(&v1);
        assert_eq!(v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 50);
        assert!(v2["spec"].get("targetCPUUtilizationPercentage").is_none());
        let mut stored = v2.clone();
        stored["status"] = json!({"currentReplicas": 2, "desiredReplicas": 3,
            "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 80}}}]});
        let back = to_v1(&stored);
        assert_eq!(back["spec"], v1["spec"]);
        assert_eq!(back["status"], json!({"currentReplicas": 2, "desiredReplicas": 3, "currentCPUUtilizationPercentage": 80}));
    }
}
