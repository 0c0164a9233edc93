//! The audit log: Kubernetes' `audit.k8s.io/v1` Events as JSON lines, one per request stage, at the
//! level a policy chooses, written by a thread of its own and rotated by size.
//!
//! Stages: `RequestReceived` when the request arrives, `ResponseStarted` when a long-running one
//! (a watch, a followed log, exec and its kin) starts answering, `ResponseComplete` when the answer
//! is done (for long-running ones: when the stream ends or the client leaves). A full queue holds
//! the request up rather than losing its record (Kubernetes' blocking mode).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::Response;
use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::auth::UserInfo;
use crate::authz::Attributes;
use crate::http::AppState;

/// How much of a request the log keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }
}

/// An `audit.k8s.io/v1` Policy: the first rule that matches a request sets its level; a request no
/// rule matches is not logged.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    api_version: String,
    kind: String,
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Rule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
    #[serde(default)]
    omit_managed_fields: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

/// What one request gets from the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decision {
    level: Level,
    omit: Stages,
    omit_managed_fields: bool,
}

/// A set of stages, as bits: deciding a request allocates nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stages(u8);

impl Stages {
    fn contains(&self, stage: &Stage) -> bool {
        self.0 & (1 << *stage as u8) != 0
    }
}

impl FromIterator<Stage> for Stages {
    fn from_iter<I: IntoIterator<Item = Stage>>(stages: I) -> Stages {
        Stages(stages.into_iter().fold(0, |bits, s| bits | (1 << s as u8)))
    }
}

impl Policy {
    /// Every request at `Metadata`: who did what to which object, and the answer's code.
    pub fn metadata_for_everything() -> Policy {
        Policy {
            api_version: "audit.k8s.io/v1".into(),
            kind: "Policy".into(),
            _metadata: None,
            rules: vec![Rule {
                level: Level::Metadata,
                users: vec![],
                user_groups: vec![],
                verbs: vec![],
                resources: vec![],
                namespaces: vec![],
                non_resource_urls: vec![],
                omit_stages: vec![],
                omit_managed_fields: None,
            }],
            omit_stages: vec![Stage::RequestReceived],
            omit_managed_fields: false,
        }
    }

    /// Reads a policy file (YAML or JSON), refusing what Kubernetes would refuse.
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the audit policy {}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("the audit policy {} is invalid: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Policy, String> {
        let policy: Policy = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if policy.kind != "Policy" || policy.api_version != "audit.k8s.io/v1" {
            return Err(format!(
                "expected apiVersion audit.k8s.io/v1 and kind Policy, not {} {}",
                policy.api_version, policy.kind
            ));
        }
        for (i, rule) in policy.rules.iter().enumerate() {
            if !rule.non_resource_urls.is_empty() && (!rule.resources.is_empty() || !rule.namespaces.is_empty()) {
                return Err(format!("rules[{i}]: nonResourceURLs cannot be combined with resources or namespaces"));
            }
            if let Some(url) = rule.non_resource_urls.iter().find(|u| u.trim_end_matches('*').contains('*')) {
                return Err(format!("rules[{i}].nonResourceURLs: {url:?} may have '*' only at its end"));
            }
        }
        Ok(policy)
    }

    fn decide(&self, user: &UserInfo, a: &Attributes) -> Decision {
        let rule = self.rules.iter().find(|r| r.matches(user, a));
        let level = rule.map_or(Level::None, |r| r.level);
        let omit = self.omit_stages.iter().chain(rule.map(|r| r.omit_stages.as_slice()).unwrap_or(&[])).copied().collect();
        let omit_managed_fields = rule.and_then(|r| r.omit_managed_fields).unwrap_or(self.omit_managed_fields);
        Decision { level, omit, omit_managed_fields }
    }
}

