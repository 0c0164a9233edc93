//! The `simulated` runtime: no processes. Containers turn Running after a delay and stay up,
//! fail, or exit 0 after a while when their pod asks, so one agent process can stand in for many
//! nodes in scale tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use rand::Rng;

use crate::runtime::{Adopted, ContainerId, ContainerSpec, EventSender, Exit, LogFiles, Runtime, RuntimeEvent, Started};

/// How simulated containers behave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimulatedBehaviour {
    /// From start to Running (and Ready).
    pub ready_delay: Duration,
    /// The fraction of container starts that fail (exit 1) once the delay has passed, 0.0 to 1.0.
    pub fail_fraction: f64,
}

impl Default for SimulatedBehaviour {
    fn default() -> Self {
        SimulatedBehaviour { ready_delay: Duration::from_millis(100), fail_fraction: 0.0 }
    }
}

pub(crate) struct SimulatedRuntime {
    behaviour: SimulatedBehaviour,
    events: EventSender,
    next_instance: AtomicU64,
    live: Arc<Mutex<Live>>,
}

/// The running instance of each container and when it started.
type Live = HashMap<ContainerId, (u64, Timestamp)>;

/// Forgets `instance` of `id` if it is still the running one; its start time then.
fn end(live: &Mutex<Live>, id: &ContainerId, instance: u64) -> Option<Timestamp> {
    let mut live = live.lock().unwrap_or_else(|e| e.into_inner());
    match live.get(id) {
        Some((i, started)) if *i == instance => {
            let started = *started;
            live.remove(id);
            Some(started)
        }
        _ => None,
    }
}

impl SimulatedRuntime {
    pub fn new(behaviour: SimulatedBehaviour, events: EventSender) -> Self {
        SimulatedRuntime { behaviour, events, next_instance: AtomicU64::new(1), live: Arc::default() }
    }

    fn ended(&self, id: &ContainerId, instance: u64) -> Option<Timestamp> {
        end(&self.live, id, instance)
    }
}

#[async_trait]
impl Runtime for SimulatedRuntime {
    async fn start(&self, spec: &ContainerSpec) -> Result<Started, String> {
        let instance = self.next_instance.fetch_add(1, Ordering::Relaxed);
        let started_at = Timestamp::now();
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(spec.id.clone(), (instance, started_at));
        let fail = spec.simulate_fail || rand::rng().random_bool(self.behaviour.fail_fraction.clamp(0.0, 1.0));
        let (events, id, delay) = (self.events.clone(), spec.id.clone(), self.behaviour.ready_delay);
        let (exit_after, live) = (spec.simulate_exit_after, self.live.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if fail {
                let exit = Exit { code: 1, reason: "Error".into(), started_at, finished_at: Timestamp::now() };
                let _ = events.send(RuntimeEvent::Exited { id, instance, exit });
                return;
            }
            let _ = events.send(RuntimeEvent::Running { id: id.clone(), instance });
            if let Some(after) = exit_after {
                tokio::time::sleep(after).await;
                // Stopped meanwhile: its exit was reported then.
                if end(&live, &id, instance).is_none() {
                    return;
                }
                let exit = Exit { code: 0, reason: "Completed".into(), started_at, finished_at: Timestamp::now() };
                let _ = events.send(RuntimeEvent::Exited { id, instance, exit });
            }
        });
        Ok(Started { instance, started_at, running: false })
    }

    fn reports_within(&self) -> Option<Duration> {
        Some(self.behaviour.ready_delay)
    }

    fn stop(&self, id: &ContainerId, instance: u64, _grace: Duration) {
        if let Some(started_at) = self.ended(id, instance) {
            let exit = Exit { code: 0, reason: "Completed".into(), started_at, finished_at: Timestamp::now() };
            let _ = self.events.send(RuntimeEvent::Exited { id: id.clone(), instance, exit });
        }
    }

    fn remove(&self, id: &ContainerId) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    fn adopt(&self) -> Vec<Adopted> {
        Vec::new()
    }

    fn pid(&self, _id: &ContainerId) -> Option<u32> {
        None
    }

    fn log_files(&self, _id: &ContainerId) -> Option<LogFiles> {
        None
    }

    fn detach(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn spec(exit_after: Option<Duration>) -> ContainerSpec {
        ContainerSpec {
            id: ContainerId { pod_key: "ns/job-0".into(), pod_uid: "u".into(), name: "main".into() },
            image: "minimal".into(),
            command: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            working_dir: None,
            hostname: "job-0".into(),
            memory_limit_bytes: None,
            cpu_limit_millis: None,
            simulate_fail: false,
            simulate_exit_after: exit_after,
            restart_count: 0,
            mounts: Vec::new(),
            security: Default::default(),
            interactive: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_asked_to_exit_runs_that_long_then_exits_zero_once() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let behaviour = SimulatedBehaviour { ready_delay: Duration::from_millis(100), fail_fraction: 0.0 };
        let rt = SimulatedRuntime::new(behaviour, tx);
        let started = rt.start(&spec(Some(Duration::from_millis(500)))).await.expect("start");
        let t0 = tokio::time::Instant::now();
        assert!(matches!(rx.recv().await, Some(RuntimeEvent::Running { .. })));
        match rx.recv().await {
            Some(RuntimeEvent::Exited { instance, exit, .. }) => {
                assert_eq!((instance, exit.code, exit.reason.as_str()), (started.instance, 0, "Completed"));
            }
            other => panic!("expected an exit, got {other:?}"),
        }
        assert_eq!(t0.elapsed(), Duration::from_millis(600), "ready after 100 ms, then 500 ms of running");
        // Stopping it afterwards reports nothing more: it already exited.
        rt.stop(&spec(None).id, started.instance, Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_stopped_before_its_exit_time_reports_one_exit() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let rt = SimulatedRuntime::new(SimulatedBehaviour::default(), tx);
        let started = rt.start(&spec(Some(Duration::from_secs(5)))).await.expect("start");
        assert!(matches!(rx.recv().await, Some(RuntimeEvent::Running { .. })));
        rt.stop(&spec(None).id, started.instance, Duration::ZERO);
        assert!(matches!(rx.recv().await, Some(RuntimeEvent::Exited { .. })));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(rx.try_recv().is_err(), "the exit time passing after the stop reports no second exit");
    }
}
