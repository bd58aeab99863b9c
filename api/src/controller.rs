//! The Controller kind (slurmctld): its spec, status and the names derived from it.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ConfigMapKeySelector, LocalObjectReference, SecretKeySelector},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ContainerWrapper, PodTemplate, ServiceSpec, is_default};

/// Metrics settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Expose OpenMetrics from slurmctld.
    #[serde(default)]
    pub enabled: bool,
    /// A Prometheus Operator ServiceMonitor scraping slurmctld's metrics (with `enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitor>,
}

/// A Prometheus Operator ServiceMonitor for slurmctld's metrics (Slinky's `ServiceMonitor`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitor {
    /// Build the ServiceMonitor `<controller>-controller` (needs `metrics.enabled` and the
    /// Prometheus Operator's CRDs).
    #[serde(default)]
    pub enabled: bool,
    /// Labels of the ServiceMonitor (a Prometheus selects ServiceMonitors by them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the ServiceMonitor.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// How often Prometheus scrapes (a Prometheus duration, e.g. `30s`; its global default when
    /// empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// When a scrape times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
    /// The paths to scrape (default: slurmctld's `/metrics/jobs`, `/metrics/nodes`,
    /// `/metrics/partitions`, `/metrics/scheduler`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "endpoints")]
    pub metric_endpoints: Vec<MetricEndpoint>,
}

/// One metrics path of slurmctld to scrape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricEndpoint {
    /// The HTTP path.
    #[serde(default)]
    pub path: String,
    /// Its scrape interval (the ServiceMonitor's when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Its scrape timeout (the ServiceMonitor's when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
}

/// An external daemon's address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalConfig {
    /// Host name or address.
    #[serde(default)]
    pub host: String,
    /// Port.
    #[serde(default)]
    pub port: i32,
}

/// slurmctld high availability.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HighAvailability {
    /// Run backup controllers.
    #[serde(default)]
    pub enabled: bool,
    /// Number of backups (minimum 1, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups: Option<i32>,
}

/// slurmctld state-save persistence.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Persistence {
    /// Persist the state (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Use this existing claim instead of a volume claim template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_claim: Option<String>,
    /// The rest of a PersistentVolumeClaimSpec (inlined, passed through).
    #[serde(flatten)]
    #[schemars(skip)]
    pub claim_spec: BTreeMap<String, serde_json::Value>,
}

/// `persistence`: `enabled` and `existingClaim` typed (the immutability rules read them), the
/// rest of a PersistentVolumeClaimSpec passed through.
fn persistence_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": {
            "enabled": {"type": "boolean", "description": "Persist the state (default true)."},
            "existingClaim": {"type": "string", "description": "Use this existing claim instead of a volume claim template."}
        },
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// `spec` of a Slinky Controller (slurmctld).
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "slinky.slurm.net",
    version = "v1beta1",
    kind = "Controller",
    namespaced,
    status = "ControllerStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "slurmctld",
    category = "slurm",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.clusterName"),
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
#[schemars(transform = crate::immutable::controller)]
pub struct ControllerSpec {
    /// The Slurm cluster name; empty means `<namespace>_<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// The Slurm auth key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_key_ref: Option<SecretKeySelector>,
    /// The JWT HS256 key (`jwtHs256KeyRef` is accepted as an alias).
    #[serde(default, alias = "jwtHs256KeyRef", skip_serializing_if = "Option::is_none")]
    pub jwt_key_ref: Option<SecretKeySelector>,
    /// JWKS for JWT validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_key_ref: Option<ConfigMapKeySelector>,
    /// The Accounting (slurmdbd) this cluster reports to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting_ref: Option<LocalObjectReference>,
    /// slurmctld runs outside Kubernetes.
    #[serde(default)]
    pub external: bool,
    /// Where the external slurmctld is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_config: Option<ExternalConfig>,
    /// High availability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ha: Option<HighAvailability>,
    /// The slurmctld container.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub slurmctld: ContainerWrapper,
    /// The reconfigure sidecar.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub reconfigure: ContainerWrapper,
    /// The logfile sidecar.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub logfile: ContainerWrapper,
    /// Reconfigure in place instead of rolling the pod on config change.
    #[serde(default)]
    pub inplace_reconfigure: bool,
    /// Pod template.
    #[serde(default, skip_serializing_if = "is_default")]
    pub template: PodTemplate,
    /// Extra `slurm.conf` lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_conf: Option<String>,
    /// Extra config files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_file_refs: Vec<LocalObjectReference>,
    /// Prolog scripts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prolog_script_refs: Vec<LocalObjectReference>,
    /// Epilog scripts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epilog_script_refs: Vec<LocalObjectReference>,
    /// PrologSlurmctld scripts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prolog_slurmctld_script_refs: Vec<LocalObjectReference>,
    /// EpilogSlurmctld scripts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epilog_slurmctld_script_refs: Vec<LocalObjectReference>,
    /// State-save persistence (inlines a PersistentVolumeClaimSpec, passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "persistence_schema")]
    pub persistence: Option<Persistence>,
    /// The Service customisation.
    #[serde(default, skip_serializing_if = "is_default")]
    pub service: ServiceSpec,
    /// Metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
}

