//! Shepherd's reconcile engine: informers, work queue, backoff, resync and the controller loop.

pub mod client;

pub use client::{Client, DeleteParams, ListParams, ObjectList, Patch, Propagation, WatchEvent};
