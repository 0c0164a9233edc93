//! OpenAPI documents of the served kinds (`/openapi/v2`, `/openapi/v3`), generated from the k8s-openapi types.
//!
//! kubectl reads them for client-side validation (and to learn that the server validates fields
//! itself: the `fieldValidation` parameter on a kind's PATCH operation), for `explain`, `edit`, and to
//! compute strategic merge patches (the `x-kubernetes-patch-*` extensions).
//!
//! The schemas are those of the upstream types, with two changes so that clients tell the truth about
//! Shepherd: fields Shepherd refuses (`shepherd_api::validation::unsupported_fields`) are pruned, so
//! that `explain` does not offer them (kubectl validates the items of a `List` itself, against v2: there
//! a pruned field is refused even when empty, which the server would accept); and definitions no served
//! kind reaches are dropped. The Kubernetes extensions that k8s-openapi does not carry (patch strategies
//! and merge keys, list types) come from [`FIELD_EXTENSIONS`]. Documents are built once, on first
//! request, and served with an ETag.

mod gnostic;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Event, Namespace, Node, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Status, WatchEvent};
use prost::Message;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};
use shepherd_api::ApiError;
use shepherd_api::kinds::{self, ResourceInfo};

use crate::discovery::GIT_VERSION;
use crate::http::error_response;

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const V2_REF: &str = "#/definitions/";
const V3_REF: &str = "#/components/schemas/";
/// Asked for in `Accept`; the answer is labelled `application/octet-stream`, as Kubernetes does,
/// because client-go parses the response's media type and Go's parser refuses the `@`.
const PROTOBUF_V2: &str = "application/com.github.proto-openapi.spec.v2";

/// The Rust type behind a served kind.
struct KindType {
    api_version: &'static str,
    kind: &'static str,
    /// Its definition's name, `io.k8s.api.core.v1.Pod`.
    definition: fn() -> std::borrow::Cow<'static, str>,
    schema: fn(&mut SchemaGenerator) -> Schema,
}

const fn typed<K: k8s_openapi::Resource + JsonSchema>() -> KindType {
    KindType {
        api_version: K::API_VERSION,
        kind: K::KIND,
        definition: <K as JsonSchema>::schema_name,
        schema: SchemaGenerator::subschema_for::<K>,
    }
}

/// The type of every kind in `kinds::ALL`: a kind added there needs its line here, and nothing else.
const KIND_TYPES: &[KindType] = &[
    typed::<Namespace>(),
    typed::<Node>(),
    typed::<Pod>(),
    typed::<Service>(),
    typed::<Endpoints>(),
    typed::<Event>(),
    typed::<Deployment>(),
    typed::<ReplicaSet>(),
    typed::<Lease>(),
    typed::<EndpointSlice>(),
    typed::<PodDisruptionBudget>(),
    typed::<ConfigMap>(),
    typed::<Secret>(),
    typed::<ServiceAccount>(),
    typed::<CustomResourceDefinition>(),
    typed::<Job>(),
    typed::<CronJob>(),
    typed::<DaemonSet>(),
    typed::<StatefulSet>(),
    typed::<ControllerRevision>(),
    typed::<k8s_openapi::api::core::v1::ReplicationController>(),
    typed::<k8s_openapi::api::rbac::v1::Role>(),
    typed::<k8s_openapi::api::rbac::v1::ClusterRole>(),
    typed::<k8s_openapi::api::rbac::v1::RoleBinding>(),
    typed::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(),
    typed::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(),
    typed::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(),
    typed::<k8s_openapi::api::authorization::v1::SelfSubjectRulesReview>(),
    typed::<k8s_openapi::api::authorization::v1::LocalSubjectAccessReview>(),
    typed::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(),
    typed::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>(),
];

/// Extensions Kubernetes puts on a field: how strategic merge patch and server-side apply treat it.
struct FieldExtensions {
    definition: &'static str,
    field: &'static str,
    patch_strategy: Option<&'static str>,
    patch_merge_key: Option<&'static str>,
    list_type: Option<&'static str>,
    list_map_keys: &'static [&'static str],
}

const fn map_list(definition: &'static str, field: &'static str, keys: &'static [&'static str]) -> FieldExtensions {
    FieldExtensions {
        definition,
        field,
        patch_strategy: Some("merge"),
        patch_merge_key: Some(keys[0]),
        list_type: Some("map"),
        list_map_keys: keys,
    }
}

const fn atomic_list(definition: &'static str, field: &'static str) -> FieldExtensions {
    FieldExtensions {
        definition,
        field,
        patch_strategy: None,
        patch_merge_key: None,
        list_type: Some("atomic"),
        list_map_keys: &[],
    }
}

