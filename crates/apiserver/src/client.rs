//! `LocalClient`: the in-process implementation of the controllers' `Client`, calling the
//! service layer directly (no HTTP, same validation, same watch semantics).

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;
use shepherd_api::JsonPath;
use shepherd_api::ApiError;
use shepherd_api::digest::{DigestDetail, ListDigest};
use shepherd_api::kinds::ResourceInfo;
use shepherd_runtime::{Client, DeleteParams, ListParams, ObjectList, Patch, WatchEvent};

use crate::codec;
use crate::write_options::WriteOptions;
use crate::resource_metrics;
use crate::service::{ApiService, DeleteOptions, ListOptions, Part, PatchType};
use crate::watch::WatchOptions;

#[derive(Clone)]
pub struct LocalClient {
    svc: ApiService,
}

impl LocalClient {
    pub fn new(svc: ApiService) -> Self {
        LocalClient { svc }
    }

    pub(crate) fn service(&self) -> &ApiService {
        &self.svc
    }
}

fn name_of(obj: &Value) -> Result<String, ApiError> {
    obj.at("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ApiError::BadRequest("metadata.name is required for an update".into()))
}

fn namespace_of<'a>(res: &ResourceInfo, ns: Option<&'a str>, obj: &'a Value) -> Option<&'a str> {
    if !res.namespaced {
        return None;
    }
    ns.or_else(|| obj.at("/metadata/namespace").and_then(Value::as_str)).or(Some("default"))
}

fn patch_parts(patch: Patch) -> (PatchType, Value) {
    match patch {
        Patch::Merge(v) => (PatchType::Merge, v),
        Patch::Json(v) => (PatchType::Json, v),
    }
}

/// `ResourceInfo` values handed to the client are copies; the service wants the registry's own.
fn registered(res: &ResourceInfo) -> Result<&'static ResourceInfo, ApiError> {
    shepherd_api::kinds::by_group_version_plural(res.group, res.version, res.plural)
        .ok_or_else(|| ApiError::NotFound { kind: res.plural.into(), name: String::new(), message: format!("unknown resource {}", res.plural) })
}

