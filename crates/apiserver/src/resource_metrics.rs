//! `metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics): the latest usage each node agent reported,
//! held in memory and never written to the store, as metrics-server holds its last scrape.
//!
//! Each agent POSTs a NodeMetrics of its node to `/apis/metrics.k8s.io/v1beta1/nodes` with a
//! Shepherd-only field `pods`, the PodMetrics of the pods it runs; a report replaces the node's
//! previous one whole, so a pod that is gone disappears with the next report. Reads are get and
//! list (all namespaces, one namespace, label and `metadata.name` field selectors), as
//! metrics-server serves them to `kubectl top` and the autoscaler.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::{ApiError, FieldSelector, LabelSelector};
use shepherd_pack::{Packed, Packer};

use crate::http::AppState;

pub(crate) const GROUP: &str = "metrics.k8s.io";
const VERSION: &str = "v1beta1";
/// A node whose agent stopped reporting for this long has no metrics any more (its agent is
/// gone or cut off; serving hour-old usage would mislead the autoscaler).
const STALE_AFTER: Duration = Duration::from_secs(60);
/// Largest report accepted: a node's pods at about 500 bytes each, for far more pods than a node runs.
const MAX_REPORT_BYTES: usize = 4 * 1024 * 1024;

struct Report {
    received: Instant,
    node: Value,
    pods: Vec<PodEntry>,
}

/// One PodMetrics as served, kept as its JSON text packed against the others': parsed, a
/// PodMetrics is ~3 KB of small maps against ~300 bytes of text (a few dozen packed), and the
/// table holds one for every running pod while it is read only by the occasional `kubectl top`
/// or autoscaler pass.
struct PodEntry {
    namespace: String,
    name: String,
    json: Packed,
}

/// What the packer calls the PodMetrics' kind.
const PACKED_KIND: &str = "podmetrics";

impl PodEntry {
    fn new(pod: &Value, packer: &mut Packer) -> Result<Self, ApiError> {
        let json = serde_json::to_vec(pod).map_err(|e| ApiError::Internal(format!("encoding PodMetrics: {e}")))?;
        let json = packer.pack(PACKED_KIND, &json.into());
        Ok(PodEntry { namespace: namespace_of(pod).to_string(), name: name_of(pod).to_string(), json })
    }

    /// The PodMetrics as it was reported; `None` only if the text kept were not JSON, which
    /// `new` rules out.
    fn value(&self) -> Option<Value> {
        serde_json::from_slice(&self.json.unpack()).ok()
    }
}

/// The latest report of every node.
#[derive(Default)]
pub struct MetricsTable {
    /// By node name; replaced whole by each report of that node.
    nodes: RwLock<HashMap<String, Report>>,
    packer: Mutex<Packer>,
}

// Looked up field by field rather than by a parsed path: a report names each of its nodes' pods
// several times over, and every running pod is in a report four times a minute.
fn name_of(v: &Value) -> &str {
    v.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("")
}

fn namespace_of(v: &Value) -> &str {
    v.get("metadata").and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or("")
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(message.into())
}

/// A node's report, validated and in its served form, with the node's name.
fn checked(mut body: Value, packer: &Mutex<Packer>) -> Result<(String, Report), ApiError> {
    let node = name_of(&body).to_string();
    if node.is_empty() {
        return Err(bad("a metrics report needs metadata.name, the node's name"));
    }
    let pods = match body.as_object_mut().and_then(|m| m.remove("pods")) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(pods)) => pods,
        Some(_) => return Err(bad("pods of a metrics report must be a list of PodMetrics")),
    };
    for (i, p) in pods.iter().enumerate() {
        if name_of(p).is_empty() || namespace_of(p).is_empty() || !p["containers"].is_array() {
            return Err(bad(format!("pods[{i}] of the report of node {node} needs metadata.name, metadata.namespace and containers")));
        }
    }
    let now = crate::service::now_rfc3339();
    let node_metrics = finish(&kinds::NODE_METRICS, body, &now);
    let mut packer = packer.lock().unwrap_or_else(|e| e.into_inner());
    let pods = pods.into_iter().map(|p| PodEntry::new(&finish(&kinds::POD_METRICS, p, &now), &mut packer)).collect::<Result<_, _>>()?;
    Ok((node, Report { received: Instant::now(), node: node_metrics, pods }))
}

