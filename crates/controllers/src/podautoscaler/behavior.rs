//! `behavior` of a HorizontalPodAutoscaler: stabilization windows over past recommendations, then
//! the rate policies (`Pods`/`Percent` per `periodSeconds`, combined by `selectPolicy`) and the
//! replica bounds, as Kubernetes' `normalizeDesiredReplicasWithBehaviors`.
//!
//! Recommendations and scale events live in memory, per autoscaler, as in Kubernetes: a restarted
//! controller starts with empty windows. Times are tokio instants, so tests run on the paused clock.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

/// One direction's rules, read from a defaulted `behavior.scaleUp` or `scaleDown`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    pub window: Duration,
    pub select: Select,
    pub policies: Vec<Policy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    Max,
    Min,
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Pods { value: i64, period: Duration },
    Percent { value: i64, period: Duration },
}

impl Policy {
    fn period(&self) -> Duration {
        match self {
            Policy::Pods { period, .. } | Policy::Percent { period, .. } => *period,
        }
    }
}

impl Rules {
    /// Reads one direction of a behavior that went through `behavior_with_defaults`.
    pub fn from_json(v: &Value) -> Rules {
        let window = Duration::from_secs(v["stabilizationWindowSeconds"].as_u64().unwrap_or(0));
        let select = match v["selectPolicy"].as_str() {
            Some("Min") => Select::Min,
            Some("Disabled") => Select::Disabled,
            _ => Select::Max,
        };
        let policies = v["policies"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        let value = p["value"].as_i64()?;
                        let period = Duration::from_secs(p["periodSeconds"].as_u64()?);
                        match p["type"].as_str()? {
                            "Pods" => Some(Policy::Pods { value, period }),
                            "Percent" => Some(Policy::Percent { value, period }),
                            _ => None,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Rules { window, select, policies }
    }
}

/// Both directions of a behavior and the replica bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub min: i64,
    pub max: i64,
    pub up: Rules,
    pub down: Rules,
}

/// What bounded the outcome, for the `ScalingLimited` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// `DesiredWithinRange`: nothing did.
    No,
    TooManyReplicas,
    TooFewReplicas,
    ScaleUpLimit,
    ScaleDownLimit,
}

impl Limited {
    pub fn reason(self) -> &'static str {
        match self {
            Limited::No => "DesiredWithinRange",
            Limited::TooManyReplicas => "TooManyReplicas",
            Limited::TooFewReplicas => "TooFewReplicas",
            Limited::ScaleUpLimit => "ScaleUpLimit",
            Limited::ScaleDownLimit => "ScaleDownLimit",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Limited::No => "the desired count is within the acceptable range",
            Limited::TooManyReplicas => "the desired replica count is more than the maximum replica count",
            Limited::TooFewReplicas => "the desired replica count is less than the minimum replica count",
            Limited::ScaleUpLimit => "the desired replica count is increasing faster than the maximum scale rate",
            Limited::ScaleDownLimit => "the desired replica count is decreasing faster than the maximum scale rate",
        }
    }
}

/// One autoscaler's memory: past recommendations and the replica changes it made.
#[derive(Debug, Default)]
pub struct History {
    recommendations: VecDeque<(i64, Instant)>,
    /// Replicas added (positive) or removed (negative), and when.
    changes: VecDeque<(i64, Instant)>,
}

/// The outcome of one normalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalized {
    pub replicas: i64,
    pub limited: Limited,
    /// The stabilization windows held the recommendation back.
    pub stabilized: bool,
}

impl History {
    /// Applies the windows, the policies and the bounds to a new `recommendation` for a target
    /// now at `current` replicas, and remembers the recommendation.
    pub fn normalize(&mut self, limits: &Limits, current: i64, recommendation: i64, now: Instant) -> Normalized {
        let stable = self.stabilize(limits, current, recommendation, now);
        let (replicas, limited) = self.limit(limits, current, stable, now);
        Normalized { replicas, limited, stabilized: stable != recommendation }
    }

