//! The `simulated` runtime: no processes. Containers turn Running after a delay and stay up,
//! or fail when asked to, so one agent process can stand in for many nodes in scale tests.

use std::collections::HashMap;
use std::sync::Mutex;
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
    live: Mutex<HashMap<ContainerId, (u64, Timestamp)>>,
}

impl SimulatedRuntime {
    pub fn new(behaviour: SimulatedBehaviour, events: EventSender) -> Self {
        SimulatedRuntime { behaviour, events, next_instance: AtomicU64::new(1), live: Mutex::default() }
    }

    fn ended(&self, id: &ContainerId, instance: u64) -> Option<Timestamp> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        match live.get(id) {
            Some((i, started)) if *i == instance => {
                let started = *started;
                live.remove(id);
                Some(started)
            }
            _ => None,
        }
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
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let event = if fail {
                let exit = Exit { code: 1, reason: "Error".into(), started_at, finished_at: Timestamp::now() };
                RuntimeEvent::Exited { id, instance, exit }
            } else {
                RuntimeEvent::Running { id, instance }
            };
            let _ = events.send(event);
        });
        Ok(Started { instance, started_at, running: false })
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
