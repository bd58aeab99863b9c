//! One child object of a build, checked: its kind is one the builder kind may return, the checks
//! every child passes, and those of its kind (ConfigMaps, Secrets, Services, PodDisruptionBudgets,
//! StatefulSets and Deployments and their pod templates).

use k8s_openapi::{
    Metadata,
    api::{
        apps::v1::{Deployment, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy},
        core::v1::{ConfigMap, Secret, Service},
        policy::v1::PodDisruptionBudget,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::ResourceExt;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use slinky_api::{
    Controller, NodeSet,
    contract::secret_refs::{self, SecretRef},
    keys,
    labels::Labels,
    validation,
};

use super::super::{
    Allowances,
    allowances::{self, PodGrants, ServiceGrants},
    builder_annotations, dns1035_label, finish_meta, metadata_problems, pod_spec_problems, require_labels,
};
use crate::{Child, ChildKind, Ownership, Plugin};

/// What a build's objects are checked against besides their kind's rules: what the host allows,
/// and what the parent grants the pods of its StatefulSets.
pub(super) struct Rules<'a> {
    pub(super) allow: &'a Allowances,
    pub(super) pods: PodGrants,
    /// The Service the parent's `spec.service` customises, by name, and what it asks for.
    pub(super) service: Option<(String, ServiceGrants)>,
    /// The Secret values a returned Secret may place (the parent's spec references them).
    pub(super) secret_refs: Vec<SecretRef>,
}

/// Parse, check and finish one object: its kind is one of `allowed`, then the checks common to
/// every child and those of its kind.
pub(super) fn check<P>(
    text: &str,
    parent: &P,
    plugin: &Plugin,
    allowed: &[ChildKind],
    builder: &str,
    rules: &Rules<'_>,
) -> Result<Child, String>
where
    P: kube::Resource<DynamicType = ()>,
{
    let value: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "the output is not JSON ({e}): return the object serialized with serde_json \
             (`slinky_guest_sdk::export_plugin!` does this for you)"
        )
    })?;
    let field = |f: &str| {
        value
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or("<missing>")
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let Some(child_kind) = ChildKind::of(&api_version, &kind).filter(|k| allowed.contains(k)) else {
        return Err(format!(
            "apiVersion {api_version} kind {kind} is not allowed: a {builder} builder returns {}{}",
            allowed
                .iter()
                .map(|k| format!("{} {}", k.api_version(), k.kind()))
                .collect::<Vec<_>>()
                .join(", "),
            forbidden_hint(&api_version, &kind)
        ));
    };
    let allow = rules.allow;
    let object = match child_kind {
        ChildKind::ConfigMap => finish::<ConfigMap, P>(value, parent, plugin, allow, config_map_problems)?,
        ChildKind::Secret => {
            finish::<Secret, P>(value, parent, plugin, allow, |s| secret_problems(s, rules))?
        }
        ChildKind::Service => {
            finish::<Service, P>(value, parent, plugin, allow, |s| service_problems(s, rules))?
        }
        ChildKind::PodDisruptionBudget => {
            finish::<PodDisruptionBudget, P>(value, parent, plugin, allow, pdb_problems)?
        }
        ChildKind::StatefulSet => finish::<StatefulSet, P>(value, parent, plugin, allow, |s| {
            statefulset_problems(s, plugin, rules)
        })?,
        ChildKind::Deployment => finish::<Deployment, P>(value, parent, plugin, allow, |d| {
            let spec = &mut d.spec;
            template_problems(&spec.selector, &mut spec.template, plugin, rules)
        })?,
        ChildKind::ServiceMonitor => finish_untyped(value, parent, plugin, allow)?,
    };
    Ok(Child {
        kind: child_kind,
        ownership: Ownership::Controlled,
        object,
    })
}

/// Parse as `K` (so the object is well formed), check and finish the metadata (no finalizers
/// unless allowed), run the kind's checks, drop `status`.
pub(super) fn finish<K, P>(
    value: Value,
    parent: &P,
    plugin: &Plugin,
    allow: &Allowances,
    problems: impl FnOnce(&mut K) -> Result<(), String>,
) -> Result<Value, String>
where
    K: Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned + k8s_openapi::Resource,
    P: kube::Resource<DynamicType = ()>,
{
    let mut obj: K = serde_json::from_value(value).map_err(|e| {
        format!(
            "the output is not a valid {} ({e}): build it with the k8s-openapi types rather than by hand",
            K::KIND
        )
    })?;
    let name = obj.metadata().name.clone().unwrap_or_default();
    let at = format!("{} {name:?}", K::KIND);
    finish_meta(obj.metadata_mut(), parent, plugin).map_err(|e| format!("{at}: {e}"))?;
    metadata_problems(obj.metadata()).map_err(|e| format!("{at}: {e}"))?;
    allowances::finalizers("metadata", obj.metadata(), allow).map_err(|e| format!("{at}: {e}"))?;
    problems(&mut obj).map_err(|e| format!("{at}: {e}"))?;
    let mut value = serde_json::to_value(&obj).map_err(|e| format!("{at}: cannot serialize it: {e}"))?;
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    // A StatefulSet's volume claim templates are embedded objects: the API server keeps no
    // apiVersion or kind on them (k8s-openapi writes both).
    for claim in value
        .pointer_mut("/spec/volumeClaimTemplates")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(c) = claim.as_object_mut() {
            c.remove("apiVersion");
            c.remove("kind");
            c.remove("status");
        }
    }
    Ok(value)
}

