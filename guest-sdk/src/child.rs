//! One child object of the children builders (contract 0.2.0 on): a builder returns the list of
//! objects a parent should have, the host applies them (server-side apply) and deletes the ones
//! it built before and that are no longer in the list.

use crate::BuildError;
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{ConfigMap, Secret, Service},
    policy::v1::PodDisruptionBudget,
};

/// One child object a children builder returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Child {
    /// A `v1 ConfigMap`.
    ConfigMap(Box<ConfigMap>),
    /// A `v1 Service`.
    Service(Box<Service>),
    /// An `apps/v1 StatefulSet`.
    StatefulSet(Box<StatefulSet>),
    /// An `apps/v1 Deployment` (a RestApi's slurmrestd, contract 0.3.0 on).
    Deployment(Box<Deployment>),
    /// A `policy/v1 PodDisruptionBudget`.
    PodDisruptionBudget(Box<PodDisruptionBudget>),
    /// A `v1 Secret` (an Accounting's `slurmdbd.conf`, contract 0.3.0 on): `stringData` only,
    /// with `${secretKeyRef:<name>/<key>}` where a Secret value the builder may not see goes
    /// ([`crate::api::contract::secret_refs::placeholder`]).
    Secret(Box<Secret>),
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
            Child::Deployment(o) => &o.metadata,
            Child::PodDisruptionBudget(o) => &o.metadata,
            Child::Secret(o) => &o.metadata,
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
            Child::Deployment(_) => "Deployment",
            Child::PodDisruptionBudget(_) => "PodDisruptionBudget",
            Child::Secret(_) => "Secret",
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

    /// The Deployment, if this is one.
    pub fn as_deployment(&self) -> Option<&Deployment> {
        match self {
            Child::Deployment(o) => Some(o),
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

    /// The Secret, if this is one.
    pub fn as_secret(&self) -> Option<&Secret> {
        match self {
            Child::Secret(o) => Some(o),
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
            Child::Deployment(o) => crate::to_json(o),
            Child::PodDisruptionBudget(o) => crate::to_json(o),
            Child::Secret(o) => crate::to_json(o),
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
            ("v1", "Secret") => Child::Secret(Box::new(serde_json::from_value(value).map_err(bad)?)),
            ("apps/v1", "StatefulSet") => {
                Child::StatefulSet(Box::new(serde_json::from_value(value).map_err(bad)?))
            }
            ("apps/v1", "Deployment") => {
                Child::Deployment(Box::new(serde_json::from_value(value).map_err(bad)?))
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

impl From<Deployment> for Child {
    fn from(o: Deployment) -> Self {
        Child::Deployment(Box::new(o))
    }
}

impl From<Secret> for Child {
    fn from(o: Secret) -> Self {
        Child::Secret(Box::new(o))
    }
}

impl From<PodDisruptionBudget> for Child {
    fn from(o: PodDisruptionBudget) -> Self {
        Child::PodDisruptionBudget(Box::new(o))
    }
}