/// The `x-kubernetes-patch-*` and `x-kubernetes-list-*` facts of the fields Shepherd serves, as the
/// Kubernetes API types declare them (k8s-openapi's schemas do not carry them).
const FIELD_EXTENSIONS: &[FieldExtensions] = &[
    FieldExtensions {
        definition: "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        field: "finalizers",
        patch_strategy: Some("merge"),
        patch_merge_key: None,
        list_type: Some("set"),
        list_map_keys: &[],
    },
    map_list("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "ownerReferences", &["uid"]),
    atomic_list("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector", "matchExpressions"),
    atomic_list("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement", "values"),
    map_list("io.k8s.api.core.v1.PodSpec", "containers", &["name"]),
    map_list("io.k8s.api.core.v1.PodSpec", "imagePullSecrets", &["name"]),
    atomic_list("io.k8s.api.core.v1.PodSpec", "tolerations"),
    atomic_list("io.k8s.api.core.v1.Container", "args"),
    atomic_list("io.k8s.api.core.v1.Container", "command"),
    map_list("io.k8s.api.core.v1.Container", "ports", &["containerPort", "protocol"]),
    map_list("io.k8s.api.core.v1.Container", "env", &["name"]),
    map_list("io.k8s.api.core.v1.PodStatus", "conditions", &["type"]),
    map_list("io.k8s.api.core.v1.PodStatus", "podIPs", &["ip"]),
    map_list("io.k8s.api.core.v1.PodStatus", "hostIPs", &["ip"]),
    atomic_list("io.k8s.api.core.v1.PodStatus", "containerStatuses"),
    map_list("io.k8s.api.core.v1.ServiceSpec", "ports", &["port", "protocol"]),
    atomic_list("io.k8s.api.core.v1.ServiceSpec", "clusterIPs"),
    atomic_list("io.k8s.api.core.v1.ServiceSpec", "ipFamilies"),
    map_list("io.k8s.api.core.v1.ServiceStatus", "conditions", &["type"]),
    atomic_list("io.k8s.api.core.v1.LoadBalancerStatus", "ingress"),
    atomic_list("io.k8s.api.core.v1.Endpoints", "subsets"),
    atomic_list("io.k8s.api.core.v1.EndpointSubset", "addresses"),
    atomic_list("io.k8s.api.core.v1.EndpointSubset", "notReadyAddresses"),
    atomic_list("io.k8s.api.core.v1.EndpointSubset", "ports"),
    FieldExtensions {
        definition: "io.k8s.api.core.v1.NodeSpec",
        field: "podCIDRs",
        patch_strategy: Some("merge"),
        patch_merge_key: None,
        list_type: Some("set"),
        list_map_keys: &[],
    },
    atomic_list("io.k8s.api.core.v1.NodeSpec", "taints"),
    map_list("io.k8s.api.core.v1.NodeStatus", "conditions", &["type"]),
    map_list("io.k8s.api.core.v1.NodeStatus", "addresses", &["type"]),
    map_list("io.k8s.api.core.v1.NamespaceStatus", "conditions", &["type"]),
    FieldExtensions {
        definition: "io.k8s.api.apps.v1.DeploymentSpec",
        field: "strategy",
        patch_strategy: Some("retainKeys"),
        patch_merge_key: None,
        list_type: None,
        list_map_keys: &[],
    },
    map_list("io.k8s.api.apps.v1.DeploymentStatus", "conditions", &["type"]),
    map_list("io.k8s.api.apps.v1.ReplicaSetStatus", "conditions", &["type"]),
];

/// One group-version's OpenAPI v3 document, with the hash clients use to cache it.
struct V3Document {
    json: Vec<u8>,
    hash: String,
}

/// Every document, serialised once.
struct Documents {
    v2_json: Vec<u8>,
    v2_json_etag: String,
    v2_protobuf: Vec<u8>,
    v2_protobuf_etag: String,
    v3_index: Vec<u8>,
    /// By path below `/openapi/v3/`: `api/v1`, `apis/apps/v1`.
    v3: BTreeMap<String, V3Document>,
}

/// Bumped whenever the served custom resources change; documents built at an older generation
/// are rebuilt (and get new ETags and hashes) on the next request.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The documents last built, with the generation they describe.
static DOCUMENTS: RwLock<Option<(u64, Arc<Documents>)>> = RwLock::new(None);

/// The documents, built on first use off the async workers (generation takes a moment).
async fn documents() -> Arc<Documents> {
    let generation = GENERATION.load(Ordering::Acquire);
    if let Some((g, d)) = DOCUMENTS.read().unwrap_or_else(|e| e.into_inner()).as_ref()
        && *g == generation
    {
        return d.clone();
    }
    let docs = match tokio::task::spawn_blocking(build).await {
        Ok(d) => Arc::new(d),
        Err(_) => Arc::new(build()),
    };
    let mut cached = DOCUMENTS.write().unwrap_or_else(|e| e.into_inner());
    if cached.as_ref().is_none_or(|(g, _)| *g <= generation) {
        *cached = Some((generation, docs.clone()));
    }
    docs
}

/// Forgets the documents after the served custom resources changed.
pub(crate) fn invalidate() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Whether a resource has a schema to describe: a built-in kind, or a custom one whose
/// definition gives its version one.
fn described(res: &ResourceInfo) -> bool {
    kind_type(res).is_some() || kinds::custom(res).is_some_and(|c| c.schema.is_some())
}

/// The definitions with Kubernetes' extensions, built once: the documents and server-side apply's
/// merge rules (`crate::apply`) read the same facts.
pub(crate) fn annotated_definitions() -> &'static Map<String, Value> {
    static DEFINITIONS: OnceLock<Map<String, Value>> = OnceLock::new();
    DEFINITIONS.get_or_init(definitions)
}

/// The definition name of a served kind, if it has one.
pub(crate) fn definition_of(res: &ResourceInfo) -> Option<String> {
    kind_type(res).map(|t| (t.definition)().into_owned())
}

