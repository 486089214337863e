//! Plugins: loading a component (cache, validation of its imports), instantiating it
//! in a sandbox (limits, virtual WASI, captured output), and calling its state function
//! with a staged `group-state` handle. A trap never escapes this module as a panic: it
//! becomes a [`CallError`], the instance is dropped and the next call makes a fresh one.

mod batch;
mod cache;
mod handle;
mod limits;
mod output;
mod v2;
mod wasi;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wasmtime::component::{Component, ComponentType, Instance, Linker, Lower, Resource, ResourceTable, TypedFunc};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::config::{Limits, TimeoutKind};
pub use cache::sha256_hex;
pub use handle::{GroupStateHandle, StagedValue};
use limits::InstanceLimiter;
use output::{Activity, PluginLog};
use wasi::VirtualEnv;

/// The generated bindings of the `state-function` world.
mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "state-function",
        imports: { default: trappable },
        additional_derives: [PartialEq, Eq],
        with: {
            "groupstate:plugin/state.group-state": crate::plugin::handle::GroupStateHandle,
        },
    });
}

/// One event of a key's group, in arrival order: the host's own type, lowered into a
/// plugin as the WIT record `event` (the same in both worlds) straight from the
/// batch's groups, through each world's typed `process` export ([`Process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ComponentType, Lower)]
#[component(record)]
pub struct Event<'a> {
    /// The event time in epoch milliseconds, read from the pipeline's time field;
    /// `None` when the pipeline has no time field.
    #[component(name = "event-time-ms")]
    pub event_time_ms: Option<i64>,
    /// The event as it arrived: the text of one JSON object (one input line), borrowed
    /// from the batch that holds it.
    pub payload: &'a str,
}

/// A world's `process` export, `(key, events, state handle) -> result<outputs,
/// message>`, typed with [`Event`] rather than a generated type. The `'static`s are
/// only nominal: wasmtime's `TypedFunc` is covariant in its parameters (a call copies
/// them into the guest), so it takes a call's shorter-lived key and events.
type Process<H> = TypedFunc<(&'static str, &'static [Event<'static>], Resource<H>), (Result<Vec<String>, String>,)>;

/// The typed `process` export of `instance` (wasmtime checks its type here, once).
fn process_export<H: 'static>(store: &mut Store<HostState>, instance: &Instance) -> wasmtime::Result<Process<H>> {
    instance.get_typed_func(store, "process")
}

/// `log` is the same interface in both worlds, each with its own generated `Level`.
macro_rules! log_host {
    ($log:ident) => {
        impl $log::Host for HostState {
            fn log(&mut self, level: $log::Level, message: String) -> wasmtime::Result<()> {
                let level = match level {
                    $log::Level::Trace => "trace",
                    $log::Level::Debug => "debug",
                    $log::Level::Info => "info",
                    $log::Level::Warn => "warn",
                    $log::Level::Error => "error",
                };
                self.log.message(level, &message);
                Ok(())
            }
        }
    };
}
use log_host;

use bindings::groupstate::plugin::types::TimeoutKind as WitTimeoutKind;
use bindings::{StateFunction, StateFunctionPre};

/// The most of a plugin's name or version the host keeps (bytes, after escaping): they
/// reach the host's log, the plugin status and the admin endpoint.
pub const INFO_TEXT_BYTES_MAX: usize = 128;

/// The `tracing` target of the lines a plugin wrote (its `log` messages, stdout and
/// stderr), each already prefixed with the plugin's name and the key, escaped and
/// within `log_bytes_per_call_max`: a subscriber shows them as they are, without the
/// host's own prefix.
pub const PLUGIN_OUTPUT_TARGET: &str = "groupstate::plugin::output";

/// What a plugin says about itself (its `info`), made safe to print and to store at
/// the plugin boundary: control characters in its name and version escaped, each at
/// most [`INFO_TEXT_BYTES_MAX`] bytes (a clipped one ends with `… (N bytes)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// A short name, such as `sensor-alerts`.
    pub name: String,
    /// The plugin's own version, such as `1.2.0`.
    pub version: String,
    /// The version of the layout of the state values it writes.
    pub state_schema_version: u32,
}

impl From<bindings::PluginInfo> for PluginInfo {
    fn from(info: bindings::PluginInfo) -> Self {
        Self {
            name: output::printable_clipped(&info.name, INFO_TEXT_BYTES_MAX),
            version: output::printable_clipped(&info.version, INFO_TEXT_BYTES_MAX),
            state_schema_version: info.state_schema_version,
        }
    }
}

/// How often the epoch ticks; the CPU limit of a call is counted in these ticks.
const EPOCH_TICK_MS: u64 = 5;

/// The most of an error message (a plugin's `err`, a trap) that a [`CallError`] keeps:
/// it goes to the dead-letter file and into the message of a failed run.
const ERROR_MESSAGE_BYTES_MAX: usize = 2048;

/// The wasm frames a trap message names.
const BACKTRACE_FRAMES_MAX: usize = 16;

