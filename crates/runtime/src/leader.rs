//! Leader election through a `coordination.k8s.io/v1` Lease, so that of several controller
//! managers (or schedulers) exactly one acts at a time.
//!
//! The shape is client-go's `leaderelection`: a candidate takes the Lease when its holder has not
//! renewed it for a lease duration, as measured on the candidate's own monotonic clock from the
//! moment it saw the Lease change (never from the timestamps in it, which come from another
//! machine's clock); the holder renews every retry period and gives up when a renew deadline has
//! passed since its last success. The renew deadline is shorter than the lease duration, so a holder
//! stops acting before anyone else may take over: [`LeaderElector::fence`] wraps the client the
//! controllers write through and refuses every write once the deadline has passed, which holds
//! even for a process that was frozen (SIGSTOP) and wakes up after another took the Lease.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use shepherd_api::{ApiError, JsonPath, kinds};
use tokio::time::Instant;

use crate::client::Client;
use crate::intercept::{Call, Intercepted, Interceptor};

/// client-go's defaults: lease duration 15 s, renew deadline 10 s, retry period 2 s.
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    /// The Lease's name, shared by every candidate for one role.
    pub name: String,
    /// This candidate, unique among them (the host name and a random suffix, as Kubernetes).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    pub fn new(name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaderElectionConfig {
            namespace: "kube-system".into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The durations must leave a holder time to notice it lost the Lease before another can take
    /// it: retry period < renew deadline < lease duration.
    pub fn check(&self) -> Result<(), String> {
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be positive and shorter than the renew deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        Ok(())
    }
}

/// The Lease as last read: who held it, and when this process saw that record change.
struct Observed {
    record: String,
    holder: String,
    at: Instant,
}

pub struct LeaderElector {
    client: Arc<dyn Client>,
    config: LeaderElectionConfig,
    observed: Mutex<Option<Observed>>,
    /// When the last successful acquire or renew was sent; `None` while not leading.
    renewed: Mutex<Option<Instant>>,
    refused_writes: AtomicU64,
}