/// An object of a kind k8s-openapi has no type for (a ServiceMonitor): its metadata checked and
/// finished as [`finish`] does, the rest kept as it is (`status` dropped).
pub(super) fn finish_untyped<P>(
    mut value: Value,
    parent: &P,
    plugin: &Plugin,
    allow: &Allowances,
) -> Result<Value, String>
where
    P: kube::Resource<DynamicType = ()>,
{
    let mut meta: ObjectMeta = serde_json::from_value(value.get("metadata").cloned().unwrap_or_default())
        .map_err(|e| format!("the output's metadata is not valid ({e})"))?;
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let at = format!("{kind} {:?}", meta.name.clone().unwrap_or_default());
    finish_meta(&mut meta, parent, plugin).map_err(|e| format!("{at}: {e}"))?;
    metadata_problems(&meta).map_err(|e| format!("{at}: {e}"))?;
    allowances::finalizers("metadata", &meta, allow).map_err(|e| format!("{at}: {e}"))?;
    if !value.get("spec").is_some_and(Value::is_object) {
        return Err(format!("{at}: spec is required"));
    }
    let map = value
        .as_object_mut()
        .ok_or_else(|| format!("{at}: not an object"))?;
    map.insert(
        "metadata".into(),
        serde_json::to_value(&meta).map_err(|e| format!("{at}: cannot serialize it: {e}"))?,
    );
    map.remove("status");
    Ok(value)
}

fn config_map_problems(cm: &mut ConfigMap) -> Result<(), String> {
    let keys = cm
        .data
        .iter()
        .flat_map(|d| d.keys())
        .chain(cm.binary_data.iter().flat_map(|d| d.keys()));
    for key in keys {
        if let Some(e) = validation::config_map_key(key).into_iter().next() {
            return Err(format!("the key {key:?} is invalid: {e}"));
        }
    }
    Ok(())
}

/// A Secret a builder returns: `stringData` only (a builder has no secret of its own to put in
/// `data`), valid keys, an `Opaque` type, and placeholders only of the values the parent's spec
/// references (the host resolves them after this check).
fn secret_problems(secret: &mut Secret, rules: &Rules<'_>) -> Result<(), String> {
    if secret.data.as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(
            "data is set: a builder returns a Secret's content as stringData, and places Secret              values it may not see with ${secretKeyRef:<name>/<key>} placeholders"
                .into(),
        );
    }
    if let Some(t) = secret.type_.as_deref().filter(|t| *t != "Opaque") {
        return Err(format!("type is {t:?}: a builder's Secret is Opaque"));
    }
    for (key, value) in secret.string_data.iter().flatten() {
        if let Some(e) = validation::config_map_key(key).into_iter().next() {
            return Err(format!("the key {key:?} is invalid: {e}"));
        }
        for r in secret_refs::references(value).map_err(|e| format!("stringData[{key:?}]: {e}"))? {
            if !rules.secret_refs.contains(&r) {
                let may = rules
                    .secret_refs
                    .iter()
                    .map(|r| secret_refs::placeholder(&r.name, &r.key))
                    .collect::<Vec<_>>();
                return Err(format!(
                    "stringData[{key:?}] places key {:?} of Secret {:?}, which the parent's spec does not                      reference for it: a builder may place only {}",
                    r.key,
                    r.name,
                    if may.is_empty() {
                        "no Secret value".to_string()
                    } else {
                        may.join(", ")
                    }
                ));
            }
        }
    }
    Ok(())
}

/// A valid name; `ClusterIP`, no external IPs, unless the host allows exposing it (only the
/// Service a parent's `spec.service` customises may be what it asks for: the `controller-service`
/// builder's, a RestApi's `<restapi>-restapi`).
fn service_problems(svc: &mut Service, rules: &Rules<'_>) -> Result<(), String> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    dns1035_label(&name).map_err(|why| format!("the Service name is invalid: {why}"))?;
    let grants = match &rules.service {
        Some((customised, grants)) if *customised == name => grants,
        _ => &ServiceGrants::default(),
    };
    allowances::service_spec(svc.spec.as_ref(), grants, rules.allow)
}

fn pdb_problems(pdb: &mut PodDisruptionBudget) -> Result<(), String> {
    let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
    if selector
        .is_none_or(|s| s.match_labels.as_ref().is_none_or(|l| l.is_empty()) && s.match_expressions.is_none())
    {
        return Err("spec.selector is required: a PodDisruptionBudget without one selects no pod".into());
    }
    Ok(())
}

/// The claim retention of every StatefulSet the host applies (`whenDeleted`, `whenScaled`).
const RETAIN: &str = "Retain";

