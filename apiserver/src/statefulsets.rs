//! A simulated StatefulSet controller (with the simulated kubelet of [`crate::lifecycle`]), so a
//! StatefulSet of the embedded server gets pods as on a cluster: pods `<sts>-<ordinal>` for
//! ordinals `0..replicas`, made from the template (its labels plus `controller-revision-hash`,
//! `statefulset.kubernetes.io/pod-name` and `apps.kubernetes.io/pod-index`, hostname
//! `<sts>-<ordinal>`, subdomain the `serviceName`, a PersistentVolumeClaim
//! `<template>-<sts>-<ordinal>` per volume claim template), controlled by the StatefulSet; extra
//! ordinals deleted from the highest; a new template rolls the pods from the highest ordinal, one
//! at a time, each once every other pod is ready (the `RollingUpdate` strategy); the status counts
//! replicas, ready, current and updated pods.
//!
//! A refused pod or claim create is a Warning `FailedCreate` Event on the StatefulSet, with
//! kube-controller-manager's message, repeats folded into its `count`.
//!
//! What it does not do: `OrderedReady` start-up (pods are created in parallel),
//! `partition`, `maxUnavailable`, `OnDelete`, `minReadySeconds`, ControllerRevisions, claim
//! retention policies (claims are kept, as by default).

use std::sync::Arc;

use serde_json::{Value, json};
use slinky_api::pods::{json_is_ready, ordinal_after};

use crate::{
    DeleteOpts, ResKey, Store,
    recorder::{self, Regarding, Said},
    store::{Op, Sub},
};

const MANAGER: &str = "embedded-statefulset-controller";

fn key(group: &str, plural: &str) -> ResKey {
    ResKey {
        group: group.into(),
        plural: plural.into(),
    }
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// The template's revision: `<sts>-<10 hex digits of its hash>` (a stable hash of its JSON).
fn revision(name: &str, template: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    template.to_string().hash(&mut h);
    format!("{name}-{:010x}", h.finish() & 0xff_ffff_ffff)
}

/// The pod of ordinal `i` of `sts` at `rev`.
fn pod_for(sts: &Value, i: i64, rev: &str) -> Value {
    let name = s(sts, "/metadata/name");
    let pod_name = format!("{name}-{i}");
    let template = sts.pointer("/spec/template").cloned().unwrap_or(Value::Null);
    let mut labels = template
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    labels["controller-revision-hash"] = rev.into();
    labels["statefulset.kubernetes.io/pod-name"] = pod_name.clone().into();
    labels["apps.kubernetes.io/pod-index"] = i.to_string().into();
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    spec["hostname"] = pod_name.clone().into();
    if let Some(svc) = sts.pointer("/spec/serviceName").filter(|v| !v.is_null()) {
        spec["subdomain"] = svc.clone();
    }
    for claim in sts
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let vct = s(claim, "/metadata/name");
        let volume =
            json!({"name": vct, "persistentVolumeClaim": {"claimName": format!("{vct}-{pod_name}")}});
        match spec.get_mut("volumes").and_then(Value::as_array_mut) {
            Some(v) => {
                v.retain(|x| x["name"] != vct);
                v.push(volume);
            }
            None => spec["volumes"] = json!([volume]),
        }
    }
    let mut meta = json!({
        "name": pod_name,
        "namespace": s(sts, "/metadata/namespace"),
        "labels": labels,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
            "uid": s(sts, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true}],
    });
    if let Some(a) = template.pointer("/metadata/annotations") {
        meta["annotations"] = a.clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// One pass of the simulated StatefulSet controller over every StatefulSet.
pub(crate) fn sync(store: &Arc<Store>) {
    let Ok((items, _, _)) = store.list(&key("apps", "statefulsets"), "", &|_| true, None, 0) else {
        return;
    };
    for sts in items {
        if sts.pointer("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        sync_one(store, &Set::of(&sts));
    }
}

/// One StatefulSet being synced: where it lives, what it wants and its template's revision.
struct Set<'a> {
    /// The StatefulSet.
    sts: &'a Value,
    /// Its namespace.
    ns: String,
    /// Its name.
    name: String,
    /// Its uid (what its pods' controller reference names).
    uid: String,
    /// `spec.replicas` (1 when absent).
    replicas: i64,
    /// The revision of its template.
    rev: String,
}

impl<'a> Set<'a> {
    fn of(sts: &'a Value) -> Self {
        let name = s(sts, "/metadata/name").to_string();
        Set {
            sts,
            ns: s(sts, "/metadata/namespace").to_string(),
            uid: s(sts, "/metadata/uid").to_string(),
            replicas: sts.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
            rev: revision(&name, sts.pointer("/spec/template").unwrap_or(&Value::Null)),
            name,
        }
    }

    /// Whether the StatefulSet controls pod `p`.
    fn owns(&self, p: &Value) -> bool {
        p.pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|o| {
                o.iter()
                    .any(|o| o["uid"] == self.uid.as_str() && o["controller"] == true)
            })
    }

    /// The ordinal of pod `p` (`<sts>-<ordinal>`), if its name has one.
    fn ordinal(&self, p: &Value) -> Option<i64> {
        ordinal_after(&self.name, s(p, "/metadata/name")).map(i64::from)
    }
}

