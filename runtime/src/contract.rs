//! The builder contract as the runtime sees it: its versions, the builder kinds, what a plugin
//! says about itself, and which version a component speaks (read from its exports before
//! anything runs).

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

/// The contract version a component speaks, from its exports; refuse components that speak
/// another version or none, before anything runs.
pub(crate) fn check_contract(
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
    let prefix = format!("{PACKAGE}/");
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