fn build() -> Documents {
    let mut definitions = annotated_definitions().clone();
    let served = kinds::all();
    for res in served.iter().filter(|r| kind_type(r).is_none()) {
        add_custom_definitions(res, &mut definitions);
    }
    let paths: Vec<PathEntry> = served.iter().filter(|r| described(r)).flat_map(|r| paths_of(r)).collect();

    let v2 = v2_document(&paths, &definitions);
    let v2_json = serde_json::to_vec(&v2).unwrap_or_default();
    let v2_protobuf = gnostic::document(&v2, &mut Vec::new()).encode_to_vec();

    let mut v3 = BTreeMap::new();
    for gv_path in group_version_paths() {
        let doc = v3_document(&gv_path, &paths, &definitions);
        let json = serde_json::to_vec(&doc).unwrap_or_default();
        let hash = content_hash(&json);
        v3.insert(gv_path, V3Document { json, hash });
    }
    let index: Map<String, Value> = v3
        .iter()
        .map(|(p, d)| (p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", d.hash)})))
        .collect();
    Documents {
        v2_json_etag: format!("\"{}\"", content_hash(&v2_json)),
        v2_json,
        v2_protobuf_etag: format!("\"{}\"", content_hash(&v2_protobuf)),
        v2_protobuf,
        v3_index: serde_json::to_vec(&json!({"paths": index})).unwrap_or_default(),
        v3,
    }
}

/// FNV-1a, 64 bits, in hex: stable across builds and platforms, which a cache key must be.
fn content_hash(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("{h:016X}")
}

fn kind_type(res: &ResourceInfo) -> Option<&'static KindType> {
    KIND_TYPES.iter().find(|t| t.kind == res.kind && t.api_version == res.api_version())
}

/// `/api/v1`, `/apis/apps/v1`.
fn group_version_prefix(res: &ResourceInfo) -> String {
    if res.group.is_empty() { format!("/api/{}", res.version) } else { format!("/apis/{}/{}", res.group, res.version) }
}

fn group_version_paths() -> BTreeSet<String> {
    kinds::all().into_iter().filter(|r| described(r)).map(|r| group_version_prefix(r)[1..].to_string()).collect()
}

/// The definition name Kubernetes gives a kind: `io.k8s.api.core.v1.Pod`, `io.k8s.api.apps.v1.Deployment`;
/// for a custom kind, its group reversed: `com.example.v1.Widget`.
fn definition_name(res: &ResourceInfo) -> String {
    match kind_type(res) {
        Some(t) => (t.definition)().into_owned(),
        None => {
            let group: Vec<&str> = res.group.split('.').rev().collect();
            format!("{}.{}.{}", group.join("."), res.version, res.kind)
        }
    }
}

/// A custom kind's definitions: its schema with the fields every object has, and its list.
fn add_custom_definitions(res: &ResourceInfo, defs: &mut Map<String, Value>) {
    let Some(schema) = kinds::custom(res).and_then(|c| c.schema.clone()) else { return };
    let name = definition_name(res);
    let mut d = match schema {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let props = d.entry("properties").or_insert_with(|| json!({}));
    if let Some(p) = props.as_object_mut() {
        p.insert("apiVersion".into(), json!({"description": "APIVersion defines the versioned schema of this \
            representation of an object.", "type": "string"}));
        p.insert("kind".into(), json!({"description": "Kind is a string value representing the REST resource this \
            object represents.", "type": "string"}));
        p.insert("metadata".into(), json!({"description": "Standard object's metadata.",
            "$ref": format!("{V2_REF}{META}.ObjectMeta")}));
    }
    d.insert("type".into(), json!("object"));
    d.insert("x-kubernetes-group-version-kind".into(), json!([gvk(res.group, res.version, res.kind)]));
    defs.insert(name.clone(), Value::Object(d));
    defs.insert(format!("{name}List"), list_schema(res, &name));
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "kind": kind, "version": version})
}

// ---------------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------------

/// Every definition the paths need, in the v2 form (`#/definitions/` references).
fn definitions() -> Map<String, Value> {
    let mut settings = SchemaSettings::draft07();
    // References keep their sibling descriptions (what `explain` prints); v3 wraps them itself.
    settings.transforms.clear();
    settings.meta_schema = None;
    let mut generator = settings.into_generator();
    let mut roots = Vec::new();
    for res in kinds::ALL {
        let Some(ty) = kind_type(res) else { continue };
        (ty.schema)(&mut generator);
        roots.push(definition_name(res));
        roots.push(format!("{}List", definition_name(res)));
    }
    generator.subschema_for::<Scale>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<WatchEvent<Pod>>();
    generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta>();
    roots.extend(["io.k8s.api.autoscaling.v1.Scale".to_string(), format!("{META}.Status"),
        format!("{META}.DeleteOptions"), format!("{META}.WatchEvent"), format!("{META}.Patch")]);
    let mut defs = generator.take_definitions(false);

    roots.push(format!("{META}.ObjectMeta"));
    for res in kinds::ALL.iter().filter(|r| kind_type(r).is_some()) {
        let name = definition_name(res);
        if let Some(Value::Object(d)) = defs.get_mut(&name) {
            d.insert("x-kubernetes-group-version-kind".into(), json!([gvk(res.group, res.version, res.kind)]));
        }
        defs.insert(format!("{name}List"), list_schema(res, &name));
    }
    if let Some(Value::Object(d)) = defs.get_mut("io.k8s.api.autoscaling.v1.Scale") {
        d.insert("x-kubernetes-group-version-kind".into(), json!([gvk("autoscaling", "v1", "Scale")]));
    }
    if let Some(Value::Object(d)) = defs.get_mut(&format!("{META}.Status")) {
        d.insert("x-kubernetes-group-version-kind".into(), json!([gvk("", "v1", "Status")]));
    }
    defs.insert(
        format!("{META}.Patch"),
        json!({"description": "A patch: a JSON patch, a JSON merge patch or a strategic merge patch, as the \
            request's Content-Type says.", "type": "object"}),
    );
    // A schema or a list of schemas, a schema or a bool...: described without the `oneOf`, as
    // Kubernetes publishes them (neither OpenAPI v2 nor its protobuf form has `oneOf`).
    for (name, d) in defs.iter_mut().filter(|(n, _)| n.starts_with("io.k8s.apiextensions-apiserver.") && n.contains("JSONSchemaPropsOr")) {
        *d = json!({"description": format!("{}: a value of more than one form; see the Kubernetes API reference.",
            name.rsplit('.').next().unwrap_or(name))});
    }
    for (definition, field) in shepherd_api::validation::unsupported_fields() {
        prune(&mut defs, definition, field);
    }
    for ext in FIELD_EXTENSIONS {
        annotate(&mut defs, ext);
    }
    if let Some(Value::Object(d)) = defs.get_mut(&format!("{META}.LabelSelector")) {
        d.insert("x-kubernetes-map-type".into(), json!("atomic"));
    }
    keep_reachable(&mut defs, &roots);
    defs
}

