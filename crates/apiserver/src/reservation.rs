//! Reservations of node ports and cluster IPs in the store, so that API servers sharing one store
//! never hand the same one to two Services.
//!
//! Each API server already serializes its own allocations under a lock and checks the stored
//! Services; what another server is allocating at the same moment is not in the Services yet. So
//! a Service that takes a port or an address first writes its reservation key (`/registry/ranges/
//! servicenodeports/30080`, `/registry/ranges/serviceips/10.96.0.7`, as Kubernetes keeps
//! IPAddress objects) with a compare-and-set, and writes the Service only once that succeeded.
//!
//! A reservation names the Service that holds it and starts `pending`; the Service's write
//! confirms it. Nothing releases one: a confirmed reservation whose Service no longer holds the
//! item (deleted, changed type, another port) is free for the next Service to take over, and a
//! pending one is too once it is older than [`PENDING_GRACE`] (its writer failed or died between
//! the reservation and the write). Every take-over is a compare-and-set on the reservation, so
//! of two servers racing for one item exactly one wins.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use shepherd_api::ApiError;
use shepherd_store::{KeyValue, Store, StoreError};

/// Reservations of node ports, by port number.
pub(crate) const NODE_PORTS: &str = "/registry/ranges/servicenodeports/";
/// Reservations of cluster IPs, by address.
pub(crate) const CLUSTER_IPS: &str = "/registry/ranges/serviceips/";

/// How long a pending reservation is left to the write that made it: far longer than a write
/// takes, including the write path's retries on conflicts (30 s).
const PENDING_GRACE: Duration = Duration::from_secs(60);
/// Attempts at one reservation when the store keeps changing under it.
const ATTEMPTS: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Reservation {
    /// The store key of the Service holding it.
    service: String,
    /// Until the Service's write confirms it.
    pending: bool,
    /// Seconds since the epoch when it was last written.
    at: u64,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn internal(e: StoreError) -> ApiError {
    match e {
        StoreError::Unavailable(m) => ApiError::ServiceUnavailable(m),
        e => ApiError::Internal(format!("reserving an allocation: {e}")),
    }
}

fn encode(r: &Reservation) -> Result<Bytes, ApiError> {
    serde_json::to_vec(r).map(Bytes::from).map_err(|e| ApiError::Internal(e.to_string()))
}

/// What a reservation reserved, to be confirmed after the Service is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reserved {
    key: String,
    service: String,
}

/// Reserves `item` under `prefix` for the Service stored at `service`. `holds` tells whether a
/// stored Service holds the item. `Ok(None)` when a live reservation of another Service has it.
pub(crate) async fn reserve(
    store: &dyn Store,
    prefix: &str,
    item: &str,
    service: &str,
    holds: &(dyn Fn(&Value) -> bool + Sync),
) -> Result<Option<Reserved>, ApiError> {
    let key = format!("{prefix}{item}");
    let mine = encode(&Reservation { service: service.to_string(), pending: true, at: now() })?;
    let reserved = Some(Reserved { key: key.clone(), service: service.to_string() });
    for _ in 0..ATTEMPTS {
        let current = match store.create(&key, mine.clone()).await {
            Ok(_) => return Ok(reserved),
            Err(StoreError::AlreadyExists { .. }) => match store.get(&key).await.map_err(internal)? {
                Some(kv) => kv,
                None => continue,
            },
            Err(e) => return Err(internal(e)),
        };
        if !free_for(store, &current, service, holds).await? {
            return Ok(None);
        }
        // Even our own reservation is written again: a server taking over a stale one at the same
        // time then loses its compare-and-set, or we lose ours.
        match store.update(&key, mine.clone(), Some(current.mod_revision)).await {
            Ok(_) => return Ok(reserved),
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(internal(e)),
        }
    }
    Err(ApiError::ServiceUnavailable(format!("{key} keeps changing; try again")))
}

/// Whether the reservation in `current` may go to `service`: it is its own, or its holder has
/// let the item go.
async fn free_for(
    store: &dyn Store,
    current: &KeyValue,
    service: &str,
    holds: &(dyn Fn(&Value) -> bool + Sync),
) -> Result<bool, ApiError> {
    let Ok(r) = serde_json::from_slice::<Reservation>(&current.value) else {
        tracing::warn!(key = current.key, "an unreadable reservation is taken over");
        return Ok(true);
    };
    if r.service == service {
        return Ok(true);
    }
    let holder = store.get(&r.service).await.map_err(internal)?;
    let held = holder.as_ref().and_then(|kv| crate::codec::decode(kv).ok()).is_some_and(|svc| holds(&svc));
    if held {
        return Ok(false);
    }
    Ok(!r.pending || now().saturating_sub(r.at) > PENDING_GRACE.as_secs())
}

