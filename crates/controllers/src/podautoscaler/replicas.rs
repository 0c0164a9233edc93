//! The replica count one Resource metric asks for, as Kubernetes' replica calculator works it out:
//! the ratio of the pods' usage to the target, within a tolerance of 10% no change, and the
//! cautious treatment of pods without metrics (taken to use their whole request when scaling
//! down, nothing when scaling up) and of unready pods (nothing, when scaling up).

use std::collections::HashMap;
use std::time::Duration;

/// Within this ratio of the target nothing changes (kube-controller-manager's default).
pub const TOLERANCE: f64 = 0.1;

/// What the metric aims for, in the resource's milli-units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// `averageUtilization`: percent of the pods' requests.
    Utilization(i64),
    /// `averageValue`: per pod, in milli-units (millicores, millibytes).
    AverageValue(i128),
}

/// One pod the target's selector picked, as the calculation reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    pub name: String,
    /// Its sample counts as a ready pod's ([`sample_counts`] for CPU; always for other resources).
    pub ready: bool,
    /// Pending, Failed, or being deleted: not counted at all.
    pub ignored: bool,
    /// The sum of its containers' requests of the resource (milli-units); `None` when a
    /// container requests none, naming it.
    pub request: Result<i128, String>,
}

/// The result for one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub replicas: i64,
    /// Average utilization of the measured pods, percent of request (Utilization targets only).
    pub utilization: Option<i64>,
    /// Average usage per measured pod, milli-units.
    pub average: i128,
}

/// Why no proposal could be made (the `FailedGetResourceMetric` condition's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    #[error("{0}")]
    MissingRequest(String),
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoMetrics,
}

/// How long after a pod starts its CPU is not trusted (kube-controller-manager's
/// `--horizontal-pod-autoscaler-cpu-initialization-period` and
/// `--horizontal-pod-autoscaler-initial-readiness-delay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Initialization {
    /// Within this of its start a pod's CPU sample counts only if the pod is Ready and the
    /// sample covers a whole window since it became so (5 min by default).
    pub cpu_period: Duration,
    /// After the period, an unready pod that has never been ready is still skipped if it turned
    /// unready within this of its start (30 s by default).
    pub readiness_delay: Duration,
}

impl Default for Initialization {
    fn default() -> Self {
        Initialization { cpu_period: Duration::from_secs(300), readiness_delay: Duration::from_secs(30) }
    }
}

/// What a pod's CPU sample is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSample {
    /// `status.startTime`.
    pub started: Option<jiff::Timestamp>,
    /// The Ready condition: its status and `lastTransitionTime`.
    pub ready: Option<(bool, jiff::Timestamp)>,
    /// The PodMetrics' `timestamp` and `window`: the sample covers `[timestamp - window, timestamp]`.
    pub taken: jiff::Timestamp,
    pub window: Duration,
}

/// Whether a pod's CPU sample counts as a ready pod's, as Kubernetes decides: a pod just started
/// burns CPU initialising, so within `cpu_period` of its start only a Ready pod whose sample was
/// taken a whole window after it turned Ready counts; later, only a pod that turned unready
/// within `readiness_delay` of its start (it never became ready) is left out.
pub fn sample_counts(sample: &CpuSample, now: jiff::Timestamp, init: &Initialization) -> bool {
    let (Some(started), Some((ready, since))) = (sample.started, sample.ready) else { return false };
    let plus = |t: jiff::Timestamp, d: Duration| jiff::SignedDuration::try_from(d).ok().and_then(|d| t.checked_add(d).ok()).unwrap_or(t);
    if plus(started, init.cpu_period) > now {
        ready && sample.taken >= plus(since, sample.window)
    } else {
        ready || plus(started, init.readiness_delay) <= since
    }
}

