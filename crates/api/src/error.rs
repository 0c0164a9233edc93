//! API errors, rendered as Kubernetes `Status` objects.

use serde_json::{Value, json};

/// One invalid field of an object, as listed in `Status.details.causes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// Kubernetes cause type: `FieldValueRequired`, `FieldValueInvalid`, `FieldValueNotSupported`,
    /// `FieldValueForbidden`, `FieldValueDuplicate`, `FieldValueTooLong`.
    pub reason: &'static str,
    /// JSON path of the field, dotted: `spec.template.spec.containers[0].image`.
    pub field: String,
    pub message: String,
}

impl Cause {
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause { reason, field: field.into(), message: message.into() }
    }
    pub fn required(field: impl Into<String>) -> Self {
        Cause::new("FieldValueRequired", field, "Required value")
    }
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause::new("FieldValueInvalid", field, message)
    }
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause::new("FieldValueForbidden", field, message)
    }
    pub fn not_supported(field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause::new("FieldValueNotSupported", field, message)
    }
}

/// What an API call can fail with; each variant maps to one HTTP code and `Status.reason`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    NotFound { kind: String, name: String, message: String },
    #[error("{message}")]
    AlreadyExists { kind: String, name: String, message: String },
    #[error("{message}")]
    Conflict { kind: String, name: String, message: String },
    #[error("{message}")]
    Invalid { kind: String, name: String, message: String, causes: Vec<Cause> },
    /// 409 from server-side apply: each cause names a field another manager owns
    /// (`FieldManagerConflict`), as Kubernetes answers it.
    #[error("{message}")]
    ApplyConflict { message: String, causes: Vec<Cause> },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Expired(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    RequestEntityTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    NotAcceptable(String),
    #[error("{0}")]
    Forbidden(String),
    /// 429: the request is refused for now; `causes` say why (an eviction blocked by a disruption budget).
    #[error("{message}")]
    TooManyRequests { message: String, causes: Vec<Cause> },
    #[error("{0}")]
    ServiceUnavailable(String),
    #[error("{0}")]
    Internal(String),
    /// A read asked for a revision the store has not reached (Kubernetes: 504 `Timeout` with
    /// the cause `ResourceVersionTooLarge`, which clients such as reflectors recognise).
    #[error("Too large resource version: {requested}, current: {current}")]
    ResourceVersionTooLarge { requested: u64, current: u64 },
}

impl ApiError {
    /// `pods "web-0" not found`, the way Kubernetes phrases it.
    pub fn not_found(plural: &str, name: &str) -> Self {
        ApiError::NotFound { kind: plural.into(), name: name.into(), message: format!("{plural} \"{name}\" not found") }
    }
    pub fn already_exists(plural: &str, name: &str) -> Self {
        ApiError::AlreadyExists {
            kind: plural.into(),
            name: name.into(),
            message: format!("{plural} \"{name}\" already exists"),
        }
    }
    /// What Kubernetes answers for a path it does not serve (an unknown group, version or
    /// resource): no kind or name in the details.
    pub fn resource_not_found() -> Self {
        ApiError::NotFound {
            kind: String::new(),
            name: String::new(),
            message: "the server could not find the requested resource".into(),
        }
    }
    pub fn conflict(plural: &str, name: &str, why: &str) -> Self {
        ApiError::Conflict {
            kind: plural.into(),
            name: name.into(),
            message: format!("Operation cannot be fulfilled on {plural} \"{name}\": {why}"),
        }
    }
    /// `Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: must be >= 0`.
    pub fn invalid(kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let details: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        ApiError::Invalid {
            kind: kind.into(),
            name: name.into(),
            message: format!("{kind} \"{name}\" is invalid: {}", details.join(", ")),
            causes,
        }
    }

    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => 409,
            ApiError::Invalid { .. } => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::Expired(_) => 410,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::RequestEntityTooLarge(_) => 413,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::NotAcceptable(_) => 406,
            ApiError::Forbidden(_) => 403,
            ApiError::TooManyRequests { .. } => 429,
            ApiError::ServiceUnavailable(_) => 503,
            ApiError::Internal(_) => 500,
            ApiError::ResourceVersionTooLarge { .. } => 504,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } | ApiError::ApplyConflict { .. } => "Conflict",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Expired(_) => "Expired",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowed",
            ApiError::RequestEntityTooLarge(_) => "RequestEntityTooLarge",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            ApiError::NotAcceptable(_) => "NotAcceptable",
            ApiError::Forbidden(_) => "Forbidden",
            ApiError::TooManyRequests { .. } => "TooManyRequests",
            ApiError::ServiceUnavailable(_) => "ServiceUnavailable",
            ApiError::Internal(_) => "InternalError",
            ApiError::ResourceVersionTooLarge { .. } => "Timeout",
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::NotFound { .. })
    }
    pub fn is_conflict(&self) -> bool {
        matches!(self, ApiError::Conflict { .. } | ApiError::ApplyConflict { .. })
    }
    pub fn is_already_exists(&self) -> bool {
        matches!(self, ApiError::AlreadyExists { .. })
    }

    /// The `Status` object (`kind: Status`, `status: Failure`) a client receives.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let details = match self {
            ApiError::NotFound { kind, name, .. }
            | ApiError::AlreadyExists { kind, name, .. }
            | ApiError::Conflict { kind, name, .. } => Some(details(kind, name)),
            ApiError::Invalid { kind, name, causes, .. } => {
                let mut d = details(kind, name);
                d["causes"] = causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect();
                Some(d)
            }
            ApiError::ResourceVersionTooLarge { .. } => Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            })),
            ApiError::ApplyConflict { causes, .. } => Some(json!({
                "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect::<Vec<_>>(),
            })),
            ApiError::TooManyRequests { causes, .. } => Some(json!({
                "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message})).collect::<Vec<_>>(),
            })),
            _ => None,
        };
        if let Some(d) = details {
            status["details"] = d;
        }
        status
    }

    /// Rebuilds an error from a `Status` object received from a server.
    pub fn from_status(status: &Value) -> Self {
        let message = status.get("message").and_then(Value::as_str).unwrap_or("unknown error").to_string();
        let details = status.get("details");
        let field = |k: &str| details.and_then(|d| d.get(k)).and_then(Value::as_str).unwrap_or("").to_string();
        let group = field("group");
        let kind = if group.is_empty() { field("kind") } else { format!("{}.{group}", field("kind")) };
        match status.get("reason").and_then(Value::as_str).unwrap_or("") {
            "NotFound" => ApiError::NotFound { kind, name: field("name"), message },
            "AlreadyExists" => ApiError::AlreadyExists { kind, name: field("name"), message },
            "Conflict" if !causes_of(details).is_empty() => ApiError::ApplyConflict { message, causes: causes_of(details) },
            "Conflict" => ApiError::Conflict { kind, name: field("name"), message },
            "Invalid" => ApiError::Invalid { kind, name: field("name"), message, causes: causes_of(details) },
            "BadRequest" => ApiError::BadRequest(message),
            "Expired" | "Gone" => ApiError::Expired(message),
            "MethodNotAllowed" => ApiError::MethodNotAllowed(message),
            "RequestEntityTooLarge" => ApiError::RequestEntityTooLarge(message),
            "Forbidden" => ApiError::Forbidden(message),
            "TooManyRequests" => ApiError::TooManyRequests { message, causes: causes_of(details) },
            "ServiceUnavailable" => ApiError::ServiceUnavailable(message),
            _ => ApiError::Internal(message),
        }
    }
}

