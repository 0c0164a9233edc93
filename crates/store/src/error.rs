use crate::Revision;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("key {key} not found")]
    NotFound { key: String },
    #[error("key {key} already exists")]
    AlreadyExists { key: String },
    #[error("key {key} is at revision {actual}, not {expected}")]
    Conflict { key: String, expected: Revision, actual: Revision },
    #[error("revision {requested} is older than the retained history (oldest watchable: {oldest})")]
    Expired { requested: Revision, oldest: Revision },
    #[error("watcher fell too far behind and was dropped; re-list and watch again")]
    Lagged,
    /// The store was closed (its server is shutting down): it takes no more writes or watches.
    #[error("the store is closed and takes no more writes or watches (its server is shutting down)")]
    Closed,
    /// A revision the store has not reached yet, where only a past one makes sense (compaction).
    #[error("revision {requested} is newer than the store's revision {current}")]
    FutureRevision { requested: Revision, current: Revision },
    #[error("storage backend: {0}")]
    Backend(String),
    /// The store's disk is full: writes fail until it has room again (reads keep working).
    #[error("{0}")]
    NoSpace(String),
    /// The store cannot write for now (an I/O error it is recovering from); reads keep working.
    #[error("{0}")]
    Unavailable(String),
}
