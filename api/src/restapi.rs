//! The RestApi kind (slurmrestd): its spec, status and the names derived from it.

use k8s_openapi::{api::core::v1::LocalObjectReference, apimachinery::pkg::apis::meta::v1::Condition};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ContainerWrapper, PodTemplate, ServiceSpec, checks::SpecProblem, is_default};

/// `spec` of a Slinky RestApi (slurmrestd): a Deployment of slurmrestd and its Service on 6820,
/// for the Controller it references (in its own namespace).
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "slinky.slurm.net",
    version = "v1beta1",
    kind = "RestApi",
    namespaced,
    status = "RestApiStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "slurmrestd",
    category = "slurm",
    printcolumn(name = "Controller", type_ = "string", json_path = ".spec.controllerRef.name"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    crates(
        kube_core = "::kube_core",
        k8s_openapi = "::k8s_openapi",
        schemars = "::schemars",
        serde = "::serde",
        serde_json = "::serde_json"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RestApiSpec {
    /// The Controller (same namespace) whose slurmctld this slurmrestd serves.
    pub controller_ref: LocalObjectReference,
    /// slurmrestd replicas (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The slurmrestd container.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub slurmrestd: ContainerWrapper,
    /// Pod template.
    #[serde(default, skip_serializing_if = "is_default")]
    pub template: PodTemplate,
    /// The Service customisation.
    #[serde(default, skip_serializing_if = "is_default")]
    pub service: ServiceSpec,
}

/// `status` of a RestApi.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestApiStatus {
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `BuilderFailed`, `InvalidSpec`, `ChildFailure`,
    /// `ControllerNotFound`; other writers' too): a list map keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// slurmrestd's port.
pub const SLURMRESTD_PORT: i32 = 6820;

impl RestApi {
    /// `<name>-restapi`: the Deployment and the Service.
    pub fn restapi_key(&self) -> String {
        restapi_key(self.metadata.name.as_deref().unwrap_or_default())
    }

    /// slurmrestd replicas (`spec.replicas`, default 1).
    pub fn replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1)
    }

    /// What is wrong with the spec as the host serves it (empty when nothing).
    pub fn spec_problems(&self) -> Vec<SpecProblem> {
        let mut out = Vec::new();
        if self.spec.controller_ref.name.is_empty() {
            out.push(SpecProblem::new(
                "spec.controllerRef.name",
                "Required value: name the Controller this slurmrestd serves",
            ));
        }
        if let Some(r) = self.spec.replicas
            && r < 0
        {
            out.push(SpecProblem::new(
                "spec.replicas",
                format!("Invalid value: {r}: must be greater than or equal to 0"),
            ));
        }
        out
    }
}

/// `<restapi>-restapi`: the name of a RestApi's Deployment and Service (Slinky's `Key()`).
pub fn restapi_key(restapi: &str) -> String {
    format!("{restapi}-restapi")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_defaults_are_slinkys() -> Result<(), serde_json::Error> {
        let r: RestApi = serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "RestApi",
            "metadata": {"name": "slurm", "namespace": "slurm"},
            "spec": {"controllerRef": {"name": "slurm"}},
        }))?;
        assert_eq!(r.restapi_key(), "slurm-restapi");
        assert_eq!(r.replicas(), 1);
        assert!(r.spec_problems().is_empty());
        let mut bad = r.clone();
        bad.spec.controller_ref.name.clear();
        bad.spec.replicas = Some(-1);
        let problems: Vec<String> = bad.spec_problems().iter().map(ToString::to_string).collect();
        assert!(
            problems[0].starts_with("spec.controllerRef.name: Required value"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("spec.replicas: Invalid value: -1"),
            "{problems:?}"
        );
        Ok(())
    }
}
