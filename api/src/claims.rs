//! Per-pod volume claims of a NodeSet (`spec.volumeClaimTemplates`), as a StatefulSet and
//! Slinky make them: claim `<template>-<pod>` (`<template>-<nodeset>-<padded ordinal>`), labelled
//! with the template's labels and the NodeSet's selector labels, mounted in the pod as a volume
//! named after the template (replacing a pod volume of that name), and owned according to
//! `spec.persistentVolumeClaimRetentionPolicy`.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use serde::Deserialize;

use crate::{
    NodeSet,
    checks::SpecProblem,
    validation::{dns1123_label, dns1123_subdomain},
};

/// What happens to a claim when its pod is scaled away or its NodeSet deleted.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Retention {
    /// The claim stays (the default): data survives, and a pod of the same ordinal reuses it.
    #[default]
    Retain,
    /// The claim is deleted (by the garbage collector, through an owner reference).
    Delete,
}

/// `spec.persistentVolumeClaimRetentionPolicy`.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionPolicy {
    /// When the NodeSet is deleted.
    #[serde(default)]
    pub when_deleted: Retention,
    /// When a pod is removed by a scale-in.
    #[serde(default)]
    pub when_scaled: Retention,
}

const TEMPLATES: &str = "spec.volumeClaimTemplates";

/// The first key of `raw` (with its path under `at`) that `known` (`raw` parsed into its type and
/// serialized back) does not have: a field the type does not know. Nulls are skipped.
fn unknown_field(raw: &serde_json::Value, known: &serde_json::Value, at: &str) -> Option<String> {
    use serde_json::Value;
    match (raw, known) {
        (Value::Object(r), Value::Object(k)) => r.iter().find_map(|(key, v)| match (v, k.get(key)) {
            (Value::Null, _) => None,
            (_, None) => Some(format!("{at}.{key}")),
            (v, Some(kv)) => unknown_field(v, kv, &format!("{at}.{key}")),
        }),
        (Value::Array(r), Value::Array(k)) => r
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (v, kv))| unknown_field(v, kv, &format!("{at}[{i}]"))),
        _ => None,
    }
}
const POLICY: &str = "spec.persistentVolumeClaimRetentionPolicy";

/// The claim of `template` for the pod named `pod`: `<template>-<pod>` (Slinky's and a
/// StatefulSet's naming).
pub fn claim_name(template: &str, pod: &str) -> String {
    format!("{template}-{pod}")
}