/// `status` of a Controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerStatus {
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions (`Ready`, `BuilderFailed`, `InvalidSpec`, `ChildFailure`,
    /// `ReferenceNotFound`; other writers' too): a list map keyed by `type`, so server-side apply merges them per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Slurm's default `SlurmdTimeout` (seconds).
pub const SLURMD_TIMEOUT_DEFAULT: u64 = 300;

impl Controller {
    /// slurmctld replicas: 1, plus `ha.backups` (default 1) with HA; always 1 when external.
    pub fn replicas(&self) -> i32 {
        if self.spec.external {
            return 1;
        }
        match &self.spec.ha {
            Some(ha) if ha.enabled => 1 + ha.backups.unwrap_or(1),
            _ => 1,
        }
    }

    /// Whether high availability is on.
    pub fn ha_enabled(&self) -> bool {
        self.spec.ha.as_ref().is_some_and(|ha| ha.enabled)
    }

    /// Whether the state is persisted (`persistence.enabled`, default true).
    pub fn persistence_enabled(&self) -> bool {
        self.spec
            .persistence
            .as_ref()
            .and_then(|p| p.enabled)
            .unwrap_or(true)
    }

    /// `<name>-controller`: the Service, the StatefulSet, and the prefix of slurmctld's pods.
    pub fn controller_key(&self) -> String {
        format!("{}-controller", self.metadata.name.as_deref().unwrap_or_default())
    }

    /// `<name>-controller-internal`: the headless Service governing the StatefulSet.
    pub fn internal_service_name(&self) -> String {
        format!("{}-internal", self.controller_key())
    }

    /// `<name>-config`: the ConfigMap holding `slurm.conf`.
    pub fn config_name(&self) -> String {
        format!("{}-config", self.metadata.name.as_deref().unwrap_or_default())
    }

    /// The key Secrets this Controller references (`slurmKeyRef`, `jwtKeyRef`), in that order.
    pub fn key_secret_refs(&self) -> impl Iterator<Item = &SecretKeySelector> {
        [&self.spec.slurm_key_ref, &self.spec.jwt_key_ref]
            .into_iter()
            .flatten()
    }

    /// Every ConfigMap the Controller references (`configFileRefs`, the prolog/epilog script
    /// refs, `jwksKeyRef`), each once, sorted.
    pub fn config_map_refs(&self) -> Vec<String> {
        let s = &self.spec;
        let mut names: Vec<String> = s
            .config_file_refs
            .iter()
            .chain(&s.prolog_script_refs)
            .chain(&s.epilog_script_refs)
            .chain(&s.prolog_slurmctld_script_refs)
            .chain(&s.epilog_slurmctld_script_refs)
            .map(|r| r.name.clone())
            .chain(s.jwks_key_ref.as_ref().map(|r| r.name.clone()))
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// How long slurmctld waits for a slurmd before it counts the node unresponsive:
    /// `SlurmdTimeout` of `spec.extraConf` (the last one set; seconds), else Slurm's default of
    /// 300 s. A node slurmctld does not list for longer than this has no slurmd that answers it.
    pub fn slurmd_timeout(&self) -> std::time::Duration {
        let seconds = self
            .spec
            .extra_conf
            .as_deref()
            .unwrap_or_default()
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .flat_map(str::split_whitespace)
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| k.eq_ignore_ascii_case("SlurmdTimeout"))
            .filter_map(|(_, v)| v.parse::<u64>().ok())
            .next_back()
            .unwrap_or(SLURMD_TIMEOUT_DEFAULT);
        std::time::Duration::from_secs(seconds)
    }

    /// The Slurm cluster name: `spec.clusterName`, else `<namespace>_<name>` (Slinky's rule).
    pub fn cluster_name(&self) -> String {
        match self.spec.cluster_name.as_deref() {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => format!(
                "{}_{}",
                self.metadata.namespace.as_deref().unwrap_or_default(),
                self.metadata.name.as_deref().unwrap_or_default()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_name_defaults_to_namespace_and_name() {
        let mut c = Controller::new("slurm", ControllerSpec::default());
        c.metadata.namespace = Some("hpc".into());
        assert_eq!(c.cluster_name(), "hpc_slurm");
        c.spec.cluster_name = Some("prod".into());
        assert_eq!(c.cluster_name(), "prod");
    }

    #[test]
    fn slurmd_timeout_is_read_from_extra_conf() {
        let mut c = Controller::new("slurm", ControllerSpec::default());
        assert_eq!(c.slurmd_timeout().as_secs(), 300, "Slurm's default");
        c.spec.extra_conf =
            Some("SchedulerType=sched/backfill\nslurmdtimeout=120 # short\n#SlurmdTimeout=9".into());
        assert_eq!(c.slurmd_timeout().as_secs(), 120);
        c.spec.extra_conf = Some("SlurmdTimeout=soon".into());
        assert_eq!(c.slurmd_timeout().as_secs(), 300, "not a number: the default");
    }

    #[test]
    fn jwt_alias_is_accepted() -> Result<(), serde_json::Error> {
        let spec: ControllerSpec =
            serde_json::from_value(serde_json::json!({"jwtHs256KeyRef": {"name": "jwt", "key": "k"}}))?;
        assert_eq!(spec.jwt_key_ref.map(|r| r.name), Some("jwt".to_string()));
        Ok(())
    }
}