/// One pass over one StatefulSet: missing pods created, one extra or old pod deleted, the
/// status written (counted from the pods seen at the start of the pass).
fn sync_one(store: &Store, set: &Set<'_>) {
    let Ok((pods, _, _)) = store.list(&key("", "pods"), &set.ns, &|p| set.owns(p), None, 0) else {
        return;
    };
    create_missing(store, set, &pods);
    let live: Vec<&Arc<Value>> = pods
        .iter()
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .collect();
    delete_extra_and_old(store, set, pods.len(), &live);
    write_status(store, set, &live);
}

/// A Warning Event on the StatefulSet from `statefulset-controller` (see [`crate::recorder`]).
fn warn(store: &Store, set: &Set<'_>, reason: &str, message: String) {
    let on = Regarding {
        api_version: "apps/v1",
        kind: "StatefulSet",
        namespace: &set.ns,
        name: &set.name,
        uid: &set.uid,
    };
    let said = Said {
        kind: "Warning",
        reason,
        message: &message,
    };
    recorder::record(store, "statefulset-controller", MANAGER, on, said);
}

/// Missing ordinals: their claims, then the pods.
fn create_missing(store: &Store, set: &Set<'_>, pods: &[Arc<Value>]) {
    for i in 0..set.replicas {
        if pods.iter().any(|p| set.ordinal(p) == Some(i)) {
            continue;
        }
        let pod = pod_for(set.sts, i, &set.rev);
        if !create_claims(store, set, i) {
            continue;
        }
        if let Err(error) = store.create(&key("", "pods"), &set.ns, pod, MANAGER, false) {
            tracing::debug!(statefulset = %set.name, %error, "cannot create a StatefulSet pod");
            let message = format!(
                "create Pod {}-{i} in StatefulSet {} failed error: {}",
                set.name, set.name, error.message
            );
            warn(store, set, "FailedCreate", message);
        }
    }
}

/// Create the missing claims of ordinal `i`; false when one could not be created (as the
/// StatefulSet controller: no pod without its claims).
fn create_claims(store: &Store, set: &Set<'_>, i: i64) -> bool {
    let pvcs = key("", "persistentvolumeclaims");
    let mut created_all = true;
    for claim in set
        .sts
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let claim_name = format!("{}-{}-{i}", s(claim, "/metadata/name"), set.name);
        if store.get(&pvcs, &set.ns, &claim_name).is_err() {
            let mut pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim_name, "namespace": set.ns,
                    "labels": set.sts.pointer("/spec/selector/matchLabels").cloned().unwrap_or_else(|| json!({}))},
                "spec": claim.get("spec").cloned().unwrap_or_else(|| json!({}))});
            if let Some(m) = pvc.pointer_mut("/metadata").and_then(Value::as_object_mut) {
                m.retain(|_, v| !v.is_null());
            }
            if let Err(error) = store.create(&pvcs, &set.ns, pvc, MANAGER, false) {
                tracing::debug!(statefulset = %set.name, %error, "cannot create a claim of a StatefulSet pod");
                let message = format!(
                    "create Claim {claim_name} for Pod {}-{i} in StatefulSet {} failed error: {}",
                    set.name, set.name, error.message
                );
                warn(store, set, "FailedCreate", message);
                created_all = false;
            }
        }
    }
    created_all
}

