//! The children builder kinds of contract 0.2.0: a builder returns the list of objects a parent
//! should have, the host applies them (server-side apply) and deletes the ones it built before
//! and that are no longer in the list.

use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{ConfigMap, Service},
    policy::v1::PodDisruptionBudget,
};
use slinky_api::{Controller, NodeSet};

use crate::{BuildContext, BuildError};

/// One child object a children builder returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Child {
    /// A `v1 ConfigMap`.
    ConfigMap(Box<ConfigMap>),
    /// A `v1 Service`.
    Service(Box<Service>),
    /// An `apps/v1 StatefulSet`.
    StatefulSet(Box<StatefulSet>),
    /// A `policy/v1 PodDisruptionBudget`.
    PodDisruptionBudget(Box<PodDisruptionBudget>),
    /// Any object as JSON (with `apiVersion` and `kind`): the host's output policy decides, and
    /// refuses what the builder kind may not return (a Secret, a cluster-scoped object, …).
    Json(Box<serde_json::Value>),
}

impl Child {
    /// `metadata.name` (empty when unset).
    pub fn name(&self) -> &str {
        let meta = match self {
            Child::ConfigMap(o) => &o.metadata,
            Child::Service(o) => &o.metadata,
            Child::StatefulSet(o) => &o.metadata,
            Child::PodDisruptionBudget(o) => &o.metadata,
            Child::Json(v) => {
                return v
                    .pointer("/metadata/name")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default();
            }
        };
        meta.name.as_deref().unwrap_or_default()
    }

    /// The Kubernetes kind, e.g. `StatefulSet`.
    pub fn kind(&self) -> &str {
        match self {
            Child::ConfigMap(_) => "ConfigMap",
            Child::Service(_) => "Service",
            Child::StatefulSet(_) => "StatefulSet",
            Child::PodDisruptionBudget(_) => "PodDisruptionBudget",
            Child::Json(v) => v
                .get("kind")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default(),
        }
    }

    /// The ConfigMap, if this is one.
    pub fn as_config_map(&self) -> Option<&ConfigMap> {
        match self {
            Child::ConfigMap(o) => Some(o),
            _ => None,
        }
    }

    /// The Service, if this is one.
    pub fn as_service(&self) -> Option<&Service> {
        match self {
            Child::Service(o) => Some(o),
            _ => None,
        }
    }

    /// The StatefulSet, if this is one.
    pub fn as_stateful_set(&self) -> Option<&StatefulSet> {
        match self {
            Child::StatefulSet(o) => Some(o),
            _ => None,
        }
    }

    /// The PodDisruptionBudget, if this is one.
    pub fn as_pod_disruption_budget(&self) -> Option<&PodDisruptionBudget> {
        match self {
            Child::PodDisruptionBudget(o) => Some(o),
            _ => None,
        }
    }

    /// As JSON text (with `apiVersion` and `kind`), as the host receives it.
    ///
    /// # Errors
    /// A serializer failure (not expected for built objects).
    pub fn to_json(&self) -> Result<String, BuildError> {
        match self {
            Child::ConfigMap(o) => crate::to_json(o),
            Child::Service(o) => crate::to_json(o),
            Child::StatefulSet(o) => crate::to_json(o),
            Child::PodDisruptionBudget(o) => crate::to_json(o),
            Child::Json(v) => crate::to_json(v),
        }
    }

