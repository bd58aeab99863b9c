//! The only `bindgen!` of the host: typed access to the exports of every contract version the
//! host loads, `slinky:builder@0.2.0` (current) and `slinky:builder@0.1.0` (frozen in
//! `wit/deps/builder@0.1.0`), and the host's own types they convert to.
//!
//! Each exported interface is loaded on its own (`GuestIndices`), so a plugin may export just the
//! builder kinds it implements, of either version.

#![allow(missing_docs, reason = "generated bindings")]

wasmtime::component::bindgen!({
    path: "../wit",
    inline: "
        package slinky:host-view;

        // The host's view of a plugin, not a plugin world: every export of every contract
        // version the host loads.
        world host {
            include slinky:builder/full-builder@0.2.0;
            export slinky:builder/plugin@0.1.0;
            export slinky:builder/controller-service@0.1.0;
            export slinky:builder/nodeset-pod@0.1.0;
        }
    ",
    world: "slinky:host-view/host",
});

/// The current contract (`slinky:builder@0.2.0`).
pub mod v2 {
    pub use super::{
        exports::slinky::builder0_2_0::{
            controller_children, controller_service, nodeset_children, nodeset_pod, plugin,
        },
        slinky::builder0_2_0::types,
    };
}

/// The first contract (`slinky:builder@0.1.0`), still loaded.
pub mod v1 {
    pub use super::{
        exports::slinky::builder0_1_0::{controller_service, nodeset_pod, plugin},
        slinky::builder0_1_0::types,
    };
}

/// The WIT records of the build context and pod identity, for each contract version (the
/// generated types differ per version; their fields are the same).
macro_rules! wit_records {
    ($($version:ident),+) => {$(
        impl $version::types::BuildContext {
            pub(crate) fn from_host(ctx: &crate::plugins::BuildContext) -> Self {
                Self {
                    cluster_domain: ctx.cluster_domain.clone(),
                }
            }
        }

        impl $version::types::PodIdentity {
            pub(crate) fn from_host(identity: &crate::plugins::PodIdentity) -> Self {
                Self {
                    ordinal: identity.ordinal,
                    name: identity.name.clone(),
                    hostname: identity.hostname.clone(),
                    revision: identity.revision.clone(),
                }
            }
        }
    )+};
}
wit_records!(v1, v2);

/// The contract version this host speaks (plugins it builds against, the SDK's version).
pub const CONTRACT_VERSION: &str = "0.2.0";
/// Every contract version this host loads plugins of, oldest first.
pub const SUPPORTED_CONTRACTS: [&str; 2] = ["0.1.0", "0.2.0"];
/// The package every contract interface belongs to.
pub const PACKAGE: &str = "slinky:builder";

/// A contract version a plugin was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    /// `slinky:builder@0.1.0`: `controller-service` and `nodeset-pod`.
    V0_1,
    /// `slinky:builder@0.2.0`: adds `controller-children` and `nodeset-children`.
    V0_2,
}

impl Contract {
    /// Newest first: the order exports are looked for.
    pub const ALL: [Contract; 2] = [Contract::V0_2, Contract::V0_1];

    /// The version text, e.g. `0.2.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
        }
    }

    /// The export name of a contract interface, e.g. `slinky:builder/plugin@0.2.0`.
    pub fn export_name(self, interface: &str) -> String {
        format!("{PACKAGE}/{interface}@{}", self.as_str())
    }

    /// The builder kinds this version has.
    pub fn kinds(self) -> &'static [BuilderKind] {
        match self {
            Contract::V0_1 => &[BuilderKind::ControllerService, BuilderKind::NodesetPod],
            Contract::V0_2 => &BuilderKind::ALL,
        }
    }
}