impl NodeSet {
    /// The claim templates, each checked: a PersistentVolumeClaim with a name that is a DNS label
    /// (it names the pod volume too), no two alike.
    ///
    /// # Errors
    /// The first template that is not one, naming it and the fix.
    pub fn claim_templates(&self) -> Result<Vec<PersistentVolumeClaim>, SpecProblem> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::with_capacity(self.spec.volume_claim_templates.len());
        for (i, raw) in self.spec.volume_claim_templates.iter().enumerate() {
            let claim: PersistentVolumeClaim = serde_json::from_value(raw.clone()).map_err(|e| {
                SpecProblem::new(
                    format!("{TEMPLATES}[{i}]"),
                    format!("is not a PersistentVolumeClaim: {e}"),
                )
            })?;
            // A key the claim type does not have (a typo such as `storageClass`) would be
            // dropped without a word: refuse it, as kube-apiserver's strict field validation does.
            let known = serde_json::to_value(&claim).unwrap_or_default();
            if let Some(path) = unknown_field(raw, &known, &format!("{TEMPLATES}[{i}]")) {
                return Err(SpecProblem::new(
                    path,
                    "is not a field of a PersistentVolumeClaim: remove it or fix its spelling",
                ));
            }
            let name = claim.metadata.name.clone().unwrap_or_default();
            let field = format!("{TEMPLATES}[{i}].metadata.name");
            if let Some(e) = dns1123_label(&name).into_iter().next() {
                return Err(SpecProblem::new(
                    field,
                    format!("{name:?} {e} (it names the pod volume the claim is mounted as)"),
                ));
            }
            if !seen.insert(name.clone()) {
                return Err(SpecProblem::new(field, format!("{name:?} is used twice")));
            }
            out.push(claim);
        }
        Ok(out)
    }

    /// `spec.persistentVolumeClaimRetentionPolicy` (Retain, Retain when unset).
    ///
    /// # Errors
    /// A value other than `Retain` or `Delete`, or an unknown key.
    pub fn retention_policy(&self) -> Result<RetentionPolicy, SpecProblem> {
        match &self.spec.persistent_volume_claim_retention_policy {
            None => Ok(RetentionPolicy::default()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                SpecProblem::new(
                    POLICY,
                    format!("{e}: whenDeleted and whenScaled are each Retain (the default) or Delete"),
                )
            }),
        }
    }

    /// The spec problems of the claim templates and the retention policy.
    pub(crate) fn claim_problems(&self) -> Vec<SpecProblem> {
        let mut problems: Vec<SpecProblem> = self.claim_templates().err().into_iter().collect();
        problems.extend(self.retention_policy().err());
        problems
    }

    /// The problems of the claim names of the pod `pod` (`<template>-<pod>` must be a DNS
    /// subdomain).
    pub(crate) fn claim_name_problems(&self, pod: &str) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        for t in self.claim_templates().unwrap_or_default() {
            let template = t.metadata.name.as_deref().unwrap_or_default();
            let claim = claim_name(template, pod);
            if let Some(e) = dns1123_subdomain(&claim).into_iter().next() {
                problems.push(SpecProblem::new(
                    format!("{TEMPLATES}[name={template}]"),
                    format!(
                        "the claim name {claim:?} of pod {pod} {e}: shorten the template or \
                         NodeSet name"
                    ),
                ));
            }
        }
        problems
    }

    /// The name of the claim of `template` for the pod of `ordinal`: `<template>-<pod name>`.
    pub fn claim_name(&self, template: &str, ordinal: u32) -> String {
        claim_name(template, &self.pod_name(ordinal))
    }

    /// The claims of the pod of `ordinal` (see [`NodeSet::claims_of_pod`]).
    pub fn claims_of(&self, ordinal: u32) -> Vec<PersistentVolumeClaim> {
        self.claims_of_pod(&self.pod_name(ordinal))
    }

    /// The claims of the pod named `pod` (an ordinal's, or in DaemonSet mode a node's), named
    /// `<template>-<pod>`, namespaced and labelled (the template's labels, then the NodeSet's
    /// selector labels), without owner references (see [`claim_owners`]). Empty when the
    /// templates are invalid (the spec check reports them).
    pub fn claims_of_pod(&self, pod: &str) -> Vec<PersistentVolumeClaim> {
        let templates = self.claim_templates().unwrap_or_default();
        templates
            .into_iter()
            .map(|mut claim| {
                let template = claim.metadata.name.take().unwrap_or_default();
                claim.metadata.name = Some(claim_name(&template, pod));
                claim.metadata.namespace = self.metadata.namespace.clone();
                claim
                    .metadata
                    .labels
                    .get_or_insert_with(BTreeMap::new)
                    .extend(self.selector_labels());
                claim.status = None;
                claim
            })
            .collect()
    }

    /// Mount its claims in `pod` (named by its name): one volume per template, named after it, in
    /// the templates' order and before the pod's other volumes; a pod volume of the same name is
    /// replaced (as `UpdateStorage` does).
    pub fn set_claim_volumes(&self, pod: &mut Pod) {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let templates = self.claim_templates().unwrap_or_default();
        if templates.is_empty() {
            return;
        }
        let Some(spec) = pod.spec.as_mut() else {
            return;
        };
        let names: Vec<String> = templates
            .iter()
            .map(|t| t.metadata.name.clone().unwrap_or_default())
            .collect();
        let mut volumes: Vec<Volume> = names
            .iter()
            .map(|template| Volume {
                name: template.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim_name(template, &pod_name),
                    read_only: None,
                }),
                ..Default::default()
            })
            .collect();
        volumes.extend(
            spec.volumes
                .take()
                .into_iter()
                .flatten()
                .filter(|v| !names.contains(&v.name)),
        );
        spec.volumes = Some(volumes);
    }
}

