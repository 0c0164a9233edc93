//! CustomResourceDefinitions: checking and completing definitions, serving the resources they
//! define (registry, schema, printer columns, scale), and removing a deleted definition's objects.
//!
//! The served custom resources are a registry in `shepherd_api::kinds`, updated after every
//! successful write of a definition and loaded from the store at start, so a new definition is
//! served as soon as its create returns. Objects of every version share one store prefix
//! (group and plural) and are stored in the storage version.

pub(crate) mod schema;

use serde_json::{Value, json};
use shepherd_api::kinds::{self, CustomResource, CustomVersion, ResourceInfo};
use shepherd_api::{ApiError, Cause, JsonPath};

use crate::codec;
use crate::service::{ApiService, DeleteOptions, ListOptions};

/// Keeps a definition until its objects are gone, as in Kubernetes.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

pub(crate) fn is_definition(res: &ResourceInfo) -> bool {
    res.group == kinds::CUSTOMRESOURCEDEFINITION.group && res.plural == kinds::CUSTOMRESOURCEDEFINITION.plural
}

fn str_at<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.at(ptr).and_then(Value::as_str).unwrap_or("")
}

/// The `Kind.group` a custom object's errors name, as Kubernetes writes it (`Widget.example.com`).
pub(crate) fn qualified_kind(res: &ResourceInfo) -> String {
    format!("{}.{}", res.kind, res.group)
}

