//! Prometheus metrics of work queues, controllers and informers, under the names users already graph.
//!
//! One `Metrics` handle is shared by everything a `Manager` runs; the daemon registers it once
//! into its registry with `Metrics::register`. Work-queue gauges about in-flight work
//! (`workqueue_unfinished_work_seconds`, `workqueue_longest_running_processor_seconds`) are
//! computed at scrape time from the live queues, so a reconcile stuck for an hour shows as an hour.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueLabels {
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    pub controller: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    pub kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 10 µs to 10 000 s: reconciles are fast, backoff delays reach 1000 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 10.0, 10))
}

/// What a live queue reports at scrape time.
pub(crate) trait InFlight: Send + Sync {
    fn queue_name(&self) -> &str;
    /// Sum of the ages of in-flight items and the age of the oldest one, in seconds.
    fn in_flight_seconds(&self) -> (f64, f64);
}

/// The metrics handle shared by every queue, controller and informer of a process. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub queue_depth: Family<QueueLabels, Gauge>,
    pub queue_adds: Family<QueueLabels, Counter>,
    pub queue_retries: Family<QueueLabels, Counter>,
    pub queue_duration: HistogramFamily<QueueLabels>,
    pub work_duration: HistogramFamily<QueueLabels>,
    pub reconcile_total: Family<ResultLabels, Counter>,
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    pub reconcile_panics: Family<ControllerLabels, Counter>,
    pub reconcile_time: HistogramFamily<ControllerLabels>,
    pub informer_events: Family<KindLabels, Counter>,
    pub informer_dropped_events: Family<KindLabels, Counter>,
    pub informer_relists: Family<KindLabels, Counter>,
    pub informer_last_resync: Family<KindLabels, Gauge<f64, AtomicU64>>,
    pub informer_objects: Family<KindLabels, Gauge>,
    pub informer_anti_entropy_checks: Family<KindLabels, Counter>,
    pub informer_anti_entropy_mismatches: Family<KindLabels, Counter>,
    pub informer_anti_entropy_repairs: Family<KindLabels, Counter>,
    live_queues: Arc<Mutex<Vec<Weak<dyn InFlight>>>>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            queue_depth: Family::default(),
            queue_adds: Family::default(),
            queue_retries: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_panics: Family::default(),
            reconcile_time: Family::new_with_constructor(duration_histogram),
            informer_events: Family::default(),
            informer_dropped_events: Family::default(),
            informer_relists: Family::default(),
            informer_last_resync: Family::default(),
            informer_objects: Family::default(),
            informer_anti_entropy_checks: Family::default(),
            informer_anti_entropy_mismatches: Family::default(),
            informer_anti_entropy_repairs: Family::default(),
            live_queues: Arc::default(),
        }
    }
}

impl Metrics {
    /// A fresh set of metrics, registered nowhere yet.
    pub fn new() -> Self {
        Metrics::default()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    pub(crate) fn track_queue(&self, queue: Weak<dyn InFlight>) {
        let mut live = self.inner.live_queues.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|q| q.strong_count() > 0);
        live.push(queue);
    }

    /// Registers every metric into the daemon's registry (call once per registry).
    pub fn register(&self, registry: &mut Registry) {
        let m = &self.inner;
        registry.register("workqueue_depth", "Current depth of the work queue", m.queue_depth.clone());
        // prometheus-client appends `_total` to counters.
        registry.register("workqueue_adds", "Keys added to the work queue", m.queue_adds.clone());
        registry.register("workqueue_retries", "Rate-limited re-adds after a failure", m.queue_retries.clone());
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long a key waits in the queue before a worker takes it",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long processing a key takes",
            m.work_duration.clone(),
        );
        registry.register_collector(Box::new(InFlightCollector { queues: m.live_queues.clone() }));
        registry.register("controller_reconcile", "Reconciles by result", m.reconcile_total.clone());
        registry.register("controller_reconcile_errors", "Reconciles that failed", m.reconcile_errors.clone());
        registry.register("controller_reconcile_panics", "Reconciles that panicked", m.reconcile_panics.clone());
        registry.register(
            "controller_reconcile_time_seconds",
            "Time spent in reconcile",
            m.reconcile_time.clone(),
        );
        registry.register("informer_events", "Watch events received", m.informer_events.clone());
        registry.register(
            "informer_dropped_events",
            "Watch events dropped by fault injection",
            m.informer_dropped_events.clone(),
        );
        registry.register("informer_relists", "Full lists (start, recovery, resync)", m.informer_relists.clone());
        registry.register(
            "informer_last_resync_timestamp_seconds",
            "Unix time of the last completed list",
            m.informer_last_resync.clone(),
        );
        registry.register("informer_cached_objects", "Objects in the informer cache", m.informer_objects.clone());
        registry.register(
            "informer_anti_entropy_checks",
            "Digest comparisons with the server (anti-entropy mode)",
            m.informer_anti_entropy_checks.clone(),
        );
        registry.register(
            "informer_anti_entropy_mismatches",
            "Digest comparisons that found the cache differing from the server",
            m.informer_anti_entropy_mismatches.clone(),
        );
        registry.register(
            "informer_anti_entropy_repairs",
            "Objects fetched or dropped to repair the cache after a digest mismatch",
            m.informer_anti_entropy_repairs.clone(),
        );
    }
}

/// Reads the in-flight gauges from the live queues at scrape time.
struct InFlightCollector {
    queues: Arc<Mutex<Vec<Weak<dyn InFlight>>>>,
}

impl std::fmt::Debug for InFlightCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlightCollector")
    }
}

impl prometheus_client::collector::Collector for InFlightCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let queues: Vec<Arc<dyn InFlight>> = {
            let live = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            live.iter().filter_map(Weak::upgrade).collect()
        };
        let readings: Vec<(String, f64, f64)> = queues
            .iter()
            .map(|q| {
                let (sum, longest) = q.in_flight_seconds();
                (q.queue_name().to_string(), sum, longest)
            })
            .collect();
        for (metric, help, pick) in [
            (
                "workqueue_unfinished_work_seconds",
                "Seconds of work in progress not yet observed by work_duration",
                0usize,
            ),
            ("workqueue_longest_running_processor_seconds", "Age of the longest-running reconcile", 1),
        ] {
            let mut family = encoder.encode_descriptor(metric, help, None, MetricType::Gauge)?;
            for (name, sum, longest) in &readings {
                let value = if pick == 0 { *sum } else { *longest };
                let labels = QueueLabels { name: name.clone() };
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_use_the_names_users_graph() {
        let metrics = Metrics::new();
        let labels = ResultLabels { controller: "rs".into(), result: "panic" };
        metrics.inner().reconcile_total.get_or_create(&labels).inc();
        metrics.inner().queue_adds.get_or_create(&QueueLabels { name: "rs".into() }).inc();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"controller_reconcile_total{controller="rs",result="panic"} 1"#), "{text}");
        assert!(text.contains(r#"workqueue_adds_total{name="rs"} 1"#), "{text}");
        assert!(text.contains("# TYPE workqueue_unfinished_work_seconds gauge"), "{text}");
    }
}
