//! The Job controller: runs pods to completion (`completions`, `parallelism`, Indexed mode), retries
//! failures with exponential back-off up to `backoffLimit`, applies `podFailurePolicy`,
//! `activeDeadlineSeconds`, `suspend` and `ttlSecondsAfterFinished`, and sets Complete or Failed.
//!
//! Counting survives restarts through the `batch.kubernetes.io/job-tracking` finalizer, as in
//! Kubernetes: every pod is created with it; a finished pod's uid is first written to
//! `status.uncountedTerminatedPods`, then its finalizer is removed, then the uid moves from there
//! into the counters. A pod without the finalizer was counted; a uid in the uncounted lists is
//! counted exactly once, whenever the controller gets to it. Indexed Jobs write the index to
//! `completedIndexes` in the first step, so a restarted controller never runs a succeeded index again.
//!
//! Pods are named `<job>-<n>` (Indexed: `<job>-<index>-<n>`) with the lowest free `n`, so a
//! retried create meets AlreadyExists instead of making a second pod.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::defaults::batch::JOB_NAME_LABEL;
use shepherd_api::{ApiError, JsonPath, kinds, meta, pod, strings_at};
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager, Patch, Propagation, Reconciler};
use tokio::time::Instant;

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::podutil;

/// The finalizer that keeps a finished pod until the Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Annotation (and label) carrying an Indexed Job pod's index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// How long a write this controller made may go unseen by the pod cache before it stops counting on it.
const EXPECTATION_TTL: Duration = Duration::from_secs(60);
/// Most pods created by one reconcile; the pods' own events bring the key back for more.
const BURST: usize = 500;
/// Most pod writes (creates, finalizer removals) in flight at once for one Job.
const MAX_BATCH: usize = 64;

/// The Job controller's own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobConfig {
    /// Back-off before the pod after the first failure; it doubles with each further failure.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for JobConfig {
    /// Kubernetes' 10 s doubling to 6 minutes.
    fn default() -> Self {
        JobConfig { backoff_base: Duration::from_secs(10), backoff_max: Duration::from_secs(360) }
    }
}

/// Builds the Job controller. It reads pods from the manager's shared cache and each Job live.
pub fn job_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig, job: JobConfig) -> Controller {
    let reconciler = JobReconciler {
        events: EventRecorder::new(client.clone(), "job-controller"),
        client,
        pods: manager.informers().cache(&kinds::POD),
        config: job,
        expectations: Mutex::default(),
    };
    Controller::new("job", &kinds::JOB, reconciler).owns(&kinds::POD).workers(config.workers).mode(config.mode)
}

/// Writes this controller made that the pod cache has not shown yet. Without them a reconcile
/// right after a create would create again, and one right after a finalizer removal would count
/// the pod again.
#[derive(Default)]
struct Expectations {
    /// Pod name to the revision that created it.
    creating: HashMap<String, (u64, Instant)>,
    /// Pod uid to the revision that removed its finalizer.
    uncounting: HashMap<String, (u64, Instant)>,
    /// Pods this controller deleted (excess, suspended, or the Job finished): not failures.
    deleted: HashSet<String>,
}

impl Expectations {
    fn prune(&mut self, observed: u64) {
        let pending = |rev: &u64, at: &Instant| *rev > observed && at.elapsed() < EXPECTATION_TTL;
        self.creating.retain(|_, (rev, at)| pending(rev, at));
        self.uncounting.retain(|_, (rev, at)| pending(rev, at));
    }
}

struct JobReconciler {
    client: Arc<dyn Client>,
    pods: Arc<Cache>,
    events: EventRecorder,
    config: JobConfig,
    /// By Job key. A key is reconciled by one worker at a time, so each entry has one writer.
    expectations: Mutex<HashMap<String, Expectations>>,
}

#[async_trait]
impl Reconciler for JobReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("default", key));
        let job = match self.client.get(&kinds::JOB, Some(ns), name).await {
            Ok(j) => Some(j),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        // Pods of an earlier Job of this name (or of this one, once it is gone or being deleted)
        // only need their finalizers removed, so that deletion can finish.
        let live_uid = job.as_ref().filter(|j| !meta::is_deleting(j)).map(|j| meta::uid(j).to_string());
        self.release_orphans(ns, name, live_uid.as_deref()).await?;
        let Some(job) = job.filter(|j| !meta::is_deleting(j)) else {
            self.lock().remove(key);
            return Ok(Action::Done);
        };
        self.sync(key, job).await
    }
}