#[async_trait]
impl Client for LocalClient {
    async fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        if resource_metrics::is_metrics(res) {
            return self.svc.resource_metrics.get(res, namespace, name);
        }
        codec::decode(&self.svc.get(res, namespace, name).await?)
    }

    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError> {
        if resource_metrics::is_metrics(res) {
            let (labels, fields) = (params.label_selector.as_deref(), params.field_selector.as_deref());
            let items = self.svc.resource_metrics.list(res, params.namespace.as_deref(), labels, fields)?;
            return Ok(ObjectList { items, resource_version: 0 });
        }
        let opts = ListOptions {
            label_selector: params.label_selector.clone(),
            field_selector: params.field_selector.clone(),
            ..Default::default()
        };
        let page = self.svc.list(res, params.namespace.as_deref(), &opts).await?;
        let items: Result<Vec<Value>, ApiError> = if params.without_managed_fields {
            page.items.iter().map(codec::decode_listed_without_managed_fields).collect()
        } else {
            page.items.iter().map(codec::decode_listed).collect()
        };
        Ok(ObjectList { items: items?, resource_version: page.revision })
    }

    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        resource_version: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError> {
        let opts = WatchOptions {
            label_selector: params.label_selector.clone(),
            field_selector: params.field_selector.clone(),
            resource_version: Some(resource_version),
            ..Default::default()
        };
        let stream = self.svc.watch(registered(res)?, params.namespace.as_deref(), opts).await?;
        let skip = params.without_managed_fields;
        Ok(stream
            .map(move |e| {
                let decoded =
                    if skip { codec::from_slice_without_managed_fields(&e.object) } else { serde_json::from_slice(&e.object) };
                let obj: Value = decoded.map_err(|err| ApiError::Internal(format!("decoding watch event: {err}")))?;
                match e.kind {
                    "ADDED" => Ok(WatchEvent::Added(obj)),
                    "MODIFIED" => Ok(WatchEvent::Modified(obj)),
                    "DELETED" => Ok(WatchEvent::Deleted(obj)),
                    "BOOKMARK" => Ok(WatchEvent::Bookmark(
                        obj.at("/metadata/resourceVersion").and_then(Value::as_str).and_then(|r| r.parse().ok()).unwrap_or(0),
                    )),
                    _ => Err(ApiError::from_status(&obj)),
                }
            })
            .boxed())
    }

    async fn create(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        if resource_metrics::is_metrics(res) && res.plural == "nodes" {
            return self.svc.resource_metrics.report_any(obj);
        }
        let ns = namespace_of(res, namespace, &obj).map(str::to_string);
        self.svc.create_with(res, ns.as_deref(), obj, &WriteOptions::default()).await?.into_value()
    }

    async fn update(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let name = name_of(&obj)?;
        let ns = namespace_of(res, namespace, &obj).map(str::to_string);
        self.svc.update_with(res, ns.as_deref(), &name, obj, Part::Main, &WriteOptions::default()).await?.into_value()
    }

    async fn update_status(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let name = name_of(&obj)?;
        let ns = namespace_of(res, namespace, &obj).map(str::to_string);
        let part = if res.has_status { Part::Status } else { Part::Main };
        self.svc.update_with(res, ns.as_deref(), &name, obj, part, &WriteOptions::default()).await?.into_value()
    }

    async fn patch(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        let (t, p) = patch_parts(patch);
        self.svc.patch_with(res, namespace, name, t, &p, Part::Main, &WriteOptions::default()).await?.into_value()
    }

    async fn patch_status(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        let (t, p) = patch_parts(patch);
        let part = if res.has_status { Part::Status } else { Part::Main };
        self.svc.patch_with(res, namespace, name, t, &p, part, &WriteOptions::default()).await?.into_value()
    }

    async fn delete(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, params: &DeleteParams) -> Result<Option<Value>, ApiError> {
        let opts = DeleteOptions {
            propagation_policy: params.propagation.map(|p| p.as_str().to_string()),
            grace_period_seconds: params.grace_period_seconds,
            precondition_uid: params.precondition_uid.clone(),
            precondition_resource_version: params.precondition_resource_version,
            dry_run: false,
        };
        match self.svc.delete(res, namespace, name, &opts).await? {
            crate::service::Deleted::Gone(_) => Ok(None),
            crate::service::Deleted::Pending(kv) => Ok(Some(codec::decode(&kv)?)),
        }
    }

    async fn get_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.svc.get_scale(registered(res)?, namespace, name).await
    }

    async fn update_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, scale: Value) -> Result<Value, ApiError> {
        let ns = namespace_of(res, namespace, &scale).map(str::to_string);
        self.svc.update_scale(registered(res)?, ns.as_deref(), name, &scale, &crate::WriteOptions::default()).await
    }

    async fn bind_pod(&self, namespace: &str, name: &str, node_name: &str) -> Result<(), ApiError> {
        self.svc.bind(namespace, name, node_name).await.map(|_| ())
    }

    async fn create_token(&self, namespace: &str, name: &str, request: Value) -> Result<Value, ApiError> {
        crate::serviceaccount::create_token(&self.svc, None, namespace, name, &request).await
    }

    async fn digest(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        revision: u64,
        detail: DigestDetail,
    ) -> Result<ListDigest, ApiError> {
        let (labels, fields) = (params.label_selector.as_deref(), params.field_selector.as_deref());
        let revision = (revision > 0).then_some(revision);
        self.svc.digest(registered(res)?, params.namespace.as_deref(), labels, fields, revision, detail).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use shepherd_api::kinds;
    use shepherd_runtime::Client;
    use shepherd_store::{HistoryLimits, LocalStore};

    use crate::{ApiServer, HttpConfig};

    #[tokio::test]
    async fn what_a_write_returns_is_what_a_read_then_gives() {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let server = ApiServer::new(store, HttpConfig::default()).await.expect("server");
        let c = server.client();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default",
            "labels": {"app": "web"}, "annotations": {"ratio": "0.25"}},
            "spec": {"containers": [{"name": "c", "image": "minimal", "resources": {"limits": {"cpu": "1.5"}}}],
                "terminationGracePeriodSeconds": 7}});
        let read = || async { c.get(&kinds::POD, Some("default"), "p").await.expect("get") };
        let created = c.create(&kinds::POD, Some("default"), pod).await.expect("create");
        assert_eq!(created, read().await);
        assert!(created["metadata"]["resourceVersion"].as_str().is_some_and(|v| !v.is_empty()));
        assert!(created["metadata"]["managedFields"].is_array() && created["metadata"]["uid"].is_string());

        let patched = c
            .patch(&kinds::POD, Some("default"), "p", shepherd_runtime::Patch::Merge(json!({"metadata": {"labels": {"tier": "a"}}})))
            .await
            .expect("patch");
        assert_eq!(patched, read().await);
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        let started = c.patch_status(&kinds::POD, Some("default"), "p", shepherd_runtime::Patch::Merge(status)).await.expect("status");
        assert_eq!(started, read().await);
        let mut changed = started.clone();
        changed["metadata"]["labels"]["tier"] = json!("b");
        let updated = c.update(&kinds::POD, Some("default"), changed).await.expect("update");
        assert_eq!(updated, read().await);
        assert_ne!(updated["metadata"]["resourceVersion"], started["metadata"]["resourceVersion"]);
        // A write that changes nothing returns the stored object as it was.
        let same = c.update(&kinds::POD, Some("default"), updated.clone()).await.expect("no-op update");
        assert_eq!(same, updated);
    }
}
