//! The plugin runtime: loading builder components, calling them in a fresh sandbox per call, and
//! checking what they return.
//!
//! # Guarantees
//! * A plugin serves only after it compiled, instantiated and described itself with a kind it
//!   really exports and this host's contract version.
//! * Every call gets a new `Store` (nothing survives between calls), a deadline (epoch
//!   interruption), a memory cap, and a WASI context that grants nothing: no preopened
//!   directories, no environment, no sockets, no stdin; clocks read a fixed instant and random
//!   numbers are seeded, so a builder is a pure function of its input. Its stdout/stderr (bounded)
//!   go to the host's log, and stderr is quoted in trap errors (a panic message shows there).
//! * A trap, a deadline or the memory cap becomes a [`PluginError`] naming the plugin, the call
//!   and the cause; the host never panics or hangs on a bad plugin.
//! * Output is untrusted: see [`policy`].

mod bindings;
pub mod bundled;
mod children;
mod engine;
pub mod policy;
pub mod reload;

use std::{path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Pod, Service};
use sha2::{Digest, Sha256};
use slinky_api::{Controller, NodeSet};
use wasmtime::{
    ResourceLimiter, Store,
    component::{InstancePre, Linker, ResourceTable},
};
use wasmtime_wasi::{Deterministic, WasiCtx, WasiCtxView, WasiView, p2::pipe::MemoryOutputPipe};

pub use bindings::{BuilderKind, CONTRACT_VERSION, Contract, PluginInfo, SUPPORTED_CONTRACTS};
pub use children::{Child, ChildKind, ConfigMapFiles, ControllerInputs, MAX_CHILDREN, Ownership};

/// The wasmtime version the host runs plugins on (pinned in the workspace manifest).
pub const WASMTIME_VERSION: &str = "48.0.8";
pub use bundled::{PluginRegistry, Refusal};
pub use engine::{
    Allocator, CallStats, CompileSource, EngineHandle, RuntimeConfig, Tier, Tiering, default_cache_dir,
};

/// What a build call may know about the cluster (the WIT `build-context`), and which pod of a
/// NodeSet to build (the WIT `pod-identity`): the same types plugin authors use.
pub use slinky_guest_sdk::{BuildContext, PodIdentity};

/// The error a builder returned (the WIT `build-error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestError {
    /// The parent object is invalid for this builder.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The request is not supported by this builder.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The builder failed internally.
    #[error("internal error: {0}")]
    Internal(String),
}

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

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Embedded in the host binary.
    Bundled,
    /// A file.
    File(PathBuf),
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Bundled => f.write_str("bundled"),
            PluginSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The data of one call's `Store`.
struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: CallLimits,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Caps linear memory (and tables) and remembers whether the cap was hit.
struct CallLimits {
    memory: usize,
    hit: bool,
    /// The size of a memory refused when it was created (its initial size above the cap).
    initial_above_cap: Option<usize>,
    /// `memory_growing` calls (memory creation at instantiation included).
    grows: u64,
}

impl ResourceLimiter for CallLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grows += 1;
        let ok = desired <= self.memory;
        self.hit |= !ok;
        if !ok && current == 0 {
            self.initial_above_cap = Some(desired);
        }
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// A fixed wall clock: the guest sees the Unix epoch.
struct FrozenWallClock;
impl wasmtime_wasi::HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// A fixed monotonic clock.
struct FrozenMonotonicClock;
impl wasmtime_wasi::HostMonotonicClock for FrozenMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Bytes of guest stdout and of stderr kept per call; a guest writing more traps.
const OUTPUT_CAP: usize = 64 << 10;
/// Largest accepted output object (JSON bytes), like the API server's request limit.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// A loaded, validated plugin: ready to serve builds. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    info: PluginInfo,
    contract: Contract,
    digest: String,
    source: PluginSource,
    engine: Arc<EngineHandle>,
    /// The code calls run: baseline first when tiered, then replaced once by the optimized code.
    code: std::sync::RwLock<Arc<Code>>,
}

/// A plugin's compiled code in one tier, linked and ready to instantiate.
struct Code {
    tier: Tier,
    compiled_from: CompileSource,
    compile_time: Duration,
    /// The engine that compiled it (stores must be of the same engine).
    engine: wasmtime::Engine,
    pre: InstancePre<CallState>,
    exports: Exports,
}

/// A component linked against WASI, before its builder exports are looked up.
struct Linked {
    tier: Tier,
    compiled: (CompileSource, Duration),
    engine: wasmtime::Engine,
    contract: Contract,
    pre: InstancePre<CallState>,
}

