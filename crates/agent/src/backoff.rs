//! Restart back-off: 10 s doubling to 5 min, as Kubernetes, reset after a long enough run.

use std::time::Duration;

/// Per container: how long to wait before the next restart.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    /// The delay handed out last; `None` until the first exit or after a reset.
    current: Option<Duration>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max: max.max(initial), current: None }
    }

    /// The delay before restarting a container that just exited after running for `ran_for`.
    /// A run of twice the maximum delay counts as healthy and starts the sequence over.
    pub fn next(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.max * 2 {
            self.current = None;
        }
        let delay = match self.current {
            None => self.initial,
            Some(c) => (c * 2).min(self.max),
        };
        self.current = Some(delay);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_from_ten_seconds_doubling_to_five_minutes() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let delays: Vec<u64> = (0..8).map(|_| b.next(Duration::from_secs(1)).as_secs()).collect();
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn a_container_that_ran_ten_minutes_starts_the_back_off_over() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        b.next(Duration::ZERO);
        b.next(Duration::ZERO);
        assert_eq!(b.next(Duration::from_secs(600)), Duration::from_secs(10));
        assert_eq!(b.next(Duration::ZERO), Duration::from_secs(20));
    }
}
