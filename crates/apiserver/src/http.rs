//! HTTP routing: the Kubernetes REST paths, verbs and content types, mapped onto `ApiService`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use futures::StreamExt;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::ApiError;
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_store::PackedKeyValue;

use crate::codec;
use crate::discovery;
use crate::protobuf;
use crate::service::{
    ApiService, DeleteOptions, Deleted, ListOptions, ListPage, Part, PatchType, RevisionMatch, Written, parse_resource_version,
};
use crate::table;
use crate::watch::{WatchOptions, WireEvent};
use crate::write_options::{
    FieldValidation, OptionsKind, WriteOptions, parse_field_manager, parse_noting_duplicates, parse_write_options,
    strict_decoding_error,
};

/// Settings of the HTTP layer.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Largest accepted request body, in bytes (Kubernetes: 3 MiB).
    pub max_body_bytes: usize,
    /// When set (and `authenticator` is not), every request must carry `Authorization: Bearer
    /// <token>`, which authenticates as an administrator.
    pub token: Option<String>,
    pub bookmark_interval: Duration,
    /// Who may make requests. None: nobody is asked (an `--insecure-loopback` listener).
    pub authenticator: Option<Arc<crate::authn::Authenticator>>,
    /// Where authenticated requests are recorded, if anywhere.
    pub audit: Option<Arc<crate::audit::AuditLog>>,
    /// Limits on each authenticated user's writes, if any.
    pub rate_limiter: Option<Arc<crate::ratelimit::UserRateLimiter>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: 3 * 1024 * 1024,
            token: None,
            bookmark_interval: Duration::from_secs(10),
            authenticator: None,
            audit: None,
            rate_limiter: None,
        }
    }
}

/// Serves `GET .../pods/{name}/log`; provided by whoever runs the node agents.
#[async_trait::async_trait]
pub trait LogSource: Send + Sync + 'static {
    async fn logs(&self, namespace: &str, pod: &str, query: &HashMap<String, String>) -> Result<Body, ApiError>;
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) svc: ApiService,
    pub(crate) registry: Arc<std::sync::Mutex<Registry>>,
    pub(crate) config: Arc<HttpConfig>,
    pub(crate) logs: Option<Arc<dyn LogSource>>,
    /// The bearer token node agents' streaming endpoints require.
    pub(crate) node_token: Option<Arc<str>>,
    pub(crate) authz: crate::authz::Authorizer,
}

fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(crate) fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, e.to_status().to_string().into_bytes())
}

/// The API's routes, with `extra` routes (debug endpoints) behind the same authentication.
pub(crate) fn router(state: AppState, extra: Router) -> Router {
    // Kubernetes accepts a trailing slash on its discovery paths; some clients (the Python
    // client's `VersionApi`, `ApisApi`) always send one.
    let version = || get(|| async { axum::Json(discovery::version()) });
    Router::new()
        .route("/healthz", get(readiness))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readiness))
        .route("/version", version())
        .route("/version/", version())
        .route("/metrics", get(metrics))
        .route("/api", get(core_discovery))
        .route("/api/", get(core_discovery))
        .route("/apis", get(group_discovery))
        .route("/apis/", get(group_discovery))
        .route("/openapi/v2", get(crate::openapi::v2))
        .route("/openapi/v3", get(crate::openapi::v3_index))
        .route("/openapi/v3/{*gv}", get(crate::openapi::v3_group_version))
        .route("/api/{*rest}", any(dispatch_core))
        .route("/apis/{*rest}", any(dispatch_groups))
        .fallback(|| async { error_response(&ApiError::resource_not_found()) })
        .with_state(state.clone())
        .merge(extra)
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::authz::authorize))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::ratelimit::limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::audit::audit))
        .layer(axum::middleware::from_fn_with_state(state, authenticate))
        .layer(axum::middleware::from_fn(catch_panic))
}

/// Answers a request whose handler panicked with a 500 `Status` and logs it with the request,
/// instead of dropping the connection; the server keeps serving. No panic should be reachable
/// from a request: this is the net under that rule.
async fn catch_panic(req: Request, next: axum::middleware::Next) -> Response {
    use futures::FutureExt;
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    match std::panic::AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(%method, %path, panic = %what, "request handler panicked");
            error_response(&ApiError::Internal(format!("internal error while serving {method} {path}")))
        }
    }
}

async fn core_discovery(headers: HeaderMap) -> Response {
    discovery_root(true, &headers)
}

async fn group_discovery(headers: HeaderMap) -> Response {
    discovery_root(false, &headers)
}

