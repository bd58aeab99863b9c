//! # slinky-host
//!
//! A WebAssembly-pluggable reconciliation host for the Slinky (Slurm on Kubernetes) operator.
//! The host owns everything that must be correct under concurrency; *builders*, Wasm components
//! compiled against `wit/builder@0.3.0` (0.1.0 and 0.2.0 still load) (run by the `slinky-runtime` crate), decide what child
//! objects should exist, and only ever see copies of objects.

/// The Kubernetes client: kube's stack over HTTP/2 where the API server speaks it, its requests
/// counted.
pub mod client;
/// The command line: arguments and one module per command (`run`, `render`, `plugin check`, …).
pub mod cmd;
/// The embedded Kubernetes API server (the `slinky-apiserver` crate), behind the `embedded`
/// feature (off by default, never in the image): `run --embedded`, the `apiserver` subcommand
/// and the tests stand on it.
#[cfg(feature = "embedded")]
pub use slinky_apiserver as embedded;
/// The host's metrics: typed families recorded by the code that counts.
pub mod metrics;
/// Where plugin modules come from and whether to trust them (the `slinky-plugin-source`
/// crate): OCI references, pull by digest, push, cosign-compatible signatures, one digest store.
pub use slinky_plugin_source as oci;
/// The plugin runtime (the `slinky-runtime` crate): engine, loading, sandboxed calls, output
/// policy, bundled builders, registry and reload.
pub use slinky_runtime as plugins;
/// The reconcilers: caches, expectations, the writer, and one part per parent kind.
pub mod reconcile;
/// The NodeSet pod revision hash.
pub mod revision;
/// The HTTP endpoints: metrics, health, readiness and the admin endpoints.
pub mod serve;
/// Logging setup.
pub mod telemetry;

pub use plugins::{BuildContext, Plugin, PluginError, PluginRegistry, PodIdentity};
