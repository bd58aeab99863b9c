//! Chainable test objects for the NodeSet planner: `pod(&w, 3).owned().ready().arc()`.

use std::sync::Arc;

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
    jiff::Timestamp,
};
use kube::ResourceExt;
use slinky_api::{ControllerReference, NodeSet, NodeSetSpec, keys, owners::controller_ref};

/// A NodeSet `name` in namespace `slurm` with a UID, `replicas` and Controller `slurm`.
pub fn nodeset(name: &str, replicas: i32) -> NodeSet {
    let mut ns = NodeSet::new(
        name,
        NodeSetSpec {
            controller_ref: ControllerReference {
                name: "slurm".into(),
                namespace: None,
            },
            replicas: Some(replicas),
            ..Default::default()
        },
    );
    ns.metadata.namespace = Some("slurm".into());
    ns.metadata.uid = Some(format!("uid-{name}"));
    ns.metadata.generation = Some(1);
    ns
}

/// A pod under construction.
pub struct PodFixture {
    pod: Pod,
    nodeset: NodeSet,
}

/// Pod `<nodeset>-<ordinal>` with the NodeSet's selector labels, no owner, Running and Ready,
/// of revision `rev1`.
pub fn pod(nodeset: &NodeSet, ordinal: u32) -> PodFixture {
    let mut labels = nodeset.selector_labels();
    labels.insert(keys::LABEL_REVISION_HASH.into(), "rev1".into());
    let pod = Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(nodeset.pod_name(ordinal)),
            namespace: nodeset.namespace(),
            uid: Some(format!("pod-uid-{}", nodeset.pod_name(ordinal))),
            labels: Some(labels),
            creation_timestamp: Some(Time(Timestamp::UNIX_EPOCH)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-0".into()),
            ..Default::default()
        }),
        status: None,
    };
    PodFixture {
        pod,
        nodeset: nodeset.clone(),
    }
    .phase("Running")
    .ready()
}

impl PodFixture {
    fn controller(mut self, kind: &str, name: &str, uid: &str) -> Self {
        self.pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        self
    }

    /// Controlled by the NodeSet.
    pub fn owned(mut self) -> Self {
        self.pod.metadata.owner_references = controller_ref(&self.nodeset).map(|r| vec![r]);
        self
    }

    /// Controlled by something else.
    pub fn stranger(self, kind: &str, name: &str) -> Self {
        self.controller(kind, name, "uid-stranger")
    }

    /// No controller.
    pub fn orphan(mut self) -> Self {
        self.pod.metadata.owner_references = None;
        self
    }

    /// Another name.
    pub fn named(mut self, name: &str) -> Self {
        self.pod.metadata.name = Some(name.into());
        self.pod.metadata.uid = Some(format!("pod-uid-{name}"));
        self
    }

    /// Without the NodeSet's selector labels (an owned pod: it lost them).
    pub fn without_selector(mut self) -> Self {
        self.pod.metadata.labels = Some(Default::default());
        self
    }

    /// An owned pod whose labels were edited away.
    pub fn labels_lost(self) -> Self {
        self.without_selector()
    }

    /// In another namespace.
    pub fn in_namespace(mut self, ns: &str) -> Self {
        self.pod.metadata.namespace = Some(ns.into());
        self
    }

    /// Being deleted.
    pub fn terminating(mut self) -> Self {
        self.pod.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        self
    }

    /// In `phase`.
    pub fn phase(mut self, phase: &str) -> Self {
        self.pod.status.get_or_insert_default().phase = Some(phase.into());
        self
    }

    /// Ready since the epoch (available whatever `minReadySeconds`).
    pub fn ready(mut self) -> Self {
        self.pod.status.get_or_insert_default().conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(Time(Timestamp::UNIX_EPOCH)),
            ..Default::default()
        }]);
        self
    }

    /// Not ready.
    pub fn unready(mut self) -> Self {
        self.pod.status.get_or_insert_default().conditions = None;
        self
    }

    /// Pending and unscheduled.
    pub fn pending(mut self) -> Self {
        self.pod.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        if let Some(s) = self.pod.spec.as_mut() {
            s.node_name = None;
        }
        self
    }

    /// Of revision `rev`.
    pub fn revision(mut self, rev: &str) -> Self {
        self.pod
            .labels_mut()
            .insert(keys::LABEL_REVISION_HASH.into(), rev.into());
        self
    }

    /// With a `pod-deletion-cost` annotation.
    pub fn deletion_cost(mut self, cost: i64) -> Self {
        self.pod
            .annotations_mut()
            .insert(keys::ANNOTATION_POD_DELETION_COST.into(), cost.to_string());
        self
    }

    /// With the annotation `key=value`.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.pod.annotations_mut().insert(key.into(), value.into());
        self
    }

    /// With a `pod-deadline` annotation (RFC 3339).
    pub fn deadline(self, at: &str) -> Self {
        self.annotation(keys::ANNOTATION_POD_DEADLINE, at)
    }

    /// Bound to `node`.
    pub fn on_node(mut self, node: &str) -> Self {
        self.pod.spec.get_or_insert_default().node_name = Some(node.into());
        self
    }

    /// With the label `key=value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.pod.labels_mut().insert(key.into(), value.into());
        self
    }

    /// Created `secs` seconds after the epoch.
    pub fn created(mut self, secs: i64) -> Self {
        self.pod.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH),
        ));
        self
    }

    /// The pod.
    pub fn arc(self) -> Arc<Pod> {
        Arc::new(self.pod)
    }
}
