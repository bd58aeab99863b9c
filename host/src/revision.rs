//! The NodeSet pod revision: a hash of **what the builders make**, not of who made it or from
//! what. The builders build one *probe* pod (ordinal 0, or a DaemonSet-mode pod of a node named
//! `probe`); the revision is the hash of that pod with its provenance (the builder annotations),
//! its revision label, and the labels and annotations it carries from the NodeSet's own metadata
//! (key and value equal) left out. So:
//!
//! * a host upgrade, a hot reload, a rebuilt plugin, a BuilderPlugin step or a settings change
//!   that makes the same pod gives the same revision and restarts nothing;
//! * one that makes another pod (a label added, an image changed) gives a new revision, and the
//!   rolling update replaces the pods within `maxUnavailable`;
//! * scaling, the update strategy and the partition line are no input, and the NodeSet's own
//!   labels and annotations copied onto pods are none either (as in Slinky, `kubectl label
//!   nodeset …` restarts no worker; new pods get the labels when they are built). A builder that
//!   *reads* one (an annotation that turns a feature on) and builds another pod from it rolls
//!   the pods, as any other change of its output.
//!
//! Provenance lives on the pods' metadata (`slinky.slurm.net/builder`, `…/builder-digest`) and is
//! patched in place when only it changes.
//!
//! Pods labelled by another scheme (a host before output revisions: 10 hex digits of an input
//! hash; Slinky: its bare FNV hash, e.g. `76f8d46bff`) are compared one by one with what the builders make for
//! their ordinal, and relabelled when equal ([`crate::reconcile::nodeset`]'s adoption): the
//! upgrade to output revisions restarts nothing. An output revision is [`OUTPUT_REVISION_LEN`]
//! hex digits, which tells it apart.
//!
//! Building a probe costs a builder call: the host remembers each NodeSet's revision under
//! [`build_key`], a hash of everything the builders are given, and builds again only when it
//! changes.
//!
//! # Caveats
//! The probe is one pod: a builder whose output differs by ordinal in ways ordinal 0 does not
//! show (settings for ordinal 7 only) changes ordinal 7's pod without a new revision. Such a
//! pod is replaced when it is replaced for another reason, or by deleting it.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use slinky_api::{Controller, NodeSet, keys};

use crate::plugins::{BuildContext, Builder, PluginError, PodIdentity};

/// How many hex digits an output revision has (a host before them wrote 10).
pub const OUTPUT_REVISION_LEN: usize = 12;

/// The revision label the probe pod is built with (left out of the hash).
const PROBE_REVISION: &str = "probe";

/// Whether `label` is an output revision (of this scheme), rather than another scheme's.
pub fn is_output_revision(label: &str) -> bool {
    label.len() == OUTPUT_REVISION_LEN
        && label
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The identity the probe pod is built with.
pub fn probe_identity(nodeset: &NodeSet) -> PodIdentity {
    if nodeset.is_daemon() {
        PodIdentity {
            ordinal: 0,
            name: nodeset.daemon_pod_name("probe"),
            hostname: "probe".into(),
            revision: PROBE_REVISION.into(),
        }
    } else {
        PodIdentity::for_ordinal(nodeset, 0, PROBE_REVISION)
    }
}

/// The revision of `nodeset`'s built probe pod: 12 hex digits of the hash of the pod without
/// its revision label, its builder annotations, and the labels and annotations equal to the
/// NodeSet's own.
pub fn output_revision(probe: &Pod, nodeset: &NodeSet) -> String {
    let mut pod = probe.clone();
    let same = |from: &Option<std::collections::BTreeMap<String, String>>, k: &String, v: &String| {
        from.as_ref().and_then(|m| m.get(k)) == Some(v)
    };
    if let Some(l) = pod.metadata.labels.as_mut() {
        l.remove(keys::LABEL_REVISION_HASH);
        l.retain(|k, v| !same(&nodeset.metadata.labels, k, v));
    }
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(keys::ANNOTATION_BUILDER);
        a.remove(keys::ANNOTATION_BUILDER_DIGEST);
        a.retain(|k, v| !same(&nodeset.metadata.annotations, k, v));
    }
    // The pod's fields serialize in a fixed order and its maps are sorted: the text is canonical.
    let text = serde_json::to_string(&pod).unwrap_or_default();
    hex::encode(&Sha256::digest(text.as_bytes())[..OUTPUT_REVISION_LEN / 2])
}