/// The nodes a report (a NodeMetrics or a NodeMetricsList) speaks for.
fn reported_nodes(body: &Value) -> Vec<&str> {
    match body.get("items").and_then(Value::as_array) {
        Some(items) if body.get("kind").and_then(Value::as_str) == Some(kinds::NODE_METRICS.list_kind().as_str()) => {
            items.iter().map(name_of).collect()
        }
        _ => vec![name_of(body)],
    }
}

/// Whether `res` is one of the metrics resources (served from the table, not the store).
pub(crate) fn is_metrics(res: &ResourceInfo) -> bool {
    res.group == GROUP
}

impl MetricsTable {
    /// Takes a node's report; answers the NodeMetrics as it will be served.
    pub(crate) fn report(&self, body: Value) -> Result<Value, ApiError> {
        let (node, report) = checked(body, &self.packer)?;
        let served = report.node.clone();
        self.nodes.write().unwrap_or_else(|e| e.into_inner()).insert(node, report);
        Ok(served)
    }

    /// Takes a report (a NodeMetrics) or several nodes' reports in one `NodeMetricsList`, as an
    /// agent that stands in for many nodes sends them. A list is taken whole or not at all.
    /// Answers what will be served: the NodeMetrics, or the list of them.
    pub(crate) fn report_any(&self, body: Value) -> Result<Value, ApiError> {
        if body.get("kind").and_then(Value::as_str) != Some(kinds::NODE_METRICS.list_kind().as_str()) {
            return self.report(body);
        }
        let items = match body {
            Value::Object(mut m) => match m.remove("items") {
                Some(Value::Array(items)) => items,
                None | Some(Value::Null) => Vec::new(),
                Some(_) => return Err(bad("items of a NodeMetricsList must be a list of NodeMetrics")),
            },
            _ => Vec::new(),
        };
        let reports = items.into_iter().map(|r| checked(r, &self.packer)).collect::<Result<Vec<_>, _>>()?;
        let served: Vec<Value> = reports.iter().map(|(_, r)| r.node.clone()).collect();
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        nodes.extend(reports);
        Ok(list_body(&kinds::NODE_METRICS, served))
    }

    fn fresh<T>(&self, f: impl FnOnce(&mut dyn Iterator<Item = &Report>) -> T) -> T {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        let mut fresh = nodes.values().filter(|r| r.received.elapsed() < STALE_AFTER);
        f(&mut fresh)
    }

    /// NodeMetrics, sorted by name.
    pub(crate) fn nodes(&self, labels: &LabelSelector, fields: &FieldSelector) -> Vec<Value> {
        let mut out: Vec<Value> = self.fresh(|reports| {
            reports.map(|r| &r.node).filter(|n| labels.matches_object(n) && fields.matches(n)).cloned().collect()
        });
        out.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        out
    }

    /// PodMetrics of one namespace or all, sorted by namespace and name.
    pub(crate) fn pods(&self, namespace: Option<&str>, labels: &LabelSelector, fields: &FieldSelector) -> Vec<Value> {
        let mut out: Vec<Value> = self.fresh(|reports| {
            reports
                .flat_map(|r| r.pods.iter())
                .filter(|p| namespace.is_none_or(|ns| p.namespace == ns))
                .filter_map(PodEntry::value)
                .filter(|p| labels.matches_object(p) && fields.matches(p))
                .collect()
        });
        out.sort_by(|a, b| (namespace_of(a), name_of(a)).cmp(&(namespace_of(b), name_of(b))));
        out
    }

    pub(crate) fn node(&self, name: &str) -> Result<Value, ApiError> {
        self.fresh(|reports| reports.map(|r| &r.node).find(|n| name_of(n) == name).cloned())
            .ok_or_else(|| ApiError::not_found("nodemetrics.metrics.k8s.io", name))
    }