/// What one pod means to its Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Active,
    Succeeded,
    /// Failed, and counts toward `backoffLimit`.
    Failed,
    /// Finished without counting: deleted by this controller, or a failure the policy ignores.
    Ignored,
}

/// What `podFailurePolicy` says of a failed pod.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PolicyAction {
    FailJob(String),
    Ignore,
    Count,
}

impl JobReconciler {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Expectations>> {
        self.expectations.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn release_orphans(&self, ns: &str, name: &str, live_uid: Option<&str>) -> Result<(), ApiError> {
        // A live Job's earlier namesakes are found by the job-name label; once it is gone, every pod
        // of the namespace is looked at, as its own pods may have been created with a manual selector.
        // Views pick the namesakes' pods; only those are read whole (for their finalizers).
        let candidates = match live_uid {
            Some(_) => self.pods.pod_views_by_label(JOB_NAME_LABEL, name),
            None => self.pods.pod_views_by_namespace(ns),
        };
        for view in candidates.into_iter().filter(|p| p.namespace() == Some(ns)) {
            let Some(owner) = view.controller() else { continue };
            if &*owner.kind != "Job" || &*owner.name != name || Some(&*owner.uid) == live_uid {
                continue;
            }
            let Some(pod) = self.pods.get(&view.key()).filter(|p| meta::uid(p) == view.uid()) else { continue };
            if meta::has_finalizer(&pod, TRACKING_FINALIZER) {
                self.remove_finalizer(&pod).await?;
            }
        }
        Ok(())
    }

