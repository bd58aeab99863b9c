//! Slinky custom resources (`slinky.slurm.net/v1beta1`), defined once and shared by the host and
//! the guest SDK, so a builder plugin and the host agree on every field.
//!
//! The shapes follow SchedMD's slurm-operator v1beta1 API. Container, pod-spec and service-spec
//! fields are *wrappers* ([`ContainerWrapper`], [`PodSpecWrapper`], [`ServiceSpecWrapper`]): like
//! Slinky's `preserve-unknown-fields` wrappers, they accept any subset of the core type's fields (a
//! container without a name, a pod spec without containers) and convert to the typed k8s-openapi
//! value on demand.

/// Spec checks made before anything is built.
pub mod checks;
/// Strategic-merge patch keys of the core types' lists.
pub mod merge_keys;
/// Kubernetes' name and value rules.
pub mod validation;
mod wrappers;

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ConfigMapKeySelector, LocalObjectReference, SecretKeySelector},
    apimachinery::pkg::{apis::meta::v1::Condition, util::intstr::IntOrString},
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use wrappers::{ContainerWrapper, PodSpecWrapper, ServiceSpecWrapper, WrapperError};

/// The API group of every Slinky kind.
pub const GROUP: &str = "slinky.slurm.net";
/// The served and stored version.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of every Slinky object.
pub const API_VERSION: &str = "slinky.slurm.net/v1beta1";

/// Status condition types the host sets (it owns these types on its parents' status; other
/// writers' conditions are kept).
pub mod conditions {
    /// The parent is reconciled: its children exist and are available.
    pub const READY: &str = "Ready";
    /// The spec is invalid or asks for what this host does not support; nothing is changed.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The builder plugin failed (trap, deadline, refused output, builder error).
    pub const BUILDER_FAILED: &str = "BuilderFailed";
    /// A NodeSet's Controller does not exist.
    pub const CONTROLLER_NOT_FOUND: &str = "ControllerNotFound";
    /// A NodeSet's pod create, delete, adoption or release was refused by the API server
    /// (like a ReplicaSet's `ReplicaFailure`; reasons `FailedCreate`, `FailedDelete`, …).
    pub const REPLICA_FAILURE: &str = "ReplicaFailure";
    /// A child other than a pod (a Service, ConfigMap, StatefulSet, PodDisruptionBudget) could
    /// not be applied or pruned, or its name is taken by an object the host did not build
    /// (reasons `FailedApply`, `FailedDelete`, `NotOwned`). On Controllers and NodeSets.
    pub const CHILD_FAILURE: &str = "ChildFailure";
    /// A Secret or ConfigMap a Controller references does not exist (reasons `SecretNotFound`,
    /// `SecretKeyNotFound`, `ConfigMapNotFound`): the children that need it wait for it.
    pub const REFERENCE_NOT_FOUND: &str = "ReferenceNotFound";
    /// Set by hosts before `ChildFailure` replaced it (the Controller's Service only); the host
    /// clears it.
    #[deprecated(note = "replaced by CHILD_FAILURE; the host only clears it")]
    pub const SERVICE_FAILURE: &str = "ServiceFailure";
    /// The condition types a NodeSet's status carries from the host.
    pub const NODESET: [&str; 6] = [
        READY,
        INVALID_SPEC,
        BUILDER_FAILED,
        CONTROLLER_NOT_FOUND,
        REPLICA_FAILURE,
        CHILD_FAILURE,
    ];
    /// The condition types a Controller's status carries from the host.
    pub const CONTROLLER: [&str; 5] = [
        READY,
        INVALID_SPEC,
        BUILDER_FAILED,
        CHILD_FAILURE,
        REFERENCE_NOT_FOUND,
    ];
}

