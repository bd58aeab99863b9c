//! The pod watch's wire type: a pod decoded into only what the reconcilers read of it.
//!
//! The pod cache keeps metadata (without managedFields), `nodeName`, `hostname`, node affinity,
//! phase, reason and conditions. Decoding a whole pod (its containers, volumes, env,
//! managedFields) only to drop most of it was the bulk of the host's JSON work in a scale-up: the
//! watch decodes [`SlimPod`] instead, whose fields are those kept; serde skips the rest of each
//! pod without allocating.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Affinity, NodeAffinity, Pod, PodCondition, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
};
use serde::Deserialize;

/// The kept fields, for a pod watch read in protobuf (`crate::client`): the rest of each pod is
/// skipped unread there. Must name every field [`SlimPod`] reads (a test checks).
pub(crate) const KEPT: slinky_protobuf::Keep = {
    use slinky_protobuf::Keep::{All, AllBut, Only};
    Only(&[
        ("metadata", AllBut(&["managedFields", "selfLink"])),
        (
            "spec",
            Only(&[
                ("nodeName", All),
                ("hostname", All),
                ("affinity", Only(&[("nodeAffinity", All)])),
            ]),
        ),
        (
            "status",
            Only(&[("phase", All), ("reason", All), ("conditions", All)]),
        ),
    ])
};

/// A pod as the watch decodes it (see the module): a [`Pod`] holding only the kept fields.
#[derive(Clone, Debug, Default)]
pub struct SlimPod(pub Pod);

impl From<SlimPod> for Pod {
    fn from(p: SlimPod) -> Self {
        p.0
    }
}

impl kube::Resource for SlimPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// The kept fields of an object's metadata (every field of [`ObjectMeta`] but managedFields and
/// selfLink: serde skips those without looking into them, however deep they go).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Meta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    uid: Option<String>,
}

