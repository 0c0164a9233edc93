//! The CronJob controller: creates a Job for each scheduled time (in the CronJob's time zone),
//! honouring `concurrencyPolicy`, `startingDeadlineSeconds`, `suspend` and the history limits.
//!
//! After an outage only the most recent missed time runs (at most one catch-up Job), and more
//! than 100 missed times are reported with a `TooManyMissedTimes` Event, as in Kubernetes. Jobs are
//! named `<cronjob>-<scheduled time in minutes since the epoch>`, so a retried create meets
//! AlreadyExists instead of running a time twice.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::cron::{Schedule, time_zone};
use shepherd_api::{ApiError, kinds};
use shepherd_api::meta;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager, Patch, Propagation, Reconciler};

use crate::config::ControllerConfig;
use crate::events::{EventRecorder, EventType};
use crate::podutil;

/// Annotation on each Job: the time it was scheduled for.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// More missed start times than this are reported: the clock or the deadline is likely wrong.
const MAX_MISSED: u64 = 100;
/// Reconciles run a little after a scheduled minute, never just before it.
const SLACK: Duration = Duration::from_millis(100);

/// Builds the CronJob controller. It reads Jobs from the manager's shared cache.
pub fn cronjob_controller(client: Arc<dyn Client>, manager: &Manager, config: &ControllerConfig) -> Controller {
    let reconciler = CronJobReconciler {
        events: EventRecorder::new(client.clone(), "cronjob-controller"),
        client,
        jobs: manager.informers().cache(&kinds::JOB),
    };
    Controller::new("cronjob", &kinds::CRONJOB, reconciler).owns(&kinds::JOB).workers(config.workers).mode(config.mode)
}

struct CronJobReconciler {
    client: Arc<dyn Client>,
    jobs: Arc<Cache>,
    events: EventRecorder,
}

#[async_trait]
impl Reconciler for CronJobReconciler {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("default", key));
        let cj = match self.client.get(&kinds::CRONJOB, Some(ns), name).await {
            Ok(c) if !meta::is_deleting(&c) => c,
            Ok(_) => return Ok(Action::Done),
            Err(e) if e.is_not_found() => return Ok(Action::Done),
            Err(e) => return Err(e.into()),
        };
        self.sync(&cj).await
    }
}

/// Whether a Job finished, and how.
fn finished(job: &Value) -> Option<&'static str> {
    let conds = job.at("/status/conditions").and_then(Value::as_array)?;
    ["Complete", "Failed"].into_iter().find(|t| conds.iter().any(|c| c["type"] == *t && c["status"] == "True"))
}

fn time_at(v: &Value, ptr: &str) -> Option<Timestamp> {
    v.at(ptr).and_then(Value::as_str).and_then(podutil::parse_time)
}

/// The scheduled times after `earliest` up to `now`: how many, and the latest. Past
/// [`MAX_MISSED`] times, the walk skips ahead to a window before `now` ten times the average gap
/// it has seen (plus a day), and estimates what it skipped: the count only needs to say "too
/// many", and an every-minute schedule left alone for a year would otherwise cost half a million
/// steps per reconcile.
fn missed_times(schedule: &Schedule, tz: &jiff::tz::TimeZone, earliest: Timestamp, now: Timestamp) -> (u64, Option<Timestamp>) {
    let mut count = 0u64;
    let mut first = None;
    let mut latest = None;
    let mut t = earliest;
    let mut skipped = false;
    while let Some(next) = schedule.next_after(t, tz) {
        if next > now {
            break;
        }
        count += 1;
        first.get_or_insert(next);
        latest = Some(next);
        t = next;
        if count > MAX_MISSED
            && !skipped
            && let Some(start) = first
        {
            skipped = true;
            let average = next.duration_since(start) / (count - 1) as i32;
            let window = average * 10 + jiff::SignedDuration::from_hours(24);
            if let Ok(from) = now.checked_sub(window)
                && from > t
            {
                let gap = from.duration_since(t);
                count += (gap.as_secs_f64() / average.as_secs_f64().max(1.0)) as u64;
                t = from;
            }
        }
    }
    (count, latest)
}

/// `<cronjob>-<minutes since the epoch>`.
pub fn job_name(cronjob: &str, scheduled: Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second().div_euclid(60))
}

fn reference(job: &Value) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "name": meta::name(job),
        "namespace": meta::namespace(job).unwrap_or("default"), "uid": meta::uid(job),
        "resourceVersion": meta::resource_version(job)})
}

