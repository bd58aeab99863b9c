//! The Accounting kind (slurmdbd): its spec, status and the names derived from it.

use k8s_openapi::{
    api::core::v1::{ConfigMapKeySelector, SecretKeySelector},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ContainerWrapper, ExternalConfig, PodTemplate, ServiceSpec, checks::SpecProblem, is_default};

/// slurmdbd's port.
pub const SLURMDBD_PORT: i32 = 6819;
/// The database port when `storageConfig.port` is not set (MySQL's and MariaDB's).
pub const DEFAULT_STORAGE_PORT: i32 = 3306;
/// The database when `storageConfig.database` is not set.
pub const DEFAULT_STORAGE_DATABASE: &str = "slurm_acct_db";
/// The key of the accounting Secret that holds `slurmdbd.conf`.
pub const SLURMDBD_CONF: &str = "slurmdbd.conf";

/// How slurmdbd reaches its database (MySQL or MariaDB).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageConfig {
    /// The database host (`StorageHost`).
    #[serde(default)]
    pub host: String,
    /// The database port (`StoragePort`, default 3306).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// The database (`StorageLoc`, default `slurm_acct_db`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// The database user (`StorageUser`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The Secret key holding that user's password (`StoragePass`). The host reads it and writes
    /// it into the `slurmdbd.conf` Secret itself: no builder ever sees it.
    #[serde(default)]
    pub password_key_ref: SecretKeySelector,
}

/// `spec` of a Slinky Accounting (slurmdbd): a StatefulSet of one slurmdbd, its Service on 6819
/// and the Secret holding `slurmdbd.conf`. Controllers name it in `spec.accountingRef`.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "slinky.slurm.net",
    version = "v1beta1",
    kind = "Accounting",
    namespaced,
    status = "AccountingStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "slurmdbd",
    category = "slurm",
    printcolumn(name = "Storage", type_ = "string", json_path = ".spec.storageConfig.host"),
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
#[schemars(transform = crate::immutable::accounting)]
pub struct AccountingSpec {
    /// The Slurm auth key (`slurm.key`); required unless external.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_key_ref: Option<SecretKeySelector>,
    /// The JWT HS256 key (`jwtHs256KeyRef` is accepted as an alias); required unless external.
    #[serde(default, alias = "jwtHs256KeyRef", skip_serializing_if = "Option::is_none")]
    pub jwt_key_ref: Option<SecretKeySelector>,
    /// JWKS for JWT validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_key_ref: Option<ConfigMapKeySelector>,
    /// slurmdbd runs outside Kubernetes: nothing is built, Controllers use `externalConfig`.
    #[serde(default)]
    pub external: bool,
    /// Where the external slurmdbd is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_config: Option<ExternalConfig>,
    /// The slurmdbd container.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub slurmdbd: ContainerWrapper,
    /// Pod template.
    #[serde(default, skip_serializing_if = "is_default")]
    pub template: PodTemplate,
    /// The database.
    #[serde(default, skip_serializing_if = "is_default")]
    pub storage_config: StorageConfig,
    /// Lines appended to `slurmdbd.conf`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub extra_conf: String,
    /// The Service customisation.
    #[serde(default, skip_serializing_if = "is_default")]
    pub service: ServiceSpec,
}

/// `status` of an Accounting.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountingStatus {
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `BuilderFailed`, `InvalidSpec`, `ChildFailure`,
    /// `ReferenceNotFound`; other writers' too): a list map keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// `<accounting>-accounting`: the name of an Accounting's StatefulSet, Service and Secret
/// (Slinky's `Key()`, `ServiceKey()` and `ConfigKey()`).
pub fn accounting_key(accounting: &str) -> String {
    format!("{accounting}-accounting")
}

impl Accounting {
    /// `<name>-accounting`: the StatefulSet, the Service and the `slurmdbd.conf` Secret.
    pub fn accounting_key(&self) -> String {
        accounting_key(self.metadata.name.as_deref().unwrap_or_default())
    }

    /// `<name>-accounting-0`: slurmdbd's pod, its `DbdHost`.
    pub fn primary_name(&self) -> String {
        format!("{}-0", self.accounting_key())
    }

    /// The key Secrets this Accounting references (`slurmKeyRef`, `jwtKeyRef`), in that order.
    pub fn key_secret_refs(&self) -> impl Iterator<Item = &SecretKeySelector> {
        [&self.spec.slurm_key_ref, &self.spec.jwt_key_ref]
            .into_iter()
            .flatten()
    }