/// Set to `1`, this environment variable turns the CPU limit off: no epoch interruption
/// in compiled code, no ticker thread. It exists only to measure what the limit costs
/// (see the README); never set it where plugins are untrusted.
pub const BENCH_NO_CPU_LIMIT_ENV: &str = "GROUPSTATE_BENCH_NO_CPU_LIMIT";

/// WASI interfaces a plugin may import. They are all backed by the empty, virtual
/// context of `wasi.rs`: no files, no network, no environment, virtual time and
/// random. Anything else (sockets, HTTP, ...) is refused at load.
const ALLOWED_WASI: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
];

/// Loading or instantiating a plugin failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The file could not be read.
    #[error("plugin {path}: cannot read ({error}); check the --plugin path")]
    Read {
        /// The plugin path.
        path: PathBuf,
        /// The error (in the message, not a `source`, so that it is not shown twice).
        error: std::io::Error,
    },
    /// The file is not a component.
    #[error("plugin {path}: {reason}")]
    NotAComponent {
        /// The plugin path.
        path: PathBuf,
        /// What it is instead, and what to do.
        reason: String,
    },
    /// Cranelift refused the component.
    #[error("plugin {path}: compile failed: {message}")]
    Compile {
        /// The plugin path.
        path: PathBuf,
        /// wasmtime's message.
        message: String,
    },
    /// The component imports what the sandbox does not provide.
    #[error(
        "plugin {path}: imports that the sandbox does not provide: {imports}; a plugin may import only groupstate:plugin/* and the virtual WASI interfaces listed in the README"
    )]
    ForbiddenImports {
        /// The plugin path.
        path: PathBuf,
        /// The offending imports, comma-separated.
        imports: String,
    },
    /// The component does not fit the `state-function` world, or its start failed.
    #[error("plugin {path}: instantiate failed: {message}")]
    Instantiate {
        /// The plugin path.
        path: PathBuf,
        /// wasmtime's message.
        message: String,
    },
    /// The plugin's `init` refused the parameters.
    #[error("plugin {path}: init refused the parameters: {message}")]
    Init {
        /// The plugin path.
        path: PathBuf,
        /// The plugin's message.
        message: String,
    },
    /// The engine could not be configured.
    #[error("plugin engine: {0}")]
    Engine(String),
}

/// A plugin call failed; the key's state is as before the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The plugin trapped (panic, a limit hit, a bad handle...); the instance was
    /// discarded.
    #[error("trapped: {0}")]
    Trap(String),
    /// The plugin returned `err`.
    #[error("returned an error: {0}")]
    Returned(String),
    /// The plugin's result broke a limit or the output format.
    #[error("{0}")]
    BadResult(String),
    /// A fresh instance could not be made after a trap.
    #[error("cannot re-instantiate after a trap: {0}")]
    Reinstantiate(String),
}

/// What one call asks of the plugin.
#[derive(Debug, Clone, Copy)]
pub struct CallRequest<'a> {
    /// The batch (seeds the virtual random stream).
    pub batch_id: u64,
    /// The group key.
    pub key: &'a str,
    /// The key's events (empty for a timeout call).
    pub events: &'a [Event<'a>],
    /// The key's state value before the call.
    pub state: Option<&'a [u8]>,
    /// Whether this call is for an expired timeout.
    pub has_timed_out: bool,
    /// The batch's watermark.
    pub watermark_ms: i64,
    /// The batch's processing time.
    pub processing_time_ms: i64,
}

/// What a successful call decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    /// The state change.
    pub value: StagedValue,
    /// The key's timeout after the call (cleared unless the call set one).
    pub timeout_ms: Option<i64>,
    /// The outputs, each one JSON text.
    pub outputs: Vec<String>,
}