/// The owner references a claim of pod `pod_name` should have under `policy`: its other owners
/// kept, then the pod's alone when the pod is being scaled away and claims go with it
/// (`scaled_away` is the pod's reference then), else the NodeSet's when claims go with the
/// NodeSet. Plain references (not controllers), as the StatefulSet controller sets them.
pub fn claim_owners(
    current: &[OwnerReference],
    policy: RetentionPolicy,
    nodeset: &OwnerReference,
    pod_name: &str,
    scaled_away: Option<&OwnerReference>,
) -> Vec<OwnerReference> {
    let ours = |r: &OwnerReference| {
        r.uid == nodeset.uid || (r.kind == "Pod" && r.api_version == "v1" && r.name == pod_name)
    };
    let plain = |r: &OwnerReference| OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..r.clone()
    };
    let mut out: Vec<OwnerReference> = current.iter().filter(|r| !ours(r)).cloned().collect();
    match (policy.when_scaled, scaled_away) {
        // The pod alone: the collector deletes a claim once *all* its owners are gone.
        (Retention::Delete, Some(pod)) => out.push(plain(pod)),
        _ if policy.when_deleted == Retention::Delete => out.push(plain(nodeset)),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    type R = Result<(), Box<dyn std::error::Error>>;

    fn nodeset(spec: serde_json::Value) -> Result<NodeSet, serde_json::Error> {
        let mut spec = spec;
        spec["controllerRef"] = json!({"name": "slurm"});
        serde_json::from_value(json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": "gpu", "namespace": "hpc", "uid": "u-ns"},
            "spec": spec,
        }))
    }

    fn scratch() -> serde_json::Value {
        json!({"metadata": {"name": "scratch", "labels": {"tier": "fast"}},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    }

    #[test]
    fn claims_are_named_labelled_and_mounted_per_ordinal() -> R {
        let ns = nodeset(json!({"ordinalPadding": 2, "volumeClaimTemplates": [scratch()]}))?;
        let claims = ns.claims_of(3);
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("scratch-gpu-03"));
        assert_eq!(claims[0].metadata.namespace.as_deref(), Some("hpc"));
        let labels = claims[0].metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["tier"], "fast");
        for (k, v) in ns.selector_labels() {
            assert_eq!(labels[&k], v);
        }
        let mut pod: Pod = serde_json::from_value(json!({"metadata": {"name": "gpu-03"},
            "spec": {"containers": [{"name": "slurmd"}],
            "volumes": [{"name": "etc", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}]}}))?;
        ns.set_claim_volumes(&mut pod);
        let volumes = pod.spec.and_then(|s| s.volumes).unwrap_or_default();
        let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["scratch", "etc"],
            "the claim replaces the pod's namesake volume"
        );
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("scratch-gpu-03")
        );
        Ok(())
    }

    #[test]
    fn bad_templates_and_policies_are_spec_problems() -> R {
        let ns = nodeset(json!({"volumeClaimTemplates": [{"metadata": {"name": "Scratch"}}]}))?;
        let p = ns.claim_problems();
        assert_eq!(p[0].field, "spec.volumeClaimTemplates[0].metadata.name", "{p:?}");
        let ns = nodeset(json!({"volumeClaimTemplates": [scratch(), scratch()]}))?;
        assert!(ns.claim_problems()[0].message.contains("used twice"));
        let ns = nodeset(json!({"volumeClaimTemplates": [{"metadata": {"name": "s"},
            "spec": {"storageClass": "fast", "resources": {"requests": {"storage": "1Gi"}}}}]}))?;
        let p = ns.claim_problems();
        assert_eq!(
            p[0].field, "spec.volumeClaimTemplates[0].spec.storageClass",
            "{p:?}"
        );
        assert!(
            nodeset(json!({"volumeClaimTemplates": [scratch()]}))?
                .claim_problems()
                .is_empty()
        );
        let ns = nodeset(json!({"volumeClaimTemplates": [{"spec": "nope"}]}))?;
        assert!(
            ns.claim_problems()[0]
                .message
                .contains("not a PersistentVolumeClaim")
        );
        let ns = nodeset(json!({"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Keep"}}))?;
        let p = ns.claim_problems();
        assert_eq!(p[0].field, POLICY);
        assert!(p[0].message.contains("Retain (the default) or Delete"), "{p:?}");
        let long = "x".repeat(240);
        let ns = nodeset(json!({"volumeClaimTemplates": [{"metadata": {"name": &long[..60]}}]}))?;
        assert!(ns.claim_name_problems(&ns.pod_name(1)).is_empty());
        let mut ns = ns;
        ns.metadata.name = Some(long[..200].to_string());
        assert!(
            ns.claim_name_problems(&ns.pod_name(1))[0]
                .message
                .contains("shorten")
        );
        Ok(())
    }

    #[test]
    fn owners_follow_the_retention_policy() {
        let owner = |kind: &str, uid: &str| OwnerReference {
            api_version: if kind == "Pod" {
                "v1".into()
            } else {
                "slinky.slurm.net/v1beta1".into()
            },
            kind: kind.into(),
            name: if kind == "Pod" {
                "gpu-0".into()
            } else {
                kind.to_lowercase()
            },
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let (ns, pod, other) = (
            owner("NodeSet", "u-ns"),
            owner("Pod", "u-pod"),
            owner("Backup", "u-b"),
        );
        let retain = RetentionPolicy::default();
        let delete = RetentionPolicy {
            when_deleted: Retention::Delete,
            when_scaled: Retention::Delete,
        };
        // Retain: our references go, a foreign one stays.
        let current = [other.clone(), ns.clone(), pod.clone()];
        let got = claim_owners(&current, retain, &ns, "gpu-0", Some(&pod));
        assert_eq!(got, std::slice::from_ref(&other));
        // Delete/Delete on a pod scaled away: the pod alone (a claim is collected only once all
        // its owners are gone), as a plain reference.
        let got = claim_owners(std::slice::from_ref(&ns), delete, &ns, "gpu-0", Some(&pod));
        let uids: Vec<&str> = got.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["u-pod"]);
        assert!(
            got.iter()
                .all(|r| r.controller.is_none() && r.block_owner_deletion.is_none())
        );
        // Delete/Delete on a pod that stays: the NodeSet only.
        let got = claim_owners(&current, delete, &ns, "gpu-0", None);
        let uids: Vec<&str> = got.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["u-b", "u-ns"]);
    }
}
