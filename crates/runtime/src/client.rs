//! The client abstraction every controller is written against.
//!
//! Two implementations exist: the in-process one (in `shepherd-apiserver`, calling the same
//! service layer as the HTTP handlers, with the same validation) and a remote one over HTTP.
//! Controllers never know which one they got.

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde_json::Value;
use shepherd_api::digest::{DigestDetail, ListDigest};
use shepherd_api::{ApiError, ResourceInfo};

/// A list result: the objects and the revision they were read at (watch from there).
#[derive(Debug, Clone, Default)]
pub struct ObjectList {
    pub items: Vec<Value>,
    pub resource_version: u64,
}

/// One change seen by a watch. `Bookmark` carries only the revision reached.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    Added(Value),
    Modified(Value),
    Deleted(Value),
    Bookmark(u64),
}

/// What to list or watch. `namespace: None` means all namespaces (or a cluster-scoped kind).
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    pub namespace: Option<String>,
    /// Kubernetes label selector syntax: `app=web,tier!=db,env in (a,b)`.
    pub label_selector: Option<String>,
    /// Kubernetes field selector syntax: `spec.nodeName=n1`.
    pub field_selector: Option<String>,
    /// The caller drops every item's `metadata.managedFields` (an informer's cache does), so a
    /// client that decodes the list itself may skip them instead of building them first: they are
    /// most of a small object's parsed size. A hint; a client may return them anyway.
    pub without_managed_fields: bool,
}

impl ListParams {
    pub fn namespace(ns: impl Into<String>) -> Self {
        ListParams { namespace: Some(ns.into()), ..Default::default() }
    }
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }
    pub fn without_managed_fields(mut self) -> Self {
        self.without_managed_fields = true;
        self
    }
}

/// A patch body and its content type.
#[derive(Debug, Clone)]
pub enum Patch {
    /// `application/merge-patch+json` (RFC 7386).
    Merge(Value),
    /// `application/json-patch+json` (RFC 6902), an array of operations.
    Json(Value),
}

/// How dependents are treated when an owner is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub fn as_str(&self) -> &'static str {
        match self {
            Propagation::Background => "Background",
            Propagation::Foreground => "Foreground",
            Propagation::Orphan => "Orphan",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct DeleteParams {
    pub propagation: Option<Propagation>,
    /// Delete only if the object still has this uid.
    pub precondition_uid: Option<String>,
    /// Delete only if the object is still at this resourceVersion.
    pub precondition_resource_version: Option<u64>,
    /// Overrides the pod's `terminationGracePeriodSeconds`; 0 deletes at once.
    pub grace_period_seconds: Option<i64>,
}

/// Access to the API, in-process or remote. Objects travel as JSON `Value`s in their wire shape
/// (apiVersion, kind, metadata, spec, status); `typed` helpers convert to `k8s-openapi` types.
#[async_trait]
pub trait Client: Send + Sync + 'static {
    async fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError>;
    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError>;
    /// Every change after `resource_version`, in order; `ApiError::Expired` (as the first item or
    /// the call's error) when that revision is older than the retained history.
    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        resource_version: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError>;
    /// Creates `obj` (its `metadata.namespace` or `namespace` decides where).
    async fn create(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError>;
    /// Replaces the object named in `obj`; a `metadata.resourceVersion` in `obj` is a precondition.
    async fn update(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError>;
    /// Replaces only the status of the object named in `obj` (the `status` subresource).
    async fn update_status(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value)
    -> Result<Value, ApiError>;
    async fn patch(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch)
    -> Result<Value, ApiError>;
    /// Patches the status subresource.
    async fn patch_status(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch)
    -> Result<Value, ApiError>;
    /// Deletes an object. Returns the object as it stands after the call: `Some` while finalizers
    /// keep it (with `deletionTimestamp` set), `None` once it is gone.
    async fn delete(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, params: &DeleteParams)
    -> Result<Option<Value>, ApiError>;
    /// The `autoscaling/v1` Scale of an object whose kind serves the `scale` subresource
    /// (`spec.replicas`, `status.replicas`, `status.selector` in the string syntax).
    async fn get_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let _ = (namespace, name);
        Err(ApiError::MethodNotAllowed(format!("this client cannot read the scale of {}", res.plural)))
    }
    /// Writes `scale.spec.replicas` through the `scale` subresource; a `metadata.resourceVersion`
    /// in `scale` is a precondition. Returns the Scale as written.
    async fn update_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, scale: Value)
    -> Result<Value, ApiError> {
        let _ = (namespace, name, scale);
        Err(ApiError::MethodNotAllowed(format!("this client cannot write the scale of {}", res.plural)))
    }
    /// Binds a pod to a node through `pods/{name}/binding`.
    async fn bind_pod(&self, namespace: &str, name: &str, node_name: &str) -> Result<(), ApiError>;
    /// Asks for a token of ServiceAccount `name` (`serviceaccounts/{name}/token`, a TokenRequest).
    async fn create_token(&self, namespace: &str, name: &str, request: Value) -> Result<Value, ApiError> {
        let _ = (namespace, request);
        Err(ApiError::MethodNotAllowed(format!("this client cannot ask for tokens of service account {name}")))
    }
    /// The digest of the (key, resourceVersion) pairs a list with `params` held at `revision`
    /// (`shepherd_api::digest`); `ApiError::Expired` when that revision is older than the history.
    async fn digest(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        revision: u64,
        detail: DigestDetail,
    ) -> Result<ListDigest, ApiError> {
        let _ = (params, revision, detail);
        Err(ApiError::MethodNotAllowed(format!("this client cannot ask for digests of {}", res.plural)))
    }
}

/// Converts between wire JSON and `k8s-openapi` types.
pub mod typed {
    use serde::{Serialize, de::DeserializeOwned};
    use serde_json::Value;
    use shepherd_api::ApiError;

    pub fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
        serde_json::from_value(v).map_err(|e| ApiError::Internal(format!("decoding object: {e}")))
    }

    pub fn to_value<T: Serialize>(t: &T) -> Result<Value, ApiError> {
        serde_json::to_value(t).map_err(|e| ApiError::Internal(format!("encoding object: {e}")))
    }
}
