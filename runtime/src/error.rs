//! The runtime's errors: what a builder returned, why a call was stopped, and every way loading
//! or calling a plugin can fail, each naming the plugin and the call.

use std::{path::PathBuf, time::Duration};

use crate::BuilderKind;

/// The error a builder returned (the WIT `build-error`): the contract's own
/// [`BuildError`](slinky_api::contract::BuildError), which plugin authors return.
pub use slinky_api::contract::BuildError as GuestError;

/// Why a call was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrapCause {
    /// The call ran past its deadline.
    Deadline(Duration),
    /// The call tried to grow memory past the cap (bytes).
    MemoryCap(usize),
    /// The plugin's initial linear memory is already above the cap: no call can run.
    InitialMemoryAboveCap {
        /// Bytes the plugin's memory starts with.
        initial: usize,
        /// The cap (bytes).
        cap: usize,
    },
    /// Any other trap (a panic is `unreachable` with the message on stderr).
    Trap(String),
}

impl std::fmt::Display for TrapCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrapCause::Deadline(d) => write!(
                f,
                "exceeded its deadline of {} ms and was stopped: a builder must return quickly (look for a \
                 loop that never ends); the host's limit is --plugin-deadline-ms",
                d.as_millis()
            ),
            TrapCause::MemoryCap(b) => write!(
                f,
                "exceeded its memory cap of {} MiB and was stopped: allocate less per call; the host's \
                 limit is --plugin-memory-mib",
                b >> 20
            ),
            TrapCause::InitialMemoryAboveCap { initial, cap } => write!(
                f,
                "starts with {} KiB of linear memory, above the memory cap of {} KiB, so no call can \
                 run: raise --plugin-memory-mib to at least {} (or build the plugin with a smaller \
                 `-C link-arg=--initial-memory=`)",
                initial >> 10,
                cap >> 10,
                initial.div_ceil(1 << 20)
            ),
            TrapCause::Trap(m) => write!(
                f,
                "trapped: {m} (a panic or a wasm trap: return a BuildError for bad input instead of \
                 panicking; a panic message shows as guest stderr)"
            ),
        }
    }
}

/// Errors of the plugin runtime. Each names the plugin and, for calls, the call.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// wasmtime could not create an engine.
    #[error("cannot create the wasm engine: {0}")]
    Engine(String),
    /// The plugin file could not be read.
    #[error("cannot read plugin {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid component for this engine.
    #[error(
        "plugin {plugin} is not a loadable wasm component: {reason} (build it with `cargo build --target wasm32-wasip2`)"
    )]
    Compile {
        /// The plugin.
        plugin: String,
        /// wasmtime's reason.
        reason: String,
    },
    /// The plugin was refused at load time.
    #[error("plugin {plugin} refused: {reason}")]
    Refused {
        /// The plugin.
        plugin: String,
        /// Why, and how to fix it.
        reason: String,
    },
    /// The call was stopped.
    #[error("plugin {plugin} {call} {cause}{}", stderr_suffix(.stderr))]
    Trap {
        /// The plugin.
        plugin: String,
        /// The call (`describe`, `build-service`, `build-pod`, `build-controller-children`, …).
        call: &'static str,
        /// Why.
        cause: TrapCause,
        /// What the guest wrote to stderr (a panic message).
        stderr: String,
    },
    /// The builder returned an error.
    #[error("plugin {plugin} {call} failed: {error}")]
    Build {
        /// The plugin.
        plugin: String,
        /// The call.
        call: &'static str,
        /// The builder's error.
        error: GuestError,
    },
    /// The plugin's output broke the output policy.
    #[error("plugin {plugin} {call} output refused: {reason}")]
    Rejected {
        /// The plugin.
        plugin: String,
        /// The call.
        call: &'static str,
        /// Which rule, and what the output had.
        reason: String,
    },
    /// The plugin does not build this kind.
    #[error("plugin {plugin} does not build {kind}")]
    NotAKind {
        /// The plugin.
        plugin: String,
        /// The kind asked for.
        kind: BuilderKind,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!("; guest stderr: {s}")
    }
}

impl PluginError {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PluginError::Engine(_) => "engine",
            PluginError::Read { .. } => "read",
            PluginError::Compile { .. } => "compile",
            PluginError::Refused { .. } => "refused",
            PluginError::Trap {
                cause: TrapCause::Deadline(_),
                ..
            } => "deadline",
            PluginError::Trap {
                cause: TrapCause::MemoryCap(_) | TrapCause::InitialMemoryAboveCap { .. },
                ..
            } => "memory_cap",
            PluginError::Trap { .. } => "trap",
            PluginError::Build { .. } => "build_error",
            PluginError::Rejected { .. } => "rejected",
            PluginError::NotAKind { .. } => "not_a_kind",
        }
    }
}

impl PluginError {
    /// The same error, its plugin named as step `step` of a pipeline (`<plugin> (BuilderPlugin
    /// <step>)`), so a status and an Event say which step broke the build.
    pub fn in_step(mut self, step: &str) -> Self {
        match &mut self {
            PluginError::Compile { plugin, .. }
            | PluginError::Refused { plugin, .. }
            | PluginError::Trap { plugin, .. }
            | PluginError::Build { plugin, .. }
            | PluginError::Rejected { plugin, .. }
            | PluginError::NotAKind { plugin, .. } => {
                *plugin = format!("{plugin} (BuilderPlugin {step})");
            }
            PluginError::Engine(_) | PluginError::Read { .. } => {}
        }
        self
    }
}