/// The data of a plugin's store.
pub struct HostState {
    table: ResourceTable,
    wasi: WasiCtx,
    env: Arc<VirtualEnv>,
    limits: InstanceLimiter,
    log: PluginLog,
    /// The 0.2 call running now, which its `key-state` handle works on.
    keyed: Option<crate::keyed::KeyCall>,
    /// The `process-batch` call running now.
    batch: Option<batch::Turns>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The engine and linker shared by every plugin of a process, and the epoch ticker
/// that enforces the CPU limit (it runs as long as the runtime or a plugin it loaded
/// is alive).
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
    limits: Limits,
    cache: Option<cache::Cache>,
    /// `None` without a CPU limit.
    ticker: Option<Arc<EpochTicker>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

/// The thread that advances the engine's epoch every [`EPOCH_TICK_MS`], stopped when
/// the last runtime or plugin holding it is dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        // The ticker only counts; the deadline of each call is set in epochs. If the
        // thread cannot be spawned, calls simply never time out, so report it loudly.
        let spawned = std::thread::Builder::new().name("groupstate-epoch".into()).spawn(move || {
            while !thread_stop.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(EPOCH_TICK_MS));
                engine.increment_epoch();
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("no epoch ticker ({e}): the CPU limit per call is not enforced");
        }
        Self { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn engine_err(e: impl std::fmt::Display) -> PluginError {
    PluginError::Engine(e.to_string())
}

impl Runtime {
    /// An engine configured with the limits, and the compiled-component cache in
    /// `cache_dir` (none: no cache).
    pub fn new(limits: &Limits, cache_dir: Option<&Path>) -> Result<Self, PluginError> {
        let cpu_limit = !cpu_limit_disabled_for_benchmark();
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(cpu_limit);
        config.max_wasm_stack(limits.wasm_stack_bytes_max);
        // For profiling: wasmtime writes `/tmp/perf-PID.map`, so that `perf` names the
        // plugin's compiled functions (README, "Benchmark").
        if std::env::var_os("GROUPSTATE_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(engine_err)?;
        let mut linker: Linker<HostState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(engine_err)?;
        // Replace wasmtime-wasi's monotonic clock, whose sleeps block the host thread.
        linker.allow_shadowing(true);
        wasi::add_virtual_monotonic_clock(&mut linker, |s| wasi::VirtualClockView { env: &s.env, table: &mut s.table })
            .map_err(engine_err)?;
        linker.allow_shadowing(false);
        batch::add_to_linker(&mut linker).map_err(engine_err)?;
        StateFunction::add_to_linker::<_, wasmtime::component::HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(engine_err)?;
        v2::bindings::KeyedStateFunction::add_to_linker::<_, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(engine_err)?;
        let ticker = cpu_limit.then(|| Arc::new(EpochTicker::start(engine.clone())));
        let cache = cache_dir.map(|dir| cache::Cache::new(dir, &engine));
        Ok(Self { engine, linker, limits: limits.clone(), cache, ticker })
    }

    /// Loads, validates and instantiates the plugin at `path`, then calls its `info`
    /// and `init(params)`.
    pub fn load(&self, path: &Path, params: &[(String, String)]) -> Result<Plugin, PluginError> {
        let bytes = std::fs::read(path).map_err(|error| PluginError::Read { path: path.to_owned(), error })?;
        self.load_bytes(path, &bytes, params)
    }

    /// [`Runtime::load`] of `bytes` already read from `path` (which only names the
    /// plugin in errors): the partitions of a Kafka run load each version from one
    /// copy, so that a file replaced meanwhile cannot give them different versions.
    pub fn load_bytes(&self, path: &Path, bytes: &[u8], params: &[(String, String)]) -> Result<Plugin, PluginError> {
        check_header(path, bytes)?;
        let component = self.compile(path, bytes)?;
        self.check_imports(path, &component)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| PluginError::Instantiate { path: path.to_owned(), message: format!("{e:#}") })?;
        let targets_v2 = component.component_type().exports(&self.engine).any(|(name, _)| name == v2::MARKER_EXPORT);
        let pre = if targets_v2 {
            Pre::V2(v2::bindings::KeyedStateFunctionPre::new(pre).map_err(|e| PluginError::Instantiate {
                path: path.to_owned(),
                message: format!("does not export the groupstate:plugin@0.2.0 state-function world: {e:#}"),
            })?)
        } else {
            Pre::V1(StateFunctionPre::new(pre).map_err(|e| PluginError::Instantiate {
                path: path.to_owned(),
                message: format!("does not export the state-function world: {e:#}"),
            })?)
        };
        let recipe = Recipe {
            path: path.to_owned(),
            pre,
            params: params.to_vec(),
            limits: self.limits.clone(),
            ticker: self.ticker.clone(),
            engine: self.engine.clone(),
        };
        let mut plugin = Plugin {
            recipe: Arc::new(recipe),
            sha256: cache::sha256_hex(bytes),
            size_bytes: bytes.len(),
            live: None,
            info: PluginInfo { name: String::new(), version: String::new(), state_schema_version: 0 },
            variables: Arc::default(),
            migrator: None,
            batch_unreadable: false,
            batches: 0,
        };
        let live = plugin.recipe.instantiate().map_err(|e| match e {
            StartError::Instantiate(message) => PluginError::Instantiate { path: path.to_owned(), message },
            StartError::Init(message) => PluginError::Init { path: path.to_owned(), message },
        })?;
        plugin.info = live.info.clone();
        plugin.variables = Arc::new(live.variables.clone());
        plugin.live = Some(live);
        Ok(plugin)
    }

    /// Describes a component without running a pipeline: its imports and exports,
    /// which imports the sandbox refuses, and (if it loads) its `info`.
    pub fn inspect(&self, path: &Path) -> Result<Inspection, PluginError> {
        let bytes = std::fs::read(path).map_err(|error| PluginError::Read { path: path.to_owned(), error })?;
        check_header(path, &bytes)?;
        let component = self.compile(path, &bytes)?;
        let ty = component.component_type();
        // Interfaces and functions: a resource or type a world `use`s at its top level
        // (`group-state`) is not something the component imports from the host.
        let named = |(name, item): (&str, wasmtime::component::types::ComponentExtern<'_>)| {
            use wasmtime::component::types::ComponentItem;
            (!matches!(item.ty, ComponentItem::Resource(_) | ComponentItem::Type(_))).then(|| name.to_owned())
        };
        let imports: Vec<String> = ty.imports(&self.engine).filter_map(named).collect();
        let exports: Vec<String> = ty.exports(&self.engine).filter_map(named).collect();
        let forbidden_imports = imports.iter().filter(|n| !import_allowed(n)).cloned().collect();
        let load = self.load(path, &[]);
        Ok(Inspection {
            size_bytes: bytes.len(),
            sha256: cache::sha256_hex(&bytes),
            imports,
            exports,
            forbidden_imports,
            info: load.as_ref().ok().map(|p| p.info().clone()),
            load_error: load.err().map(|e| e.to_string()),
        })
    }

    fn compile(&self, path: &Path, bytes: &[u8]) -> Result<Component, PluginError> {
        if let Some(component) = self.cache.as_ref().and_then(|c| c.get(&self.engine, bytes)) {
            return Ok(component);
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| {
            let message = format!("{e:#}");
            if message.contains("attempted to parse a wasm module with a component parser") {
                // A core module in text form: the header check only sees binary ones.
                PluginError::NotAComponent { path: path.to_owned(), reason: CORE_MODULE.to_owned() }
            } else {
                PluginError::Compile { path: path.to_owned(), message }
            }
        })?;
        if let Some(cache) = &self.cache {
            // A cache that cannot be written only costs a recompile next time.
            if let Err(e) = cache.put(bytes, &component) {
                tracing::warn!("compiled-plugin cache not written: {e}");
            }
        }
        Ok(component)
    }

    fn check_imports(&self, path: &Path, component: &Component) -> Result<(), PluginError> {
        let ty = component.component_type();
        let forbidden: Vec<String> =
            ty.imports(&self.engine).map(|(name, _)| name.to_owned()).filter(|name| !import_allowed(name)).collect();
        if forbidden.is_empty() {
            Ok(())
        } else {
            Err(PluginError::ForbiddenImports { path: path.to_owned(), imports: forbidden.join(", ") })
        }
    }
}

/// Types the `state-function` world itself imports (its `use state.{group-state}`).
const WORLD_TYPES: &[&str] = &["group-state", "key-state"];

fn import_allowed(name: &str) -> bool {
    let unversioned = name.split('@').next().unwrap_or(name);
    unversioned.starts_with("groupstate:plugin/") || ALLOWED_WASI.contains(&unversioned) || WORLD_TYPES.contains(&name)
}

const CORE_MODULE: &str = "is a core WebAssembly module, not a component; build with `--target wasm32-wasip2`, or wrap it with `wasm-tools component new`";

fn check_header(path: &Path, bytes: &[u8]) -> Result<(), PluginError> {
    let reason = if bytes.is_empty() {
        "the file is empty; build the plugin with `cargo build --target wasm32-wasip2`".to_owned()
    } else if !bytes.starts_with(b"\0asm") {
        if std::str::from_utf8(bytes).is_ok_and(|t| t.trim_start().starts_with('(')) {
            return Ok(()); // WebAssembly text; the compiler will judge it.
        }
        "not a WebAssembly file (no \\0asm header); pass the .wasm component the plugin build produced".to_owned()
    } else if bytes.len() < 8 {
        "truncated WebAssembly header".to_owned()
    } else if bytes[4..8] == [1, 0, 0, 0] {
        CORE_MODULE.to_owned()
    } else {
        return Ok(());
    };
    Err(PluginError::NotAComponent { path: path.to_owned(), reason })
}

/// Whether [`BENCH_NO_CPU_LIMIT_ENV`] asks for no CPU limit: the one place it is read.
fn cpu_limit_disabled_for_benchmark() -> bool {
    let disabled = std::env::var_os(BENCH_NO_CPU_LIMIT_ENV).is_some_and(|v| v == "1");
    if disabled {
        tracing::warn!(
            "{BENCH_NO_CPU_LIMIT_ENV}=1: plugin calls have no CPU limit (for benchmarks only; a looping plugin hangs the run)"
        );
    }
    disabled
}

/// What `groupstate plugin` shows about a component.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// File size.
    pub size_bytes: usize,
    /// sha256, hex.
    pub sha256: String,
    /// Everything it imports.
    pub imports: Vec<String>,
    /// Everything it exports.
    pub exports: Vec<String>,
    /// Imports the sandbox refuses.
    pub forbidden_imports: Vec<String>,
    /// Its `info`, when it loads (with no parameters).
    pub info: Option<PluginInfo>,
    /// Why it does not load, if it does not.
    pub load_error: Option<String>,
}

/// Why a fresh instance could not be started.
#[derive(Debug)]
enum StartError {
    /// Instantiating failed (a limit at instantiation, a trap in a start function),
    /// or `info` trapped.
    Instantiate(String),
    /// `init` trapped or refused the parameters.
    Init(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Instantiate(message) => write!(f, "instantiate failed: {message}"),
            Self::Init(message) => f.write_str(message),
        }
    }
}