fn list_schema(res: &ResourceInfo, item: &str) -> Value {
    json!({
        "description": format!("{}List is a list of {} objects.", res.kind, res.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": "The versioned schema of this representation of an object.",
                "type": "string"},
            "items": {"description": format!("The {} objects.", res.kind), "type": "array",
                "items": {"$ref": format!("{V2_REF}{item}")}},
            "kind": {"description": "The REST resource this object represents.", "type": "string"},
            "metadata": {"description": "Standard list metadata.", "$ref": format!("{V2_REF}{META}.ListMeta")},
        },
        "x-kubernetes-group-version-kind": [gvk(res.group, res.version, &res.list_kind())],
    })
}

/// The definition a property refers to, if it is a reference.
fn referenced(prop: &Value) -> Option<String> {
    prop.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(V2_REF)).map(String::from)
}

/// Removes `definition.a.b.c`, following references from `a` to `b`.
fn prune(defs: &mut Map<String, Value>, definition: &str, dotted: &str) {
    let mut def = definition.to_string();
    let mut parts: Vec<&str> = dotted.split('.').collect();
    let Some(last) = parts.pop() else { return };
    for part in parts {
        let Some(next) = defs.get(&def).and_then(|d| d.get("properties")).and_then(|p| p.get(part)).and_then(referenced)
        else {
            return;
        };
        def = next;
    }
    if let Some(Value::Object(d)) = defs.get_mut(&def) {
        if let Some(Value::Object(props)) = d.get_mut("properties") {
            props.remove(last);
        }
        if let Some(Value::Array(required)) = d.get_mut("required") {
            required.retain(|r| r.as_str() != Some(last));
        }
    }
}

