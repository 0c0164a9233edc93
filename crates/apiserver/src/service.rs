//! The API's operations on objects, shared by the HTTP handlers and the in-process client.
//!
//! Everything a write goes through lives here, in one order: decode, check kind and namespace,
//! drop or refuse unknown fields (`fieldValidation`), default, set server-owned metadata,
//! validate, then one store write with a precondition (none on a dry run). A rejected request
//! returns before the store is touched, so it writes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::selector::Selection;
use shepherd_api::{ApiError, defaults, validation};
use shepherd_store::{KeyValue, PackedKeyValue, Revision, Store, StoreError};

use crate::apply::{self, Writer};
use crate::codec;
use crate::metrics::Metrics;
use crate::nodeport::{NodePortRange, NodePorts};
pub use crate::patch::PatchType;
use crate::patch::apply_patch;
use crate::write_options::{FieldValidation, WriteOptions, strict_decoding_error};

/// Namespaces that exist from the first start, as in Kubernetes.
pub const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// How long a write without a client precondition keeps retrying after losing races to other
/// writers, as Kubernetes' GuaranteedUpdate does: a `kubectl annotate` never sees a conflict it
/// did not ask for. Well inside the time-outs of clients (kubectl: none; client-go: 60 s).
const RETRY_DEADLINE: Duration = Duration::from_secs(30);

/// Back-off between retries of a lost race: doubling from the first to the last, with jitter so
/// that writers that collided once do not collide again in lock step.
const RETRY_FIRST_BACKOFF: Duration = Duration::from_millis(1);
const RETRY_MAX_BACKOFF: Duration = Duration::from_millis(100);

/// How long a read that asks for a revision newer than the store's waits for it to arrive
/// before answering 504, as Kubernetes' watch cache does.
pub(crate) const FUTURE_REVISION_WAIT: Duration = Duration::from_secs(3);

/// Retries of one write that lost a race to another writer.
struct Retry {
    deadline: Instant,
    backoff: Duration,
}

impl Retry {
    fn new() -> Self {
        Retry { deadline: Instant::now() + RETRY_DEADLINE, backoff: RETRY_FIRST_BACKOFF }
    }

    /// Waits before the next attempt; false once the deadline has passed.
    async fn wait(&mut self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        let jitter = rand::random_range(0.5..1.5);
        tokio::time::sleep(self.backoff.mul_f64(jitter)).await;
        self.backoff = (self.backoff * 2).min(RETRY_MAX_BACKOFF);
        true
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    /// Which revision the list may be served at; `Any` (unset) is the most recent.
    pub revision: RevisionMatch,
}

/// `resourceVersion` with `resourceVersionMatch` of a get or list, as Kubernetes defines them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RevisionMatch {
    /// Unset, or `"0"`: the most recent state (Shepherd serves reads from memory, so "any" and
    /// "most recent" are the same answer).
    #[default]
    Any,
    /// This revision or a newer one (`resourceVersion=N`, with or without `NotOlderThan`).
    NotOlderThan(Revision),
    /// Exactly this revision (`resourceVersionMatch=Exact`).
    Exact(Revision),
}

/// A page of a list: the objects, the revision it was read at, and where the next page starts.
/// The values stay packed as the store keeps them until each is read (`PackedKeyValue::unpack`),
/// so a page of thousands of objects does not hold them all unpacked at once.
pub struct ListPage {
    pub items: Vec<PackedKeyValue>,
    pub revision: Revision,
    pub continue_token: Option<String>,
}

/// Which part of an object a write replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

impl Part {
    fn track(self) -> Track<'static> {
        match self {
            Part::Main => Track::Update(""),
            Part::Status => Track::Update("status"),
        }
    }
}

/// How a write records its owners in `managedFields`.
#[derive(Debug, Clone, Copy)]
enum Track<'a> {
    /// As an update through this subresource (`""` for the object itself): the writer takes the
    /// fields it changed.
    Update(&'a str),
    /// The object is the result of an apply, which set its owners.
    Applied,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation_policy: Option<String>,
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<Revision>,
    /// `dryRun=All`: the object is returned as the delete would leave it, and nothing is written.
    pub dry_run: bool,
}

/// What a create, update or patch wrote (or, on a dry run, would have written), and the
/// warnings for the client (unknown fields dropped under `fieldValidation=Warn`).
#[derive(Debug, Clone)]
pub struct Written {
    pub kv: KeyValue,
    pub warnings: Vec<String>,
    /// The object as written, where the write had it at hand (without its new resourceVersion).
    pub object: Option<Value>,
}

impl Written {
    /// The object as stored, with its resourceVersion: the one the write had at hand when it
    /// has it (what decoding the stored text gives, without the parse), else the stored text decoded.
    pub fn into_value(self) -> Result<Value, ApiError> {
        match self.object {
            Some(mut obj) => {
                meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(self.kv.mod_revision.to_string()));
                Ok(obj)
            }
            None => codec::decode(&self.kv),
        }
    }
}

/// What a delete did.
pub enum Deleted {
    /// The object is gone; this was its last state.
    Gone(KeyValue),
    /// The object stays, marked with `deletionTimestamp`, until its finalizers are removed or its
    /// node agent confirms a pod has stopped.
    Pending(KeyValue),
}

impl Deleted {
    pub fn kv(&self) -> &KeyValue {
        match self {
            Deleted::Gone(kv) | Deleted::Pending(kv) => kv,
        }
    }
}

/// The object API over one store.
#[derive(Clone)]
pub struct ApiService {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) node_ports: Arc<NodePorts>,
    /// `metrics.k8s.io`: what node agents last reported, in memory only.
    pub(crate) resource_metrics: Arc<crate::resource_metrics::MetricsTable>,
    /// Signs and checks ServiceAccount tokens; `None`: no tokens are issued nor mounted into pods.
    pub(crate) service_account_tokens: Option<Arc<crate::serviceaccount::ServiceAccountTokens>>,
    /// Watches that select by node, one store watch per kind for all of them.
    pub(crate) node_watches: Arc<crate::watch_hub::NodeWatches>,
}

pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn store_err(res: &ResourceInfo, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::NotFound { .. } => ApiError::not_found(&res.qualified_plural(), name),
        StoreError::AlreadyExists { .. } => ApiError::already_exists(&res.qualified_plural(), name),
        StoreError::Conflict { .. } => ApiError::conflict(
            &res.qualified_plural(),
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ),
        e => store_failure(e),
    }
}

/// A store failure that is about no one object (the store's state, its disk, its history).
pub(crate) fn store_failure(e: StoreError) -> ApiError {
    match e {
        StoreError::Expired { requested, oldest } => ApiError::Expired(format!(
            "too old resource version: {requested} ({oldest})"
        )),
        StoreError::Lagged => ApiError::Expired("watch fell behind; re-list and watch again".into()),
        StoreError::Closed => ApiError::ServiceUnavailable("the store is shutting down".into()),
        StoreError::Backend(m) => ApiError::Internal(m),
        StoreError::NoSpace(m) => ApiError::InsufficientStorage(m),
        StoreError::Unavailable(m) => ApiError::ServiceUnavailable(m),
        StoreError::FutureRevision { requested, current } => ApiError::ResourceVersionTooLarge { requested, current },
        e @ (StoreError::NotFound { .. } | StoreError::AlreadyExists { .. } | StoreError::Conflict { .. }) => {
            ApiError::Internal(e.to_string())
        }
    }
}

fn meta(obj: &Value) -> Option<&serde_json::Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// The object's metadata, made an empty map if it is missing or not a map. Callers have checked
/// that `obj` is an object; one that is not becomes an empty object rather than a panic.
fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Value::Object(fields) = obj else { unreachable!("obj was just made an object") };
    let meta = fields.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    let Value::Object(m) = meta else { unreachable!("metadata was just made an object") };
    m
}

fn finalizers(obj: &Value) -> usize {
    meta(obj).and_then(|m| m.get("finalizers")).and_then(Value::as_array).map_or(0, Vec::len)
}

/// Parses a resourceVersion given by a client. Empty means "none".
pub fn parse_resource_version(rv: &str) -> Result<Option<Revision>, ApiError> {
    if rv.is_empty() {
        return Ok(None);
    }
    rv.parse::<Revision>()
        .map(Some)
        .map_err(|_| ApiError::BadRequest(format!("resourceVersion {rv:?} is not a valid resource version")))
}

/// Whether the desired state differs: everything but metadata, status and the type, which is
/// what `metadata.generation` counts changes of.
fn spec_changed(old: &Value, new: &Value) -> bool {
    const NOT_SPEC: [&str; 4] = ["metadata", "status", "apiVersion", "kind"];
    let empty = serde_json::Map::new();
    let (o, n) = (old.as_object().unwrap_or(&empty), new.as_object().unwrap_or(&empty));
    let spec_keys = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| !NOT_SPEC.contains(&k.as_str())).count();
    spec_keys(o) != spec_keys(n)
        || o.iter().any(|(k, v)| !NOT_SPEC.contains(&k.as_str()) && n.get(k) != Some(v))
}

/// Random suffix for `generateName`, from the same alphabet Kubernetes uses (no vowels, no
/// look-alike digits), so names never spell words.
pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let id = uuid::Uuid::new_v4();
    id.as_bytes().iter().take(5).map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

/// The continue token: the revision of the first page and the last key returned, hex-encoded.
fn encode_continue(revision: Revision, last_key: &str) -> String {
    let raw = format!("{revision}\n{last_key}");
    raw.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::BadRequest("continue token is invalid; start the list again without it".into());
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> =
        (0..token.len()).step_by(2).map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16)).collect();
    let raw = String::from_utf8(bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    let (rev, key) = raw.split_once('\n').ok_or_else(bad)?;
    Ok((rev.parse().map_err(|_| bad())?, key.to_string()))
}