/// The pre-instantiated component, per the world it targets.
enum Pre {
    V1(StateFunctionPre<HostState>),
    V2(v2::bindings::KeyedStateFunctionPre<HostState>),
}

/// An instance's exports, per the world it targets, with its typed `process`.
enum Bindings {
    /// With its `process-batch`, if it exports one.
    V1(StateFunction, Process<GroupStateHandle>, Option<batch::ProcessBatch>),
    V2(v2::bindings::KeyedStateFunction, Process<v2::KeyStateHandle>),
}

/// A live instance: its store, bindings and virtual environment.
struct Live {
    store: Store<HostState>,
    bindings: Bindings,
    /// The variables a 0.2 plugin's `init` declared (none for 0.1).
    variables: Vec<crate::keyed::Variable>,
    env: Arc<VirtualEnv>,
    info: PluginInfo,
}

/// What it takes to make a live instance of a loaded plugin: shared by the plugin's
/// instance and, for a 0.2 plugin, the instance that converts old entries.
struct Recipe {
    path: PathBuf,
    pre: Pre,
    params: Vec<(String, String)>,
    limits: Limits,
    /// Keeps the epoch advancing while the plugin lives (`None`: no CPU limit).
    ticker: Option<Arc<EpochTicker>>,
    engine: Engine,
}

