//! The API server's Prometheus metrics.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub resource: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub verb: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

/// Request counts and latencies, store write latency, open watches, stored objects.
pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<LatencyLabels, Histogram>,
    pub store_write_duration: Histogram,
    pub open_watches: Gauge<i64, AtomicI64>,
    pub objects: Family<ResourceLabel, Gauge<i64, AtomicI64>>,
    /// Time a request spends being authenticated (certificate or token to user).
    pub authentication_duration: Histogram,
    /// Time a request spends being authorized (attributes, impersonation, the decision).
    pub authorization_duration: Histogram,
}

/// Authentication and authorization take microseconds: buckets from 1 µs, 1.5x apart, to ~0.2 s.
fn auth_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_001, 1.5, 31)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 18))),
            store_write_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            open_watches: Gauge::default(),
            objects: Family::default(),
            authentication_duration: Histogram::new(auth_buckets()),
            authorization_duration: Histogram::new(auth_buckets()),
        }
    }
}

impl Metrics {
    /// Registers every metric of the API server into `registry`.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register("apiserver_request", "API requests by verb, resource and HTTP code", self.requests.clone());
        registry.register(
            "apiserver_request_duration_seconds",
            "API request latency by verb and resource (watches: time to first byte)",
            self.request_duration.clone(),
        );
        registry.register(
            "shepherd_store_write_duration_seconds",
            "Latency of one durable store write, including the wait for its group commit",
            self.store_write_duration.clone(),
        );
        registry.register("apiserver_open_watches", "Watch streams currently open", self.open_watches.clone());
        registry.register("apiserver_storage_objects", "Objects stored, by resource", self.objects.clone());
        registry.register(
            "apiserver_authentication_duration_seconds",
            "Time spent authenticating a request (client certificate or bearer token to a user)",
            self.authentication_duration.clone(),
        );
        registry.register(
            "apiserver_authorization_duration_seconds",
            "Time spent authorizing a request (its attributes, impersonation, the RBAC and node decision)",
            self.authorization_duration.clone(),
        );
    }

    pub fn observe_store_write(&self, started: Instant) {
        self.store_write_duration.observe(started.elapsed().as_secs_f64());
    }

    pub fn observe_request(&self, verb: &str, resource: &str, code: u16, started: Instant) {
        self.requests
            .get_or_create(&RequestLabels { verb: verb.into(), resource: resource.into(), code: code.to_string() })
            .inc();
        self.request_duration
            .get_or_create(&LatencyLabels { verb: verb.into(), resource: resource.into() })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Decrements the open-watch gauge when a watch stream ends, however it ends.
pub(crate) struct WatchGuard(pub(crate) Arc<Metrics>);

impl WatchGuard {
    pub(crate) fn new(m: Arc<Metrics>) -> Self {
        m.open_watches.inc();
        WatchGuard(m)
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.open_watches.dec();
    }
}
