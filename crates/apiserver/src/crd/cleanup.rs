//! Deleting a definition: its objects go first (finalizers respected), then the definition, and
//! the resource stops being served.

use serde_json::Value;
use shepherd_api::kinds;
use shepherd_api::{ApiError, JsonPath};

use super::{CLEANUP_FINALIZER, forget, served_versions, str_at};
use crate::codec;
use crate::service::{ApiService, DeleteOptions, ListOptions};

/// Definitions whose objects are being removed by [`spawn_cleanup`] now.
static CLEANING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);


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
    let terminating = def.at("/status/conditions").and_then(Value::as_array).into_iter().flatten()
        .any(|c| c["type"] == "Terminating");
    if !terminating {
        // Rewriting the definition as it is lets `prepare` report the cleanup in its status.
        let opts = crate::write_options::WriteOptions::default();
        svc.mutate(&kinds::CUSTOMRESOURCEDEFINITION, None, name, None, "", &opts, |old| Ok(old.clone())).await?;
    }
    let served = served_versions(&def);
    let mut remaining = 0;
    if let Some((first, _)) = served.first()
        && let Some(res) = kinds::by_group_version_plural(&first.group, &first.version, &first.plural)
    {
        let page = svc.list(res, None, &ListOptions::default()).await?;
        for kv in &page.items {
            let obj = codec::decode_listed(kv)?;
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
