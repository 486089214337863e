//! Logging to the host's log through the WIT `log` interface: [`write()`] and the [`trace!`] … [`error!`] macros.
//!
//! Messages are tagged by the host with the plugin's name and key, and limited in size
//! per call (`log_bytes_per_call_max`, shared with stdout and stderr); what is over the limit is dropped and counted. In native
//! tests (not `wasm32`) messages go to standard error instead.
//!
//! ```
//! use groupstate_sdk::log;
//!
//! log::info!("alert for {} at {}", "s-000123", 1_700_000_000_123i64);
//! log::write(log::Level::Warn, "reading out of range");
//! ```

use std::fmt;

#[cfg(target_arch = "wasm32")]
use crate::wit::groupstate::plugin::log as wit_log;

/// The severity of a log message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the plugin handled.
    Warn,
    /// Something failed.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        })
    }
}

/// Writes one message to the host's log.
#[cfg(target_arch = "wasm32")]
pub fn write(level: Level, message: &str) {
    let level = match level {
        Level::Trace => wit_log::Level::Trace,
        Level::Debug => wit_log::Level::Debug,
        Level::Info => wit_log::Level::Info,
        Level::Warn => wit_log::Level::Warn,
        Level::Error => wit_log::Level::Error,
    };
    wit_log::log(level, message);
}

/// Writes one message to the host's log (to standard error outside WebAssembly).
#[cfg(not(target_arch = "wasm32"))]
pub fn write(level: Level, message: &str) {
    eprintln!("[{level}] {message}");
}

#[doc(hidden)]
pub fn write_fmt(level: Level, message: fmt::Arguments<'_>) {
    match message.as_str() {
        Some(text) => write(level, text),
        None => write(level, &message.to_string()),
    }
}

/// Logs a message at [`Level::Trace`], formatted like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __groupstate_log_trace {
    ($($arg:tt)+) => { $crate::log::write_fmt($crate::log::Level::Trace, ::core::format_args!($($arg)+)) };
}

/// Logs a message at [`Level::Debug`], formatted like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __groupstate_log_debug {
    ($($arg:tt)+) => { $crate::log::write_fmt($crate::log::Level::Debug, ::core::format_args!($($arg)+)) };
}

/// Logs a message at [`Level::Info`], formatted like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __groupstate_log_info {
    ($($arg:tt)+) => { $crate::log::write_fmt($crate::log::Level::Info, ::core::format_args!($($arg)+)) };
}

/// Logs a message at [`Level::Warn`], formatted like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __groupstate_log_warn {
    ($($arg:tt)+) => { $crate::log::write_fmt($crate::log::Level::Warn, ::core::format_args!($($arg)+)) };
}

/// Logs a message at [`Level::Error`], formatted like `format!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __groupstate_log_error {
    ($($arg:tt)+) => { $crate::log::write_fmt($crate::log::Level::Error, ::core::format_args!($($arg)+)) };
}

#[doc(inline)]
pub use crate::__groupstate_log_debug as debug;
#[doc(inline)]
pub use crate::__groupstate_log_error as error;
#[doc(inline)]
pub use crate::__groupstate_log_info as info;
#[doc(inline)]
pub use crate::__groupstate_log_trace as trace;
#[doc(inline)]
pub use crate::__groupstate_log_warn as warn;
