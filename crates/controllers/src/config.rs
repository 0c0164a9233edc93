//! How a controller runs: its worker count and trigger mode, set from the daemon's flags.

use shepherd_runtime::TriggerMode;

/// Per-controller run settings. `Default` is 4 workers in hybrid mode (events plus a 5 minute
/// resync), the setting every controller is designed for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerConfig {
    /// Keys reconciled at once (at least 1).
    pub workers: usize,
    pub mode: TriggerMode,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig { workers: 4, mode: TriggerMode::hybrid() }
    }
}