/// The provenance of a built pod: its builder annotations, to patch onto pods of its revision.
pub fn provenance(pod: &Pod) -> std::collections::BTreeMap<String, String> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| {
            k.as_str() == keys::ANNOTATION_BUILDER || k.as_str() == keys::ANNOTATION_BUILDER_DIGEST
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Build `nodeset`'s probe pod with `builder`: the pod [`output_revision`] hashes.
///
/// # Errors
/// The builder's error.
pub fn build_probe<B: Builder + ?Sized>(
    builder: &B,
    nodeset: &NodeSet,
    controller: &Controller,
    ctx: &BuildContext,
) -> Result<Pod, PluginError> {
    builder.build_pod(ctx, nodeset, controller, &probe_identity(nodeset))
}

/// The pod revision of `nodeset` as `builder` builds it: [`output_revision`] of its probe.
///
/// # Errors
/// The builder's error.
pub fn pod_revision<B: Builder + ?Sized>(
    builder: &B,
    nodeset: &NodeSet,
    controller: &Controller,
    ctx: &BuildContext,
) -> Result<String, PluginError> {
    build_probe(builder, nodeset, controller, ctx).map(|p| output_revision(&p, nodeset))
}

/// A hash of everything the probe is built from: the NodeSet's name, namespace, labels,
/// annotations and spec (but `replicas`, so scaling builds nothing), the Controller's metadata
/// and spec, the build context
/// and the builder's digest (a pipeline's covers its steps and their settings). While it stays
/// the same, so does the revision.
pub fn build_key(
    nodeset: &NodeSet,
    controller: &Controller,
    builder_digest: &str,
    ctx: &BuildContext,
) -> String {
    let mut spec = serde_json::to_value(&nodeset.spec).unwrap_or(Value::Null);
    if let Some(m) = spec.as_object_mut() {
        m.remove("replicas");
    }
    let input = json!({
        "nodeset": [nodeset.metadata.name, nodeset.metadata.namespace,
            nodeset.metadata.labels, nodeset.metadata.annotations, spec],
        "controller": [controller.metadata.name, controller.metadata.namespace,
            controller.metadata.labels, controller.metadata.annotations, controller.spec],
        "context": [ctx.cluster_domain, ctx.settings],
        "builder": builder_digest,
    });
    hex::encode(&Sha256::digest(input.to_string().as_bytes())[..16])
}

/// The NodeSet spec fields a ControllerRevision records: those the bundled builder builds pods
/// from that a user may change (`controllerRef` and the claim templates are immutable).
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
    fn the_revision_is_the_output_without_its_provenance() {
        let pod = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| -> Pod {
            let map =
                |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
            Pod {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some("w-0".into()),
                    labels: map(labels),
                    annotations: map(annotations),
                    ..Default::default()
                },
                ..Default::default()
            }
        };
        let mut ns = NodeSet::new("w", NodeSetSpec::default());
        ns.metadata.labels = Some([("team".to_string(), "hpc".to_string())].into());
        let base = output_revision(
            &pod(
                &[("app", "slurmd"), (keys::LABEL_REVISION_HASH, "probe")],
                &[
                    (keys::ANNOTATION_BUILDER, "a@1"),
                    (keys::ANNOTATION_BUILDER_DIGEST, "sha256:1"),
                ],
            ),
            &ns,
        );
        assert!(is_output_revision(&base), "{base}");
        let other_builder = output_revision(
            &pod(
                &[
                    ("app", "slurmd"),
                    (keys::LABEL_REVISION_HASH, "other"),
                    ("team", "hpc"),
                ],
                &[
                    (keys::ANNOTATION_BUILDER, "b@2 > c@1"),
                    (keys::ANNOTATION_BUILDER_DIGEST, "sha256:2"),
                ],
            ),
            &ns,
        );
        assert_eq!(
            base, other_builder,
            "provenance, the revision label and the NodeSet's labels are no output"
        );
        let labelled = output_revision(&pod(&[("app", "slurmd"), ("extra", "1")], &[]), &ns);
        assert_ne!(base, labelled, "a label is output");
        let other_value = output_revision(&pod(&[("app", "slurmd"), ("team", "ops")], &[]), &ns);
        assert_ne!(
            base, other_value,
            "a label the NodeSet has with another value is output"
        );
        assert!(
            !is_output_revision("0123456789"),
            "a revision of the input-hash scheme"
        );
        assert!(!is_output_revision("w-7d9f8c6b5"), "Slinky's");
    }

    #[test]
    fn the_build_key_follows_what_builders_are_given_but_scaling() {
        let ctx = BuildContext::default();
        let controller = Controller::new("slurm", ControllerSpec::default());
        let mut ns = NodeSet::new(
            "w",
            NodeSetSpec {
                replicas: Some(1),
                ..Default::default()
            },
        );
        let base = build_key(&ns, &controller, "d1", &ctx);
        ns.spec.replicas = Some(7);
        assert_eq!(
            build_key(&ns, &controller, "d1", &ctx),
            base,
            "scaling builds no probe"
        );
        assert_ne!(build_key(&ns, &controller, "d2", &ctx), base, "another builder");
        let mut labelled = ns.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert_ne!(
            build_key(&labelled, &controller, "d1", &ctx),
            base,
            "a builder may read labels"
        );
        ns.spec.partition = Some(Partition {
            enabled: true,
            config: Some("MaxTime=1".into()),
        });
        assert_ne!(
            build_key(&ns, &controller, "d1", &ctx),
            base,
            "any other spec field"
        );
        let mut c2 = controller.clone();
        c2.spec.external = true;
        c2.spec.external_config = Some(ExternalConfig {
            host: "ctld".into(),
            port: 6817,
        });
        ns.spec.partition = None;
        assert_ne!(build_key(&ns, &c2, "d1", &ctx), base, "the Controller");
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
        let rev = |n: &NodeSet| build_key(n, &controller, "d", &ctx);
        assert_ne!(rev(&a), rev(&b));
        let mut back = b_spec;
        merge(&mut back, &data["spec"]);
        let back = nodeset(back);
        assert_eq!(rev(&back), rev(&a), "rolled back: {:?}", back.spec);
        assert_eq!(back.spec.replicas, Some(5), "scaling is not rolled back");
    }

    #[test]
    fn every_revision_field_is_a_build_input() {
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
                build_key(&nodeset(spec), &controller, "d", &ctx),
                build_key(&base, &controller, "d", &ctx),
                "{field} is a build input"
            );
        }
    }
}
