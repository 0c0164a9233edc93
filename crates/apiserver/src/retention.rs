//! Gauges of what the store retains in memory and the bound of each, read at scrape time, so a
//! growing buffer shows up in `/metrics` beside the limit it will stop at.

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use shepherd_store::Store;

struct RetentionCollector {
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for RetentionCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetentionCollector")
    }
}

impl prometheus_client::collector::Collector for RetentionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = self.store.retention() else { return Ok(()) };
        let l = r.limits;
        let gauges: [(&str, &str, f64); 13] = [
            ("store_objects", "Objects the store holds (all kinds, in memory)", r.objects as f64),
            ("store_object_bytes", "Bytes of the serialized objects the store holds in memory", r.object_bytes as f64),
            (
                "store_object_memory_bytes",
                "Bytes those objects take in memory, compressed against a dictionary per kind",
                r.object_memory_bytes as f64,
            ),
            ("store_watch_history_events", "Events kept for watchers to resume from", r.history_events as f64),
            ("store_watch_history_events_limit", "Most events the watch history keeps (--history-events)", l.max_events as f64),
            ("store_watch_history_bytes", "Bytes of object values the watch history keeps alive", r.history_bytes as f64),
            ("store_watch_history_bytes_limit", "Most bytes the watch history keeps alive (--history-mib)", l.max_bytes as f64),
            (
                "store_watch_history_memory_bytes",
                "Of the watch history's bytes, those held in memory (the embedded store reads older events from its file)",
                r.history_memory_bytes as f64,
            ),
            (
                "store_watch_history_memory_bytes_limit",
                "Most bytes of the watch history held in memory beyond the last checkpoint (--history-memory-mib)",
                l.memory_bytes as f64,
            ),
            ("store_watch_history_age_limit_seconds", "Oldest event the watch history keeps (--history-seconds)", l.max_age.as_secs_f64()),
            ("store_live_watchers", "Watch subscriptions following live events", r.live_watchers as f64),
            ("store_live_buffer_events", "Events held in the live buffer for the slowest watcher", r.live_buffer_events as f64),
            (
                "store_live_buffer_events_limit",
                "Most events a watched prefix's live buffer holds; a watcher further behind resumes from the history",
                l.live_buffer() as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)?;
        }
        // Either grows steadily when the history kept in memory or the live buffers are too small
        // for the watchers: each resume replays from the history, each file read decodes events.
        let counters: [(&str, &str, u64); 3] = [
            ("store_watch_resumes", "Watches that fell out of their live buffer and resumed from the history", r.watch_resumes),
            (
                "store_watch_history_file_reads",
                "Reads of the watch history from the store file, by watches and lists reaching past the history in memory",
                r.history_file_reads,
            ),
            ("store_watch_history_file_events", "Events those reads returned", r.history_file_events),
        ];
        for (name, help, value) in counters {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(metric)?;
        }
        Ok(())
    }
}

/// Registers the store's retention gauges (`store_*`) into `registry`.
pub fn register_retention(store: Arc<dyn Store>, registry: &mut Registry) {
    registry.register_collector(Box::new(RetentionCollector { store }));
}
