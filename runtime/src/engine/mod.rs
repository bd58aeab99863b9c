//! The wasmtime engines of the process: component model, epoch interruption driven by a ticker
//! thread, the pooling allocator (with an on-demand fallback), and a cache of precompiled
//! components keyed by the component's sha256 and the engine's compatibility hash.
//!
//! Two compilers: Cranelift (the optimized tier, what plugins run on) and Winch (the baseline
//! tier: a single-pass compiler, about ten times faster to compile, slower code). A plugin that
//! is not in the cache is compiled with Winch first so that it serves within milliseconds, and
//! with Cranelift in the background; the plugin then switches to the optimized code (see
//! [`Tiering`]).

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Strategy,
    component::{Component, Linker},
};

use crate::{
    PluginError,
    policy::Allowances,
    sandbox::{self, CallState},
};

mod compile;
mod gate;
pub use compile::CompileSource;
pub(crate) use gate::CallGate;

/// How often the epoch advances; deadlines are rounded up to it.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits and settings of the plugin runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Wall-clock deadline of one plugin call (default 1 s).
    pub call_deadline: Duration,
    /// Linear-memory cap of one plugin call, in bytes (default 64 MiB).
    pub memory_limit: usize,
    /// Where precompiled components are kept; `None` disables the disk cache.
    pub cache_dir: Option<PathBuf>,
    /// Try the pooling allocator first (falls back to on-demand when it can't reserve memory).
    pub pooling: bool,
    /// At most this many plugin calls run at once, on either tier (a call past it waits); with
    /// pooling, the pool's instance slots (default 16: calls run on a host's few cores, and the
    /// slots' resident memory stays bounded).
    pub max_concurrent_calls: u32,
    /// Pooling: bytes of each linear memory (and table) kept resident between instances, reset
    /// with `memset` rather than decommitted: a reused slot takes no page faults for them. The
    /// pool's resident memory is at most this much per slot in use (default 4 MiB, twice what a
    /// bundled build touches).
    pub keep_resident: usize,
    /// Pooling on Linux 6.7+: reset only the pages an instance touched (`PAGEMAP_SCAN`); older
    /// kernels reset the resident part with `memset`.
    pub pagemap_scan: bool,
    /// Map the component's initial memory image copy-on-write instead of copying it.
    pub memory_init_cow: bool,
    /// Write `/tmp/perf-<pid>.map` so `perf record` names the guests' functions
    /// (`SLINKY_HOST_PLUGIN_PERF_MAP=1`).
    pub perf_map: bool,
    /// Which compilers a plugin that is not in the cache goes through.
    pub tiering: Tiering,
    /// What the output policy lets plugins build past their parents' grants (`--allow`; default:
    /// nothing): see [`crate::policy::Allow`].
    pub allow: Allowances,
}

/// How a plugin that is not already compiled (in memory or in the disk cache) gets its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Tiering {
    /// Compile with Winch and serve at once; compile with Cranelift in the background and switch
    /// to its code when ready (the optimized code is also written to the disk cache). The
    /// default: a new version serves within the reload budget, and runs at full speed soon after.
    #[default]
    Tiered,
    /// Compile with Cranelift before serving: slower to load, never runs baseline code.
    Optimized,
    /// Compile with Winch only and never switch (for tests and comparisons).
    Baseline,
}

/// Which compiler made the code a plugin runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Winch: compiled in one pass, fast to make, slower to run.
    Baseline,
    /// Cranelift: the optimizing compiler.
    Optimized,
}

impl Tier {
    /// `baseline` or `optimized`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Baseline => "baseline",
            Tier::Optimized => "optimized",
        }
    }
}

/// The smallest linear-memory size a pool slot is made for, whatever the cap: a component whose
/// memory does not fit a slot cannot even be loaded (and its cached artifact would be discarded
/// as unusable), while the cap itself is the limiter's to enforce, with an error that says so.
const MIN_POOLED_MEMORY: usize = 16 << 20;

/// Bytes of each pooled linear memory kept resident between calls (see
/// [`RuntimeConfig::keep_resident`]): more than a build touches (the bundled builders touch about
/// 2 MiB), so a call takes no page faults. Resident memory is bounded by what calls touched, at most
/// this much per instance slot in use.
pub const DEFAULT_KEEP_RESIDENT: usize = 4 << 20;

