//! What the pipeline calls per key: the [`StateFunction`] trait, which a loaded wasm
//! `Plugin` implements (and, for benchmarks, a native function).

use crate::config::TimeoutKind;
use crate::plugin::{CallError, CallOutcome, CallRequest, Plugin, PluginInfo};

/// What the pipeline calls per key: a loaded wasm [`Plugin`], or — for benchmarks and
/// tests only, through `Pipeline::open_with_function` — a native implementation that
/// measures what the sandbox costs.
pub trait StateFunction: Send {
    /// The function's name, version and state-schema version.
    fn info(&self) -> &PluginInfo;
    /// One call for one key; see [`Plugin::call`].
    fn call(&mut self, kind: TimeoutKind, req: &CallRequest<'_>) -> Result<CallOutcome, CallError>;
    /// Converts a state value from an older schema version; see [`Plugin::migrate`].
    fn migrate(&mut self, from_version: u32, value: &[u8]) -> Result<Vec<u8>, CallError>;
}

impl StateFunction for Plugin {
    fn info(&self) -> &PluginInfo {
        Plugin::info(self)
    }
    fn call(&mut self, kind: TimeoutKind, req: &CallRequest<'_>) -> Result<CallOutcome, CallError> {
        Plugin::call(self, kind, req)
    }
    fn migrate(&mut self, from_version: u32, value: &[u8]) -> Result<Vec<u8>, CallError> {
        Plugin::migrate(self, from_version, value)
    }
}

/// How a plugin is named in the log and the status: name, version and state schema.
pub(crate) fn label_of(info: &PluginInfo) -> String {
    format!("{} {} (state schema {})", info.name, info.version, info.state_schema_version)
}