fn annotate(defs: &mut Map<String, Value>, ext: &FieldExtensions) {
    let Some(Value::Object(prop)) =
        defs.get_mut(ext.definition).and_then(|d| d.get_mut("properties")).and_then(|p| p.get_mut(ext.field))
    else {
        return;
    };
    if let Some(s) = ext.patch_strategy {
        prop.insert("x-kubernetes-patch-strategy".into(), json!(s));
    }
    if let Some(k) = ext.patch_merge_key {
        prop.insert("x-kubernetes-patch-merge-key".into(), json!(k));
    }
    if let Some(t) = ext.list_type {
        prop.insert("x-kubernetes-list-type".into(), json!(t));
    }
    if !ext.list_map_keys.is_empty() {
        prop.insert("x-kubernetes-list-map-keys".into(), json!(ext.list_map_keys));
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = referenced(v) {
                out.push(r);
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The names of `roots` and of every definition they reach.
fn reachable(defs: &Map<String, Value>, roots: &[String]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.to_vec();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        if let Some(d) = defs.get(&name) {
            collect_refs(d, &mut todo);
        }
    }
    seen
}

fn keep_reachable(defs: &mut Map<String, Value>, roots: &[String]) {
    let keep = reachable(defs, roots);
    defs.retain(|name, _| keep.contains(name));
}

// ---------------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------------

/// A query parameter: name, type, description.
type QueryParam = (&'static str, &'static str, &'static str);

const PRETTY: QueryParam = ("pretty", "string", "If 'true', the output is indented.");
const DRY_RUN: QueryParam = ("dryRun", "string", "When present, the request is validated and admitted but \
     nothing is stored; the answer is the object as it would be. The only valid value is All.");
const FIELD_MANAGER: QueryParam = ("fieldManager", "string", "Name of the actor making the change.");
const FIELD_VALIDATION: QueryParam = ("fieldValidation", "string", "What to do with fields the schema does not \
     know and with duplicated fields: Ignore drops them silently, Warn drops them and answers with a warning for \
     each, Strict refuses the request and names them.");
const LIST_PARAMS: &[QueryParam] = &[
    ("allowWatchBookmarks", "boolean", "Ask a watch for BOOKMARK events, which carry only a resourceVersion."),
    ("continue", "string", "The continue token of the previous page of a paged list."),
    ("fieldSelector", "string", "Only objects whose fields match, such as metadata.name=web."),
    ("labelSelector", "string", "Only objects whose labels match, such as app=web,tier!=db."),
    ("limit", "integer", "At most this many objects; the answer carries a continue token for the rest."),
    ("resourceVersion", "string", "For a watch, the version to start after; for a list, the oldest version \
     acceptable."),
    ("timeoutSeconds", "integer", "End a list or watch call after this many seconds."),
    ("watch", "boolean", "Stream the changes to the listed objects instead of listing them."),
];
const WRITE_PARAMS: &[QueryParam] = &[DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION];
const DELETE_PARAMS: &[QueryParam] = &[
    DRY_RUN,
    ("gracePeriodSeconds", "integer", "Seconds the object has to end gracefully; 0 deletes at once."),
    ("propagationPolicy", "string", "What happens to dependents: Orphan, Background or Foreground."),
];

const PATCH_TYPES: &[&str] =
    &["application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json",
        "application/apply-patch+yaml"];
/// Custom resources take no strategic merge patch; kubectl reads this list to choose its patch type.
const CUSTOM_PATCH_TYPES: &[&str] =
    &["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"];

struct Operation {
    method: &'static str,
    action: &'static str,
    id: String,
    description: String,
    gvk: Value,
    query: Vec<QueryParam>,
    /// The definition of the request body, if the operation takes one.
    body: Option<String>,
    /// The definition of a successful answer.
    response: String,
    consumes: &'static [&'static str],
}

struct PathEntry {
    path: String,
    group_version: String,
    tag: String,
    /// Path parameters: name and description.
    params: Vec<(&'static str, String)>,
    ops: Vec<Operation>,
}

/// The operations of one resource, in Kubernetes' naming (`readCoreV1NamespacedPod`).
fn paths_of(res: &ResourceInfo) -> Vec<PathEntry> {
    let prefix = group_version_prefix(res);
    let group_version = prefix[1..].to_string();
    let group_word = if res.group.is_empty() { "core" } else { res.group.split('.').next().unwrap_or(res.group) };
    let tag = format!("{group_word}_{}", res.version);
    let id_part = format!("{}{}", capitalise(group_word), capitalise(res.version));
    let scope = if res.namespaced { "Namespaced" } else { "" };
    let def = definition_name(res);
    let list_def = format!("{def}List");
    let kind = res.kind;
    let kind_gvk = gvk(res.group, res.version, kind);
    let collection = if res.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", res.plural)
    } else {
        format!("{prefix}/{}", res.plural)
    };
    let namespace_param = || res.namespaced.then(|| ("namespace", "the namespace of the object".to_string()));
    let name_param = |what: &str| ("name", format!("name of the {what}"));
    let entry = |path: String, params: Vec<(&'static str, String)>, ops: Vec<Operation>| PathEntry {
        path,
        group_version: group_version.clone(),
        tag: tag.clone(),
        params,
        ops,
    };
    let op = |method, action, verb: &str, suffix: &str, description: String, query: Vec<QueryParam>,
              body: Option<String>, response: String, gvk: Value, consumes| Operation {
        method,
        action,
        id: format!("{verb}{id_part}{scope}{kind}{suffix}"),
        description,
        gvk,
        query,
        body,
        response,
        consumes,
    };
    let json_only: &'static [&'static str] = &[];
    let patch_types = if kind_type(res).is_some() { PATCH_TYPES } else { CUSTOM_PATCH_TYPES };

    let mut collection_ops = vec![
        op("get", "list", "list", "", format!("list or watch objects of kind {kind}"), LIST_PARAMS.to_vec(), None,
            list_def.clone(), kind_gvk.clone(), json_only),
        op("post", "post", "create", "", format!("create a {kind}"), WRITE_PARAMS.to_vec(), Some(def.clone()),
            def.clone(), kind_gvk.clone(), json_only),
    ];
    // As discovery says: every kind but Namespace can be deleted by collection.
    if res.kind != "Namespace" {
        let mut query: Vec<QueryParam> =
            LIST_PARAMS.iter().filter(|p| !matches!(p.0, "watch" | "allowWatchBookmarks")).copied().collect();
        query.extend(DELETE_PARAMS);
        collection_ops.push(Operation {
            id: format!("delete{id_part}Collection{scope}{kind}"),
            ..op("delete", "deletecollection", "delete", "", format!("delete a collection of {kind} objects"), query,
                Some(format!("{META}.DeleteOptions")), format!("{META}.Status"), kind_gvk.clone(), json_only)
        });
    }
    let mut out = vec![entry(collection.clone(), namespace_param().into_iter().collect(), collection_ops)];
    let item = format!("{collection}/{{name}}");
    let item_params = |what: &str| {
        let mut p = vec![name_param(what)];
        p.extend(namespace_param());
        p
    };
    out.push(entry(
        item.clone(),
        item_params(kind),
        vec![
            op("get", "get", "read", "", format!("read the specified {kind}"), vec![], None, def.clone(),
                kind_gvk.clone(), json_only),
            op("put", "put", "replace", "", format!("replace the specified {kind}"), WRITE_PARAMS.to_vec(),
                Some(def.clone()), def.clone(), kind_gvk.clone(), json_only),
            op("patch", "patch", "patch", "", format!("partially update the specified {kind}"), WRITE_PARAMS.to_vec(),
                Some(format!("{META}.Patch")), def.clone(), kind_gvk.clone(), patch_types),
            op("delete", "delete", "delete", "", format!("delete a {kind}"), DELETE_PARAMS.to_vec(),
                Some(format!("{META}.DeleteOptions")), def.clone(), kind_gvk.clone(), json_only),
        ],
    ));
    let mut subresource = |name: &str, suffix: &str, what: String, target: String, target_gvk: Value| {
        out.push(entry(
            format!("{item}/{name}"),
            item_params(kind),
            vec![
                op("get", "get", "read", suffix, format!("read {what} of the specified {kind}"), vec![], None,
                    target.clone(), target_gvk.clone(), json_only),
                op("put", "put", "replace", suffix, format!("replace {what} of the specified {kind}"),
                    WRITE_PARAMS.to_vec(), Some(target.clone()), target.clone(), target_gvk.clone(), json_only),
                op("patch", "patch", "patch", suffix, format!("partially update {what} of the specified {kind}"),
                    WRITE_PARAMS.to_vec(), Some(format!("{META}.Patch")), target.clone(), target_gvk, patch_types),
            ],
        ));
    };
    if res.has_status {
        subresource("status", "Status", "status".into(), def.clone(), kind_gvk.clone());
    }
    if res.has_scale {
        subresource("scale", "Scale", "scale".into(), "io.k8s.api.autoscaling.v1.Scale".into(),
            gvk("autoscaling", "v1", "Scale"));
    }
    if res.namespaced {
        out.push(entry(
            format!("{prefix}/{}", res.plural),
            vec![],
            vec![Operation {
                id: format!("list{id_part}{kind}ForAllNamespaces"),
                ..op("get", "list", "list", "", format!("list or watch objects of kind {kind} in every namespace"),
                    LIST_PARAMS.to_vec(), None, list_def, kind_gvk, json_only)
            }],
        ));
    }
    out
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

fn v2_document(paths: &[PathEntry], defs: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    for p in paths {
        let mut item = Map::new();
        let mut params: Vec<Value> = p
            .params
            .iter()
            .map(|(name, d)| json!({"name": name, "in": "path", "required": true, "type": "string",
                "uniqueItems": true, "description": d}))
            .collect();
        params.push(v2_query(&PRETTY));
        item.insert("parameters".into(), Value::Array(params));
        for op in &p.ops {
            let mut params: Vec<Value> = Vec::new();
            if let Some(body) = &op.body {
                params.push(json!({"name": "body", "in": "body", "required": op.method != "delete",
                    "schema": {"$ref": format!("{V2_REF}{body}")}}));
            }
            params.extend(op.query.iter().map(v2_query));
            let consumes: Vec<&str> = if op.consumes.is_empty() { vec!["*/*"] } else { op.consumes.to_vec() };
            let mut o = json!({
                "description": op.description,
                "operationId": op.id,
                "tags": [p.tag],
                "schemes": ["https"],
                "consumes": consumes,
                "produces": ["application/json", "application/yaml"],
                "parameters": params,
                "responses": {
                    "200": {"description": "OK", "schema": {"$ref": format!("{V2_REF}{}", op.response)}},
                    "401": {"description": "Unauthorized"},
                },
                "x-kubernetes-action": op.action,
                "x-kubernetes-group-version-kind": op.gvk,
            });
            if op.method == "post" {
                o["responses"]["201"] = json!({"description": "Created",
                    "schema": {"$ref": format!("{V2_REF}{}", op.response)}});
            }
            item.insert(op.method.into(), o);
        }
        out.insert(p.path.clone(), Value::Object(item));
    }
    let mut defs = defs.clone();
    for (name, d) in defs.iter_mut() {
        v2_quirks(name, d);
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": out,
        "definitions": defs,
    })
}

fn v2_query(p: &QueryParam) -> Value {
    json!({"name": p.0, "in": "query", "type": p.1, "uniqueItems": true, "description": p.2})
}

/// OpenAPI v2 has no int-or-string; Kubernetes writes these two as strings there. Custom kinds'
/// schemas lose, in v2, what v2 cannot say (as Kubernetes publishes them).
fn v2_quirks(name: &str, d: &mut Value) {
    if !name.starts_with("io.k8s.") {
        strip_for_v2(d);
    }
    let Some(m) = d.as_object_mut() else { return };
    if m.remove("x-kubernetes-int-or-string").is_some() {
        m.insert("type".into(), json!("string"));
        if name.ends_with("IntOrString") {
            m.insert("format".into(), json!("int-or-string"));
        }
    }
}

fn strip_for_v2(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for k in ["nullable", "oneOf", "anyOf", "allOf", "not", "x-kubernetes-int-or-string"] {
                m.remove(k);
            }
            m.values_mut().for_each(strip_for_v2);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_for_v2),
        _ => {}
    }
}

