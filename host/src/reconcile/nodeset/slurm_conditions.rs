//! `SlurmNodeState<State>` pod conditions (Slinky's; health tools such as NVIDIA's
//! slinky-drainer read them) beside the kubelet's.
//!
//! # Rules
//! * Each state of the pod's Slurm node is one condition type, once (Slinky's #144: duplicated
//!   types broke every later patch); types of states the node left are removed; the kubelet's and
//!   others' conditions are kept as they are, in their order.
//! * Written with a JSON patch whose first operation tests the conditions the host read: a
//!   condition the kubelet wrote meanwhile makes the API server refuse the patch instead of the
//!   host dropping it (Slinky's merge patch from the cache could); the next pass writes again
//!   from the fresh pod.

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use slinky_slurm::Node;

/// The prefix of the host's condition types.
pub const PREFIX: &str = "SlurmNodeState";

/// The pod's conditions with the Slurm ones made to match `node` (None: unchanged).
pub fn desired(pod: &Pod, node: &Node, now: Timestamp) -> Option<Vec<PodCondition>> {
    let current: Vec<PodCondition> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let want = node.condition_types();
    let mut out: Vec<PodCondition> = Vec::new();
    for c in &current {
        let ours = c.type_.starts_with(PREFIX);
        if ours && !want.contains(&c.type_) {
            continue;
        }
        if out.iter().any(|o| o.type_ == c.type_) {
            continue;
        }
        let mut c = c.clone();
        if ours {
            c.status = "True".into();
            c.message = (!node.reason.is_empty()).then(|| node.reason.clone());
        }
        out.push(c);
    }
    for t in &want {
        if !out.iter().any(|c| &c.type_ == t) {
            out.push(PodCondition {
                type_: t.clone(),
                status: "True".into(),
                last_transition_time: Some(Time(now)),
                message: (!node.reason.is_empty()).then(|| node.reason.clone()),
                ..Default::default()
            });
        }
    }
    (out != current).then_some(out)
}

/// The JSON patch that replaces the pod's conditions with `conditions` only if the pod is still
/// as `pod` shows it: its `resourceVersion` is tested (the conditions the kubelet wrote meanwhile
/// are never replaced). The conditions themselves are not what is tested: a real kubelet writes
/// `lastProbeTime: null`, which a typed read drops, so a test of them never matched and the
/// Slurm conditions were never written (found on the real node: a 422 at every pass). A pod read
/// without a `resourceVersion` (never, from the API) is tested by its conditions.
pub fn patch(pod: &Pod, conditions: &[PodCondition]) -> serde_json::Value {
    let current = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let op = if current.is_some() { "replace" } else { "add" };
    match (pod.metadata.resource_version.as_deref(), current) {
        (Some(rv), _) => serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": op, "path": "/status/conditions", "value": conditions},
        ]),
        (None, Some(c)) => serde_json::json!([
            {"op": "test", "path": "/status/conditions", "value": c},
            {"op": "replace", "path": "/status/conditions", "value": conditions},
        ]),
        (None, None) => serde_json::json!([
            {"op": "add", "path": "/status/conditions", "value": conditions},
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn pod(types: &[&str]) -> Pod {
        Pod {
            status: Some(PodStatus {
                conditions: Some(
                    types
                        .iter()
                        .map(|t| PodCondition {
                            type_: t.to_string(),
                            status: "True".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(state: &[&str]) -> Node {
        Node::new("n", state, "")
    }

    fn types(c: &[PodCondition]) -> Vec<&str> {
        c.iter().map(|c| c.type_.as_str()).collect()
    }

    #[test]
    fn slurm_states_replace_ours_keep_the_kubelets_and_never_duplicate() {
        let p = pod(&[
            "Ready",
            "SlurmNodeStateIdle",
            "SlurmNodeStateIdle",
            "ContainersReady",
        ]);
        let out =
            desired(&p, &node(&["MIXED", "DRAIN", "DYNAMIC_NORM"]), Timestamp::now()).unwrap_or_default();
        assert_eq!(
            types(&out),
            [
                "Ready",
                "ContainersReady",
                "SlurmNodeStateMixed",
                "SlurmNodeStateDrain"
            ]
        );
        // Nothing to change: no write.
        let p = pod(&["Ready", "SlurmNodeStateIdle"]);
        assert!(desired(&p, &node(&["IDLE", "DYNAMIC_NORM"]), Timestamp::now()).is_none());
    }

    #[test]
    fn the_patch_tests_what_was_read() {
        // Read from the API: its resourceVersion, whatever the conditions hold.
        let mut read = pod(&["Ready"]);
        read.metadata.resource_version = Some("41".into());
        let v = patch(&read, &[]);
        assert_eq!(
            v[0],
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": "41"})
        );
        assert_eq!(v[1]["op"], "replace");
        // Without conditions: the kubelet's first write must not be replaced.
        let mut fresh = Pod::default();
        fresh.metadata.resource_version = Some("42".into());
        let v = patch(&fresh, &[]);
        assert_eq!(
            v[0],
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(v[1]["op"], "add");
        let v = patch(&pod(&["Ready"]), &[]);
        assert_eq!(v[0]["op"], "test");
        assert_eq!(v[0]["value"][0]["type"], "Ready");
        let v = patch(&Pod::default(), &[]);
        assert_eq!(v[0]["op"], "add");
    }
}
