//! The builder kinds and the contract versions (`slinky:builder@<version>`) a plugin may speak,
//! and what a plugin says about itself.

/// The current contract version: the one the host speaks and the guest SDK builds plugins against
/// (`slinky:builder@0.3.0`).
pub const CONTRACT_VERSION: &str = "0.3.0";
/// Every contract version this host loads plugins of, oldest first.
pub const SUPPORTED_CONTRACTS: [&str; 3] = ["0.1.0", "0.2.0", "0.3.0"];
/// The package every contract interface belongs to.
pub const PACKAGE: &str = "slinky:builder";

/// The builder kinds of `0.2.0` (every kind before `restapi-children`).
const V0_2_KINDS: [BuilderKind; 4] = [
    BuilderKind::ControllerService,
    BuilderKind::NodesetPod,
    BuilderKind::ControllerChildren,
    BuilderKind::NodesetChildren,
];

/// A contract version a plugin was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    /// `slinky:builder@0.1.0`: `controller-service` and `nodeset-pod`.
    V0_1,
    /// `slinky:builder@0.2.0`: adds `controller-children` and `nodeset-children`.
    V0_2,
    /// `slinky:builder@0.3.0`: adds `restapi-children`, `loginset-children` and
    /// `accounting-children`.
    V0_3,
}

impl Contract {
    /// Newest first: the order exports are looked for.
    pub const ALL: [Contract; 3] = [Contract::V0_3, Contract::V0_2, Contract::V0_1];

    /// The version text, e.g. `0.2.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
            Contract::V0_3 => "0.3.0",
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
            Contract::V0_2 => &V0_2_KINDS,
            Contract::V0_3 => &BuilderKind::ALL,
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
    /// RestApi + its Controller → the slurmrestd Deployment and Service.
    RestapiChildren,
    /// LoginSet + its Controller → the login Deployment, Service and `sshd_config` ConfigMap.
    LoginsetChildren,
    /// Accounting → the slurmdbd StatefulSet, Service and `slurmdbd.conf` Secret.
    AccountingChildren,
}

impl BuilderKind {
    /// Every kind, in the order `/plugins` and the metrics list them.
    pub const ALL: [BuilderKind; 7] = [
        BuilderKind::ControllerService,
        BuilderKind::NodesetPod,
        BuilderKind::ControllerChildren,
        BuilderKind::NodesetChildren,
        BuilderKind::RestapiChildren,
        BuilderKind::LoginsetChildren,
        BuilderKind::AccountingChildren,
    ];

    /// The WIT interface (and CLI) name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            BuilderKind::ControllerService => "controller-service",
            BuilderKind::NodesetPod => "nodeset-pod",
            BuilderKind::ControllerChildren => "controller-children",
            BuilderKind::NodesetChildren => "nodeset-children",
            BuilderKind::RestapiChildren => "restapi-children",
            BuilderKind::LoginsetChildren => "loginset-children",
            BuilderKind::AccountingChildren => "accounting-children",
        }
    }

    /// Its position in [`BuilderKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind of parent whose children it builds: `Controller`, `NodeSet`, `RestApi`,
    /// `LoginSet` or `Accounting`.
    pub fn parent(self) -> &'static str {
        match self {
            BuilderKind::ControllerService | BuilderKind::ControllerChildren => "Controller",
            BuilderKind::NodesetPod | BuilderKind::NodesetChildren => "NodeSet",
            BuilderKind::RestapiChildren => "RestApi",
            BuilderKind::LoginsetChildren => "LoginSet",
            BuilderKind::AccountingChildren => "Accounting",
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

/// How much a guest's log line matters (the contract's `log.level`, 0.3.0 on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// `trace`.
    Trace,
    /// `debug`.
    Debug,
    /// `info`.
    Info,
    /// `warn`.
    Warn,
    /// `error`.
    Error,
}

impl LogLevel {
    /// Its name, as `/metrics` labels it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in BuilderKind::ALL {
            assert_eq!(kind.as_str().parse::<BuilderKind>(), Ok(kind));
            assert_eq!(BuilderKind::ALL[kind.index()], kind);
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert!(
            "pods"
                .parse::<BuilderKind>()
                .is_err_and(|e| e.contains("nodeset-pod"))
        );
        assert_eq!(BuilderKind::NodesetChildren.parent(), "NodeSet");
        assert_eq!(BuilderKind::ControllerService.parent(), "Controller");
        assert_eq!(BuilderKind::AccountingChildren.parent(), "Accounting");
        assert_eq!(BuilderKind::LoginsetChildren.as_str(), "loginset-children");
    }

    #[test]
    fn versions_know_their_kinds_and_exports() {
        assert_eq!(Contract::V0_1.kinds().len(), 2);
        assert_eq!(Contract::V0_2.kinds().len(), 4);
        assert!(!Contract::V0_2.kinds().contains(&BuilderKind::RestapiChildren));
        assert_eq!(Contract::V0_3.kinds(), &BuilderKind::ALL);
        assert_eq!(
            Contract::V0_2.export_name("plugin"),
            "slinky:builder/plugin@0.2.0"
        );
        assert_eq!(Contract::ALL[0].as_str(), CONTRACT_VERSION);
        assert_eq!(
            SUPPORTED_CONTRACTS,
            [
                Contract::V0_1.as_str(),
                Contract::V0_2.as_str(),
                Contract::V0_3.as_str()
            ]
        );
    }
}