fn v3_document(gv_path: &str, paths: &[PathEntry], defs: &Map<String, Value>) -> Value {
    let mut out = Map::new();
    let mut roots = Vec::new();
    for p in paths.iter().filter(|p| p.group_version == gv_path) {
        let mut item = Map::new();
        let mut params: Vec<Value> = p
            .params
            .iter()
            .map(|(name, d)| json!({"name": name, "in": "path", "required": true, "description": d,
                "schema": {"type": "string", "uniqueItems": true}}))
            .collect();
        params.push(v3_query(&PRETTY));
        item.insert("parameters".into(), Value::Array(params));
        for op in &p.ops {
            roots.push(op.response.clone());
            let answer = json!({"schema": {"$ref": format!("{V3_REF}{}", op.response)}});
            let mut o = json!({
                "description": op.description,
                "operationId": op.id,
                "tags": [p.tag],
                "parameters": op.query.iter().map(v3_query).collect::<Vec<_>>(),
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": answer, "application/yaml": answer}},
                    "401": {"description": "Unauthorized"},
                },
                "x-kubernetes-action": op.action,
                "x-kubernetes-group-version-kind": op.gvk,
            });
            if let Some(body) = &op.body {
                roots.push(body.clone());
                let schema = json!({"schema": {"$ref": format!("{V3_REF}{body}")}});
                let content: Map<String, Value> = if op.consumes.is_empty() {
                    [("*/*".to_string(), schema)].into_iter().collect()
                } else {
                    op.consumes.iter().map(|c| (c.to_string(), schema.clone())).collect()
                };
                o["requestBody"] = json!({"content": content, "required": op.method != "delete"});
            }
            if op.method == "post" {
                o["responses"]["201"] =
                    json!({"description": "Created", "content": {"application/json": answer}});
            }
            item.insert(op.method.into(), o);
        }
        out.insert(p.path.clone(), Value::Object(item));
    }
    roots.push(format!("{META}.Status"));
    let keep = reachable(defs, &roots);
    let schemas: Map<String, Value> =
        defs.iter().filter(|(n, _)| keep.contains(*n)).map(|(n, d)| (n.clone(), v3_schema(d))).collect();
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": out,
        "components": {"schemas": schemas},
    })
}

