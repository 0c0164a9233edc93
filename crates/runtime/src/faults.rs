//! Fault injection for tests and experiments: lose watch events, make reconciles fail or panic.
//!
//! Everything here is off by default and only switched on by test code or experiment config.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Drops a fraction of watch events before they reach an informer's cache, as a lossy network
/// would: the watch stays open and nothing reports the loss. Shared by every informer of a factory.
#[derive(Debug, Default)]
pub struct WatchFaults {
    /// `f64` bits of the fraction in `0..=1`.
    drop_fraction: AtomicU64,
}

impl WatchFaults {
    /// Sets the fraction of watch events to drop, clamped to `0..=1`; takes effect immediately.
    pub fn set_drop_fraction(&self, fraction: f64) {
        let f = if fraction.is_nan() { 0.0 } else { fraction.clamp(0.0, 1.0) };
        self.drop_fraction.store(f.to_bits(), Ordering::Relaxed);
    }

    pub fn drop_fraction(&self) -> f64 {
        f64::from_bits(self.drop_fraction.load(Ordering::Relaxed))
    }

    pub(crate) fn should_drop(&self) -> bool {
        roll(self.drop_fraction())
    }
}

/// Makes a fraction of reconcile calls fail or panic before the reconciler runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReconcileFaults {
    /// Fraction of calls (`0..=1`) that return an injected error.
    pub fail_fraction: f64,
    /// Fraction of calls (`0..=1`) that panic.
    pub panic_fraction: f64,
}

/// What an injected fault does to one reconcile call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Fail,
    Panic,
}

impl ReconcileFaults {
    pub(crate) fn is_off(&self) -> bool {
        self.fail_fraction <= 0.0 && self.panic_fraction <= 0.0
    }

    pub(crate) fn roll(&self) -> Option<Fault> {
        if self.is_off() {
            return None;
        }
        let x: f64 = rand::rng().random();
        if x < self.panic_fraction {
            Some(Fault::Panic)
        } else if x < self.panic_fraction + self.fail_fraction {
            Some(Fault::Fail)
        } else {
            None
        }
    }
}

fn roll(fraction: f64) -> bool {
    fraction >= 1.0 || (fraction > 0.0 && rand::rng().random::<f64>() < fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_off_by_default_and_all_or_nothing_at_the_extremes() {
        let w = WatchFaults::default();
        assert!((0..1000).all(|_| !w.should_drop()));
        w.set_drop_fraction(1.5);
        assert!((0..1000).all(|_| w.should_drop()));
        assert_eq!(ReconcileFaults::default().roll(), None);
        let always_panic = ReconcileFaults { panic_fraction: 1.0, ..Default::default() };
        assert_eq!(always_panic.roll(), Some(Fault::Panic));
    }
}