impl CronJobReconciler {
    async fn sync(&self, cj: &Value) -> Result<Action, Error> {
        let now = podutil::now();
        let spec = cj.get("spec").cloned().unwrap_or_else(|| json!({}));
        let mut children: Vec<Arc<Value>> = self.jobs.by_controller_uid(meta::uid(cj));
        children.sort_by_key(|j| time_at(j, "/metadata/creationTimestamp"));

        // History: keep the newest finished Jobs of each kind up to their limits.
        let mut last_success = time_at(cj, "/status/lastSuccessfulTime");
        for (kind, limit) in [("Complete", "successfulJobsHistoryLimit"), ("Failed", "failedJobsHistoryLimit")] {
            let done: Vec<&Arc<Value>> = children.iter().filter(|j| finished(j) == Some(kind) && !meta::is_deleting(j)).collect();
            if kind == "Complete" {
                for j in &done {
                    let t = time_at(j, "/status/completionTime");
                    if t > last_success {
                        last_success = t;
                    }
                }
            }
            let keep = spec.get(limit).and_then(Value::as_u64).map_or(usize::MAX, |l| l as usize);
            for job in done.iter().take(done.len().saturating_sub(keep)) {
                self.delete_job(cj, job).await?;
            }
        }
        let mut active: Vec<Arc<Value>> =
            children.iter().filter(|j| finished(j).is_none() && !meta::is_deleting(j)).cloned().collect();

        let schedule_text = spec.get("schedule").and_then(Value::as_str).unwrap_or("");
        let (schedule, tz) = match (Schedule::parse(schedule_text), time_zone(spec.get("timeZone").and_then(Value::as_str))) {
            (Ok(s), Ok(tz)) => (s, tz),
            (Err(e), _) | (_, Err(e)) => {
                self.events.record(cj, EventType::Warning, "UnparseableSchedule", &format!("unparseable schedule: {schedule_text:?}: {e}")).await;
                self.write_status(cj, &active, None, last_success).await?;
                return Ok(Action::Done);
            }
        };
        let suspended = spec.get("suspend").and_then(Value::as_bool) == Some(true);
        let next_run = |after: Timestamp| {
            schedule.next_after(after, &tz).map(|t| Action::RequeueAfter(podutil::elapsed(now, t) + SLACK)).unwrap_or(Action::Done)
        };
        if suspended {
            self.write_status(cj, &active, None, last_success).await?;
            return Ok(Action::Done);
        }

        let deadline = spec.get("startingDeadlineSeconds").and_then(Value::as_i64);
        let mut earliest = time_at(cj, "/status/lastScheduleTime")
            .or_else(|| time_at(cj, "/metadata/creationTimestamp"))
            .unwrap_or(now);
        if let Some(d) = deadline
            && let Ok(floor) = now.checked_sub(jiff::SignedDuration::from_secs(d))
            && floor > earliest
        {
            earliest = floor;
        }
        let (missed, latest) = missed_times(&schedule, &tz, earliest, now);
        let Some(scheduled) = latest else {
            self.write_status(cj, &active, None, last_success).await?;
            return Ok(next_run(now));
        };
        if missed > MAX_MISSED {
            let msg = format!("too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew");
            self.events.record(cj, EventType::Warning, "TooManyMissedTimes", &msg).await;
        }
        if let Some(d) = deadline
            && podutil::elapsed(scheduled, now) > Duration::from_secs(d.max(0) as u64)
        {
            let msg = format!("Missed scheduled time to start a job: {}", scheduled.strftime("%a, %d %b %Y %H:%M:%S %z"));
            self.events.record(cj, EventType::Warning, "MissSchedule", &msg).await;
            self.write_status(cj, &active, None, last_success).await?;
            return Ok(next_run(now));
        }
        let name = job_name(meta::name(cj), scheduled);
        let ns = meta::namespace(cj).unwrap_or("default");
        if children.iter().any(|j| meta::name(j) == name) {
            self.write_status(cj, &active, Some(scheduled), last_success).await?;
            return Ok(next_run(now));
        }
        match spec.get("concurrencyPolicy").and_then(Value::as_str).unwrap_or("Allow") {
            "Forbid" if !active.is_empty() => {
                // The time stays unscheduled: it runs when the active Job ends, if still in time.
                self.write_status(cj, &active, None, last_success).await?;
                return Ok(next_run(now));
            }
            "Replace" => {
                for job in active.drain(..) {
                    self.delete_job(cj, &job).await?;
                }
            }
            _ => {}
        }

        let job = self.job_for(cj, &name, scheduled, &tz);
        let created = match self.client.create(&kinds::JOB, Some(ns), job).await {
            Ok(j) => {
                self.events.record(cj, EventType::Normal, "SuccessfulCreate", &format!("Created job {name}")).await;
                j
            }
            Err(e) if e.is_already_exists() => match self.client.get(&kinds::JOB, Some(ns), &name).await {
                Ok(j) => j,
                Err(e) => return Err(e.into()),
            },
            Err(e) => {
                self.events.record(cj, EventType::Warning, "FailedCreate", &format!("Error creating job: {e}")).await;
                return Err(e.into());
            }
        };
        if meta::controller_uid(&created) == Some(meta::uid(cj)) && finished(&created).is_none() {
            active.push(Arc::new(created));
        }
        self.write_status(cj, &active, Some(scheduled), last_success).await?;
        Ok(next_run(now))
    }

