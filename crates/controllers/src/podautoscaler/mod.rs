//! The HorizontalPodAutoscaler controller (`autoscaling/v2`): every sync period it reads the
//! target's scale, its pods and their `metrics.k8s.io` PodMetrics, asks each Resource metric for a
//! replica count (`replicas`), takes the largest, passes it through the behavior (`behavior`) and
//! the bounds, and writes the replicas through the target's `scale` subresource, so any kind that
//! serves one (Deployment, StatefulSet, ReplicaSet, ReplicationController, a custom resource with
//! `subresources.scale`) is a target; status, conditions and Events as Kubernetes reports them.

pub mod behavior;
pub mod replicas;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::defaults::autoscaling::behavior_with_defaults;
use shepherd_api::quantity::{self, milli_value};
use shepherd_api::{ApiError, JsonPath, LabelSelector, kinds};
use shepherd_api::{meta, pod};
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, ListParams, Manager, Patch, Reconciler};
use tokio::time::Instant;

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::podutil;
use behavior::{History, Limited, Limits, Rules};
use replicas::{CpuSample, Initialization, PodInfo, Target, sample_counts};

/// How the autoscaler runs.
#[derive(Debug, Clone, Copy)]
pub struct AutoscalerConfig {
    pub run: ControllerConfig,
    /// How often each autoscaler is evaluated (kube-controller-manager's
    /// `--horizontal-pod-autoscaler-sync-period`, 15 s).
    pub sync_period: Duration,
    /// How long a starting pod's CPU is distrusted.
    pub init: Initialization,
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        AutoscalerConfig { run: ControllerConfig::default(), sync_period: Duration::from_secs(15), init: Initialization::default() }
    }
}

/// Builds the HorizontalPodAutoscaler controller. It reads pods from the manager's shared cache.
pub fn horizontal_pod_autoscaler_controller(client: Arc<dyn Client>, manager: &Manager, config: AutoscalerConfig) -> Controller {
    let reconciler = Autoscaler {
        events: EventRecorder::new(client.clone(), "horizontal-pod-autoscaler"),
        client,
        pods: manager.informers().cache(&kinds::POD),
        histories: Mutex::default(),
        sync_period: config.sync_period,
        init: config.init,
    };
    Controller::new("horizontalpodautoscaler", &kinds::HORIZONTALPODAUTOSCALER, reconciler)
        .workers(config.run.workers)
        .mode(config.run.mode)
}

struct Autoscaler {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    events: EventRecorder,
    /// Recommendations and rescales of each autoscaler (`namespace/name`), for its behavior.
    histories: Mutex<HashMap<String, History>>,
    sync_period: Duration,
    init: Initialization,
}

#[async_trait]
impl Reconciler for Autoscaler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("default", key));
        let hpa = match self.client.get(&kinds::HORIZONTALPODAUTOSCALER, Some(ns), name).await {
            Ok(h) if !meta::is_deleting(&h) => h,
            Ok(_) => return Ok(Action::Done),
            Err(e) if e.is_not_found() => {
                self.histories.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
                return Ok(Action::Done);
            }
            Err(e) => return Err(e.into()),
        };
        self.sync(key, ns, &hpa).await?;
        Ok(Action::RequeueAfter(self.sync_period))
    }
}

/// The conditions of one sync, in Kubernetes' order.
struct Conditions(Vec<(&'static str, bool, &'static str, String)>);

impl Conditions {
    fn set(&mut self, type_: &'static str, ok: bool, reason: &'static str, message: impl Into<String>) {
        self.0.retain(|c| c.0 != type_);
        self.0.push((type_, ok, reason, message.into()));
    }

    /// As status conditions, keeping `lastTransitionTime` of those whose status did not change.
    fn render(&self, old: &Value, now: &str) -> Value {
        let old = old.at("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut out: Vec<Value> = Vec::new();
        for type_ in ["AbleToScale", "ScalingActive", "ScalingLimited"] {
            let Some((_, ok, reason, message)) = self.0.iter().find(|c| c.0 == type_) else { continue };
            let status = if *ok { "True" } else { "False" };
            let since = old
                .iter()
                .find(|c| c["type"] == type_ && c["status"] == status)
                .and_then(|c| c["lastTransitionTime"].as_str())
                .unwrap_or(now);
            out.push(json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}));
        }
        Value::Array(out)
    }
}

/// The target's `autoscaling/v1` Scale as read through its `scale` subresource: replicas asked
/// for and running, and its pod selector (`status.selector`, in the string syntax).
struct Scale {
    res: &'static kinds::ResourceInfo,
    /// The Scale as read, written back with the new replicas (its resourceVersion a precondition).
    read: Value,
    spec: i64,
    status: i64,
    selector: Result<LabelSelector, String>,
}