impl Linked {
    /// Link `component` (compiled by `engine`, speaking `contract`).
    fn new(
        engine: &wasmtime::Engine,
        component: &wasmtime::component::Component,
        contract: Contract,
        tier: Tier,
        compiled: (CompileSource, Duration),
        refused: &impl Fn(String) -> PluginError,
    ) -> Result<Linked, PluginError> {
        let mut linker: Linker<CallState> = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| PluginError::Engine(format!("cannot link WASI: {e:#}")))?;
        let pre = linker
            .instantiate_pre(component)
            .map_err(|e| refused(format!("it imports something this host does not provide: {e:#}")))?;
        Ok(Linked {
            tier,
            compiled,
            engine: engine.clone(),
            contract,
            pre,
        })
    }

    /// The code, with the exports of the builder `kinds` found.
    fn into_code(
        self,
        kinds: &[BuilderKind],
        refused: &impl Fn(String) -> PluginError,
    ) -> Result<Code, PluginError> {
        let exports = exports_of(&self.pre, self.contract, kinds).map_err(refused)?;
        Ok(Code {
            tier: self.tier,
            compiled_from: self.compiled.0,
            compile_time: self.compiled.1,
            engine: self.engine,
            pre: self.pre,
            exports,
        })
    }
}

/// The builder interfaces a plugin exports, by contract version.
enum Exports {
    V1 {
        service: Option<bindings::v1::controller_service::GuestIndices>,
        pod: Option<bindings::v1::nodeset_pod::GuestIndices>,
    },
    V2 {
        service: Option<bindings::v2::controller_service::GuestIndices>,
        pod: Option<bindings::v2::nodeset_pod::GuestIndices>,
        controller_children: Option<bindings::v2::controller_children::GuestIndices>,
        nodeset_children: Option<bindings::v2::nodeset_children::GuestIndices>,
    },
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.inner.info.name)
            .field("version", &self.inner.info.version)
            .field("digest", &self.inner.digest)
            .field("source", &self.inner.source)
            .finish_non_exhaustive()
    }
}

/// Largest decompressed `*.wasm.gz` accepted.
const MAX_COMPONENT_BYTES: u64 = 64 << 20;

/// Decompress a gzipped component (bounded).
///
/// # Errors
/// Not gzip, or larger than 64 MiB decompressed; the message says how to fix it.
pub fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not a valid gzip file ({e}): make it with `gzip -k FILE.wasm`"))?;
    if out.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(format!(
            "it decompresses to more than {} MiB; a builder component is a few MiB at most",
            MAX_COMPONENT_BYTES >> 20
        ));
    }
    Ok(out)
}