/// Plugin calls running at once by default (see [`RuntimeConfig::max_concurrent_calls`]).
pub const DEFAULT_CONCURRENT_CALLS: u32 = 16;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            call_deadline: Duration::from_secs(1),
            memory_limit: 64 << 20,
            cache_dir: default_cache_dir(),
            pooling: true,
            max_concurrent_calls: DEFAULT_CONCURRENT_CALLS,
            keep_resident: DEFAULT_KEEP_RESIDENT,
            pagemap_scan: true,
            memory_init_cow: true,
            perf_map: std::env::var_os("SLINKY_HOST_PLUGIN_PERF_MAP").is_some_and(|v| v == "1"),
            tiering: Tiering::default(),
            allow: Allowances::default(),
        }
    }
}

/// `$SLINKY_HOST_PLUGIN_CACHE`, else `$XDG_CACHE_HOME/slinky-host/components`, else
/// `~/.cache/slinky-host/components`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SLINKY_HOST_PLUGIN_CACHE") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("slinky-host").join("components"))
}

/// Which instance allocator the engine ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// Pre-reserved instance slots.
    Pooling,
    /// Memory mapped per instance (the fallback).
    OnDemand,
}

/// Counters of the calls made on an engine (for benchmarks and diagnostics).
#[derive(Debug, Default)]
pub struct CallStats {
    /// Builder calls made.
    pub calls: AtomicU64,
    /// `memory_growing` calls seen by the limiter (creating memories at instantiation included).
    pub memory_grows: AtomicU64,
}

/// The engines plus what goes with them: ticker, compiled-component caches.
pub struct EngineHandle {
    /// Cranelift: the optimized tier.
    pub(crate) engine: Engine,
    /// Winch: the baseline tier (`None` when tiering is off or Winch is unavailable here).
    baseline: Option<Engine>,
    /// The one linker of each engine (WASI, granting nothing), built once: `(optimized, baseline)`.
    linkers: (Linker<CallState>, Option<Linker<CallState>>),
    pub(crate) config: RuntimeConfig,
    allocator: Allocator,
    compat: String,
    compiled: Mutex<HashMap<String, Component>>,
    ticker_stop: Arc<AtomicBool>,
    stats: CallStats,
    /// At most `max_concurrent_calls` calls at once, whatever their tier.
    gate: CallGate,
    /// The guests' log lines: rate limits and counts per plugin.
    guest_logs: crate::guest_log::GuestLogs,
    /// The queue of the one thread that compiles optimized code in the background.
    optimizer: Mutex<Option<std::sync::mpsc::Sender<OptimizeJob>>>,
}

/// The pooling allocator's memory held in slots no call uses ([`EngineHandle::pool_resident`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolResident {
    /// Linear-memory slots freed with pages still resident.
    pub warm_memories: u32,
    /// Bytes resident in those linear memories.
    pub memory_bytes: usize,
    /// Bytes resident in freed tables.
    pub table_bytes: usize,
}

/// Work for the background optimizer thread.
pub(crate) type OptimizeJob = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("config", &self.config)
            .field("allocator", &self.allocator)
            .finish_non_exhaustive()
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

