//! The NodeSet kind (slurmd workers): its spec, status and the names of its pods.

use k8s_openapi::{
    api::core::v1::SecretKeySelector,
    apimachinery::pkg::{apis::meta::v1::Condition, util::intstr::IntOrString},
};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ContainerWrapper, PodTemplate, is_default, wrappers};

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
    /// Scheduled update parameters: the maintenance window (with `type: ScheduledUpdate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_update: Option<crate::ScheduledUpdate>,
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
#[schemars(transform = crate::immutable::nodeset)]
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
    /// Per-pod PersistentVolumeClaims: for each template, claim `<template>-<pod>` is made before
    /// the pod and mounted as its volume `<template>`; it outlives the pod (see
    /// `persistentVolumeClaimRetentionPolicy`) and a pod of the same ordinal reuses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "wrappers::preserve_unknown_list")]
    pub volume_claim_templates: Vec<serde_json::Value>,
    /// How pods are replaced on a revision change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    /// Revisions kept (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    /// What happens to the claims: `whenDeleted` (the NodeSet) and `whenScaled` (a scale-in),
    /// each `Retain` (default) or `Delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wrappers::preserve_unknown")]
    pub persistent_volume_claim_retention_policy: Option<serde_json::Value>,
    /// Seconds a pod must be ready before it counts as available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    /// Zero-pad ordinals in pod names to this many digits (default 0: no padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal_padding: Option<u32>,
    /// Pin a replacement pod to the node its ordinal last ran on (`status.ordinalToNode`), while
    /// that node exists and is schedulable.
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
    /// Pods whose Slurm node is IDLE (not drained, not down).
    #[serde(default)]
    pub slurm_idle: i32,
    /// Pods whose Slurm node is ALLOCATED or MIXED.
    #[serde(default)]
    pub slurm_allocated: i32,
    /// Pods whose Slurm node is DOWN.
    #[serde(default)]
    pub slurm_down: i32,
    /// Pods whose Slurm node is DRAIN (draining or drained).
    #[serde(default)]
    pub slurm_drain: i32,
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
    /// With `pinToNode`: the Kubernetes node each ordinal's pod last ran on (the ordinal as a
    /// string → the node name), so its replacement is pinned there.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ordinal_to_node: std::collections::BTreeMap<String, String>,
    /// Drains and DOWNs the host did not make (an admin's, a health checker's, a
    /// `pod-cordon` annotation's), by Slurm node name: remembered while the node has one, so
    /// that the node of a replacement pod gets it back (a pod's pre-stop hook marks its node
    /// DOWN with the host's reason). Forgotten once the node is returned to service.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub kept_drains: std::collections::BTreeMap<String, KeptDrain>,
}

/// A drain or DOWN someone else set on a Slurm node, kept for the node of a replacement pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeptDrain {
    /// `DRAIN` or `DOWN`.
    pub state: String,
    /// The node's reason, as it was set.
    pub reason: String,
    /// The UID of the pod whose `pod-cordon` annotation made the drain (none for someone
    /// else's): a replacement pod (another UID) gets the annotation again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
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

    /// The name of the DaemonSet-mode pod whose Slurm node (hostname) is `hostname`:
    /// `<nodeset>-<hostname>` (Slinky lets the API server generate `<nodeset>-<random>`; a name of
    /// the node makes a second pod for a node a conflict, not a duplicate to clean up).
    pub fn daemon_pod_name(&self, hostname: &str) -> String {
        format!("{}-{hostname}", self.metadata.name.as_deref().unwrap_or_default())
    }

    /// Whether the NodeSet places one pod per eligible node.
    pub fn is_daemon(&self) -> bool {
        self.spec.scaling_mode == ScalingMode::DaemonSet
    }

    /// The ordinal of the pod named `pod` if it is named exactly as this NodeSet names that
    /// ordinal (`<nodeset>-<ordinal>` with its own zero padding and no other: `w-07` is not ordinal
    /// 7 of an unpadded NodeSet `w`, and `w-7` is not ordinal 7 of one padded to 2).
    pub fn pod_ordinal(&self, pod: &str) -> Option<u32> {
        let ordinal = crate::pods::ordinal_after(self.metadata.name.as_deref().unwrap_or_default(), pod)?;
        (self.pod_name(ordinal) == pod).then_some(ordinal)
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

    /// Whether this NodeSet shares its Controller's workers' objects (Service, PodDisruptionBudget)
    /// with `other`: the same namespace and the same Controller, its namespace included (two
    /// Controllers of one name in two namespaces are two clusters).
    pub fn shares_workers_with(&self, other: &NodeSet) -> bool {
        self.metadata.namespace == other.metadata.namespace
            && self.spec.controller_ref.name == other.spec.controller_ref.name
            && self.controller_namespace() == other.controller_namespace()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PodSpecWrapper;

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
    fn only_the_nodesets_own_padding_is_an_ordinal_name() {
        assert_eq!(nodeset(None, None).pod_ordinal("workers-7"), Some(7));
        assert_eq!(nodeset(None, None).pod_ordinal("workers-07"), None);
        assert_eq!(nodeset(Some(2), None).pod_ordinal("workers-07"), Some(7));
        assert_eq!(nodeset(Some(2), None).pod_ordinal("workers-7"), None);
        assert_eq!(nodeset(None, None).pod_ordinal("other-7"), None);
    }
}