    /// Parse a child from JSON text by its `apiVersion` and `kind` ([`Child::Json`] for another
    /// kind).
    ///
    /// # Errors
    /// [`BuildError::Internal`] for text that is not JSON, or not a valid object of its kind.
    pub fn from_json(json: &str) -> Result<Child, BuildError> {
        let value: serde_json::Value = crate::from_json("child", json)?;
        let field = |f: &str| {
            value
                .get(f)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let bad = |e: serde_json::Error| BuildError::Internal(format!("cannot parse a child: {e}"));
        Ok(match (field("apiVersion").as_str(), field("kind").as_str()) {
            ("v1", "ConfigMap") => Child::ConfigMap(Box::new(serde_json::from_value(value).map_err(bad)?)),
            ("v1", "Service") => Child::Service(Box::new(serde_json::from_value(value).map_err(bad)?)),
            ("apps/v1", "StatefulSet") => {
                Child::StatefulSet(Box::new(serde_json::from_value(value).map_err(bad)?))
            }
            ("policy/v1", "PodDisruptionBudget") => {
                Child::PodDisruptionBudget(Box::new(serde_json::from_value(value).map_err(bad)?))
            }
            _ => Child::Json(Box::new(value)),
        })
    }
}

impl From<ConfigMap> for Child {
    fn from(o: ConfigMap) -> Self {
        Child::ConfigMap(Box::new(o))
    }
}

impl From<Service> for Child {
    fn from(o: Service) -> Self {
        Child::Service(Box::new(o))
    }
}

impl From<StatefulSet> for Child {
    fn from(o: StatefulSet) -> Self {
        Child::StatefulSet(Box::new(o))
    }
}

impl From<PodDisruptionBudget> for Child {
    fn from(o: PodDisruptionBudget) -> Self {
        Child::PodDisruptionBudget(Box::new(o))
    }
}

/// A ConfigMap a Controller references, by the files it provides (its keys, sorted): never their
/// content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigMapFiles {
    /// The ConfigMap's name.
    pub name: String,
    /// Its keys (`data` and `binaryData`), sorted.
    pub files: Vec<String>,
}

/// What the host read from the cluster for a Controller's children. Builders never see Secret
/// data: only Slinky's hashes of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControllerInputs {
    /// The NodeSets that reference the Controller, sorted by name.
    pub nodesets: Vec<NodeSet>,
    /// `slinky.slurm.net/slurm-key-hash`: sha256 (hex) of the Slurm key Secret's values in key
    /// order (Slinky's `CheckSumFromMap`); empty for an external Controller.
    pub slurm_key_hash: String,
    /// `slinky.slurm.net/jwt-key-hash`: the same over the JWT key Secret.
    pub jwt_key_hash: String,
    /// Every ConfigMap the Controller references, each once, sorted by name.
    pub config_maps: Vec<ConfigMapFiles>,
}

impl ControllerInputs {
    /// The files ConfigMap `name` provides (none when it is not among the inputs).
    pub fn files_of(&self, name: &str) -> &[String] {
        self.config_maps
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.files.as_slice())
            .unwrap_or_default()
    }
}

/// Builds a Controller's children other than its Service (Slinky's slurmctld StatefulSet,
/// `<controller>-config` and `<controller>-controller-internal`). Implement it and export it
/// with [`crate::export_plugin!`]; [`crate::slinky::build_controller_children`] is Slinky's.
///
/// # Guarantees and caveats
/// The host calls this with copies, in a fresh sandbox per call; the call must be idempotent and
/// safe to cancel. Every object must be in the Controller's namespace and named
/// `<controller>-…`; the host sets owner references and the builder annotations, applies every
/// object, and deletes the objects it built earlier that the list no longer has.
pub trait ControllerChildrenBuilder {
    /// Build the children of `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid Controller or an unsupported request.
    fn build_controller_children(
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, BuildError>;
}

/// Builds a NodeSet's children other than its pods (Slinky's workers' Service and
/// PodDisruptionBudget, shared by the Controller's NodeSets, and the SSH ConfigMap). Implement it
/// and export it with [`crate::export_plugin!`]; [`crate::slinky::build_nodeset_children`] is
/// Slinky's.
///
/// # Guarantees and caveats
/// As [`ControllerChildrenBuilder`]. The objects named `slurm-workers-<controller>` (Service) and
/// `slurm-workers-pdb-<controller>` (PodDisruptionBudget) are shared: the host makes every
/// NodeSet of the Controller their owner. Every other object must be named `<nodeset>-…`.
pub trait NodeSetChildrenBuilder {
    /// Build the children of `nodeset`, whose Controller is `controller`.
    ///
    /// # Errors
    /// [`BuildError`] for an invalid NodeSet or an unsupported request.
    fn build_nodeset_children(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError>;
}