    /// Removes the tracking finalizer; the revision it was removed at, `None` if the pod is gone.
    async fn remove_finalizer(&self, pod: &Value) -> Result<Option<u64>, ApiError> {
        let kept: Vec<&str> = meta::finalizers(pod).into_iter().filter(|f| *f != TRACKING_FINALIZER).collect();
        let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": meta::resource_version(pod)}});
        match self.client.patch(&kinds::POD, meta::namespace(pod), meta::name(pod), Patch::Merge(patch)).await {
            Ok(p) => Ok(Some(shepherd_runtime::cache::resource_version(&p).unwrap_or(u64::MAX))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn sync(&self, key: &str, mut job: Value) -> Result<Action, Error> {
        let uid = meta::uid(&job).to_string();
        let spec = job.get("spec").cloned().unwrap_or_else(|| json!({}));
        let indexed = spec.at("/completionMode").and_then(Value::as_str) == Some("Indexed");
        let completions = spec.at("/completions").and_then(Value::as_i64).map(|c| c.max(0) as usize);
        let parallelism = spec.at("/parallelism").and_then(Value::as_i64).unwrap_or(1).max(0) as usize;
        let backoff_limit = spec.at("/backoffLimit").and_then(Value::as_i64).unwrap_or(6).max(0) as usize;
        let suspended = spec.at("/suspend").and_then(Value::as_bool) == Some(true);
        let finished = finished_condition(&job).is_some();
        let now = podutil::now();

        let pods = self.pods.by_controller_uid(&uid);
        {
            let mut all = self.lock();
            let exp = all.entry(key.to_string()).or_default();
            exp.prune(self.pods.observed_revision());
        }

        // Classify every pod, and apply the failure policy to failed ones.
        let mut policy_failure: Option<String> = None;
        let mut outcomes: Vec<(Arc<Value>, Outcome)> = Vec::new();
        {
            let all = self.lock();
            let exp = all.get(key);
            for pod in &pods {
                let deleted_by_us = exp.is_some_and(|e| e.deleted.contains(meta::uid(pod)));
                let outcome = match pod::phase(pod) {
                    "Succeeded" => Outcome::Succeeded,
                    "Failed" if deleted_by_us => Outcome::Ignored,
                    "Failed" => match failure_policy_action(&spec, pod) {
                        PolicyAction::Ignore => Outcome::Ignored,
                        PolicyAction::Count => Outcome::Failed,
                        PolicyAction::FailJob(why) => {
                            policy_failure.get_or_insert(why);
                            Outcome::Failed
                        }
                    },
                    _ if meta::is_deleting(pod) => {
                        if deleted_by_us || suspended || finished { Outcome::Ignored } else { Outcome::Failed }
                    }
                    _ => Outcome::Active,
                };
                outcomes.push((pod.clone(), outcome));
            }
        }

        // Step 1: every finished pod still holding the finalizer joins the uncounted lists.
        let status = job.get("status").cloned().unwrap_or_else(|| json!({}));
        let mut uncounted_ok = strings_at(&status, "/uncountedTerminatedPods/succeeded").map(str::to_string).collect::<BTreeSet<_>>();
        let mut uncounted_failed = strings_at(&status, "/uncountedTerminatedPods/failed").map(str::to_string).collect::<BTreeSet<_>>();
        let mut completed: BTreeSet<usize> = parse_indexes(status.at("/completedIndexes").and_then(Value::as_str).unwrap_or(""));
        let mut to_release: Vec<Arc<Value>> = Vec::new();
        let mut newly = false;
        {
            let all = self.lock();
            let exp = all.get(key);
            for (pod, outcome) in &outcomes {
                if *outcome == Outcome::Active || !meta::has_finalizer(pod, TRACKING_FINALIZER) {
                    continue;
                }
                let pod_uid = meta::uid(pod).to_string();
                if exp.is_some_and(|e| e.uncounting.contains_key(&pod_uid)) {
                    continue;
                }
                match outcome {
                    Outcome::Succeeded if !uncounted_ok.contains(&pod_uid) => {
                        uncounted_ok.insert(pod_uid);
                        if indexed && let Some(i) = pod_index(pod) {
                            completed.insert(i);
                        }
                        newly = true;
                    }
                    Outcome::Failed if !uncounted_failed.contains(&pod_uid) => {
                        uncounted_failed.insert(pod_uid);
                        newly = true;
                    }
                    _ => {}
                }
                to_release.push(pod.clone());
            }
        }
        if let Some(limit) = completions {
            completed.retain(|i| *i < limit);
        }
        if newly {
            let patch = json!({"status": {
                "uncountedTerminatedPods": {"succeeded": uncounted_ok, "failed": uncounted_failed},
                "completedIndexes": if indexed { json!(format_indexes(&completed)) } else { Value::Null },
            }});
            job = self.patch_status(&job, patch).await?;
        }

        // Step 2: remove their finalizers, many at once.
        let mut released: HashSet<String> = HashSet::new();
        let mut failure: Option<ApiError> = None;
        for chunk in to_release.chunks(MAX_BATCH) {
            let results = futures::future::join_all(chunk.iter().map(|p| self.remove_finalizer(p))).await;
            for (pod, r) in chunk.iter().zip(results) {
                let pod_uid = meta::uid(pod).to_string();
                match r {
                    Ok(rev) => {
                        if let Some(rev) = rev
                            && let Some(exp) = self.lock().get_mut(key)
                        {
                            exp.uncounting.insert(pod_uid.clone(), (rev, Instant::now()));
                        }
                        released.insert(pod_uid);
                    }
                    Err(e) => failure = Some(e),
                }
            }
        }
        // What was released is in the expectations; the next pass counts it.
        if let Some(e) = failure {
            return Err(e.into());
        }

        // Step 3: move every uncounted uid whose pod no longer holds the finalizer into the counters.
        let holds_finalizer: HashSet<String> = pods
            .iter()
            .filter(|p| meta::has_finalizer(p, TRACKING_FINALIZER))
            .map(|p| meta::uid(p).to_string())
            .filter(|u| !released.contains(u))
            .collect();
        let status = job.get("status").cloned().unwrap_or_else(|| json!({}));
        let mut succeeded = status.at("/succeeded").and_then(Value::as_u64).unwrap_or(0) as usize;
        let mut failed = status.at("/failed").and_then(Value::as_u64).unwrap_or(0) as usize;
        let moved_ok: Vec<String> = uncounted_ok.iter().filter(|u| !holds_finalizer.contains(*u)).cloned().collect();
        let moved_failed: Vec<String> = uncounted_failed.iter().filter(|u| !holds_finalizer.contains(*u)).cloned().collect();
        if indexed {
            succeeded = completed.len();
        } else {
            succeeded += moved_ok.len();
        }
        failed += moved_failed.len();
        uncounted_ok.retain(|u| !moved_ok.contains(u));
        uncounted_failed.retain(|u| !moved_failed.contains(u));
        let all_counted = uncounted_ok.is_empty() && uncounted_failed.is_empty();
        let pending_ok = uncounted_ok.len();
        let pending_failed = uncounted_failed.len();

        // Decide: finished, failed, suspended, or pods to create or delete.
        let active: Vec<&Arc<Value>> = outcomes.iter().filter(|(_, o)| *o == Outcome::Active).map(|(p, _)| p).collect();
        let pending_creates: Vec<String> = self.lock().get(key).map(|e| e.creating.keys().cloned().collect()).unwrap_or_default();
        let active_names: HashSet<&str> = active.iter().map(|p| meta::name(p)).collect();
        let unseen_creates = pending_creates.iter().filter(|n| !active_names.contains(n.as_str())).count();
        let total_ok = if indexed { completed.len() } else { succeeded + pending_ok };
        let total_failed = failed + pending_failed;
        let any_ok = total_ok > 0 || outcomes.iter().any(|(_, o)| *o == Outcome::Succeeded);

        let mut conditions: Vec<Value> = status.at("/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut requeue: Option<Duration> = None;
        let mut start_time = status.at("/startTime").and_then(Value::as_str).map(str::to_string);
        let mut completion_time = status.at("/completionTime").and_then(Value::as_str).map(str::to_string);
        let mut finish: Option<(&str, &str, String)> = None; // (condition, reason, message)

        if !finished {
            if let Some(why) = policy_failure {
                finish = Some(("Failed", "PodFailurePolicy", why));
            } else if total_failed > backoff_limit {
                finish = Some(("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit".into()));
            } else if let (Some(ads), Some(start)) = (
                spec.at("/activeDeadlineSeconds").and_then(Value::as_u64),
                start_time.as_deref().and_then(podutil::parse_time),
            ) && !suspended
            {
                let deadline = Duration::from_secs(ads);
                let ran = podutil::elapsed(start, now);
                if ran >= deadline {
                    finish = Some(("Failed", "DeadlineExceeded", "Job was active longer than specified deadline".into()));
                } else {
                    requeue = Some(deadline - ran);
                }
            }
            if finish.is_none() {
                let done = match completions {
                    Some(c) if indexed => (0..c).all(|i| completed.contains(&i)),
                    Some(c) => total_ok >= c,
                    None => any_ok && active.is_empty() && unseen_creates == 0,
                };
                if done {
                    finish = Some(("Complete", "CompletionsReached", "Reached expected number of succeeded pods".into()));
                }
            }
        }

        let mut errors: Vec<String> = Vec::new();
        let stop_all = finished || finish.is_some() || suspended;
        if stop_all {
            for pod in &active {
                if let Err(e) = self.delete_pod(key, pod).await {
                    errors.push(e.to_string());
                }
            }
        } else {
            if start_time.is_none() {
                start_time = Some(podutil::format_time(now));
            }
            let want_more = match (completions, indexed) {
                (Some(c), true) => {
                    let running: HashSet<usize> = active.iter().filter_map(|p| pod_index(p)).collect();
                    let pending_idx: HashSet<usize> = pending_creates.iter().filter_map(|n| name_index(n, meta::name(&job))).collect();
                    let open: Vec<usize> = (0..c)
                        .filter(|i| !completed.contains(i) && !running.contains(i) && !pending_idx.contains(i))
                        .filter(|i| !succeeded_index_present(&outcomes, *i))
                        .collect();
                    let room = parallelism.saturating_sub(active.len() + unseen_creates);
                    open.into_iter().take(room).map(Some).collect::<Vec<_>>()
                }
                (Some(c), false) => {
                    let want = parallelism.min(c.saturating_sub(total_ok));
                    vec![None; want.saturating_sub(active.len() + unseen_creates)]
                }
                (None, _) if any_ok => Vec::new(),
                (None, _) => vec![None; parallelism.saturating_sub(active.len() + unseen_creates)],
            };
            let excess = (active.len() + unseen_creates).saturating_sub(parallelism);
            if excess > 0 {
                let mut victims: Vec<&&Arc<Value>> = active.iter().collect();
                victims.sort_by_key(|p| std::cmp::Reverse(meta::name(p).to_string()));
                for pod in victims.into_iter().take(excess) {
                    if let Err(e) = self.delete_pod(key, pod).await {
                        errors.push(e.to_string());
                    }
                }
            }
            if !want_more.is_empty() {
                match self.backoff_remaining(&outcomes, now) {
                    Some(wait) => requeue = Some(requeue.map_or(wait, |r| r.min(wait))),
                    None => {
                        if let Err(e) = self.create_pods(key, &job, &want_more, pods.len()).await {
                            errors.push(e);
                        }
                    }
                }
            }
        }

        // Conditions.
        if suspended && !finished {
            set_condition(&mut conditions, "Suspended", "True", "JobSuspended", "Job suspended", now);
        } else if conditions.iter().any(|c| c["type"] == "Suspended" && c["status"] == "True") {
            set_condition(&mut conditions, "Suspended", "False", "JobResumed", "Job resumed", now);
            start_time = Some(podutil::format_time(now));
        }
        if let Some((kind, reason, message)) = &finish
            && all_counted
            && !finished
        {
            if *kind == "Complete" {
                set_condition(&mut conditions, "SuccessCriteriaMet", "True", reason, message, now);
                set_condition(&mut conditions, "Complete", "True", "", "", now);
                completion_time = Some(podutil::format_time(now));
                self.events.record(&job, EventType::Normal, "Completed", "Job completed").await;
            } else {
                set_condition(&mut conditions, "FailureTarget", "True", reason, message, now);
                set_condition(&mut conditions, "Failed", "True", reason, message, now);
                self.events.record(&job, EventType::Warning, reason, message).await;
            }
        }
        let ready = active.iter().filter(|p| pod::is_ready(p)).count();
        let mut new_status = json!({
            "active": active.len(), "ready": ready, "succeeded": succeeded, "failed": failed,
            "terminating": pods.iter().filter(|p| meta::is_deleting(p) && pod::phase(p) != "Succeeded"
                && pod::phase(p) != "Failed").count(),
            "uncountedTerminatedPods": {"succeeded": uncounted_ok, "failed": uncounted_failed},
            "conditions": conditions,
            "startTime": start_time, "completionTime": completion_time,
        });
        if indexed {
            new_status["completedIndexes"] = json!(format_indexes(&completed));
        }
        if status_differs(&status, &new_status) {
            job = self.patch_status(&job, json!({"status": new_status})).await?;
        }
        if !errors.is_empty() {
            return Err(errors.join("; ").into());
        }
        if let Some(wait) = self.ttl_remaining(&job, now).await? {
            requeue = Some(requeue.map_or(wait, |r| r.min(wait)));
        }
        if finish.is_some() && !all_counted {
            return Ok(Action::RequeueAfter(Duration::from_millis(200)));
        }
        Ok(requeue.map_or(Action::Done, |d| Action::RequeueAfter(d + Duration::from_millis(10))))
    }

    /// Deletes a finished Job whose `ttlSecondsAfterFinished` has passed; else how long until it does.
    async fn ttl_remaining(&self, job: &Value, now: jiff::Timestamp) -> Result<Option<Duration>, ApiError> {
        let Some(ttl) = job.at("/spec/ttlSecondsAfterFinished").and_then(Value::as_u64) else { return Ok(None) };
        let Some(cond) = finished_condition(job) else { return Ok(None) };
        let Some(at) = cond.get("lastTransitionTime").and_then(Value::as_str).and_then(podutil::parse_time) else {
            return Ok(None);
        };
        let age = podutil::elapsed(at, now);
        if age < Duration::from_secs(ttl) {
            return Ok(Some(Duration::from_secs(ttl) - age));
        }
        let params = DeleteParams {
            propagation: Some(Propagation::Background),
            precondition_uid: Some(meta::uid(job).to_string()),
            ..Default::default()
        };
        match self.client.delete(&kinds::JOB, meta::namespace(job), meta::name(job), &params).await {
            Ok(_) => Ok(None),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The wait before the next pod after recent failures: the back-off doubles with each failure
    /// since the last success, counted from the latest failure.
    fn backoff_remaining(&self, outcomes: &[(Arc<Value>, Outcome)], now: jiff::Timestamp) -> Option<Duration> {
        let last_success = outcomes.iter().filter(|(_, o)| *o == Outcome::Succeeded).filter_map(|(p, _)| finish_time(p)).max();
        let failures: Vec<jiff::Timestamp> = outcomes
            .iter()
            .filter(|(_, o)| *o == Outcome::Failed)
            .filter_map(|(p, _)| finish_time(p))
            .filter(|t| last_success.is_none_or(|s| *t > s))
            .collect();
        let latest = failures.iter().max()?;
        let exp = (failures.len() - 1).min(30) as u32;
        let delay = self.config.backoff_base.saturating_mul(2u32.saturating_pow(exp)).min(self.config.backoff_max);
        let waited = podutil::elapsed(*latest, now);
        (waited < delay).then(|| delay - waited)
    }

    /// Creates a pod per entry of `indexes` (`None` for a NonIndexed Job) at a free name, in
    /// doubling batches, so a Job whose pods are all rejected fails after one request. `owned` is
    /// how many pods the Job has.
    async fn create_pods(&self, key: &str, job: &Value, indexes: &[Option<usize>], owned: usize) -> Result<(), String> {
        let ns = meta::namespace(job).unwrap_or("default");
        let job_name = meta::name(job);
        let mut reserved: HashSet<String> = self.lock().get(key).map(|e| e.creating.keys().cloned().collect()).unwrap_or_default();
        let mut planned: Vec<(String, Option<usize>)> = Vec::new();
        for index in indexes.iter().take(BURST) {
            // A NonIndexed Job keeps its finished pods under `<job>-0..`: the names below the count of
            // its pods are nearly all taken, and walking them for every new pod made a Job of n
            // pods cost n² lookups. An Indexed Job's names per index are few.
            let (prefix, first) = match index {
                Some(i) => (format!("{job_name}-{i}"), 0),
                None => (job_name.to_string(), owned as u64),
            };
            let name = (first..)
                .map(|n| format!("{prefix}-{n}"))
                .find(|c| !reserved.contains(c) && !self.pods.contains(&format!("{ns}/{c}")))
                .unwrap_or_default();
            reserved.insert(name.clone());
            planned.push((name, *index));
        }
        let mut batch = 1usize;
        let mut rest = planned.as_slice();
        while !rest.is_empty() {
            let (now, later) = rest.split_at(batch.min(rest.len()));
            rest = later;
            let results =
                futures::future::join_all(now.iter().map(|(name, i)| self.client.create(&kinds::POD, Some(ns), pod_for(job, name, *i))))
                    .await;
            let mut failure = None;
            for ((name, _), r) in now.iter().zip(results) {
                match r {
                    Ok(pod) => {
                        let rev = shepherd_runtime::cache::resource_version(&pod).unwrap_or(u64::MAX);
                        if let Some(exp) = self.lock().get_mut(key) {
                            exp.creating.insert(name.clone(), (rev, Instant::now()));
                        }
                        self.events.record(job, EventType::Normal, "SuccessfulCreate", &format!("Created pod: {name}")).await;
                    }
                    // Created by an earlier try the cache has not shown yet: the next reconcile sees it.
                    Err(e) if e.is_already_exists() => {}
                    Err(e) => failure = Some(format!("creating pod {name} for Job {key}: {e}")),
                }
            }
            if let Some(e) = failure {
                self.events.record(job, EventType::Warning, "FailedCreate", &e).await;
                return Err(e);
            }
            batch = (batch * 2).min(MAX_BATCH);
        }
        Ok(())
    }

    async fn delete_pod(&self, key: &str, pod: &Value) -> Result<(), ApiError> {
        if let Some(exp) = self.lock().get_mut(key) {
            exp.deleted.insert(meta::uid(pod).to_string());
        }
        let params = DeleteParams { precondition_uid: Some(meta::uid(pod).to_string()), ..Default::default() };
        match self.client.delete(&kinds::POD, meta::namespace(pod), meta::name(pod), &params).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Patches the status at the revision read, so a concurrent writer makes this reconcile retry
    /// rather than be overwritten; returns the Job as written.
    async fn patch_status(&self, job: &Value, mut patch: Value) -> Result<Value, ApiError> {
        patch["metadata"] = json!({"resourceVersion": meta::resource_version(job)});
        self.client.patch_status(&kinds::JOB, meta::namespace(job), meta::name(job), Patch::Merge(patch)).await
    }
}

/// The Complete or Failed condition, once the Job has one.
fn finished_condition(job: &Value) -> Option<&Value> {
    job.at("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
}

fn set_condition(conditions: &mut Vec<Value>, kind: &str, status: &str, reason: &str, message: &str, now: jiff::Timestamp) {
    let time = podutil::format_time(now);
    match conditions.iter_mut().find(|c| c["type"] == kind) {
        Some(c) if c["status"] == status => {}
        Some(c) => *c = json!({"type": kind, "status": status, "reason": reason, "message": message,
            "lastProbeTime": time, "lastTransitionTime": time}),
        None => conditions.push(json!({"type": kind, "status": status, "reason": reason, "message": message,
            "lastProbeTime": time, "lastTransitionTime": time})),
    }
}

fn status_differs(old: &Value, new: &Value) -> bool {
    let Some(fields) = new.as_object() else { return false };
    fields.iter().any(|(k, v)| {
        let o = old.get(k).cloned().unwrap_or(Value::Null);
        match (k.as_str(), v) {
            ("uncountedTerminatedPods", _) => {
                let empty = |x: &Value| x.at("/succeeded").and_then(Value::as_array).is_none_or(Vec::is_empty)
                    && x.at("/failed").and_then(Value::as_array).is_none_or(Vec::is_empty);
                !(empty(&o) && empty(v)) && o != *v
            }
            (_, Value::Null) => !o.is_null(),
            (_, Value::Number(n)) if n.as_u64() == Some(0) => o.as_u64().unwrap_or(0) != 0,
            (_, Value::Array(a)) if a.is_empty() => o.as_array().is_some_and(|x| !x.is_empty()),
            _ => o != *v,
        }
    })
}

/// When a pod finished: its last container's end, else now-unknown.
fn finish_time(pod: &Value) -> Option<jiff::Timestamp> {
    pod.at("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.at("/state/terminated/finishedAt").and_then(Value::as_str).and_then(podutil::parse_time))
        .max()
        .or_else(|| {
            pod.at("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("lastTransitionTime").and_then(Value::as_str).and_then(podutil::parse_time))
                .max()
        })
}

fn pod_index(pod: &Value) -> Option<usize> {
    pod.at("/metadata/annotations")
        .and_then(|a| a.get(COMPLETION_INDEX))
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
}

/// The index in a pod name `<job>-<index>-<n>`.
fn name_index(pod_name: &str, job_name: &str) -> Option<usize> {
    let rest = pod_name.strip_prefix(job_name)?.strip_prefix('-')?;
    rest.split_once('-')?.0.parse().ok()
}

fn succeeded_index_present(outcomes: &[(Arc<Value>, Outcome)], index: usize) -> bool {
    outcomes.iter().any(|(p, o)| *o == Outcome::Succeeded && pod_index(p) == Some(index))
}

/// `1,3-5,7` as Kubernetes writes `completedIndexes`.
pub fn format_indexes(set: &BTreeSet<usize>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = set.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if end == start { start.to_string() } else { format!("{start}-{end}") });
    }
    out.join(",")
}

pub fn parse_indexes(text: &str) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b.min(a.saturating_add(1_000_000)));
                }
            }
            None => {
                if let Ok(v) = part.parse() {
                    out.insert(v);
                }
            }
        }
    }
    out
}

/// What the failure policy says of a failed pod: the first rule whose exit codes match decides.
fn failure_policy_action(spec: &Value, pod: &Value) -> PolicyAction {
    let Some(rules) = spec.at("/podFailurePolicy/rules").and_then(Value::as_array) else { return PolicyAction::Count };
    let exits: Vec<(&str, i64)> = pod
        .at("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let code = c.at("/state/terminated/exitCode").and_then(Value::as_i64)?;
            Some((c.get("name").and_then(Value::as_str).unwrap_or(""), code))
        })
        .filter(|(_, code)| *code != 0)
        .collect();
    for (i, rule) in rules.iter().enumerate() {
        let Some(on) = rule.get("onExitCodes") else { continue };
        let container = on.get("containerName").and_then(Value::as_str);
        let values: Vec<i64> = on.get("values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_i64).collect();
        let is_in = on.get("operator").and_then(Value::as_str) == Some("In");
        let hit = exits.iter().find(|(name, code)| container.is_none_or(|c| c == *name) && values.contains(code) == is_in);
        if let Some((name, code)) = hit {
            return match rule.get("action").and_then(Value::as_str) {
                Some("FailJob") => PolicyAction::FailJob(format!(
                    "Container {name} for pod {}/{} failed with exit code {code} matching FailJob rule at index {i}",
                    meta::namespace(pod).unwrap_or("default"),
                    meta::name(pod)
                )),
                Some("Ignore") => PolicyAction::Ignore,
                _ => PolicyAction::Count,
            };
        }
    }
    PolicyAction::Count
}

/// A pod of `job` named `name`: the template, owned by the Job, holding the tracking finalizer;
/// an Indexed Job's pod also carries its index (annotation, label, `JOB_COMPLETION_INDEX`, hostname).
fn pod_for(job: &Value, name: &str, index: Option<usize>) -> Value {
    let template = job.at("/spec/template").cloned().unwrap_or_else(|| json!({}));
    let mut labels = template.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut annotations = template.at("/metadata/annotations").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(i) = index {
        labels.insert(COMPLETION_INDEX.into(), json!(i.to_string()));
        annotations.insert(COMPLETION_INDEX.into(), json!(i.to_string()));
        if spec.get("hostname").is_none_or(Value::is_null) {
            spec["hostname"] = json!(format!("{}-{i}", meta::name(job)));
        }
        for container in spec.get_mut("containers").and_then(Value::as_array_mut).into_iter().flatten() {
            let env = container.as_object_mut().map(|c| c.entry("env").or_insert_with(|| json!([])));
            if let Some(Value::Array(env)) = env {
                env.retain(|e| e.get("name").and_then(Value::as_str) != Some("JOB_COMPLETION_INDEX"));
                env.push(json!({"name": "JOB_COMPLETION_INDEX", "value": i.to_string()}));
            }
        }
    }
    let mut metadata = json!({
        "name": name,
        "labels": labels,
        "ownerReferences": [podutil::owner_reference_to(job, &kinds::JOB)],
        "finalizers": [TRACKING_FINALIZER],
    });
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    if let Some(ns) = meta::namespace(job) {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completed_indexes_read_and_write_as_kubernetes_ranges() {
        let set: BTreeSet<usize> = [0, 1, 2, 4, 6, 7].into_iter().collect();
        assert_eq!(format_indexes(&set), "0-2,4,6-7");
        assert_eq!(parse_indexes("0-2,4,6-7"), set);
        assert!(parse_indexes("").is_empty());
    }

    #[test]
    fn an_indexed_pod_carries_its_index_in_env_annotation_and_hostname() {
        let job = json!({"metadata": {"name": "sq", "namespace": "default", "uid": "u"},
            "spec": {"template": {"metadata": {"labels": {"job-name": "sq"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}});
        let pod = pod_for(&job, "sq-3-0", Some(3));
        assert_eq!(pod["metadata"]["annotations"][COMPLETION_INDEX], "3");
        assert_eq!(pod["spec"]["hostname"], "sq-3");
        assert_eq!(pod["spec"]["containers"][0]["env"], json!([{"name": "JOB_COMPLETION_INDEX", "value": "3"}]));
        assert_eq!(pod["metadata"]["finalizers"], json!([TRACKING_FINALIZER]));
        assert_eq!(name_index("sq-3-0", "sq"), Some(3));
    }

    #[test]
    fn the_failure_policy_matches_exit_codes_in_rule_order() {
        let spec = json!({"podFailurePolicy": {"rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [1]}}]}});
        let pod = |code: i64| json!({"metadata": {"name": "p", "namespace": "ns"}, "status": {"containerStatuses": [
            {"name": "main", "state": {"terminated": {"exitCode": code}}}]}});
        assert_eq!(failure_policy_action(&spec, &pod(42)), PolicyAction::Ignore);
        assert_eq!(failure_policy_action(&spec, &pod(1)), PolicyAction::Count);
        assert!(matches!(failure_policy_action(&spec, &pod(7)), PolicyAction::FailJob(m) if m.contains("exit code 7")));
    }
}