/// A loaded plugin: the pre-instantiated component and one live instance, re-made
/// after a trap.
pub struct Plugin {
    recipe: Arc<Recipe>,
    sha256: String,
    size_bytes: usize,
    live: Option<Live>,
    info: PluginInfo,
    /// The variables a 0.2 plugin declared at load; every instance must declare them.
    variables: Arc<Vec<crate::keyed::Variable>>,
    /// A 0.2 plugin's second instance, for `migrate-state` while a call reads (made
    /// when first needed); it is lent to each call.
    migrator: Option<Box<dyn crate::keyed::Migrate>>,
    /// Its `process-batch` once returned what does not read: not used again.
    batch_unreadable: bool,
    /// See [`Plugin::batches`].
    batches: u64,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("path", &self.recipe.path).field("info", &self.info).finish_non_exhaustive()
    }
}

/// What went wrong in a call that returned an error from wasmtime, on one line and
/// at most [`ERROR_MESSAGE_BYTES_MAX`] long: the cause, the limit involved, what the
/// plugin last wrote to stderr in the call (the panic message of a Rust plugin, for
/// one) and where in the plugin it happened.
fn trap_message(e: &wasmtime::Error, limits: &Limits, log: &PluginLog) -> String {
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        match trap {
            wasmtime::Trap::Interrupt => {
                return format!("CPU time limit exceeded (call_cpu_ms_max = {} ms)", limits.call_cpu_ms_max);
            }
            wasmtime::Trap::StackOverflow => {
                return format!("wasm stack overflow (wasm_stack_bytes_max = {})", limits.wasm_stack_bytes_max);
            }
            _ => {}
        }
    }
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return format!("the plugin called exit({}); a plugin must return instead", exit.0);
    }
    // wasmtime's context chain, outermost first, without the multi-line backtrace,
    // which is summarized after it.
    let message = e
        .chain()
        .map(|cause| cause.to_string())
        .filter(|cause| !cause.starts_with("error while executing at wasm backtrace"))
        .collect::<Vec<_>>()
        .join(": ")
        .replace('\n', " | ");
    let hint = if message.contains("fuel allocated for hostcalls has been exhausted") {
        format!(" (transfer_bytes_max = {})", limits.transfer_bytes_max)
    } else if message.contains("resource table has no free keys") || message.contains("store handle limit exceeded") {
        format!(
            " (instance_resources_max = {}: the plugin holds too many handles; drop the ones it no longer uses)",
            limits.instance_resources_max
        )
    } else {
        limits::count_limit_hint(&message).unwrap_or_default()
    };
    let stderr = log.stderr_tail().map(|tail| format!(" (its stderr ended with: {tail})")).unwrap_or_default();
    clip_message(&format!("{message}{hint}{stderr}{}", backtrace(e)))
}

/// The wasm frames of a trap, innermost first, on one line: `; wasm backtrace: f < g`.
fn backtrace(e: &wasmtime::Error) -> String {
    let Some(trace) = e.downcast_ref::<wasmtime::WasmBacktrace>() else {
        return String::new();
    };
    let frames: Vec<String> = trace
        .frames()
        .iter()
        .take(BACKTRACE_FRAMES_MAX)
        .map(|f| format!("{}!{}", f.module().name().unwrap_or("?"), f.func_name().unwrap_or("?")))
        .collect();
    if frames.is_empty() { String::new() } else { format!("; wasm backtrace: {}", frames.join(" < ")) }
}

/// A plugin-controlled message made safe to print and to store: control characters
/// escaped, at most [`ERROR_MESSAGE_BYTES_MAX`] bytes.
fn clip_message(message: &str) -> String {
    output::escape_unprintable(&output::clip_chars(message, ERROR_MESSAGE_BYTES_MAX))
}

