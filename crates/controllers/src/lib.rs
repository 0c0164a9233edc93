//! Shepherd's controllers, each a reconciler on the engine in `shepherd-runtime`.

pub mod clusterroleaggregation;
pub mod config;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod events;
pub mod eventttl;
mod expectations;
pub mod gc;
pub mod history;
pub mod job;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podtally;
pub mod podautoscaler;
pub mod podutil;
pub mod replicaset;
pub mod rootcacertpublisher;
pub mod scheduler;
pub mod serviceaccount;
pub mod statefulset;
pub mod taintmanager;

pub use config::ControllerConfig;
pub use deployment::deployment_controller;
pub use events::{EventRecorder, EventType};
pub use gc::garbage_collector;
pub use replicaset::{replicaset_controller, replicaset_controller_recounting};