impl Rule {
    fn matches(&self, user: &UserInfo, a: &Attributes) -> bool {
        let listed = |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v == value);
        if !listed(&self.users, &user.name) || !listed(&self.verbs, &a.verb) {
            return false;
        }
        if !self.user_groups.is_empty() && !self.user_groups.iter().any(|g| user.in_group(g)) {
            return false;
        }
        if !a.resource_request {
            // A rule about resources or namespaces says nothing of `/healthz` and its kin.
            if !self.resources.is_empty() || !self.namespaces.is_empty() {
                return false;
            }
            return self.non_resource_urls.is_empty()
                || self.non_resource_urls.iter().any(|u| match u.strip_suffix('*') {
                    Some(prefix) => a.path.starts_with(prefix),
                    None => a.path == *u,
                });
        }
        if !self.non_resource_urls.is_empty() || !listed(&self.namespaces, &a.namespace) {
            return false;
        }
        self.resources.is_empty() || self.resources.iter().any(|g| g.matches(a))
    }
}

impl GroupResources {
    fn matches(&self, a: &Attributes) -> bool {
        if self.group != "*" && self.group != a.api_group {
            return false;
        }
        let full = a.resource_with_subresource();
        let resource_ok = self.resources.is_empty()
            || self.resources.iter().any(|r| {
                r == "*"
                    || *r == full
                    || (r.ends_with("/*") && !a.subresource.is_empty() && r.trim_end_matches("/*") == a.resource)
                    || (r.starts_with("*/") && r.trim_start_matches("*/") == a.subresource)
            });
        resource_ok && (self.resource_names.is_empty() || self.resource_names.contains(&a.name))
    }
}

/// Where the log goes and when it turns over.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// The log file; `-` is standard output.
    pub path: PathBuf,
    pub policy: Policy,
    /// Rotate once the file would grow past this many bytes; 0 never rotates.
    pub max_bytes: u64,
    /// Rotated files kept; older ones are removed. 0 keeps all.
    pub max_backups: usize,
}

/// The running log: requests hand their Events to a writer thread.
pub struct AuditLog {
    policy: Policy,
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    events: Counter,
    errors: Counter,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").finish_non_exhaustive()
    }
}

/// Events queued for the writer before requests wait for it.
const QUEUE: usize = 10_000;

/// How long the writer lets lines gather after a write: the most a line waits to be written.
const BATCH_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

impl AuditLog {
    /// Opens (or creates) the log and starts its writer.
    pub fn start(config: AuditConfig) -> Result<Arc<AuditLog>, String> {
        let mut sink = Sink::open(&config.path, config.max_bytes, config.max_backups)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(QUEUE);
        let errors = Counter::default();
        let thread_errors = errors.clone();
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                while let Some(line) = rx.blocking_recv() {
                    let mut result = sink.write(&line);
                    // Drain what is queued, then flush once: one write per burst, not per event.
                    while let Ok(line) = rx.try_recv() {
                        result = result.and(sink.write(&line));
                    }
                    if let Err(e) = result.and_then(|()| sink.flush()) {
                        thread_errors.inc();
                        tracing::error!(error = %e, "writing the audit log failed");
                    }
                    // Lines sent while this thread is not waiting on the queue cost the sender no
                    // wake-up: pausing gathers a busy server's lines into one write per pause
                    // instead of a wake-up and a write for each.
                    std::thread::sleep(BATCH_PAUSE);
                }
                let _ = sink.flush();
            })
            .map_err(|e| format!("cannot start the audit log writer: {e}"))?;
        Ok(Arc::new(AuditLog { policy: config.policy, tx, events: Counter::default(), errors }))
    }

    /// `apiserver_audit_event_total` and `apiserver_audit_error_total`, as Kubernetes names them.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("apiserver_audit_event", "Audit events written", self.events.clone());
        registry.register("apiserver_audit_error", "Audit events that could not be written", self.errors.clone());
    }

    async fn emit(&self, line: Vec<u8>) {
        self.events.inc();
        if self.tx.send(line).await.is_err() {
            self.errors.inc();
        }
    }
}

/// The file end of the log, with size rotation.
enum Sink {
    Stdout(std::io::Stdout),
    File { path: PathBuf, out: BufWriter<File>, size: u64, max_bytes: u64, max_backups: usize },
}

