//! The `/debug/controllers` view: what each controller is doing and which keys are stuck in backoff.

use std::sync::Arc;

use serde::Serialize;
use tokio::time::Instant;

use crate::controller::ControllerState;
use crate::informer::InformerFactory;

/// Every running controller, as served by `/debug/controllers`.
#[derive(Debug, Clone, Serialize)]
pub struct ControllersSnapshot {
    pub controllers: Vec<ControllerSnapshot>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerSnapshot {
    pub name: String,
    pub kind: String,
    /// `level`, `edge`, `hybrid` or `anti-entropy`.
    pub mode: String,
    /// Level interval, hybrid resync period or anti-entropy check interval.
    pub period_seconds: Option<f64>,
    /// The fraction of events this controller's handlers lose (0 unless a demonstration set it).
    pub event_loss: f64,
    pub workers: usize,
    /// Keys ready for a worker.
    pub queue_depth: usize,
    /// Keys being reconciled now.
    pub in_flight: usize,
    /// Keys waiting out a backoff after failures, soonest first.
    pub backoff: Vec<BackoffEntry>,
    /// When this controller last enqueued every key (level tick or hybrid resync).
    pub last_resync: Option<String>,
    /// When the primary kind's informer last completed a full list.
    pub last_list: Option<String>,
    /// When the primary kind's informer last compared digests with the server (anti-entropy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_check: Option<String>,
    /// When such a check last repaired an object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_repair: Option<String>,
    pub reconciles: ReconcileCounts,
    /// Keys added to the queue since start (each add, de-duplicated or not).
    pub queue_adds: u64,
    /// Percentiles of the latest reconciles' durations.
    pub latency: Latency,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    /// How many of the latest reconciles the percentiles cover.
    pub samples: usize,
    pub p50_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
}

/// The durations of the latest reconciles (a ring of fixed size): recent percentiles without
/// the histogram's bucket resolution.
#[derive(Debug, Default)]
pub struct RecentDurations {
    ring: Vec<f64>,
    next: usize,
}

impl RecentDurations {
    const CAPACITY: usize = 512;

    pub fn record(&mut self, seconds: f64) {
        if self.ring.len() < Self::CAPACITY {
            self.ring.push(seconds);
        } else {
            self.ring[self.next] = seconds;
        }
        self.next = (self.next + 1) % Self::CAPACITY;
    }

    pub fn latency(&self) -> Latency {
        let mut sorted = self.ring.clone();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
            sorted.get(i).copied()
        };
        Latency { samples: sorted.len(), p50_seconds: at(0.5), p99_seconds: at(0.99) }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackoffEntry {
    pub key: String,
    pub retries: u32,
    pub next_attempt_in_seconds: f64,
    pub next_attempt_at: String,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReconcileCounts {
    pub success: u64,
    pub error: u64,
    pub requeue: u64,
    pub panic: u64,
}

pub(crate) fn snapshot(controllers: &[Arc<ControllerState>], factory: &InformerFactory) -> ControllersSnapshot {
    let now = Instant::now();
    let wall = jiff::Timestamp::now();
    let controllers = controllers
        .iter()
        .map(|c| {
            let errors = c.last_errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let backoff = c
                .queue
                .delayed()
                .into_iter()
                .filter_map(|(key, due)| {
                    let retries = c.queue.retries(&key);
                    if retries == 0 {
                        return None;
                    }
                    let wait = due.saturating_duration_since(now);
                    let at = jiff::SignedDuration::try_from(wait).ok().and_then(|d| wall.checked_add(d).ok());
                    Some(BackoffEntry {
                        last_error: errors.get(&key).cloned(),
                        key,
                        retries,
                        next_attempt_in_seconds: wait.as_secs_f64(),
                        next_attempt_at: at.map(|t| t.to_string()).unwrap_or_default(),
                    })
                })
                .collect();
            let informer = factory.informer(&c.primary);
            let (last_check, last_repair) = informer.anti_entropy_times();
            ControllerSnapshot {
                name: c.name.clone(),
                kind: c.primary.kind.to_string(),
                mode: c.mode().name().to_string(),
                period_seconds: c.mode().period().map(|p| p.as_secs_f64()),
                event_loss: c.event_loss.drop_fraction(),
                workers: c.workers,
                queue_depth: c.queue.len(),
                in_flight: c.queue.in_flight(),
                backoff,
                last_resync: c.last_resync.lock().unwrap_or_else(|e| e.into_inner()).map(|t| t.to_string()),
                last_list: informer.last_list().map(|t| t.to_string()),
                last_check: last_check.map(|t| t.to_string()),
                last_repair: last_repair.map(|t| t.to_string()),
                reconciles: ReconcileCounts {
                    success: c.metrics.success.get(),
                    error: c.metrics.error.get(),
                    requeue: c.metrics.requeue.get(),
                    panic: c.metrics.panic.get(),
                },
                queue_adds: c.queue.adds(),
                latency: c.metrics.recent.lock().unwrap_or_else(|e| e.into_inner()).latency(),
            }
        })
        .collect();
    ControllersSnapshot { controllers }
}

impl ControllersSnapshot {
    /// The snapshot as JSON, ready to serve.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_durations_give_nearest_rank_percentiles_of_the_latest_samples_only() {
        let mut r = RecentDurations::default();
        assert_eq!(r.latency().p50_seconds, None);
        for i in 1..=100 {
            r.record(i as f64);
        }
        let l = r.latency();
        assert_eq!((l.samples, l.p50_seconds, l.p99_seconds), (100, Some(50.0), Some(99.0)));
        for _ in 0..RecentDurations::CAPACITY {
            r.record(0.5);
        }
        let l = r.latency();
        assert_eq!((l.samples, l.p99_seconds), (RecentDurations::CAPACITY, Some(0.5)), "old samples are gone");
    }
}