    pub(crate) fn pod(&self, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.fresh(|reports| {
            reports.flat_map(|r| r.pods.iter()).find(|p| p.namespace == namespace && p.name == name).and_then(PodEntry::value)
        })
        .ok_or_else(|| ApiError::not_found("podmetrics.metrics.k8s.io", name))
    }

    /// A list as the in-process client and the HTTP layer answer it.
    pub(crate) fn list(&self, res: &ResourceInfo, namespace: Option<&str>, labels: Option<&str>, fields: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let labels = LabelSelector::parse(labels.unwrap_or(""))?;
        let fields = FieldSelector::parse(fields.unwrap_or(""))?;
        Ok(if res.plural == "nodes" { self.nodes(&labels, &fields) } else { self.pods(namespace, &labels, &fields) })
    }

    pub(crate) fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        match (res.plural, namespace) {
            ("nodes", _) => self.node(name),
            (_, Some(ns)) => self.pod(ns, name),
            (_, None) => Err(bad("podmetrics are namespaced: a namespace is required")),
        }
    }
}

/// The served form: apiVersion and kind, and the metadata metrics-server sets.
fn finish(res: &ResourceInfo, mut v: Value, now: &str) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(res.api_version()));
        m.insert("kind".into(), json!(res.kind));
    }
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.entry("creationTimestamp").or_insert_with(|| json!(now));
    }
    v
}

fn list_body(res: &ResourceInfo, items: Vec<Value>) -> Value {
    json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {}, "items": items})
}

fn respond(code: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    r
}

/// `/apis/metrics.k8s.io/{version}/{rest}`.
pub(crate) async fn serve(app: &AppState, version: &str, rest: &[&str], req: Request) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let (verb, resource, result) = handle(app, version, rest, req).await;
    let response = match result {
        Ok((code, body)) => respond(code, &body),
        Err(e) => crate::http::error_response(&e),
    };
    if method != Method::OPTIONS {
        app.svc.metrics.observe_request(verb, resource, response.status().as_u16(), started);
    }
    response
}