impl std::fmt::Display for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A builder kind: which children of which parent a builder makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BuilderKind {
    /// Controller → its slurmctld Service (`<controller>-controller`).
    ControllerService,
    /// NodeSet + Controller + pod identity → one slurmd Pod.
    NodesetPod,
    /// Controller → the slurmctld StatefulSet, the `slurm.conf` ConfigMap, the internal Service.
    ControllerChildren,
    /// NodeSet → the shared worker Service and PodDisruptionBudget, the SSH ConfigMap.
    NodesetChildren,
}

impl BuilderKind {
    /// Every kind, in the order `/plugins` and the metrics list them.
    pub const ALL: [BuilderKind; 4] = [
        BuilderKind::ControllerService,
        BuilderKind::NodesetPod,
        BuilderKind::ControllerChildren,
        BuilderKind::NodesetChildren,
    ];

    /// The WIT interface (and CLI) name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            BuilderKind::ControllerService => "controller-service",
            BuilderKind::NodesetPod => "nodeset-pod",
            BuilderKind::ControllerChildren => "controller-children",
            BuilderKind::NodesetChildren => "nodeset-children",
        }
    }

    /// Its position in [`BuilderKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind of parent whose children it builds: `Controller` or `NodeSet`.
    pub fn parent(self) -> &'static str {
        match self {
            BuilderKind::ControllerService | BuilderKind::ControllerChildren => "Controller",
            BuilderKind::NodesetPod | BuilderKind::NodesetChildren => "NodeSet",
        }
    }
}

impl std::fmt::Display for BuilderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BuilderKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BuilderKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown builder kind {s:?}; the kinds are {}",
                    BuilderKind::ALL.map(BuilderKind::as_str).join(", ")
                )
            })
    }
}

/// What a plugin says about itself (`describe()`, of any contract version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The plugin's name.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The builder kinds it says it exports.
    pub kinds: Vec<BuilderKind>,
    /// The contract version it says it speaks.
    pub contract_version: String,
}

impl From<v2::types::PluginInfo> for PluginInfo {
    fn from(i: v2::types::PluginInfo) -> Self {
        PluginInfo {
            name: i.name,
            version: i.version,
            kinds: i
                .kinds
                .into_iter()
                .map(|k| match k {
                    v2::types::BuilderKind::ControllerService => BuilderKind::ControllerService,
                    v2::types::BuilderKind::NodesetPod => BuilderKind::NodesetPod,
                    v2::types::BuilderKind::ControllerChildren => BuilderKind::ControllerChildren,
                    v2::types::BuilderKind::NodesetChildren => BuilderKind::NodesetChildren,
                })
                .collect(),
            contract_version: i.contract_version,
        }
    }
}

impl From<v1::types::PluginInfo> for PluginInfo {
    fn from(i: v1::types::PluginInfo) -> Self {
        PluginInfo {
            name: i.name,
            version: i.version,
            kinds: i
                .kinds
                .into_iter()
                .map(|k| match k {
                    v1::types::BuilderKind::ControllerService => BuilderKind::ControllerService,
                    v1::types::BuilderKind::NodesetPod => BuilderKind::NodesetPod,
                })
                .collect(),
            contract_version: i.contract_version,
        }
    }
}

/// The builder's error, of either version.
pub(crate) fn guest_error_v2(e: v2::types::BuildError) -> super::GuestError {
    match e {
        v2::types::BuildError::InvalidInput(m) => super::GuestError::InvalidInput(m),
        v2::types::BuildError::Unsupported(m) => super::GuestError::Unsupported(m),
        v2::types::BuildError::Internal(m) => super::GuestError::Internal(m),
    }
}

/// The builder's error of a 0.1.0 plugin.
pub(crate) fn guest_error_v1(e: v1::types::BuildError) -> super::GuestError {
    match e {
        v1::types::BuildError::InvalidInput(m) => super::GuestError::InvalidInput(m),
        v1::types::BuildError::Unsupported(m) => super::GuestError::Unsupported(m),
        v1::types::BuildError::Internal(m) => super::GuestError::Internal(m),
    }
}
