//! The StatefulSet fields an update cannot change: which differ from what the builder builds
//! (the object must then be deleted and created again), and what can still be applied meanwhile.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::reconcile::core::compare::{contains, differences};

/// The StatefulSet spec fields an update may change (kube-apiserver's `ValidateStatefulSetUpdate`):
/// every other one is immutable.
const STATEFULSET_MUTABLE: [&str; 6] = [
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

/// The immutable StatefulSet spec fields to compare: those the build sets, and those whose
/// removal is a change too.
fn statefulset_immutable_keys(desired: &Value) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = desired
        .get("spec")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.keys().cloned())
        .collect();
    keys.extend(["serviceName", "selector", "volumeClaimTemplates"].map(String::from));
    keys.retain(|k| !STATEFULSET_MUTABLE.contains(&k.as_str()));
    keys
}

/// The first immutable StatefulSet field that differs, which an update cannot change, as its exact
/// path (`spec.volumeClaimTemplates[name=statesave].spec.resources.requests.storage`): the object
/// must be deleted and created again to change it (Slinky does so when `serviceName` changed).
pub(crate) fn statefulset_recreate(live: &Value, desired: &Value) -> Option<String> {
    let get = |v: &Value, k: &str| v.pointer(&format!("/spec/{k}")).cloned().unwrap_or(Value::Null);
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                c.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    };
    for k in statefulset_immutable_keys(desired) {
        let (l, d) = (get(live, &k), get(desired, &k));
        let same = match k.as_str() {
            // A selector must be equal both ways; claim templates must be the same claims.
            "selector" => contains(&l, &d) && contains(&d, &l),
            "volumeClaimTemplates" => names(&l) == names(&d) && contains(&l, &d),
            _ => contains(&l, &d),
        };
        if same {
            continue;
        }
        let sub = differences(&l, &d, 1).into_iter().next().unwrap_or_default();
        return Some(if sub.is_empty() {
            format!("spec.{k}")
        } else if sub.starts_with('[') {
            format!("spec.{k}{sub}")
        } else {
            format!("spec.{k}.{sub}")
        });
    }
    None
}

/// `desired` with the live object's immutable StatefulSet fields: what can still be applied while
/// an immutable field differs (the image, the configuration hash, a rotated key's hash).
pub(crate) fn with_live_immutables(live: &Value, desired: &Value) -> Value {
    let mut out = desired.clone();
    for k in statefulset_immutable_keys(desired) {
        let l = live.pointer(&format!("/spec/{k}")).cloned();
        if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
            match l {
                Some(v) => spec.insert(k, v),
                None => spec.remove(&k),
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn immutable_statefulset_fields_ask_for_a_recreate() {
        let sts = |svc: &str, claims: Value| {
            json!({"spec": {"serviceName": svc, "selector": {"matchLabels": {"a": "b"}},
                "volumeClaimTemplates": claims}})
        };
        let claim = json!([{"metadata": {"name": "statesave"}, "spec": {"resources": {"requests": {"storage": "4Gi"}}}}]);
        let live = sts("x-controller-internal", claim.clone());
        assert_eq!(statefulset_recreate(&live, &live).as_deref(), None);
        assert_eq!(
            statefulset_recreate(&sts("x-controller", claim.clone()), &live).as_deref(),
            Some("spec.serviceName")
        );
        assert_eq!(
            statefulset_recreate(&live, &sts("x-controller-internal", json!(null))).as_deref(),
            Some("spec.volumeClaimTemplates")
        );
        let mut more = live.clone();
        more["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"] = "Filesystem".into();
        assert_eq!(
            statefulset_recreate(&more, &live).as_deref(),
            None,
            "server defaults are no change"
        );
        let stored_as = |q: &str| {
            sts(
                "x-controller-internal",
                json!([{"metadata": {"name": "statesave"}, "spec": {"resources": {"requests": {"storage": q}}}}]),
            )
        };
        assert_eq!(
            statefulset_recreate(&stored_as("4Gi"), &stored_as("4096Mi")).as_deref(),
            None,
            "the API server's canonical form of a quantity is no change"
        );
        assert_eq!(
            statefulset_recreate(&stored_as("4Gi"), &stored_as("5Gi")).as_deref(),
            Some("spec.volumeClaimTemplates[name=statesave].spec.resources.requests.storage"),
            "the exact field"
        );
        let mut policy = live.clone();
        policy["spec"]["podManagementPolicy"] = "Parallel".into();
        assert_eq!(
            statefulset_recreate(&live, &policy).as_deref(),
            Some("spec.podManagementPolicy"),
            "every immutable field, not only three"
        );
        // What can still change is applied over the live immutables.
        let mut want = stored_as("5Gi");
        want["spec"]["template"] = json!({"metadata": {"annotations": {"h": "2"}}});
        let merged = with_live_immutables(&stored_as("4Gi"), &want);
        assert_eq!(statefulset_recreate(&stored_as("4Gi"), &merged), None);
        assert_eq!(merged["spec"]["template"]["metadata"]["annotations"]["h"], "2");
    }
}