/// Delete the highest ordinal past `replicas`, and (a rolling update) the highest pod of an old
/// revision once every pod is there and ready. `total` counts the pods, terminating ones too.
fn delete_extra_and_old(store: &Store, set: &Set<'_>, total: usize, live: &[&Arc<Value>]) {
    let delete = |pod: &Value| {
        let _ = store.delete(
            &key("", "pods"),
            &set.ns,
            s(pod, "/metadata/name"),
            &DeleteOpts {
                uid: Some(s(pod, "/metadata/uid").to_string()),
                ..Default::default()
            },
        );
    };
    // Ordinals past `replicas`, the highest first.
    let mut extra: Vec<&&Arc<Value>> = live
        .iter()
        .filter(|p| set.ordinal(p).is_none_or(|o| o >= set.replicas))
        .collect();
    extra.sort_by_key(|p| std::cmp::Reverse(set.ordinal(p)));
    if let Some(p) = extra.first() {
        delete(p);
    }
    // A rolling update: the highest old pod, once every pod is there and ready.
    let all_ready =
        live.len() as i64 == set.replicas && total == live.len() && live.iter().all(|p| json_is_ready(p));
    if all_ready
        && let Some(old) = live
            .iter()
            .filter(|p| s(p, "/metadata/labels/controller-revision-hash") != set.rev)
            .max_by_key(|p| set.ordinal(p))
    {
        delete(old);
    }
}

/// Write the status counted from the `live` pods, when it changed.
fn write_status(store: &Store, set: &Set<'_>, live: &[&Arc<Value>]) {
    let count = |f: &dyn Fn(&Value) -> bool| live.iter().filter(|p| f(p)).count() as i64;
    let updated = count(&|p| s(p, "/metadata/labels/controller-revision-hash") == set.rev);
    let status = json!({
        "observedGeneration": set.sts.pointer("/metadata/generation").cloned().unwrap_or(Value::Null),
        "replicas": live.len(),
        "readyReplicas": count(&json_is_ready),
        "availableReplicas": count(&json_is_ready),
        "currentReplicas": updated,
        "updatedReplicas": updated,
        "currentRevision": set.rev,
        "updateRevision": set.rev,
    });
    if set.sts.get("status") != Some(&status) {
        let sets = key("apps", "statefulsets");
        let _ = store.modify(
            &sets,
            &set.ns,
            &set.name,
            Sub::Status,
            MANAGER,
            Op::Server,
            |cur, _| {
                let mut o = cur.clone();
                o["status"] = status;
                Ok(o)
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_follow_the_template() {
        let sts = json!({"metadata": {"name": "slurm-controller", "namespace": "slurm", "uid": "u"},
            "spec": {"serviceName": "slurm-controller-internal", "template": {
                "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "statesave"}}]}});
        let rev = revision("slurm-controller", &sts["spec"]["template"]);
        assert!(rev.starts_with("slurm-controller-") && rev.len() == "slurm-controller-".len() + 10);
        let pod = pod_for(&sts, 1, &rev);
        assert_eq!(pod["metadata"]["name"], "slurm-controller-1");
        assert_eq!(pod["metadata"]["labels"]["app"], "x");
        assert_eq!(
            pod["metadata"]["labels"]["controller-revision-hash"],
            rev.as_str()
        );
        assert_eq!(pod["metadata"]["annotations"]["a"], "b");
        assert_eq!(pod["spec"]["hostname"], "slurm-controller-1");
        assert_eq!(pod["spec"]["subdomain"], "slurm-controller-internal");
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "statesave-slurm-controller-1"
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
    }
}
