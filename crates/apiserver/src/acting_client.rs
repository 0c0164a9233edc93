//! `ActingClient`: the in-process client with an identity. Each call is authorized as the same
//! request over HTTP would be (RBAC and the node authorizer) and its writes pass the same
//! admission, so the controllers, scheduler and node agent that `standalone` runs in one process
//! hold their own roles, not a superuser's.

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde_json::Value;
use shepherd_api::ApiError;
use shepherd_api::JsonPath;
use shepherd_api::digest::{DigestDetail, ListDigest};
use shepherd_api::kinds::ResourceInfo;
use shepherd_runtime::{Client, DeleteParams, ListParams, ObjectList, Patch, WatchEvent};

use crate::auth::UserInfo;
use crate::authz::{Attributes, Authorizer};
use crate::client::LocalClient;

#[derive(Clone)]
pub struct ActingClient {
    inner: LocalClient,
    user: UserInfo,
    authz: Authorizer,
}

impl ActingClient {
    /// A client for `user`; a node's identity first loads the pods' placement the node authorizer
    /// decides by.
    pub(crate) async fn new(inner: LocalClient, user: UserInfo, authz: Authorizer) -> ActingClient {
        if user.node_name().is_some() {
            authz.follow_nodes().await;
        }
        ActingClient { inner, user, authz }
    }

    pub fn user(&self) -> &UserInfo {
        &self.user
    }

    fn check(&self, verb: &str, res: &ResourceInfo, namespace: Option<&str>, name: &str, sub: &str) -> Result<(), ApiError> {
        let mut a = Attributes::of_collection(verb, res, namespace, None);
        a.name = name.into();
        a.subresource = sub.into();
        self.authz.check(&self.user, &a)
    }

    /// A list, watch or digest: narrowed to one object when the field selector names it.
    fn check_collection(&self, verb: &str, res: &ResourceInfo, params: &ListParams) -> Result<(), ApiError> {
        let a = Attributes::of_collection(verb, res, params.namespace.as_deref(), params.field_selector.as_deref());
        self.authz.check(&self.user, &a)
    }

    /// Runs `call` as this user, for the admission checks inside the object service.
    async fn act<T>(&self, call: impl Future<Output = Result<T, ApiError>>) -> Result<T, ApiError> {
        crate::authz::acting_as(self.user.clone(), self.authz.clone(), call).await
    }
}

fn name_in(obj: &Value) -> &str {
    obj.at("/metadata/name").and_then(Value::as_str).unwrap_or("")
}

fn namespace_in<'a>(namespace: Option<&'a str>, obj: &'a Value) -> Option<&'a str> {
    namespace.or_else(|| obj.at("/metadata/namespace").and_then(Value::as_str)).or(Some("default"))
}

#[async_trait]
impl Client for ActingClient {
    async fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.check("get", res, namespace, name, "")?;
        self.inner.get(res, namespace, name).await
    }

    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError> {
        self.check_collection("list", res, params)?;
        self.inner.list(res, params).await
    }

    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        resource_version: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError> {
        self.check_collection("watch", res, params)?;
        self.inner.watch(res, params, resource_version).await
    }

    async fn create(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.check("create", res, namespace_in(namespace, &obj), "", "")?;
        self.act(self.inner.create(res, namespace, obj)).await
    }

    async fn update(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.check("update", res, namespace_in(namespace, &obj), name_in(&obj), "")?;
        self.act(self.inner.update(res, namespace, obj)).await
    }

    async fn update_status(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.check("update", res, namespace_in(namespace, &obj), name_in(&obj), "status")?;
        self.act(self.inner.update_status(res, namespace, obj)).await
    }

    async fn patch(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        self.check("patch", res, namespace, name, "")?;
        self.act(self.inner.patch(res, namespace, name, patch)).await
    }

    async fn patch_status(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        self.check("patch", res, namespace, name, "status")?;
        self.act(self.inner.patch_status(res, namespace, name, patch)).await
    }

    async fn delete(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, params: &DeleteParams) -> Result<Option<Value>, ApiError> {
        self.check("delete", res, namespace, name, "")?;
        self.act(self.inner.delete(res, namespace, name, params)).await
    }

    async fn get_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.check("get", res, namespace, name, "scale")?;
        self.inner.get_scale(res, namespace, name).await
    }

    async fn update_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, scale: Value) -> Result<Value, ApiError> {
        self.check("update", res, namespace, name, "scale")?;
        self.act(self.inner.update_scale(res, namespace, name, scale)).await
    }

    async fn create_token(&self, namespace: &str, name: &str, request: Value) -> Result<Value, ApiError> {
        self.check("create", &shepherd_api::kinds::SERVICEACCOUNT, Some(namespace), name, "token")?;
        crate::serviceaccount::create_token(self.inner.service(), Some(&self.user), namespace, name, &request).await
    }

    async fn bind_pod(&self, namespace: &str, name: &str, node_name: &str) -> Result<(), ApiError> {
        self.check("create", &shepherd_api::kinds::POD, Some(namespace), name, "binding")?;
        self.act(self.inner.bind_pod(namespace, name, node_name)).await
    }

    async fn digest(&self, res: &ResourceInfo, params: &ListParams, revision: u64, detail: DigestDetail) -> Result<ListDigest, ApiError> {
        self.check_collection("list", res, params)?;
        self.inner.digest(res, params, revision, detail).await
    }
}