    fn job_for(&self, cj: &Value, name: &str, scheduled: Timestamp, tz: &jiff::tz::TimeZone) -> Value {
        let template = cj.at("/spec/jobTemplate").cloned().unwrap_or_else(|| json!({}));
        let mut metadata = template.get("metadata").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
        metadata["name"] = json!(name);
        metadata["namespace"] = json!(meta::namespace(cj).unwrap_or("default"));
        metadata["ownerReferences"] = json!([podutil::owner_reference_to(cj, &kinds::CRONJOB)]);
        let stamp = scheduled.to_zoned(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string();
        if !metadata.get("annotations").is_some_and(Value::is_object) {
            metadata["annotations"] = json!({});
        }
        metadata["annotations"][SCHEDULED_TIMESTAMP] = json!(stamp);
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
            "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))})
    }

    async fn delete_job(&self, cj: &Value, job: &Value) -> Result<(), ApiError> {
        let params = DeleteParams {
            propagation: Some(Propagation::Background),
            precondition_uid: Some(meta::uid(job).to_string()),
            ..Default::default()
        };
        match self.client.delete(&kinds::JOB, meta::namespace(job), meta::name(job), &params).await {
            Ok(_) => {
                let msg = format!("Deleted job {}", meta::name(job));
                self.events.record(cj, EventType::Normal, "SuccessfulDelete", &msg).await;
                Ok(())
            }
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn write_status(
        &self,
        cj: &Value,
        active: &[Arc<Value>],
        scheduled: Option<Timestamp>,
        last_success: Option<Timestamp>,
    ) -> Result<(), ApiError> {
        let refs: Vec<Value> = active.iter().map(|j| reference(j)).collect();
        let mut status = json!({"active": if refs.is_empty() { Value::Null } else { json!(refs) }});
        if let Some(t) = scheduled {
            status["lastScheduleTime"] = json!(podutil::format_time(t));
        }
        if let Some(t) = last_success {
            status["lastSuccessfulTime"] = json!(podutil::format_time(t));
        }
        let current = cj.get("status").cloned().unwrap_or_else(|| json!({}));
        let names = |v: &Value| -> Vec<String> {
            v.get("active").and_then(Value::as_array).into_iter().flatten()
                .filter_map(|r| r.get("name").and_then(Value::as_str)).map(str::to_string).collect()
        };
        let same = names(&current) == names(&status)
            && ["lastScheduleTime", "lastSuccessfulTime"].iter().all(|f| status.get(*f).is_none() || current.get(*f) == status.get(*f));
        if same {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": meta::resource_version(cj)}, "status": status});
        match self.client.patch_status(&kinds::CRONJOB, meta::namespace(cj), meta::name(cj), Patch::Merge(patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_named_after_their_scheduled_minute() {
        let t: Timestamp = "2026-01-01T10:05:00Z".parse().expect("time");
        assert_eq!(job_name("tick", t), format!("tick-{}", t.as_second() / 60));
    }

    #[test]
    fn three_hours_of_a_minutely_schedule_are_180_missed_times_and_the_latest_runs() {
        let s = Schedule::parse("* * * * *").expect("parses");
        let from: Timestamp = "2026-01-01T10:00:00Z".parse().expect("time");
        let now: Timestamp = "2026-01-01T13:00:30Z".parse().expect("time");
        let (missed, latest) = missed_times(&s, &jiff::tz::TimeZone::UTC, from, now);
        assert_eq!(missed, 180);
        assert_eq!(latest, Some("2026-01-01T13:00:00Z".parse().expect("time")));
    }

    #[test]
    fn a_year_of_missed_minutes_is_counted_roughly_and_the_latest_exactly() {
        let s = Schedule::parse("* * * * *").expect("parses");
        let from: Timestamp = "2025-01-01T00:00:00Z".parse().expect("time");
        let now: Timestamp = "2026-01-01T00:00:30Z".parse().expect("time");
        let (missed, latest) = missed_times(&s, &jiff::tz::TimeZone::UTC, from, now);
        assert!((525_000..=526_000).contains(&missed), "{missed}");
        assert_eq!(latest, Some("2026-01-01T00:00:00Z".parse().expect("time")));
        let weekly = Schedule::parse("0 9 * * mon").expect("parses");
        let (missed, latest) = missed_times(&weekly, &jiff::tz::TimeZone::UTC, "2020-01-01T00:00:00Z".parse().expect("time"), now);
        assert!(missed > 300, "{missed}");
        assert_eq!(latest, Some("2025-12-29T09:00:00Z".parse().expect("time")), "the last Monday of 2025");
    }
}