impl Recipe {
    fn instantiate(&self) -> Result<Live, StartError> {
        let env = Arc::new(VirtualEnv::default());
        let file_name = self.path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        let log = PluginLog::new(&file_name, self.limits.log_bytes_per_call_max);
        // WASI streams and pollables a plugin asks for, and the call's group-state
        // handle, live in this table: a plugin that leaks them hits the limit and traps
        // instead of growing the host.
        let mut table = ResourceTable::new();
        table.set_max_capacity(self.limits.instance_resources_max);
        let state = HostState {
            table,
            wasi: wasi::build_ctx(&env, &log),
            env: env.clone(),
            limits: InstanceLimiter::new(self.limits.instance_memory_bytes_max),
            log: log.clone(),
            keyed: None,
            batch: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // The component model's own handle tables (the guest's view of those handles,
        // and resources it makes itself) get the same bound.
        store.set_max_component_handles(self.limits.instance_resources_max);
        // wasmtime's cap on what one lift copies out of the plugin (a call's result, a
        // host function's arguments), counting the host's per-item overhead: a list of
        // many (pointer, length) pairs aimed at one big string costs its full size.
        store.set_hostcall_fuel(self.limits.transfer_bytes_max);
        let live = self.start(store, env, &log);
        log.flush(Activity::Init);
        let live = live?;
        log.set_plugin(&live.info.name);
        Ok(live)
    }

    /// Instantiates the component in `store` and calls `info` and `init`.
    fn start(&self, mut store: Store<HostState>, env: Arc<VirtualEnv>, log: &PluginLog) -> Result<Live, StartError> {
        let trap = |e: &wasmtime::Error| trap_message(e, &self.limits, log);
        self.set_deadline(&mut store);
        let init_trapped = |e: &wasmtime::Error| StartError::Init(format!("init() trapped: {}", trap(e)));
        let info_trapped = |e: &wasmtime::Error| StartError::Instantiate(format!("info() trapped: {}", trap(e)));
        match &self.pre {
            Pre::V1(pre) => {
                let instantiate = |store: &mut Store<HostState>| {
                    let instance = pre.instance_pre().instantiate(&mut *store)?;
                    Ok::<_, wasmtime::Error>((
                        StateFunction::new(&mut *store, &instance)?,
                        process_export(&mut *store, &instance)?,
                        batch::export(store, &instance),
                    ))
                };
                let (bindings, process, batch) =
                    instantiate(&mut store).map_err(|e| StartError::Instantiate(trap(&e)))?;
                self.set_deadline(&mut store);
                let info = bindings.call_info(&mut store).map_err(|e| info_trapped(&e))?.into();
                self.set_deadline(&mut store);
                bindings
                    .call_init(&mut store, &self.params)
                    .map_err(|e| init_trapped(&e))?
                    .map_err(|message| StartError::Init(clip_message(&message)))?;
                Ok(Live { store, bindings: Bindings::V1(bindings, process, batch), variables: Vec::new(), env, info })
            }
            Pre::V2(pre) => {
                let instantiate = |store: &mut Store<HostState>| {
                    let instance = pre.instance_pre().instantiate(&mut *store)?;
                    let bindings = v2::bindings::KeyedStateFunction::new(&mut *store, &instance)?;
                    Ok::<_, wasmtime::Error>((bindings, process_export(store, &instance)?))
                };
                let (bindings, process) = instantiate(&mut store).map_err(|e| StartError::Instantiate(trap(&e)))?;
                self.set_deadline(&mut store);
                let info = bindings.call_info(&mut store).map_err(|e| info_trapped(&e))?;
                let info = PluginInfo {
                    name: output::printable_clipped(&info.name, INFO_TEXT_BYTES_MAX),
                    version: output::printable_clipped(&info.version, INFO_TEXT_BYTES_MAX),
                    state_schema_version: info.state_schema_version,
                };
                self.set_deadline(&mut store);
                let variables: Vec<crate::keyed::Variable> = bindings
                    .call_init(&mut store, &self.params)
                    .map_err(|e| init_trapped(&e))?
                    .map_err(|message| StartError::Init(clip_message(&message)))?
                    .into_iter()
                    .map(Into::into)
                    .collect();
                crate::keyed::check_variables(&variables).map_err(|m| StartError::Init(clip_message(&m)))?;
                Ok(Live { store, bindings: Bindings::V2(bindings, process), variables, env, info })
            }
        }
    }

    /// Gives the next call `call_cpu_ms_max` of CPU time.
    fn set_deadline(&self, store: &mut Store<HostState>) {
        set_deadline(store, self.deadline_ticks());
    }

    /// `call_cpu_ms_max` in epoch ticks, plus one for the tick already under way;
    /// `None` without a CPU limit.
    fn deadline_ticks(&self) -> Option<u64> {
        self.ticker.as_ref().map(|_| self.limits.call_cpu_ms_max.div_ceil(EPOCH_TICK_MS) + 1)
    }

    /// A live instance made anew, checked to say what the plugin said at load.
    fn live_checked(&self, info: &PluginInfo, variables: &[crate::keyed::Variable]) -> Result<Live, CallError> {
        let live = self.instantiate().map_err(|e| CallError::Reinstantiate(e.to_string()))?;
        if live.info != *info {
            return Err(CallError::Reinstantiate(clip_message(&format!(
                "info() changed from {info:?} to {:?}",
                live.info
            ))));
        }
        if live.variables != variables {
            return Err(CallError::Reinstantiate(clip_message(&format!(
                "init() declared other variables than at load: {:?}, not {variables:?}",
                live.variables
            ))));
        }
        Ok(live)
    }
}

impl Plugin {
    /// What the plugin said about itself.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The component's sha256, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The parameters its instances are initialised with.
    pub fn params(&self) -> &[(String, String)] {
        &self.recipe.params
    }