    /// Where slurmctld reaches this slurmdbd (`AccountingStorageHost`, `AccountingStoragePort`):
    /// `externalConfig` when external, else its Service `<name>-accounting` on `spec.service.port`
    /// (default 6819). Slinky always writes `<name>-accounting:6819`, which names no Service for
    /// an external slurmdbd and the wrong port for a customised one.
    pub fn storage_address(&self) -> (String, i32) {
        match (&self.spec.external_config, self.spec.external) {
            (Some(ext), true) => (
                ext.host.clone(),
                if ext.port > 0 { ext.port } else { SLURMDBD_PORT },
            ),
            _ => (
                self.accounting_key(),
                self.spec.service.port.filter(|p| *p > 0).unwrap_or(SLURMDBD_PORT),
            ),
        }
    }

    /// What is wrong with the spec as the host serves it (empty when nothing).
    pub fn spec_problems(&self) -> Vec<SpecProblem> {
        let s = &self.spec;
        let mut out = Vec::new();
        let unset =
            |r: &Option<SecretKeySelector>| r.as_ref().is_none_or(|r| r.name.is_empty() || r.key.is_empty());
        if s.external {
            if s.external_config.as_ref().is_none_or(|e| e.host.is_empty()) {
                out.push(SpecProblem::new(
                    "spec.externalConfig.host",
                    "Required value: an external slurmdbd needs the host (and port) slurmctld reaches it at",
                ));
            }
            return out;
        }
        if unset(&s.slurm_key_ref) {
            out.push(SpecProblem::new(
                "spec.slurmKeyRef",
                "Required value: name the Secret and key holding the Slurm key (the Controller's), \
                 unless external",
            ));
        }
        if unset(&s.jwt_key_ref) {
            out.push(SpecProblem::new(
                "spec.jwtKeyRef",
                "Required value: name the Secret and key holding the JWT key (the Controller's), \
                 unless external",
            ));
        }
        if s.storage_config.host.is_empty() {
            out.push(SpecProblem::new(
                "spec.storageConfig.host",
                "Required value: the MySQL/MariaDB host slurmdbd stores accounting in",
            ));
        }
        let pass = &s.storage_config.password_key_ref;
        if pass.name.is_empty() || pass.key.is_empty() {
            out.push(SpecProblem::new(
                "spec.storageConfig.passwordKeyRef",
                "Required value: name the Secret and key holding the database user's password",
            ));
        }
        if let Some(p) = s.storage_config.port
            && !(1..=65535).contains(&p)
        {
            out.push(SpecProblem::new(
                "spec.storageConfig.port",
                format!("Invalid value: {p}: must be between 1 and 65535, inclusive"),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounting(spec: serde_json::Value) -> Result<Accounting, serde_json::Error> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Accounting",
            "metadata": {"name": "slurm", "namespace": "slurm"},
            "spec": spec,
        }))
    }

    #[test]
    fn names_and_addresses_are_slinkys_or_better() -> Result<(), serde_json::Error> {
        let a = accounting(serde_json::json!({
            "slurmKeyRef": {"name": "k", "key": "slurm.key"},
            "jwtHs256KeyRef": {"name": "j", "key": "jwt.key"},
            "storageConfig": {"host": "mariadb", "passwordKeyRef": {"name": "db", "key": "password"}},
        }))?;
        assert_eq!(a.accounting_key(), "slurm-accounting");
        assert_eq!(a.primary_name(), "slurm-accounting-0");
        assert_eq!(a.storage_address(), ("slurm-accounting".to_string(), 6819));
        assert!(a.spec_problems().is_empty(), "{:?}", a.spec_problems());
        let mut custom = a.clone();
        custom.spec.service.port = Some(16819);
        assert_eq!(custom.storage_address().1, 16819);
        let ext = accounting(serde_json::json!({"external": true,
            "externalConfig": {"host": "dbd.example.org", "port": 7000}}))?;
        assert_eq!(ext.storage_address(), ("dbd.example.org".to_string(), 7000));
        assert!(ext.spec_problems().is_empty());
        Ok(())
    }

    #[test]
    fn missing_fields_are_named() -> Result<(), serde_json::Error> {
        let a = accounting(serde_json::json!({"storageConfig": {"port": 0}}))?;
        let fields: Vec<String> = a.spec_problems().into_iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            [
                "spec.slurmKeyRef",
                "spec.jwtKeyRef",
                "spec.storageConfig.host",
                "spec.storageConfig.passwordKeyRef",
                "spec.storageConfig.port"
            ]
        );
        let ext = accounting(serde_json::json!({"external": true}))?;
        assert_eq!(ext.spec_problems()[0].field, "spec.externalConfig.host");
        Ok(())
    }
}