impl LeaderElector {
    pub fn new(client: Arc<dyn Client>, config: LeaderElectionConfig) -> Arc<Self> {
        Arc::new(LeaderElector {
            client,
            config,
            observed: Mutex::new(None),
            renewed: Mutex::new(None),
            refused_writes: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// Leading: the last successful renew was sent less than the renew deadline ago.
    pub fn is_leader(&self) -> bool {
        let renewed = *self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        renewed.is_some_and(|at| at.elapsed() < self.config.renew_deadline)
    }

    /// Writes the fence refused because this process was no longer leading.
    pub fn refused_writes(&self) -> u64 {
        self.refused_writes.load(Ordering::Relaxed)
    }

    /// Waits until this candidate holds the Lease, trying every retry period.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "acquired the lease");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.config.name, error = %e, "cannot read or take the lease"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the Lease every retry period until a renew deadline passes without a successful
    /// renew (or another holder shows up); returns then, no longer leading.
    pub async fn hold(&self) {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            if !self.is_leader() {
                break;
            }
            let attempt = tokio::time::timeout(self.config.retry_period, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(true)) => continue,
                // Someone else holds it: we must have been away past the lease duration.
                Ok(Ok(false)) => break,
                Ok(Err(e)) => tracing::warn!(lease = %self.config.name, error = %e, "renewing the lease failed"),
                Err(_) => tracing::warn!(lease = %self.config.name, "renewing the lease timed out"),
            }
        }
        self.step_down();
        tracing::warn!(lease = %self.config.name, identity = %self.config.identity, "lost the lease");
    }

    /// Gives the Lease up at a clean stop, so that another candidate takes over at once instead
    /// of after the lease duration.
    pub async fn release(&self) {
        if !self.is_leader() {
            return;
        }
        self.step_down();
        let cfg = &self.config;
        let Ok(mut lease) = self.client.get(&kinds::LEASE, Some(&cfg.namespace), &cfg.name).await else { return };
        if lease.at("/spec/holderIdentity").and_then(Value::as_str) != Some(cfg.identity.as_str()) {
            return;
        }
        lease["spec"]["holderIdentity"] = json!("");
        lease["spec"]["renewTime"] = json!(micro_time(jiff::Timestamp::now()));
        if let Err(e) = self.client.update(&kinds::LEASE, Some(&cfg.namespace), lease).await {
            tracing::warn!(lease = %cfg.name, error = %e, "cannot release the lease; others wait for it to expire");
        }
    }

    fn step_down(&self) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// One attempt: take the Lease if it is free or expired, renew it if it is ours. `Ok(false)`
    /// when another candidate holds it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, ApiError> {
        let cfg = &self.config;
        let sent = Instant::now();
        let now = micro_time(jiff::Timestamp::now());
        let seconds = cfg.lease_duration.as_secs().max(1);
        let lease = match self.client.get(&kinds::LEASE, Some(&cfg.namespace), &cfg.name).await {
            Ok(lease) => lease,
            Err(e) if e.is_not_found() => {
                let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": {"holderIdentity": cfg.identity, "leaseDurationSeconds": seconds,
                        "acquireTime": now, "renewTime": now, "leaseTransitions": 0}});
                return match self.client.create(&kinds::LEASE, Some(&cfg.namespace), lease).await {
                    Ok(created) => {
                        self.observe(&created);
                        self.renewed_at(sent);
                        Ok(true)
                    }
                    Err(e) if e.is_already_exists() => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let holder = lease.at("/spec/holderIdentity").and_then(Value::as_str).unwrap_or("").to_string();
        let seen_at = self.observe(&lease);
        let held_by_other = !holder.is_empty() && holder != cfg.identity;
        if held_by_other && seen_at.elapsed() < cfg.lease_duration {
            return Ok(false);
        }
        let mut next = lease.clone();
        next["spec"]["holderIdentity"] = json!(cfg.identity);
        next["spec"]["leaseDurationSeconds"] = json!(seconds);
        next["spec"]["renewTime"] = json!(now);
        if holder != cfg.identity {
            let transitions = lease.at("/spec/leaseTransitions").and_then(Value::as_i64).unwrap_or(0);
            next["spec"]["acquireTime"] = json!(now);
            next["spec"]["leaseTransitions"] = json!(if holder.is_empty() { transitions } else { transitions + 1 });
        }
        // The resourceVersion read above is the precondition: of two candidates racing for an
        // expired Lease, one wins and the other gets a conflict.
        match self.client.update(&kinds::LEASE, Some(&cfg.namespace), next).await {
            Ok(updated) => {
                self.observe(&updated);
                self.renewed_at(sent);
                Ok(true)
            }
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn renewed_at(&self, sent: Instant) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
    }

    /// Notes the Lease's record; returns when this process first saw it as it is now.
    fn observe(&self, lease: &Value) -> Instant {
        let spec = lease.get("spec").cloned().unwrap_or(Value::Null);
        // Every write changes the resourceVersion, even one that leaves the spec as it was.
        let version = lease.at("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
        let record = format!("{version} {spec}");
        let holder = spec.at("/holderIdentity").and_then(Value::as_str).unwrap_or("").to_string();
        let mut observed = self.observed.lock().unwrap_or_else(|e| e.into_inner());
        match observed.as_ref() {
            Some(o) if o.record == record => o.at,
            _ => {
                if observed.as_ref().is_some_and(|o| o.holder != holder) && !holder.is_empty() {
                    tracing::info!(lease = %self.config.name, %holder, "the lease has a new holder");
                }
                let at = Instant::now();
                *observed = Some(Observed { record, holder, at });
                at
            }
        }
    }

    /// `client`, with every write refused while this process is not leading: reads pass, so
    /// caches stay warm for a quick takeover.
    pub fn fence(self: &Arc<Self>, client: Arc<dyn Client>) -> Arc<dyn Client> {
        Arc::new(Intercepted::new(client, Fence(self.clone())))
    }
}

/// Kubernetes' `MicroTime` wire format.
fn micro_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// Refuses every write while its elector is not leading.
struct Fence(Arc<LeaderElector>);

#[async_trait]
impl Interceptor for Fence {
    async fn before(&self, call: &Call<'_>) -> Result<(), ApiError> {
        if !call.is_write() || self.0.is_leader() {
            return Ok(());
        }
        self.0.refused_writes.fetch_add(1, Ordering::Relaxed);
        Err(ApiError::ServiceUnavailable(format!(
            "not leading (lease {}/{}): {} {} refused",
            self.0.config.namespace,
            self.0.config.name,
            call.verb(),
            call.resource().plural
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryClient;

    fn candidate(client: &Arc<MemoryClient>, id: &str) -> Arc<LeaderElector> {
        LeaderElector::new(client.clone(), LeaderElectionConfig::new("kube-controller-manager", id))
    }

    async fn holder(client: &MemoryClient) -> String {
        let lease = client.get(&kinds::LEASE, Some("kube-system"), "kube-controller-manager").await.expect("lease");
        lease.at("/spec/holderIdentity").and_then(Value::as_str).unwrap_or("").to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn one_candidate_leads_and_the_other_waits_while_the_lease_is_renewed() {
        let client = Arc::new(MemoryClient::new());
        let (a, b) = (candidate(&client, "a"), candidate(&client, "b"));
        a.acquire().await;
        assert!(a.is_leader());
        let hold = tokio::spawn({
            let a = a.clone();
            async move { a.hold().await }
        });
        for _ in 0..20 {
            assert!(!b.try_acquire_or_renew().await.expect("attempt"), "b took a lease a keeps renewing");
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        assert_eq!(holder(&client).await, "a");
        assert!(a.is_leader() && !b.is_leader());
        hold.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_stops_renewing_is_replaced_after_the_lease_duration_and_counts_a_transition() {
        let client = Arc::new(MemoryClient::new());
        let (a, b) = (candidate(&client, "a"), candidate(&client, "b"));
        a.acquire().await;
        // b sees a's record now; a never renews again (it died).
        assert!(!b.try_acquire_or_renew().await.expect("attempt"));
        let started = Instant::now();
        b.acquire().await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(15) && waited <= Duration::from_secs(17), "took over after {waited:?}");
        assert_eq!(holder(&client).await, "b");
        let lease = client.get(&kinds::LEASE, Some("kube-system"), "kube-controller-manager").await.expect("lease");
        assert_eq!(lease.at("/spec/leaseTransitions"), Some(&json!(1)));
        let renew = lease.at("/spec/renewTime").and_then(Value::as_str).expect("renewTime");
        assert_eq!(renew.len(), "2026-01-01T00:00:00.000000Z".len(), "MicroTime has six fraction digits: {renew}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_leader_is_fenced_before_another_can_take_the_lease() {
        let client = Arc::new(MemoryClient::new());
        let a = candidate(&client, "a");
        a.acquire().await;
        let writes = a.fence(client.clone());
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one", "namespace": "default"}});
        writes.create(&kinds::CONFIGMAP, Some("default"), cm).await.expect("a leader writes");
        // Frozen: no renew for longer than the renew deadline, still short of the lease duration.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!a.is_leader());
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two", "namespace": "default"}});
        let refused = writes.create(&kinds::CONFIGMAP, Some("default"), cm).await.expect_err("fenced");
        assert!(matches!(refused, ApiError::ServiceUnavailable(_)), "{refused:?}");
        assert_eq!(a.refused_writes(), 1);
        assert!(writes.get(&kinds::CONFIGMAP, Some("default"), "one").await.is_ok(), "reads still pass");
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_finds_another_in_its_place_steps_down() {
        let client = Arc::new(MemoryClient::new());
        let (a, b) = (candidate(&client, "a"), candidate(&client, "b"));
        a.acquire().await;
        assert!(!b.try_acquire_or_renew().await.expect("attempt"));
        // a is frozen past the lease duration; b takes over.
        tokio::time::advance(Duration::from_secs(16)).await;
        assert!(b.try_acquire_or_renew().await.expect("b takes over"));
        tokio::time::timeout(Duration::from_secs(5), a.hold()).await.expect("a notices at once");
        assert!(!a.is_leader());
        assert_eq!(holder(&client).await, "b");
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_at_once() {
        let client = Arc::new(MemoryClient::new());
        let (a, b) = (candidate(&client, "a"), candidate(&client, "b"));
        a.acquire().await;
        assert!(!b.try_acquire_or_renew().await.expect("attempt"));
        a.release().await;
        assert!(!a.is_leader());
        assert!(b.try_acquire_or_renew().await.expect("attempt"), "b waited although a let go");
    }

    #[test]
    fn durations_that_leave_no_margin_are_refused() {
        let mut cfg = LeaderElectionConfig::new("l", "me");
        assert!(cfg.check().is_ok());
        cfg.renew_deadline = Duration::from_secs(15);
        assert!(cfg.check().unwrap_err().contains("renew deadline"));
        cfg.renew_deadline = Duration::from_secs(10);
        cfg.retry_period = Duration::from_secs(10);
        assert!(cfg.check().unwrap_err().contains("retry period"));
    }
}
