//! Kubernetes-shaped HTTP API over the Shepherd store: REST paths, verbs, watch, discovery,
//! Status errors, metrics; and the in-process client that controllers use.

mod acting_client;
mod apply;
mod audit;
pub mod auth;
pub mod authn;
pub mod authz;
mod autoscaling_v1;
pub mod bootstrap_token;
pub mod certificates;
mod client;
mod codec;
mod crd;
mod digest;
mod drain;
mod discovery;
mod eviction;
mod http;
mod metrics;
mod nodeport;
mod openapi;
mod patch;
pub mod pki;
mod protobuf;
mod ratelimit;
mod reservation;
mod resource_metrics;
mod retention;
mod scale;
mod serve;
mod service;
pub mod serviceaccount;
mod stream_proxy;
pub use stream_proxy::CHANNELS_FIRST_BYTES_HOLD;
mod table;
mod watch;
mod watch_hub;
mod watch_socket;
mod write_options;

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use shepherd_store::Store;

pub use audit::{AuditConfig, AuditLog, Level as AuditLevel, PeerAddr, Policy as AuditPolicy};
pub use acting_client::ActingClient;
pub use client::LocalClient;
pub use http::{HttpConfig, LogSource};
pub use metrics::Metrics;
pub use nodeport::{InvalidNodePortRange, NodePortRange};
pub use ratelimit::{RateLimit, UserRateLimiter};
pub use retention::register_retention;
pub use serve::{ConnectionLimits, ConnectionMetrics, serve, serve_tls};
pub use service::{
    ApiService, DeleteOptions, Deleted, ListOptions, Part, PatchType, RevisionMatch, SYSTEM_NAMESPACES, Written,
};
pub use table::{human_age, pod_status};
pub use watch::{WatchOptions, WireEvent};
pub use write_options::{
    AGENT_FIELD_MANAGER, CONTROLLER_MANAGER_FIELD_MANAGER, FieldValidation, SCHEDULER_FIELD_MANAGER, WriteOptions,
};

/// The API server: the object service, its metrics registry and the HTTP router over them.
#[derive(Clone)]
pub struct ApiServer {
    service: ApiService,
    registry: Arc<Mutex<Registry>>,
    config: Arc<HttpConfig>,
    logs: Option<Arc<dyn LogSource>>,
    node_token: Option<Arc<str>>,
    authz: authz::Authorizer,
}

impl ApiServer {
    /// Builds a server over `store`, creating the system namespaces and the default RBAC roles if they
    /// are missing.
    pub async fn new(store: Arc<dyn Store>, mut config: HttpConfig) -> Result<Self, shepherd_api::ApiError> {
        if config.authenticator.is_none()
            && let Some(token) = &config.token
        {
            let authn = authn::Authenticator::new(&[], vec![authn::admin_token(token)])
                .map_err(|e| shepherd_api::ApiError::Internal(e.to_string()))?;
            config.authenticator = Some(Arc::new(authn));
        }
        let metrics = Arc::new(Metrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        if let Some(audit) = &config.audit {
            audit.register(&mut registry);
        }
        if let Some(limiter) = &config.rate_limiter {
            limiter.register(&mut registry);
        }
        let service = ApiService::new(store, metrics);
        service.ensure_system_namespaces().await?;
        crd::load(&service).await?;
        authz::reconcile_default_roles(&service).await?;
        let authz = authz::Authorizer::start(service.store().clone()).await?;
        Ok(ApiServer {
            service,
            registry: Arc::new(Mutex::new(registry)),
            config: Arc::new(config),
            logs: None,
            node_token: None,
            authz,
        })
    }

    /// Decides authenticated requests (RBAC and node restriction).
    pub fn authorizer(&self) -> &authz::Authorizer {
        &self.authz
    }

    pub fn service(&self) -> &ApiService {
        &self.service
    }

    /// Allocates Services' node ports from `range` (30000-32767 by default).
    pub fn with_node_port_range(mut self, range: NodePortRange) -> Self {
        self.service.set_node_port_range(range);
        self
    }

    /// Issues ServiceAccount tokens (TokenRequest), accepts them as credentials, and mounts them into
    /// new pods.
    pub fn with_service_account_tokens(mut self, tokens: serviceaccount::ServiceAccountTokens) -> Self {
        self.service.service_account_tokens = Some(Arc::new(tokens));
        self
    }

    /// A client that calls the service directly, with the same validation as HTTP.
    pub fn client(&self) -> LocalClient {
        LocalClient::new(self.service.clone())
    }

    /// A client that calls the service directly as `user`: authorized and admitted like that
    /// user's requests over HTTP.
    pub async fn client_as(&self, user: auth::UserInfo) -> ActingClient {
        ActingClient::new(self.client(), user, self.authz.clone()).await
    }

    /// The metrics registry, for other components to register theirs into `/metrics`.
    pub fn registry(&self) -> Arc<Mutex<Registry>> {
        self.registry.clone()
    }

    /// Serves pod logs through `GET .../pods/{name}/log`.
    pub fn with_logs(mut self, logs: Arc<dyn LogSource>) -> Self {
        self.logs = Some(logs);
        self
    }

    /// Hands `pods/exec`, `pods/attach` and `pods/portforward` to the streaming endpoints of node
    /// agents, which require `token`.
    pub fn with_node_streaming(mut self, token: impl Into<Arc<str>>) -> Self {
        self.node_token = Some(token.into());
        self
    }

    /// The HTTP routes.
    pub fn router(&self) -> axum::Router {
        self.router_with(axum::Router::new())
    }

    /// The HTTP routes and `extra` ones (debug endpoints), all behind the same bearer token and
    /// the same panic handling.
    pub fn router_with(&self, extra: axum::Router) -> axum::Router {
        http::router(
            http::AppState {
                svc: self.service.clone(),
                registry: self.registry.clone(),
                config: self.config.clone(),
                logs: self.logs.clone(),
                node_token: self.node_token.clone(),
                authz: self.authz.clone(),
            },
            extra,
        )
    }
}
