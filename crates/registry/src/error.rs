//! Registry errors as the distribution spec's JSON error body: `{"errors":[{"code","message","detail"}]}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// The spec's error codes that this registry returns (a 4xx body may carry no others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BlobUnknown,
    BlobUploadInvalid,
    BlobUploadUnknown,
    DigestInvalid,
    ManifestBlobUnknown,
    ManifestInvalid,
    ManifestUnknown,
    NameInvalid,
    NameUnknown,
    SizeInvalid,
    Unsupported,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BlobUnknown => "BLOB_UNKNOWN",
            Self::BlobUploadInvalid => "BLOB_UPLOAD_INVALID",
            Self::BlobUploadUnknown => "BLOB_UPLOAD_UNKNOWN",
            Self::DigestInvalid => "DIGEST_INVALID",
            Self::ManifestBlobUnknown => "MANIFEST_BLOB_UNKNOWN",
            Self::ManifestInvalid => "MANIFEST_INVALID",
            Self::ManifestUnknown => "MANIFEST_UNKNOWN",
            Self::NameInvalid => "NAME_INVALID",
            Self::NameUnknown => "NAME_UNKNOWN",
            Self::SizeInvalid => "SIZE_INVALID",
            Self::Unsupported => "UNSUPPORTED",
        }
    }

    /// The status codes the reference implementation pairs with each code; clients key on them.
    fn status(self) -> StatusCode {
        match self {
            Self::BlobUnknown | Self::BlobUploadUnknown | Self::ManifestUnknown | Self::NameUnknown => {
                StatusCode::NOT_FOUND
            }
            Self::Unsupported => StatusCode::METHOD_NOT_ALLOWED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// An error a request ends with.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A client error with the spec's code.
    #[error("{}: {message}", code.as_str())]
    Client { code: ErrorCode, status: StatusCode, message: String, detail: Option<serde_json::Value> },
    /// The registry failed on its own side (disk full, permissions, ...).
    #[error("storage: {0}")]
    Io(#[from] std::io::Error),
}

impl RegistryError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Client { code, status: code.status(), message: message.into(), detail: None }
    }

    /// The same error naming the digest it is about in `detail`, as the spec's examples do.
    pub fn about_digest(self, digest: &str) -> Self {
        match self {
            Self::Client { code, status, message, .. } => {
                Self::Client { code, status, message, detail: Some(serde_json::json!({ "digest": digest })) }
            }
            other => other,
        }
    }

    /// The same error with another status than the code's usual one (416 for an out-of-order chunk).
    pub fn with_status(code: ErrorCode, status: StatusCode, message: impl Into<String>) -> Self {
        Self::Client { code, status, message: message.into(), detail: None }
    }
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        let (status, code, message, detail) = match self {
            Self::Client { code, status, message, detail } => (status, code.as_str(), message, detail),
            Self::Io(error) => {
                tracing::error!(%error, "registry storage failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "UNKNOWN", format!("storage error: {error}"), None)
            }
        };
        let body = serde_json::json!({"errors": [{"code": code, "message": message, "detail": detail}]});
        (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;