fn base_config(runtime: &RuntimeConfig) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.memory_init_cow(runtime.memory_init_cow);
    if runtime.perf_map {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

/// `engine`'s compatibility hash, as the cache files' names carry it: artifacts one engine
/// compiled load on another with the same hash.
pub(crate) fn compat_of(engine: &Engine) -> String {
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Give the heap a compile freed back to the system. A Cranelift compile allocates hundreds of
/// MiB and frees them; glibc's malloc keeps freed memory for later use, so after the bundled
/// builders' cold start the host stayed at 388 MiB resident where a warm start needs 89 (measured
/// on the real node; 269 MiB after a trim). Called after each Cranelift compile.
pub(crate) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(
        unsafe_code,
        reason = "glibc's malloc_trim: no arguments but the padding, no pointers"
    )]
    // SAFETY: malloc_trim only returns free heap pages to the system; it takes the allocator's
    // own locks and touches no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The Cranelift engine's configuration. With tiering, its compiles run in the background while
/// the baseline code serves, so they run on one thread: a parallel compile of the bundled builders
/// into an empty cache peaked at 608 MiB (release build, 2 cores), over the install's 512 MiB
/// limit, and the pod was OOM-killed at every cold start (found on the real node); on one thread
/// the peak was 399 MiB, and a core stays free for reconciles. Compiles a pass waits for
/// (`Tiering::Optimized`) stay parallel.
fn optimized_config(runtime: &RuntimeConfig) -> Config {
    let mut config = base_config(runtime);
    if runtime.tiering == Tiering::Tiered {
        config.parallel_compilation(false);
    }
    config
}

impl EngineHandle {
    /// Create the engine.
    ///
    /// # Errors
    /// [`PluginError::Engine`] when wasmtime cannot create an engine even without pooling.
    pub fn new(config: RuntimeConfig) -> Result<Arc<Self>, PluginError> {
        let gate = CallGate::new(config.max_concurrent_calls);
        let (engine, allocator) = if config.pooling {
            let mut pool = PoolingAllocationConfig::default();
            let slots = config.max_concurrent_calls.max(1);
            pool.total_component_instances(slots)
                .total_core_instances(slots * 8)
                .total_memories(slots * 4)
                .total_tables(slots * 8)
                .max_memory_size(config.memory_limit.max(MIN_POOLED_MEMORY))
                .linear_memory_keep_resident(config.keep_resident)
                .table_keep_resident(config.keep_resident.min(1 << 20))
                // A slot freed keeps what its call touched of the resident part (above).
                // wasmtime's default (100 idle "warm" slots, more than the pool has) takes a
                // never-used slot before one another component used, so over a long run every
                // memory slot of the pool ends up resident. With as many warm slots as calls, a
                // call takes its own component's idle slot, else a fresh one while fewer than
                // `slots` idle ones are kept, else the least recently used: at most twice the
                // calls' slots are ever resident, and each bundled builder keeps a slot its own.
                .max_unused_warm_slots(slots)
                .pagemap_scan(if config.pagemap_scan {
                    wasmtime::Enabled::Auto
                } else {
                    wasmtime::Enabled::No
                });
            let mut pooled = optimized_config(&config);
            pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            match Engine::new(&pooled) {
                Ok(engine) => (engine, Allocator::Pooling),
                Err(error) => {
                    tracing::warn!(%error, "pooling allocator unavailable, falling back to on-demand allocation");
                    (Self::on_demand(&config)?, Allocator::OnDemand)
                }
            }
        } else {
            (Self::on_demand(&config)?, Allocator::OnDemand)
        };
        let baseline = match config.tiering {
            Tiering::Optimized => None,
            Tiering::Tiered | Tiering::Baseline => Self::baseline_engine(&config),
        };
        let compat = compat_of(&engine);

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let weak_engines: Vec<_> = std::iter::once(&engine)
            .chain(baseline.as_ref())
            .map(Engine::weak)
            .collect();
        let stop = ticker_stop.clone();
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    let mut alive = false;
                    for engine in weak_engines.iter().filter_map(|e| e.upgrade()) {
                        engine.increment_epoch();
                        alive = true;
                    }
                    if !alive {
                        break;
                    }
                }
            })
            .map_err(|e| PluginError::Engine(format!("cannot start the epoch thread: {e}")))?;
        let linkers = (
            crate::linker::linker(&engine)?,
            baseline.as_ref().map(crate::linker::linker).transpose()?,
        );
        Ok(Arc::new(EngineHandle {
            engine,
            baseline,
            linkers,
            config,
            allocator,
            compat,
            compiled: Mutex::new(HashMap::new()),
            ticker_stop,
            stats: CallStats::default(),
            gate,
            guest_logs: Default::default(),
            optimizer: Mutex::new(None),
        }))
    }

    fn on_demand(config: &RuntimeConfig) -> Result<Engine, PluginError> {
        Engine::new(&optimized_config(config)).map_err(|e| PluginError::Engine(format!("{e:#}")))
    }

    /// The Winch engine, with on-demand allocation: it serves only until the optimized code is
    /// ready, so it reserves no instance slots of its own. `None` (logged) where Winch is not
    /// supported: every plugin is then compiled with Cranelift before it serves.
    fn baseline_engine(config: &RuntimeConfig) -> Option<Engine> {
        let mut winch = base_config(config);
        winch.strategy(Strategy::Winch);
        match Engine::new(&winch) {
            Ok(engine) => Some(engine),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"),
                    "the baseline compiler (Winch) is unavailable here: plugins are compiled with Cranelift before they serve");
                None
            }
        }
    }

    /// Queue `job` for the background optimizer: one thread, one Cranelift compile at a time (on
    /// one thread with tiering: see `optimized_config`; the compile hands its freed heap back),
    /// so versions landing together do not pile up compiles that fight each other and the reconciles for two cores; a job whose plugin is gone by its turn
    /// does nothing. The thread starts with the first job; a job that panics is logged and the
    /// thread goes on with the next (and is started again should it ever be gone).
    ///
    /// # Errors
    /// When no thread can be started.
    pub(crate) fn optimize_later(&self, job: OptimizeJob) -> Result<(), String> {
        let mut slot = self
            .optimizer
            .lock()
            .map_err(|_| "the optimizer queue lock is poisoned".to_string())?;
        let job = match slot.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(()),
                // The thread is gone: start another.
                Err(std::sync::mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = std::sync::mpsc::channel::<OptimizeJob>();
        std::thread::Builder::new()
            .name("wasm-optimize".into())
            .spawn(move || {
                for job in rx {
                    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
                        let message = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        tracing::error!(%message, "compiling optimized code panicked; the plugin keeps its baseline code");
                    }
                }
            })
            .map_err(|e| format!("cannot start the optimizer thread: {e}"))?;
        tx.send(job)
            .map_err(|_| "the optimizer thread stopped at once".to_string())?;
        *slot = Some(tx);
        Ok(())
    }

    /// The engine that runs code of `tier`.
    pub(crate) fn engine_of(&self, tier: Tier) -> &Engine {
        match (tier, &self.baseline) {
            (Tier::Baseline, Some(baseline)) => baseline,
            _ => &self.engine,
        }
    }

    /// The linker of the engine that runs code of `tier`.
    pub(crate) fn linker_of(&self, tier: Tier) -> &Linker<CallState> {
        match (tier, &self.linkers.1) {
            (Tier::Baseline, Some(baseline)) => baseline,
            _ => &self.linkers.0,
        }
    }

    /// Whether plugins not in the cache are compiled with Winch first.
    pub(crate) fn tiering(&self) -> Tiering {
        if self.baseline.is_some() {
            self.config.tiering
        } else {
            Tiering::Optimized
        }
    }

    /// What the output policy lets plugins build past their parents' grants (`--allow`).
    pub fn allowances(&self) -> &Allowances {
        &self.config.allow
    }

    /// The allocator in use.
    pub fn allocator(&self) -> Allocator {
        self.allocator
    }

    /// What the pooling allocator keeps resident in slots no call uses now (`None` on demand).
    pub fn pool_resident(&self) -> Option<PoolResident> {
        let m = self.engine.pooling_allocator_metrics()?;
        Some(PoolResident {
            warm_memories: m.unused_warm_memories(),
            memory_bytes: m.unused_memory_bytes_resident(),
            table_bytes: m.unused_table_bytes_resident(),
        })
    }

    /// Counters of the calls made.
    pub fn stats(&self) -> &CallStats {
        &self.stats
    }

    pub(crate) fn guest_logs(&self) -> &crate::guest_log::GuestLogs {
        &self.guest_logs
    }

    /// What every plugin run on this engine logged so far (lines by level, dropped).
    pub fn guest_log_counts(&self) -> Vec<crate::guest_log::LogCounts> {
        self.guest_logs.counts()
    }

    pub(crate) fn count_call(&self, grows: u64) {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.stats.memory_grows.fetch_add(grows, Ordering::Relaxed);
    }

    /// The limits each call runs under.
    /// The gate every call passes (see [`CallGate`]).
    pub(crate) fn gate(&self) -> &CallGate {
        &self.gate
    }

    /// Calls that waited for one of the `max_concurrent_calls` slots, since the start.
    pub fn calls_waited(&self) -> u64 {
        self.gate.waited()
    }

    pub(crate) fn limits(&self) -> sandbox::Limits {
        sandbox::Limits {
            memory: self.config.memory_limit,
            deadline_ticks: self.deadline_ticks(),
            deadline: self.config.call_deadline,
        }
    }

    /// Epoch ticks for the call deadline (rounded up, at least 1).
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let ticks = self
            .config
            .call_deadline
            .as_nanos()
            .div_ceil(EPOCH_TICK.as_nanos());
        u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
    }
}