/// `Status.details` as Kubernetes writes them: the qualified name an error carries
/// (`deployments.apps`, `Deployment.apps`) split into `kind` and `group`, empty fields left out.
fn details(qualified: &str, name: &str) -> Value {
    let (kind, group) = qualified.split_once('.').unwrap_or((qualified, ""));
    let mut d = serde_json::Map::new();
    for (key, value) in [("name", name), ("group", group), ("kind", kind)] {
        if !value.is_empty() {
            d.insert(key.into(), json!(value));
        }
    }
    Value::Object(d)
}

/// The `details.causes` of a received `Status`.
fn causes_of(details: Option<&Value>) -> Vec<Cause> {
    let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    details
        .and_then(|d| d.get("causes"))
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| Cause {
                    reason: cause_reason(c.get("reason").and_then(Value::as_str).unwrap_or("")),
                    field: text(c, "field"),
                    message: text(c, "message"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn cause_reason(r: &str) -> &'static str {
    match r {
        "FieldValueRequired" => "FieldValueRequired",
        "FieldValueNotSupported" => "FieldValueNotSupported",
        "FieldValueForbidden" => "FieldValueForbidden",
        "FieldValueDuplicate" => "FieldValueDuplicate",
        "FieldValueTooLong" => "FieldValueTooLong",
        "DisruptionBudget" => "DisruptionBudget",
        "FieldManagerConflict" => "FieldManagerConflict",
        _ => "FieldValueInvalid",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_status_names_every_field() {
        let e = ApiError::invalid("Deployment", "web", vec![Cause::invalid("spec.replicas", "must be >= 0")]);
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["reason"], "Invalid");
        assert_eq!(s["details"]["causes"][0]["field"], "spec.replicas");
        assert_eq!(ApiError::from_status(&s), e);
    }

    #[test]
    fn details_name_the_resource_and_its_group_separately_as_kubernetes_does() {
        let e = ApiError::conflict("deployments.apps", "web", "the object has been modified");
        let s = e.to_status();
        assert_eq!(s["details"], json!({"name": "web", "group": "apps", "kind": "deployments"}));
        assert!(s["message"].as_str().unwrap().contains("deployments.apps \"web\""));
        assert_eq!(ApiError::from_status(&s), e);
        let lease = ApiError::not_found("leases.coordination.k8s.io", "l").to_status();
        assert_eq!(lease["details"], json!({"name": "l", "group": "coordination.k8s.io", "kind": "leases"}));
        assert_eq!(ApiError::not_found("pods", "p").to_status()["details"], json!({"name": "p", "kind": "pods"}));
        let invalid = ApiError::invalid("Deployment.apps", "web", vec![Cause::required("spec.selector")]).to_status();
        assert_eq!((&invalid["details"]["kind"], &invalid["details"]["group"]), (&json!("Deployment"), &json!("apps")));
    }

    #[test]
    fn an_unserved_path_answers_as_kubernetes_with_empty_details() {
        let s = ApiError::resource_not_found().to_status();
        assert_eq!(s["message"], "the server could not find the requested resource");
        assert_eq!((&s["code"], &s["reason"], &s["details"]), (&json!(404), &json!("NotFound"), &json!({})));
    }
}
