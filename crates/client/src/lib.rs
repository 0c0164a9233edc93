//! `RemoteClient`: Shepherd's controller `Client` over the HTTP API, for components that run in
//! another process than the API server (node agents, remote controllers). It speaks the plain
//! Kubernetes REST API through the `kube` crate, so it would work against any Kubernetes server.

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use http::{Method, Request};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::ApiError;
use shepherd_api::digest::{DigestDetail, ListDigest};
use shepherd_runtime::{Client, DeleteParams, ListParams, ObjectList, Patch, WatchEvent};

/// `NAME/VERSION`, the User-Agent of a component: the server takes `NAME` as its field manager.
fn user_agent(name: &str) -> http::HeaderValue {
    let value = format!("{name}/{}", env!("CARGO_PKG_VERSION"));
    http::HeaderValue::from_str(&value).unwrap_or_else(|_| http::HeaderValue::from_static("shepherd"))
}

/// How long a server-side watch runs before the client starts a new one from its last revision.
const WATCH_TIMEOUT_SECONDS: u32 = 290;

#[derive(Clone)]
pub struct RemoteClient {
    client: kube::Client,
    /// Sent with every request: the server records writes that name no field manager under the
    /// User-Agent's first word, so this names who set a field (the `kube` crate sends none).
    user_agent: http::HeaderValue,
}

impl RemoteClient {
    /// A client whose writes are recorded under the field manager `shepherd`.
    pub fn new(client: kube::Client) -> Self {
        RemoteClient { client, user_agent: user_agent("shepherd") }
    }

    /// The client of the component `name` (`shepherd-agent`): its writes are recorded under that
    /// field manager.
    pub fn named(mut self, name: &str) -> Self {
        self.user_agent = user_agent(name);
        self
    }

    /// A client for the server at `url` (`http://127.0.0.1:9876`), with an optional bearer token.
    pub fn connect(url: &str, token: Option<&str>) -> Result<Self, ApiError> {
        let uri: http::Uri = url.parse().map_err(|e| ApiError::BadRequest(format!("invalid server URL {url:?}: {e}")))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        if let Some(t) = token {
            config.auth_info.token = Some(t.to_string().into());
        }
        let client = kube::Client::try_from(config).map_err(|e| ApiError::Internal(format!("building client for {url}: {e}")))?;
        Ok(RemoteClient::new(client))
    }

    pub fn kube(&self) -> &kube::Client {
        &self.client
    }

    /// A request of this client, with its User-Agent.
    fn request(&self, method: Method, url: String) -> http::request::Builder {
        Request::builder().method(method).uri(url).header(http::header::USER_AGENT, self.user_agent.clone())
    }

    async fn call(&self, method: Method, url: String, body: Option<(&str, Vec<u8>)>) -> Result<Value, ApiError> {
        let mut req = self.request(method, url);
        let bytes = match body {
            Some((ct, b)) => {
                req = req.header(http::header::CONTENT_TYPE, ct);
                b
            }
            None => Vec::new(),
        };
        let req = req.body(bytes).map_err(|e| ApiError::Internal(format!("building request: {e}")))?;
        self.client.request::<Value>(req).await.map_err(from_kube)
    }
}

/// Turns a kube error into the API error it carries, keeping reason, code and causes.
pub fn from_kube(e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) => match serde_json::to_value(&*status) {
            Ok(v) => {
                let mut v = v;
                if v.get("reason").and_then(Value::as_str).is_none_or(str::is_empty) && v["code"] == 410 {
                    v["reason"] = json!("Expired");
                }
                ApiError::from_status(&v)
            }
            Err(_) => ApiError::Internal(status.to_string()),
        },
        other => ApiError::ServiceUnavailable(format!("API server unreachable: {other}")),
    }
}

/// `/api/v1/namespaces/ns/pods` or `/apis/apps/v1/deployments`.
fn collection(res: &ResourceInfo, ns: Option<&str>) -> String {
    let base = if res.group.is_empty() { format!("/api/{}", res.version) } else { format!("/apis/{}/{}", res.group, res.version) };
    match (res.namespaced, ns) {
        (true, Some(ns)) => format!("{base}/namespaces/{ns}/{}", res.plural),
        _ => format!("{base}/{}", res.plural),
    }
}

fn item(res: &ResourceInfo, ns: Option<&str>, name: &str) -> String {
    format!("{}/{}", collection(res, ns), name)
}

