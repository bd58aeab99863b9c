//! The NodeSet pod revision: a hash over everything that determines a pod's content, so that a
//! change of any of it (template, containers, extraConf, …, or the builder plugin itself) gives
//! new pods a new `controller-revision-hash` and rolls the old ones.

use serde_json::json;
use sha2::{Digest, Sha256};
use slinky_api::{Controller, NodeSet};

/// The pod revision of `nodeset` built by the builder with digest `builder_digest`: 10 hex digits.
///
/// Covered: every spec field a builder reads for a pod (all but `replicas`, `updateStrategy`, `minReadySeconds`,
/// `revisionHistoryLimit`, `persistentVolumeClaimRetentionPolicy`, `workloadDisruptionProtection`
/// and `pruneSlurmNodeRecords`), the Controller fields the bundled builder reads (name, namespace,
/// `slurmKeyRef`, `external`, `externalConfig`), and the builder digest. The NodeSet's own labels
/// and annotations are not covered, as in Slinky: `kubectl label nodeset …` must not restart a
/// Slurm cluster's workers; new pods get them when they are built.
pub fn pod_revision(nodeset: &NodeSet, controller: &Controller, builder_digest: &str) -> String {
    let s = &nodeset.spec;
    let input = json!({
        "spec": {
            "controllerRef": s.controller_ref,
            "scalingMode": s.scaling_mode,
            "slurmd": s.slurmd,
            "logfile": s.logfile,
            "ssh": s.ssh,
            "template": s.template,
            "extraConf": s.extra_conf,
            "partition": s.partition,
            "volumeClaimTemplates": s.volume_claim_templates,
            "ordinalPadding": s.ordinal_padding,
            "pinToNode": s.pin_to_node,
            "oversubscribeNode": s.oversubscribe_node,
        },
        "controller": {
            "name": controller.metadata.name,
            "namespace": controller.metadata.namespace,
            "slurmKeyRef": controller.spec.slurm_key_ref,
            "external": controller.spec.external,
            "externalConfig": controller.spec.external_config,
        },
        "builder": builder_digest,
    });
    // serde_json maps are ordered by key, so the text is canonical.
    let digest = Sha256::digest(input.to_string().as_bytes());
    hex::encode(&digest[..5])
}

#[cfg(test)]
mod tests {
    use slinky_api::{ControllerSpec, NodeSetSpec};

    use super::*;

    #[test]
    fn revision_follows_pod_inputs_only() {
        let controller = Controller::new("slurm", ControllerSpec::default());
        let mut ns = NodeSet::new(
            "w",
            NodeSetSpec {
                replicas: Some(1),
                ..Default::default()
            },
        );
        let base = pod_revision(&ns, &controller, "d1");
        assert_eq!(base.len(), 10);
        ns.spec.replicas = Some(5);
        assert_eq!(
            pod_revision(&ns, &controller, "d1"),
            base,
            "scaling does not roll pods"
        );
        assert_ne!(
            pod_revision(&ns, &controller, "d2"),
            base,
            "a new builder rolls pods"
        );
        ns.spec.extra_conf = Some("Weight=1".into());
        assert_ne!(
            pod_revision(&ns, &controller, "d1"),
            base,
            "a pod field rolls pods"
        );
    }
}
