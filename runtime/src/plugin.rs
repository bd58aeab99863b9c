//! A loaded plugin: how it is loaded (compile tiers, contract checks, `describe()`), the code it
//! runs (baseline, then optimized), and what it says about itself.

use crate::Builder as _;
use std::{path::PathBuf, sync::Arc, time::Duration};

use wasmtime::component::InstancePre;

use crate::{
    BuildContext, BuilderKind, CONTRACT_VERSION, CompileSource, Contract, EngineHandle, PluginError,
    PluginInfo, Tier, Tiering,
    bindings::{self, Exports, exports_of},
    contract::check_contract,
    module_bytes::{digest, gunzip},
    sandbox::{CallState, instantiate, log_output, trap_error},
};

mod examples;

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Embedded in the host binary.
    Bundled,
    /// A file.
    File(PathBuf),
    /// A `BuilderPlugin` custom resource: its name and where its module came from (an OCI
    /// reference or a ConfigMap).
    Resource {
        /// The `BuilderPlugin`'s name.
        name: String,
        /// Where its module came from.
        module: String,
    },
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Bundled => f.write_str("bundled"),
            PluginSource::File(p) => write!(f, "{}", p.display()),
            PluginSource::Resource { name, module } => write!(f, "BuilderPlugin {name} ({module})"),
        }
    }
}

/// A loaded, validated plugin: ready to serve builds. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

pub(crate) struct PluginInner {
    info: PluginInfo,
    contract: Contract,
    digest: String,
    source: PluginSource,
    pub(crate) engine: Arc<EngineHandle>,
    /// The code calls run: baseline first when tiered, then replaced once by the optimized code.
    code: std::sync::RwLock<Arc<Code>>,
}

/// A plugin's compiled code in one tier, linked and ready to instantiate.
pub(crate) struct Code {
    tier: Tier,
    compiled_from: CompileSource,
    compile_time: Duration,
    /// The engine that compiled it (stores must be of the same engine).
    pub(crate) engine: wasmtime::Engine,
    pub(crate) pre: InstancePre<CallState>,
    pub(crate) exports: Exports,
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
    /// Link `component` (compiled for code of `tier`, speaking `contract`) with the engine's one
    /// linker of that tier.
    fn new(
        engine: &EngineHandle,
        component: &wasmtime::component::Component,
        contract: Contract,
        tier: Tier,
        compiled: (CompileSource, Duration),
        refused: &impl Fn(String) -> PluginError,
    ) -> Result<Linked, PluginError> {
        let pre = engine
            .linker_of(tier)
            .instantiate_pre(component)
            .map_err(|e| refused(format!("it imports something this host does not provide: {e:#}")))?;
        Ok(Linked {
            tier,
            compiled,
            engine: engine.engine_of(tier).clone(),
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
    pub fn load_unoptimized(
        engine: &Arc<EngineHandle>,
        bytes: &[u8],
        source: PluginSource,
    ) -> Result<Plugin, PluginError> {
        Self::load_unoptimized_as(engine, bytes, digest(bytes), source)
    }

    /// A bundled builder (its digest computed by the build): with its optimized code in the
    /// cache, none of its bytes but the header are read.
    ///
    /// # Errors
    /// As [`Plugin::load_file`].
    pub(crate) fn load_bundled(
        engine: &Arc<EngineHandle>,
        kind: crate::BuilderKind,
    ) -> Result<Plugin, PluginError> {
        let bytes = crate::bundled::bundled_bytes(kind);
        let digest = crate::bundled::bundled_digest(kind).to_string();
        let plugin = Self::load_unoptimized_as(engine, bytes, digest, PluginSource::Bundled)?;
        plugin.optimize_in_background(bytes);
        Ok(plugin)
    }

    /// [`Plugin::load_unoptimized`] of bytes whose sha256 is `digest`.
    fn load_unoptimized_as(
        engine: &Arc<EngineHandle>,
        bytes: &[u8],
        digest: String,
        source: PluginSource,
    ) -> Result<Plugin, PluginError> {
        let label = source.to_string();
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
            engine,
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
    pub fn optimize_in_background(&self, bytes: &[u8]) {
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
            let outcome = compiled
                .and_then(|(component, from)| plugin.optimized_code(&component, from, compile_time))
                .and_then(|code| plugin.check_optimized(code));
            match outcome {
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

    fn optimized_code(
        &self,
        component: &wasmtime::component::Component,
        from: CompileSource,
        compile_time: Duration,
    ) -> Result<Code, PluginError> {
        let engine = &self.inner.engine;
        let label = self.label();
        let refused = |reason: String| PluginError::Refused {
            plugin: label.clone(),
            reason,
        };
        let contract = check_contract(&engine.engine, component).map_err(&refused)?;
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

    pub(crate) fn code(&self) -> Arc<Code> {
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

    /// The names the component imports and exports (WIT interfaces such as
    /// `wasi:cli/environment@0.2.0`): the Wasm OCI config's `component`.
    pub fn interfaces(&self) -> (Vec<String>, Vec<String>) {
        let code = self.code();
        let ty = code.pre.component().component_type();
        let imports = ty.imports(&code.engine).map(|(n, _)| n.to_string()).collect();
        let exports = ty.exports(&code.engine).map(|(n, _)| n.to_string()).collect();
        (imports, exports)
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

    /// The contract version the plugin was built against.
    pub fn contract(&self) -> Contract {
        self.inner.contract
    }
}

/// Call `describe()` on a fresh instance of `pre`, in a sandbox like any call.
fn describe(
    engine: &Arc<EngineHandle>,
    wasm_engine: &wasmtime::Engine,
    pre: &InstancePre<CallState>,
    contract: Contract,
    label: &str,
) -> Result<PluginInfo, PluginError> {
    let limits = engine.limits();
    // A slot like any call: with the pool's slots all taken by builds, describe() waits rather
    // than failing to instantiate (which would refuse a reload or drop a tier-up).
    let _slot = engine.gate().enter();
    let (mut store, instance) = instantiate(&limits, wasm_engine, pre, label, "describe")?;
    let described = bindings::call_describe(&mut store, &instance, pre, contract);
    let info = described.map_err(|e| trap_error(label, "describe", e, &store, &limits))?;
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
