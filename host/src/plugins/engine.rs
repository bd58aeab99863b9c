//! The one wasmtime `Engine` of the process: component model, epoch interruption driven by a
//! ticker thread, the pooling allocator (with an on-demand fallback), and a cache of precompiled
//! components keyed by the component's sha256 and the engine's compatibility hash.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, component::Component};

use super::PluginError;

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
    /// At most this many plugin calls run at once when pooling (instance slots).
    pub max_concurrent_calls: u32,
    /// Pooling: bytes of each linear memory (and table) kept resident between instances, reset
    /// with `memset` rather than decommitted: a reused slot takes no page faults for them.
    pub keep_resident: usize,
    /// Pooling on Linux 6.7+: reset only the pages an instance touched (`PAGEMAP_SCAN`); older
    /// kernels reset the resident part with `memset`.
    pub pagemap_scan: bool,
    /// Map the component's initial memory image copy-on-write instead of copying it.
    pub memory_init_cow: bool,
    /// Write `/tmp/perf-<pid>.map` so `perf record` names the guests' functions
    /// (`SLINKY_HOST_PLUGIN_PERF_MAP=1`).
    pub perf_map: bool,
}

/// Bytes of each pooled linear memory kept resident between calls (see
/// [`RuntimeConfig::keep_resident`]): more than a build touches (the bundled builders touch about
/// 2 MiB), so a call takes no page faults. Resident memory is bounded by what calls touched, at most
/// this much per instance slot in use.
pub const DEFAULT_KEEP_RESIDENT: usize = 16 << 20;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            call_deadline: Duration::from_secs(1),
            memory_limit: 64 << 20,
            cache_dir: default_cache_dir(),
            pooling: true,
            max_concurrent_calls: 64,
            keep_resident: DEFAULT_KEEP_RESIDENT,
            pagemap_scan: true,
            memory_init_cow: true,
            perf_map: std::env::var_os("SLINKY_HOST_PLUGIN_PERF_MAP").is_some_and(|v| v == "1"),
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

/// The engine plus what goes with it: ticker, compiled-component caches.
pub struct EngineHandle {
    pub(crate) engine: Engine,
    pub(crate) config: RuntimeConfig,
    allocator: Allocator,
    compat: String,
    compiled: Mutex<HashMap<String, Component>>,
    ticker_stop: Arc<AtomicBool>,
    stats: CallStats,
}

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

impl EngineHandle {
    /// Create the engine.
    ///
    /// # Errors
    /// [`PluginError::Engine`] when wasmtime cannot create an engine even without pooling.
    pub fn new(config: RuntimeConfig) -> Result<Arc<Self>, PluginError> {
        let (engine, allocator) = if config.pooling {
            let mut pool = PoolingAllocationConfig::default();
            let slots = config.max_concurrent_calls.max(1);
            pool.total_component_instances(slots)
                .total_core_instances(slots * 8)
                .total_memories(slots * 4)
                .total_tables(slots * 8)
                .max_memory_size(config.memory_limit)
                .linear_memory_keep_resident(config.keep_resident)
                .table_keep_resident(config.keep_resident.min(1 << 20))
                .pagemap_scan(if config.pagemap_scan {
                    wasmtime::Enabled::Auto
                } else {
                    wasmtime::Enabled::No
                });
            let mut pooled = base_config(&config);
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
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let compat = format!("{:016x}", hasher.finish());

        let ticker_stop = Arc::new(AtomicBool::new(false));
        let (weak_engine, stop) = (engine.weak(), ticker_stop.clone());
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match weak_engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| PluginError::Engine(format!("cannot start the epoch thread: {e}")))?;
        Ok(Arc::new(EngineHandle {
            engine,
            config,
            allocator,
            compat,
            compiled: Mutex::new(HashMap::new()),
            ticker_stop,
            stats: CallStats::default(),
        }))
    }

    fn on_demand(config: &RuntimeConfig) -> Result<Engine, PluginError> {
        Engine::new(&base_config(config)).map_err(|e| PluginError::Engine(format!("{e:#}")))
    }

    /// The allocator in use.
    pub fn allocator(&self) -> Allocator {
        self.allocator
    }

    /// Counters of the calls made.
    pub fn stats(&self) -> &CallStats {
        &self.stats
    }

    pub(crate) fn count_call(&self, grows: u64) {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.stats.memory_grows.fetch_add(grows, Ordering::Relaxed);
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

    /// The compiled component for `bytes` (digest `digest`): from memory, else from the disk
    /// cache, else compiled (and stored in the disk cache).
    ///
    /// # Errors
    /// [`PluginError::Compile`] when the bytes are not a valid component.
    pub fn component(
        &self,
        name: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, CompileSource), PluginError> {
        if let Some(c) = self.compiled.lock().map_err(poisoned)?.get(digest) {
            return Ok((c.clone(), CompileSource::Memory));
        }
        let cached = self.cache_path(digest);
        let (component, source) = match cached.as_deref().and_then(|p| self.load_cached(p)) {
            Some(c) => (c, CompileSource::Disk),
            None => {
                let precompiled =
                    self.engine
                        .precompile_component(bytes)
                        .map_err(|e| PluginError::Compile {
                            plugin: name.to_string(),
                            reason: format!("{e:#}"),
                        })?;
                if let Some(path) = &cached {
                    store_cached(path, &precompiled);
                }
                (self.deserialize(&precompiled, name)?, CompileSource::Compiled)
            }
        };
        self.compiled
            .lock()
            .map_err(poisoned)?
            .insert(digest.to_string(), component.clone());
        Ok((component, source))
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.config.cache_dir.as_ref()?;
        Some(dir.join(format!("{digest}-{}.cwasm", self.compat)))
    }

    /// Load a cached artifact. It is read into memory rather than mapped: a file truncated under
    /// a mapping would crash the process (SIGBUS), a read copy can only fail to deserialize.
    fn load_cached(&self, path: &Path) -> Option<Component> {
        let bytes = std::fs::read(path).ok()?;
        match self.deserialize(&bytes, &path.display().to_string()) {
            Ok(c) => Some(c),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "discarding unusable precompiled component");
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    #[allow(
        unsafe_code,
        reason = "deserializing artifacts of our own engine; see the safety note"
    )]
    fn deserialize(&self, precompiled: &[u8], name: &str) -> Result<Component, PluginError> {
        // SAFETY: `precompiled` was produced by `precompile_component` of this engine, or of an
        // engine with the same compatibility hash (it is in the cache file's name), and stored
        // atomically (unique temp file + rename) in the host's private cache directory. wasmtime
        // checks the header and refuses artifacts of another version or configuration.
        unsafe { Component::deserialize(&self.engine, precompiled) }.map_err(|e| PluginError::Compile {
            plugin: name.to_string(),
            reason: format!("{e:#}"),
        })
    }
}

/// Where a compiled component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileSource {
    /// Already compiled in this process.
    Memory,
    /// Loaded from the precompiled-artifact cache.
    Disk,
    /// Compiled now.
    Compiled,
}

fn store_cached(path: &Path, bytes: &[u8]) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp.{}.{unique}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    };
    if let Err(error) = write() {
        tracing::warn!(path = %path.display(), %error, "cannot store the precompiled component (continuing)");
    }
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> PluginError {
    PluginError::Engine("the compiled-component cache lock is poisoned".into())
}