impl ApiService {
    pub fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        ApiService {
            store,
            metrics,
            node_ports: Arc::default(),
            resource_metrics: Arc::default(),
            service_account_tokens: None,
            node_watches: Arc::default(),
        }
    }

    /// Allocates Services' node ports from `range` (30000-32767 by default).
    pub fn set_node_port_range(&mut self, range: NodePortRange) {
        self.node_ports = Arc::new(NodePorts::new(range));
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Creates the namespaces every cluster has, if they are missing.
    pub async fn ensure_system_namespaces(&self) -> Result<(), ApiError> {
        for ns in SYSTEM_NAMESPACES {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            match self.create(&kinds::NAMESPACE, None, obj).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn key(res: &ResourceInfo, ns: Option<&str>, name: &str) -> String {
        res.key(ns, name)
    }

    fn require_namespace<'a>(res: &ResourceInfo, ns: Option<&'a str>) -> Result<Option<&'a str>, ApiError> {
        match (res.namespaced, ns) {
            (true, None) => Err(ApiError::BadRequest(format!("{} are namespaced: a namespace is required", res.plural))),
            (true, Some(ns)) => Ok(Some(ns)),
            (false, _) => Ok(None),
        }
    }

    pub async fn get(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<KeyValue, ApiError> {
        let ns = Self::require_namespace(res, ns)?;
        self.store
            .get(&Self::key(res, ns, name))
            .await
            .map_err(|e| store_err(res, name, e))?
            .ok_or_else(|| ApiError::not_found(&res.qualified_plural(), name))
    }

    /// Waits until the store has reached `revision`, briefly: a client that read a revision from
    /// another server may be ahead of this one (Kubernetes' watch cache waits the same way).
    pub(crate) async fn wait_for_revision(&self, revision: Revision) -> Result<(), ApiError> {
        let deadline = Instant::now() + FUTURE_REVISION_WAIT;
        loop {
            let current = self.store.revision().await.map_err(store_failure)?;
            if current >= revision {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ApiError::ResourceVersionTooLarge { requested: revision, current });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn list(&self, res: &ResourceInfo, ns: Option<&str>, opts: &ListOptions) -> Result<ListPage, ApiError> {
        // A revision newer than the store's is waited for, then 504 (as Kubernetes answers it).
        // Exact reads the list as it stood then, from the retained history; older than that is
        // 410 Expired, as Kubernetes answers a compacted revision.
        let at = match opts.revision {
            RevisionMatch::Any => None,
            RevisionMatch::NotOlderThan(rv) => {
                self.wait_for_revision(rv).await?;
                None
            }
            RevisionMatch::Exact(rv) => {
                self.wait_for_revision(rv).await?;
                Some(rv)
            }
        };
        self.list_at(res, ns, opts, at).await
    }

    /// One page, read at one revision: `at`, or the first page's for a continued list, or the
    /// current one. Later pages see the list as the first did, whatever was written since.
    async fn list_at(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        at: Option<Revision>,
    ) -> Result<ListPage, ApiError> {
        let selection = Selection::parse(opts.label_selector.as_deref(), opts.field_selector.as_deref())?;
        let prefix = match (res.namespaced, ns) {
            (true, Some(ns)) => res.namespace_prefix(ns),
            _ => res.key_prefix(),
        };
        let (first_revision, start_after) = match &opts.continue_token {
            Some(t) if !t.is_empty() => {
                let (rev, key) = decode_continue(t)?;
                (Some(rev), Some(key))
            }
            _ => (None, None),
        };
        let filtering = !selection.is_empty();
        let mut items = Vec::new();
        let mut cursor = start_after;
        let mut revision = first_revision.or(at);
        let mut more;
        // With a selector, keep reading until the page is full of matches or the keys run out.
        loop {
            let want = opts.limit.map(|l| l.saturating_sub(items.len()));
            let want = want.map(|w| w.max(1));
            let page = self.store.list_packed(&prefix, cursor.as_deref(), want, revision).await;
            let page = page.map_err(|e| match e {
                StoreError::Expired { .. } if first_revision.is_some() => continue_too_old(),
                StoreError::Expired { .. } => exact_too_old(),
                e => store_err(res, "", e),
            })?;
            revision.get_or_insert(page.revision);
            more = page.more;
            cursor = page.items.last().map(|kv| kv.key.clone()).or(cursor);
            for kv in page.items {
                // The value unpacked for the selector is dropped again: the page keeps it packed.
                if filtering && !codec::selected(&selection, &kv.unpack())? {
                    continue;
                }
                items.push(kv);
            }
            if !more || opts.limit.is_none_or(|l| items.len() >= l) {
                break;
            }
        }
        let revision = revision.unwrap_or(0);
        let continue_token = match (more, &cursor) {
            (true, Some(last)) => Some(encode_continue(revision, last)),
            _ => None,
        };
        Ok(ListPage { items, revision, continue_token })
    }

    /// Checks `apiVersion`/`kind` of a request body against the resource it was sent to, and
    /// fills them in when absent.
    fn check_type(res: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::BadRequest("request body must be a JSON object".into()));
        }
        check_metadata_is_object(res, obj)?;
        let api_version = res.api_version();
        match obj.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => obj["apiVersion"] = json!(api_version),
            Some(v) if v == api_version => {}
            Some(v) => {
                return Err(ApiError::BadRequest(format!(
                    "the API version in the data ({v}) does not match the expected API version ({api_version})"
                )));
            }
        }
        match obj.get("kind").and_then(Value::as_str) {
            None | Some("") => obj["kind"] = json!(res.kind),
            Some(k) if k == res.kind => {}
            Some(k) => {
                return Err(ApiError::BadRequest(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    res.kind
                )));
            }
        }
        Ok(())
    }

    /// Places the object in the request's namespace, refusing a body that names another one.
    fn check_namespace(res: &ResourceInfo, ns: Option<&str>, obj: &mut Value) -> Result<(), ApiError> {
        let body_ns = meta_str(obj, "namespace").map(str::to_string);
        let m = meta_mut(obj);
        match (res.namespaced, ns) {
            (true, Some(ns)) => {
                if let Some(b) = body_ns.filter(|b| !b.is_empty() && b != ns) {
                    return Err(ApiError::BadRequest(format!(
                        "the namespace of the provided object ({b}) does not match the namespace sent on the request ({ns})"
                    )));
                }
                m.insert("namespace".into(), json!(ns));
            }
            (true, None) => return Self::require_namespace(res, None).map(|_| ()),
            (false, _) => {
                m.remove("namespace");
            }
        }
        Ok(())
    }

    async fn namespace_must_exist(&self, res: &ResourceInfo, ns: Option<&str>) -> Result<(), ApiError> {
        if let (true, Some(ns)) = (res.namespaced, ns) {
            let ns_obj = self.store.get(&kinds::NAMESPACE.key(None, ns)).await.map_err(|e| store_err(res, ns, e))?;
            match ns_obj {
                None => return Err(ApiError::not_found("namespaces", ns)),
                Some(kv) => {
                    let v = codec::decode(&kv)?;
                    if meta(&v).is_some_and(|m| m.contains_key("deletionTimestamp")) {
                        return Err(ApiError::Forbidden(format!(
                            "unable to create new content in namespace {ns} because it is being terminated"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The ServiceAccount admission check: a new pod naming an account must name an existing one.
    /// `default` is not checked, because its controller creates it a moment after the namespace
    /// and a pod created in that moment would be refused for nothing.
    async fn service_account_must_exist(&self, res: &ResourceInfo, ns: Option<&str>, obj: &Value) -> Result<(), ApiError> {
        let (true, Some(ns)) = (res.kind == "Pod" && res.group.is_empty(), ns) else { return Ok(()) };
        let named = obj.pointer("/spec/serviceAccountName").and_then(Value::as_str);
        let Some(sa) = named.filter(|s| !s.is_empty() && *s != "default") else { return Ok(()) };
        let found = self.store.get(&kinds::SERVICEACCOUNT.key(Some(ns), sa)).await.map_err(|e| store_err(res, sa, e))?;
        if found.is_none() {
            let name = meta_str(obj, "name").unwrap_or("");
            return Err(ApiError::Forbidden(format!(
                "pods \"{name}\" is forbidden: error looking up service account {ns}/{sa}: serviceaccount \"{sa}\" not found"
            )));
        }
        Ok(())
    }

    /// Applies `fieldValidation` to an object about to be written: unknown fields are an error
    /// (Strict) or dropped (Warn, Ignore), and named in warnings (Warn). Fields Kubernetes knows
    /// but Shepherd does not implement are not unknown: validation refuses them under every
    /// setting, as they would otherwise be silently ignored.
    fn check_fields(
        res: &ResourceInfo,
        obj: &mut Value,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<validation::Schema, ApiError> {
        let (unknown, schema) = match crate::crd::prune_unknown(res, obj) {
            Some(unknown) => (unknown, validation::Schema::Check),
            None => validation::prune_and_check(res, obj),
        };
        if unknown.is_empty() {
            return Ok(schema);
        }
        let problems = unknown.iter().map(|p| format!("unknown field \"{p}\""));
        match opts.field_validation {
            FieldValidation::Strict => {
                let problems: Vec<String> = problems.collect();
                let version = res.api_version();
                let version = version.rsplit('/').next().unwrap_or("v1");
                Err(strict_decoding_error(res.kind, version, &problems))
            }
            FieldValidation::Warn => {
                warnings.extend(problems);
                Ok(schema)
            }
            FieldValidation::Ignore => Ok(schema),
        }
    }

    pub async fn create(&self, res: &ResourceInfo, ns: Option<&str>, obj: Value) -> Result<KeyValue, ApiError> {
        self.create_with(res, ns, obj, &WriteOptions::default()).await.map(|w| w.kv)
    }

    pub async fn create_with(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.create_tracked(res, ns, obj, opts, Track::Update("")).await
    }

    /// A create; `Track::Applied` when `obj` is the result of an apply, its owners already set.
    async fn create_tracked(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
        track: Track<'_>,
    ) -> Result<Written, ApiError> {
        Self::check_type(res, &mut obj)?;
        let mut warnings = Vec::new();
        let schema = Self::check_fields(res, &mut obj, opts, &mut warnings)?;
        Self::check_namespace(res, ns, &mut obj)?;
        let ns = if res.namespaced { meta_str(&obj, "namespace").map(str::to_string) } else { None };
        {
            let m = meta_mut(&mut obj);
            let name = m.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let generate = m.get("generateName").and_then(Value::as_str).unwrap_or("").to_string();
            if name.is_empty() && !generate.is_empty() {
                m.insert("name".into(), json!(format!("{generate}{}", random_suffix())));
            }
            for server_owned in ["uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                "deletionGracePeriodSeconds", "generation", "selfLink"] {
                m.remove(server_owned);
            }
            if let Track::Update(_) = track {
                m.remove("managedFields");
            }
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(now_rfc3339()));
            m.insert("generation".into(), json!(1));
        }
        reset_status_on_create(res, &mut obj);
        defaults::apply_defaults(res, &mut obj);
        if let (true, Some(ns)) = (res.kind == "Pod" && res.group.is_empty(), ns.as_deref()) {
            crate::serviceaccount::mount_token(self, ns, &mut obj).await?;
        }
        crate::crd::admit(res, None, &mut obj)?;
        crate::authz::admit(res, None, &obj)?;
        if let Track::Update(subresource) = track {
            apply::record_update(res, None, &mut obj, Writer { manager: opts.manager(), subresource });
        }
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        validation::validate_as(res, &obj, schema)?;
        self.namespace_must_exist(res, ns.as_deref()).await?;
        self.service_account_must_exist(res, ns.as_deref(), &obj).await?;
        let assigned = self.node_ports.assign(self.store.as_ref(), res, None, &mut obj, !opts.dry_run).await?;
        let key = Self::key(res, ns.as_deref(), &name);
        if opts.dry_run {
            if self.store.get(&key).await.map_err(|e| store_err(res, &name, e))?.is_some() {
                return Err(ApiError::already_exists(&res.qualified_plural(), &name));
            }
            return Ok(Written { kv: dry_run_kv(key, &obj, 0)?, warnings, object: None });
        }
        let bytes = codec::encode(&obj)?;
        let started = Instant::now();
        let r = self.store.create(&key, bytes).await;
        self.metrics.observe_store_write(started);
        match &r {
            Ok(_) => assigned.written(self.store.as_ref()).await,
            Err(_) => assigned.not_written(self.store.as_ref()).await,
        }
        let kv = r.map_err(|e| store_err(res, &name, e))?;
        crate::crd::written(self, res, &obj, false);
        Ok(Written { kv, warnings, object: Some(obj) })
    }

    /// Replaces an object (or only its status), as `PUT` does. A `metadata.resourceVersion` in
    /// the body is a precondition; without one the write wins over concurrent ones.
    pub async fn update(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        body: Value,
        part: Part,
    ) -> Result<KeyValue, ApiError> {
        self.update_with(res, ns, name, body, part, &WriteOptions::default()).await.map(|w| w.kv)
    }

    pub async fn update_with(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        mut body: Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        Self::check_type(res, &mut body)?;
        Self::check_namespace(res, ns, &mut body)?;
        match meta_str(&body, "name") {
            Some(n) if n == name => {}
            Some("") | None => {
                meta_mut(&mut body).insert("name".into(), json!(name));
            }
            Some(n) => {
                return Err(ApiError::BadRequest(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        let precondition = parse_resource_version(meta_str(&body, "resourceVersion").unwrap_or(""))?;
        self.mutate_checked(res, ns, name, precondition, true, opts, part.track(), |old| {
            check_uid_precondition(res, old, &body)?;
            Ok(merge_update(res, old, &body, part))
        })
        .await
    }

    /// Applies a patch to the current object (or its status), retrying if another writer got in
    /// first, unless the patch itself carries a resourceVersion.
    pub async fn patch(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        part: Part,
    ) -> Result<KeyValue, ApiError> {
        self.patch_with(res, ns, name, patch_type, patch, part, &WriteOptions::default()).await.map(|w| w.kv)
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn patch_with(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let precondition = match patch_type {
            PatchType::Json => None,
            _ => parse_resource_version(
                patch.get("metadata").and_then(|m| m.get("resourceVersion")).and_then(Value::as_str).unwrap_or(""),
            )?,
        };
        self.mutate_checked(res, ns, name, precondition, true, opts, part.track(), |old| {
            let patched = apply_patch(old, patch_type, patch)?;
            check_type_unchanged(res, old, &patched)?;
            check_patched_identity(res, ns, name, &patched)?;
            // A JSON patch that replaces the resourceVersion makes it a precondition, as in Kubernetes
            // (kubectl moves client-side ownership to server-side apply so).
            if patch_type == PatchType::Json && patched.pointer("/metadata/resourceVersion") != old.pointer("/metadata/resourceVersion") {
                return Err(ApiError::conflict(&res.qualified_plural(), name,
                    "the object has been modified; please apply your changes to the latest version and try again"));
            }
            check_metadata_is_object(res, &patched)?;
            check_uid_precondition(res, old, &patched)?;
            Ok(merge_update(res, old, &patched, part))
        })
        .await
    }

    /// Server-side apply (`application/apply-patch+yaml`) of `config` by `opts.field_manager`: merges
    /// it into the object (creating the object if it is absent, for the main resource), records the
    /// manager's ownership, and refuses with 409 a change to fields another manager owns unless
    /// `opts.force`. The bool says whether the object was created.
    pub async fn apply_with(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        config: &Value,
        part: Part,
        opts: &WriteOptions,
    ) -> Result<(Written, bool), ApiError> {
        let mut config = config.clone();
        Self::check_type(res, &mut config)?;
        Self::check_namespace(res, ns, &mut config)?;
        match meta_str(&config, "name") {
            Some(n) if n == name => {}
            Some("") | None => {
                meta_mut(&mut config).insert("name".into(), json!(name));
            }
            Some(n) => {
                return Err(ApiError::BadRequest(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        if meta(&config).and_then(|m| m.get("managedFields")).is_some_and(|f| !f.is_null()) {
            return Err(ApiError::BadRequest("metadata.managedFields must be nil".into()));
        }
        let precondition = parse_resource_version(meta_str(&config, "resourceVersion").unwrap_or(""))?;
        meta_mut(&mut config).remove("resourceVersion");
        let subresource = match part {
            Part::Main => "",
            Part::Status => "status",
        };
        let w = Writer { manager: opts.manager(), subresource };
        loop {
            let applied = self
                .mutate_checked(res, ns, name, precondition, true, opts, Track::Applied, |old| {
                    if opts.field_validation == FieldValidation::Strict {
                        // Unknown fields are refused before pruning could hide them.
                        let mut probe = apply::merged(res, old, &config, w);
                        Self::check_fields(res, &mut probe, opts, &mut Vec::new())?;
                    }
                    let applied = apply::apply(res, old, &config, w, opts.force)?;
                    check_type_unchanged(res, old, &applied)?;
                    let mut new = merge_update(res, old, &applied, part);
                    match meta(&applied).and_then(|m| m.get("managedFields")) {
                        Some(f) => meta_mut(&mut new).insert("managedFields".into(), f.clone()),
                        None => meta_mut(&mut new).remove("managedFields"),
                    };
                    Ok(new)
                })
                .await;
            match applied {
                Err(e) if e.is_not_found() && part == Part::Main && precondition.is_none() => {
                    let created = apply::apply(res, &json!({}), &config, w, opts.force)?;
                    match self.create_tracked(res, ns, created, opts, Track::Applied).await {
                        // Created by someone else meanwhile: apply to theirs.
                        Err(ApiError::AlreadyExists { .. }) => continue,
                        r => return r.map(|w| (w, true)),
                    }
                }
                r => return r.map(|w| (w, false)),
            }
        }
    }

    /// The read-modify-write every update goes through: read, compute the new object, validate,
    /// write with the revision read as precondition; on a lost race, read again. `subresource`
    /// names where the write came through, for `managedFields` (`scale`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn mutate(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        precondition: Option<Revision>,
        subresource: &str,
        opts: &WriteOptions,
        f: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<KeyValue, ApiError> {
        self.mutate_checked(res, ns, name, precondition, true, opts, Track::Update(subresource), f).await.map(|w| w.kv)
    }

    /// `mutate`, optionally without the update rules (for `binding`, the one writer allowed to
    /// set a pod's `spec.nodeName`). Without a client precondition, a write that loses a race
    /// is retried with back-off until [`RETRY_DEADLINE`]; with one, it fails at once with 409.
    #[allow(clippy::too_many_arguments)]
    async fn mutate_checked(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        precondition: Option<Revision>,
        check_update: bool,
        opts: &WriteOptions,
        track: Track<'_>,
        f: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Written, ApiError> {
        let ns = Self::require_namespace(res, ns)?;
        let key = Self::key(res, ns, name);
        let mut retry = Retry::new();
        loop {
            let current = self.get(res, ns, name).await?;
            if precondition.is_some_and(|p| p != current.mod_revision) {
                return Err(store_err(res, name, StoreError::Conflict {
                    key: key.clone(),
                    expected: precondition.unwrap_or(0),
                    actual: current.mod_revision,
                }));
            }
            let old = codec::decode(&current)?;
            let mut new = f(&old)?;
            if !new.is_object() {
                return Err(ApiError::BadRequest("the object must be a JSON object".into()));
            }
            let mut warnings = Vec::new();
            let schema = Self::check_fields(res, &mut new, opts, &mut warnings)?;
            defaults::apply_defaults(res, &mut new);
            crate::crd::admit(res, Some(&old), &mut new)?;
            crate::authz::admit(res, Some(&old), &new)?;
            let node_ports =
                self.node_ports.assign(self.store.as_ref(), res, Some(&old), &mut new, !opts.dry_run).await?;
            if let Track::Update(subresource) = track {
                apply::record_update(res, Some(&old), &mut new, Writer { manager: opts.manager(), subresource });
            }
            if spec_changed(&old, &new) {
                let generation = meta(&old).and_then(|m| m.get("generation")).and_then(Value::as_i64).unwrap_or(1);
                meta_mut(&mut new).insert("generation".into(), json!(generation.saturating_add(1)));
            }
            // Compare without resourceVersion: an update that changes nothing writes nothing.
            if same_but_resource_version(&new, &old, &current.mod_revision.to_string()) {
                return Ok(Written { kv: current, warnings, object: None });
            }
            if check_update {
                validation::validate_update_as(res, &old, &new, schema)?;
            } else {
                validation::validate_as(res, &new, schema)?;
            }
            if opts.dry_run {
                return Ok(Written { kv: dry_run_kv(key, &new, current.mod_revision)?, warnings, object: None });
            }
            let started = Instant::now();
            let deleting = meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp")) && finalizers(&new) == 0;
            let graceful_pod = res.kind == "Pod" && is_graceful_pending(&new);
            let result = if deleting && !graceful_pod {
                // The last finalizer is gone from an object being deleted: it goes now.
                self.store.delete(&key, Some(current.mod_revision)).await
            } else {
                self.store.update(&key, codec::encode(&new)?, Some(current.mod_revision)).await
            };
            self.metrics.observe_store_write(started);
            match &result {
                Ok(_) => node_ports.written(self.store.as_ref()).await,
                Err(_) => node_ports.not_written(self.store.as_ref()).await,
            }
            match result {
                Ok(kv) => {
                    let gone = deleting && !graceful_pod;
                    crate::crd::written(self, res, &new, gone);
                    return Ok(Written { kv, warnings, object: (!gone).then_some(new) });
                }
                Err(StoreError::Conflict { .. }) if precondition.is_none() && retry.wait().await => continue,
                Err(StoreError::Conflict { .. }) if precondition.is_none() => {
                    return Err(ApiError::conflict(&res.qualified_plural(), name, &format!(
                        "still losing to concurrent writers after {}s; try again",
                        RETRY_DEADLINE.as_secs()
                    )));
                }
                Err(e) => return Err(store_err(res, name, e)),
            }
        }
    }

    pub async fn delete(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        if let Some(p) = opts.propagation_policy.as_deref()
            && !["Background", "Foreground", "Orphan"].contains(&p)
        {
            return Err(ApiError::BadRequest(format!(
                "propagationPolicy {p:?} is not supported: use Background, Foreground or Orphan"
            )));
        }
        if opts.grace_period_seconds.is_some_and(|g| g < 0) {
            return Err(ApiError::BadRequest("gracePeriodSeconds must be >= 0".into()));
        }
        let ns = Self::require_namespace(res, ns)?;
        let key = Self::key(res, ns, name);
        let mut retry = Retry::new();
        loop {
            let current = self.get(res, ns, name).await?;
            let obj = codec::decode(&current)?;
            if let Some(uid) = &opts.precondition_uid {
                let actual = meta_str(&obj, "uid").unwrap_or("");
                if uid != actual {
                    return Err(ApiError::conflict(&res.qualified_plural(), name, &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    )));
                }
            }
            if let Some(rv) = opts.precondition_resource_version
                && rv != current.mod_revision
            {
                return Err(ApiError::conflict(&res.qualified_plural(), name, &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    current.mod_revision
                )));
            }
            let grace = self.grace_period(res, &obj, opts);
            // Foreground and Orphan are carried out by the garbage collector, which removes
            // these finalizers when the dependents are gone or released.
            let mut new = obj.clone();
            let policy_finalizer = match opts.propagation_policy.as_deref() {
                Some("Foreground") => Some("foregroundDeletion"),
                Some("Orphan") => Some("orphan"),
                _ => None,
            };
            if let Some(f) = policy_finalizer {
                let list = meta_mut(&mut new).entry("finalizers").or_insert_with(|| json!([]));
                if let Some(a) = list.as_array_mut()
                    && !a.iter().any(|x| x == f)
                {
                    a.push(json!(f));
                }
            }
            let started = Instant::now();
            if meta(&obj).is_some_and(|m| m.contains_key("deletionTimestamp")) && (finalizers(&obj) > 0 || grace > 0) {
                if new == obj {
                    return Ok(Deleted::Pending(current));
                }
                if opts.dry_run {
                    return Ok(Deleted::Pending(dry_run_kv(key, &new, current.mod_revision)?));
                }
                // Already being deleted, and now asked for another propagation policy: its
                // finalizer joins the others, the deletion itself stays as it was.
                let result = self.store.update(&key, codec::encode(&new)?, Some(current.mod_revision)).await;
                self.metrics.observe_store_write(started);
                match result {
                    Ok(kv) => return Ok(Deleted::Pending(kv)),
                    Err(StoreError::Conflict { .. }) if retry.wait().await => continue,
                    Err(e) => return Err(store_err(res, name, e)),
                }
            }
            let result = if finalizers(&new) > 0 || grace > 0 {
                // Mark, and keep the object until its finalizers or its node agent let it go.
                let when = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
                let m = meta_mut(&mut new);
                m.insert("deletionTimestamp".into(), json!(when.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                if opts.dry_run {
                    return Ok(Deleted::Pending(dry_run_kv(key, &new, current.mod_revision)?));
                }
                let bytes = codec::encode(&new)?;
                self.store.update(&key, bytes, Some(current.mod_revision)).await.map(Deleted::Pending)
            } else {
                if opts.dry_run {
                    return Ok(Deleted::Gone(current));
                }
                self.store.delete(&key, Some(current.mod_revision)).await.map(Deleted::Gone)
            };
            self.metrics.observe_store_write(started);
            match result {
                Ok(Deleted::Gone(kv)) => {
                    if res.kind == "Namespace" {
                        self.delete_namespace_contents(name).await?;
                    }
                    crate::crd::written(self, res, &new, true);
                    return Ok(Deleted::Gone(kv));
                }
                Ok(d) => {
                    crate::crd::written(self, res, &codec::decode(d.kv())?, false);
                    return Ok(d);
                }
                Err(StoreError::Conflict { .. }) if retry.wait().await => continue,
                Err(e) => return Err(store_err(res, name, e)),
            }
        }
    }

    /// Pods on a node get a grace period for their agent to stop them; everything else goes at
    /// once (unless finalizers hold it).
    fn grace_period(&self, res: &ResourceInfo, obj: &Value, opts: &DeleteOptions) -> i64 {
        if res.kind != "Pod" {
            return 0;
        }
        let bound = obj.at("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
        let finished = matches!(obj.at("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"));
        if !bound || finished {
            return 0;
        }
        opts.grace_period_seconds
            .or_else(|| obj.at("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
            .unwrap_or(30)
            .max(0)
    }

    /// Removes everything left in a deleted namespace.
    async fn delete_namespace_contents(&self, ns: &str) -> Result<(), ApiError> {
        for res in kinds::all().into_iter().filter(|r| r.namespaced) {
            let page = self.store.list(&res.namespace_prefix(ns), None, None).await.map_err(|e| store_err(res, ns, e))?;
            for kv in page.items {
                match self.store.delete(&kv.key, None).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(store_err(res, &kv.key, e)),
                }
            }
        }
        Ok(())
    }

    /// `pods/{name}/binding`: assigns a pod to a node, once.
    pub async fn bind(&self, ns: &str, name: &str, node_name: &str) -> Result<KeyValue, ApiError> {
        if node_name.is_empty() {
            return Err(ApiError::invalid("Binding", name, vec![shepherd_api::Cause::required("target.name")]));
        }
        let res = &kinds::POD;
        let opts = WriteOptions::default();
        let written = self.mutate_checked(res, Some(ns), name, None, false, &opts, Track::Update("binding"), |old| {
            let current = old.at("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
            if !current.is_empty() {
                return Err(ApiError::conflict("pods/binding", name, &format!(
                    "pod {name} is already assigned to node \"{current}\""
                )));
            }
            if meta(old).is_some_and(|m| m.contains_key("deletionTimestamp")) {
                return Err(ApiError::conflict("pods/binding", name, "pod is being deleted"));
            }
            let mut new = old.clone();
            new["spec"]["nodeName"] = json!(node_name);
            set_condition(&mut new, "PodScheduled", "True", None, None);
            Ok(new)
        })
        .await?;
        Ok(written.kv)
    }
}

/// The answer Kubernetes gives for a list at a revision it no longer has.
fn exact_too_old() -> ApiError {
    ApiError::Expired("The resourceVersion for the provided list is too old.".into())
}

/// Kubernetes' words for a continue token whose revision has left the history.
fn continue_too_old() -> ApiError {
    ApiError::Expired(
        "The provided continue parameter is too old to display a consistent list result. You can start a new list \
         without the continue parameter."
            .into(),
    )
}

/// The object a dry run returns: as it would have been stored, at the revision it was read at
/// (a create has none yet, and is rendered without one).
fn dry_run_kv(key: String, obj: &Value, revision: Revision) -> Result<KeyValue, ApiError> {
    let value = if revision == 0 {
        let mut o = obj.clone();
        meta_mut(&mut o).remove("resourceVersion");
        bytes::Bytes::from(serde_json::to_vec(&o).map_err(|e| ApiError::Internal(format!("encoding object: {e}")))?)
    } else {
        codec::encode(obj)?
    };
    Ok(KeyValue { key, value, create_revision: revision, mod_revision: revision })
}

/// `metadata`, when present, must be a map: anything else would be replaced by an empty one,
/// silently losing what the client sent.
fn check_metadata_is_object(res: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    match obj.get("metadata") {
        None | Some(Value::Null | Value::Object(_)) => Ok(()),
        Some(other) => Err(ApiError::invalid(res.kind, "", vec![shepherd_api::Cause::invalid(
            "metadata",
            format!("Invalid value: {other}: must be an object"),
        )])),
    }
}

/// A patch may not change what an object is: `apiVersion` and `kind` are immutable.
fn check_type_unchanged(res: &ResourceInfo, old: &Value, new: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    for field in ["apiVersion", "kind"] {
        let (was, now) = (old.get(field), new.get(field));
        if was != now {
            let shown = now.map_or_else(|| "null".to_string(), Value::to_string);
            causes.push(shepherd_api::Cause::invalid(field, format!("Invalid value: {shown}: field is immutable")));
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(res.kind, meta_str(old, "name").unwrap_or(""), causes))
}

/// A patch may not rename an object or move it to another namespace: Kubernetes answers 400, as
/// for an update whose body names another object than its URL.
fn check_patched_identity(res: &ResourceInfo, ns: Option<&str>, name: &str, patched: &Value) -> Result<(), ApiError> {
    let patched_name = meta_str(patched, "name").unwrap_or("");
    if patched_name != name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({patched_name}) does not match the name on the URL ({name})"
        )));
    }
    if let (true, Some(ns), Some(b)) = (res.namespaced, ns, meta_str(patched, "namespace").filter(|b| !b.is_empty()))
        && b != ns
    {
        return Err(ApiError::BadRequest(format!(
            "the namespace of the provided object ({b}) does not match the namespace sent on the request ({ns})"
        )));
    }
    Ok(())
}

/// A `metadata.uid` in a write is a precondition, as in Kubernetes: it must be the stored object's,
/// so a write meant for an object that was deleted and re-created under its name is refused.
fn check_uid_precondition(res: &ResourceInfo, old: &Value, new: &Value) -> Result<(), ApiError> {
    match (meta_str(new, "uid"), meta_str(old, "uid")) {
        (Some(want), Some(actual)) if !want.is_empty() && want != actual => Err(ApiError::conflict(
            &res.qualified_plural(),
            meta_str(old, "name").unwrap_or(""),
            &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {actual}"),
        )),
        _ => Ok(()),
    }
}

/// Whether a pod marked for deletion is still waiting for its agent (grace period not zero).
fn is_graceful_pending(obj: &Value) -> bool {
    meta(obj).and_then(|m| m.get("deletionGracePeriodSeconds")).and_then(Value::as_i64).is_some_and(|g| g > 0)
}

/// Sets a condition in `status.conditions`, keeping `lastTransitionTime` when the status is unchanged.
pub(crate) fn set_condition(obj: &mut Value, type_: &str, status: &str, reason: Option<&str>, message: Option<&str>) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    let conditions = &mut obj["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else { return };
    let now = now_rfc3339();
    let mut cond = json!({"type": type_, "status": status, "lastTransitionTime": now, "lastProbeTime": null});
    if let Some(r) = reason {
        cond["reason"] = json!(r);
    }
    if let Some(m) = message {
        cond["message"] = json!(m);
    }
    match list.iter_mut().find(|c| c.get("type").and_then(Value::as_str) == Some(type_)) {
        Some(existing) => {
            if existing.get("status").and_then(Value::as_str) == Some(status) {
                cond["lastTransitionTime"] = existing.get("lastTransitionTime").cloned().unwrap_or(json!(now));
            }
            *existing = cond;
        }
        None => list.push(cond),
    }
}

/// What a create keeps of a client-sent status: kinds with a status subresource start from a
/// clean one, as in Kubernetes (a node agent's registration keeps its node's status).
fn reset_status_on_create(res: &ResourceInfo, obj: &mut Value) {
    let Some(o) = obj.as_object_mut() else { return };
    match res.kind {
        "Pod" => {
            o.insert("status".into(), json!({"phase": "Pending"}));
        }
        "Namespace" => {
            o.insert("status".into(), json!({"phase": "Active"}));
        }
        "Deployment" | "ReplicaSet" | "Service" | "PodDisruptionBudget" | "Job" | "CronJob" | "DaemonSet"
        | "StatefulSet" | "ReplicationController" => {
            o.remove("status");
        }
        _ => {}
    }
}

/// Whether `new` with `rv` for its resourceVersion would equal `old` (without copying `new`).
fn same_but_resource_version(new: &Value, old: &Value, rv: &str) -> bool {
    let (Some(n), Some(o)) = (new.as_object(), old.as_object()) else { return false };
    let same_meta = |nm: &serde_json::Map<String, Value>, om: &serde_json::Map<String, Value>| {
        om.get("resourceVersion").and_then(Value::as_str) == Some(rv)
            && nm.len() - usize::from(nm.contains_key("resourceVersion")) == om.len() - 1
            && nm.iter().all(|(k, v)| k == "resourceVersion" || om.get(k) == Some(v))
    };
    n.len() == o.len()
        && n.iter().all(|(k, nv)| match (o.get(k), nv.as_object()) {
            (Some(Value::Object(om)), Some(nm)) if k == "metadata" => same_meta(nm, om),
            (Some(ov), _) => nv == ov,
            (None, _) => false,
        })
}

/// Builds the object an update writes: the body for the part being replaced, the stored object
/// for everything the server owns.
fn merge_update(res: &ResourceInfo, old: &Value, body: &Value, part: Part) -> Value {
    let mut new = match part {
        Part::Main => body.clone(),
        Part::Status => {
            let mut n = old.clone();
            match body.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(o) = n.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            n
        }
    };
    if part == Part::Main && res.has_status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    let old_meta = meta(old);
    let m = meta_mut(&mut new);
    for owned in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation", "name", "namespace"] {
        match old_meta.and_then(|o| o.get(owned)) {
            Some(v) => {
                m.insert(owned.into(), v.clone());
            }
            None => {
                m.remove(owned);
            }
        }
    }
    m.remove("selfLink");
    // The scheduler's decision is made through `binding`, never undone by an update.
    if res.kind == "Pod"
        && let Some(node) = old.at("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty())
        && new.get("spec").is_some_and(Value::is_object)
    {
        new["spec"]["nodeName"] = json!(node);
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_garbage_is_a_bad_request() {
        let t = encode_continue(42, "/registry/core/pods/default/web-7");
        assert_eq!(decode_continue(&t).expect("decode"), (42, "/registry/core/pods/default/web-7".to_string()));
        assert!(matches!(decode_continue("zz"), Err(ApiError::BadRequest(_))));
        assert!(matches!(decode_continue("abc"), Err(ApiError::BadRequest(_))));
    }

    #[test]
    fn an_update_is_a_no_op_only_when_all_but_the_resource_version_is_the_same() {
        let old = json!({"kind": "Lease", "metadata": {"name": "n1", "resourceVersion": "7"}, "spec": {"renewTime": "a"}});
        let same = |new: Value| same_but_resource_version(&new, &old, "7");
        assert!(same(json!({"kind": "Lease", "metadata": {"name": "n1", "resourceVersion": "3"}, "spec": {"renewTime": "a"}})));
        assert!(same(json!({"kind": "Lease", "metadata": {"name": "n1"}, "spec": {"renewTime": "a"}})));
        assert!(!same(json!({"kind": "Lease", "metadata": {"name": "n1"}, "spec": {"renewTime": "b"}})), "a changed field");
        assert!(!same(json!({"kind": "Lease", "metadata": {"name": "n1", "labels": {}}, "spec": {"renewTime": "a"}})), "an added one");
        assert!(!same(json!({"kind": "Lease", "metadata": {"name": "n1"}})), "a removed one");
        assert!(!same(json!({"kind": "Lease", "metadata": {}, "spec": {"renewTime": "a"}})), "a removed metadata field");
        assert!(!same_but_resource_version(&old, &old, "8"), "the stored object is at another revision");
    }
}
