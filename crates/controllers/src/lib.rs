//! Shepherd's controllers, each a reconciler on the engine in `shepherd-runtime`.

pub mod config;
pub mod events;
pub mod podutil;
pub mod replicaset;
pub mod scheduler;

pub use config::ControllerConfig;
pub use events::{EventRecorder, EventType};
pub use replicaset::replicaset_controller;
