//! Authorization: every authenticated request is allowed by the node authorizer or by RBAC, or refused with
//! Kubernetes' 403; writes of RBAC objects and by nodes pass escalation and node-restriction admission.
//!
//! The roles, bindings and pods are indexed in memory and kept current by watching the store, so a
//! decision reads no object. Requests without a [`UserInfo`] came through an unauthenticated listener
//! and are not subject to authorization.

mod bootstrap;
mod node;
mod rbac;
mod request_info;
mod review;

use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use shepherd_api::ApiError;
use shepherd_store::{EventKind, Store};

use crate::auth::{MASTERS_GROUP, UserInfo};
use crate::http::AppState;
pub use bootstrap::reconcile_default_roles;
pub use rbac::PolicyRule;
use rbac::RbacIndex;
pub use request_info::Attributes;

const RBAC_PREFIX: &str = "/registry/rbac.authorization.k8s.io/";
const PODS_PREFIX: &str = "/registry/core/pods/";

/// Decides requests from the RBAC objects and the pods' placement, as the store holds them.
#[derive(Clone, Default)]
pub struct Authorizer {
    rbac: Arc<RwLock<RbacIndex>>,
    graph: Arc<RwLock<node::NodeGraph>>,
    store: Option<Arc<dyn Store>>,
    /// Set once the pods are loaded into `graph` and followed. That happens on the first request of
    /// a node, so that a server no node talks to as itself (tests, benchmarks, unauthenticated
    /// listeners) decodes no pod for it.
    graph_followed: Arc<tokio::sync::OnceCell<()>>,
}

impl Authorizer {
    /// Loads the RBAC objects from `store` and follows their changes from then on.
    pub async fn start(store: Arc<dyn Store>) -> Result<Authorizer, ApiError> {
        let authz = Authorizer { store: Some(store.clone()), ..Authorizer::default() };
        let revision = authz.load(&store, RBAC_PREFIX).await?;
        let follower = authz.clone();
        tokio::spawn(async move { follower.follow(store, RBAC_PREFIX, revision).await });
        Ok(authz)
    }

    /// Loads and follows the pods' placement, once; what deciding for a node needs.
    pub async fn follow_nodes(&self) {
        let Some(store) = &self.store else { return };
        self.graph_followed
            .get_or_init(|| async {
                let revision = self.reload(store, PODS_PREFIX).await;
                let (follower, store) = (self.clone(), store.clone());
                tokio::spawn(async move { follower.follow(store, PODS_PREFIX, revision).await });
            })
            .await;
    }

    fn take(&self, key: &str, value: Option<&Value>) {
        if let Some(rest) = key.strip_prefix(RBAC_PREFIX) {
            let kind = rest.split('/').next().unwrap_or("");
            self.rbac.write().unwrap_or_else(|e| e.into_inner()).apply(key, kind, value);
        } else {
            self.graph.write().unwrap_or_else(|e| e.into_inner()).apply(key, value);
        }
    }

    /// Reads everything under `prefix`; returns the revision it was read at.
    async fn load(&self, store: &Arc<dyn Store>, prefix: &str) -> Result<u64, ApiError> {
        let mut after: Option<String> = None;
        let mut revision = 0;
        loop {
            let page = store
                .list(prefix, after.as_deref(), Some(1000))
                .await
                .map_err(|e| ApiError::Internal(format!("reading {prefix} for authorization: {e}")))?;
            revision = if revision == 0 { page.revision } else { revision.min(page.revision) };
            for kv in &page.items {
                match crate::codec::decode(kv) {
                    Ok(v) => self.take(&kv.key, Some(&v)),
                    Err(e) => tracing::warn!(key = %kv.key, error = %e, "unreadable object skipped by authorization"),
                }
            }
            after = page.items.last().map(|kv| kv.key.clone());
            if !page.more || after.is_none() {
                return Ok(revision);
            }
        }
    }