fn v3_query(p: &QueryParam) -> Value {
    json!({"name": p.0, "in": "query", "description": p.2, "schema": {"type": p.1, "uniqueItems": true}})
}

/// A v2 schema in v3 form: references point into `components`, and a reference with siblings (a
/// description) becomes `allOf: [reference]` beside them, since v3 ignores a reference's siblings.
fn v3_schema(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out: Map<String, Value> = m.iter().map(|(k, v)| (k.clone(), v3_schema(v))).collect();
            if let Some(Value::String(r)) = out.remove("$ref") {
                let r = Value::String(r.replacen(V2_REF, V3_REF, 1));
                if out.is_empty() {
                    out.insert("$ref".into(), r);
                } else {
                    out.insert("allOf".into(), json!([{"$ref": r}]));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(v3_schema).collect()),
        other => other.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

fn document_response(body: &[u8], content_type: &'static str, etag: &str, headers: &HeaderMap) -> Response {
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut r =
        if matches { StatusCode::NOT_MODIFIED.into_response() } else { Response::new(Body::from(body.to_vec())) };
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

/// `GET /openapi/v2`: gnostic protobuf when asked for, JSON otherwise.
pub(crate) async fn v2(headers: HeaderMap) -> Response {
    let docs = documents().await;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains(PROTOBUF_V2) {
        document_response(&docs.v2_protobuf, "application/octet-stream", &docs.v2_protobuf_etag, &headers)
    } else {
        document_response(&docs.v2_json, "application/json", &docs.v2_json_etag, &headers)
    }
}

/// `GET /openapi/v3`: where each group-version's document is.
pub(crate) async fn v3_index() -> Response {
    let docs = documents().await;
    let mut r = Response::new(Body::from(docs.v3_index.clone()));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `GET /openapi/v3/{api/v1 | apis/GROUP/VERSION}`: JSON only; a client that accepts nothing else
/// (protobuf alone) gets 406. With the current `hash`, the answer may be cached for good.
pub(crate) async fn v3_group_version(
    Path(gv): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let docs = documents().await;
    let Some(doc) = docs.v3.get(gv.trim_end_matches('/')) else {
        return error_response(&ApiError::NotFound {
            kind: String::new(),
            name: String::new(),
            message: format!("no OpenAPI v3 document for {gv}: the served ones are listed at /openapi/v3"),
        });
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let accepts_json = accept.is_empty()
        || accept.split(',').any(|a| {
            let t = a.split(';').next().unwrap_or("").trim();
            matches!(t, "application/json" | "application/*" | "*/*")
        });
    if !accepts_json {
        return error_response(&ApiError::NotAcceptable(format!(
            "the OpenAPI v3 documents are served as application/json, not {accept}"
        )));
    }
    match query.get("hash") {
        Some(h) if *h != doc.hash => {
            let mut r = StatusCode::MOVED_PERMANENTLY.into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("/openapi/v3/{gv}?hash={}", doc.hash)) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        hash => {
            let mut r = document_response(&doc.json, "application/json", &format!("\"{}\"", doc.hash), &headers);
            let cache = if hash.is_some() { "public, immutable" } else { "no-cache, private" };
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(docs: &Documents, gv: &str) -> Value {
        serde_json::from_slice(&docs.v3[gv].json).expect("v3 json")
    }

    #[test]
    fn every_served_kind_has_its_type_in_the_openapi_table() {
        for res in kinds::ALL {
            assert!(kind_type(res).is_some(), "{} {} needs a line in KIND_TYPES", res.api_version(), res.kind);
        }
    }

    #[test]
    fn the_protobuf_document_decodes_to_the_json_document_with_nothing_dropped() {
        let docs = build();
        let json: Value = serde_json::from_slice(&docs.v2_json).expect("v2 json");
        let mut dropped = Vec::new();
        let expected = gnostic::document(&json, &mut dropped);
        assert!(dropped.is_empty(), "the protobuf form leaves out {dropped:?}");
        let decoded = gnostic::Document::decode(docs.v2_protobuf.as_slice()).expect("decode");
        assert_eq!(decoded, expected);

        // What kubectl looks for: the Deployment's PATCH operation names its kind and takes fieldValidation.
        let paths = decoded.paths.expect("paths").path;
        let item = paths
            .iter()
            .find(|p| p.name == "/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
            .and_then(|p| p.value.clone())
            .expect("deployment path");
        let patch = item.patch.expect("patch operation");
        let kind = patch.vendor_extension.iter().find(|e| e.name == "x-kubernetes-group-version-kind").expect("gvk");
        let kind: Value = serde_json::from_str(&kind.value.clone().expect("value").yaml).expect("yaml is json");
        assert_eq!(kind, json!({"group": "apps", "kind": "Deployment", "version": "v1"}));
        let names: Vec<String> = patch
            .parameters
            .iter()
            .filter_map(|p| match &p.oneof {
                Some(gnostic::parameters_item::Oneof::Parameter(gnostic::Parameter {
                    oneof: Some(gnostic::parameter::Oneof::NonBodyParameter(q)),
                })) => match &q.oneof {
                    Some(gnostic::non_body_parameter::Oneof::QueryParameterSubSchema(q)) => Some(q.name.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert!(names.contains(&"fieldValidation".to_string()) && names.contains(&"dryRun".to_string()), "{names:?}");
    }

    #[test]
    fn fields_shepherd_refuses_are_not_described() {
        let docs = build();
        let json: Value = serde_json::from_slice(&docs.v2_json).expect("v2 json");
        let defs = &json["definitions"];
        let pod_spec = &defs["io.k8s.api.core.v1.PodSpec"]["properties"];
        assert!(pod_spec.get("containers").is_some());
        for gone in ["initContainers", "hostPID", "hostIPC"] {
            assert!(pod_spec.get(gone).is_none(), "PodSpec.{gone} is still described");
        }
        let volume = &defs["io.k8s.api.core.v1.Volume"]["properties"];
        assert!(volume.get("configMap").is_some() && volume.get("nfs").is_none(), "{volume}");
        assert!(defs["io.k8s.api.core.v1.VolumeMount"]["properties"].get("subPathExpr").is_none());
        let pod_security = &defs["io.k8s.api.core.v1.PodSecurityContext"]["properties"];
        assert!(pod_security.get("runAsUser").is_some() && pod_security.get("fsGroup").is_none(), "{pod_security}");
        let affinity = &defs["io.k8s.api.core.v1.Affinity"]["properties"];
        assert!(affinity.get("nodeAffinity").is_some() && affinity.get("podAffinity").is_none(), "{affinity}");
        // And what only they reached is gone with them.
        assert!(defs.get("io.k8s.api.core.v1.NFSVolumeSource").is_none());
        assert!(defs.get("io.k8s.api.core.v1.PodAffinity").is_none());
    }

    #[test]
    fn every_field_extension_lands_on_a_described_field() {
        let json: Value = serde_json::from_slice(&build().v2_json).expect("v2 json");
        for ext in FIELD_EXTENSIONS {
            let prop = &json["definitions"][ext.definition]["properties"][ext.field];
            assert!(prop.is_object(), "{}.{} is not in the document", ext.definition, ext.field);
            if let Some(key) = ext.patch_merge_key {
                assert_eq!(prop["x-kubernetes-patch-merge-key"], key);
            }
        }
        let ports = &json["definitions"]["io.k8s.api.core.v1.Container"]["properties"]["ports"];
        assert_eq!(ports["x-kubernetes-list-map-keys"], json!(["containerPort", "protocol"]));
        assert_eq!(ports["x-kubernetes-patch-strategy"], "merge");
    }

    #[test]
    fn each_v3_document_resolves_its_references_and_names_its_kinds() {
        let docs = build();
        assert_eq!(docs.v3.keys().collect::<Vec<_>>(), ["api/v1", "apis/apiextensions.k8s.io/v1", "apis/apps/v1", "apis/authorization.k8s.io/v1",
            "apis/autoscaling/v2", "apis/batch/v1", "apis/certificates.k8s.io/v1", "apis/coordination.k8s.io/v1", "apis/discovery.k8s.io/v1", "apis/policy/v1",
            "apis/rbac.authorization.k8s.io/v1"]);
        for gv in docs.v3.keys() {
            let doc = v3(&docs, gv);
            let schemas = doc["components"]["schemas"].as_object().expect("schemas");
            let text = doc.to_string();
            for r in text.split("\"$ref\":\"").skip(1) {
                let name = r.split('"').next().unwrap_or("").trim_start_matches(V3_REF);
                assert!(schemas.contains_key(name), "{gv}: dangling reference to {name}");
            }
            assert!(!text.contains(V2_REF), "{gv} still refers to v2 definitions");
        }
        let apps = v3(&docs, "apis/apps/v1");
        let deployment = &apps["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(deployment["x-kubernetes-group-version-kind"], json!([gvk("apps", "v1", "Deployment")]));
        // A described reference is wrapped, so that the description survives in v3.
        let spec = &deployment["properties"]["spec"];
        assert_eq!(spec["allOf"][0]["$ref"], "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec");
        assert!(spec["description"].is_string(), "{spec}");
        let patch = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        let params: Vec<&str> =
            patch["parameters"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
        assert!(params.contains(&"fieldValidation") && params.contains(&"dryRun"), "{params:?}");
    }

    #[test]
    fn collections_can_be_deleted_as_discovery_says_except_namespaces() {
        let core = v3(&build(), "api/v1");
        let pods = &core["paths"]["/api/v1/namespaces/{namespace}/pods"]["delete"];
        assert_eq!(pods["x-kubernetes-action"], "deletecollection");
        assert_eq!(pods["operationId"], "deleteCoreV1CollectionNamespacedPod");
        assert!(core["paths"]["/api/v1/namespaces"].get("delete").is_none());
        assert!(core["paths"]["/api/v1/namespaces/{name}"].get("delete").is_some());
    }

    #[test]
    fn the_v3_index_points_at_each_document_by_its_hash() {
        let docs = build();
        let index: Value = serde_json::from_slice(&docs.v3_index).expect("index");
        let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"].as_str().expect("url");
        assert_eq!(url, format!("/openapi/v3/apis/apps/v1?hash={}", docs.v3["apis/apps/v1"].hash));
    }
}