async fn handle(
    app: &AppState,
    version: &str,
    rest: &[&str],
    req: Request,
) -> (&'static str, &'static str, Result<(StatusCode, Value), ApiError>) {
    let table = &app.svc.resource_metrics;
    if version != VERSION {
        return ("GET", "unknown", Err(ApiError::resource_not_found()));
    }
    let query: HashMap<String, String> =
        axum::extract::Query::<HashMap<String, String>>::try_from_uri(req.uri()).map(|q| q.0).unwrap_or_default();
    let (labels, fields) = (query.get("labelSelector").map(String::as_str), query.get("fieldSelector").map(String::as_str));
    let get = req.method() == Method::GET;
    match rest {
        ["nodes"] if req.method() == Method::POST => {
            // A node agent reports for its own node only (others are authorized by RBAC alone).
            let reporter = req.extensions().get::<crate::auth::UserInfo>().and_then(|u| u.node_name().map(str::to_string));
            let body = match axum::body::to_bytes(req.into_body(), MAX_REPORT_BYTES).await {
                Ok(b) => b,
                Err(_) => return ("POST", "nodes", Err(ApiError::RequestEntityTooLarge("metrics report too large".into()))),
            };
            let parsed = serde_json::from_slice::<Value>(&body).map_err(|e| bad(format!("malformed metrics report: {e}")));
            let parsed = parsed.and_then(|v| {
                let other = reporter.as_deref().and_then(|node| reported_nodes(&v).into_iter().find(|n| n != &node).map(|n| (node, n)));
                match other {
                    Some((node, other)) => Err(ApiError::Forbidden(format!(
                        "nodes.metrics.k8s.io {other:?} is forbidden: node {node:?} can only report its own usage"
                    ))),
                    None => Ok(v),
                }
            });
            ("POST", "nodes", parsed.and_then(|v| table.report_any(v)).map(|n| (StatusCode::CREATED, n)))
        }
        ["nodes"] if get => {
            let r = table.list(&kinds::NODE_METRICS, None, labels, fields);
            ("LIST", "nodes", r.map(|items| (StatusCode::OK, list_body(&kinds::NODE_METRICS, items))))
        }
        ["nodes", name] if get => ("GET", "nodes", table.node(name).map(|n| (StatusCode::OK, n))),
        ["pods"] if get => {
            let r = table.list(&kinds::POD_METRICS, None, labels, fields);
            ("LIST", "pods", r.map(|items| (StatusCode::OK, list_body(&kinds::POD_METRICS, items))))
        }
        ["namespaces", ns, "pods"] if get => {
            let r = table.list(&kinds::POD_METRICS, Some(ns), labels, fields);
            ("LIST", "pods", r.map(|items| (StatusCode::OK, list_body(&kinds::POD_METRICS, items))))
        }
        ["namespaces", ns, "pods", name] if get => ("GET", "pods", table.pod(ns, name).map(|p| (StatusCode::OK, p))),
        ["nodes" | "pods", ..] | ["namespaces", _, "pods", ..] => (
            "OTHER",
            "unknown",
            Err(ApiError::MethodNotAllowed(format!("the server does not allow this method on the requested resource ({} metrics are read-only)", GROUP))),
        ),
        _ => ("GET", "unknown", Err(ApiError::resource_not_found())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str, pods: &[(&str, &str, &str)]) -> Value {
        let pods: Vec<Value> = pods
            .iter()
            .map(|(ns, name, app)| {
                json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "timestamp": "2026-01-01T00:00:00Z",
                    "window": "5s", "containers": [{"name": "c", "usage": {"cpu": "10m", "memory": "1Mi"}}]})
            })
            .collect();
        json!({"metadata": {"name": node}, "timestamp": "2026-01-01T00:00:00Z", "window": "5s",
            "usage": {"cpu": "100m", "memory": "10Mi"}, "pods": pods})
    }

    fn names(items: &[Value]) -> Vec<&str> {
        items.iter().map(name_of).collect()
    }

    #[test]
    fn a_report_replaces_its_nodes_pods_and_lists_filter_by_namespace_and_labels() {
        let t = MetricsTable::default();
        t.report(report("n1", &[("default", "web-1", "web"), ("kube-system", "dns", "dns")])).expect("report");
        t.report(report("n2", &[("default", "web-2", "web"), ("default", "db", "db")])).expect("report");
        let all = t.list(&kinds::POD_METRICS, None, None, None).expect("list");
        assert_eq!(names(&all), ["db", "web-1", "web-2", "dns"]);
        assert_eq!(all[0]["kind"], "PodMetrics");
        let web = t.list(&kinds::POD_METRICS, Some("default"), Some("app=web"), None).expect("list");
        assert_eq!(names(&web), ["web-1", "web-2"]);
        t.report(report("n1", &[])).expect("report");
        let all = t.list(&kinds::POD_METRICS, None, None, None).expect("list");
        assert_eq!(names(&all), ["db", "web-2"]);
        assert!(t.pod("default", "web-1").unwrap_err().is_not_found());
        assert_eq!(t.node("n1").expect("node")["usage"]["cpu"], "100m");
        assert!(t.node("n1").expect("node").get("pods").is_none(), "the pods are served as PodMetrics only");
    }

    #[test]
    fn a_report_without_a_node_name_or_with_a_nameless_pod_is_refused() {
        let t = MetricsTable::default();
        assert_eq!(t.report(json!({"metadata": {}})).unwrap_err().code(), 400);
        let mut r = report("n1", &[("default", "web", "web")]);
        r["pods"][0]["metadata"]["name"] = json!("");
        assert_eq!(t.report(r).unwrap_err().code(), 400);
        assert!(t.list(&kinds::NODE_METRICS, None, None, None).expect("list").is_empty(), "a refused report stores nothing");
    }

    #[test]
    fn a_pod_is_served_exactly_as_reported_through_get_and_list() {
        let t = MetricsTable::default();
        let mut r = report("n1", &[("default", "web-1", "web")]);
        r["pods"][0]["containers"][0]["usage"]["share"] = json!(0.1);
        r["pods"][0]["extra"] = json!({"max": u64::MAX, "neg": -3, "text": "é \" \n", "none": null, "list": [1.5, true, {}]});
        let reported = r["pods"][0].clone();
        t.report(r).expect("report");
        let got = t.pod("default", "web-1").expect("pod");
        let mut expected = reported;
        expected["apiVersion"] = json!("metrics.k8s.io/v1beta1");
        expected["kind"] = json!("PodMetrics");
        expected["metadata"]["creationTimestamp"] = got["metadata"]["creationTimestamp"].clone();
        assert!(got["metadata"]["creationTimestamp"].is_string());
        assert_eq!(got, expected);
        assert_eq!(t.list(&kinds::POD_METRICS, Some("default"), None, None).expect("list"), [expected]);
    }

    #[test]
    fn a_nodes_pods_are_held_packed_and_served_as_reported() {
        let t = MetricsTable::default();
        let pods: Vec<(String, String)> = (0..200).map(|i| (format!("web-{i}"), format!("app-{}", i % 7))).collect();
        let named: Vec<(&str, &str, &str)> = pods.iter().map(|(n, a)| ("default", n.as_str(), a.as_str())).collect();
        let r = report("n1", &named);
        let reported = r["pods"].as_array().expect("pods").clone();
        t.report(r).expect("report");
        let served = t.list(&kinds::POD_METRICS, Some("default"), None, None).expect("list");
        assert_eq!(served.len(), reported.len());
        for got in &served {
            let sent = reported.iter().find(|p| name_of(p) == name_of(got)).expect("reported");
            assert_eq!(got["containers"], sent["containers"]);
            assert_eq!(got["metadata"]["labels"], sent["metadata"]["labels"]);
        }
        let nodes = t.nodes.read().expect("lock");
        let (held, text): (usize, usize) =
            nodes["n1"].pods.iter().fold((0, 0), |(h, l), p| (h + p.json.memory(), l + p.json.unpacked_len()));
        assert!(held * 3 < text, "{held} bytes held for {text} bytes of PodMetrics");
    }

    #[test]
    fn a_list_of_reports_is_taken_whole_or_not_at_all() {
        let t = MetricsTable::default();
        let list = |items: Vec<Value>| json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetricsList", "items": items});
        let served = t
            .report_any(list(vec![report("n1", &[("default", "web-1", "web")]), report("n2", &[("default", "web-2", "web")])]))
            .expect("a list of two reports");
        assert_eq!(served["kind"], "NodeMetricsList");
        assert_eq!(names(served["items"].as_array().expect("items")), ["n1", "n2"]);
        assert_eq!(names(&t.list(&kinds::NODE_METRICS, None, None, None).expect("list")), ["n1", "n2"]);
        assert_eq!(names(&t.list(&kinds::POD_METRICS, None, None, None).expect("list")), ["web-1", "web-2"]);

        // One bad report refuses the whole list: n1 keeps its pod, n3 is not taken.
        let mut bad_pod = report("n1", &[("default", "", "web")]);
        bad_pod["timestamp"] = json!("2026-01-01T00:01:00Z");
        let refused = t.report_any(list(vec![report("n3", &[]), bad_pod])).unwrap_err();
        assert_eq!(refused.code(), 400);
        assert_eq!(names(&t.list(&kinds::NODE_METRICS, None, None, None).expect("list")), ["n1", "n2"]);
        assert_eq!(names(&t.list(&kinds::POD_METRICS, None, None, None).expect("list")), ["web-1", "web-2"]);
        assert_eq!(t.report_any(json!({"kind": "NodeMetricsList", "items": {}})).unwrap_err().code(), 400);

        // A single NodeMetrics is still one report.
        assert_eq!(t.report_any(report("n3", &[])).expect("single")["kind"], "NodeMetrics");
    }
}
