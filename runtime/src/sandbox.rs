//! The sandbox of one call: a fresh `Store` with a WASI context that grants nothing (frozen
//! clocks, seeded randomness, no files, environment or sockets), a memory cap, a deadline and
//! bounded stdout/stderr; and what a trap becomes.

use std::time::Duration;

use wasmtime::{
    ResourceLimiter, Store,
    component::{InstancePre, ResourceTable},
};
use wasmtime_wasi::{Deterministic, WasiCtx, WasiCtxView, WasiView, p2::pipe::MemoryOutputPipe};

use crate::{PluginError, TrapCause};

/// The data of one call's `Store`.
pub(crate) struct CallState {
    /// The guest's log lines (the `log` import).
    pub(crate) log: crate::guest_log::CallLog,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: CallLimits,
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

/// The most linear memories (and core instances) one call may make: a builder has one or two.
const MAX_MEMORIES: usize = 8;
/// The most core instances one call may make (a component's modules, its adapters and shims).
const MAX_INSTANCES: usize = 64;

/// Caps linear memory (and tables), across every memory a call makes, and remembers whether the
/// cap was hit.
pub(crate) struct CallLimits {
    memory: usize,
    /// Bytes of every memory of the call together.
    total: usize,
    hit: bool,
    /// The size of a memory refused when it was created (its initial size above the cap).
    initial_above_cap: Option<usize>,
    /// `memory_growing` calls (memory creation at instantiation included).
    pub(crate) grows: u64,
}

impl ResourceLimiter for CallLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grows += 1;
        let total = self.total.saturating_sub(current).saturating_add(desired);
        let ok = total <= self.memory;
        self.hit |= !ok;
        if ok {
            self.total = total;
        } else if current == 0 && desired > self.memory {
            // One memory alone starts above the cap (not many together).
            self.initial_above_cap = Some(desired);
        }
        Ok(ok)
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
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
pub(crate) const OUTPUT_CAP: usize = 64 << 10;

/// The limits every call runs under (from the engine's configuration).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Linear memory cap (bytes).
    pub(crate) memory: usize,
    /// Epoch ticks before the call is interrupted.
    pub(crate) deadline_ticks: u64,
    /// The deadline those ticks stand for (for the error message).
    pub(crate) deadline: Duration,
}

/// A fresh store and instance, with the deadline and memory cap set before instantiation.
pub(crate) fn instantiate(
    limits: &Limits,
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
        log: Default::default(),
        wasi,
        table: ResourceTable::new(),
        limits: CallLimits {
            memory: limits.memory,
            total: 0,
            hit: false,
            initial_above_cap: None,
            grows: 0,
        },
        stdout,
        stderr,
    };
    let mut store = Store::new(wasm_engine, state);
    store.limiter(|s| &mut s.limits);
    store.set_epoch_deadline(limits.deadline_ticks);
    store.epoch_deadline_trap();
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| trap_error(label, call, e, &store, limits))?;
    Ok((store, instance))
}

fn stdio(store: &Store<CallState>) -> (String, String) {
    let read = |pipe: &MemoryOutputPipe| String::from_utf8_lossy(&pipe.contents()).into_owned();
    (read(&store.data().stdout), read(&store.data().stderr))
}

pub(crate) fn log_output(label: &str, call: &str, store: &Store<CallState>) {
    let (out, err) = stdio(store);
    for line in out.lines().chain(err.lines()) {
        tracing::info!(plugin = label, call, "guest: {line}");
    }
}

/// What a failed call becomes: the cause (initial memory above the cap, the cap, the deadline, or
/// another trap) with the guest's stderr.
pub(crate) fn trap_error(
    label: &str,
    call: &'static str,
    error: wasmtime::Error,
    store: &Store<CallState>,
    limits: &Limits,
) -> PluginError {
    let seen = &store.data().limits;
    let cause = if let Some(initial) = seen.initial_above_cap {
        TrapCause::InitialMemoryAboveCap {
            initial,
            cap: limits.memory,
        }
    } else if seen.hit {
        TrapCause::MemoryCap(limits.memory)
    } else if matches!(
        error.downcast_ref::<wasmtime::Trap>(),
        Some(wasmtime::Trap::Interrupt)
    ) {
        TrapCause::Deadline(limits.deadline)
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
