//! Runs a process's controllers together: one informer factory, one metrics handle, one shutdown.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::client::Client;
use crate::controller::{self, Controller, ControllerState};
use crate::debug::{self, ControllersSnapshot};
use crate::informer::InformerFactory;
use crate::metrics::Metrics;

/// Owns the shared informers and runs every added controller until one shutdown signal.
///
/// ```ignore
/// let manager = Manager::new(client);
/// let pods = manager.informers().cache(&kinds::POD);
/// manager.add(Controller::new("replicaset", &kinds::REPLICASET, reconcile).owns(&kinds::POD).workers(4));
/// manager.metrics().register(&mut registry);
/// manager.run(ctrl_c()).await;
/// ```
pub struct Manager {
    factory: Arc<InformerFactory>,
    metrics: Metrics,
    pending: Mutex<Vec<Controller>>,
    running: Mutex<Vec<Arc<ControllerState>>>,
}

impl Manager {
    /// A manager whose informers list and watch through `client`.
    pub fn new(client: Arc<dyn Client>) -> Self {
        let metrics = Metrics::new();
        Manager {
            factory: Arc::new(InformerFactory::new(client, metrics.clone())),
            metrics,
            pending: Mutex::default(),
            running: Mutex::default(),
        }
    }

    /// The shared informers: reconcilers and mappers read their caches from here.
    pub fn informers(&self) -> &Arc<InformerFactory> {
        &self.factory
    }

    /// The metrics of every queue, controller and informer; register them into the daemon's registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Adds a controller; it starts with the next `run`.
    pub fn add(&self, controller: Controller) -> &Self {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(controller);
        self
    }

    /// Runs every added controller until `shutdown` completes, then stops taking work, lets
    /// in-flight reconciles finish within each controller's grace period and stops the informers.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let controllers: Vec<Controller> = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut tasks = tokio::task::JoinSet::new();
        for c in controllers {
            let (state, prepared) = c.prepare(&self.metrics);
            self.running.lock().unwrap_or_else(|e| e.into_inner()).push(state.clone());
            tasks.spawn(controller::run(state, prepared, self.factory.clone(), stop_rx.clone()));
        }
        self.factory.start();
        shutdown.await;
        stop_tx.send_replace(true);
        while tasks.join_next().await.is_some() {}
        self.factory.shut_down();
    }

    /// The `/debug/controllers` view: every running controller with its queue and backoff state.
    pub fn snapshot(&self) -> ControllersSnapshot {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner()).clone();
        debug::snapshot(&running, &self.factory)
    }
}
