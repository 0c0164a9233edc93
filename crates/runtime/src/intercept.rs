//! A `Client` that passes every call to another one, showing each to an [`Interceptor`] first
//! (which may refuse or delay it) and its outcome after: fences, counters and fault gates are
//! interceptors, not hand-written delegating clients.

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde_json::Value;
use shepherd_api::digest::{DigestDetail, ListDigest};
use shepherd_api::{ApiError, ResourceInfo, kinds};

use crate::client::{Client, DeleteParams, ListParams, ObjectList, Patch, WatchEvent};

/// One call through a `Client`, as an interceptor sees it.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    Get { res: &'a ResourceInfo, namespace: Option<&'a str>, name: &'a str },
    List { res: &'a ResourceInfo, params: &'a ListParams },
    Watch { res: &'a ResourceInfo, params: &'a ListParams },
    Create { res: &'a ResourceInfo, namespace: Option<&'a str> },
    Update { res: &'a ResourceInfo, namespace: Option<&'a str> },
    UpdateStatus { res: &'a ResourceInfo, namespace: Option<&'a str> },
    Patch { res: &'a ResourceInfo, namespace: Option<&'a str>, name: &'a str },
    PatchStatus { res: &'a ResourceInfo, namespace: Option<&'a str>, name: &'a str },
    Delete { res: &'a ResourceInfo, namespace: Option<&'a str>, name: &'a str },
    GetScale { res: &'a ResourceInfo, namespace: Option<&'a str>, name: &'a str },
    UpdateScale { res: &'a ResourceInfo, namespace: Option<&'a str>, name: &'a str },
    Bind { namespace: &'a str, name: &'a str, node: &'a str },
    CreateToken { namespace: &'a str, name: &'a str },
    Digest { res: &'a ResourceInfo, params: &'a ListParams },
}

impl Call<'_> {
    /// The kind the call acts on (pods for a binding, service accounts for a token).
    pub fn resource(&self) -> &ResourceInfo {
        match *self {
            Call::Get { res, .. }
            | Call::List { res, .. }
            | Call::Watch { res, .. }
            | Call::Create { res, .. }
            | Call::Update { res, .. }
            | Call::UpdateStatus { res, .. }
            | Call::Patch { res, .. }
            | Call::PatchStatus { res, .. }
            | Call::Delete { res, .. }
            | Call::GetScale { res, .. }
            | Call::UpdateScale { res, .. }
            | Call::Digest { res, .. } => res,
            Call::Bind { .. } => &kinds::POD,
            Call::CreateToken { .. } => &kinds::SERVICEACCOUNT,
        }
    }

    /// The API verb, as RBAC names it.
    pub fn verb(&self) -> &'static str {
        match self {
            Call::Get { .. } | Call::GetScale { .. } => "get",
            Call::List { .. } | Call::Digest { .. } => "list",
            Call::Watch { .. } => "watch",
            Call::Create { .. } | Call::Bind { .. } | Call::CreateToken { .. } => "create",
            Call::Update { .. } | Call::UpdateStatus { .. } | Call::UpdateScale { .. } => "update",
            Call::Patch { .. } | Call::PatchStatus { .. } => "patch",
            Call::Delete { .. } => "delete",
        }
    }

    /// Whether the call changes anything stored.
    pub fn is_write(&self) -> bool {
        !matches!(self.verb(), "get" | "list" | "watch")
    }
}

/// What a call that succeeded returned.
#[derive(Debug, Clone, Copy)]
pub enum Reply<'a> {
    Object(&'a Value),
    List(&'a ObjectList),
    /// A delete: the object while finalizers keep it, `None` once gone.
    Deleted(Option<&'a Value>),
    /// A watch stream began, or a binding was made.
    Started,
    Digest(&'a ListDigest),
}

/// The results of `Client` calls, seen as a [`Reply`].
trait AsReply {
    fn as_reply(&self) -> Reply<'_>;
}

impl AsReply for Value {
    fn as_reply(&self) -> Reply<'_> {
        Reply::Object(self)
    }
}

impl AsReply for ObjectList {
    fn as_reply(&self) -> Reply<'_> {
        Reply::List(self)
    }
}

impl AsReply for Option<Value> {
    fn as_reply(&self) -> Reply<'_> {
        Reply::Deleted(self.as_ref())
    }
}

impl AsReply for () {
    fn as_reply(&self) -> Reply<'_> {
        Reply::Started
    }
}

impl AsReply for BoxStream<'static, Result<WatchEvent, ApiError>> {
    fn as_reply(&self) -> Reply<'_> {
        Reply::Started
    }
}

impl AsReply for ListDigest {
    fn as_reply(&self) -> Reply<'_> {
        Reply::Digest(self)
    }
}

/// Sees every call an [`Intercepted`] client makes.
#[async_trait]
pub trait Interceptor: Send + Sync + 'static {
    /// Before `call` is made; an error refuses it, and the call is not made.
    async fn before(&self, call: &Call<'_>) -> Result<(), ApiError> {
        let _ = call;
        Ok(())
    }

    /// After `call` was made, with what it returned.
    fn after(&self, call: &Call<'_>, outcome: Result<Reply<'_>, &ApiError>) {
        let _ = (call, outcome);
    }
}

/// `inner`, with every call shown to `interceptor`.
pub struct Intercepted<I> {
    inner: Arc<dyn Client>,
    interceptor: I,
}

impl<I: Interceptor> Intercepted<I> {
    pub fn new(inner: Arc<dyn Client>, interceptor: I) -> Self {
        Intercepted { inner, interceptor }
    }

    pub fn interceptor(&self) -> &I {
        &self.interceptor
    }