/// `/api` or `/apis`: the aggregated `APIGroupDiscoveryList` when the client asks for it, the
/// legacy `APIVersions` / `APIGroupList` otherwise.
fn discovery_root(core: bool, headers: &HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let (body, content_type) = match discovery::negotiate(accept) {
        Some(version) => (discovery::aggregated(core, version), discovery::aggregated_content_type(version)),
        None if core => (discovery::core_versions(), "application/json".to_string()),
        None => (discovery::groups(), "application/json".to_string()),
    };
    let mut r = json_response(StatusCode::OK, body.to_string().into_bytes());
    if let Ok(ct) = HeaderValue::from_str(&content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    r.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

async fn authenticate(State(app): State<AppState>, mut req: Request, next: axum::middleware::Next) -> Response {
    // No authenticator: an `--insecure-loopback` listener, whose requests carry no user.
    let Some(authn) = &app.config.authenticator else { return next.run(req).await };
    let started = std::time::Instant::now();
    // A bootstrap token (`id.secret`), a ServiceAccount's JWT, else a certificate or a static token.
    let identified = match crate::bootstrap_token::of_request(req.headers()) {
        Some(token) => match token.authenticate(&app.svc).await {
            Ok(user) => Ok(Some(user)),
            Err(why) => identify(authn, &req).map_err(|_| why),
        },
        None => match service_account_token(&app, authn, &req) {
            Some((tokens, jwt)) => tokens.authenticate(&app.svc, &jwt).await.map(Some),
            None => identify(authn, &req),
        },
    };
    app.svc.metrics.authentication_duration.observe(started.elapsed().as_secs_f64());
    match identified {
        Ok(Some(user)) => {
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        // Health, version and the dashboard's assets hold no cluster data; the calls the page
        // makes for data do. These go on without a user.
        Ok(None) if is_public(req.uri().path()) => next.run(req).await,
        // kubeadm's discovery: a joining node reads the cluster CA before it can trust the server.
        Ok(None) if req.method() == Method::GET && req.uri().path() == crate::bootstrap_token::cluster_info_path() => {
            next.run(req).await
        }
        Ok(None) => unauthorized("Unauthorized"),
        Err(why) => {
            tracing::debug!(path = %req.uri().path(), reason = %why, "request not authenticated");
            unauthorized("Unauthorized")
        }
    }
}

/// Paths anonymous clients may read, as Kubernetes' `system:public-info-viewer` role allows.
fn is_public(path: &str) -> bool {
    let under = |p: &str| path == p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/'));
    under("/healthz") || under("/readyz") || under("/livez") || under("/version") || under("/dashboard")
}

/// The user of a request: a client certificate the cluster CA signed, else a bearer token (from
/// the `Authorization` header, or for a browser's WebSocket, which cannot set headers, from its
/// subprotocol as Kubernetes takes it). `Ok(None)`: no credentials at all.
fn identify(authn: &crate::authn::Authenticator, req: &Request) -> Result<Option<crate::auth::UserInfo>, String> {
    let certificate = req
        .extensions()
        .get::<Arc<crate::authn::PeerCertificates>>()
        .filter(|p| p.presented())
        .map(|p| authn.certificate_user(p));
    if let Some(Ok(user)) = certificate {
        return Ok(Some(user));
    }
    let token = match req.headers().get(header::AUTHORIZATION) {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
                .map(|t| t.trim().to_string())
                .ok_or("the Authorization header is not a bearer token")?,
        ),
        None if crate::watch_socket::requested(req.headers()) => crate::watch_socket::bearer_token(req.headers()),
        None => None,
    };
    match (token, certificate) {
        (Some(t), _) => authn.token_user(&t).map(Some).ok_or_else(|| "unknown bearer token".to_string()),
        (None, Some(Err(why))) => Err(why),
        (None, _) => Ok(None),
    }
}

/// A bearer token for the ServiceAccount authenticator: one shaped as a JWT that is no static token,
/// on a request whose client certificate (if any) is not accepted, when this server signs tokens.
fn service_account_token(
    app: &AppState,
    authn: &crate::authn::Authenticator,
    req: &Request,
) -> Option<(Arc<crate::serviceaccount::ServiceAccountTokens>, String)> {
    let tokens = app.svc.service_account_tokens.clone()?;
    let token = match req.headers().get(header::AUTHORIZATION) {
        Some(v) => {
            let v = v.to_str().ok()?;
            v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer "))?.trim().to_string()
        }
        None if crate::watch_socket::requested(req.headers()) => crate::watch_socket::bearer_token(req.headers())?,
        None => return None,
    };
    if !crate::serviceaccount::looks_like_jwt(&token) || authn.token_user(&token).is_some() {
        return None;
    }
    let certificate = req.extensions().get::<Arc<crate::authn::PeerCertificates>>().filter(|p| p.presented());
    if certificate.is_some_and(|p| authn.certificate_user(p).is_ok()) {
        return None;
    }
    Some((tokens, token))
}

/// Kubernetes' 401: a `Status` with reason `Unauthorized`, which kubectl reports as "You must be
/// logged in to the server".
fn unauthorized(message: &str) -> Response {
    let mut r = json_response(
        StatusCode::UNAUTHORIZED,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Unauthorized", "code": 401})
        .to_string()
        .into_bytes(),
    );
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// `/readyz` (and `/healthz`): ready while the store can write. The process stays live (`/livez`)
/// while it cannot: restarting does not give a full disk room, and reads keep being served.
async fn readiness(State(app): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let store = app.svc.store.writable();
    let check = match &store {
        Ok(()) => "[+]store ok".to_string(),
        Err(e) => format!("[-]store failed: {e}"),
    };
    let (code, body) = match store {
        Ok(()) if !q.contains_key("verbose") => (StatusCode::OK, "ok".to_string()),
        Ok(()) => (StatusCode::OK, format!("[+]ping ok\n{check}\nreadyz check passed\n")),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, format!("[+]ping ok\n{check}\nreadyz check failed\n")),
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

async fn metrics(State(app): State<AppState>) -> Response {
    for res in kinds::all() {
        let Ok(n) = app.svc.store.count(&res.key_prefix()).await else { continue };
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        app.svc.metrics.objects.get_or_create(&crate::metrics::ResourceLabel { resource: res.plural.into() }).set(n);
    }
    let mut out = String::new();
    let encoded = match app.registry.lock() {
        Ok(reg) => prometheus_client::encoding::text::encode(&mut out, &reg).map_err(|e| e.to_string()),
        Err(_) => Err("metrics registry poisoned".to_string()),
    };
    match encoded {
        Ok(()) => {
            let mut r = Response::new(Body::from(out));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            );
            r
        }
        Err(e) => error_response(&ApiError::Internal(e)),
    }
}

/// A request resolved to a resource: which one, in which namespace, which object, which subresource.
#[derive(Debug)]
struct Target {
    res: &'static ResourceInfo,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

/// Reads the path below `/api/{version}` or `/apis/{group}/{version}`; anything not served is
/// the 404 Kubernetes answers for a path it does not know.
fn resolve(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let unknown = ApiError::resource_not_found;
    if !discovery::serves(group, version) {
        return Err(unknown());
    }
    let served = |plural: &str| kinds::by_group_version_plural(group, version, plural);
    // `namespaces/{name}/{x}` is a subresource of the namespace when it has one called x, and
    // otherwise resource x inside that namespace.
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(tail.is_empty() && served("namespaces").is_some_and(|n| discovery::has_subresource(n, plural))) =>
        {
            (Some(ns.to_string()), &rest[2..])
        }
        _ => (None, rest),
    };
    let [plural, tail @ ..] = rest else { return Err(unknown()) };
    let res = served(plural).ok_or_else(unknown)?;
    if (namespace.is_some() && !res.namespaced) || (namespace.is_none() && res.namespaced && !tail.is_empty()) {
        return Err(unknown());
    }
    match tail {
        [] => Ok(Target { res, namespace, name: None, sub: None }),
        [name] => Ok(Target { res, namespace, name: Some(name.to_string()), sub: None }),
        [name, sub] if discovery::has_subresource(res, sub) => {
            Ok(Target { res, namespace, name: Some(name.to_string()), sub: Some(sub.to_string()) })
        }
        _ => Err(unknown()),
    }
}

async fn dispatch_core(State(app): State<AppState>, req: Request) -> Response {
    let path = req.uri().path().trim_start_matches("/api/").to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        [version] => match discovery::resources("", version) {
            Some(r) => axum::Json(r).into_response(),
            None => error_response(&ApiError::resource_not_found()),
        },
        [version, rest @ ..] => {
            let t = resolve("", version, rest);
            serve(app, t, req).await
        }
        [] => discovery_root(true, req.headers()),
    }
}

async fn dispatch_groups(State(app): State<AppState>, req: Request) -> Response {
    let path = req.uri().path().trim_start_matches("/apis/").to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        [group] => match discovery::group(group) {
            Some(g) => axum::Json(g).into_response(),
            None => error_response(&ApiError::resource_not_found()),
        },
        [group, version] => match discovery::resources(group, version) {
            Some(r) => axum::Json(r).into_response(),
            None => error_response(&ApiError::resource_not_found()),
        },
        [group, version, rest @ ..] if *group == crate::resource_metrics::GROUP => {
            crate::resource_metrics::serve(&app, version, rest, req).await
        }
        ["autoscaling", version, rest @ ..] if *version == crate::autoscaling_v1::VERSION => {
            crate::autoscaling_v1::serve(app, rest, req).await
        }
        [group, version, rest @ ..] => {
            let t = resolve(group, version, rest);
            serve(app, t, req).await
        }
        [] => discovery_root(false, req.headers()),
    }
}

/// Serves a request for `group`/`version` (used by versions served through another one).
pub(crate) async fn serve_group_version(app: AppState, group: &str, version: &str, rest: &[&str], req: Request) -> Response {
    serve(app, resolve(group, version, rest), req).await
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("as=Table"))
}