fn versions(def: &Value) -> &[Value] {
    def.at("/spec/versions").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

pub(crate) fn served_versions(def: &Value) -> Vec<(CustomResource, CustomVersion)> {
    kinds::custom_resources_of(def)
}

/// Serves what a stored definition defines (or stops serving it once it is gone).
pub(crate) fn sync(def: &Value) {
    kinds::register_custom(str_at(def, "/metadata/name"), served_versions(def));
    crate::openapi::invalidate();
}

pub(crate) fn forget(name: &str) {
    kinds::unregister_custom(name);
    crate::openapi::invalidate();
}

/// Serves every stored definition; called once at start.
pub(crate) async fn load(svc: &ApiService) -> Result<(), ApiError> {
    let page = svc.list(&kinds::CUSTOMRESOURCEDEFINITION, None, &ListOptions::default()).await?;
    for kv in &page.items {
        let def = codec::decode(kv)?;
        sync(&def);
        if def.at("/metadata/deletionTimestamp").is_some() {
            spawn_cleanup(svc.clone(), str_at(&def, "/metadata/name").to_string());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Writing definitions
// ---------------------------------------------------------------------------------------------

/// Completes a definition about to be written, as Kubernetes' defaulting and its establishing
/// controller would: defaults, the cleanup finalizer, and a status the server owns.
pub(crate) fn prepare(old: Option<&Value>, def: &mut Value) {
    let kind = str_at(def, "/spec/names/kind").to_string();
    if let Some(names) = def.get_mut("spec").and_then(|s| s.get_mut("names")).and_then(Value::as_object_mut) {
        if names.get("singular").and_then(Value::as_str).is_none_or(str::is_empty) {
            names.insert("singular".into(), json!(kind.to_ascii_lowercase()));
        }
        if names.get("listKind").and_then(Value::as_str).is_none_or(str::is_empty) {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if let Some(spec) = def.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion").or_insert_with(|| json!({"strategy": "None"}));
    }
    let deleting = def.at("/metadata/deletionTimestamp").is_some();
    if old.is_none() && let Some(m) = def.get_mut("metadata").and_then(Value::as_object_mut) {
        let list = m.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(a) = list.as_array_mut()
            && !a.iter().any(|f| f == CLEANUP_FINALIZER)
        {
            a.push(json!(CLEANUP_FINALIZER));
        }
    }
    let now = crate::service::now_rfc3339();
    let previous = |t: &str| {
        old.and_then(|o| o.at("/status/conditions")).and_then(Value::as_array).into_iter().flatten()
            .find(|c| c["type"] == t).cloned()
    };
    let condition = |t: &str, status: &str, reason: &str, message: &str| {
        let since = previous(t)
            .filter(|c| c["status"] == status)
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
    };
    let mut conditions = vec![
        condition("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
        condition("Established", "True", "InitialNamesAccepted", "the initial names have been accepted"),
    ];
    if deleting {
        conditions.push(condition("Terminating", "True", "InstanceDeletionInProgress", "CustomResource deletion is in progress"));
    }
    let mut stored = strings(old.and_then(|o| o.at("/status/storedVersions")));
    if let Some(storage) = versions(def).iter().find(|v| v["storage"] == true).map(|v| str_at(v, "/name").to_string())
        && !stored.contains(&storage)
    {
        stored.push(storage);
    }
    let accepted = def.at("/spec/names").cloned().unwrap_or(json!({}));
    def["status"] = json!({"conditions": conditions, "acceptedNames": accepted, "storedVersions": stored});
}

/// Checks a definition as Kubernetes' validation does; `old` is the stored one on an update.
pub(crate) fn validate(old: Option<&Value>, def: &Value) -> Result<(), ApiError> {
    let mut c = Vec::new();
    let name = str_at(def, "/metadata/name");
    let group = str_at(def, "/spec/group");
    let plural = str_at(def, "/spec/names/plural");
    let kind = str_at(def, "/spec/names/kind");
    if group.is_empty() {
        c.push(Cause::required("spec.group"));
    } else if !group.contains('.') || !shepherd_api::validation::is_dns1123_subdomain(group) {
        c.push(Cause::invalid("spec.group", format!("Invalid value: {group:?}: should be a domain with at least one dot")));
    } else if kinds::GROUPS.contains(&group) || group.ends_with(".k8s.io") || group.ends_with(".kubernetes.io") {
        c.push(Cause::invalid("spec.group", format!(
            "Invalid value: {group:?}: is a group served by Shepherd itself; choose a group of your own"
        )));
    }
    if plural.is_empty() {
        c.push(Cause::required("spec.names.plural"));
    } else if !shepherd_api::validation::is_dns1123_label(plural) {
        c.push(Cause::invalid("spec.names.plural", format!("Invalid value: {plural:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
    }
    let singular = str_at(def, "/spec/names/singular");
    if !singular.is_empty() && !shepherd_api::validation::is_dns1123_label(singular) {
        c.push(Cause::invalid("spec.names.singular", format!("Invalid value: {singular:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
    }
    if kind.is_empty() {
        c.push(Cause::required("spec.names.kind"));
    } else if !kind.chars().next().is_some_and(|ch| ch.is_ascii_alphabetic()) || !kind.chars().all(|ch| ch.is_ascii_alphanumeric()) {
        c.push(Cause::invalid("spec.names.kind", format!("Invalid value: {kind:?}: must be a valid kind name")));
    }
    for (i, s) in strings(def.at("/spec/names/shortNames")).iter().enumerate() {
        if !shepherd_api::validation::is_dns1123_label(s) {
            c.push(Cause::invalid(format!("spec.names.shortNames[{i}]"), format!("Invalid value: {s:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
        }
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        c.push(Cause::invalid("metadata.name", format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group")));
    }
    match str_at(def, "/spec/scope") {
        "Namespaced" | "Cluster" => {}
        "" => c.push(Cause::required("spec.scope")),
        other => c.push(Cause::not_supported("spec.scope", format!("Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""))),
    }
    match str_at(def, "/spec/conversion/strategy") {
        "" | "None" => {}
        "Webhook" => c.push(Cause::not_supported("spec.conversion.strategy", "Unsupported value: \"Webhook\": supported values: \"None\" (Shepherd does not call conversion webhooks)")),
        other => c.push(Cause::not_supported("spec.conversion.strategy", format!("Unsupported value: {other:?}: supported values: \"None\", \"Webhook\""))),
    }
    validate_versions(def, &mut c);
    if let Some(old) = old {
        for (field, ptr) in [("spec.scope", "/spec/scope"), ("spec.group", "/spec/group"), ("spec.names.plural", "/spec/names/plural")] {
            let (was, now) = (str_at(old, ptr), str_at(def, ptr));
            if was != now {
                c.push(Cause::invalid(field, format!("Invalid value: {now:?}: field is immutable")));
            }
        }
    }
    if c.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid("CustomResourceDefinition.apiextensions.k8s.io", name, c))
}

fn validate_versions(def: &Value, c: &mut Vec<Cause>) {
    let vs = versions(def);
    if vs.is_empty() {
        c.push(Cause::invalid("spec.versions", "Invalid value: []: must have exactly one version marked as storage version"));
        return;
    }
    let storage = vs.iter().filter(|v| v["storage"] == true).count();
    if storage != 1 {
        c.push(Cause::invalid("spec.versions", format!(
            "Invalid value: {storage} storage versions: must have exactly one version marked as storage version"
        )));
    }
    let mut seen = Vec::new();
    for (i, v) in vs.iter().enumerate() {
        let path = format!("spec.versions[{i}]");
        let name = str_at(v, "/name");
        if name.is_empty() {
            c.push(Cause::required(format!("{path}.name")));
        } else if !shepherd_api::validation::is_dns1123_label(name) {
            c.push(Cause::invalid(format!("{path}.name"), format!("Invalid value: {name:?}: a DNS-1035 label must consist of lower case alphanumeric characters or '-'")));
        } else if seen.contains(&name) {
            c.push(Cause::new("FieldValueDuplicate", "spec.versions", format!("Duplicate value: {name:?}")));
        }
        seen.push(name);
        match v.at("/schema/openAPIV3Schema") {
            Some(s) if !s.is_null() => schema::check_structural(s, &format!("{path}.schema.openAPIV3Schema"), c),
            _ => c.push(Cause::required(format!("{path}.schema.openAPIV3Schema")).with("Required value: schemas are required")),
        }
        if let Some(scale) = v.at("/subresources/scale").filter(|s| !s.is_null()) {
            for (field, required) in [("specReplicasPath", true), ("statusReplicasPath", true), ("labelSelectorPath", false)] {
                let p = str_at(scale, &format!("/{field}"));
                let full = format!("{path}.subresources.scale.{field}");
                if p.is_empty() {
                    if required {
                        c.push(Cause::required(full));
                    }
                } else if simple_path(p).is_none() {
                    c.push(Cause::invalid(full, format!("Invalid value: {p:?}: should be a json path under either .spec or .status")));
                }
            }
        }
        for (j, col) in v.get("additionalPrinterColumns").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let cp = format!("{path}.additionalPrinterColumns[{j}]");
            if str_at(col, "/name").is_empty() {
                c.push(Cause::required(format!("{cp}.name")));
            }
            match str_at(col, "/type") {
                "integer" | "number" | "string" | "boolean" | "date" => {}
                "" => c.push(Cause::required(format!("{cp}.type"))),
                other => c.push(Cause::not_supported(format!("{cp}.type"), format!("Unsupported value: {other:?}: supported values: \"boolean\", \"date\", \"integer\", \"number\", \"string\""))),
            }
            let jp = str_at(col, "/jsonPath");
            if jp.is_empty() {
                c.push(Cause::required(format!("{cp}.jsonPath")));
            } else if simple_path(jp).is_none() {
                c.push(Cause::invalid(format!("{cp}.jsonPath"), format!("Invalid value: {jp:?}: must be a simple json path")));
            }
        }
    }
}

trait WithMessage {
    fn with(self, message: &str) -> Self;
}

impl WithMessage for Cause {
    fn with(mut self, message: &str) -> Self {
        self.message = message.to_string();
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Writing custom objects
// ---------------------------------------------------------------------------------------------

/// Prunes the fields a custom object's schema does not know and returns their paths (for
/// `fieldValidation`); none for built-in kinds, which have their own schema.
pub(crate) fn prune_unknown(res: &ResourceInfo, obj: &mut Value) -> Option<Vec<String>> {
    let custom = kinds::custom(res)?;
    Some(custom.schema.as_ref().map(|s| schema::prune(s, obj)).unwrap_or_default())
}

/// What the write path does to definitions and custom objects after the common defaults:
/// schema defaults, the status a definition gets, the storage version, and validation.
pub(crate) fn admit(res: &ResourceInfo, old: Option<&Value>, obj: &mut Value) -> Result<(), ApiError> {
    if is_definition(res) {
        prepare(old, obj);
        return validate(old, obj);
    }
    let Some(custom) = kinds::custom(res) else { return Ok(()) };
    if old.is_none() {
        reset_status_on_create(res, obj);
    }
    if let Some(s) = &custom.schema {
        schema::apply_defaults(s, obj);
    }
    validate_object(res, old, obj)?;
    obj["apiVersion"] = json!(custom.storage_api_version);
    Ok(())
}

/// Definitions whose objects are being removed by [`spawn_cleanup`] now.
static CLEANING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

/// After a definition was written: serve what it defines, stop serving it once it is gone, and
/// start removing its objects once it is being deleted.
pub(crate) fn written(svc: &ApiService, res: &ResourceInfo, obj: &Value, gone: bool) {
    if !is_definition(res) {
        return;
    }
    let name = str_at(obj, "/metadata/name");
    if gone {
        forget(name);
        return;
    }
    sync(obj);
    if obj.at("/metadata/deletionTimestamp").is_some() {
        spawn_cleanup(svc.clone(), name.to_string());
    }
}

/// Checks a custom object against its schema, or a definition against the rules for definitions.
pub(crate) fn validate_object(res: &ResourceInfo, old: Option<&Value>, obj: &Value) -> Result<(), ApiError> {
    if is_definition(res) {
        return validate(old, obj);
    }
    let Some(custom) = kinds::custom(res) else { return Ok(()) };
    let Some(s) = &custom.schema else { return Ok(()) };
    let causes = schema::validate(s, obj);
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(&qualified_kind(res), str_at(obj, "/metadata/name"), causes))
}

/// Custom objects with a status subresource start without a status, as in Kubernetes.
pub(crate) fn reset_status_on_create(res: &ResourceInfo, obj: &mut Value) {
    if res.has_status
        && kinds::is_custom(res)
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
}

// ---------------------------------------------------------------------------------------------
// Reading custom objects
// ---------------------------------------------------------------------------------------------

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

/// A simple JSONPath (`.spec.replicas`, `.status.conditions[0].type`) as JSON-pointer steps;
/// none for anything fancier, which Shepherd does not evaluate.
pub(crate) fn simple_path(path: &str) -> Option<Vec<String>> {
    let path = path.trim();
    let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
    let rest = path.strip_prefix('.')?;
    let mut steps = Vec::new();
    for part in rest.split('.') {
        let (field, mut index) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if field.is_empty() || !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return None;
        }
        steps.push(field.to_string());
        while !index.is_empty() {
            let close = index.find(']')?;
            let n: usize = index.get(1..close)?.parse().ok()?;
            steps.push(n.to_string());
            index = &index[close + 1..];
        }
    }
    Some(steps)
}

fn value_at<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let steps = simple_path(path)?;
    let mut v = obj;
    for s in &steps {
        v = match v {
            Value::Object(m) => m.get(s)?,
            Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Sets the value at a simple path, creating the objects on the way.
fn set_at(obj: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    let steps = simple_path(path).ok_or_else(|| ApiError::Internal(format!("scale path {path:?} is not a simple path")))?;
    let mut v = obj;
    for s in &steps {
        if !v.is_object() {
            *v = json!({});
        }
        let Value::Object(m) = v else { unreachable!("just made an object") };
        v = m.entry(s.clone()).or_insert(Value::Null);
    }
    *v = value;
    Ok(())
}

/// The `autoscaling/v1` Scale of a custom object, read through its definition's paths.
pub(crate) fn scale_of(scale: &Value, obj: &Value) -> Value {
    let path = |f: &str| str_at(scale, &format!("/{f}")).to_string();
    let int = |p: String| value_at(obj, &p).and_then(Value::as_i64).unwrap_or(0);
    let selector = value_at(obj, &path("labelSelectorPath")).and_then(Value::as_str).unwrap_or("").to_string();
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": obj.at("/metadata/name"), "namespace": obj.at("/metadata/namespace"),
            "uid": obj.at("/metadata/uid"), "resourceVersion": obj.at("/metadata/resourceVersion"),
            "creationTimestamp": obj.at("/metadata/creationTimestamp"),
        },
        "spec": {"replicas": int(path("specReplicasPath"))},
        "status": {"replicas": int(path("statusReplicasPath")), "selector": selector},
    })
}

/// The Scale view of any scalable object, built-in or custom.
pub(crate) fn scale_view(res: &ResourceInfo, obj: &Value) -> Option<Value> {
    kinds::custom(res).and_then(|c| c.scale.as_ref().map(|s| scale_of(s, obj)))
}

/// Writes a Scale's replicas into a custom object; false for built-in kinds.
pub(crate) fn set_replicas(res: &ResourceInfo, obj: &mut Value, replicas: i64) -> Result<bool, ApiError> {
    let Some(custom) = kinds::custom(res) else { return Ok(false) };
    let Some(scale) = &custom.scale else { return Ok(false) };
    set_at(obj, str_at(scale, "/specReplicasPath"), json!(replicas))?;
    Ok(true)
}

/// A Table of custom objects: Name, the definition's printer columns, or Age without any.
pub(crate) fn table(custom: &CustomVersion, objects: &[Value], resource_version: &str) -> Value {
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0})];
    let columns: Vec<Value> = if custom.printer_columns.is_empty() {
        vec![json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})]
    } else {
        custom.printer_columns.clone()
    };
    for col in &columns {
        defs.push(json!({"name": col["name"], "type": col["type"], "format": col.get("format").cloned().unwrap_or(json!("")),
            "description": col.get("description").cloned().unwrap_or(json!("")), "priority": col.get("priority").cloned().unwrap_or(json!(0))}));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![json!(str_at(o, "/metadata/name"))];
            for col in &columns {
                let v = value_at(o, str_at(col, "/jsonPath"));
                cells.push(match (str_at(col, "/type"), v) {
                    (_, None) => Value::Null,
                    ("date", Some(Value::String(t))) => match t.parse::<jiff::Timestamp>() {
                        Ok(ts) => json!(crate::table::human_age(jiff::Timestamp::now().as_second() - ts.as_second())),
                        Err(_) => json!(t),
                    },
                    (_, Some(v @ (Value::Object(_) | Value::Array(_)))) => json!(v.to_string()),
                    (_, Some(v)) => v.clone(),
                });
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": defs, "rows": rows})
}

// ---------------------------------------------------------------------------------------------
// Deleting definitions
// ---------------------------------------------------------------------------------------------

/// How often a deleted definition's cleanup looks again at objects held by their finalizers.
const CLEANUP_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Deletes every object of a definition being deleted, waits until they are gone (finalizers
/// included), then removes the cleanup finalizer, which lets the definition go.
pub(crate) fn spawn_cleanup(svc: ApiService, name: String) {
    let mut cleaning = CLEANING.lock().unwrap_or_else(|e| e.into_inner());
    if !cleaning.insert(name.clone()) {
        return;
    }
    tokio::spawn(async move {
        loop {
            match cleanup_once(&svc, &name).await {
                Ok(true) => {
                    CLEANING.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(definition = %name, error = %e, "cleaning up a deleted definition's objects"),
            }
            tokio::time::sleep(CLEANUP_POLL).await;
        }
    });
}

/// One pass of the cleanup; true once the definition is gone.
async fn cleanup_once(svc: &ApiService, name: &str) -> Result<bool, ApiError> {
    let def = match svc.get(&kinds::CUSTOMRESOURCEDEFINITION, None, name).await {
        Ok(kv) => codec::decode(&kv)?,
        Err(e) if e.is_not_found() => {
            forget(name);
            return Ok(true);
        }
        Err(e) => return Err(e),
    };
    if def.at("/metadata/deletionTimestamp").is_none() {
        return Ok(true);
    }
    let served = served_versions(&def);
    let mut remaining = 0;
    if let Some((first, _)) = served.first()
        && let Some(res) = kinds::by_group_version_plural(&first.group, &first.version, &first.plural)
    {
        let page = svc.list(res, None, &ListOptions::default()).await?;
        for kv in &page.items {
            let obj = codec::decode(kv)?;
            remaining += 1;
            if obj.at("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let ns = obj.at("/metadata/namespace").and_then(Value::as_str);
            match svc.delete(res, ns, str_at(&obj, "/metadata/name"), &DeleteOptions::default()).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        if remaining > 0 {
            // Look again: the deletes above may have removed everything.
            remaining = svc.list(res, None, &ListOptions::default()).await?.items.len();
        }
    }
    if remaining > 0 {
        return Ok(false);
    }
    let opts = crate::write_options::WriteOptions::default();
    let result = svc
        .mutate(&kinds::CUSTOMRESOURCEDEFINITION, None, name, None, "", &opts, |old| {
            let mut new = old.clone();
            if let Some(list) = new.get_mut("metadata").and_then(|m| m.get_mut("finalizers")).and_then(Value::as_array_mut) {
                list.retain(|f| f != CLEANUP_FINALIZER);
            }
            Ok(new)
        })
        .await;
    match result {
        Ok(_) => Ok(false),
        Err(e) if e.is_not_found() => {
            forget(name);
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_json_paths_are_read_and_fancy_ones_refused() {
        assert_eq!(simple_path(".spec.replicas"), Some(vec!["spec".to_string(), "replicas".to_string()]));
        assert_eq!(simple_path(".status.conditions[0].type").map(|s| s.len()), Some(4));
        assert_eq!(simple_path("spec.replicas"), None);
        assert_eq!(simple_path(".spec.items[*].name"), None);
        let obj = json!({"spec": {"replicas": 3}});
        assert_eq!(value_at(&obj, ".spec.replicas"), Some(&json!(3)));
    }
}