    /// Shows `call` to the interceptor, makes it with `make` unless refused, and reports the outcome.
    async fn through<T: AsReply>(&self, call: Call<'_>, make: impl Future<Output = Result<T, ApiError>>) -> Result<T, ApiError> {
        self.interceptor.before(&call).await?;
        let outcome = make.await;
        self.interceptor.after(&call, outcome.as_ref().map(AsReply::as_reply));
        outcome
    }
}

#[async_trait]
impl<I: Interceptor> Client for Intercepted<I> {
    async fn get(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let call = Call::Get { res, namespace, name };
        self.through(call, self.inner.get(res, namespace, name)).await
    }

    async fn list(&self, res: &ResourceInfo, params: &ListParams) -> Result<ObjectList, ApiError> {
        self.through(Call::List { res, params }, self.inner.list(res, params)).await
    }

    async fn watch(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        resource_version: u64,
    ) -> Result<BoxStream<'static, Result<WatchEvent, ApiError>>, ApiError> {
        let call = Call::Watch { res, params };
        self.through(call, self.inner.watch(res, params, resource_version)).await
    }

    async fn create(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.through(Call::Create { res, namespace }, self.inner.create(res, namespace, obj)).await
    }

    async fn update(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        self.through(Call::Update { res, namespace }, self.inner.update(res, namespace, obj)).await
    }

    async fn update_status(&self, res: &ResourceInfo, namespace: Option<&str>, obj: Value) -> Result<Value, ApiError> {
        let call = Call::UpdateStatus { res, namespace };
        self.through(call, self.inner.update_status(res, namespace, obj)).await
    }

    async fn patch(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, patch: Patch) -> Result<Value, ApiError> {
        let call = Call::Patch { res, namespace, name };
        self.through(call, self.inner.patch(res, namespace, name, patch)).await
    }

    async fn patch_status(
        &self,
        res: &ResourceInfo,
        namespace: Option<&str>,
        name: &str,
        patch: Patch,
    ) -> Result<Value, ApiError> {
        let call = Call::PatchStatus { res, namespace, name };
        self.through(call, self.inner.patch_status(res, namespace, name, patch)).await
    }

    async fn delete(
        &self,
        res: &ResourceInfo,
        namespace: Option<&str>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Option<Value>, ApiError> {
        let call = Call::Delete { res, namespace, name };
        self.through(call, self.inner.delete(res, namespace, name, params)).await
    }

    async fn get_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let call = Call::GetScale { res, namespace, name };
        self.through(call, self.inner.get_scale(res, namespace, name)).await
    }

    async fn update_scale(&self, res: &ResourceInfo, namespace: Option<&str>, name: &str, scale: Value) -> Result<Value, ApiError> {
        let call = Call::UpdateScale { res, namespace, name };
        self.through(call, self.inner.update_scale(res, namespace, name, scale)).await
    }

    async fn bind_pod(&self, namespace: &str, name: &str, node_name: &str) -> Result<(), ApiError> {
        let call = Call::Bind { namespace, name, node: node_name };
        self.through(call, self.inner.bind_pod(namespace, name, node_name)).await
    }

    async fn create_token(&self, namespace: &str, name: &str, request: Value) -> Result<Value, ApiError> {
        let call = Call::CreateToken { namespace, name };
        self.through(call, self.inner.create_token(namespace, name, request)).await
    }

    async fn digest(
        &self,
        res: &ResourceInfo,
        params: &ListParams,
        revision: u64,
        detail: DigestDetail,
    ) -> Result<ListDigest, ApiError> {
        let call = Call::Digest { res, params };
        self.through(call, self.inner.digest(res, params, revision, detail)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::testing::MemoryClient;

    /// Refuses writes to Secrets, and writes down every call it let through with its outcome.
    #[derive(Default)]
    struct Guard {
        seen: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Interceptor for Guard {
        async fn before(&self, call: &Call<'_>) -> Result<(), ApiError> {
            if call.is_write() && call.resource().kind == "Secret" {
                return Err(ApiError::Forbidden(format!("{} secrets refused", call.verb())));
            }
            Ok(())
        }

        fn after(&self, call: &Call<'_>, outcome: Result<Reply<'_>, &ApiError>) {
            let what = match outcome {
                Ok(Reply::List(list)) => format!("{} items", list.items.len()),
                Ok(_) => "ok".to_string(),
                Err(e) => format!("error {}", e.code()),
            };
            self.seen.lock().unwrap().push(format!("{} {}: {what}", call.verb(), call.resource().plural));
        }
    }

    fn named(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns"}})
    }

    #[tokio::test]
    async fn a_refused_call_is_never_made_and_every_call_made_is_reported_with_its_outcome() {
        let memory = Arc::new(MemoryClient::new());
        let client = Intercepted::new(memory.clone(), Guard::default());
        client.create(&kinds::CONFIGMAP, Some("ns"), named("a")).await.expect("a ConfigMap passes");
        let refused = client.create(&kinds::SECRET, Some("ns"), named("s")).await.expect_err("a Secret is refused");
        assert!(matches!(refused, ApiError::Forbidden(_)), "{refused:?}");
        assert!(memory.get(&kinds::SECRET, Some("ns"), "s").await.is_err(), "the refused create never reached the client");
        client.list(&kinds::CONFIGMAP, &ListParams::namespace("ns")).await.expect("list");
        client.get(&kinds::CONFIGMAP, Some("ns"), "missing").await.expect_err("not found");
        client.get(&kinds::SECRET, Some("ns"), "s").await.expect_err("reads of Secrets pass, and find nothing");
        let seen = client.interceptor().seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            ["create configmaps: ok", "list configmaps: 1 items", "get configmaps: error 404", "get secrets: error 404"]
        );
    }
}
