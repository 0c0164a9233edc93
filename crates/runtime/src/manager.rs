//! Runs a process's controllers together: one informer factory, one metrics handle, one shutdown.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::TriggerMode;
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
            let runtime = c.runtime().cloned();
            let (state, prepared) = c.prepare(&self.metrics);
            self.running.lock().unwrap_or_else(|e| e.into_inner()).push(state.clone());
            let run = controller::run(state, prepared, self.factory.clone(), stop_rx.clone());
            match runtime {
                Some(runtime) => tasks.spawn_on(run, &runtime),
                None => tasks.spawn(run),
            };
        }
        self.factory.start();
        shutdown.await;
        stop_tx.send_replace(true);
        while tasks.join_next().await.is_some() {}
        self.factory.shut_down();
    }

    /// Runs the manager in a task of its own until the returned handle is stopped.
    pub fn spawn(self) -> RunningManager {
        let manager = Arc::new(self);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let m = manager.clone();
        let task = tokio::spawn(async move {
            m.run(async {
                let _ = stopped.await;
            })
            .await
        });
        RunningManager { manager, stop: Some(stop), task }
    }

    /// Changes a running controller's trigger mode and the fraction of events its handlers lose,
    /// at once (a demonstration of the seeds' experiment, live). Anti-entropy is set up with the
    /// informers at start, so it is neither entered nor left here.
    pub fn tune(&self, name: &str, mode: Option<TriggerMode>, event_loss: Option<f64>) -> Result<(), TuneError> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let c = running.iter().find(|c| c.name == name).ok_or_else(|| TuneError::NotFound(name.to_string()))?;
        if let Some(loss) = event_loss
            && !(0.0..=1.0).contains(&loss)
        {
            return Err(TuneError::Invalid(format!("eventLoss must be between 0 and 1, not {loss}")));
        }
        if let Some(mode) = mode {
            let anti = |m: &TriggerMode| matches!(m, TriggerMode::AntiEntropy { .. });
            if anti(&mode) || anti(&c.mode()) {
                return Err(TuneError::Invalid("anti-entropy is chosen at start (--controller-mode); it cannot be switched to or from while running".into()));
            }
            if mode.period().is_some_and(|p| p.is_zero()) {
                return Err(TuneError::Invalid("the period must be longer than 0 seconds".into()));
            }
            c.mode.send_replace(mode);
        }
        if let Some(loss) = event_loss {
            c.event_loss.set_drop_fraction(loss);
        }
        Ok(())
    }

    /// The `/debug/controllers` view: every running controller with its queue and backoff state.
    pub fn snapshot(&self) -> ControllersSnapshot {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner()).clone();
        debug::snapshot(&running, &self.factory)
    }
}

/// Why `Manager::tune` refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TuneError {
    #[error("no controller named {0:?} runs here")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
}