impl Sink {
    fn open(path: &Path, max_bytes: u64, max_backups: usize) -> Result<Sink, String> {
        if path == Path::new("-") {
            return Ok(Sink::Stdout(std::io::stdout()));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let file = open_append(path).map_err(|e| format!("cannot open the audit log {}: {e}", path.display()))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Sink::File { path: path.to_path_buf(), out: BufWriter::new(file), size, max_bytes, max_backups })
    }

    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => out.lock().write_all(line),
            Sink::File { path, out, size, max_bytes, max_backups } => {
                let len = line.len() as u64;
                if *max_bytes > 0 && *size > 0 && *size + len > *max_bytes {
                    out.flush()?;
                    let rotated = rotated_name(path);
                    std::fs::rename(&*path, &rotated)?;
                    *out = BufWriter::new(open_append(path)?);
                    *size = 0;
                    if *max_backups > 0 {
                        remove_old_backups(path, *max_backups);
                    }
                }
                out.write_all(line)?;
                *size += len;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => out.flush(),
            Sink::File { out, .. } => out.flush(),
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Audit records name users and objects: for the server's user only.
    OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// `audit.log` -> `audit-2026-12-01T10-02-03.123.log`: sorts by time, in the file's own folder.
fn rotated_name(path: &Path) -> PathBuf {
    let stamp = jiff::Timestamp::now().strftime("%Y-%m-%dT%H-%M-%S%.3f").to_string();
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let name = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => format!("{stem}-{stamp}.{ext}"),
        None => format!("{stem}-{stamp}"),
    };
    let mut rotated = path.with_file_name(&name);
    // Two rotations within one millisecond: keep both.
    let mut n = 1;
    while rotated.exists() {
        rotated = path.with_file_name(format!("{name}.{n}"));
        n += 1;
    }
    rotated
}

fn remove_old_backups(path: &Path, keep: usize) {
    let (Some(dir), Some(stem)) = (path.parent(), path.file_stem().and_then(|s| s.to_str())) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!("{stem}-");
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut backups: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p != path && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
        .collect();
    backups.sort();
    let excess = backups.len().saturating_sub(keep);
    for old in &backups[..excess] {
        if let Err(e) = std::fs::remove_file(old) {
            tracing::warn!(file = %old.display(), error = %e, "cannot remove an old audit log");
        }
    }
}

/// The peer address of a request's connection, put there by the listener.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// The request's part of every Event it produces, serialized once when the request arrives: the
/// fields before `stage` and those after it, in the order Kubernetes writes an Event. Each stage's
/// line is these pieces with the stage's own fields between them.
struct Record {
    log: Arc<AuditLog>,
    decision: Decision,
    /// `{"kind":"Event",...,"auditID":"..."`: the line's opening up to `stage`.
    head: String,
    /// `"requestURI":...` up to `objectRef`, without braces.
    middle: String,
    /// `requestReceivedTimestamp`, formatted.
    received: String,
}

/// `responseStatus`: a `metav1.Status` with the answer's code, and for an answer that is a `Status`,
/// its status, message and reason.
#[derive(Serialize)]
struct ResponseStatus<'a> {
    metadata: Empty,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a Value>,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

impl<'a> ResponseStatus<'a> {
    fn of(code: u16, body: Option<&'a Value>) -> ResponseStatus<'a> {
        let status = body.filter(|b| b["kind"] == "Status");
        let field = |k: &str| status.and_then(|b| b.get(k));
        ResponseStatus { metadata: Empty {}, status: field("status"), message: field("message"), reason: field("reason"), code }
    }
}

/// What one stage adds to the request's part.
#[derive(Default)]
struct StageFields<'a> {
    status: Option<ResponseStatus<'a>>,
    request_object: Option<&'a Value>,
    response_object: Option<&'a Value>,
}

/// The Event's fields between `stage` and `responseStatus`, borrowed from the request.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Middle<'a> {
    #[serde(rename = "requestURI")]
    request_uri: &'a str,
    verb: &'a str,
    user: UserRecord<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    impersonated_user: Option<Impersonated<'a>>,
    #[serde(rename = "sourceIPs")]
    source_ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    object_ref: Option<ObjectRef<'a>>,
}

#[derive(Serialize)]
struct UserRecord<'a> {
    username: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    uid: &'a str,
    groups: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    extra: &'a BTreeMap<String, Vec<String>>,
}

#[derive(Serialize)]
struct Impersonated<'a> {
    username: &'a str,
    groups: Vec<&'a str>,
}

