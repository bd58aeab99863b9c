//! The NodeSet pod revision: a hash over exactly what determines a pod's content, so that a
//! change of any of it (template, containers, extraConf, …, the cluster domain, or the builder
//! plugin itself) gives new pods a new `controller-revision-hash` and rolls the old ones, and a
//! change of anything else (scaling, the update strategy, the Slurm partition line) restarts
//! nothing.

use serde_json::json;
use sha2::{Digest, Sha256};
use slinky_api::{Controller, NodeSet};

use crate::plugins::BuildContext;

/// The pod revision of `nodeset` built by the builder with digest `builder_digest` in `ctx`:
/// 10 hex digits.
///
/// Covered: the NodeSet fields the bundled builder reads (`controllerRef`, `scalingMode`,
/// `slurmd`, `logfile`, `ssh`, `template`, `extraConf`, `ordinalPadding`, `oversubscribeNode`,
/// the name and namespace), the Controller fields it reads (name, namespace, `slurmKeyRef`,
/// `external`, `externalConfig`), the build context (`--cluster-domain`) and the builder digest.
///
/// Not covered: `replicas`, `updateStrategy`, `minReadySeconds`, `revisionHistoryLimit`,
/// `partition` (a `slurm.conf` line, not a pod field), `pinToNode`, the claim templates' specs
/// (a claim is made once and reused: only their names are pod fields, and they are covered),
/// `persistentVolumeClaimRetentionPolicy`, `workloadDisruptionProtection`,
/// `pruneSlurmNodeRecords`, and the NodeSet's own labels and annotations: as in Slinky,
/// `kubectl label nodeset …` must not restart a Slurm cluster's workers; new pods get them when
/// they are built. A custom builder that reads other fields should say so in its docs: changing
/// them rolls nothing until the pods are replaced for another reason.
pub fn pod_revision(
    nodeset: &NodeSet,
    controller: &Controller,
    builder_digest: &str,
    ctx: &BuildContext,
) -> String {
    let s = &nodeset.spec;
    let mut input = json!({
        "nodeset": {
            "name": nodeset.metadata.name,
            "namespace": nodeset.metadata.namespace,
        },
        "spec": {
            "controllerRef": s.controller_ref,
            "scalingMode": s.scaling_mode,
            "slurmd": s.slurmd,
            "logfile": s.logfile,
            "ssh": s.ssh,
            "template": s.template,
            "extraConf": s.extra_conf,
            "ordinalPadding": s.ordinal_padding,
            "oversubscribeNode": s.oversubscribe_node,
        },
        "controller": {
            "name": controller.metadata.name,
            "namespace": controller.metadata.namespace,
            "slurmKeyRef": controller.spec.slurm_key_ref,
            "external": controller.spec.external,
            "externalConfig": controller.spec.external_config,
        },
        "context": {
            "clusterDomain": ctx.cluster_domain,
        },
        "builder": builder_digest,
    });
    // The claim templates' names are the pod's claim volumes; absent when there are none, so
    // NodeSets without claims keep the revisions they had before claims were served.
    let claims: Vec<String> = nodeset
        .claim_templates()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    if !claims.is_empty() {
        input["spec"]["volumeClaimTemplates"] = json!(claims);
    }
    // serde_json maps are ordered by key, so the text is canonical.
    let digest = Sha256::digest(input.to_string().as_bytes());
    hex::encode(&digest[..5])
}

#[cfg(test)]
mod tests {
    use slinky_api::{ControllerSpec, ExternalConfig, NodeSetSpec, Partition};

    use super::*;

    #[test]
    fn revision_follows_pod_inputs_only() {
        let ctx = BuildContext::default();
        let mut controller = Controller::new("slurm", ControllerSpec::default());
        let mut ns = NodeSet::new(
            "w",
            NodeSetSpec {
                replicas: Some(1),
                ..Default::default()
            },
        );
        let base = pod_revision(&ns, &controller, "d1", &ctx);
        assert_eq!(base.len(), 10);
        let same = |ns: &NodeSet, c: &Controller| pod_revision(ns, c, "d1", &ctx) == base;

        ns.spec.replicas = Some(5);
        ns.spec.partition = Some(Partition {
            enabled: true,
            config: Some("MaxTime=UNLIMITED".into()),
        });
        ns.spec.min_ready_seconds = Some(10);
        ns.metadata.labels = Some([("team".to_string(), "hpc".to_string())].into());
        controller.spec.extra_conf = Some("SchedulerType=sched/backfill".into());
        assert!(
            same(&ns, &controller),
            "scaling, partition, labels, other Controller fields roll nothing"
        );

        assert_ne!(
            pod_revision(&ns, &controller, "d2", &ctx),
            base,
            "a new builder rolls pods"
        );
        let other_domain = BuildContext {
            cluster_domain: "example.org".into(),
        };
        assert_ne!(
            pod_revision(&ns, &controller, "d1", &other_domain),
            base,
            "--cluster-domain"
        );
        let mut c2 = controller.clone();
        c2.spec.external = true;
        c2.spec.external_config = Some(ExternalConfig {
            host: "ctld".into(),
            port: 6817,
        });
        assert!(!same(&ns, &c2), "the conf server");
        let claim = |size: &str| {
            serde_json::json!({"metadata": {"name": "scratch"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}})
        };
        let mut with_claim = ns.clone();
        with_claim.spec.volume_claim_templates = vec![claim("1Gi")];
        let claimed = pod_revision(&with_claim, &controller, "d1", &ctx);
        assert_ne!(claimed, base, "a new claim template is a new pod volume");
        with_claim.spec.volume_claim_templates = vec![claim("2Gi")];
        assert_eq!(
            pod_revision(&with_claim, &controller, "d1", &ctx),
            claimed,
            "a claim's size is not a pod field (claims are made once)"
        );
        ns.spec.extra_conf = Some("Weight=1".into());
        assert!(!same(&ns, &controller), "a pod field rolls pods");
    }
}