    /// Applies every change under `prefix` after `revision`; re-reads everything when the history no
    /// longer reaches back to the last change applied.
    async fn follow(self, store: Arc<dyn Store>, prefix: &'static str, mut revision: u64) {
        loop {
            let mut events = match store.watch(prefix, revision).await {
                Ok(events) => events,
                Err(shepherd_store::StoreError::Closed) => return,
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "authorization index re-reads the store");
                    revision = self.reload(&store, prefix).await;
                    continue;
                }
            };
            while let Some(event) = events.next().await {
                match event {
                    Ok(e) => {
                        revision = e.revision();
                        let value = match e.kind {
                            EventKind::Deleted => None,
                            _ => crate::codec::decode(&e.kv).ok(),
                        };
                        self.take(&e.kv.key, value.as_ref());
                    }
                    Err(shepherd_store::StoreError::Closed) => return,
                    Err(e) => {
                        tracing::warn!(prefix, error = %e, "authorization watch broke; watching again");
                        break;
                    }
                }
            }
            // Resumes after the last change applied; a revision no longer in the history re-reads.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    async fn reload(&self, store: &Arc<dyn Store>, prefix: &str) -> u64 {
        loop {
            let fresh = Authorizer::default();
            match fresh.load(store, prefix).await {
                Ok(revision) => {
                    if prefix == RBAC_PREFIX {
                        let index = std::mem::take(&mut *fresh.rbac.write().unwrap_or_else(|e| e.into_inner()));
                        *self.rbac.write().unwrap_or_else(|e| e.into_inner()) = index;
                    } else {
                        let graph = std::mem::take(&mut *fresh.graph.write().unwrap_or_else(|e| e.into_inner()));
                        *self.graph.write().unwrap_or_else(|e| e.into_inner()) = graph;
                    }
                    return revision;
                }
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "authorization index cannot read the store; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// `Ok` when `user` may do `a`; otherwise the reason (empty when no authorizer has one).
    pub fn authorize(&self, user: &UserInfo, a: &Attributes) -> Result<(), String> {
        if user.in_group(MASTERS_GROUP) {
            return Ok(());
        }
        let mut reason = String::new();
        if let Some(node) = user.node_name() {
            match node::authorize(node, &self.graph.read().unwrap_or_else(|e| e.into_inner()), a) {
                Ok(()) => return Ok(()),
                Err(r) => reason = r,
            }
        }
        if self.rbac.read().unwrap_or_else(|e| e.into_inner()).allows(user, a) {
            return Ok(());
        }
        Err(reason)
    }

    /// [`Authorizer::authorize`] with the refusal as the API's 403 error, for in-process clients.
    pub(crate) fn check(&self, user: &UserInfo, a: &Attributes) -> Result<(), ApiError> {
        self.authorize(user, a).map_err(|reason| {
            let mut why = forbidden_message(&user.name, a);
            if !reason.is_empty() {
                why = format!("{why}: {reason}");
            }
            let status = forbidden_status(&a.api_group, &a.resource, &a.name, &why);
            ApiError::Forbidden(status["message"].as_str().unwrap_or("forbidden").to_string())
        })
    }

    /// Every rule `user` holds in `namespace`: what `kubectl auth can-i --list` shows.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        if user.in_group(MASTERS_GROUP) {
            return vec![PolicyRule::resources(&["*"], &["*"], &["*"]), PolicyRule::urls(&["*"], &["*"])];
        }
        let mut rules = self.rbac.read().unwrap_or_else(|e| e.into_inner()).rules_for(user, namespace);
        if user.node_name().is_some() {
            rules.extend(node::node_rules());
        }
        rules
    }

    /// The number of bindings indexed.
    pub fn binding_count(&self) -> usize {
        self.rbac.read().unwrap_or_else(|e| e.into_inner()).binding_count()
    }
}

/// Kubernetes' forbidden message for a request: `User "bob" cannot delete resource "pods" in API group ""
/// in the namespace "default"`.
fn forbidden_message(user: &str, a: &Attributes) -> String {
    if !a.resource_request {
        return format!("User {user:?} cannot {} path {:?}", a.verb, a.path);
    }
    let resource = a.resource_with_subresource();
    match a.namespace.as_str() {
        "" => format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.verb, a.api_group
        ),
        ns => format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {ns:?}",
            a.verb, a.api_group
        ),
    }
}

