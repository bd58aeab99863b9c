//! The only `bindgen!` of the host: typed access to the `slinky:builder@0.1.0` exports.
//!
//! Each exported interface is loaded on its own (`GuestIndices`), so a plugin may export just the
//! builder kinds it implements.

#![allow(missing_docs, reason = "generated bindings")]

wasmtime::component::bindgen!({
    world: "full-builder",
    path: "../wit",
});

pub use exports::slinky::builder::{controller_service, nodeset_pod, plugin};
pub use slinky::builder::types::{BuildContext, BuildError, BuilderKind, PluginInfo, PodIdentity};

/// The contract version this host speaks.
pub const CONTRACT_VERSION: &str = "0.1.0";
/// The package every contract interface belongs to.
pub const PACKAGE: &str = "slinky:builder";

/// The export name of a contract interface, e.g. `slinky:builder/plugin@0.1.0`.
pub fn export_name(interface: &str) -> String {
    format!("{PACKAGE}/{interface}@{CONTRACT_VERSION}")
}

impl BuilderKind {
    /// The WIT interface (and CLI) name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            BuilderKind::ControllerService => "controller-service",
            BuilderKind::NodesetPod => "nodeset-pod",
        }
    }
}

impl std::fmt::Display for BuilderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