    /// The recommendation the windows allow: no higher than the lowest recommendation of the
    /// scale-up window, no lower than the highest of the scale-down window.
    fn stabilize(&mut self, limits: &Limits, current: i64, recommendation: i64, now: Instant) -> i64 {
        let (mut up, mut down) = (recommendation, recommendation);
        for &(r, at) in &self.recommendations {
            let age = now.saturating_duration_since(at);
            if age < limits.up.window {
                up = up.min(r);
            }
            if age < limits.down.window {
                down = down.max(r);
            }
        }
        let keep = limits.up.window.max(limits.down.window);
        self.recommendations.retain(|(_, at)| now.saturating_duration_since(*at) < keep);
        self.recommendations.push_back((recommendation, now));
        let mut stable = current;
        if stable < up {
            stable = up;
        }
        if stable > down {
            stable = down;
        }
        stable
    }

    /// Replicas changed in the last `period` in the direction `sign` (1 up, -1 down), as a count.
    fn changed_within(&self, period: Duration, sign: i64, now: Instant) -> i64 {
        self.changes
            .iter()
            .filter(|(c, at)| c.signum() == sign && now.saturating_duration_since(*at) < period)
            .map(|(c, _)| c.abs())
            .sum()
    }

    fn limit(&self, limits: &Limits, current: i64, stable: i64, now: Instant) -> (i64, Limited) {
        if stable > current {
            let rate = self.scale_up_limit(&limits.up, current, now).max(current);
            let (cap, reason) =
                if limits.max > rate { (rate, Limited::ScaleUpLimit) } else { (limits.max, Limited::TooManyReplicas) };
            return if stable > cap { (cap, reason) } else { (stable, Limited::No) };
        }
        if stable < current {
            let rate = self.scale_down_limit(&limits.down, current, now).min(current);
            let (floor, reason) =
                if limits.min > rate { (limits.min, Limited::TooFewReplicas) } else { (rate, Limited::ScaleDownLimit) };
            return if stable < floor { (floor, reason) } else { (stable, Limited::No) };
        }
        if stable > limits.max {
            return (limits.max, Limited::TooManyReplicas);
        }
        if stable < limits.min {
            return (limits.min, Limited::TooFewReplicas);
        }
        (stable, Limited::No)
    }

    fn scale_up_limit(&self, rules: &Rules, current: i64, now: Instant) -> i64 {
        let pick: fn(i64, i64) -> i64 = match rules.select {
            Select::Disabled => return current,
            Select::Max => i64::max,
            Select::Min => i64::min,
        };
        let mut result: Option<i64> = None;
        for p in &rules.policies {
            let start = current - self.changed_within(p.period(), 1, now);
            let proposed = match *p {
                Policy::Pods { value, .. } => start + value,
                Policy::Percent { value, .. } => (start as f64 * (1.0 + value as f64 / 100.0)).ceil() as i64,
            };
            result = Some(result.map_or(proposed, |r| pick(r, proposed)));
        }
        result.unwrap_or(current)
    }

    fn scale_down_limit(&self, rules: &Rules, current: i64, now: Instant) -> i64 {
        let pick: fn(i64, i64) -> i64 = match rules.select {
            Select::Disabled => return current,
            Select::Max => i64::min,
            Select::Min => i64::max,
        };
        let mut result: Option<i64> = None;
        for p in &rules.policies {
            let start = current + self.changed_within(p.period(), -1, now);
            let proposed = match *p {
                Policy::Pods { value, .. } => start - value,
                Policy::Percent { value, .. } => (start as f64 * (1.0 - value as f64 / 100.0)) as i64,
            };
            result = Some(result.map_or(proposed, |r| pick(r, proposed)));
        }
        result.unwrap_or(current)
    }