/// The sha256 of a component, hex.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `component` with a custom section `name` holding `data` appended: the same behaviour under
/// another digest (custom sections are ignored when running). Stamps builds (a build id, a git
/// commit) and gives tests and benchmarks distinct versions of one plugin.
pub fn with_custom_section(component: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut payload = Vec::with_capacity(name.len() + data.len() + 5);
    leb128(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(data);
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb128(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

impl Plugin {
    /// Load a plugin from a file.
    ///
    /// # Errors
    /// [`PluginError`] when the file can't be read, compiled, instantiated or described, or speaks
    /// another contract version.
    pub fn load_file(engine: &Arc<EngineHandle>, path: &std::path::Path) -> Result<Plugin, PluginError> {
        let bytes = std::fs::read(path).map_err(|source| PluginError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // A gzipped component (`x.wasm.gz`, as a ConfigMap carries it) loads like the component.
        let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
            gunzip(&bytes).map_err(|reason| PluginError::Refused {
                plugin: path.display().to_string(),
                reason,
            })?
        } else {
            bytes
        };
        Self::load(engine, &bytes, PluginSource::File(path.to_path_buf()))
    }

    /// Load a plugin from bytes.
    ///
    /// # Errors
    /// As [`Plugin::load_file`].
    pub fn load(
        engine: &Arc<EngineHandle>,
        bytes: &[u8],
        source: PluginSource,
    ) -> Result<Plugin, PluginError> {
        let plugin = Self::load_unoptimized(engine, bytes, source)?;
        plugin.optimize_in_background(bytes);
        Ok(plugin)
    }

    /// [`Plugin::load`] without starting the background compile of optimized code, for a
    /// version that must pass more checks first (the reloader's example builds): a refused
    /// version then costs no Cranelift compile. Call [`Plugin::optimize_in_background`] once it
    /// is accepted.
    ///
    /// # Errors
    /// As [`Plugin::load_file`].
    pub(crate) fn load_unoptimized(
        engine: &Arc<EngineHandle>,
        bytes: &[u8],
        source: PluginSource,
    ) -> Result<Plugin, PluginError> {
        let label = source.to_string();
        let digest = digest(bytes);
        let refused = |reason: String| PluginError::Refused {
            plugin: label.clone(),
            reason,
        };
        if !bytes.starts_with(b"\0asm") {
            return Err(refused("not a wasm file (no `\\0asm` header)".into()));
        }
        let started = std::time::Instant::now();
        // Optimized code if it is already compiled; else baseline code now and optimized code
        // in the background when tiering; else compile the optimized code now.
        let cached = match engine.tiering() {
            // Baseline-only means Winch code, even when an optimized artifact exists.
            Tiering::Baseline => None,
            Tiering::Tiered | Tiering::Optimized => engine.cached(&digest)?,
        };
        let (component, tier, compiled_from) = match (cached, engine.tiering()) {
            (Some((component, from)), _) => (component, Tier::Optimized, from),
            (None, Tiering::Optimized) => {
                let (component, from) = engine.component(&label, &digest, bytes)?;
                (component, Tier::Optimized, from)
            }
            (None, Tiering::Tiered | Tiering::Baseline) => match engine.baseline_component(&label, bytes) {
                Ok(component) => (component, Tier::Baseline, CompileSource::Compiled),
                Err(error) => {
                    tracing::warn!(plugin = %label, %error, "the baseline compiler refused the plugin; compiling it with Cranelift");
                    let (component, from) = engine.component(&label, &digest, bytes)?;
                    (component, Tier::Optimized, from)
                }
            },
        };
        let compile_time = started.elapsed();
        let wasm_engine = engine.engine_of(tier);
        let contract = check_contract(wasm_engine, &component).map_err(&refused)?;
        let linked = Linked::new(
            wasm_engine,
            &component,
            contract,
            tier,
            (compiled_from, compile_time),
            &refused,
        )?;
        let info = describe(engine, wasm_engine, &linked.pre, contract, &label)?;

        if info.contract_version != contract.as_str() {
            return Err(refused(format!(
                "it exports the contract {contract} interfaces but describes contract version {}: \
                 rebuild it against slinky-guest-sdk {CONTRACT_VERSION}",
                info.contract_version
            )));
        }
        if info.kinds.is_empty() {
            return Err(refused("describe() lists no builder kinds".into()));
        }
        let code = linked.into_code(&info.kinds, &refused)?;
        tracing::info!(plugin = %info.name, version = %info.version, digest = %&digest[..12], source = %label,
            kinds = ?info.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(), %contract, ?compiled_from,
            tier = tier.as_str(), compile_ms = compile_time.as_millis() as u64, "plugin loaded");
        let plugin = Plugin {
            inner: Arc::new(PluginInner {
                info,
                contract,
                digest,
                source,
                engine: engine.clone(),
                code: std::sync::RwLock::new(Arc::new(code)),
            }),
        };
        Ok(plugin)
    }

    /// When the plugin runs baseline code and the engine is tiered: compile the optimized code
    /// on the engine's optimizer thread, check it, and switch to it. Calls already running
    /// finish on the baseline code, calls made after the switch run the optimized code. The
    /// optimized code must describe itself as the baseline code did and build the example inputs
    /// exactly as the baseline code builds them (so it passes what the version passed before it
    /// served). Nothing happens if the plugin is gone by the job's turn (a version replaced
    /// before it was optimized is never compiled); on any failure the plugin keeps its baseline
    /// code (logged).
    pub(crate) fn optimize_in_background(&self, bytes: &[u8]) {
        if self.tier() != Tier::Baseline || self.inner.engine.tiering() != Tiering::Tiered {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let bytes = bytes.to_vec();
        let (engine, digest, label) = (self.inner.engine.clone(), self.inner.digest.clone(), self.label());
        let job = move || {
            // Replaced (or dropped) before its turn: nothing to do.
            if weak.strong_count() == 0 {
                return;
            }
            let started = std::time::Instant::now();
            let compiled = engine.component(&label, &digest, &bytes);
            let compile_time = started.elapsed();
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let plugin = Plugin { inner };
            match compiled
                .and_then(|(component, from)| plugin.optimized_code(&component, from, compile_time))
                .and_then(|code| plugin.check_optimized(code))
            {
                Ok(code) => {
                    plugin.set_code(code);
                    tracing::info!(plugin = %label, digest = %&digest[..12], compile_ms = compile_time.as_millis() as u64,
                        "plugin switched to optimized code");
                }
                Err(error) => {
                    tracing::warn!(plugin = %label, %error, "cannot switch to optimized code; the plugin keeps running its baseline code");
                }
            }
        };
        if let Err(error) = self.inner.engine.optimize_later(Box::new(job)) {
            tracing::warn!(plugin = %self.label(), %error, "cannot compile the optimized code; the plugin keeps running its baseline code");
        }
    }

    /// `code` (optimized) if it describes itself as this plugin did and builds the example
    /// inputs as the code now serving does.
    fn check_optimized(&self, code: Code) -> Result<Arc<Code>, PluginError> {
        let label = self.label();
        let refused = |reason: String| PluginError::Refused {
            plugin: label.clone(),
            reason,
        };
        let info = describe(
            &self.inner.engine,
            &code.engine,
            &code.pre,
            self.inner.contract,
            &label,
        )?;
        if info != self.inner.info {
            return Err(refused(format!(
                "its optimized code describes itself as {info:?}, its baseline code as {:?}",
                self.inner.info
            )));
        }
        let candidate = Plugin {
            inner: Arc::new(PluginInner {
                info,
                contract: self.inner.contract,
                digest: self.inner.digest.clone(),
                source: self.inner.source.clone(),
                engine: self.inner.engine.clone(),
                code: std::sync::RwLock::new(Arc::new(code)),
            }),
        };
        let ctx = BuildContext::default();
        let serving = self.example_builds(&ctx).map_err(|e| e.metric_label());
        let optimized = candidate.example_builds(&ctx).map_err(|e| e.metric_label());
        if serving != optimized {
            return Err(refused(format!(
                "its optimized code builds the example inputs differently from its baseline code \
                 (baseline: {}, optimized: {})",
                summary(&serving),
                summary(&optimized)
            )));
        }
        Ok(candidate.code())
    }

    /// Build the example inputs (`slinky-guest-sdk`'s `testing` examples) with every kind the
    /// plugin builds, through the output policy; the outputs, kind by kind, in debug form.
    ///
    /// # Errors
    /// The first call that fails; [`PluginError::Refused`] when the examples do not parse.
    pub(crate) fn example_builds(&self, ctx: &BuildContext) -> Result<Vec<String>, PluginError> {
        use slinky_guest_sdk::testing;
        // Parsed once per process: every reload and every switch to optimized code builds them.
        static EXAMPLES: std::sync::LazyLock<Result<(Controller, NodeSet), String>> =
            std::sync::LazyLock::new(|| {
                testing::example_controller()
                    .and_then(|c| Ok((c, testing::example_nodeset()?)))
                    .map_err(|e| format!("the example inputs do not parse: {e}"))
            });
        let (controller, nodeset) = EXAMPLES.as_ref().map_err(|reason| PluginError::Refused {
            plugin: self.label(),
            reason: reason.clone(),
        })?;
        let mut out = Vec::new();
        if self.builds(BuilderKind::ControllerService) {
            out.push(format!("{:?}", self.build_service(ctx, controller)?));
        }
        if self.builds(BuilderKind::NodesetPod) {
            let identity = PodIdentity::for_ordinal(nodeset, 0, "smoke");
            out.push(format!(
                "{:?}",
                self.build_pod(ctx, nodeset, controller, &identity)?
            ));
        }
        if self.builds(BuilderKind::ControllerChildren) {
            let inputs = testing::example_inputs(std::slice::from_ref(nodeset));
            out.push(format!(
                "{:?}",
                self.build_controller_children(ctx, controller, &inputs)?
            ));
        }
        if self.builds(BuilderKind::NodesetChildren) {
            out.push(format!(
                "{:?}",
                self.build_nodeset_children(ctx, nodeset, controller)?
            ));
        }
        Ok(out)
    }

    fn optimized_code(
        &self,
        component: &wasmtime::component::Component,
        from: CompileSource,
        compile_time: Duration,
    ) -> Result<Code, PluginError> {
        let engine = &self.inner.engine.engine;
        let label = self.label();
        let refused = |reason: String| PluginError::Refused {
            plugin: label.clone(),
            reason,
        };
        let contract = check_contract(engine, component).map_err(&refused)?;
        if contract != self.inner.contract {
            return Err(refused(format!(
                "its optimized code speaks contract {contract}, its baseline code {}",
                self.inner.contract
            )));
        }
        Linked::new(
            engine,
            component,
            contract,
            Tier::Optimized,
            (from, compile_time),
            &refused,
        )?
        .into_code(&self.inner.info.kinds, &refused)
    }

    fn code(&self) -> Arc<Code> {
        match self.inner.code.read() {
            Ok(code) => code.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_code(&self, code: Arc<Code>) {
        match self.inner.code.write() {
            Ok(mut slot) => *slot = code,
            Err(poisoned) => *poisoned.into_inner() = code,
        }
    }

    /// Which compiler made the code new calls run.
    pub fn tier(&self) -> Tier {
        self.code().tier
    }

    /// Wait until new calls run code of `tier` (polling); `false` after `timeout`.
    pub fn wait_for_tier(&self, tier: Tier, timeout: Duration) -> bool {
        let started = std::time::Instant::now();
        while self.tier() != tier {
            if started.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// What the plugin said about itself.
    pub fn info(&self) -> &PluginInfo {
        &self.inner.info
    }

    /// The sha256 of the component, hex.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// Where it came from.
    pub fn source(&self) -> &PluginSource {
        &self.inner.source
    }

    /// Whether the code new calls run was compiled in this process, or came from a cache.
    pub fn compiled_from(&self) -> CompileSource {
        self.code().compiled_from
    }

    /// How long compiling (or loading the precompiled artifact) of the code new calls run took.
    pub fn compile_time(&self) -> Duration {
        self.code().compile_time
    }

    /// Whether the plugin builds `kind`.
    pub fn builds(&self, kind: BuilderKind) -> bool {
        self.inner.info.kinds.contains(&kind)
    }

    /// `<name>@<version>`, the value of the builder annotation.
    pub fn label(&self) -> String {
        format!("{}@{}", self.inner.info.name, self.inner.info.version)
    }

    /// Call `build-service` and return the raw JSON text, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_service_raw(&self, ctx: &BuildContext, controller: &String) -> Result<String, PluginError> {
        const CALL: &str = "build-service";
        let missing = || self.not_a_kind(BuilderKind::ControllerService);
        let code = self.code();
        let out = match &code.exports {
            Exports::V2 { service, .. } => {
                let idx = service.as_ref().ok_or_else(missing)?;
                let wctx = bindings::v2::types::BuildContext::from_host(ctx);
                self.call(&code, CALL, |store, instance| {
                    let r = idx
                        .load(&mut *store, instance)?
                        .call_build_service(store, &wctx, controller)?;
                    Ok(r.map_err(bindings::guest_error_v2))
                })?
            }
            Exports::V1 { service, .. } => {
                let idx = service.as_ref().ok_or_else(missing)?;
                let wctx = bindings::v1::types::BuildContext::from_host(ctx);
                self.call(&code, CALL, |store, instance| {
                    let r = idx
                        .load(&mut *store, instance)?
                        .call_build_service(store, &wctx, controller)?;
                    Ok(r.map_err(bindings::guest_error_v1))
                })?
            }
        };
        self.bounded(CALL, out)
    }

    /// Call `build-pod` and return the raw JSON text, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_pod_raw(
        &self,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
        identity: &PodIdentity,
    ) -> Result<String, PluginError> {
        const CALL: &str = "build-pod";
        let missing = || self.not_a_kind(BuilderKind::NodesetPod);
        let code = self.code();
        let out = match &code.exports {
            Exports::V2 { pod, .. } => {
                let idx = pod.as_ref().ok_or_else(missing)?;
                let wctx = bindings::v2::types::BuildContext::from_host(ctx);
                let wid = bindings::v2::types::PodIdentity::from_host(identity);
                self.call(&code, CALL, |store, instance| {
                    let r = idx
                        .load(&mut *store, instance)?
                        .call_build_pod(store, &wctx, nodeset, controller, &wid)?;
                    Ok(r.map_err(bindings::guest_error_v2))
                })?
            }
            Exports::V1 { pod, .. } => {
                let idx = pod.as_ref().ok_or_else(missing)?;
                let wctx = bindings::v1::types::BuildContext::from_host(ctx);
                let wid = bindings::v1::types::PodIdentity::from_host(identity);
                self.call(&code, CALL, |store, instance| {
                    let r = idx
                        .load(&mut *store, instance)?
                        .call_build_pod(store, &wctx, nodeset, controller, &wid)?;
                    Ok(r.map_err(bindings::guest_error_v1))
                })?
            }
        };
        self.bounded(CALL, out)
    }

    /// Time `n` `build-pod` calls made on **one** instance: the compiled code's own speed, without
    /// instantiation, memory faults or teardown. For benchmarks only: the host never reuses an
    /// instance (every real call gets a fresh one, so no state survives between calls).
    ///
    /// # Errors
    /// A [`PluginError`] when a call fails.
    #[doc(hidden)]
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` by reference"
    )]
    pub fn time_build_pod_on_one_instance(
        &self,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
        identity: &PodIdentity,
        n: usize,
    ) -> Result<Vec<Duration>, PluginError> {
        const CALL: &str = "build-pod";
        // Only contract 0.2.0 plugins: the benchmark's guests are built against it.
        let code = self.code();
        let Exports::V2 { pod: Some(idx), .. } = &code.exports else {
            return Err(self.not_a_kind(BuilderKind::NodesetPod));
        };
        let wctx = bindings::v2::types::BuildContext::from_host(ctx);
        let wid = bindings::v2::types::PodIdentity::from_host(identity);
        let label = self.label();
        let engine = &self.inner.engine;
        let (mut store, instance) = instantiate(engine, &code.engine, &code.pre, &label, CALL)?;
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            store.set_epoch_deadline(engine.deadline_ticks());
            let started = std::time::Instant::now();
            let out = idx
                .load(&mut store, &instance)
                .and_then(|f| f.call_build_pod(&mut store, &wctx, nodeset, controller, &wid))
                .map_err(|e| trap_error(&label, CALL, e, &store, engine))?;
            times.push(started.elapsed());
            std::hint::black_box(out.ok());
        }
        Ok(times)
    }

    /// Create a fresh store and instance, then drop them: the time of each (for benchmarks).
    ///
    /// # Errors
    /// A [`PluginError::Trap`] when instantiation traps.
    #[doc(hidden)]
    pub fn time_instantiation(&self) -> Result<(Duration, Duration), PluginError> {
        let code = self.code();
        let started = std::time::Instant::now();
        let made = instantiate(
            &self.inner.engine,
            &code.engine,
            &code.pre,
            &self.label(),
            "instantiate",
        )?;
        let instantiated = started.elapsed();
        let started = std::time::Instant::now();
        drop(made);
        Ok((instantiated, started.elapsed()))
    }

    /// Create a fresh store and instance and drop them (for benchmarks).
    ///
    /// # Errors
    /// A [`PluginError::Trap`] when instantiation traps.
    #[doc(hidden)]
    pub fn instantiate_only(&self) -> Result<(), PluginError> {
        let code = self.code();
        instantiate(
            &self.inner.engine,
            &code.engine,
            &code.pre,
            &self.label(),
            "instantiate",
        )
        .map(drop)
    }

    /// Build the Controller's Service: serialize a copy, call the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when the output breaks the policy.
    pub fn build_service(&self, ctx: &BuildContext, controller: &Controller) -> Result<Service, PluginError> {
        let input = self.input("build-service", controller)?;
        let raw = self.build_service_raw(ctx, &input)?;
        policy::service(&raw, controller, self).map_err(|reason| PluginError::Rejected {
            plugin: self.label(),
            call: "build-service",
            reason,
        })
    }

    /// Build one pod of a NodeSet: serialize copies, call the plugin, apply the output policy.
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when the output breaks the policy.
    pub fn build_pod(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, PluginError> {
        let ns_json = self.input("build-pod", nodeset)?;
        let ctl_json = self.input("build-pod", controller)?;
        let raw = self.build_pod_raw(ctx, &ns_json, &ctl_json, identity)?;
        policy::pod(&raw, nodeset, identity, self).map_err(|reason| PluginError::Rejected {
            plugin: self.label(),
            call: "build-pod",
            reason,
        })
    }

    fn input<T: serde::Serialize>(&self, call: &'static str, obj: &T) -> Result<String, PluginError> {
        serde_json::to_string(obj).map_err(|e| PluginError::Build {
            plugin: self.label(),
            call,
            error: GuestError::Internal(format!("cannot serialize the input: {e}")),
        })
    }

    fn not_a_kind(&self, kind: BuilderKind) -> PluginError {
        PluginError::NotAKind {
            plugin: self.label(),
            kind,
        }
    }

    /// Run one call in a fresh sandbox; the builder's error becomes [`PluginError::Build`].
    fn call<T, F>(&self, code: &Code, call: &'static str, f: F) -> Result<T, PluginError>
    where
        F: FnOnce(
            &mut Store<CallState>,
            &wasmtime::component::Instance,
        ) -> wasmtime::Result<Result<T, GuestError>>,
    {
        let label = self.label();
        let engine = &self.inner.engine;
        let (mut store, instance) = instantiate(engine, &code.engine, &code.pre, &label, call)?;
        let result = f(&mut store, &instance);
        engine.count_call(store.data().limits.grows);
        log_output(&label, call, &store);
        let output = result.map_err(|e| trap_error(&label, call, e, &store, engine))?;
        output.map_err(|error| PluginError::Build {
            plugin: label.clone(),
            call,
            error,
        })
    }

    /// `json`, unless it is larger than an API server accepts.
    fn bounded(&self, call: &'static str, json: String) -> Result<String, PluginError> {
        if json.len() > MAX_OUTPUT_BYTES {
            return Err(PluginError::Rejected {
                plugin: self.label(),
                call,
                reason: format!(
                    "the output is {} bytes, more than the {MAX_OUTPUT_BYTES} allowed",
                    json.len()
                ),
            });
        }
        Ok(json)
    }

    /// The contract version the plugin was built against.
    pub fn contract(&self) -> Contract {
        self.inner.contract
    }
}

/// The builder interfaces of `kinds` that the component exports, for `contract`.
fn exports_of(
    pre: &InstancePre<CallState>,
    contract: Contract,
    kinds: &[BuilderKind],
) -> Result<Exports, String> {
    let missing = |kind: BuilderKind| {
        move |e: wasmtime::Error| {
            format!(
                "describe() lists {kind} but the component does not export it ({e:#}): list only the \
                 kinds you implement in `export_plugin!(…, kinds = [...])`"
            )
        }
    };
    let wants = |kind| kinds.contains(&kind);
    if let Some(kind) = kinds.iter().find(|k| !contract.kinds().contains(k)) {
        return Err(format!(
            "describe() lists {kind}, which contract {contract} does not have: rebuild it against \
             slinky-guest-sdk {CONTRACT_VERSION}"
        ));
    }
    Ok(match contract {
        Contract::V0_1 => {
            use bindings::v1::{controller_service, nodeset_pod};
            let k = (BuilderKind::ControllerService, BuilderKind::NodesetPod);
            Exports::V1 {
                service: wants(k.0)
                    .then(|| controller_service::GuestIndices::new(pre).map_err(missing(k.0)))
                    .transpose()?,
                pod: wants(k.1)
                    .then(|| nodeset_pod::GuestIndices::new(pre).map_err(missing(k.1)))
                    .transpose()?,
            }
        }
        Contract::V0_2 => {
            use bindings::v2::{controller_children, controller_service, nodeset_children, nodeset_pod};
            Exports::V2 {
                service: wants(BuilderKind::ControllerService)
                    .then(|| {
                        controller_service::GuestIndices::new(pre)
                            .map_err(missing(BuilderKind::ControllerService))
                    })
                    .transpose()?,
                pod: wants(BuilderKind::NodesetPod)
                    .then(|| nodeset_pod::GuestIndices::new(pre).map_err(missing(BuilderKind::NodesetPod)))
                    .transpose()?,
                controller_children: wants(BuilderKind::ControllerChildren)
                    .then(|| {
                        controller_children::GuestIndices::new(pre)
                            .map_err(missing(BuilderKind::ControllerChildren))
                    })
                    .transpose()?,
                nodeset_children: wants(BuilderKind::NodesetChildren)
                    .then(|| {
                        nodeset_children::GuestIndices::new(pre)
                            .map_err(missing(BuilderKind::NodesetChildren))
                    })
                    .transpose()?,
            }
        }
    })
}

/// Call `describe()` on a fresh instance of `pre`, in a sandbox like any call.
fn describe(
    engine: &Arc<EngineHandle>,
    wasm_engine: &wasmtime::Engine,
    pre: &InstancePre<CallState>,
    contract: Contract,
    label: &str,
) -> Result<PluginInfo, PluginError> {
    let (mut store, instance) = instantiate(engine, wasm_engine, pre, label, "describe")?;
    let described = match contract {
        Contract::V0_2 => bindings::v2::plugin::GuestIndices::new(pre)
            .and_then(|idx| idx.load(&mut store, &instance))
            .and_then(|guest| guest.call_describe(&mut store))
            .map(PluginInfo::from),
        Contract::V0_1 => bindings::v1::plugin::GuestIndices::new(pre)
            .and_then(|idx| idx.load(&mut store, &instance))
            .and_then(|guest| guest.call_describe(&mut store))
            .map(PluginInfo::from),
    };
    let info = described.map_err(|e| trap_error(label, "describe", e, &store, engine))?;
    log_output(label, "describe", &store);
    Ok(info)
}

/// A short account of example builds for an error message.
fn summary(builds: &Result<Vec<String>, &'static str>) -> String {
    match builds {
        Ok(outputs) => format!(
            "{} outputs, {} bytes",
            outputs.len(),
            outputs.iter().map(String::len).sum::<usize>()
        ),
        Err(label) => format!("failed ({label})"),
    }
}

/// A fresh store and instance, with the deadline and memory cap set before instantiation.
fn instantiate(
    engine: &Arc<EngineHandle>,
    wasm_engine: &wasmtime::Engine,
    pre: &InstancePre<CallState>,
    label: &str,
    call: &'static str,
) -> Result<(Store<CallState>, wasmtime::component::Instance), PluginError> {
    let (stdout, stderr) = (
        MemoryOutputPipe::new(OUTPUT_CAP),
        MemoryOutputPipe::new(OUTPUT_CAP),
    );
    let wasi = WasiCtx::builder()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .wall_clock(FrozenWallClock)
        .monotonic_clock(FrozenMonotonicClock)
        .secure_random(Deterministic::new(vec![0x5a; 32]))
        .insecure_random(Deterministic::new(vec![0xa5; 32]))
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    let state = CallState {
        wasi,
        table: ResourceTable::new(),
        limits: CallLimits {
            memory: engine.config.memory_limit,
            hit: false,
            initial_above_cap: None,
            grows: 0,
        },
        stdout,
        stderr,
    };
    let mut store = Store::new(wasm_engine, state);
    store.limiter(|s| &mut s.limits);
    store.set_epoch_deadline(engine.deadline_ticks());
    store.epoch_deadline_trap();
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| trap_error(label, call, e, &store, engine))?;
    Ok((store, instance))
}

fn stdio(store: &Store<CallState>) -> (String, String) {
    let read = |pipe: &MemoryOutputPipe| String::from_utf8_lossy(&pipe.contents()).into_owned();
    (read(&store.data().stdout), read(&store.data().stderr))
}

fn log_output(label: &str, call: &str, store: &Store<CallState>) {
    let (out, err) = stdio(store);
    for line in out.lines().chain(err.lines()) {
        tracing::info!(plugin = label, call, "guest: {line}");
    }
}

fn trap_error(
    label: &str,
    call: &'static str,
    error: wasmtime::Error,
    store: &Store<CallState>,
    engine: &EngineHandle,
) -> PluginError {
    let limits = &store.data().limits;
    let cause = if let Some(initial) = limits.initial_above_cap {
        TrapCause::InitialMemoryAboveCap {
            initial,
            cap: engine.config.memory_limit,
        }
    } else if limits.hit {
        TrapCause::MemoryCap(engine.config.memory_limit)
    } else if matches!(
        error.downcast_ref::<wasmtime::Trap>(),
        Some(wasmtime::Trap::Interrupt)
    ) {
        TrapCause::Deadline(engine.config.call_deadline)
    } else {
        TrapCause::Trap(format!("{error:#}"))
    };
    PluginError::Trap {
        plugin: label.to_string(),
        call,
        cause,
        stderr: stdio(store).1,
    }
}

/// The contract version a component speaks, from its exports; refuse components that speak
/// another version or none, before anything runs.
fn check_contract(
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> Result<Contract, String> {
    let exports: Vec<String> = component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    if let Some(contract) = Contract::ALL
        .into_iter()
        .find(|c| exports.contains(&c.export_name("plugin")))
    {
        return Ok(contract);
    }
    let prefix = format!("{}/", bindings::PACKAGE);
    let ours: Vec<&String> = exports.iter().filter(|e| e.starts_with(&prefix)).collect();
    let supported = SUPPORTED_CONTRACTS.join(" and ");
    if let Some(other) = ours.iter().find_map(|e| e.split_once('@').map(|(_, v)| v)) {
        return Err(format!(
            "it was built against contract version {other}, this host speaks {supported} \
             (it exports {}): rebuild it against slinky-guest-sdk {CONTRACT_VERSION}",
            ours.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    Err(format!(
        "it does not export `{}` (no describe()); it exports [{}]. Export your builder with \
         `slinky_guest_sdk::export_plugin!`",
        Contract::V0_2.export_name("plugin"),
        exports.join(", ")
    ))
}

#[cfg(test)]
mod version_tests {
    #[test]
    fn the_wasmtime_version_is_the_locked_one() {
        let lock = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.lock"));
        let locked = lock
            .split("[[package]]")
            .find(|p| p.contains("\nname = \"wasmtime\"\n"))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
            .map(|v| v.trim_matches('"'));
        assert_eq!(locked, Some(super::WASMTIME_VERSION));
    }
}
