//! The NodeSet pod revision: a hash over exactly what determines a pod's content, so that a
//! change of any of it (template, containers, extraConf, …, the cluster domain, or the builder
//! plugin itself) gives new pods a new `controller-revision-hash` and rolls the old ones, and a
//! change of anything else (scaling, the update strategy, the Slurm partition line) restarts
//! nothing.

use serde_json::{Map, Value, json};
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

/// The NodeSet spec fields a ControllerRevision records: those of [`pod_revision`]'s that a user
/// may change (`controllerRef` and the claim templates are immutable).
pub const REVISION_FIELDS: [&str; 8] = [
    "template",
    "slurmd",
    "logfile",
    "ssh",
    "extraConf",
    "ordinalPadding",
    "oversubscribeNode",
    "scalingMode",
];

/// The name of the ControllerRevision of pod revision `hash`: `<nodeset>-<hash>`, so a pod's
/// `controller-revision-hash` label names its revision (as on a StatefulSet, whose pods carry the
/// whole name).
pub fn revision_name(nodeset: &NodeSet, hash: &str) -> String {
    format!("{}-{hash}", nodeset.metadata.name.as_deref().unwrap_or_default())
}

/// The `data` of `nodeset`'s ControllerRevision: `{"spec": {…}}` with each of
/// [`REVISION_FIELDS`], an absent one as an explicit `null`. So it is a JSON merge patch that
/// sets those fields back (`kubectl patch nodeset <n> --type merge -p "$(kubectl get
/// controllerrevision <rev> -o jsonpath='{.data}')"`), removing the ones the revision did not
/// have.
///
/// # Caveats
/// A merge patch merges objects: a key a later spec added *inside* one of these fields (a
/// template label, a `nodeSelector` entry) is kept by it; lists (containers, env) are replaced.
///
/// # Errors
/// The spec does not serialize (it always does: its maps have string keys).
pub fn revision_data(nodeset: &NodeSet) -> Result<Value, serde_json::Error> {
    // The spec as the host reads it: absent and empty fields are left out.
    let spec = serde_json::to_value(&nodeset.spec)?;
    let fields: Map<String, Value> = REVISION_FIELDS
        .iter()
        .map(|f| (f.to_string(), spec.get(*f).cloned().unwrap_or(Value::Null)))
        .collect();
    Ok(json!({ "spec": fields }))
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
            ..BuildContext::default()
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

    /// RFC 7386, as `kubectl patch --type merge` has the API server apply it.
    fn merge(target: &mut Value, patch: &Value) {
        let Value::Object(p) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = json!({});
        }
        if let Value::Object(t) = target {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
    }

    fn nodeset(spec: Value) -> NodeSet {
        serde_json::from_value(
            json!({"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": "w", "namespace": "slurm"}, "spec": spec}),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn revision_data_merged_back_restores_the_pod_revision() {
        let ctx = BuildContext::default();
        let controller = Controller::new("slurm", ControllerSpec::default());
        let a = nodeset(json!({"controllerRef": {"name": "slurm"}, "replicas": 2,
            "slurmd": {"image": "slurmd:a", "resources": {"limits": {"cpu": "2"}}},
            "template": {"metadata": {"labels": {"pool": "a"}}, "spec": {"nodeSelector": {"x": "1"}}}}));
        let data = revision_data(&a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            data["spec"].as_object().map(|m| m.len()),
            Some(REVISION_FIELDS.len()),
            "{data}"
        );
        for absent in ["logfile", "ssh", "extraConf", "ordinalPadding"] {
            assert_eq!(data["spec"][absent], Value::Null, "{absent} is an explicit null");
        }
        assert_eq!(data["spec"]["scalingMode"], "StatefulSet");
        // B changes values inside A's objects and adds fields A did not have; scaling is no
        // revision field and stays.
        let b_spec = json!({"controllerRef": {"name": "slurm"}, "replicas": 5,
            "slurmd": {"image": "slurmd:b", "resources": {"limits": {"cpu": "4"}}},
            "logfile": {"image": "alpine:3"}, "ssh": {"enabled": false}, "extraConf": "Weight=5",
            "ordinalPadding": 3, "oversubscribeNode": true,
            "template": {"metadata": {"labels": {"pool": "b"}}, "spec": {"nodeSelector": {"x": "2"}}}});
        let b = nodeset(b_spec.clone());
        let rev = |n: &NodeSet| pod_revision(n, &controller, "d", &ctx);
        assert_ne!(rev(&a), rev(&b));
        let mut back = b_spec;
        merge(&mut back, &data["spec"]);
        let back = nodeset(back);
        assert_eq!(rev(&back), rev(&a), "rolled back: {:?}", back.spec);
        assert_eq!(back.spec.replicas, Some(5), "scaling is not rolled back");
    }

    #[test]
    fn every_revision_field_is_a_pod_revision_input() {
        let ctx = BuildContext::default();
        let controller = Controller::new("slurm", ControllerSpec::default());
        let base = nodeset(json!({"controllerRef": {"name": "slurm"}}));
        let changed = [
            ("template", json!({"metadata": {"labels": {"a": "b"}}})),
            ("slurmd", json!({"image": "x"})),
            ("logfile", json!({"image": "x"})),
            ("ssh", json!({"enabled": false, "extraSshdConfig": "X 1"})),
            ("extraConf", json!("Weight=1")),
            ("ordinalPadding", json!(2)),
            ("oversubscribeNode", json!(true)),
            ("scalingMode", json!("DaemonSet")),
        ];
        assert_eq!(changed.len(), REVISION_FIELDS.len());
        for (field, value) in changed {
            assert!(REVISION_FIELDS.contains(&field), "{field}");
            let mut spec = serde_json::to_value(&base.spec).unwrap_or_else(|e| panic!("{e}"));
            spec[field] = value;
            assert_ne!(
                pod_revision(&nodeset(spec), &controller, "d", &ctx),
                pod_revision(&base, &controller, "d", &ctx),
                "{field} is a pod revision input"
            );
        }
    }
}