fn read_scale(res: &'static kinds::ResourceInfo, scale: Value) -> Scale {
    let selector = match scale.at("/status/selector").and_then(Value::as_str).map(LabelSelector::parse) {
        Some(Ok(s)) if !s.is_empty() => Ok(s),
        Some(Ok(_)) | None => Err("the target's scale has no selector".to_string()),
        Some(Err(e)) => Err(e.to_string()),
    };
    Scale {
        res,
        spec: scale.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(0),
        status: scale.at("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
        selector,
        read: scale,
    }
}

/// The group of an `apiVersion` (`apps/v1`: `apps`; `v1`: the core group, empty).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// A pod as the calculation for `resource` reads it; `metrics` is its PodMetrics, if any.
fn pod_info(pod: &Value, resource: &str, metrics: Option<&Value>, now: jiff::Timestamp, init: &Initialization) -> PodInfo {
    let name = meta::name(pod).to_string();
    let phase = pod.at("/status/phase").and_then(Value::as_str).unwrap_or("");
    let condition = pod
        .at("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| (c["status"] == "True", c["lastTransitionTime"].as_str().and_then(podutil::parse_time)));
    // Only CPU is distrusted while a pod starts, as in Kubernetes; other resources count as measured.
    let ready = match metrics {
        Some(m) if resource == "cpu" => {
            let sample = CpuSample {
                started: pod.at("/status/startTime").and_then(Value::as_str).and_then(podutil::parse_time),
                ready: condition.and_then(|(ready, since)| Some((ready, since?))),
                taken: m["timestamp"].as_str().and_then(podutil::parse_time).unwrap_or(now),
                window: m["window"].as_str().and_then(|w| shepherd_api::duration::parse(w).ok()).unwrap_or_default(),
            };
            sample_counts(&sample, now, init)
        }
        Some(_) => true,
        None => condition.is_some_and(|(ready, _)| ready),
    };
    let mut request: Result<i128, String> = Ok(0);
    for c in pod.at("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
        let cname = c["name"].as_str().unwrap_or("");
        let q = pod::container_request_milli(c, resource);
        request = match (request, q) {
            (Ok(sum), Some(q)) => Ok(sum + q),
            (Ok(_), None) => Err(format!("missing request for {resource} in container {cname} of Pod {name}")),
            (e, _) => e,
        };
    }
    PodInfo { name, ready, ignored: meta::is_deleting(pod) || matches!(phase, "Pending" | "Failed" | "Succeeded"), request }
}

/// A milli-unit amount of `resource` as a quantity: millicores, or bytes for memory.
fn quantity(resource: &str, milli: i128) -> String {
    if resource == "memory" { format!("{}", milli / 1000) } else { format!("{milli}m") }
}

/// Each pod's total usage of `resource` (milli-units) from its PodMetrics.
fn usage_of(metrics: &[Value], resource: &str) -> HashMap<String, i128> {
    metrics
        .iter()
        .filter_map(|m| {
            let containers = m["containers"].as_array()?;
            let mut total = 0i128;
            for c in containers {
                total += quantity::text(c.at(&format!("/usage/{resource}"))?).and_then(|q| milli_value(&q).ok())?;
            }
            Some((meta::name(m).to_string(), total))
        })
        .collect()
}

/// The outcome of the metrics: the largest proposal and the metric that made it, the
/// current values for status, and what went wrong.
struct Evaluated {
    proposal: Option<(i64, String)>,
    current_metrics: Vec<Value>,
    errors: Vec<String>,
    first_metric: String,
}

impl Autoscaler {
    fn limits(hpa: &Value, min: i64, max: i64) -> Limits {
        let b = behavior_with_defaults(hpa.at("/spec/behavior"));
        Limits { min, max, up: Rules::from_json(&b["scaleUp"]), down: Rules::from_json(&b["scaleDown"]) }
    }

    async fn evaluate(&self, ns: &str, hpa: &Value, current: i64, selector: &LabelSelector) -> Evaluated {
        let pods: Vec<Arc<Value>> = self.pods.by_namespace_where(ns, |p| p.matches(selector));
        let metrics = match self.client.list(&kinds::POD_METRICS, &ListParams::namespace(ns)).await {
            Ok(l) => Ok(l.items),
            Err(e) => Err(format!("unable to fetch metrics from resource metrics API: {e}")),
        };
        let mut out = Evaluated { proposal: None, current_metrics: Vec::new(), errors: Vec::new(), first_metric: String::new() };
        for m in hpa.at("/spec/metrics").and_then(Value::as_array).into_iter().flatten() {
            let resource = m.at("/resource/name").and_then(Value::as_str).unwrap_or("cpu");
            let target = match m.at("/resource/target/type").and_then(Value::as_str) {
                Some("Utilization") => Target::Utilization(m.at("/resource/target/averageUtilization").and_then(Value::as_i64).unwrap_or(80)),
                _ => match m.at("/resource/target/averageValue").and_then(quantity::text).and_then(|q| milli_value(&q).ok()) {
                    Some(v) => Target::AverageValue(v),
                    None => continue,
                },
            };
            let what = match target {
                Target::Utilization(_) => format!("{resource} resource utilization (percentage of request)"),
                Target::AverageValue(_) => format!("{resource} resource"),
            };
            if out.first_metric.is_empty() {
                out.first_metric = what.clone();
            }
            let metrics = match &metrics {
                Ok(m) => m,
                Err(e) => {
                    out.errors.push(format!("failed to get {resource} utilization: {e}"));
                    continue;
                }
            };
            let by_name: HashMap<&str, &Value> = metrics.iter().map(|m| (meta::name(m), m)).collect();
            let now = podutil::now();
            let infos: Vec<PodInfo> =
                pods.iter().map(|p| pod_info(p, resource, by_name.get(meta::name(p)).copied(), now, &self.init)).collect();
            let usage = usage_of(metrics, resource);
            match replicas::replicas(current, &infos, &usage, target) {
                Ok(p) => {
                    let mut cur = json!({"averageValue": quantity(resource, p.average)});
                    if let Some(u) = p.utilization {
                        cur["averageUtilization"] = json!(u);
                    }
                    out.current_metrics.push(json!({"type": "Resource", "resource": {"name": resource, "current": cur}}));
                    if out.proposal.as_ref().is_none_or(|(r, _)| p.replicas > *r) {
                        out.proposal = Some((p.replicas, what));
                    }
                }
                Err(e) => out.errors.push(format!("failed to get {resource} utilization: {e}")),
            }
        }
        out
    }

    async fn sync(&self, key: &str, ns: &str, hpa: &Value) -> Result<(), ApiError> {
        let now = podutil::format_time(podutil::now());
        let spec = hpa.get("spec").cloned().unwrap_or(Value::Null);
        let min = spec["minReplicas"].as_i64().unwrap_or(1);
        let max = spec["maxReplicas"].as_i64().unwrap_or(min);
        let target_ref = &spec["scaleTargetRef"];
        let (kind, target_name) = (target_ref["kind"].as_str().unwrap_or(""), target_ref["name"].as_str().unwrap_or(""));
        let api_version = target_ref["apiVersion"].as_str().unwrap_or("");
        let mut conds = Conditions(Vec::new());
        let mut status = json!({
            "observedGeneration": hpa.at("/metadata/generation").cloned().unwrap_or(json!(1)),
            "currentReplicas": 0,
            "desiredReplicas": hpa.at("/status/desiredReplicas").cloned().unwrap_or(json!(0)),
        });
        if let Some(t) = hpa.at("/status/lastScaleTime") {
            status["lastScaleTime"] = t.clone();
        }

        // Any kind that serves `scale` is a target; the API server refuses the others, and that
        // refusal is the condition's message, as in Kubernetes.
        let res = kinds::by_api_version_kind(api_version, kind).or_else(|| kinds::by_kind(kind));
        let target = match res {
            None => Err(format!("no matches for kind \"{kind}\" in group \"{}\"", group_of(api_version))),
            Some(r) => match self.client.get_scale(r, Some(ns), target_name).await {
                Ok(scale) => Ok((r, scale)),
                Err(e) => Err(e.to_string()),
            },
        };
        let scale = match target {
            Ok((r, scale)) => read_scale(r, scale),
            Err(why) => {
                let message = format!("the HPA controller was unable to get the target's current scale: {why}");
                conds.set("AbleToScale", false, "FailedGetScale", message.clone());
                self.events.record(hpa, EventType::Warning, "FailedGetScale", &message).await;
                status["conditions"] = conds.render(hpa, &now);
                return self.write_status(ns, hpa, status).await;
            }
        };
        status["currentReplicas"] = json!(scale.status);
        conds.set("AbleToScale", true, "SucceededGetScale", "the HPA controller was able to get the target's current scale");
        let current = scale.spec;
        let selector = match &scale.selector {
            Ok(s) => s.clone(),
            Err(why) => {
                conds.set("ScalingActive", false, "InvalidSelector", format!("the HPA target's scale has an invalid selector: {why}"));
                status["conditions"] = conds.render(hpa, &now);
                return self.write_status(ns, hpa, status).await;
            }
        };

        let (desired, reason) = if current == 0 && min != 0 {
            conds.set("ScalingActive", false, "ScalingDisabled", "scaling is disabled since the replica count of the target is zero");
            (0, String::new())
        } else if current > max {
            conds.set("ScalingLimited", true, "TooManyReplicas", Limited::TooManyReplicas.message());
            (max, "Current number of replicas above Spec.MaxReplicas".to_string())
        } else if current < min {
            conds.set("ScalingLimited", true, "TooFewReplicas", Limited::TooFewReplicas.message());
            (min, "Current number of replicas below Spec.MinReplicas".to_string())
        } else {
            let evaluated = self.evaluate(ns, hpa, current, &selector).await;
            status["currentMetrics"] = json!(evaluated.current_metrics);
            for e in &evaluated.errors {
                self.events.record(hpa, EventType::Warning, "FailedGetResourceMetric", e).await;
            }
            let Some((proposal, metric)) = evaluated.proposal else {
                let why = evaluated.errors.join("; ");
                conds.set("ScalingActive", false, "FailedGetResourceMetric", format!("the HPA was unable to compute the replica count: {why}"));
                status["desiredReplicas"] = json!(current);
                status["conditions"] = conds.render(hpa, &now);
                return self.write_status(ns, hpa, status).await;
            };
            conds.set(
                "ScalingActive",
                true,
                "ValidMetricFound",
                format!("the HPA was able to successfully calculate a replica count from {}", evaluated.first_metric),
            );
            let limits = Self::limits(hpa, min, max);
            let normalized = {
                let mut histories = self.histories.lock().unwrap_or_else(|e| e.into_inner());
                histories.entry(key.to_string()).or_default().normalize(&limits, current, proposal, Instant::now())
            };
            conds.set("ScalingLimited", normalized.limited != Limited::No, normalized.limited.reason(), normalized.limited.message());
            if normalized.stabilized && proposal < current {
                conds.set("AbleToScale", true, "ScaleDownStabilized",
                    "recent recommendations were higher than current one, applying the highest recent recommendation");
            } else if normalized.stabilized {
                conds.set("AbleToScale", true, "ScaleUpStabilized",
                    "recent recommendations were lower than current one, applying the lowest recent recommendation");
            } else {
                conds.set("AbleToScale", true, "ReadyForNewScale", "recommended size matches current size");
            }
            let reason = if proposal > current { format!("{metric} above target") } else { "All metrics below target".to_string() };
            (normalized.replicas, reason)
        };

        if desired != current && !(current == 0 && min != 0) {
            let mut write = scale.read.clone();
            write["spec"]["replicas"] = json!(desired);
            match self.client.update_scale(scale.res, Some(ns), target_name, write).await {
                Ok(_) => {
                    let message = format!("New size: {desired}; reason: {reason}");
                    self.events.record(hpa, EventType::Normal, "SuccessfulRescale", &message).await;
                    conds.set("AbleToScale", true, "SucceededRescale", format!("the HPA controller was able to update the target scale to {desired}"));
                    status["lastScaleTime"] = json!(now);
                    let limits = Self::limits(hpa, min, max);
                    let mut histories = self.histories.lock().unwrap_or_else(|e| e.into_inner());
                    histories.entry(key.to_string()).or_default().record_change(&limits, current, desired, Instant::now());
                    tracing::info!(hpa = key, from = current, to = desired, %reason, "rescaled");
                }
                Err(e) => {
                    let message = format!("failed to rescale {kind}/{target_name}: {e}");
                    conds.set("AbleToScale", false, "FailedUpdateScale", message.clone());
                    self.events.record(hpa, EventType::Warning, "FailedRescale", &message).await;
                }
            }
        }
        status["desiredReplicas"] = json!(desired);
        status["conditions"] = conds.render(hpa, &now);
        self.write_status(ns, hpa, status).await
    }

    async fn write_status(&self, ns: &str, hpa: &Value, status: Value) -> Result<(), ApiError> {
        let unchanged = hpa.get("status").is_some_and(|old| {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(m) = v.as_object_mut() {
                    m.remove("conditions");
                }
                v
            };
            strip(old) == strip(&status) && old["conditions"] == status["conditions"]
        });
        if unchanged {
            return Ok(());
        }
        let patch = Patch::Merge(json!({"status": status}));
        self.client.patch_status(&kinds::HORIZONTALPODAUTOSCALER, Some(ns), meta::name(hpa), patch).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_reads_as_unready_ignored_or_missing_a_request_as_the_calculation_needs() {
        let pod = json!({"metadata": {"name": "web-1"}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]},
            "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "250m"}}},
                {"name": "b", "resources": {"requests": {"cpu": "0.25", "memory": "1Mi"}}}]}});
        let (now, init) = (podutil::now(), Initialization::default());
        let info = pod_info(&pod, "cpu", None, now, &init);
        assert_eq!((info.ready, info.ignored, info.request), (true, false, Ok(500)));
        assert_eq!(pod_info(&pod, "memory", None, now, &init).request, Err("missing request for memory in container a of Pod web-1".into()));
        for phase in ["Failed", "Pending"] {
            let mut other = pod.clone();
            other["status"]["phase"] = json!(phase);
            assert!(pod_info(&other, "cpu", None, now, &init).ignored, "{phase}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_starting_pod_s_cpu_is_distrusted_until_a_whole_window_after_ready_on_the_autoscaler_s_clock() {
        let init = Initialization::default();
        let t0 = podutil::parse_time(&podutil::format_time(podutil::now())).expect("time");
        let at = |s: i64| podutil::format_time(t0.checked_add(jiff::SignedDuration::from_secs(s)).expect("time"));
        let pod = json!({"metadata": {"name": "web-1"}, "status": {"phase": "Running", "startTime": at(0),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at(5)}]},
            "spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "1Mi"}}}]}});
        let sample = |s: i64| json!({"metadata": {"name": "web-1"}, "timestamp": at(s), "window": "15s",
            "containers": [{"name": "a", "usage": {"cpu": "900m", "memory": "1Mi"}}]});

        tokio::time::advance(Duration::from_secs(12)).await;
        let early = sample(11);
        assert!(!pod_info(&pod, "cpu", Some(&early), podutil::now(), &init).ready, "its window reaches back before Ready");
        assert!(pod_info(&pod, "memory", Some(&early), podutil::now(), &init).ready, "only CPU is distrusted");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(pod_info(&pod, "cpu", Some(&sample(21)), podutil::now(), &init).ready, "a whole window after Ready");

        let mut never = pod.clone();
        never["status"]["conditions"][0] = json!({"type": "Ready", "status": "False", "lastTransitionTime": at(10)});
        tokio::time::advance(init.cpu_period).await;
        let late = sample(320);
        assert!(!pod_info(&never, "cpu", Some(&late), podutil::now(), &init).ready, "never ready since it started: left out");
        never["status"]["conditions"][0]["lastTransitionTime"] = json!(at(200));
        assert!(pod_info(&never, "cpu", Some(&late), podutil::now(), &init).ready, "ready once, unready later: its CPU counts");
    }

    #[test]
    fn pod_metrics_add_up_their_containers_in_milli_units() {
        let metrics = [json!({"metadata": {"name": "web-1"}, "containers": [
            {"name": "a", "usage": {"cpu": "150000000n", "memory": "1024Ki"}},
            {"name": "b", "usage": {"cpu": "50m", "memory": "1Ki"}}]})];
        let cpu = usage_of(&metrics, "cpu");
        assert_eq!(cpu["web-1"], 200);
        assert_eq!(usage_of(&metrics, "memory")["web-1"], 1025 * 1024 * 1000);
        assert_eq!(quantity("cpu", 200), "200m");
        assert_eq!(quantity("memory", 2048 * 1000), "2048");
    }

    #[test]
    fn a_scale_s_string_selector_picks_the_target_s_pods() {
        let scale = json!({"spec": {"replicas": 3}, "status": {"replicas": 2, "selector": "app=web,tier in (a,b)"}});
        let s = read_scale(&kinds::STATEFULSET, scale);
        assert_eq!((s.spec, s.status), (3, 2));
        let selector = s.selector.expect("selector");
        assert!(selector.matches_object(&json!({"metadata": {"labels": {"app": "web", "tier": "a"}}})));
        assert!(!selector.matches_object(&json!({"metadata": {"labels": {"app": "web"}}})));
        let unselective = read_scale(&kinds::STATEFULSET, json!({"spec": {"replicas": 1}, "status": {"selector": ""}}));
        assert_eq!(unselective.selector.err().as_deref(), Some("the target's scale has no selector"));
        assert_eq!((group_of("apps/v1"), group_of("v1")), ("apps", ""));
    }
}