/// `objectRef`; `apiGroup` is always there (empty for the core group), the rest when known.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    resource: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    api_group: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    api_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    subresource: &'a str,
}

impl Record {
    fn new(
        log: Arc<AuditLog>,
        decision: Decision,
        req: &Request,
        user: &UserInfo,
        a: &Attributes,
        id: &str,
        received: jiff::Timestamp,
    ) -> Record {
        // An audit ID is a UUID and a level a fixed word: neither needs escaping.
        let head = format!(
            "{{\"kind\":\"Event\",\"apiVersion\":\"audit.k8s.io/v1\",\"level\":\"{}\",\"auditID\":\"{id}\"",
            decision.level.as_str()
        );
        let headers = req.headers();
        let impersonated_user = headers.get("impersonate-user").and_then(|v| v.to_str().ok()).map(|username| Impersonated {
            username,
            groups: headers.get_all("impersonate-group").iter().filter_map(|v| v.to_str().ok()).collect(),
        });
        let middle = Middle {
            request_uri: req.uri().path_and_query().map_or_else(|| req.uri().path(), |p| p.as_str()),
            verb: &a.verb,
            user: UserRecord { username: &user.name, uid: &user.uid, groups: &user.groups, extra: &user.extra },
            impersonated_user,
            source_ips: source_ips(req),
            user_agent: headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()),
            object_ref: a.resource_request.then_some(ObjectRef {
                resource: &a.resource,
                namespace: &a.namespace,
                name: &a.name,
                api_group: &a.api_group,
                api_version: &a.api_version,
                subresource: &a.subresource,
            }),
        };
        // A struct of strings serializes into memory without fail; its braces come off so that the
        // stage's fields can follow inside the same object.
        let object = serde_json::to_string(&middle).unwrap_or_else(|_| "{}".into());
        let middle = object.strip_prefix('{').and_then(|o| o.strip_suffix('}')).unwrap_or_default().to_string();
        Record { log, decision, head, middle, received: micro(received) }
    }

    /// The Event of `stage` as one JSON line.
    fn line(&self, stage: Stage, fields: &StageFields, at: jiff::Timestamp) -> Vec<u8> {
        let objects = fields.request_object.is_some() || fields.response_object.is_some();
        let mut out = Vec::with_capacity(self.head.len() + self.middle.len() + if objects { 1024 } else { 160 });
        out.extend_from_slice(self.head.as_bytes());
        out.extend_from_slice(b",\"stage\":\"");
        out.extend_from_slice(stage.as_str().as_bytes());
        out.extend_from_slice(b"\",");
        out.extend_from_slice(self.middle.as_bytes());
        if let Some(status) = &fields.status {
            put_field(&mut out, "responseStatus", status);
        }
        if let Some(o) = fields.request_object {
            put_field(&mut out, "requestObject", o);
        }
        if let Some(o) = fields.response_object {
            put_field(&mut out, "responseObject", o);
        }
        out.extend_from_slice(b",\"requestReceivedTimestamp\":\"");
        out.extend_from_slice(self.received.as_bytes());
        out.extend_from_slice(b"\",\"stageTimestamp\":\"");
        out.extend_from_slice(micro(at).as_bytes());
        out.extend_from_slice(b"\"}\n");
        out
    }

    async fn emit(&self, stage: Stage, fields: StageFields<'_>) {
        if self.decision.omit.contains(&stage) {
            return;
        }
        let line = self.line(stage, &fields, jiff::Timestamp::now());
        self.log.emit(line).await;
    }
}

/// Appends `,"name":value` to a line being written.
fn put_field(out: &mut Vec<u8>, name: &str, value: &impl Serialize) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
    // Writing into memory fails only for maps whose keys are not strings, which JSON values and the
    // record's structs do not have.
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.extend_from_slice(b"null");
    }
}