/// The replicas `target` asks for, given the usage (milli-units) of the pods that have metrics.
pub fn replicas(current: i64, pods: &[PodInfo], usage: &HashMap<String, i128>, target: Target) -> Result<Proposal, CalcError> {
    let counted: Vec<&PodInfo> = pods.iter().filter(|p| !p.ignored).collect();
    if counted.is_empty() {
        return Err(CalcError::NoPods);
    }
    let mut requests: HashMap<&str, i128> = HashMap::new();
    if let Target::Utilization(_) = target {
        for p in &counted {
            match &p.request {
                Ok(r) => requests.insert(&p.name, *r),
                Err(why) => return Err(CalcError::MissingRequest(why.clone())),
            };
        }
    }
    let mut ready_measured = 0i64;
    let mut unready: Vec<&str> = Vec::new();
    let mut missing: Vec<&str> = Vec::new();
    let mut metrics: HashMap<&str, i128> = HashMap::new();
    for p in &counted {
        match usage.get(&p.name) {
            None => missing.push(&p.name),
            Some(_) if !p.ready => unready.push(&p.name),
            Some(u) => {
                ready_measured += 1;
                metrics.insert(&p.name, *u);
            }
        }
    }
    if metrics.is_empty() {
        return Err(CalcError::NoMetrics);
    }
    let ratio_of = |m: &HashMap<&str, i128>| -> (f64, Option<i64>, i128) {
        let total: i128 = m.values().sum();
        let average = total / m.len() as i128;
        match target {
            Target::Utilization(pct) => {
                let requested: i128 = m.keys().map(|k| requests.get(k).copied().unwrap_or(0)).sum();
                let utilization = if requested > 0 { (total * 100 / requested) as i64 } else { 0 };
                (utilization as f64 / pct.max(1) as f64, Some(utilization), average)
            }
            Target::AverageValue(per_pod) => (total as f64 / (per_pod.max(1) as f64 * m.len() as f64), None, average),
        }
    };
    let (ratio, utilization, average) = ratio_of(&metrics);
    let up_with_unready = !unready.is_empty() && ratio > 1.0;
    if missing.is_empty() && !up_with_unready {
        let replicas = if (1.0 - ratio).abs() <= TOLERANCE { current } else { (ratio * ready_measured as f64).ceil() as i64 };
        return Ok(Proposal { replicas, utilization, average });
    }
    // Assume the worst for the direction of the change: pods without metrics use their whole
    // request (or the target) when scaling down, nothing when scaling up; unready pods nothing.
    for name in &missing {
        let assumed = if ratio < 1.0 {
            match target {
                Target::Utilization(_) => requests.get(name).copied().unwrap_or(0),
                Target::AverageValue(v) => v,
            }
        } else {
            0
        };
        metrics.insert(name, assumed);
    }
    if up_with_unready {
        for name in &unready {
            metrics.insert(name, 0);
        }
    }
    let (new_ratio, _, _) = ratio_of(&metrics);
    let flips = (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0);
    if (1.0 - new_ratio).abs() <= TOLERANCE || flips {
        return Ok(Proposal { replicas: current, utilization, average });
    }
    let proposed = (new_ratio * metrics.len() as f64).ceil() as i64;
    let replicas = if (new_ratio < 1.0 && proposed > current) || (new_ratio > 1.0 && proposed < current) { current } else { proposed };
    Ok(Proposal { replicas, utilization, average })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, request: i128) -> PodInfo {
        PodInfo { name: name.into(), ready: true, ignored: false, request: Ok(request) }
    }

    fn usage(pairs: &[(&str, i128)]) -> HashMap<String, i128> {
        pairs.iter().map(|(n, u)| (n.to_string(), *u)).collect()
    }

    #[test]
    fn usage_above_target_scales_by_the_ratio_rounded_up() {
        let pods = [pod("a", 200), pod("b", 200)];
        let p = replicas(2, &pods, &usage(&[("a", 400), ("b", 300)]), Target::Utilization(50)).expect("proposal");
        assert_eq!(p, Proposal { replicas: 7, utilization: Some(175), average: 350 }, "175% of 50% on 2 pods: 7");
    }

    #[test]
    fn usage_within_ten_percent_of_the_target_changes_nothing() {
        let pods = [pod("a", 100), pod("b", 100), pod("c", 100)];
        let p = replicas(3, &pods, &usage(&[("a", 54), ("b", 54), ("c", 54)]), Target::Utilization(50)).expect("proposal");
        assert_eq!((p.replicas, p.utilization), (3, Some(54)));
        let p = replicas(3, &pods, &usage(&[("a", 56), ("b", 56), ("c", 56)]), Target::Utilization(50)).expect("proposal");
        assert_eq!(p.replicas, 4, "112% of target is outside the tolerance: ceil(1.12 * 3)");
    }

    #[test]
    fn idle_pods_scale_down_to_what_their_usage_needs() {
        let pods = [pod("a", 100), pod("b", 100), pod("c", 100), pod("d", 100)];
        let p = replicas(4, &pods, &usage(&[("a", 1), ("b", 2), ("c", 0), ("d", 1)]), Target::Utilization(50)).expect("proposal");
        assert_eq!(p.replicas, 1);
    }

    #[test]
    fn average_value_targets_compare_the_mean_usage_per_pod() {
        let pods = [pod("a", 0), pod("b", 0)];
        let p = replicas(2, &pods, &usage(&[("a", 300), ("b", 500)]), Target::AverageValue(200)).expect("proposal");
        assert_eq!((p.replicas, p.utilization, p.average), (4, None, 400));
    }

    #[test]
    fn a_pod_without_a_request_makes_utilization_unknown() {
        let mut pods = vec![pod("a", 100)];
        pods.push(PodInfo { request: Err("missing request for cpu in container web of Pod b".into()), ..pod("b", 0) });
        let e = replicas(2, &pods, &usage(&[("a", 100), ("b", 100)]), Target::Utilization(50)).unwrap_err();
        assert_eq!(e.to_string(), "missing request for cpu in container web of Pod b");
        assert!(replicas(2, &pods, &usage(&[("a", 100)]), Target::AverageValue(50)).is_ok(), "average values need no request");
    }

    #[test]
    fn pods_without_metrics_damp_a_scale_down_and_unready_pods_damp_a_scale_up() {
        let pods = [pod("a", 100), pod("b", 100), pod("c", 100), pod("d", 100)];
        // Two measured at 10% of request: alone they ask for 1 pod; the two unmeasured count as
        // using all of theirs, so the average is 55%: above the target, the direction flips, no change.
        let p = replicas(4, &pods, &usage(&[("a", 10), ("b", 10)]), Target::Utilization(50)).expect("proposal");
        assert_eq!(p.replicas, 4);
        let mut pods = vec![pod("a", 100), pod("b", 100)];
        pods[1].ready = false;
        // a at 200% of its request; b is unready and counts as 0, so the two average 100%: ceil(2 * 2).
        let p = replicas(2, &pods, &usage(&[("a", 200), ("b", 200)]), Target::Utilization(50)).expect("proposal");
        assert_eq!(p.replicas, 4);
        let p = replicas(2, &pods, &usage(&[("a", 60), ("b", 200)]), Target::Utilization(50)).expect("proposal");
        assert_eq!(p.replicas, 2, "a alone at 120% asks for more, but with b at 0 the average is 60%/2 = 30%: no change");
    }

    fn at(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000 + s).expect("timestamp")
    }

    #[test]
    fn a_starting_pod_s_cpu_counts_only_once_ready_for_a_whole_window() {
        let init = Initialization::default();
        // Started at 0, Ready at 10 s; 15 s samples.
        let sample = |taken: i64| CpuSample { started: Some(at(0)), ready: Some((true, at(10))), taken: at(taken), window: Duration::from_secs(15) };
        assert!(!sample_counts(&sample(20), at(21), &init), "the sample reaches back before the pod turned Ready");
        assert!(sample_counts(&sample(25), at(26), &init), "a whole window after Ready");
        let unready = CpuSample { ready: Some((false, at(10))), ..sample(60) };
        assert!(!sample_counts(&unready, at(61), &init), "unready within the initialization period");
        let unknown = CpuSample { started: None, ..sample(60) };
        assert!(!sample_counts(&unknown, at(61), &init), "a pod without a start time or Ready condition is unready");
    }

    #[test]
    fn after_the_initialization_period_only_a_pod_never_ready_is_left_out() {
        let init = Initialization::default();
        let window = Duration::from_secs(15);
        // A pod that turned unready 20 s after starting never became ready: still left out at 10 min.
        let never = CpuSample { started: Some(at(0)), ready: Some((false, at(20))), taken: at(600), window };
        assert!(!sample_counts(&never, at(600), &init));
        // One that fell unready long after it started was ready once: its CPU counts.
        let fell = CpuSample { ready: Some((false, at(400))), ..never };
        assert!(sample_counts(&fell, at(600), &init));
        // A Ready pod counts even with a sample from just after the transition.
        let ready = CpuSample { ready: Some((true, at(595))), ..never };
        assert!(sample_counts(&ready, at(600), &init));
    }

    #[test]
    fn no_pods_or_no_metrics_is_an_error_not_a_scale_to_zero() {
        assert_eq!(replicas(1, &[], &usage(&[]), Target::Utilization(50)), Err(CalcError::NoPods));
        let mut gone = pod("a", 100);
        gone.ignored = true;
        assert_eq!(replicas(1, &[gone], &usage(&[("a", 1)]), Target::Utilization(50)), Err(CalcError::NoPods));
        assert_eq!(replicas(1, &[pod("a", 100)], &usage(&[]), Target::Utilization(50)), Err(CalcError::NoMetrics));
    }
}
