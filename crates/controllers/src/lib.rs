//! Shepherd's controllers, each a reconciler on the engine in `shepherd-runtime`.

pub mod events;

pub use events::{EventRecorder, EventType};
