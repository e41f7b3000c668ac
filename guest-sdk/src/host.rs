//! The host imports (`log`, `config`, `keep-permissions`) behind one seam. In the component they
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

/// Gives the file `replacement` the permission bits of `original` (see
/// the WIT `keep-permissions`). Natively it copies them with `std::fs`.
pub(crate) fn keep_permissions(
    original: &std::path::Path,
    replacement: &std::path::Path,
) -> std::io::Result<()> {
    imp::keep_permissions(original, replacement)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use std::path::Path;

    use crate::bindings::warden::plugin::host;
    use crate::types::LogLevel;

    pub(super) fn keep_permissions(original: &Path, replacement: &Path) -> std::io::Result<()> {
        let text = |p: &Path| {
            p.to_str().map(str::to_owned).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("`{}` is not utf-8", p.display()),
                )
            })
        };
        host::keep_permissions(&text(original)?, &text(replacement)?)
            .map_err(|reason| std::io::Error::new(std::io::ErrorKind::PermissionDenied, reason))
    }

    pub(super) fn config(key: &str) -> Option<String> {
        host::config(key)
    }

    pub(super) fn log(level: LogLevel, message: &str) {
        host::log(level, message)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::path::Path;

    pub(super) use crate::testing::{native_config as config, native_log as log};

    pub(super) fn keep_permissions(original: &Path, replacement: &Path) -> std::io::Result<()> {
        let permissions = std::fs::metadata(original)?.permissions();
        #[cfg(unix)]
        let permissions = {
            use std::os::unix::fs::PermissionsExt;
            // As the host does: never setuid, setgid or sticky.
            std::fs::Permissions::from_mode(permissions.mode() & 0o777)
        };
        std::fs::set_permissions(replacement, permissions)
    }
}