fn micro(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Whether the answer is a stream that outlives the handler.
fn long_running(a: &Attributes, query: Option<&str>) -> bool {
    let flag = |name: &str| {
        query.is_some_and(|q| q.split('&').any(|p| p == format!("{name}=true") || p == format!("{name}=1") || p == name))
    };
    a.verb == "watch"
        || flag("watch")
        || (a.subresource == "log" && flag("follow"))
        || matches!(a.subresource.as_str(), "exec" | "attach" | "portforward" | "proxy")
}

/// The middleware: after authentication, so it knows the user; around everything after it, so it
/// sees refusals too. The request's attributes go on in its extensions, for authorization.
pub(crate) async fn audit(State(app): State<AppState>, mut req: Request, next: axum::middleware::Next) -> Response {
    let Some(log) = app.config.audit.clone() else { return next.run(req).await };
    let Some(user) = req.extensions().get::<UserInfo>() else { return next.run(req).await };
    let attrs = Arc::new(Attributes::of(req.method(), req.uri().path(), req.uri().query()));
    let decision = log.policy.decide(user, &attrs);
    if decision.level == Level::None {
        req.extensions_mut().insert(attrs);
        return next.run(req).await;
    }
    let received = jiff::Timestamp::now();
    let audit_id = uuid::Uuid::new_v4().to_string();
    let record = Arc::new(Record::new(log, decision, &req, user, &attrs, &audit_id, received));
    record.emit(Stage::RequestReceived, StageFields::default()).await;

    let streaming = long_running(&attrs, req.uri().query());
    req.extensions_mut().insert(attrs);
    let (req, request_object) = if record.decision.level >= Level::Request && has_body(req.method()) {
        match take_body(req, app.config.max_body_bytes).await {
            Ok(pair) => pair,
            Err(response) => return finish(&record, response, None).await,
        }
    } else {
        (req, None)
    };
    let mut response = next.run(req).await;
    if let Ok(id) = HeaderValue::from_str(&audit_id) {
        response.headers_mut().insert("audit-id", id);
    }
    if streaming {
        let code = response.status().as_u16();
        let started = StageFields { status: Some(ResponseStatus::of(code, None)), ..StageFields::default() };
        record.emit(Stage::ResponseStarted, started).await;
        let (parts, body) = response.into_parts();
        let guard = CompleteOnDrop { record: Some(record), code, request_object };
        let stream = body.into_data_stream().map(move |chunk| {
            let _ = &guard;
            chunk
        });
        return Response::from_parts(parts, Body::from_stream(stream));
    }
    finish(&record, response, request_object).await
}

/// Writes `ResponseComplete` for an answer that is already whole, keeping its body for
/// `RequestResponse`.
async fn finish(record: &Record, response: Response, request_object: Option<Value>) -> Response {
    let code = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let (body, response_object) = if record.decision.level >= Level::RequestResponse && is_json(&parts.headers) {
        match axum::body::to_bytes(body, usize::MAX).await {
            Ok(bytes) => {
                let object = serde_json::from_slice::<Value>(&bytes).ok();
                (Body::from(bytes), object)
            }
            Err(_) => (Body::empty(), None),
        }
    } else {
        (body, None)
    };
    let strip = record.decision.omit_managed_fields;
    let request_object = request_object.map(|o| without_managed_fields(o, strip));
    let response_object = response_object.map(|o| without_managed_fields(o, strip));
    let fields = StageFields {
        status: Some(ResponseStatus::of(code, response_object.as_ref())),
        request_object: request_object.as_ref(),
        response_object: response_object.as_ref(),
    };
    record.emit(Stage::ResponseComplete, fields).await;
    Response::from_parts(parts, body)
}

/// Writes a streaming request's `ResponseComplete` when its body is done with: finished, or
/// dropped because the client went away.
struct CompleteOnDrop {
    record: Option<Arc<Record>>,
    code: u16,
    request_object: Option<Value>,
}

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        let Some(record) = self.record.take() else { return };
        let (code, request_object) = (self.code, self.request_object.take());
        // Drop cannot wait for the queue; a task can.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let fields = StageFields {
                    status: Some(ResponseStatus::of(code, None)),
                    request_object: request_object.as_ref(),
                    response_object: None,
                };
                record.emit(Stage::ResponseComplete, fields).await;
            });
        }
    }
}