    /// The component's size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.recipe.path
    }

    /// The world the component targets: 1 for `groupstate:plugin@0.1.0`, 2 for 0.2.0.
    pub fn state_api(&self) -> u32 {
        match self.recipe.pre {
            Pre::V1(_) => 1,
            Pre::V2(_) => 2,
        }
    }

    /// The state variables a 0.2 plugin declared (none for 0.1).
    pub fn variables(&self) -> Arc<Vec<crate::keyed::Variable>> {
        self.variables.clone()
    }

    /// Calls `process` for one key. On `Ok`, the outcome holds the staged state,
    /// timeout and outputs; on `Err` nothing of the call is kept.
    pub fn call(&mut self, kind: TimeoutKind, req: &CallRequest<'_>) -> Result<CallOutcome, CallError> {
        let (ticks, state_bytes_max) = (self.deadline_ticks(), self.recipe.limits.state_bytes_max);
        let live = self.live()?;
        let Bindings::V1(_, process, _) = live.bindings else {
            return Err(CallError::BadResult("the plugin targets groupstate:plugin@0.2.0, not 0.1.0".into()));
        };
        live.env.prepare_call(req.processing_time_ms, req.batch_id, req.key);
        let handle = GroupStateHandle::new(req, kind, state_bytes_max);
        let Ok(resource) = live.store.data_mut().table.push(handle) else {
            // The instance holds instance_resources_max handles already: it would fail
            // every call from now on, so it goes like a trapped one.
            self.live = None;
            return Err(CallError::Trap(format!(
                "no room for the group-state handle (instance_resources_max = {}: the plugin holds too many handles; drop the ones it no longer uses)",
                self.recipe.limits.instance_resources_max
            )));
        };
        let borrowed = Resource::<GroupStateHandle>::new_borrow(resource.rep());
        set_deadline(&mut live.store, ticks);
        let result = process.call(&mut live.store, (req.key, req.events, borrowed)).map(|(result,)| result);
        let handle = live.store.data_mut().table.delete(resource);
        let log = live.store.data().log.clone();
        let outcome = self.settle(result, handle, &log).map(|(outputs, handle)| {
            let (value, timeout_ms) = handle.into_staged();
            CallOutcome { value, timeout_ms, outputs }
        });
        log.flush(Activity::Key(req.key));
        outcome
    }

    /// What a call of `process` (or of a 0.2 handler) came to, given the call's result
    /// and its state handle taken back from the table: the checked outputs and the
    /// handle, or why not. After a trap, or a handle the call lost, the instance is
    /// dropped (a trapped store is poisoned) and made anew for the next call.
    fn settle<H>(
        &mut self,
        result: wasmtime::Result<Result<Vec<String>, String>>,
        handle: Result<H, wasmtime::component::ResourceTableError>,
        log: &PluginLog,
    ) -> Result<(Vec<String>, H), CallError> {
        match (result, handle) {
            (Ok(Ok(outputs)), Ok(handle)) => Ok((check_outputs(outputs, &self.recipe.limits)?, handle)),
            (Ok(Err(message)), _) => Err(CallError::Returned(clip_message(&message))),
            (Err(e), _) => {
                self.live = None;
                Err(CallError::Trap(trap_message(&e, &self.recipe.limits, log)))
            }
            (Ok(Ok(_)), Err(e)) => {
                self.live = None;
                Err(CallError::Trap(format!("state handle lost: {e}")))
            }
        }
    }

    /// The live instance, made anew if the last call trapped.
    fn live(&mut self) -> Result<&mut Live, CallError> {
        if self.live.is_none() {
            self.live = Some(self.recipe.live_checked(&self.info, &self.variables)?);
        }
        self.live.as_mut().ok_or_else(|| CallError::Reinstantiate("no instance".into()))
    }

    /// `call_cpu_ms_max` in epoch ticks; see [`Recipe::deadline_ticks`].
    fn deadline_ticks(&self) -> Option<u64> {
        self.recipe.deadline_ticks()
    }

    /// Converts a state value from an older schema version through `migrate-state`.
    pub fn migrate(&mut self, from_version: u32, value: &[u8]) -> Result<Vec<u8>, CallError> {
        let ticks = self.deadline_ticks();
        let live = self.live()?;
        let Bindings::V1(bindings, ..) = &live.bindings else {
            return Err(CallError::Returned(
                "a groupstate:plugin@0.2.0 plugin converts its entries per variable (migrate-state with the variable's name), not whole values".into(),
            ));
        };
        let log = live.store.data().log.clone();
        set_deadline(&mut live.store, ticks);
        let result = bindings.call_migrate_state(&mut live.store, from_version, value);
        let outcome = match result {
            Ok(Ok(v)) if v.len() as u64 <= self.recipe.limits.state_bytes_max => Ok(v),
            Ok(Ok(v)) => Err(CallError::BadResult(format!(
                "migrate-state returned {} bytes, over state_bytes_max ({})",
                v.len(),
                self.recipe.limits.state_bytes_max
            ))),
            Ok(Err(message)) => {
                Err(CallError::Returned(clip_message(&format!("migrate-state from schema {from_version}: {message}"))))
            }
            Err(e) => {
                self.live = None;
                Err(CallError::Trap(trap_message(&e, &self.recipe.limits, &log)))
            }
        };
        log.flush(Activity::Migrate(from_version));
        outcome
    }
}