/// The 403 `Status` of a refused request, with the details kubectl reads.
fn forbidden_status(group: &str, resource: &str, name: &str, why: &str) -> Value {
    let qualified = if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    let message = match (qualified.as_str(), name) {
        ("", _) => format!("forbidden: {why}"),
        (q, "") => format!("{q} is forbidden: {why}"),
        (q, n) => format!("{q} {n:?} is forbidden: {why}"),
    };
    let mut details = serde_json::Map::new();
    for (k, v) in [("name", name), ("group", group), ("kind", resource)] {
        if !v.is_empty() {
            details.insert(k.into(), json!(v));
        }
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
        "reason": "Forbidden", "details": details, "code": 403})
}

fn status_response(code: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(axum::body::Body::from(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn forbidden(user: &UserInfo, a: &Attributes, reason: &str) -> Response {
    let mut why = forbidden_message(&user.name, a);
    if !reason.is_empty() {
        why = format!("{why}: {reason}");
    }
    let resource = if a.resource_request { a.resource.as_str() } else { "" };
    status_response(StatusCode::FORBIDDEN, &forbidden_status(&a.api_group, resource, &a.name, &why))
}

/// Who makes the request being served, for the admission checks inside the object service.
#[derive(Clone)]
struct Requester {
    user: UserInfo,
    authz: Authorizer,
}

tokio::task_local! {
    static REQUESTER: Requester;
}

/// `f` of the name of the user the request being served comes from; `None` outside a request.
pub(crate) fn requester_name<T>(f: impl FnOnce(&str) -> T) -> Option<T> {
    REQUESTER.try_with(|r| f(&r.user.name)).ok()
}

/// Runs `call` as `user`: the admission checks inside the object service apply to its writes, as
/// they do to an HTTP request of that user.
pub(crate) async fn acting_as<F: Future>(user: UserInfo, authz: Authorizer, call: F) -> F::Output {
    REQUESTER.scope(Requester { user, authz }, call).await
}

/// The middleware: impersonation, then the decision, then the access reviews (answered here, never
/// stored); the handlers run knowing the requester, for [`admit`].
pub(crate) async fn authorize(State(app): State<AppState>, mut req: Request, next: axum::middleware::Next) -> Response {
    // Unauthenticated listeners' requests skip even the parsing, unless they ask for a review.
    let anonymous_listener = req.extensions().get::<UserInfo>().is_none()
        && !req.headers().contains_key("impersonate-user")
        && !req.uri().path().starts_with("/apis/authorization.k8s.io/");
    if anonymous_listener {
        return next.run(req).await;
    }
    let started = std::time::Instant::now();
    // The audit log has read them already when it records this request.
    let attrs = match req.extensions().get::<Arc<Attributes>>() {
        Some(attrs) => attrs.clone(),
        None => Arc::new(Attributes::of(req.method(), req.uri().path(), req.uri().query())),
    };
    let user = match impersonate(&app.authz, &mut req) {
        Ok(user) => user,
        Err(r) => return *r,
    };
    if user.as_ref().is_some_and(|u| u.node_name().is_some()) {
        app.authz.follow_nodes().await;
    }
    let decision = user.as_ref().map_or(Ok(()), |user| app.authz.authorize(user, &attrs));
    app.svc.metrics.authorization_duration.observe(started.elapsed().as_secs_f64());
    if let Some(user) = &user
        && let Err(reason) = decision
    {
        if attrs.resource_request {
            // Counted as the handlers count what they answer (`apiserver_request_total`).
            let verb = match attrs.verb.as_str() {
                "create" => "POST",
                "update" => "PUT",
                other => &other.to_ascii_uppercase(),
            };
            app.svc.metrics.observe_request(verb, &attrs.resource_with_subresource(), 403, std::time::Instant::now());
        }
        return forbidden(user, &attrs, &reason);
    }
    if attrs.resource_request && attrs.api_group == "authorization.k8s.io" && attrs.subresource.is_empty() {
        return review::answer(&app, user.as_ref(), &attrs, req).await;
    }
    match user {
        Some(user) => REQUESTER.scope(Requester { user, authz: app.authz.clone() }, next.run(req)).await,
        None => next.run(req).await,
    }
}

/// Applies `Impersonate-User` / `Impersonate-Group`: the request goes on as that user if the requester
/// may `impersonate` it and each group. A request without an identity (an unauthenticated listener,
/// allowed everything) may impersonate anyone: that is how `kubectl --as` tries a user's view there.
fn impersonate(authz: &Authorizer, req: &mut Request) -> Result<Option<UserInfo>, Box<Response>> {
    let requester = req.extensions().get::<UserInfo>().cloned();
    let headers = req.headers();
    let Some(target) = headers.get("impersonate-user") else {
        if headers.contains_key("impersonate-group") {
            let e = ApiError::BadRequest("requested Impersonate-Group without Impersonate-User".into());
            return Err(Box::new(crate::http::error_response(&e)));
        }
        return Ok(requester);
    };
    let Ok(target) = target.to_str().map(str::to_string) else {
        let e = ApiError::BadRequest("Impersonate-User is not valid text".into());
        return Err(Box::new(crate::http::error_response(&e)));
    };
    let groups: Vec<String> =
        headers.get_all("impersonate-group").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    if let Some(requester) = &requester {
        let mut checks: Vec<Attributes> = Vec::new();
        let check = |resource: &str, namespace: &str, name: &str| Attributes {
            verb: "impersonate".into(),
            resource_request: true,
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Attributes::default()
        };
        match target.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
            Some((ns, name)) => checks.push(check("serviceaccounts", ns, name)),
            None => checks.push(check("users", "", &target)),
        }
        checks.extend(groups.iter().map(|g| check("groups", "", g)));
        for a in &checks {
            if let Err(reason) = authz.authorize(requester, a) {
                return Err(Box::new(forbidden(requester, a, &reason)));
            }
        }
    }
    let mut user = UserInfo::new(target.clone(), groups);
    if let Some((ns, _)) = target.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
        for g in ["system:serviceaccounts".to_string(), format!("system:serviceaccounts:{ns}")] {
            if !user.in_group(&g) {
                user.groups.push(g);
            }
        }
    }
    req.extensions_mut().insert(user.clone());
    Ok(Some(user))
}

/// Admission of a write by the current requester, called by the object service before it stores `new`
/// (`old`: the stored object of an update): escalation prevention for RBAC objects and node
/// restriction. Writes outside an authorized request (in-process components, unauthenticated
/// listeners) are not checked.
pub(crate) fn admit(res: &shepherd_api::ResourceInfo, old: Option<&Value>, new: &Value) -> Result<(), ApiError> {
    let Ok(requester) = REQUESTER.try_with(Requester::clone) else { return Ok(()) };
    let user = &requester.user;
    if user.in_group(MASTERS_GROUP) {
        return Ok(());
    }
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let refused = |why: String| {
        let status = forbidden_status(res.group, res.plural, name, &why);
        ApiError::Forbidden(status["message"].as_str().unwrap_or("forbidden").to_string())
    };
    if let Some(node) = user.node_name() {
        node::admit(node, res.kind, old, new).map_err(refused)?;
    }
    if res.group == "certificates.k8s.io" {
        if old.is_none() {
            crate::certificates::admit_requester(new, user).map_err(refused)?;
        }
        return crate::certificates::admit_decision(old, new, |signer| {
            let a = Attributes {
                verb: "approve".into(),
                resource_request: true,
                api_group: "certificates.k8s.io".into(),
                resource: "signers".into(),
                name: signer.into(),
                ..Attributes::default()
            };
            requester.authz.authorize(user, &a).is_ok()
        })
        .map_err(refused);
    }
    if res.group != "rbac.authorization.k8s.io" {
        return Ok(());
    }
    let namespace =
        if res.namespaced { new.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("") } else { "" };
    let may = |verb: &str, resource: &str, name: &str| {
        let a = Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: "rbac.authorization.k8s.io".into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Attributes::default()
        };
        requester.authz.authorize(user, &a).is_ok()
    };
    let index = || requester.authz.rbac.read().unwrap_or_else(|e| e.into_inner());
    // An update that leaves what is granted alone (labels, annotations, finalizers) grants nothing.
    let same = |fields: &[&str]| old.is_some_and(|o| fields.iter().all(|f| o.get(*f) == new.get(*f)));
    let wanted: Vec<PolicyRule> = match res.kind {
        "Role" | "ClusterRole" => {
            if same(&["rules", "aggregationRule"]) || may("escalate", res.plural, name) {
                return Ok(());
            }
            let rules: Vec<PolicyRule> =
                new.get("rules").and_then(Value::as_array).into_iter().flatten().map(PolicyRule::from_json).collect();
            // An aggregation rule can gather anything: it takes holding everything.
            let aggregating = new.get("aggregationRule").is_some_and(|a| !a.is_null());
            if aggregating && old.and_then(|o| o.get("aggregationRule")) != new.get("aggregationRule") {
                let everything = [PolicyRule::resources(&["*"], &["*"], &["*"]), PolicyRule::urls(&["*"], &["*"])];
                if !index().not_held(user, namespace, &everything).is_empty() {
                    return Err(refused("must have cluster-admin privileges to use the aggregationRule".into()));
                }
            }
            rules
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let field =
                |k: &str| new.pointer(&format!("/roleRef/{k}")).and_then(Value::as_str).unwrap_or("").to_string();
            let (role_kind, role_name) = (field("kind"), field("name"));
            let role_resource = if role_kind == "Role" { "roles" } else { "clusterroles" };
            if same(&["roleRef", "subjects"]) || may("bind", role_resource, &role_name) {
                return Ok(());
            }
            let scope = res.namespaced.then_some(namespace);
            let rules = index().role_rules(&role_kind, &role_name, scope);
            match rules {
                Some(rules) => rules.to_vec(),
                None => {
                    return Err(refused(format!(
                        "{}.rbac.authorization.k8s.io {:?} not found",
                        role_resource, role_name
                    )));
                }
            }
        }
        _ => return Ok(()),
    };
    let missing = index().not_held(user, namespace, &wanted);
    if missing.is_empty() {
        return Ok(());
    }
    let groups: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
    let listed: Vec<String> = missing.iter().map(PolicyRule::compact).collect();
    Err(refused(format!(
        "user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        groups.join(" "),
        listed.join("\n")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn forbidden_messages_read_as_kubernetes_writes_them() {
        let a = Attributes::of(&Method::DELETE, "/api/v1/namespaces/default/pods/x", None);
        let s = forbidden_status(&a.api_group, &a.resource, &a.name, &forbidden_message("bob", &a));
        assert_eq!(
            s["message"],
            "pods \"x\" is forbidden: User \"bob\" cannot delete resource \"pods\" in API group \"\" \
            in the namespace \"default\""
        );
        assert_eq!(s["details"], json!({"name": "x", "kind": "pods"}));
        let a = Attributes::of(&Method::GET, "/apis/apps/v1/deployments", None);
        let s = forbidden_status(&a.api_group, &a.resource, &a.name, &forbidden_message("bob", &a));
        assert_eq!(
            s["message"],
            "deployments.apps is forbidden: User \"bob\" cannot list resource \"deployments\" in API \
            group \"apps\" at the cluster scope"
        );
        let a = Attributes::of(&Method::GET, "/metrics", None);
        let s = forbidden_status("", "", "", &forbidden_message("bob", &a));
        assert_eq!(s["message"], "forbidden: User \"bob\" cannot get path \"/metrics\"");
    }
}