/// Labels and annotations a builder or the host may set (Slinky's `well_known.go`).
pub mod keys {
    /// `app.kubernetes.io/name`: a selector label.
    pub const LABEL_NAME: &str = "app.kubernetes.io/name";
    /// `app.kubernetes.io/instance`: a selector label (the CR name).
    pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
    /// `app.kubernetes.io/component`: added to the selector labels in the full labels.
    pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
    /// The Slurm cluster a worker pod belongs to (the Controller's name).
    pub const LABEL_CLUSTER: &str = "slinky.slurm.net/cluster";
    /// Marks the active slurmctld pod.
    pub const LABEL_CONTROLLER_ACTIVE: &str = "controller.slinky.slurm.net/active";
    /// NodeSet pod label: the pod name.
    pub const LABEL_POD_NAME: &str = "nodeset.slinky.slurm.net/pod-name";
    /// NodeSet pod label: the ordinal.
    pub const LABEL_POD_INDEX: &str = "nodeset.slinky.slurm.net/pod-index";
    /// NodeSet pod label: the hostname (the Slurm node name).
    pub const LABEL_POD_HOSTNAME: &str = "nodeset.slinky.slurm.net/pod-hostname";
    /// NodeSet pod label: the scaling mode the pod was made for.
    pub const LABEL_SCALING_MODE: &str = "nodeset.slinky.slurm.net/scaling-mode";
    /// NodeSet pod label: protected from disruption while its Slurm node is busy.
    pub const LABEL_POD_PROTECT: &str = "nodeset.slinky.slurm.net/pod-protect";
    /// The revision label shared with StatefulSets.
    pub const LABEL_REVISION_HASH: &str = "controller-revision-hash";
    /// Pod annotation: the Slurm topology spec, read by slurmd through `SLINKY_TOPOLOGY`.
    pub const ANNOTATION_TOPOLOGY: &str = "topology.slinky.slurm.net/spec";
    /// Pod annotation: the pod is cordoned (its Slurm node drained).
    pub const ANNOTATION_POD_CORDON: &str = "nodeset.slinky.slurm.net/pod-cordon";
    /// Pod annotation: the pod's deletion cost (lower goes first on scale-down).
    pub const ANNOTATION_POD_DELETION_COST: &str = "nodeset.slinky.slurm.net/pod-deletion-cost";
    /// Pod annotation: when the pod's running jobs end (RFC 3339).
    pub const ANNOTATION_POD_DEADLINE: &str = "nodeset.slinky.slurm.net/pod-deadline";
    /// Pod-template annotation: the hash of the sshd configuration.
    pub const ANNOTATION_SSHD_CONF_HASH: &str = "slinky.slurm.net/sshd-conf-hash";
    /// Pod-template annotation: the hash of the sssd configuration.
    pub const ANNOTATION_SSSD_CONF_HASH: &str = "slinky.slurm.net/sssd-conf-hash";
    /// The container `kubectl logs/exec` picks by default.
    pub const ANNOTATION_DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
    /// slurmctld pod-template annotation: the hash of the Slurm key Secret's data.
    pub const ANNOTATION_SLURM_KEY_HASH: &str = "slinky.slurm.net/slurm-key-hash";
    /// slurmctld pod-template annotation: the hash of the JWT key Secret's data.
    pub const ANNOTATION_JWT_KEY_HASH: &str = "slinky.slurm.net/jwt-key-hash";
    /// slurmctld pod-template annotation (without in-place reconfigure): the hash of the
    /// `<controller>-config` ConfigMap's data, so a configuration change rolls slurmctld.
    pub const ANNOTATION_SLURM_CONFIG_HASH: &str = "slinky.slurm.net/slurm-config-hash";
    /// Set by the host on every child it applies: a hash of the object as last applied, so a
    /// steady state makes no writes.
    pub const ANNOTATION_APPLIED_HASH: &str = "slinky.slurm.net/applied-hash";
    /// Set by the host on every child: `<plugin name>@<plugin version>`.
    pub const ANNOTATION_BUILDER: &str = "slinky.slurm.net/builder";
    /// Set by the host on every child: `sha256:<digest of the plugin component>`.
    pub const ANNOTATION_BUILDER_DIGEST: &str = "slinky.slurm.net/builder-digest";
    /// The taint on Kubernetes nodes reserved for Slurm workers.
    pub const TAINT_WORKER: &str = "nodeset.slinky.slurm.net/worker";
}

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

/// Metrics settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    /// Expose OpenMetrics from slurmctld.
    #[serde(default)]
    pub enabled: bool,
    /// ServiceMonitor settings (passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wrappers::preserve_unknown")]
    pub service_monitor: Option<serde_json::Value>,
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
    #[schemars(schema_with = "wrappers::preserve_unknown")]
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

/// A reference from a NodeSet to its Controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerReference {
    /// The Controller's name.
    pub name: String,
    /// The Controller's namespace (defaults to the NodeSet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// How a NodeSet places its pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ScalingMode {
    /// Ordinal pods, like a StatefulSet (the default).
    #[default]
    StatefulSet,
    /// One pod per eligible node, like a DaemonSet.
    DaemonSet,
}

