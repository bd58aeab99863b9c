//! Parts both kinds' specs embed: a pod template, labels-and-annotations metadata, a Service
//! customisation.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{PodSpecWrapper, ServiceSpecWrapper};

/// A PodTemplate as Slinky embeds it: labels/annotations and a full (partial-allowed) PodSpec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations merged into the built pod.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// A PodSpec merged over the builder's base spec.
    #[serde(default, skip_serializing_if = "PodSpecWrapper::is_empty")]
    pub spec: PodSpecWrapper,
}

/// Labels and annotations only (Slinky's template and service metadata).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Metadata {
    /// True when there are neither labels nor annotations.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// A Service customisation: metadata, a ServiceSpec base, and the operator port's number.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Labels and annotations for the Service.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// The user's ServiceSpec: the base the operator's selector and port are merged into.
    #[serde(default, skip_serializing_if = "ServiceSpecWrapper::is_empty")]
    pub spec: ServiceSpecWrapper,
    /// The service port (defaults to the daemon's port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// The node port, for NodePort and LoadBalancer services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<i32>,
}