/// A manager running in its own task (`Manager::spawn`).
pub struct RunningManager {
    manager: Arc<Manager>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningManager {
    pub fn manager(&self) -> &Arc<Manager> {
        &self.manager
    }

    /// Signals shutdown and waits until every controller has drained and stopped.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::client::Patch;
    use crate::controller::{Action, Error, TriggerMode};
    use crate::testing::MemoryClient;
    use serde_json::{Value, json};
    use shepherd_api::kinds::{ENDPOINTS, NODE, POD, REPLICASET, SERVICE};
    use shepherd_api::{ApiError, ResourceInfo};
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::time::Instant;

    // The toy controller: every Service ("source") has an Endpoints object ("derived") of the
    // same name whose `value` equals the source's `spec.value`. It reads the source from the
    // shared cache, as real controllers do, and writes the derived object through the client.

    fn source(name: &str, value: &str) -> Value {
        json!({ "metadata": { "name": name, "namespace": "ns" }, "spec": { "value": value } })
    }

    async fn sync_derived(client: &MemoryClient, sources: &Cache, key: &str) -> Result<Action, Error> {
        let (ns, name) = key.split_once('/').ok_or("key without a namespace")?;
        let Some(src) = sources.get(key) else {
            return match client.delete(&ENDPOINTS, Some(ns), name, &Default::default()).await {
                Ok(_) => Ok(Action::Done),
                Err(e) if e.is_not_found() => Ok(Action::Done),
                Err(e) => Err(e.into()),
            };
        };
        let want = src["spec"]["value"].clone();
        match client.get(&ENDPOINTS, Some(ns), name).await {
            Ok(current) if current["value"] == want => {}
            Ok(_) => {
                client.patch(&ENDPOINTS, Some(ns), name, Patch::Merge(json!({ "value": want }))).await?;
            }
            Err(e) if e.is_not_found() => {
                client.create(&ENDPOINTS, Some(ns), json!({ "metadata": { "name": name }, "value": want })).await?;
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Action::Done)
    }

    async fn derived(client: &MemoryClient, name: &str) -> Option<String> {
        client.get(&ENDPOINTS, Some("ns"), name).await.ok().and_then(|o| o["value"].as_str().map(str::to_string))
    }

    async fn all_derived_are(client: &MemoryClient, names: &[String], value: &str) -> bool {
        for n in names {
            if derived(client, n).await.as_deref() != Some(value) {
                return false;
            }
        }
        true
    }

    /// Polls `cond` on the paused clock in 10 ms steps; returns the time it took, or `None` after `limit`.
    async fn wait_until<F, Fut>(limit: Duration, mut cond: F) -> Option<Duration>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() <= limit {
            if cond().await {
                return Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    fn toy_manager(client: &Arc<MemoryClient>, mode: TriggerMode) -> Manager {
        let manager = Manager::new(client.clone());
        let sources = manager.informers().cache(&SERVICE);
        let c = client.clone();
        manager.add(
            Controller::new("toy", &SERVICE, move |key: String| {
                let (c, sources) = (c.clone(), sources.clone());
                async move { sync_derived(&c, &sources, &key).await }
            })
            .mode(mode)
            .workers(2),
        );
        manager
    }

    async fn create_sources(client: &MemoryClient, n: usize, value: &str) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..n {
            let name = format!("s{i}");
            client.create(&SERVICE, None, source(&name, value)).await.unwrap();
            names.push(name);
        }
        names
    }

    async fn set_all_sources(client: &MemoryClient, names: &[String], value: &str) {
        for n in names {
            client.patch(&SERVICE, Some("ns"), n, Patch::Merge(json!({ "spec": { "value": value } }))).await.unwrap();
        }
    }

    #[test]
    fn a_controller_given_a_runtime_of_its_own_reconciles_on_that_runtime_s_threads() {
        let own = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("own-runtime")
            .enable_all()
            .build()
            .unwrap();
        let managers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("manager-runtime")
            .enable_all()
            .build()
            .unwrap();
        let threads = Arc::new(Mutex::new(HashSet::new()));
        managers.block_on(async {
            let client = Arc::new(MemoryClient::new());
            let names = create_sources(&client, 3, "1").await;
            let manager = Manager::new(client.clone());
            let sources = manager.informers().cache(&SERVICE);
            let (c, seen) = (client.clone(), threads.clone());
            manager.add(
                Controller::new("toy", &SERVICE, move |key: String| {
                    let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
                    seen.lock().unwrap().insert(thread);
                    let (c, sources) = (c.clone(), sources.clone());
                    async move { sync_derived(&c, &sources, &key).await }
                })
                .on_runtime(own.handle().clone()),
            );
            let running = Manager::spawn(manager);
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !all_derived_are(&client, &names, "1").await {
                assert!(std::time::Instant::now() < deadline, "the controller on its own runtime never reconciled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            running.stop().await;
        });
        assert_eq!(*threads.lock().unwrap(), HashSet::from(["own-runtime".to_string()]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_primary_change_filter_keeps_unwanted_changes_out_of_the_queue_but_not_out_of_the_resync() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 3, "1").await;
        let manager = Manager::new(client.clone());
        let sources = manager.informers().cache(&SERVICE);
        let c = client.clone();
        let period = Duration::from_secs(60);
        manager.add(
            Controller::new("toy", &SERVICE, move |key: String| {
                let (c, sources) = (c.clone(), sources.clone());
                async move { sync_derived(&c, &sources, &key).await }
            })
            .mode(TriggerMode::hybrid().with_period(period))
            .primary_changes(|change| !matches!(change, crate::cache::Change::Updated { .. })),
        );
        let running = Manager::spawn(manager);
        assert!(wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "1")).await.is_some(), "added: enqueued");
        set_all_sources(&client, &names, "2").await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(all_derived_are(&client, &names, "1").await, "an update the filter refuses enqueues nothing");
        let took = wait_until(period * 2, || all_derived_are(&client, &names, "2")).await;
        assert!(took.is_some(), "the resync still visits every key");
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn hybrid_reconciles_every_change_within_one_resync_even_when_every_watch_event_is_lost() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 5, "1").await;
        let period = Duration::from_secs(60);
        let running = Manager::spawn(toy_manager(&client, TriggerMode::hybrid().with_period(period)));
        assert!(wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "1")).await.is_some());

        running.manager().informers().watch_faults().set_drop_fraction(1.0);
        set_all_sources(&client, &names, "2").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(all_derived_are(&client, &names, "1").await, "with every event lost nothing moves before the resync");

        let took = wait_until(period * 2, || all_derived_are(&client, &names, "2")).await;
        let took = took.expect("hybrid must converge without any watch event");
        assert!(took <= period.mul_f64(1.1), "converged after {took:?}, more than one resync period (±10%)");
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_edge_controller_that_loses_its_events_stays_stuck_until_switched_to_hybrid_while_running() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 3, "1").await;
        let running = Manager::spawn(toy_manager(&client, TriggerMode::edge()));
        assert!(wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "1")).await.is_some());

        let m = running.manager();
        m.tune("toy", None, Some(1.0)).unwrap();
        set_all_sources(&client, &names, "2").await;
        assert!(wait_until(Duration::from_secs(600), || all_derived_are(&client, &names, "2")).await.is_none(), "edge never repairs");
        assert_eq!(m.snapshot().controllers[0].event_loss, 1.0);

        let period = Duration::from_secs(10);
        m.tune("toy", Some(TriggerMode::hybrid().with_period(period)), None).unwrap();
        let took = wait_until(period * 2, || all_derived_are(&client, &names, "2")).await;
        assert!(took.expect("the next resync repairs") <= period.mul_f64(1.1), "{took:?}");
        let toy = &m.snapshot().controllers[0];
        assert_eq!((toy.mode.as_str(), toy.period_seconds), ("hybrid", Some(10.0)));
        assert!(toy.last_resync.is_some());

        assert_eq!(m.tune("nope", None, None), Err(TuneError::NotFound("nope".into())));
        assert!(matches!(m.tune("toy", None, Some(1.5)), Err(TuneError::Invalid(_))));
        assert!(matches!(m.tune("toy", Some(TriggerMode::anti_entropy()), None), Err(TuneError::Invalid(_))));
        assert_eq!(m.snapshot().controllers[0].mode, "hybrid", "a refused change changes nothing");
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn anti_entropy_reconciles_every_change_within_one_check_even_when_every_watch_event_is_lost() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 5, "1").await;
        let check = Duration::from_secs(1);
        let running = Manager::spawn(toy_manager(&client, TriggerMode::anti_entropy().with_period(check)));
        assert!(wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "1")).await.is_some());

        running.manager().informers().watch_faults().set_drop_fraction(1.0);
        set_all_sources(&client, &names, "2").await;
        let took = wait_until(check * 3, || all_derived_are(&client, &names, "2")).await;
        let took = took.expect("anti-entropy must converge without any watch event");
        // One check sees the server ahead, a tenth of an interval later the writes count as lost.
        assert!(took <= check.mul_f64(1.15), "converged after {took:?}, more than one check interval");
        let debug = running.manager().snapshot();
        let toy = &debug.controllers[0];
        assert_eq!((toy.mode.as_str(), toy.period_seconds), ("anti-entropy", Some(1.0)));
        assert!(toy.last_repair.is_some() && toy.last_check.is_some(), "{toy:?}");
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn edge_stays_stuck_forever_when_its_watch_events_are_lost() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 5, "1").await;
        let running = Manager::spawn(toy_manager(&client, TriggerMode::edge()));
        assert!(wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "1")).await.is_some());

        running.manager().informers().watch_faults().set_drop_fraction(1.0);
        set_all_sources(&client, &names, "2").await;
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        assert!(all_derived_are(&client, &names, "1").await, "edge never learns of the change: stuck, as the seeds warn");
        let cached = running.manager().informers().cache(&SERVICE).get("ns/s0");
        assert_eq!(cached.map(|o| o["spec"]["value"].clone()), Some(json!("1")));
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn level_ignores_events_and_reconciles_only_at_the_tick() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 5, "1").await;
        let started = Instant::now();
        let running = Manager::spawn(toy_manager(&client, TriggerMode::level()));
        assert!(wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "1")).await.is_some());

        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
        set_all_sources(&client, &names, "2").await; // events flow, level does not listen
        tokio::time::sleep_until(started + Duration::from_millis(4900)).await;
        assert!(all_derived_are(&client, &names, "1").await, "nothing happens between ticks");
        let took = wait_until(Duration::from_secs(1), || all_derived_are(&client, &names, "2")).await;
        assert!(took.is_some(), "the 5 s tick reconciles the change");
        let at = started.elapsed();
        assert!(at >= Duration::from_secs(5) && at <= Duration::from_millis(5100), "reconciled at {at:?}");
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconciler_panicking_on_every_third_call_still_converges_and_other_controllers_are_unaffected() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 10, "1").await;
        for i in 0..5 {
            client.create(&NODE, None, json!({ "metadata": { "name": format!("n{i}") } })).await.unwrap();
        }
        let manager = Manager::new(client.clone());
        let sources = manager.informers().cache(&SERVICE);
        let calls = Arc::new(AtomicUsize::new(0));
        let panics = Arc::new(AtomicUsize::new(0));
        let (c, calls2, panics2) = (client.clone(), calls.clone(), panics.clone());
        manager.add(
            Controller::new("panicky", &SERVICE, move |key: String| {
                let (c, sources, calls, panics) = (c.clone(), sources.clone(), calls2.clone(), panics2.clone());
                async move {
                    if calls.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
                        panics.fetch_add(1, Ordering::SeqCst);
                        panic!("every third call panics ({key})");
                    }
                    sync_derived(&c, &sources, &key).await
                }
            })
            .workers(3),
        );
        let seen_nodes: Arc<Mutex<HashSet<String>>> = Arc::default();
        let seen = seen_nodes.clone();
        manager.add(Controller::new("steady", &NODE, move |key: String| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().insert(key);
                Ok(Action::Done)
            }
        }));
        let running = Manager::spawn(manager);

        let took = wait_until(Duration::from_secs(10), || all_derived_are(&client, &names, "1")).await;
        assert!(took.is_some(), "every key converges despite the panics");
        assert_eq!(seen_nodes.lock().unwrap().len(), 5, "the other controller reconciled all its keys");
        assert!(panics.load(Ordering::SeqCst) >= 3);

        let snapshot = running.manager().snapshot();
        let by_name = |n: &str| snapshot.controllers.iter().find(|c| c.name == n).cloned().unwrap();
        assert_eq!(by_name("panicky").reconciles.panic, panics.load(Ordering::SeqCst) as u64);
        assert_eq!(by_name("steady").reconciles.panic, 0);
        assert_eq!(by_name("steady").reconciles.success, 5);

        let mut registry = prometheus_client::registry::Registry::default();
        running.manager().metrics().register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let expected = format!(r#"controller_reconcile_panics_total{{controller="panicky"}} {}"#, panics.load(Ordering::SeqCst));
        assert!(text.contains(&expected), "{text}");
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn injected_reconcile_faults_are_retried_until_every_key_converges() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 20, "1").await;
        let manager = Manager::new(client.clone());
        let sources = manager.informers().cache(&SERVICE);
        let c = client.clone();
        let faults = crate::faults::ReconcileFaults { fail_fraction: 0.3, panic_fraction: 0.2 };
        manager.add(
            Controller::new("faulty", &SERVICE, move |key: String| {
                let (c, sources) = (c.clone(), sources.clone());
                async move { sync_derived(&c, &sources, &key).await }
            })
            .faults(faults)
            .workers(4),
        );
        let running = Manager::spawn(manager);
        let took = wait_until(Duration::from_secs(60), || all_derived_are(&client, &names, "1")).await;
        assert!(took.is_some(), "every key converges through injected failures and panics");
        let snapshot = running.manager().snapshot();
        let counts = &snapshot.controllers[0].reconciles;
        assert!(counts.error + counts.panic > 0, "with half the calls faulty some must have failed: {counts:?}");
        running.stop().await;
    }

    /// A reconciler that records every key it is called with.
    fn recording(manager: &Manager, name: &str, primary: &ResourceInfo, mode: TriggerMode) -> Arc<Mutex<Vec<String>>> {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = seen.clone();
        manager.add(
            Controller::new(name, primary, move |key: String| {
                let s = s.clone();
                async move {
                    s.lock().unwrap().push(key);
                    Ok(Action::Done)
                }
            })
            .mode(mode),
        );
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_change_enqueues_its_replicaset_and_a_node_change_enqueues_the_pods_bound_to_it() {
        let client = Arc::new(MemoryClient::new());
        client.create(&REPLICASET, None, json!({ "metadata": { "name": "web", "namespace": "ns" } })).await.unwrap();
        client.create(&NODE, None, json!({ "metadata": { "name": "n1" } })).await.unwrap();
        let manager = Manager::new(client.clone());
        let rs_seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = rs_seen.clone();
        manager.add(
            Controller::new("replicaset", &REPLICASET, move |key: String| {
                let s = s.clone();
                async move {
                    s.lock().unwrap().push(key);
                    Ok(Action::Done)
                }
            })
            .owns(&POD)
            .mode(TriggerMode::edge()),
        );
        let pods = manager.informers().cache(&POD);
        let pod_seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = pod_seen.clone();
        manager.add(
            Controller::new("pod-on-node", &POD, move |key: String| {
                let s = s.clone();
                async move {
                    s.lock().unwrap().push(key);
                    Ok(Action::Done)
                }
            })
            .watches(&NODE, move |node| {
                let name = node["metadata"]["name"].as_str().unwrap_or_default();
                pods.by_node_name(name).iter().filter_map(|p| crate::cache::object_key(p)).collect()
            })
            .mode(TriggerMode::edge()),
        );
        let running = Manager::spawn(manager);
        assert!(wait_until(Duration::from_secs(1), || async { rs_seen.lock().unwrap().len() == 1 }).await.is_some());

        let pod = json!({ "metadata": { "name": "web-0", "namespace": "ns", "ownerReferences": [
            { "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "x", "controller": true }
        ] }, "spec": { "nodeName": "n1" } });
        client.create(&POD, None, pod).await.unwrap();
        assert!(wait_until(Duration::from_secs(1), || async { rs_seen.lock().unwrap().len() == 2 }).await.is_some());
        assert_eq!(*rs_seen.lock().unwrap(), ["ns/web", "ns/web"]);

        pod_seen.lock().unwrap().clear();
        client.patch(&NODE, None, "n1", Patch::Merge(json!({ "status": { "phase": "NotReady" } }))).await.unwrap();
        assert!(wait_until(Duration::from_secs(1), || async { !pod_seen.lock().unwrap().is_empty() }).await.is_some());
        assert_eq!(*pod_seen.lock().unwrap(), ["ns/web-0"]);
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_force_resync_annotation_alone_triggers_a_reconcile() {
        let client = Arc::new(MemoryClient::new());
        create_sources(&client, 1, "1").await;
        let manager = Manager::new(client.clone());
        let seen = recording(&manager, "annotated", &SERVICE, TriggerMode::edge());
        let running = Manager::spawn(manager);
        assert!(wait_until(Duration::from_secs(1), || async { seen.lock().unwrap().len() == 1 }).await.is_some());
        let patch = json!({ "metadata": { "annotations": { "shepherd.io/force-resync": "1" } } });
        client.patch(&SERVICE, Some("ns"), "s0", Patch::Merge(patch)).await.unwrap();
        assert!(wait_until(Duration::from_secs(1), || async { seen.lock().unwrap().len() == 2 }).await.is_some());
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_shows_in_the_debug_view_with_its_backoff_and_last_error() {
        let client = Arc::new(MemoryClient::new());
        create_sources(&client, 2, "1").await;
        let manager = Manager::new(client.clone());
        manager.add(Controller::new("picky", &SERVICE, |key: String| async move {
            if key == "ns/s1" {
                return Err(ApiError::Conflict { kind: "services".into(), name: "s1".into(), message: "s1 is cursed".into() }.into());
            }
            Ok(Action::Done)
        }));
        let running = Manager::spawn(manager);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let json = running.manager().snapshot().to_json();
        let c = &json["controllers"][0];
        assert_eq!(c["name"], "picky");
        assert_eq!(c["mode"], "hybrid");
        assert_eq!(c["backoff"][0]["key"], "ns/s1");
        assert_eq!(c["backoff"][0]["lastError"], "s1 is cursed");
        assert!(c["backoff"][0]["retries"].as_u64().unwrap_or(0) >= 3, "{json}");
        assert_eq!(c["reconciles"]["success"], 1);
        running.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_lets_an_in_flight_reconcile_finish_within_the_grace_period() {
        let client = Arc::new(MemoryClient::new());
        create_sources(&client, 1, "1").await;
        let manager = Manager::new(client.clone());
        let finished = Arc::new(AtomicUsize::new(0));
        let f = finished.clone();
        manager.add(
            Controller::new("slow", &SERVICE, move |_key: String| {
                let f = f.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    f.fetch_add(1, Ordering::SeqCst);
                    Ok(Action::Done)
                }
            })
            .shutdown_grace(Duration::from_secs(10)),
        );
        let running = Manager::spawn(manager);
        tokio::time::sleep(Duration::from_millis(100)).await;
        running.stop().await;
        assert_eq!(finished.load(Ordering::SeqCst), 1, "the reconcile in flight at shutdown completed");
    }

    #[tokio::test(start_paused = true)]
    async fn keys_pushed_from_outside_are_reconciled_once_each_even_in_level_mode() {
        let client = Arc::new(MemoryClient::new());
        let manager = Manager::new(client.clone());
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s = seen.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        manager.add(
            Controller::new("external", &SERVICE, move |key: String| {
                let s = s.clone();
                async move {
                    s.lock().unwrap_or_else(|e| e.into_inner()).push(key);
                    Ok(Action::Done)
                }
            })
            .mode(TriggerMode::level())
            .triggered_by(rx),
        );
        let running = Manager::spawn(manager);
        tokio::time::sleep(Duration::from_millis(10)).await;
        for key in ["ns/exited", "ns/exited", "ns/probed"] {
            tx.send(key.to_string()).expect("controller is listening");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut got = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        got.sort();
        assert_eq!(got, ["ns/exited", "ns/probed"], "each once, well before the 5 s tick");
        running.stop().await;
    }

    /// Reconcile latency from write to reconcile start with events flowing (hybrid mode), on the
    /// real clock. A measurement, not an assertion:
    /// `cargo test --release -p shepherd-runtime -- --ignored --nocapture reconcile_latency`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn reconcile_latency_from_write_to_reconcile_start() {
        let client = Arc::new(MemoryClient::new());
        let names = create_sources(&client, 100, "0").await;
        let manager = Manager::new(client.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, std::time::Instant)>();
        let sources = manager.informers().cache(&SERVICE);
        manager.add(
            Controller::new("latency", &SERVICE, move |key: String| {
                let started = std::time::Instant::now();
                let value = sources.get(&key).and_then(|o| o["spec"]["value"].as_str().map(str::to_string));
                let _ = tx.send((format!("{key}={}", value.unwrap_or_default()), started));
                async { Ok(Action::Done) }
            })
            .workers(4),
        );
        let running = Manager::spawn(manager);
        tokio::time::sleep(Duration::from_millis(200)).await;
        while rx.try_recv().is_ok() {}
        let mut samples = Vec::new();
        for round in 1..=20 {
            for n in &names {
                let value = round.to_string();
                let wrote = std::time::Instant::now();
                client.patch(&SERVICE, Some("ns"), n, Patch::Merge(json!({ "spec": { "value": value } }))).await.unwrap();
                let want = format!("ns/{n}={value}");
                loop {
                    let Some((got, at)) = rx.recv().await else { break };
                    if got == want {
                        samples.push(at.duration_since(wrote));
                        break;
                    }
                }
            }
        }
        samples.sort();
        let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p) as usize];
        println!(
            "reconcile latency over {} writes: p50 {:?}, p99 {:?}, max {:?}",
            samples.len(),
            pct(0.50),
            pct(0.99),
            pct(1.0)
        );
        running.stop().await;
    }

    /// A controller whose reconciler asks for its key again at once, every time, on a
    /// current-thread runtime with the paused clock: `(reconciles, the time the test's own timer saw)`.
    async fn run_one_second_beside_an_eager_requeuer() -> (usize, Duration) {
        let client = Arc::new(MemoryClient::new());
        create_sources(&client, 1, "1").await;
        let manager = Manager::new(client.clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        manager.add(Controller::new("eager", &SERVICE, move |_key: String| {
            let calls = counted.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(Action::RequeueAfter(Duration::ZERO))
            }
        }));
        let running = Manager::spawn(manager);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let waited = started.elapsed();
        running.stop().await;
        (calls.load(Ordering::SeqCst), waited)
    }

    #[test]
    fn a_reconciler_that_always_asks_to_be_requeued_at_once_leaves_the_runtime_to_other_tasks() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
            let _ = tx.send(rt.block_on(run_one_second_beside_an_eager_requeuer()));
        });
        let (calls, waited) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the test's one-second timer never fired: the requeueing worker held the runtime");
        assert!(waited >= Duration::from_secs(1));
        // Requeues are at least a millisecond apart: about a thousand in a second, not unbounded.
        assert!((100..=1100).contains(&calls), "{calls} reconciles in one second");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_draining_a_long_queue_of_instant_reconciles_lets_other_tasks_run_in_between() {
        const KEYS: usize = 2000;
        let client = Arc::new(MemoryClient::new());
        create_sources(&client, KEYS, "1").await;
        let manager = Manager::new(client.clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        manager.add(Controller::new("instant", &SERVICE, move |_key: String| {
            let calls = counted.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(Action::Done)
            }
        }));
        let running = Manager::spawn(manager);
        // What another task on the same thread sees of the worker's progress while it gets turns.
        let mut seen = Vec::new();
        while calls.load(Ordering::SeqCst) < KEYS {
            seen.push(calls.load(Ordering::SeqCst));
            tokio::task::yield_now().await;
        }
        running.stop().await;
        let between = seen.iter().filter(|&&n| n > 0 && n < KEYS).count();
        assert!(between >= 5, "another task ran only {between} times while {KEYS} keys were reconciled: {seen:?}");
    }
}