impl ScalingMode {
    /// The value used in the scaling-mode pod label.
    pub fn as_str(self) -> &'static str {
        match self {
            ScalingMode::StatefulSet => "StatefulSet",
            ScalingMode::DaemonSet => "DaemonSet",
        }
    }
}

/// SSH into worker pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ssh {
    /// Run sshd in the slurmd pod.
    #[serde(default)]
    pub enabled: bool,
    /// Extra `sshd_config` lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_sshd_config: Option<String>,
    /// An sssd.conf Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sssd_conf_ref: Option<SecretKeySelector>,
}

/// The Slurm partition a NodeSet defines.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// Define a partition named after the NodeSet.
    #[serde(default)]
    pub enabled: bool,
    /// The rest of the `PartitionName=` line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

/// How pods are replaced when the pod revision changes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// `RollingUpdate` (default), `OnDelete` or `ScheduledUpdate`.
    #[serde(rename = "type", default)]
    pub type_: UpdateStrategyType,
    /// Rolling update parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
    /// Scheduled update parameters (passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wrappers::preserve_unknown")]
    pub scheduled_update: Option<serde_json::Value>,
}

/// The update strategy's kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategyType {
    /// Replace old pods, at most `maxUnavailable` at a time.
    #[default]
    RollingUpdate,
    /// Replace a pod only when a user deletes it.
    OnDelete,
    /// Replace pods inside a Slurm maintenance window.
    ScheduledUpdate,
}

/// Rolling update parameters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// How many pods may be unavailable during the update: a number or a percentage (default 25%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// `spec` of a Slinky NodeSet (slurmd workers).
#[allow(
    clippy::duplicated_attributes,
    reason = "kube(...) repeats printcolumn/shortname/derive per item"
)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "slinky.slurm.net",
    version = "v1beta1",
    kind = "NodeSet",
    namespaced,
    status = "NodeSetStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "nss",
    shortname = "slurmd",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    category = "slurm",
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Up-to-date", type_ = "integer", json_path = ".status.updatedReplicas"),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Status",
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
pub struct NodeSetSpec {
    /// The Controller (Slurm cluster) these workers join. Required; immutable.
    pub controller_ref: ControllerReference,
    /// Desired number of pods (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// `StatefulSet` (default) or `DaemonSet`.
    #[serde(default)]
    pub scaling_mode: ScalingMode,
    /// The slurmd container.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub slurmd: ContainerWrapper,
    /// The logfile sidecar.
    #[serde(default, skip_serializing_if = "ContainerWrapper::is_empty")]
    pub logfile: ContainerWrapper,
    /// SSH settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<Ssh>,
    /// Pod template.
    #[serde(default, skip_serializing_if = "is_default")]
    pub template: PodTemplate,
    /// Space-separated `Key=Value` items passed to slurmd `--conf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_conf: Option<String>,
    /// The Slurm partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
    /// Volume claim templates (passed through).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "wrappers::preserve_unknown_list")]
    pub volume_claim_templates: Vec<serde_json::Value>,
    /// How pods are replaced on a revision change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    /// Revisions kept (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    /// PVC retention (passed through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wrappers::preserve_unknown")]
    pub persistent_volume_claim_retention_policy: Option<serde_json::Value>,
    /// Seconds a pod must be ready before it counts as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    /// Zero-pad ordinals in pod names to this many digits (default 0: no padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal_padding: Option<u32>,
    /// Pin a pod to the node it last ran on.
    #[serde(default)]
    pub pin_to_node: bool,
    /// Protect busy Slurm nodes from disruption (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_disruption_protection: Option<bool>,
    /// `Never` (default) or `NodeNotFound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune_slurm_node_records: Option<String>,
    /// Allow several slurmd pods on one Kubernetes node.
    #[serde(default)]
    pub oversubscribe_node: bool,
}

