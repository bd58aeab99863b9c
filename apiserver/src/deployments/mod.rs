//! A simulated deployment controller and replica set controller (with the simulated kubelet of
//! [`crate::lifecycle`]), so a Deployment of the embedded server gets pods as on a cluster, as
//! kube-controller-manager v1.28's controllers make them ([`rollout`], [`replicasets`]):
//!
//! - A Deployment has one ReplicaSet per pod template, `<deployment>-<pod-template-hash>`,
//!   controlled by the Deployment, its labels, selector and template those of the Deployment
//!   plus `pod-template-hash`, with the annotations `deployment.kubernetes.io/revision`
//!   (`desired-replicas`, `max-replicas`, and the Deployment's own); the Deployment carries the
//!   revision of its newest ReplicaSet.
//! - A new template rolls out by the strategy: `RollingUpdate` scales the new ReplicaSet up and
//!   the old ones down within `maxSurge` and `maxUnavailable` (25% each by default), `Recreate`
//!   scales the old ones to 0 and starts the new one once their pods are gone. Scaling a
//!   Deployment scales its ReplicaSets (proportionally during a rollout); a paused Deployment is
//!   only scaled. Old ReplicaSets past `revisionHistoryLimit` (10) are deleted once empty.
//! - A ReplicaSet gets pods `<replicaset>-<5 random characters>` from its template, controlled
//!   by it; extra pods are deleted (unscheduled, then pending, then unready, then the newest
//!   first).
//! - Both write their status as the real controllers do: a Deployment's `replicas`,
//!   `updatedReplicas`, `readyReplicas`, `availableReplicas`, `unavailableReplicas`,
//!   `observedGeneration` and the `Available` and `Progressing` conditions (and `ReplicaFailure`
//!   from its ReplicaSets); a ReplicaSet's counts and its `ReplicaFailure` condition. Events:
//!   `ScalingReplicaSet` on the Deployment, `SuccessfulCreate`, `SuccessfulDelete` and
//!   `FailedCreate` on the ReplicaSet.
//!
//! What it does not do: adopt or release objects by selector (only what it controls is its own),
//! the deprecated `rollbackTo`, slow-start batches (all missing pods are created in one pass),
//! the pod deletion ranks by co-located pods, ready time and restarts. The pod-template hash is
//! FNV-32a of the template's canonical JSON, encoded as Kubernetes encodes its own: stable for a
//! template, not bit for bit kube-controller-manager's (which hashes Go's object dump). Absent
//! fields mean their API defaults (`replicas` 1, `RollingUpdate` 25%/25%, `revisionHistoryLimit`
//! 10, `progressDeadlineSeconds` 600), which this server does not write into Deployments.

mod replicasets;
mod rollout;

use std::sync::Arc;

use serde_json::{Value, json};

use crate::{ResKey, Store};

/// The field manager of the simulated controllers' writes (kube-controller-manager's).
const MANAGER: &str = "kube-controller-manager";
/// The label a ReplicaSet and its pods carry, unique per pod template.
const HASH_LABEL: &str = "pod-template-hash";
/// A ReplicaSet's revision (and a Deployment's: its newest ReplicaSet's).
const REVISION: &str = "deployment.kubernetes.io/revision";

/// One pass of both simulated controllers: Deployments, then ReplicaSets.
pub(crate) fn sync(store: &Arc<Store>) {
    rollout::sync(store);
    replicasets::sync(store);
}

fn key(group: &str, plural: &str) -> ResKey {
    ResKey {
        group: group.into(),
        plural: plural.into(),
    }
}

/// A string at `pointer` (`""` when absent).
fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// An integer at `pointer` (`default` when absent).
fn int(v: &Value, pointer: &str, default: i64) -> i64 {
    v.pointer(pointer).and_then(Value::as_i64).unwrap_or(default)
}

/// Whether `obj` is controlled by the object of `uid`.
fn controlled_by(obj: &Value, uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid && r["controller"] == true))
}