    /// Remembers a rescale from `from` to `to` replicas (for the policies' periods).
    pub fn record_change(&mut self, limits: &Limits, from: i64, to: i64, now: Instant) {
        let longest = limits.up.policies.iter().chain(&limits.down.policies).map(Policy::period).max().unwrap_or_default();
        self.changes.retain(|(_, at)| now.saturating_duration_since(*at) < longest);
        if to != from {
            self.changes.push_back((to - from, now));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shepherd_api::defaults::autoscaling::behavior_with_defaults;

    use super::*;

    fn limits(behavior: Value, min: i64, max: i64) -> Limits {
        let b = behavior_with_defaults(Some(&behavior));
        Limits { min, max, up: Rules::from_json(&b["scaleUp"]), down: Rules::from_json(&b["scaleDown"]) }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[tokio::test(start_paused = true)]
    async fn a_scale_down_waits_for_the_highest_recommendation_to_leave_its_window() {
        let l = limits(json!({"scaleDown": {"stabilizationWindowSeconds": 60}}), 1, 10);
        let mut h = History::default();
        assert_eq!(h.normalize(&l, 5, 5, Instant::now()).replicas, 5);
        tokio::time::advance(S(20)).await;
        let n = h.normalize(&l, 5, 2, Instant::now());
        assert_eq!((n.replicas, n.stabilized), (5, true), "the recommendation of 5 twenty seconds ago holds");
        tokio::time::advance(S(39)).await;
        assert_eq!(h.normalize(&l, 5, 2, Instant::now()).replicas, 5, "59 s after it, still inside the window");
        tokio::time::advance(S(2)).await;
        assert_eq!(h.normalize(&l, 5, 2, Instant::now()).replicas, 2, "61 s after it, the window has let go");
    }

    #[tokio::test(start_paused = true)]
    async fn a_scale_up_is_immediate_by_default_but_capped_by_the_larger_of_4_pods_and_100_percent() {
        let l = limits(json!({}), 1, 100);
        let mut h = History::default();
        let n = h.normalize(&l, 1, 20, Instant::now());
        assert_eq!((n.replicas, n.limited), (5, Limited::ScaleUpLimit), "1 + 4 pods beats 1 * 200%");
        h.record_change(&l, 1, 5, Instant::now());
        tokio::time::advance(S(5)).await;
        let n = h.normalize(&l, 5, 20, Instant::now());
        assert_eq!(n.replicas, 5, "the 15 s period started at 1 replica and already added 4");
        tokio::time::advance(S(11)).await;
        let n = h.normalize(&l, 5, 20, Instant::now());
        assert_eq!(n.replicas, 10, "a new period: 5 doubled beats 5 + 4");
    }

    #[tokio::test(start_paused = true)]
    async fn select_policy_min_takes_the_smaller_rate_and_disabled_forbids_the_direction() {
        let up = json!({"scaleUp": {"selectPolicy": "Min", "policies": [
            {"type": "Pods", "value": 1, "periodSeconds": 60}, {"type": "Percent", "value": 50, "periodSeconds": 60}]},
            "scaleDown": {"selectPolicy": "Disabled", "stabilizationWindowSeconds": 0}});
        let l = limits(up, 1, 10);
        let mut h = History::default();
        assert_eq!(h.normalize(&l, 4, 9, Instant::now()).replicas, 5, "min(4 + 1, 4 * 150%)");
        let n = h.normalize(&l, 4, 1, Instant::now());
        assert_eq!((n.replicas, n.limited), (4, Limited::ScaleDownLimit));
    }

    #[tokio::test(start_paused = true)]
    async fn percent_scale_down_counts_from_the_replicas_at_the_start_of_the_period() {
        let down = json!({"scaleDown": {"stabilizationWindowSeconds": 0,
            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 30}]}});
        let l = limits(down, 1, 10);
        let mut h = History::default();
        assert_eq!(h.normalize(&l, 8, 1, Instant::now()).replicas, 4);
        h.record_change(&l, 8, 4, Instant::now());
        tokio::time::advance(S(10)).await;
        assert_eq!(h.normalize(&l, 4, 1, Instant::now()).replicas, 4, "the period began at 8: half is 4, reached");
        tokio::time::advance(S(21)).await;
        assert_eq!(h.normalize(&l, 4, 1, Instant::now()).replicas, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn bounds_win_over_everything_and_say_which_one_held() {
        let l = limits(json!({"scaleDown": {"stabilizationWindowSeconds": 0}}), 2, 6);
        let mut h = History::default();
        let n = h.normalize(&l, 3, 50, Instant::now());
        assert_eq!((n.replicas, n.limited), (6, Limited::TooManyReplicas));
        let n = h.normalize(&l, 3, 1, Instant::now());
        assert_eq!((n.replicas, n.limited), (2, Limited::TooFewReplicas));
        let n = h.normalize(&l, 3, 3, Instant::now());
        assert_eq!((n.replicas, n.limited), (3, Limited::No));
    }
}
