//! The host imports (`log`, `config`) behind one seam. In the component they
//! call the host; natively (unit tests, `cargo test` on x86_64) they use the
//! thread-local state of [`crate::testing`], so plugin logic runs without a
//! wasm runtime and never reaches the generated import stubs, which panic off
//! wasm.

use crate::types::LogLevel;

/// Looks up a configuration value the operator set for this plugin.
///
/// In the component this asks the host. Natively it reads the values set
/// with [`testing::set_config`](crate::testing::set_config) on the current
/// thread; by default none is set.
pub fn config(key: &str) -> Option<String> {
    imp::config(key)
}

/// Sends one log line to the host (natively: to stderr, and to the capture
/// that [`testing::take_logs`](crate::testing::take_logs) drains).
pub(crate) fn log(level: LogLevel, message: &str) {
    imp::log(level, message)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use crate::bindings::warden::plugin::host;
    use crate::types::LogLevel;

    pub(super) fn config(key: &str) -> Option<String> {
        host::config(key)
    }

    pub(super) fn log(level: LogLevel, message: &str) {
        host::log(level, message)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    pub(super) use crate::testing::{native_config as config, native_log as log};
}
