//! The LoginSet kind (login nodes: sshd and sackd): its spec, status and the names derived from
//! it.

use k8s_openapi::{
    api::{
        apps::v1::DeploymentStrategy,
        core::v1::{LocalObjectReference, SecretKeySelector},
    },
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ContainerWrapper, PodTemplate, ServiceSpec, checks::SpecProblem, is_default, wrappers};

/// sshd's port on a login pod.
pub const LOGIN_SSH_PORT: i32 = 22;
/// The files of a LoginSet's host-key Secret (`<loginset>-ssh-host-keys`), as Slinky names them.
pub const SSH_HOST_KEY_FILES: [&str; 6] = [
    "ssh_host_ecdsa_key",
    "ssh_host_ecdsa_key.pub",
    "ssh_host_ed25519_key",
    "ssh_host_ed25519_key.pub",
    "ssh_host_rsa_key",
    "ssh_host_rsa_key.pub",
];

/// `spec` of a Slinky LoginSet: a Deployment of login pods (sshd, with sackd for the Slurm
/// clients), their Service on 22, the `sshd_config` ConfigMap and the host keys Secret, for the
/// Controller it references.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "slinky.slurm.net",
    version = "v1beta1",
    kind = "LoginSet",
    namespaced,
    status = "LoginSetStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "lss",
    shortname = "sackd",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    category = "slurm",
    printcolumn(name = "Controller", type_ = "string", json_path = ".spec.controllerRef.name"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
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
#[schemars(transform = crate::immutable::loginset)]
pub struct LoginSetSpec {
    /// The Controller (same namespace) whose cluster these login nodes use.
    pub controller_ref: LocalObjectReference,
    /// Login pods (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The login container (sshd and sackd).
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub login: ContainerWrapper,
    /// The initconf init container (prepares `/etc/slurm` and the user database).
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub initconf: ContainerWrapper,
    /// Pod template.
    #[serde(default, skip_serializing_if = "is_default")]
    pub template: PodTemplate,
    /// `/root/.ssh/authorized_keys`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub root_ssh_authorized_keys: String,
    /// Lines appended to `sshd_config`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extra_sshd_config: String,
    /// The Secret key holding `sssd.conf` (required: the login pods mount it).
    #[serde(default)]
    pub sssd_conf_ref: SecretKeySelector,
    /// How the Deployment replaces login pods (a Deployment's `strategy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wrappers::preserve_unknown")]
    pub strategy: Option<DeploymentStrategy>,
    /// The Service customisation.
    #[serde(default, skip_serializing_if = "is_default")]
    pub service: ServiceSpec,
}

/// `status` of a LoginSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoginSetStatus {
    /// Login pods that exist (its Deployment's `status.replicas`).
    #[serde(default)]
    pub replicas: i32,
    /// The label selector of the login pods, as a string (for the scale subresource).
    #[serde(default)]
    pub selector: String,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `BuilderFailed`, `InvalidSpec`, `ChildFailure`,
    /// `ControllerNotFound`; other writers' too): a list map keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl LoginSet {
    /// `<name>`: the Deployment and the Service (Slinky's `Key()` and `ServiceKey()`).
    pub fn login_key(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    /// `<name>-ssh-config`: the ConfigMap holding `sshd_config` and `authorized_keys`.
    pub fn ssh_config_name(&self) -> String {
        format!("{}-ssh-config", self.login_key())
    }

    /// `<name>-ssh-host-keys`: the Secret holding the sshd host keys (made by the host).
    pub fn ssh_host_keys_name(&self) -> String {
        format!("{}-ssh-host-keys", self.login_key())
    }

    /// Login pods (`spec.replicas`, default 1).
    pub fn replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1)
    }

    /// What is wrong with the spec as the host serves it (empty when nothing).
    pub fn spec_problems(&self) -> Vec<SpecProblem> {
        let s = &self.spec;
        let mut out = Vec::new();
        if s.controller_ref.name.is_empty() {
            out.push(SpecProblem::new(
                "spec.controllerRef.name",
                "Required value: name the Controller whose cluster these login nodes use",
            ));
        }
        if let Some(r) = s.replicas
            && r < 0
        {
            out.push(SpecProblem::new(
                "spec.replicas",
                format!("Invalid value: {r}: must be greater than or equal to 0"),
            ));
        }
        if s.sssd_conf_ref.name.is_empty() || s.sssd_conf_ref.key.is_empty() {
            out.push(SpecProblem::new(
                "spec.sssdConfRef",
                "Required value: name the Secret and key holding sssd.conf (the login pods mount it \
                 and would never start without it)",
            ));
        }
        // A Deployment name: a DNS-1123 subdomain; its Service name: a DNS-1035 label.
        let name = self.login_key();
        if let Some(why) = crate::validation::dns1035_label(&name).into_iter().next() {
            out.push(SpecProblem::new(
                "metadata.name",
                format!(
                    "Invalid value: {name:?}: it names the login Service, which must be a DNS-1035 \
                     label ({why}); recreate the LoginSet under another name"
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_defaults_and_problems() -> Result<(), serde_json::Error> {
        let l: LoginSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "LoginSet",
            "metadata": {"name": "login", "namespace": "slurm"},
            "spec": {"controllerRef": {"name": "slurm"},
                     "sssdConfRef": {"name": "sssd", "key": "sssd.conf"},
                     "strategy": {"type": "Recreate"}},
        }))?;
        assert_eq!(l.login_key(), "login");
        assert_eq!(l.ssh_config_name(), "login-ssh-config");
        assert_eq!(l.ssh_host_keys_name(), "login-ssh-host-keys");
        assert_eq!(l.replicas(), 1);
        assert_eq!(
            l.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
            Some("Recreate")
        );
        assert!(l.spec_problems().is_empty(), "{:?}", l.spec_problems());
        let mut bad = l.clone();
        bad.spec.controller_ref.name.clear();
        bad.spec.sssd_conf_ref.key.clear();
        bad.metadata.name = Some("1login".into());
        let fields: Vec<String> = bad.spec_problems().into_iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            ["spec.controllerRef.name", "spec.sssdConfRef", "metadata.name"]
        );
        Ok(())
    }
}
