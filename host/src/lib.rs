//! # slinky-host
//!
//! A WebAssembly-pluggable reconciliation host for the Slinky (Slurm on Kubernetes) operator.
//! The host owns everything that must be correct under concurrency; *builders*, Wasm components
//! compiled against `wit/builder.wit`, decide what child objects should exist, and only ever see
//! copies of objects.

pub mod check;
pub mod cli;
pub mod crds;
/// The embedded Kubernetes API server (the `slinky-apiserver` crate), behind the default
/// `embedded` feature: `run --embedded`, the `apiserver` subcommand and the tests stand on it.
#[cfg(feature = "embedded")]
pub use slinky_apiserver as embedded;
pub mod manifests;
pub mod metrics;
/// The plugin runtime (the `slinky-runtime` crate): engine, loading, sandboxed calls, output
/// policy, bundled builders, registry and reload.
pub use slinky_runtime as plugins;
pub mod reconcile;
pub mod render;
pub mod revision;
pub mod run;
pub mod scaffold;
pub mod serve;
pub mod telemetry;

pub use plugins::{BuildContext, Plugin, PluginError, PluginRegistry, PodIdentity};
