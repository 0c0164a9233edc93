//! CustomResourceDefinitions: checking and completing definitions, serving the resources they
//! define (registry, schema, printer columns, scale), and removing a deleted definition's objects.
//!
//! The served custom resources are a registry in `shepherd_api::kinds`, updated after every
//! successful write of a definition and loaded from the store at start, so a new definition is
//! served as soon as its create returns. Objects of every version share one store prefix
//! (group and plural) and are stored in the storage version.

mod cleanup;
mod conversion;
mod definition;
pub(crate) mod schema;
mod views;

pub(crate) use cleanup::spawn_cleanup;
pub(crate) use conversion::{convert_event, convert_response, read_as};
use definition::{prepare, validate};
pub(crate) use views::{scale_body, scale_view, set_replicas, simple_path, table};

use serde_json::{Value, json};
use shepherd_api::kinds::{self, CustomResource, CustomVersion, ResourceInfo};
use shepherd_api::{ApiError, JsonPath, str_at};

use crate::codec;
use crate::service::{ApiService, ListOptions};

/// Keeps a definition until its objects are gone, as in Kubernetes.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

pub(crate) fn is_definition(res: &ResourceInfo) -> bool {
    res.group == kinds::CUSTOMRESOURCEDEFINITION.group && res.plural == kinds::CUSTOMRESOURCEDEFINITION.plural
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
    let accepted = def.at("/status/conditions").and_then(Value::as_array).into_iter().flatten()
        .any(|c| c["type"] == "NamesAccepted" && c["status"] == "True");
    let versions = if accepted { served_versions(def) } else { Vec::new() };
    kinds::register_custom(str_at(def, "/metadata/name"), versions);
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
        let def = codec::decode_listed(kv)?;
        sync(&def);
        if def.at("/metadata/deletionTimestamp").is_some() {
            spawn_cleanup(svc.clone(), str_at(&def, "/metadata/name").to_string());
        }
    }
    Ok(())
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

/// After a definition was written: serve what it defines, stop serving it once it is gone, and
/// start removing its objects once it is being deleted.
pub(crate) fn written(svc: &ApiService, res: &ResourceInfo, obj: &Value, gone: bool) {
    if !is_definition(res) {
        return;
    }
    let name = str_at(obj, "/metadata/name");
    if gone {
        forget(name);
        let svc = svc.clone();
        let group = str_at(obj, "/spec/group").to_string();
        tokio::spawn(async move {
            if let Err(e) = accept_freed_names(&svc, &group).await {
                tracing::warn!(%group, error = %e, "re-checking definitions whose names were taken");
            }
        });
        return;
    }
    sync(obj);
    if obj.at("/metadata/deletionTimestamp").is_some() {
        spawn_cleanup(svc.clone(), name.to_string());
    }
}

/// Looks again at the definitions of `group` whose names were taken: rewriting one as it is
/// re-evaluates its names, and serves it if they are free now.
async fn accept_freed_names(svc: &ApiService, group: &str) -> Result<(), ApiError> {
    let page = svc.list(&kinds::CUSTOMRESOURCEDEFINITION, None, &ListOptions::default()).await?;
    for kv in &page.items {
        let def = codec::decode_listed(kv)?;
        let refused = def.at("/status/conditions").and_then(Value::as_array).into_iter().flatten()
            .any(|c| c["type"] == "NamesAccepted" && c["status"] == "False");
        if refused && str_at(&def, "/spec/group") == group {
            let opts = crate::write_options::WriteOptions::default();
            let name = str_at(&def, "/metadata/name");
            match svc.mutate(&kinds::CUSTOMRESOURCEDEFINITION, None, name, None, "", &opts, |old| Ok(old.clone())).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
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