/// A StatefulSet: its claims are retained whatever the builder says; its pod template as
/// [`template_problems`] checks it.
fn statefulset_problems(sts: &mut StatefulSet, plugin: &Plugin, rules: &Rules<'_>) -> Result<(), String> {
    let spec = &mut sts.spec;
    // Its claims outlive it, whatever the builder says: slurmctld's state save claim must survive
    // a deleted or scaled-in StatefulSet (a plugin setting `Delete` would erase the cluster's
    // state with it).
    if let Some(p) = &spec.persistent_volume_claim_retention_policy
        && (p.when_deleted.as_deref().is_some_and(|w| w != RETAIN)
            || p.when_scaled.as_deref().is_some_and(|w| w != RETAIN))
    {
        tracing::warn!(plugin = %plugin.label(), policy = ?p,
            "a builder set a StatefulSet's claim retention other than Retain; the host keeps Retain");
    }
    spec.persistent_volume_claim_retention_policy = Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some(RETAIN.into()),
        when_scaled: Some(RETAIN.into()),
    });
    template_problems(&spec.selector, &mut spec.template, plugin, rules)
}

/// A workload's pod template (a StatefulSet's, a Deployment's): labels matching its selector,
/// valid containers, nothing past the parent's grants (unless allowed); no builder annotations
/// (they are on the workload: a new builder of the same template rolls nothing).
fn template_problems(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    template: &mut k8s_openapi::api::core::v1::PodTemplateSpec,
    plugin: &Plugin,
    rules: &Rules<'_>,
) -> Result<(), String> {
    let selector = selector.match_labels.clone().unwrap_or_default();
    if selector.is_empty() {
        return Err("spec.selector.matchLabels is required".into());
    }
    let template_meta = template.metadata.get_or_insert_default();
    require_labels(
        "spec.template.metadata.labels",
        template_meta.labels.as_ref().unwrap_or(&Default::default()),
        &selector,
    )?;
    // Provenance is the workload's, never its template's: a new builder that builds the same
    // template restarts nothing (a builder that copied them there gets them removed).
    if let Some(a) = template_meta.annotations.as_mut() {
        for k in builder_annotations(plugin).keys() {
            a.remove(k);
        }
    }
    let template_check = ObjectMeta {
        labels: template_meta.labels.clone(),
        annotations: template_meta.annotations.clone(),
        ..Default::default()
    };
    metadata_problems(&template_check).map_err(|e| format!("spec.template.{e}"))?;
    // The workload controllers copy the template's finalizers to every pod.
    allowances::finalizers("spec.template.metadata", template_meta, rules.allow)?;
    let pod = template.spec.as_ref().ok_or("spec.template.spec is required")?;
    if pod.containers.is_empty() {
        return Err("spec.template.spec has no containers".into());
    }
    pod_spec_problems(pod)
        .and_then(|()| allowances::pod_spec(pod, &rules.pods, rules.allow))
        .map_err(|e| format!("spec.template.{e}"))
}

/// A NodeSet's PodDisruptionBudget selects only its pods; the workers' shared one, only the
/// Controller's protected workers (as Slinky's does), unless the host allows a wider one.
pub(super) fn pdb_selector(
    child: &Child,
    nodeset: &NodeSet,
    shared: bool,
    allow: &Allowances,
) -> Result<(), String> {
    let have: Labels = child
        .object
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let cluster = &nodeset.spec.controller_ref.name;
    let (want, whose) = if shared {
        (
            Labels::from([
                (keys::LABEL_POD_PROTECT.to_string(), "true".to_string()),
                (keys::LABEL_CLUSTER.to_string(), cluster.clone()),
            ]),
            format!("the protected workers of Controller {cluster}"),
        )
    } else {
        (
            nodeset.selector_labels(),
            format!("the pods of NodeSet {}", nodeset.name_any()),
        )
    };
    allowances::pdb_selector(&have, &want, &whose, allow).map_err(|e| format!("{}: {e}", child.describe()))
}

/// A child (the StatefulSet, the ServiceMonitor) selects by `spec.selector.matchLabels` exactly
/// the Controller's slurmctld pods.
pub(super) fn selects_slurmctld(child: &Child, controller: &Controller) -> Result<(), String> {
    let selector: std::collections::BTreeMap<String, String> = child
        .object
        .pointer("/spec/selector/matchLabels")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    require_labels(
        "spec.selector.matchLabels",
        &selector,
        &controller.selector_labels(),
    )
    .map_err(|e| format!("{}: {e}", child.describe()))
}

/// What a builder may not return, and why (a hint in the refusal).
pub(super) fn forbidden_hint(api_version: &str, kind: &str) -> &'static str {
    match (api_version, kind) {
        ("v1", "Secret") => {
            ": builders never see or make Secrets (the host reads the Secrets a Controller references \
             and passes their hashes)"
        }
        ("v1", "Namespace" | "Node" | "PersistentVolume")
        | ("rbac.authorization.k8s.io/v1", "ClusterRole" | "ClusterRoleBinding")
        | ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            ": a builder makes namespaced children of its parent, never cluster-scoped objects"
        }
        _ => "",
    }
}
