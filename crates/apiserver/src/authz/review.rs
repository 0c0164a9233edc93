//! Access reviews (`authorization.k8s.io/v1`): SubjectAccessReview, LocalSubjectAccessReview,
//! SelfSubjectAccessReview and SelfSubjectRulesReview, answered from the request and never stored.

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use shepherd_api::{ApiError, Cause};

use super::{Attributes, Authorizer, PolicyRule, status_response};
use crate::auth::UserInfo;
use crate::http::{AppState, error_response};

/// Answers a request to a review resource; `user` None: an unauthenticated listener, allowed everything.
pub(super) async fn answer(app: &AppState, user: Option<&UserInfo>, a: &Attributes, req: Request) -> Response {
    let accept = crate::protobuf::Accept::of(req.headers());
    let response = match review(app, user, a, req).await {
        Ok(body) => status_response(StatusCode::CREATED, &body),
        Err(e) => error_response(&e),
    };
    crate::protobuf::respond(accept, false, response).await
}

async fn review(app: &AppState, user: Option<&UserInfo>, a: &Attributes, req: Request) -> Result<Value, ApiError> {
    let kind = match a.resource.as_str() {
        "subjectaccessreviews" => "SubjectAccessReview",
        "localsubjectaccessreviews" => "LocalSubjectAccessReview",
        "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
        "selfsubjectrulesreviews" => "SelfSubjectRulesReview",
        _ => return Err(ApiError::resource_not_found()),
    };
    if *req.method() != Method::POST || !a.name.is_empty() {
        return Err(ApiError::MethodNotAllowed(format!(
            "{} is not allowed on {}: reviews are only created",
            req.method(),
            a.resource
        )));
    }
    let limit = app.config.max_body_bytes;
    let body = axum::body::to_bytes(req.into_body(), limit).await.map_err(|_| {
        ApiError::RequestEntityTooLarge(format!("request body is larger than the limit of {limit} bytes"))
    })?;
    let mut review: Value = if crate::protobuf::is_protobuf(&body) {
        crate::protobuf::decode(&body)
            .map_err(|e| ApiError::BadRequest(format!("malformed protobuf in request body: {e}")))?
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadRequest(format!("malformed JSON in request body: {e}")))?
    };
    if !review.is_object() {
        return Err(ApiError::BadRequest(format!("a {kind} must be a JSON object")));
    }
    let spec = review.get("spec").cloned().unwrap_or(json!({}));
    let invalid = |cause: Cause| ApiError::invalid(kind, "", vec![cause]);
    let status = match kind {
        "SelfSubjectRulesReview" => {
            let namespace = spec.get("namespace").and_then(Value::as_str).unwrap_or("");
            let rules = match user {
                Some(u) => app.authz.rules_for(u, namespace),
                None => vec![PolicyRule::resources(&["*"], &["*"], &["*"]), PolicyRule::urls(&["*"], &["*"])],
            };
            rules_status(&rules)
        }
        _ => {
            let subject = match kind {
                "SelfSubjectAccessReview" => user.cloned(),
                _ => Some(subject_of(&spec).ok_or_else(|| {
                    invalid(Cause::invalid(
                        "spec.user",
                        "Invalid value: \"\": at least one of user or group must be specified",
                    ))
                })?),
            };
            let asked = asked_attributes(&spec).ok_or_else(|| invalid(Cause::invalid("spec.resourceAttributes",
                "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified")))?;
            if kind == "LocalSubjectAccessReview" && asked.namespace != a.namespace {
                return Err(invalid(Cause::invalid(
                    "spec.resourceAttributes.namespace",
                    format!("Invalid value: {:?}: must match metadata.namespace", asked.namespace),
                )));
            }
            if subject.as_ref().is_some_and(|u| u.node_name().is_some()) {
                app.authz.follow_nodes().await;
            }
            access_status(&app.authz, subject.as_ref(), &asked)
        }
    };
    review["status"] = status;
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!(kind);
    if !review.get("metadata").is_some_and(Value::is_object) {
        review["metadata"] = json!({});
    }
    review["metadata"]["creationTimestamp"] = Value::Null;
    Ok(review)
}

/// The user a SubjectAccessReview asks about.
fn subject_of(spec: &Value) -> Option<UserInfo> {
    let name = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    if name.is_empty() && groups.is_empty() {
        return None;
    }
    // The groups are taken as given: a review asks about exactly that identity.
    Some(UserInfo {
        name: name.to_string(),
        uid: spec.get("uid").and_then(Value::as_str).unwrap_or("").to_string(),
        groups,
        ..UserInfo::default()
    })
}

fn asked_attributes(spec: &Value) -> Option<Attributes> {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match (
        spec.get("resourceAttributes").filter(|v| v.is_object()),
        spec.get("nonResourceAttributes").filter(|v| v.is_object()),
    ) {
        (Some(r), None) => Some(Attributes {
            verb: text(r, "verb"),
            resource_request: true,
            api_group: text(r, "group"),
            api_version: text(r, "version"),
            namespace: text(r, "namespace"),
            resource: text(r, "resource"),
            subresource: text(r, "subresource"),
            name: text(r, "name"),
            path: String::new(),
        }),
        (None, Some(n)) => Some(Attributes { verb: text(n, "verb"), path: text(n, "path"), ..Attributes::default() }),
        _ => None,
    }
}

fn access_status(authz: &Authorizer, user: Option<&UserInfo>, a: &Attributes) -> Value {
    let Some(user) = user else { return json!({"allowed": true}) };
    match authz.authorize(user, a) {
        Ok(()) => json!({"allowed": true, "reason": "allowed by RBAC"}),
        Err(reason) => {
            let mut s = json!({"allowed": false});
            if !reason.is_empty() {
                s["reason"] = json!(reason);
            }
            s
        }
    }
}

fn rules_status(rules: &[PolicyRule]) -> Value {
    let (urls, resources): (Vec<&PolicyRule>, Vec<&PolicyRule>) =
        rules.iter().partition(|r| !r.non_resource_urls.is_empty());
    let resource_rules: Vec<Value> = resources
        .iter()
        .map(|r| {
            let mut v = json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
            if !r.resource_names.is_empty() {
                v["resourceNames"] = json!(r.resource_names);
            }
            v
        })
        .collect();
    let url_rules: Vec<Value> =
        urls.iter().map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls})).collect();
    json!({"resourceRules": resource_rules, "nonResourceRules": url_rules, "incomplete": false})
}
