//! The one error type of the image library: each variant says what failed, on which image or path.

use std::path::PathBuf;
use std::sync::Arc;

/// Cloneable so that one failed pull can be handed to every caller that waited for it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },
    #[error("invalid digest {digest:?}: {reason}")]
    InvalidDigest { digest: String, reason: String },
    #[error("image {reference} not found: {detail}")]
    NotFound { reference: String, detail: String },
    #[error("pull access denied for {reference}: the repository does not exist or needs credentials ({detail})")]
    Unauthorized { reference: String, detail: String },
    #[error("pulling {reference} from its registry failed: {detail}")]
    Registry { reference: String, detail: String },
    #[error("image {reference} is not supported: {reason}")]
    Unsupported { reference: String, reason: String },
    #[error("content {expected} failed verification: its bytes hash to {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("layer {layer}: {reason}")]
    Unpack { layer: String, reason: String },
    #[error("image {reference} is not present on this node and its pull policy is Never")]
    NeverPull { reference: String },
    #[error("image {reference} is not present on this node")]
    NotPresent { reference: String },
    #[error("invalid container id {id:?}: {reason}")]
    InvalidContainerId { id: String, reason: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("image store record {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("image archive: {0}")]
    Archive(String),
    #[error("{0}")]
    Internal(String),
}

impl ImageError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ImageError::Io {
            action,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    /// True when the registry answered that the image does not exist (kubelet's `ErrImagePull` with a
    /// "not found" message, as opposed to a transport failure worth retrying sooner).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ImageError::NotFound { .. })
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;