async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::RequestEntityTooLarge(format!("request body is larger than the limit of {limit} bytes"));
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    axum::body::to_bytes(req.into_body(), limit).await.map_err(|_| too_large())
}

/// A request body as JSON. A protobuf body is recognised by its magic prefix, which no JSON text
/// starts with, and converted: every handler that reads a body reads both encodings.
fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("request body is empty; a JSON object is required".into()));
    }
    if protobuf::is_protobuf(body) {
        return protobuf::decode(body).map_err(|e| ApiError::BadRequest(e.to_string()));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("malformed JSON in request body: {e}")))
}

fn content_type(headers: &HeaderMap) -> String {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_string()
}

fn check_json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = content_type(headers);
    if ct.starts_with("application/json") || ct.starts_with("*/*") || ct.starts_with(protobuf::MEDIA_TYPE) {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "content type {ct:?} is not supported: send application/json or {}",
            protobuf::MEDIA_TYPE
        )))
    }
}

/// A boolean query parameter read as Kubernetes reads one: absent, `0` or `false` in any case is
/// false, anything else is true (the Python client sends `watch=True`).
fn query_flag(query: &HashMap<String, String>, name: &str) -> bool {
    query.get(name).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

fn verb_name(method: &Method, t: &Target, query: &HashMap<String, String>) -> &'static str {
    let watching = query_flag(query, "watch");
    match (method.as_str(), &t.name) {
        ("GET", None) if watching => "WATCH",
        ("GET", None) if query.contains_key("digest") => "DIGEST",
        ("GET", None) => "LIST",
        ("GET", Some(_)) => "GET",
        ("POST", _) => "POST",
        ("PUT", _) => "PUT",
        ("PATCH", _) => "PATCH",
        ("DELETE", None) => "DELETECOLLECTION",
        ("DELETE", Some(_)) => "DELETE",
        _ => "OTHER",
    }
}