/// `X-Forwarded-For`'s addresses, then the connection's, as Kubernetes lists them.
fn source_ips(req: &Request) -> Vec<String> {
    let mut ips: Vec<String> = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| s.parse::<std::net::IpAddr>().is_ok()).collect())
        .unwrap_or_default();
    if let Some(PeerAddr(peer)) = req.extensions().get::<PeerAddr>() {
        let ip = peer.ip().to_string();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

fn has_body(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE)
}

fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("application/json"))
}

/// Reads the request body for the record and puts it back for the handler.
async fn take_body(req: Request, limit: usize) -> Result<(Request, Option<Value>), Response> {
    let (parts, body) = req.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            let e = shepherd_api::ApiError::RequestEntityTooLarge(format!(
                "request body is larger than the limit of {limit} bytes"
            ));
            return Err(crate::http::error_response(&e));
        }
    };
    // YAML and protobuf bodies are kept out; the record says what JSON said.
    let object = serde_json::from_slice::<Value>(&bytes).ok();
    Ok((Request::from_parts(parts, Body::from(bytes)), object))
}

fn without_managed_fields(mut object: Value, strip: bool) -> Value {
    if strip {
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        if let Some(items) = object.get_mut("items").and_then(Value::as_array_mut) {
            for item in items {
                if let Some(meta) = item.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("managedFields");
                }
            }
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(method: Method, path: &str) -> Attributes {
        Attributes::of(&method, path, None)
    }

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    nonResourceURLs: ["/healthz*", "/version"]
  - level: Metadata
    resources:
      - group: ""
        resources: ["secrets", "configmaps"]
  - level: None
    users: ["system:kube-proxy"]
    verbs: ["watch"]
  - level: RequestResponse
    resources:
      - group: "apps"
        resources: ["deployments/scale"]
  - level: Request
    namespaces: ["prod"]
  - level: Metadata
"#;

    #[test]
    fn the_first_matching_rule_sets_the_level() {
        let p = Policy::parse(POLICY).expect("policy");
        let alice = UserInfo::new("alice", ["dev"]);
        let level = |m: Method, path: &str| p.decide(&alice, &attrs(m, path)).level;
        assert_eq!(level(Method::GET, "/healthz/ready"), Level::None);
        assert_eq!(level(Method::GET, "/version"), Level::None);
        assert_eq!(level(Method::GET, "/openapi/v2"), Level::Metadata);
        // Secrets stay at Metadata even in prod: their values never reach the log.
        assert_eq!(level(Method::POST, "/api/v1/namespaces/prod/secrets"), Level::Metadata);
        assert_eq!(level(Method::POST, "/api/v1/namespaces/prod/pods"), Level::Request);
        assert_eq!(level(Method::PUT, "/apis/apps/v1/namespaces/dev/deployments/web/scale"), Level::RequestResponse);
        assert_eq!(level(Method::PUT, "/apis/apps/v1/namespaces/dev/deployments/web"), Level::Metadata);
        let proxy = UserInfo::new("system:kube-proxy", Vec::<String>::new());
        let watch = Attributes::of(&Method::GET, "/api/v1/services", Some("watch=true"));
        assert_eq!(p.decide(&proxy, &watch).level, Level::None);
        assert!(p.decide(&alice, &watch).omit.contains(&Stage::RequestReceived));
    }

    /// The fields of Kubernetes' `audit.k8s.io/v1` Event, in the order its JSON has them.
    const EVENT_FIELDS: &[&str] = &["kind", "apiVersion", "level", "auditID", "stage", "requestURI", "verb", "user",
        "impersonatedUser", "sourceIPs", "userAgent", "objectRef", "responseStatus", "requestObject", "responseObject",
        "requestReceivedTimestamp", "stageTimestamp", "annotations"];

    #[tokio::test]
    async fn a_record_has_the_fields_of_a_kubernetes_audit_event_in_their_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = AuditConfig { path: dir.path().join("audit.log"), policy: Policy::metadata_for_everything(),
            max_bytes: 0, max_backups: 0 };
        let log = AuditLog::start(config).expect("log");
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("/api/v1/namespaces/dev/pods/web/eviction?dryRun=All")
            .header(header::USER_AGENT, "kubectl/v1.33.0")
            .header("x-forwarded-for", "10.0.0.7, not-an-address")
            .header("impersonate-user", "carol")
            .header("impersonate-group", "qa")
            .body(Body::empty())
            .expect("request");
        req.extensions_mut().insert(PeerAddr("127.0.0.1:50000".parse().expect("address")));
        let mut alice = UserInfo::new("alice", ["dev"]);
        alice.uid = "42".into();
        alice.extra.insert("scopes".into(), vec!["a \"quoted\" one".into()]);
        let a = Attributes::of(req.method(), req.uri().path(), req.uri().query());
        let decision = Policy::metadata_for_everything().decide(&alice, &a);
        let received: jiff::Timestamp = "2026-12-01T10:00:00.000001Z".parse().expect("time");
        let record = Record::new(log, decision, &req, &alice, &a, "6f1c2b7e-0000-4000-8000-000000000001", received);
        let status = json!({"kind": "Status", "status": "Failure", "message": "no", "reason": "TooManyRequests", "code": 429});
        let fields = StageFields { status: Some(ResponseStatus::of(429, Some(&status))), ..StageFields::default() };
        let at: jiff::Timestamp = "2026-12-01T10:00:00.25Z".parse().expect("time");
        let line = record.line(Stage::ResponseComplete, &fields, at);
        assert_eq!(line.last(), Some(&b'\n'), "one event per line");
        let event: Value = serde_json::from_slice(&line).expect("a JSON line");
        assert_eq!(event, json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": "6f1c2b7e-0000-4000-8000-000000000001", "stage": "ResponseComplete",
            "requestURI": "/api/v1/namespaces/dev/pods/web/eviction?dryRun=All", "verb": "create",
            "user": {"username": "alice", "uid": "42", "groups": ["dev", "system:authenticated"],
                "extra": {"scopes": ["a \"quoted\" one"]}},
            "impersonatedUser": {"username": "carol", "groups": ["qa"]},
            "sourceIPs": ["10.0.0.7", "127.0.0.1"], "userAgent": "kubectl/v1.33.0",
            "objectRef": {"resource": "pods", "namespace": "dev", "name": "web", "apiGroup": "",
                "apiVersion": "v1", "subresource": "eviction"},
            "responseStatus": {"metadata": {}, "status": "Failure", "message": "no", "reason": "TooManyRequests",
                "code": 429},
            "requestReceivedTimestamp": "2026-12-01T10:00:00.000001Z",
            "stageTimestamp": "2026-12-01T10:00:00.250000Z",
        }));
        // Keys in the Event's own order: a reader of Kubernetes' logs finds them where it expects.
        let text = std::str::from_utf8(&line).expect("utf-8");
        let positions: Vec<usize> = EVENT_FIELDS.iter().filter_map(|f| text.find(&format!("\"{f}\":"))).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "fields out of the Event's order: {text}");
        let top: Vec<&String> = event.as_object().expect("object").keys().collect();
        assert!(top.iter().all(|k| EVENT_FIELDS.contains(&k.as_str())), "a field Kubernetes' Event lacks: {top:?}");
    }

    #[test]
    fn a_policy_that_is_not_one_is_refused_with_the_reason() {
        let wrong_kind = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Pod\n").unwrap_err();
        assert!(wrong_kind.contains("kind Policy"), "{wrong_kind}");
        let bad_level = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Everything}]\n").unwrap_err();
        assert!(bad_level.contains("Everything"), "{bad_level}");
        let unknown = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, user: [x]}]\n").unwrap_err();
        assert!(unknown.contains("user"), "{unknown}");
        let mixed = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/x], namespaces: [a]}]\n";
        assert!(Policy::parse(mixed).unwrap_err().contains("nonResourceURLs"));
    }

    #[test]
    fn a_full_log_turns_over_and_keeps_the_newest_backups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let mut sink = Sink::open(&path, 100, 2).expect("open");
        for i in 0..20 {
            sink.write(format!("{{\"n\":{i:040}}}\n").as_bytes()).expect("write");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        sink.flush().expect("flush");
        let mut names: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names.len(), 3, "the log and two backups: {names:?}");
        assert!(names.iter().all(|n| n == "audit.log" || (n.starts_with("audit-") && n.ends_with(".log"))), "{names:?}");
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.len() <= 100 && current.contains("0019"), "{current}");
    }
}