impl Meta {
    /// The metadata as an [`ObjectMeta`].
    pub(super) fn into_object_meta(self) -> ObjectMeta {
        ObjectMeta {
            annotations: self.annotations,
            creation_timestamp: self.creation_timestamp,
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            deletion_timestamp: self.deletion_timestamp,
            finalizers: self.finalizers,
            generate_name: self.generate_name,
            // Pods have no generation in 1.28: a protobuf watch shows Go's zero, JSON none.
            generation: self.generation.filter(|g| *g != 0),
            labels: self.labels,
            managed_fields: None,
            name: self.name,
            namespace: self.namespace,
            owner_references: self.owner_references,
            resource_version: self.resource_version,
            self_link: None,
            uid: self.uid,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    node_name: Option<String>,
    hostname: Option<String>,
    affinity: Option<SpecAffinity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecAffinity {
    node_affinity: Option<NodeAffinity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    reason: Option<String>,
    conditions: Option<Vec<PodCondition>>,
}

#[derive(Deserialize)]
struct Wire {
    metadata: Option<Meta>,
    spec: Option<Spec>,
    status: Option<Status>,
}

impl<'de> Deserialize<'de> for SlimPod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = Wire::deserialize(d)?;
        let metadata = w
            .metadata
            .map_or_else(ObjectMeta::default, Meta::into_object_meta);
        let spec = w.spec.map(|s| PodSpec {
            node_name: s.node_name,
            hostname: s.hostname,
            affinity: s.affinity.and_then(|a| a.node_affinity).map(|n| Affinity {
                node_affinity: Some(n),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        });
        let status = w.status.map(|s| PodStatus {
            phase: s.phase,
            reason: s.reason,
            // Kubernetes 1.33+ sets a condition's observedGeneration; a protobuf watch shows Go's
            // zero where JSON shows none (as for `generation` above).
            conditions: s.conditions.map(|mut cs| {
                for c in &mut cs {
                    c.observed_generation = c.observed_generation.filter(|g| *g != 0);
                }
                cs
            }),
            ..PodStatus::default()
        });
        Ok(Self(Pod {
            metadata,
            spec,
            status,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod with every kind of field: what the slim decode keeps is exactly the kept fields,
    /// equal to a whole decode's.
    #[test]
    fn keeps_exactly_the_read_fields() -> Result<(), serde_json::Error> {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "slurm", "uid": "u1", "resourceVersion": "7",
                "generateName": "w-", "generation": 2, "creationTimestamp": "2026-01-02T03:04:05Z",
                "deletionTimestamp": "2026-01-02T03:05:05Z", "deletionGracePeriodSeconds": 30,
                "labels": {"a": "b"}, "annotations": {"c": "d"}, "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                    "name": "w", "uid": "p1", "controller": true}],
                "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {}}}],
                "selfLink": "/api/v1/namespaces/slurm/pods/w-0"},
            "spec": {"nodeName": "n1", "hostname": "w-0", "subdomain": "s",
                "containers": [{"name": "slurmd", "image": "i", "env": [{"name": "X", "value": "y"}]}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                        "values": ["n1"]}]}]}},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}},
            "status": {"phase": "Running", "reason": "R", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "slurmd", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0}]}
        });
        let slim: Pod = serde_json::from_value::<SlimPod>(json.clone())?.into();
        let whole: Pod = serde_json::from_value(json)?;
        let mut meta = whole.metadata.clone();
        meta.managed_fields = None;
        meta.self_link = None;
        assert_eq!(slim.metadata, meta);
        let (spec, whole_spec) = (slim.spec.unwrap_or_default(), whole.spec.unwrap_or_default());
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.hostname.as_deref(), Some("w-0"));
        assert!(spec.containers.is_empty() && spec.subdomain.is_none());
        let affinity = spec.affinity.unwrap_or_default();
        let whole_affinity = whole_spec.affinity.unwrap_or_default();
        assert!(affinity.node_affinity.is_some());
        assert_eq!(affinity.node_affinity, whole_affinity.node_affinity);
        assert!(affinity.pod_anti_affinity.is_none() && whole_affinity.pod_anti_affinity.is_some());
        let (status, whole_status) = (slim.status.unwrap_or_default(), whole.status.unwrap_or_default());
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.reason.as_deref(), Some("R"));
        assert!(status.conditions.is_some());
        assert_eq!(status.conditions, whole_status.conditions);
        assert!(status.pod_ip.is_none() && status.container_statuses.is_none());
        Ok(())
    }

    /// Read in protobuf with only [`KEPT`] decoded, the same pod reaches the cache as read whole
    /// in JSON: `KEPT` names every field the slim pod reads.
    #[test]
    fn the_fields_kept_in_protobuf_are_all_the_slim_pod_reads() -> Result<(), serde_json::Error> {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "slurm", "uid": "u1", "resourceVersion": "7",
                "generateName": "w-", "creationTimestamp": "2026-01-02T03:04:05Z",
                "deletionTimestamp": "2026-01-02T03:05:05Z", "deletionGracePeriodSeconds": 0,
                "labels": {"a": "b"}, "annotations": {"c": "d"}, "finalizers": ["f"],
                "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                    "name": "w", "uid": "p1", "controller": true, "blockOwnerDeletion": true}],
                "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {}}}]},
            "spec": {"nodeName": "n1", "hostname": "w-0", "subdomain": "s",
                "containers": [{"name": "slurmd", "image": "i", "env": [{"name": "X", "value": "y"}]}],
                "affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5,
                        "preference": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}]}}},
            "status": {"phase": "Running", "reason": "R", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-01-02T03:04:06Z", "message": "m", "reason": "r"}]}
        });
        let bytes = slinky_protobuf::encode(&json).unwrap_or_default();
        let kept = slinky_protobuf::decode_keeping(&bytes, &KEPT)
            .map_err(|e| serde::de::Error::custom(e.to_string()))?;
        assert!(kept["spec"].get("containers").is_none(), "{kept}");
        let from_protobuf: Pod = serde_json::from_value::<SlimPod>(kept)?.into();
        let from_json: Pod = serde_json::from_value::<SlimPod>(json)?.into();
        assert_eq!(from_protobuf, from_json);
        Ok(())
    }

    /// A condition's `observedGeneration` of 0 (Go's zero, written in protobuf by Kubernetes
    /// 1.33+ where JSON omits it) reads as none, so a condition compares equal whether the pod
    /// came from a list in JSON or a watch in protobuf; a set one is kept.
    #[test]
    fn a_conditions_zero_observed_generation_reads_as_none() -> Result<(), serde_json::Error> {
        let p: Pod = serde_json::from_value::<SlimPod>(serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "observedGeneration": 0},
            {"type": "PodScheduled", "status": "True", "observedGeneration": 3}]}}))?
        .into();
        let generations: Vec<Option<i64>> = p
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.observed_generation)
            .collect();
        assert_eq!(generations, [None, Some(3)]);
        Ok(())
    }

    /// A pod without spec or status (a watch's deleted object may be bare) decodes.
    #[test]
    fn a_bare_pod_decodes() -> Result<(), serde_json::Error> {
        let p: SlimPod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}}))?;
        assert_eq!(p.0.metadata.name.as_deref(), Some("p"));
        assert!(p.0.spec.is_none() && p.0.status.is_none());
        Ok(())
    }
}