impl Reserved {
    /// Marks the reservation as held by its written Service. A failure is only logged: the
    /// reservation then stays pending, which holds it while the Service does and frees it a
    /// grace period after the Service lets it go.
    pub(crate) async fn confirm(&self, store: &dyn Store) {
        let Ok(Some(kv)) = store.get(&self.key).await else { return };
        let Ok(r) = serde_json::from_slice::<Reservation>(&kv.value) else { return };
        if r.service != self.service || !r.pending {
            return;
        }
        let Ok(value) = encode(&Reservation { pending: false, at: now(), ..r }) else { return };
        if let Err(e) = store.update(&self.key, value, Some(kv.mod_revision)).await {
            tracing::debug!(key = self.key, error = %e, "reservation left pending");
        }
    }

    /// Gives up a reservation whose Service was not written after all.
    pub(crate) async fn release(&self, store: &dyn Store) {
        let Ok(Some(kv)) = store.get(&self.key).await else { return };
        let Ok(r) = serde_json::from_slice::<Reservation>(&kv.value) else { return };
        if r.service == self.service && r.pending {
            let _ = store.delete(&self.key, Some(kv.mod_revision)).await;
        }
    }
}

/// The cluster IP a Service value holds (`None` and empty hold none).
pub(crate) fn cluster_ip(svc: &Value) -> Option<&str> {
    svc.pointer("/spec/clusterIP").and_then(Value::as_str).filter(|ip| !ip.is_empty() && *ip != "None")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use shepherd_store::{HistoryLimits, LocalStore};

    use super::*;

    fn holds_port(port: i64) -> impl Fn(&Value) -> bool + Sync {
        move |svc: &Value| svc.pointer("/spec/ports/0/nodePort").and_then(Value::as_i64) == Some(port)
    }

    async fn write_service(store: &dyn Store, key: &str, port: Option<i64>) {
        let svc =
            json!({"kind": "Service", "metadata": {"name": key}, "spec": {"ports": [{"port": 80, "nodePort": port}]}});
        let bytes = Bytes::from(serde_json::to_vec(&svc).expect("json"));
        match store.get(key).await.expect("get") {
            Some(kv) => store.update(key, bytes, Some(kv.mod_revision)).await.map(drop),
            None => store.create(key, bytes).await.map(drop),
        }
        .expect("write service");
    }

    #[tokio::test]
    async fn a_port_reserved_by_a_service_that_holds_it_is_refused_to_another_and_freed_when_let_go() {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let holds = holds_port(30080);
        let a = reserve(store.as_ref(), NODE_PORTS, "30080", "/svc/a", &holds).await.expect("reserve");
        let a = a.expect("the first reservation wins");
        // Pending: another Service cannot take it while a's write may still land.
        assert_eq!(reserve(store.as_ref(), NODE_PORTS, "30080", "/svc/b", &holds).await.expect("reserve"), None);
        write_service(store.as_ref(), "/svc/a", Some(30080)).await;
        a.confirm(store.as_ref()).await;
        assert_eq!(reserve(store.as_ref(), NODE_PORTS, "30080", "/svc/b", &holds).await.expect("reserve"), None);
        // a's own Service may reserve it again (a retried write).
        assert!(reserve(store.as_ref(), NODE_PORTS, "30080", "/svc/a", &holds).await.expect("reserve").is_some());
        a.confirm(store.as_ref()).await;
        // a lets the port go: b may take it at once.
        write_service(store.as_ref(), "/svc/a", None).await;
        assert!(reserve(store.as_ref(), NODE_PORTS, "30080", "/svc/b", &holds).await.expect("reserve").is_some());
    }

    #[tokio::test]
    async fn a_released_reservation_is_free_and_a_pending_one_is_held_for_its_grace() {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let holds = holds_port(30081);
        let a = reserve(store.as_ref(), NODE_PORTS, "30081", "/svc/a", &holds).await.expect("reserve").expect("won");
        a.release(store.as_ref()).await;
        let b = reserve(store.as_ref(), NODE_PORTS, "30081", "/svc/b", &holds).await.expect("reserve");
        assert!(b.is_some(), "released");
        // b never writes its Service: its pending reservation blocks others only for the grace.
        let stale = Reservation { service: "/svc/b".into(), pending: true, at: now() - PENDING_GRACE.as_secs() - 1 };
        let kv = store.get(&format!("{NODE_PORTS}30081")).await.expect("get").expect("present");
        store.update(&kv.key, encode(&stale).expect("encode"), Some(kv.mod_revision)).await.expect("age it");
        assert!(reserve(store.as_ref(), NODE_PORTS, "30081", "/svc/c", &holds).await.expect("reserve").is_some());
    }
}