fn query(params: &ListParams, extra: &[(&'static str, String)]) -> String {
    let mut q: Vec<(&str, String)> = Vec::new();
    if let Some(l) = &params.label_selector {
        q.push(("labelSelector", l.clone()));
    }
    if let Some(f) = &params.field_selector {
        q.push(("fieldSelector", f.clone()));
    }
    q.extend(extra.iter().cloned());
    let encoded: Vec<String> = q.into_iter().map(|(k, v)| format!("{k}={}", encode(&v))).collect();
    if encoded.is_empty() { String::new() } else { format!("?{}", encoded.join("&")) }
}

/// A list answer as decoded: its revision and its items, taken straight from the text (never
/// from a parsed copy of the whole list, which would hold every item twice).
struct DecodedList {
    resource_version: u64,
    items: Vec<Value>,
}

/// Decodes a list answer; with `without_managed_fields`, every item's `metadata.managedFields`
/// is skipped over in the text instead of being built and dropped later (for a small object such
/// as a Service they are about half of its parsed size).
#[derive(Clone, Copy)]
struct ListSeed {
    without_managed_fields: bool,
}

impl<'de> DeserializeSeed<'de> for ListSeed {
    type Value = DecodedList;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<DecodedList, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ListSeed {
    type Value = DecodedList;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DecodedList, A::Error> {
        let mut list = DecodedList { resource_version: 0, items: Vec::new() };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "metadata" => {
                    let meta: Value = map.next_value()?;
                    list.resource_version = meta.get("resourceVersion").and_then(Value::as_str).and_then(|r| r.parse().ok()).unwrap_or(0);
                }
                "items" => list.items = map.next_value_seed(ItemsSeed(self))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(list)
    }
}

/// A list's `items` (`null` counts as none).
struct ItemsSeed(ListSeed);

impl<'de> DeserializeSeed<'de> for ItemsSeed {
    type Value = Vec<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Value>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed {
    type Value = Vec<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of objects")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<Value>, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        if !self.0.without_managed_fields {
            while let Some(item) = seq.next_element::<Value>()? {
                items.push(item);
            }
            return Ok(items);
        }
        while let Some(item) = seq.next_element_seed(WithoutManagedFields { depth: 0 })? {
            items.push(item);
        }
        Ok(items)
    }
}

/// An item (`depth` 0) or its `metadata` (`depth` 1) as a `Value`, leaving out the metadata's
/// `managedFields`. Anything that is not an object decodes as it is.
struct WithoutManagedFields {
    depth: u8,
}

impl<'de> DeserializeSeed<'de> for WithoutManagedFields {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WithoutManagedFields {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match (self.depth, key.as_str()) {
                (0, "metadata") => map.next_value_seed(WithoutManagedFields { depth: 1 })?,
                (1, "managedFields") => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                _ => map.next_value::<Value>()?,
            };
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// A watched object decoded without its `metadata.managedFields`.
#[derive(Clone)]
struct Lean(Value);

impl<'de> Deserialize<'de> for Lean {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Lean, D::Error> {
        WithoutManagedFields { depth: 0 }.deserialize(d).map(Lean)
    }
}

fn watch_event<T>(e: kube::api::WatchEvent<T>, object: impl Fn(T) -> Value) -> Result<WatchEvent, ApiError> {
    match e {
        kube::api::WatchEvent::Added(o) => Ok(WatchEvent::Added(object(o))),
        kube::api::WatchEvent::Modified(o) => Ok(WatchEvent::Modified(object(o))),
        kube::api::WatchEvent::Deleted(o) => Ok(WatchEvent::Deleted(object(o))),
        kube::api::WatchEvent::Bookmark(b) => Ok(WatchEvent::Bookmark(b.metadata.resource_version.parse().unwrap_or(0))),
        kube::api::WatchEvent::Error(e) => Err(ApiError::from_status(&json!({
            "reason": if e.code == 410 { "Expired".to_string() } else { e.reason.clone() },
            "message": e.message, "code": e.code,
        }))),
    }
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn name_ns<'a>(res: &ResourceInfo, ns: Option<&'a str>, obj: &'a Value) -> Result<(Option<&'a str>, &'a str), ApiError> {
    let name = obj
        .at("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::BadRequest("metadata.name is required".into()))?;
    let ns = if res.namespaced {
        ns.or_else(|| obj.at("/metadata/namespace").and_then(Value::as_str)).or(Some("default"))
    } else {
        None
    };
    Ok((ns, name))
}

fn json_body(v: &Value) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::Internal(format!("encoding request: {e}")))
}

fn patch_body(p: &Patch) -> Result<(&'static str, Vec<u8>), ApiError> {
    Ok(match p {
        Patch::Merge(v) => ("application/merge-patch+json", json_body(v)?),
        Patch::Json(v) => ("application/json-patch+json", json_body(v)?),
    })
}

#[async_trait]
impl Client for RemoteClient {
    async fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.call(Method::GET, item(res, namespace, name), None).await
    }

    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError> {
        let url = format!("{}{}", collection(res, params.namespace.as_deref()), query(params, &[]));
        let req = self
            .request(Method::GET, url)
            .body(Vec::new())
            .map_err(|e| ApiError::Internal(format!("building request: {e}")))?;
        let text = self.client.request_text(req).await.map_err(from_kube)?;
        let seed = ListSeed { without_managed_fields: params.without_managed_fields };
        let list = seed
            .deserialize(&mut serde_json::Deserializer::from_str(&text))
            .map_err(|e| ApiError::Internal(format!("decoding a {} list: {e}", res.kind)))?;
        drop(text);
        let items = list
            .items
            .into_iter()
            .map(|mut i| {
                // Lists may omit each item's apiVersion/kind; controllers expect them.
                i["apiVersion"] = json!(res.api_version());
                i["kind"] = json!(res.kind);
                i
            })
            .collect();
        Ok(ObjectList { items, resource_version: list.resource_version })
    }

    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        resource_version: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError> {
        let url = format!(
            "{}{}",
            collection(res, params.namespace.as_deref()),
            query(params, &[
                ("watch", "true".into()),
                ("resourceVersion", resource_version.to_string()),
                ("allowWatchBookmarks", "true".into()),
                ("timeoutSeconds", WATCH_TIMEOUT_SECONDS.to_string()),
            ])
        );
        let req = self
            .request(Method::GET, url)
            .body(Vec::new())
            .map_err(|e| ApiError::Internal(format!("building request: {e}")))?;
        // An informer drops every object's managedFields on entry: skip them in the text, as the
        // list does, rather than build them for each event.
        if params.without_managed_fields {
            let events = self.client.request_events::<Lean>(req).await.map_err(from_kube)?;
            return Ok(StreamExt::map(events, |e| e.map_err(from_kube).and_then(|e| watch_event(e, |o: Lean| o.0))).boxed());
        }
        let events = self.client.request_events::<Value>(req).await.map_err(from_kube)?;
        Ok(StreamExt::map(events, |e| e.map_err(from_kube).and_then(|e| watch_event(e, |o: Value| o))).boxed())
    }

    async fn create(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let ns = if res.namespaced {
            namespace.or_else(|| obj.at("/metadata/namespace").and_then(Value::as_str)).or(Some("default"))
        } else {
            None
        };
        self.call(Method::POST, collection(res, ns), Some(("application/json", json_body(&obj)?))).await
    }

    async fn update(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let (ns, name) = name_ns(res, namespace, &obj)?;
        self.call(Method::PUT, item(res, ns, name), Some(("application/json", json_body(&obj)?))).await
    }

    async fn update_status(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let (ns, name) = name_ns(res, namespace, &obj)?;
        let url = if res.has_status { format!("{}/status", item(res, ns, name)) } else { item(res, ns, name) };
        self.call(Method::PUT, url, Some(("application/json", json_body(&obj)?))).await
    }

    async fn patch(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        self.call(Method::PATCH, item(res, namespace, name), Some(patch_body(&patch)?)).await
    }

    async fn patch_status(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        let url = if res.has_status { format!("{}/status", item(res, namespace, name)) } else { item(res, namespace, name) };
        self.call(Method::PATCH, url, Some(patch_body(&patch)?)).await
    }

    async fn delete(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, params: &DeleteParams) -> Result<Option<Value>, ApiError> {
        let mut opts = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(p) = params.propagation {
            opts["propagationPolicy"] = json!(p.as_str());
        }
        if let Some(g) = params.grace_period_seconds {
            opts["gracePeriodSeconds"] = json!(g);
        }
        if let Some(uid) = &params.precondition_uid {
            opts["preconditions"]["uid"] = json!(uid);
        }
        if let Some(rv) = params.precondition_resource_version {
            opts["preconditions"]["resourceVersion"] = json!(rv.to_string());
        }
        let after = self.call(Method::DELETE, item(res, namespace, name), Some(("application/json", json_body(&opts)?))).await?;
        // The server answers with the object: still there (marked) or its last state.
        let still_there = after.at("/metadata/deletionTimestamp").is_some()
            && self.get(res, namespace, name).await.is_ok();
        Ok(still_there.then_some(after))
    }

    async fn get_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.call(Method::GET, format!("{}/scale", item(res, namespace, name)), None).await
    }

    async fn update_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, scale: Value) -> Result<Value, ApiError> {
        let url = format!("{}/scale", item(res, namespace, name));
        self.call(Method::PUT, url, Some(("application/json", json_body(&scale)?))).await
    }

    async fn bind_pod(&self, namespace: &str, name: &str, node_name: &str) -> Result<(), ApiError> {
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}});
        let url = format!("{}/binding", item(&kinds::POD, Some(namespace), name));
        self.call(Method::POST, url, Some(("application/json", json_body(&binding)?))).await.map(|_| ())
    }

    async fn create_token(&self, namespace: &str, name: &str, request: Value) -> Result<Value, ApiError> {
        let url = format!("{}/token", item(&kinds::SERVICEACCOUNT, Some(namespace), name));
        self.call(Method::POST, url, Some(("application/json", json_body(&request)?))).await
    }

    async fn digest(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        revision: u64,
        detail: DigestDetail,
    ) -> Result<ListDigest, ApiError> {
        let extra = [("digest", detail.as_query()), ("resourceVersion", revision.to_string())];
        let url = format!("{}{}", collection(res, params.namespace.as_deref()), query(params, &extra));
        let reply = self.call(Method::GET, url, None).await?;
        serde_json::from_value(reply).map_err(|e| ApiError::Internal(format!("decoding a list digest: {e}")))
    }
}