fn set_deadline(mut store: impl wasmtime::AsContextMut<Data = HostState>, ticks: Option<u64>) {
    if let Some(ticks) = ticks {
        store.as_context_mut().set_epoch_deadline(ticks);
    }
}

/// Checks a call's outputs against the limits and the output format, and returns them
/// as they are written: each exactly one line for any JSON Lines reader. A line feed or
/// carriage return can only be whitespace between JSON tokens (JSON strings hold them
/// escaped), so an output with one is refused; U+0085, U+2028 and U+2029, which some
/// readers also split lines on, can only be inside strings, where they are replaced by
/// their `\u` escapes: the same JSON value, on one line.
fn check_outputs(mut outputs: Vec<String>, limits: &Limits) -> Result<Vec<String>, CallError> {
    if outputs.len() > limits.outputs_per_call_max {
        return Err(CallError::BadResult(format!(
            "returned {} outputs, over outputs_per_call_max ({}); emit fewer or raise the limit",
            outputs.len(),
            limits.outputs_per_call_max
        )));
    }
    for (i, out) in outputs.iter().enumerate() {
        if out.len() > limits.output_bytes_max {
            return Err(CallError::BadResult(format!(
                "output {i} has {} bytes, over output_bytes_max ({})",
                out.len(),
                limits.output_bytes_max
            )));
        }
        if out.contains(['\n', '\r']) {
            return Err(CallError::BadResult(format!(
                "output {i} contains a line break (a line feed or carriage return); emit compact JSON, one value per output"
            )));
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(out) {
            return Err(CallError::BadResult(format!(
                "output {i} is not JSON ({e}): {}",
                clip_message(&output::clip_chars(out, 80))
            )));
        }
    }
    for out in &mut outputs {
        if out.contains(UNICODE_LINE_SEPARATORS) {
            *out = escape_line_separators(out);
        }
    }
    Ok(outputs)
}

/// Characters outside ASCII that some JSON Lines readers end a line at (Python's
/// `str.splitlines`, JavaScript's line terminators).
const UNICODE_LINE_SEPARATORS: [char; 3] = ['\u{85}', '\u{2028}', '\u{2029}'];

/// `json` with each of [`UNICODE_LINE_SEPARATORS`] written as its JSON escape. Valid
/// JSON holds them only inside strings, where the escape means the same character.
fn escape_line_separators(json: &str) -> String {
    let mut escaped = String::with_capacity(json.len() + 12);
    for c in json.chars() {
        if UNICODE_LINE_SEPARATORS.contains(&c) {
            escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    escaped
}

impl From<TimeoutKind> for WitTimeoutKind {
    fn from(k: TimeoutKind) -> Self {
        match k {
            TimeoutKind::None => Self::None,
            TimeoutKind::ProcessingTime => Self::ProcessingTime,
            TimeoutKind::EventTime => Self::EventTime,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_errors_are_clear() {
        let p = Path::new("p.wasm");
        let msg = |b: &[u8]| check_header(p, b).unwrap_err().to_string();
        assert!(msg(b"").contains("empty"));
        assert!(msg(b"garbage bytes").contains("not a WebAssembly file"));
        assert!(msg(b"\0asm\x01\0\0\0").contains("core WebAssembly module"));
        assert!(check_header(p, b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn outputs_stay_one_line_for_every_reader() {
        let limits = Limits::default();
        let check = |out: &str| check_outputs(vec![out.to_owned()], &limits);
        assert_eq!(check("{\"a\":1}").unwrap(), ["{\"a\":1}"]);
        // A carriage return between tokens would let a plugin forge a record for
        // readers that split on it.
        let forged = check("[1,\r{\"k\":\"forged\"}\r]").unwrap_err().to_string();
        assert!(forged.contains("line break"), "{forged}");
        let escaped = check("[\"a\u{2028}b\u{85}c\u{2029}\"]").unwrap();
        assert_eq!(escaped, ["[\"a\\u2028b\\u0085c\\u2029\"]"]);
        let value: serde_json::Value = serde_json::from_str(&escaped[0]).unwrap();
        assert_eq!(value, serde_json::json!(["a\u{2028}b\u{85}c\u{2029}"]), "the same value");
    }

    #[test]
    fn import_allow_list() {
        assert!(import_allowed("wasi:cli/environment@0.2.6"));
        assert!(import_allowed("groupstate:plugin/state@0.1.0"));
        assert!(!import_allowed("wasi:sockets/tcp@0.2.6"));
        assert!(!import_allowed("wasi:http/outgoing-handler@0.2.0"));
        assert!(import_allowed("group-state"));
        assert!(!import_allowed("other-thing"));
    }
}
