//! Logging through the host's `log` import: [`write()`] and the
//! `format!`-style macros [`trace!`], [`debug!`], [`info!`], [`warn!`] and
//! [`error!`]. The host tags each line with the plugin's name and caps it.
//!
//! ```
//! use warden_guest::log;
//!
//! log::info!("indexed {} files", 3);
//! log::write(warden_guest::LogLevel::Debug, "done");
//! ```

use crate::types::LogLevel;

/// Writes one line at `level`.
pub fn write(level: LogLevel, message: &str) {
    crate::host::log(level, message)
}

#[doc(inline)]
pub use crate::{
    __warden_log_debug as debug, __warden_log_error as error, __warden_log_info as info,
    __warden_log_trace as trace, __warden_log_warn as warn,
};

/// Logs a `format!`-style message at `trace` level.
#[doc(hidden)]
#[macro_export]
macro_rules! __warden_log_trace {
    ($($arg:tt)+) => {
        $crate::log::write($crate::LogLevel::Trace, &::std::format!($($arg)+))
    };
}

/// Logs a `format!`-style message at `debug` level.
#[doc(hidden)]
#[macro_export]
macro_rules! __warden_log_debug {
    ($($arg:tt)+) => {
        $crate::log::write($crate::LogLevel::Debug, &::std::format!($($arg)+))
    };
}

/// Logs a `format!`-style message at `info` level.
#[doc(hidden)]
#[macro_export]
macro_rules! __warden_log_info {
    ($($arg:tt)+) => {
        $crate::log::write($crate::LogLevel::Info, &::std::format!($($arg)+))
    };
}

/// Logs a `format!`-style message at `warn` level.
#[doc(hidden)]
#[macro_export]
macro_rules! __warden_log_warn {
    ($($arg:tt)+) => {
        $crate::log::write($crate::LogLevel::Warn, &::std::format!($($arg)+))
    };
}

/// Logs a `format!`-style message at `error` level.
#[doc(hidden)]
#[macro_export]
macro_rules! __warden_log_error {
    ($($arg:tt)+) => {
        $crate::log::write($crate::LogLevel::Error, &::std::format!($($arg)+))
    };
}

#[cfg(test)]
mod tests {
    use crate::LogLevel;
    use crate::testing::take_logs;

    #[test]
    fn macros_format_and_tag_the_level() {
        take_logs();
        crate::log::trace!("t{}", 1);
        crate::log::debug!("d");
        crate::log::info!("i {x}", x = "y");
        crate::log::warn!("w");
        crate::log::error!("e");
        assert_eq!(
            take_logs(),
            [
                (LogLevel::Trace, "t1".to_string()),
                (LogLevel::Debug, "d".into()),
                (LogLevel::Info, "i y".into()),
                (LogLevel::Warn, "w".into()),
                (LogLevel::Error, "e".into()),
            ]
        );
        assert!(take_logs().is_empty());
    }
}