/// A controller reference to `owner` (of `kind` in apps/v1), as `metav1.NewControllerRef`.
fn controller_ref(owner: &Value, kind: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": kind, "name": s(owner, "/metadata/name"),
        "uid": s(owner, "/metadata/uid"), "controller": true, "blockOwnerDeletion": true})
}

/// The time now as a Kubernetes timestamp (seconds).
fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A JSON value with its object keys sorted, written compactly: the same text for the same
/// content whatever order the keys arrived in.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `controller.ComputeHash`: FNV-32a of the template (here the canonical JSON of its
/// [`semantic`] form without the hash label) and of the
/// collision count when there is one, its decimal digits encoded by `rand.SafeEncodeString`.
fn template_hash(template: &Value, collision_count: Option<i64>) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut text = String::new();
    canonical(&without_hash(template), &mut text);
    let mut bytes = text.into_bytes();
    if let Some(count) = collision_count {
        // Go writes the count as 8 little-endian bytes, the upper four zero.
        let mut le = [0u8; 8];
        le[..4].copy_from_slice(&(count as u32).to_le_bytes());
        bytes.extend_from_slice(&le);
    }
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash.to_string()
        .bytes()
        .map(|d| char::from(ALPHANUMS[usize::from(d) % ALPHANUMS.len()]))
        .collect()
}

/// `v` without what Go's typed objects cannot tell from absent: `null`, `""`, and (once
/// emptied) `{}` and `[]`. Two templates that differ only there are one to kube-controller-manager
/// (`apiequality.Semantic.DeepEqual` of decoded objects), e.g. the `creationTimestamp: null` and
/// `resources: {}` that `kubectl rollout undo` sends back.
fn semantic(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::Object(m) => {
            let kept: serde_json::Map<String, Value> = m
                .iter()
                .filter_map(|(k, v)| semantic(v).map(|v| (k.clone(), v)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(items) if items.is_empty() => None,
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .map(|i| semantic(i).unwrap_or_else(|| json!({})))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

/// A pod template without the `pod-template-hash` label, in its [`semantic`] form: what
/// `EqualIgnoreHash` compares and the hash is taken of.
fn without_hash(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        labels.remove(HASH_LABEL);
    }
    semantic(&t).unwrap_or_else(|| json!({}))
}

/// Whether a pod counts as available: Ready for at least `min_ready_seconds`
/// (`podutil.IsPodAvailable`).
fn pod_available(pod: &Value, min_ready_seconds: i64, now: k8s_openapi::jiff::Timestamp) -> bool {
    slinky_api::pods::json_is_available(pod, min_ready_seconds, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_stable_for_a_template_and_reads_like_kubernetes() {
        let a = json!({"metadata": {"labels": {"app": "x", "tier": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let b = json!({"spec": {"containers": [{"image": "i", "name": "c"}]}, "metadata": {"labels": {"tier": "y", "app": "x"}}});
        let h = template_hash(&a, None);
        assert_eq!(h, template_hash(&b, None), "key order does not matter");
        assert!(
            !h.is_empty() && h.len() <= 10 && h.bytes().all(|c| b"bcdfghjklmnpqrstvwxz2456789".contains(&c)),
            "{h}"
        );
        assert_ne!(h, template_hash(&a, Some(1)), "a collision count changes it");
        let mut c = a.clone();
        c["spec"]["containers"][0]["image"] = "j".into();
        assert_ne!(h, template_hash(&c, None));
        let mut hashed = a.clone();
        hashed["metadata"]["labels"][HASH_LABEL] = h.clone().into();
        assert_eq!(without_hash(&hashed), a);
        // What typed clients send back (`kubectl rollout undo`) is the same template.
        let mut typed = a.clone();
        typed["metadata"]["creationTimestamp"] = Value::Null;
        typed["spec"]["containers"][0]["resources"] = json!({});
        typed["spec"]["volumes"] = json!([]);
        assert_eq!(without_hash(&typed), without_hash(&a));
        assert_eq!(template_hash(&typed, None), h);
    }
}