async fn serve(app: AppState, target: Result<Target, ApiError>, req: Request) -> Response {
    let started = Instant::now();
    let query: HashMap<String, String> =
        Query::<HashMap<String, String>>::try_from_uri(req.uri()).map(|q| q.0).unwrap_or_default();
    let t = match target {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let verb = verb_name(req.method(), &t, &query);
    let resource = match &t.sub {
        Some(s) => format!("{}/{}", t.res.plural, s),
        None => t.res.plural.to_string(),
    };
    let accept = protobuf::Accept::of(req.headers());
    if accept == protobuf::Accept::OnlyProtobuf && kinds::is_custom(t.res) {
        // Custom resources have no protobuf form; Kubernetes serves them in JSON only.
        let e = ApiError::NotAcceptable(
            "only the following media types are accepted: application/json, application/json;stream=watch".into(),
        );
        return error_response(&e);
    }
    let response = match handle(&app, &t, &query, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    let response = match crate::crd::read_as(t.res) {
        Some(api_version) if verb != "WATCH" => crate::crd::convert_response(&api_version, response).await,
        _ => response,
    };
    let response = protobuf::respond(accept, verb == "WATCH", response).await;
    app.svc.metrics.observe_request(verb, &resource, response.status().as_u16(), started);
    response
}

fn object_response(code: StatusCode, kv: &shepherd_store::KeyValue) -> Response {
    json_response(code, codec::render(kv))
}

fn list_options(query: &HashMap<String, String>) -> Result<ListOptions, ApiError> {
    // A negative limit means no limit, as in Kubernetes.
    let limit = match query.get("limit").map(|l| l.parse::<i64>()) {
        None => None,
        Some(Ok(l)) if l > 0 => Some(l as usize),
        Some(Ok(_)) => None,
        Some(Err(_)) => return Err(ApiError::BadRequest("limit must be a whole number".into())),
    };
    let continue_token = query.get("continue").cloned().filter(|c| !c.is_empty());
    Ok(ListOptions {
        label_selector: query.get("labelSelector").cloned(),
        field_selector: query.get("fieldSelector").cloned(),
        limit,
        revision: revision_match(query, continue_token.is_some())?,
        continue_token,
    })
}

/// `resourceVersion` and `resourceVersionMatch` of a list, checked as Kubernetes checks them
/// (its ListOptions validation: a 422 naming `resourceVersionMatch`).
fn revision_match(query: &HashMap<String, String>, continuing: bool) -> Result<RevisionMatch, ApiError> {
    let rv_text = query.get("resourceVersion").map(String::as_str).unwrap_or("");
    let rv = parse_rv_param(rv_text)?;
    let matching = query.get("resourceVersionMatch").map(String::as_str).unwrap_or("");
    let mut causes = Vec::new();
    if !matching.is_empty() {
        if rv_text.is_empty() {
            causes.push(shepherd_api::Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if continuing {
            causes.push(shepherd_api::Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if !["Exact", "NotOlderThan"].contains(&matching) {
            causes.push(shepherd_api::Cause::not_supported(
                "resourceVersionMatch",
                format!("Unsupported value: {matching:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""),
            ));
        }
        if matching == "Exact" && rv_text == "0" {
            causes.push(shepherd_api::Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("ListOptions.meta.k8s.io", "", causes));
    }
    // A continue token carries the revision of the first page.
    if continuing && rv.is_some_and(|rv| rv != 0) {
        return Err(ApiError::BadRequest("specifying resource version is not allowed when using continue".into()));
    }
    Ok(match (rv, matching) {
        (None | Some(0), _) => RevisionMatch::Any,
        (Some(rv), "Exact") => RevisionMatch::Exact(rv),
        (Some(rv), _) => RevisionMatch::NotOlderThan(rv),
    })
}

/// A `resourceVersion` query parameter: empty is none; anything but a revision number is a 400
/// naming the parameter (Kubernetes answers it with a 500, a known bug).
fn parse_rv_param(rv: &str) -> Result<Option<u64>, ApiError> {
    if rv.is_empty() {
        return Ok(None);
    }
    rv.parse::<u64>().map(Some).map_err(|_| {
        ApiError::BadRequest(format!("resourceVersion: Invalid value: {rv:?}: not a valid resource version"))
    })
}

/// The options of a write from its query parameters.
fn write_options(kind: OptionsKind, query: &HashMap<String, String>) -> Result<WriteOptions, ApiError> {
    parse_write_options(kind, query.get("dryRun").map(String::as_str), query.get("fieldValidation").map(String::as_str))
}

/// The options of a create, update or patch, with who makes it (`fieldManager`, else the
/// User-Agent) and, for an apply, `force`.
fn manager_options(
    kind: OptionsKind,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    apply: bool,
) -> Result<WriteOptions, ApiError> {
    let user_agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let manager =
        parse_field_manager(kind, query.get("fieldManager").map(String::as_str), query.get("force").map(String::as_str), apply, user_agent);
    let mut opts = write_options(kind, query)?;
    (opts.field_manager, opts.force) = manager?;
    Ok(opts)
}

/// An apply body: YAML, of which JSON is a part (JSON bodies keep the duplicate-field checks).
fn parse_apply_body(
    body: &[u8],
    res: &ResourceInfo,
    opts: &WriteOptions,
    warnings: &mut Vec<String>,
) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| ApiError::BadRequest("an apply body must be UTF-8 YAML or JSON".into()))?;
    if text.trim_start().starts_with('{') {
        return parse_write_body(body, res, opts, warnings);
    }
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::BadRequest(format!("error decoding YAML: {}", e.to_string().lines().next().unwrap_or(""))))?;
    if !value.is_object() {
        return Err(ApiError::BadRequest("an apply body must be a YAML or JSON object".into()));
    }
    Ok(value)
}

/// Parses a write's JSON body; duplicate fields are an error under `fieldValidation=Strict` and
/// a warning under Warn (the last one wins), as in Kubernetes.
fn parse_write_body(
    body: &[u8],
    res: &ResourceInfo,
    opts: &WriteOptions,
    warnings: &mut Vec<String>,
) -> Result<Value, ApiError> {
    if protobuf::is_protobuf(body) {
        // A protobuf message cannot carry a field twice; its decoder reports what it cannot map.
        return parse_json(body);
    }
    if body.is_empty() {
        return Err(ApiError::BadRequest("request body is empty; a JSON object is required".into()));
    }
    let (value, duplicates) = parse_noting_duplicates(body)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON in request body: {e}")))?;
    if duplicates.is_empty() {
        return Ok(value);
    }
    let problems: Vec<String> = duplicates.iter().map(|d| format!("duplicate field \"{d}\"")).collect();
    match opts.field_validation {
        FieldValidation::Strict => {
            let version = res.api_version();
            Err(strict_decoding_error(res.kind, version.rsplit('/').next().unwrap_or("v1"), &problems))
        }
        FieldValidation::Warn => {
            warnings.extend(problems);
            Ok(value)
        }
        FieldValidation::Ignore => Ok(value),
    }
}

/// Largest total size of the `Warning` headers of one response; what does not fit is dropped.
const MAX_WARNING_BYTES: usize = 4096;

/// The response to a write: the object, with each warning in a `Warning: 299 - "..."` header.
fn written_response(code: StatusCode, w: &Written, extra_warnings: &[String]) -> Response {
    let mut r = object_response(code, &w.kv);
    add_warnings(&mut r, extra_warnings.iter().chain(&w.warnings));
    r
}

fn add_warnings<'a>(r: &mut Response, warnings: impl Iterator<Item = &'a String>) {
    let mut total = 0;
    let mut seen = std::collections::HashSet::new();
    for w in warnings {
        if !seen.insert(w) {
            continue;
        }
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        total += text.len();
        if total > MAX_WARNING_BYTES {
            break;
        }
        if let Ok(v) = HeaderValue::from_bytes(text.as_bytes()) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
}

async fn handle(
    app: &AppState,
    t: &Target,
    query: &HashMap<String, String>,
    req: Request,
) -> Result<Response, ApiError> {
    let svc = &app.svc;
    let res = t.res;
    let ns = t.namespace.as_deref();
    let method = req.method().clone();
    let headers = req.headers().clone();
    match (&method, t.name.as_deref(), t.sub.as_deref()) {
        (&Method::GET, None, None) => {
            if query_flag(query, "watch") {
                if crate::watch_socket::requested(&headers) {
                    let mut req = req;
                    let on_upgrade = hyper::upgrade::on(&mut req);
                    let answer = match watch(app, t, query, &headers).await {
                        Ok(r) => r,
                        Err(e) => error_response(&e),
                    };
                    return Ok(crate::watch_socket::upgrade(answer, &headers, on_upgrade));
                }
                return watch(app, t, query, &headers).await;
            }
            if let Some(detail) = query.get("digest") {
                let detail = shepherd_api::digest::DigestDetail::parse(detail).map_err(ApiError::BadRequest)?;
                // As for lists, "0" means any revision: the current one.
                let revision = parse_rv_param(query.get("resourceVersion").map(String::as_str).unwrap_or(""))?
                    .filter(|rv| *rv > 0);
                let d = svc
                    .digest(res, ns, query.get("labelSelector").map(String::as_str),
                        query.get("fieldSelector").map(String::as_str), revision, detail)
                    .await?;
                let mut body = serde_json::to_value(&d).map_err(|e| ApiError::Internal(e.to_string()))?;
                body["kind"] = json!("ListDigest");
                body["apiVersion"] = json!("shepherd.io/v1alpha1");
                return Ok(json_response(StatusCode::OK, body.to_string().into_bytes()));
            }
            let page = svc.list(res, ns, &list_options(query)?).await?;
            if wants_table(&headers) {
                let objects: Result<Vec<Value>, ApiError> = page.items.iter().map(codec::decode_listed).collect();
                let mut tbl = table::table(res, &objects?, &page.revision.to_string());
                if let Some(c) = page.continue_token {
                    tbl["metadata"]["continue"] = json!(c);
                }
                return Ok(json_response(StatusCode::OK, tbl.to_string().into_bytes()));
            }
            Ok(list_response(res, page))
        }
        (&Method::GET, Some(name), None) => {
            // A get reads the latest state; a revision newer than the store's is waited for.
            if let Some(rv) = parse_rv_param(query.get("resourceVersion").map(String::as_str).unwrap_or(""))? {
                svc.wait_for_revision(rv).await?;
            }
            let kv = svc.get(res, ns, name).await?;
            if wants_table(&headers) {
                let tbl = table::table(res, &[codec::decode(&kv)?], &kv.mod_revision.to_string());
                return Ok(json_response(StatusCode::OK, tbl.to_string().into_bytes()));
            }
            Ok(object_response(StatusCode::OK, &kv))
        }
        (&Method::GET, Some(name), Some("status")) if res.has_status => {
            Ok(object_response(StatusCode::OK, &svc.get(res, ns, name).await?))
        }
        // A kind without a Scale is answered NotFound, as an unknown subresource is.
        (&Method::GET, Some(name), Some("scale")) => {
            Ok(json_response(StatusCode::OK, svc.get_scale(res, ns, name).await?.to_string().into_bytes()))
        }
        (&Method::GET, Some(name), Some("log")) if res.kind == "Pod" => {
            let ns = ns.unwrap_or("default");
            svc.get(res, Some(ns), name).await?;
            match &app.logs {
                Some(src) => {
                    let body = src.logs(ns, name, query).await?;
                    let mut r = Response::new(body);
                    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                    Ok(r)
                }
                None => match &app.node_token {
                    Some(token) => {
                        let raw_query = req.uri().query().unwrap_or("").to_string();
                        crate::stream_proxy::logs(svc, token, ns, name, query, &raw_query).await
                    }
                    None => Err(ApiError::ServiceUnavailable(
                        "no node agent serves logs in this server; logs are available in standalone mode or with \
                         --node-streaming-token"
                            .into(),
                    )),
                },
            }
        }
        (&Method::GET | &Method::POST, Some(name), Some(sub @ ("exec" | "attach" | "portforward"))) if res.kind == "Pod" => {
            let ns = ns.unwrap_or("default");
            crate::stream_proxy::proxy(svc, app.node_token.as_deref(), ns, name, sub, query, req).await
        }
        (&Method::POST, None, None) => {
            check_json_body(&headers)?;
            let opts = manager_options(OptionsKind::Create, query, &headers, false)?;
            let mut warnings = Vec::new();
            let user = req.extensions().get::<crate::auth::UserInfo>().cloned();
            let mut body = parse_write_body(&read_body(req, app.config.max_body_bytes).await?, res, &opts, &mut warnings)?;
            if res.kind == kinds::CERTIFICATESIGNINGREQUEST.kind && !kinds::is_custom(res) {
                crate::certificates::prepare_create(&mut body, user.as_ref())?;
            }
            let w = svc.create_with(res, ns, body, &opts).await?;
            Ok(written_response(StatusCode::CREATED, &w, &warnings))
        }
        (&Method::POST, Some(name), Some("binding")) if res.kind == "Pod" => {
            check_json_body(&headers)?;
            let body = parse_json(&read_body(req, app.config.max_body_bytes).await?)?;
            let node = body.at("/target/name").and_then(Value::as_str).unwrap_or("");
            svc.bind(ns.unwrap_or("default"), name, node).await?;
            let ok = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
            Ok(json_response(StatusCode::CREATED, ok.to_string().into_bytes()))
        }
        (&Method::POST, Some(name), Some("token")) if res.kind == "ServiceAccount" => {
            check_json_body(&headers)?;
            let requester = req.extensions().get::<crate::auth::UserInfo>().cloned();
            let body = parse_json(&read_body(req, app.config.max_body_bytes).await?)?;
            let ns = ns.unwrap_or("default");
            let issued = crate::serviceaccount::create_token(svc, requester.as_ref(), ns, name, &body).await?;
            Ok(json_response(StatusCode::CREATED, issued.to_string().into_bytes()))
        }
        (&Method::POST, Some(name), Some("eviction")) if res.kind == "Pod" => {
            check_json_body(&headers)?;
            let body = parse_json(&read_body(req, app.config.max_body_bytes).await?)?;
            let dry_run = query.contains_key("dryRun");
            let done = crate::eviction::evict(svc, ns.unwrap_or("default"), name, &body, dry_run, |b| delete_options(query, b)).await?;
            Ok(json_response(StatusCode::CREATED, done.to_string().into_bytes()))
        }
        (&Method::PUT, Some(name), sub) => {
            check_json_body(&headers)?;
            let opts = manager_options(OptionsKind::Update, query, &headers, false)?;
            let mut warnings = Vec::new();
            let body = parse_write_body(&read_body(req, app.config.max_body_bytes).await?, res, &opts, &mut warnings)?;
            match sub {
                None => {
                    let w = svc.update_with(res, ns, name, body, Part::Main, &opts).await?;
                    Ok(written_response(StatusCode::OK, &w, &warnings))
                }
                Some("status") if res.has_status => {
                    let w = svc.update_with(res, ns, name, body, Part::Status, &opts).await?;
                    Ok(written_response(StatusCode::OK, &w, &warnings))
                }
                Some("approval") if res.kind == kinds::CERTIFICATESIGNINGREQUEST.kind && !kinds::is_custom(res) => {
                    let rv = parse_resource_version(body.at("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or(""))?;
                    let kv = svc.mutate(res, ns, name, rv, "approval", &opts, |old| {
                        crate::certificates::approval_update(old, &body)
                    }).await?;
                    Ok(object_response(StatusCode::OK, &kv))
                }
                Some("scale") if res.has_scale => {
                    let scale = svc.update_scale(res, ns, name, &body, &opts).await?;
                    Ok(json_response(StatusCode::OK, scale.to_string().into_bytes()))
                }
                Some(s) => Err(ApiError::not_found("subresources", s)),
            }
        }
        (&Method::PATCH, Some(name), sub) => {
            let ct = content_type(&headers);
            let patch_type = if ct.starts_with("application/merge-patch+json") {
                PatchType::Merge
            } else if ct.starts_with("application/json-patch+json") {
                PatchType::Json
            } else if ct.starts_with("application/strategic-merge-patch+json") {
                PatchType::StrategicMerge
            } else if ct.starts_with("application/apply-patch+yaml") {
                let opts = manager_options(OptionsKind::Patch, query, &headers, true)?;
                let mut warnings = Vec::new();
                let config = parse_apply_body(&read_body(req, app.config.max_body_bytes).await?, res, &opts, &mut warnings)?;
                let part = match sub {
                    None => Part::Main,
                    Some("status") if res.has_status => Part::Status,
                    Some(s) => {
                        return Err(ApiError::UnsupportedMediaType(format!(
                            "server-side apply of the {s} subresource is not supported: apply the object or its status"
                        )));
                    }
                };
                let (w, created) = svc.apply_with(res, ns, name, &config, part, &opts).await?;
                let code = if created { StatusCode::CREATED } else { StatusCode::OK };
                return Ok(written_response(code, &w, &warnings));
            } else {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "patch content type {ct:?} is not supported: use application/merge-patch+json, application/json-patch+json or application/strategic-merge-patch+json"
                )));
            };
            if patch_type == PatchType::StrategicMerge && kinds::is_custom(res) {
                // Custom resources have no patch strategies to merge by, as in Kubernetes.
                return Err(ApiError::UnsupportedMediaType("the body of the request was in an unknown format - accepted \
                    media types include: application/json-patch+json, application/merge-patch+json".into()));
            }
            let opts = manager_options(OptionsKind::Patch, query, &headers, false)?;
            let mut warnings = Vec::new();
            let patch = parse_write_body(&read_body(req, app.config.max_body_bytes).await?, res, &opts, &mut warnings)?;
            match sub {
                None => {
                    let w = svc.patch_with(res, ns, name, patch_type, &patch, Part::Main, &opts).await?;
                    Ok(written_response(StatusCode::OK, &w, &warnings))
                }
                Some("status") if res.has_status => {
                    let w = svc.patch_with(res, ns, name, patch_type, &patch, Part::Status, &opts).await?;
                    Ok(written_response(StatusCode::OK, &w, &warnings))
                }
                Some("scale") if res.has_scale => {
                    let scale = svc.patch_scale(res, ns, name, patch_type, &patch, &opts).await?;
                    Ok(json_response(StatusCode::OK, scale.to_string().into_bytes()))
                }
                Some(s) => Err(ApiError::not_found("subresources", s)),
            }
        }
        (&Method::DELETE, Some(name), None) => {
            let body = read_body(req, app.config.max_body_bytes).await?;
            let opts = delete_options(query, &body)?;
            match svc.delete(res, ns, name, &opts).await? {
                Deleted::Gone(kv) => Ok(object_response(StatusCode::OK, &kv)),
                Deleted::Pending(kv) => Ok(object_response(StatusCode::ACCEPTED, &kv)),
            }
        }
        (&Method::DELETE, None, None) => {
            let body = read_body(req, app.config.max_body_bytes).await?;
            let opts = delete_options(query, &body)?;
            let page = svc.list(res, ns, &list_options(query)?).await?;
            let mut deleted = Vec::new();
            for kv in &page.items {
                let obj = codec::decode_listed(kv)?;
                let name = obj.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
                let item_ns = obj.at("/metadata/namespace").and_then(Value::as_str);
                match svc.delete(res, item_ns, name, &opts).await {
                    Ok(d) => deleted.push(codec::decode(d.kv())?),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            let revision = svc.store.revision().await.map_err(crate::service::store_failure)?;
            let list = json!({"kind": res.list_kind(), "apiVersion": res.api_version(),
                "metadata": {"resourceVersion": revision.to_string()}, "items": deleted});
            Ok(json_response(StatusCode::OK, list.to_string().into_bytes()))
        }
        _ => Err(ApiError::MethodNotAllowed(format!(
            "{} is not allowed on {}{}",
            method,
            res.plural,
            t.sub.as_deref().map(|s| format!("/{s}")).unwrap_or_default()
        ))),
    }
}

/// A list body larger than this is sent as it is rendered, a chunk at a time, each object unpacked
/// only when its chunk is: a page of 5,000 pods is about 15 MB of JSON, which rendered whole would
/// sit in memory beside the objects it was rendered from.
const STREAMED_LIST_BYTES: usize = 256 * 1024;
/// About how much of a streamed list each chunk holds.
const LIST_CHUNK_BYTES: usize = 64 * 1024;

/// Answers a page of a list as JSON: whole when small, streamed when large.
fn list_response(res: &ResourceInfo, page: ListPage) -> Response {
    let size = page.items.iter().map(|kv| kv.value.unpacked_len() + 24).sum::<usize>() + 256;
    let mut head = format!("{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{}\"",
        res.list_kind(), res.api_version(), page.revision);
    if let Some(c) = &page.continue_token {
        head.push_str(&format!(",\"continue\":\"{c}\""));
    }
    head.push_str("},\"items\":[");
    let streamed = size > STREAMED_LIST_BYTES;
    let mut body = ListBody {
        head: Some(head.into_bytes()),
        items: page.items.into_iter(),
        chunk: if streamed { LIST_CHUNK_BYTES } else { usize::MAX },
        capacity: if streamed { LIST_CHUNK_BYTES + 8 * 1024 } else { size },
        first: true,
        done: false,
    };
    if !streamed {
        return json_response(StatusCode::OK, body.next().unwrap_or_default());
    }
    let mut r = Response::new(Body::from_stream(futures::stream::iter(body.map(Ok::<_, std::convert::Infallible>))));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A list's JSON in chunks of about `chunk` bytes (each made with room for `capacity`): the head,
/// the items, the closing brackets.
struct ListBody {
    head: Option<Vec<u8>>,
    items: std::vec::IntoIter<PackedKeyValue>,
    chunk: usize,
    capacity: usize,
    first: bool,
    done: bool,
}

impl Iterator for ListBody {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let mut out = self.head.take().unwrap_or_default();
        out.reserve(self.capacity);
        while out.len() < self.chunk {
            let Some(kv) = self.items.next() else {
                out.extend_from_slice(b"]}");
                self.done = true;
                break;
            };
            if !std::mem::take(&mut self.first) {
                out.push(b',');
            }
            codec::render_at(&kv.value.unpack(), kv.mod_revision, &mut out);
        }
        Some(out)
    }
}

fn delete_options(query: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        dry_run: write_options(OptionsKind::Delete, query)?.dry_run,
        propagation_policy: query.get("propagationPolicy").cloned(),
        grace_period_seconds: match query.get("gracePeriodSeconds") {
            Some(g) => Some(g.parse().map_err(|_| ApiError::BadRequest("gracePeriodSeconds must be a whole number".into()))?),
            None => None,
        },
        ..Default::default()
    };
    if !body.is_empty() {
        let b = parse_json(body)?;
        if let Some(kind) = b.get("kind").and_then(Value::as_str).filter(|k| *k != "DeleteOptions") {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({kind}) does not match the expected kind (DeleteOptions)"
            )));
        }
        if let Some(p) = b.get("propagationPolicy").and_then(Value::as_str) {
            opts.propagation_policy = Some(p.to_string());
        }
        if let Some(g) = b.get("gracePeriodSeconds").and_then(Value::as_i64) {
            opts.grace_period_seconds = Some(g);
        }
        if b.get("orphanDependents") == Some(&json!(true)) && opts.propagation_policy.is_none() {
            opts.propagation_policy = Some("Orphan".into());
        }
        if let Some(uid) = b.at("/preconditions/uid").and_then(Value::as_str) {
            opts.precondition_uid = Some(uid.to_string());
        }
        if let Some(rv) = b.at("/preconditions/resourceVersion").and_then(Value::as_str) {
            opts.precondition_resource_version = parse_resource_version(rv)?;
        }
        // DeleteOptions bodies carry dryRun as a list (`["All"]`).
        match b.get("dryRun") {
            None | Some(Value::Null) => {}
            Some(Value::Array(values)) if values.iter().all(|v| v == "All") => opts.dry_run |= !values.is_empty(),
            Some(other) => {
                parse_write_options(OptionsKind::Delete, Some(&other.to_string()), None)?;
            }
        }
    }
    Ok(opts)
}

async fn watch(app: &AppState, t: &Target, query: &HashMap<String, String>, headers: &HeaderMap) -> Result<Response, ApiError> {
    let rv = parse_resource_version(query.get("resourceVersion").map(String::as_str).unwrap_or(""))?;
    let send_initial_param = query.get("sendInitialEvents").map(String::as_str);
    let send_initial = query_flag(query, "sendInitialEvents");
    // Kubernetes' watch options validation: resourceVersionMatch only with sendInitialEvents, and
    // then only NotOlderThan.
    let matching = query.get("resourceVersionMatch").map(String::as_str).filter(|m| !m.is_empty());
    let mut causes = Vec::new();
    if send_initial_param.is_some() && matching != Some("NotOlderThan") {
        causes.push(shepherd_api::Cause::forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if let Some(m) = matching {
        if send_initial_param.is_none() {
            causes.push(shepherd_api::Cause::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if m != "NotOlderThan" {
            causes.push(shepherd_api::Cause::not_supported(
                "resourceVersionMatch",
                format!("Unsupported value: {m:?}: supported values: \"NotOlderThan\""),
            ));
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("ListOptions.meta.k8s.io", "", causes));
    }
    let timeout = match query.get("timeoutSeconds") {
        Some(s) => Some(Duration::from_secs(s.parse().map_err(|_| ApiError::BadRequest("timeoutSeconds must be a whole number".into()))?)),
        None => None,
    };
    let opts = WatchOptions {
        label_selector: query.get("labelSelector").cloned(),
        field_selector: query.get("fieldSelector").cloned(),
        resource_version: rv,
        allow_bookmarks: query_flag(query, "allowWatchBookmarks"),
        send_initial_events: send_initial,
        timeout,
        bookmark_interval: Some(app.config.bookmark_interval),
    };
    let events = app.svc.watch(t.res, t.namespace.as_deref(), opts).await?;
    let res = t.res;
    let as_table = wants_table(headers);
    let read_as = crate::crd::read_as(res);
    let lines = events.map(move |e: WireEvent| {
        let e = match &read_as {
            Some(api_version) => crate::crd::convert_event(api_version, e),
            None => e,
        };
        let e = if as_table && matches!(e.kind, "ADDED" | "MODIFIED" | "DELETED") {
            match serde_json::from_slice::<Value>(&e.object) {
                Ok(obj) => {
                    let rv = obj.at("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("").to_string();
                    WireEvent { kind: e.kind, object: table::table(res, &[obj], &rv).to_string().into_bytes() }
                }
                Err(_) => e,
            }
        } else {
            e
        };
        Ok::<_, std::io::Error>(Bytes::from(e.to_line()))
    });
    let mut r = Response::new(Body::from_stream(lines));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(r)
}