/// `status` of a NodeSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSetStatus {
    /// Pods that exist (with a phase).
    #[serde(default)]
    pub replicas: i32,
    /// Pods of the update revision.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Running and ready pods.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Pods ready for at least `minReadySeconds`.
    #[serde(default)]
    pub available_replicas: i32,
    /// Desired minus available.
    #[serde(default)]
    pub unavailable_replicas: i32,
    /// Desired replicas.
    #[serde(default)]
    pub desired: i32,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The update revision (the pod revision hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_set_hash: Option<String>,
    /// The label selector of the pods, as a string (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Conditions (`Ready`, `InvalidSpec`, `ControllerNotFound`, `BuilderFailed`,
    /// `ReplicaFailure`, `ChildFailure`; other writers' too): a list map keyed by `type`, so server-side apply
    /// merges them per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl NodeSet {
    /// `spec.replicas` with Slinky's default of 1.
    pub fn replicas(&self) -> i32 {
        self.spec.replicas.unwrap_or(1)
    }

    /// `spec.ordinalPadding` with its default of 0.
    pub fn ordinal_padding(&self) -> usize {
        self.spec.ordinal_padding.unwrap_or(0) as usize
    }

    /// The name of the pod with this ordinal: `<nodeset>-<ordinal>`, zero-padded to `ordinalPadding`.
    pub fn pod_name(&self, ordinal: u32) -> String {
        format!(
            "{}-{:0width$}",
            self.metadata.name.as_deref().unwrap_or_default(),
            ordinal,
            width = self.ordinal_padding()
        )
    }

    /// The hostname of the pod with this ordinal: `<template.hostname><ordinal>` (padded like the
    /// name) when the template sets a hostname, else the pod name (Slinky's rule).
    pub fn pod_hostname(&self, ordinal: u32) -> String {
        match self.spec.template.spec.hostname() {
            Some(prefix) if !prefix.is_empty() => {
                format!("{prefix}{ordinal:0width$}", width = self.ordinal_padding())
            }
            _ => self.pod_name(ordinal),
        }
    }

    /// The Slurm NodeSet (and partition, and feature) name: the template hostname prefix with
    /// dashes trimmed, else the NodeSet name (Slinky's `GetSlurmNodeSetName`).
    pub fn slurm_name(&self) -> String {
        match self.spec.template.spec.hostname() {
            Some(h) if !h.trim().is_empty() => {
                let first = h.split_whitespace().next().unwrap_or_default();
                first.trim_matches('-').to_string()
            }
            _ => self.metadata.name.clone().unwrap_or_default(),
        }
    }

    /// `<name>-ssh-config`: the ConfigMap holding `sshd_config` when SSH is on.
    pub fn ssh_config_name(&self) -> String {
        format!("{}-ssh-config", self.metadata.name.as_deref().unwrap_or_default())
    }

    /// The namespace of the Controller this NodeSet references.
    pub fn controller_namespace(&self) -> &str {
        self.spec
            .controller_ref
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .or(self.metadata.namespace.as_deref())
            .unwrap_or_default()
    }
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodeset(padding: Option<u32>, hostname: Option<&str>) -> NodeSet {
        let mut spec = NodeSetSpec {
            ordinal_padding: padding,
            ..Default::default()
        };
        if let Some(h) = hostname {
            spec.template.spec = PodSpecWrapper(serde_json::json!({ "hostname": h }));
        }
        let mut ns = NodeSet::new("workers", spec);
        ns.metadata.namespace = Some("slurm".into());
        ns
    }

    #[test]
    fn pod_names_and_hostnames_follow_padding_and_template() {
        assert_eq!(nodeset(None, None).pod_name(7), "workers-7");
        assert_eq!(nodeset(Some(3), None).pod_name(7), "workers-007");
        assert_eq!(nodeset(Some(3), None).pod_hostname(7), "workers-007");
        assert_eq!(nodeset(None, Some("slinky-")).pod_hostname(2), "slinky-2");
        assert_eq!(nodeset(Some(2), Some("gpu-")).pod_hostname(2), "gpu-02");
    }

    #[test]
    fn cluster_name_defaults_to_namespace_and_name() {
        let mut c = Controller::new("slurm", ControllerSpec::default());
        c.metadata.namespace = Some("hpc".into());
        assert_eq!(c.cluster_name(), "hpc_slurm");
        c.spec.cluster_name = Some("prod".into());
        assert_eq!(c.cluster_name(), "prod");
    }

    #[test]
    fn jwt_alias_is_accepted() -> Result<(), serde_json::Error> {
        let spec: ControllerSpec =
            serde_json::from_value(serde_json::json!({"jwtHs256KeyRef": {"name": "jwt", "key": "k"}}))?;
        assert_eq!(spec.jwt_key_ref.map(|r| r.name), Some("jwt".to_string()));
        Ok(())
    }
}
