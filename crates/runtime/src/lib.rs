//! Shepherd's reconcile engine: informers, work queue, backoff, resync and the controller loop.

pub mod cache;
pub mod client;
pub mod controller;
mod cputime;
pub mod debug;
pub mod faults;
pub mod informer;
pub mod intercept;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod ratelimit;
pub mod view;
pub(crate) mod workqueue;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use cache::{Cache, Change, Transform};
pub use controller::{Action, Controller, Reconciler, TriggerMode};
pub use client::{Client, DeleteParams, ListParams, ObjectList, Patch, Propagation, WatchEvent};
pub use faults::{ReconcileFaults, WatchFaults};
pub use informer::{Informer, InformerFactory};
pub use manager::{Manager, RunningManager, TuneError};
pub use metrics::Metrics;
pub use view::PodView;
