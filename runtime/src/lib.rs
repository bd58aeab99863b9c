//! # slinky-runtime
//!
//! The plugin runtime of slinky-host: loading builder components, calling them in a fresh sandbox
//! per call, and checking what they return. It never calls the Kubernetes API: the host's
//! reconcilers hand it copies of objects and write what it returns.
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
//!
//! # Modules
//! * [`engine`](EngineHandle): the wasmtime engines (Cranelift, Winch), one linker each, the
//!   pooling allocator, epoch deadlines, the compiled-artifact cache and the optimizer thread.
//! * `plugin` ([`Plugin`]): loading, compile tiers, contract checks, `describe()`.
//! * `calls`: the builder calls, one path for every contract version; `bindings`: the one
//!   `bindgen!` and the per-version glue; `sandbox`: a call's store, limits and WASI context.
//! * [`policy`]: the output policy; [`bundled`]: the embedded builders and the
//!   [`PluginRegistry`]; [`reload`]: the plugin directory watcher.
//! * `pipeline` ([`Pipeline`], [`Step`]): a kind's base builder then the steps BuilderPlugins
//!   add, each with its settings and the previous step's output, checked step by step.

mod bindings;
mod builder;
pub mod bundled;
mod calls;
mod child;
mod contract;
mod engine;
mod error;
pub mod guest_log;
mod linker;
pub mod metrics;
mod module_bytes;
mod pipeline;
mod plugin;
pub mod policy;
pub mod registry;
pub mod reload;
mod sandbox;

pub use builder::Builder;
pub use child::{Child, ChildKind, MAX_CHILDREN, Ownership};
pub use engine::{
    Allocator, CallStats, CompileSource, DEFAULT_CONCURRENT_CALLS, DEFAULT_KEEP_RESIDENT, EngineHandle,
    PoolResident, RuntimeConfig, Tier, Tiering, default_cache_dir,
};
pub use error::{GuestError, PluginError, TrapCause};
pub use module_bytes::{digest, gunzip, gunzip_if_gzipped, with_custom_section};
pub use pipeline::{Pipeline, Step, vet_step};
pub use plugin::{Plugin, PluginSource};
pub use policy::{Allow, Allowances};
pub use registry::{ActiveInfo, PluginRegistry, RefusedVersion};

/// The builder contract's types (`slinky_api::contract`), the same the guest SDK gives plugin
/// authors: what a build call may know about the cluster (the WIT `build-context`), which pod of a
/// NodeSet to build (the WIT `pod-identity`), what a Controller's children are built from, the
/// contract versions and builder kinds, and what a plugin says about itself.
pub use slinky_api::contract::{
    AccountingInputs, BuildContext, BuilderKind, CONTRACT_VERSION, ConfigMapFiles, Contract,
    ControllerInputs, LoginSetInputs, PACKAGE, PluginInfo, PodIdentity, SUPPORTED_CONTRACTS,
};

/// The wasmtime version the host runs plugins on (pinned in the workspace manifest).
pub const WASMTIME_VERSION: &str = "48.0.8";

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
