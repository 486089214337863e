//! What the pipeline calls per key: the [`StateFunction`] trait, which a loaded wasm
//! `Plugin` implements (and, for benchmarks, a native function).

use std::sync::Arc;

use crate::config::TimeoutKind;
use crate::keyed::{KeyedFunction, StatePart, Variable};
use crate::plugin::{CallError, CallOutcome, CallRequest, Plugin, PluginInfo};

/// What the pipeline calls per key: a loaded wasm [`Plugin`], or — for benchmarks and
/// tests only, through `Pipeline::open_with_function` — a native implementation that
/// measures what the sandbox costs.
pub trait StateFunction: Send {
    /// The function's name, version and state-schema version.
    fn info(&self) -> &PluginInfo;
    /// One call for one key; see [`Plugin::call`].
    fn call(&mut self, kind: TimeoutKind, req: &CallRequest<'_>) -> Result<CallOutcome, CallError>;
    /// [`StateFunction::call`] for each request, in order; see [`Plugin::call_many`].
    fn call_many(&mut self, kind: TimeoutKind, reqs: &[CallRequest<'_>]) -> Vec<Result<CallOutcome, CallError>> {
        reqs.iter().map(|req| self.call(kind, req)).collect()
    }
    /// Converts a state value from an older schema version; see [`Plugin::migrate`].
    fn migrate(&mut self, from_version: u32, value: &[u8]) -> Result<Vec<u8>, CallError>;
    /// Converts `part` of 0.2 variable `variable`, stored under `from_version`, to the
    /// variable's current layout; see [`Plugin::migrate_entry`].
    fn migrate_entry(
        &mut self,
        variable: &str,
        part: StatePart,
        from_version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        let _ = (part, bytes);
        Err(CallError::Returned(format!("cannot convert variable {variable:?} from schema {from_version}")))
    }
    /// The world whose state it keeps: 1 (`groupstate:plugin@0.1.0`) or 2 (0.2.0).
    fn state_api(&self) -> u32 {
        1
    }
    /// A 0.2 function's calls and declared variables (`None` for 0.1).
    fn keyed(&mut self) -> Option<(&mut dyn KeyedFunction, Arc<Vec<Variable>>)> {
        None
    }
    /// What makes two loaded plugins the same version: the component's sha256 and the
    /// parameters it was initialised with (`None` for a native function).
    fn build(&self) -> Option<(&str, &[(String, String)])> {
        None
    }
}

impl StateFunction for Plugin {
    fn info(&self) -> &PluginInfo {
        Plugin::info(self)
    }
    fn call(&mut self, kind: TimeoutKind, req: &CallRequest<'_>) -> Result<CallOutcome, CallError> {
        Plugin::call(self, kind, req)
    }
    fn call_many(&mut self, kind: TimeoutKind, reqs: &[CallRequest<'_>]) -> Vec<Result<CallOutcome, CallError>> {
        Plugin::call_many(self, kind, reqs)
    }
    fn migrate(&mut self, from_version: u32, value: &[u8]) -> Result<Vec<u8>, CallError> {
        Plugin::migrate(self, from_version, value)
    }
    fn migrate_entry(
        &mut self,
        variable: &str,
        part: StatePart,
        from_version: u32,
        bytes: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        Plugin::migrate_entry(self, variable, part, from_version, bytes)
    }
    fn state_api(&self) -> u32 {
        Plugin::state_api(self)
    }
    fn keyed(&mut self) -> Option<(&mut dyn KeyedFunction, Arc<Vec<Variable>>)> {
        if Plugin::state_api(self) != 2 {
            return None;
        }
        let variables = self.variables();
        Some((self, variables))
    }
    fn build(&self) -> Option<(&str, &[(String, String)])> {
        Some((self.sha256(), self.params()))
    }
}

/// How a plugin is named in the log and the status: name, version and state schema.
pub(crate) fn label_of(info: &PluginInfo) -> String {
    format!("{} {} (state schema {})", info.name, info.version, info.state_schema_version)
}
