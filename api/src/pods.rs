//! Facts about pods the host, the API server and builders share: readiness and ordinal names.

use k8s_openapi::{
    api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodCondition,
    },
    jiff::Timestamp,
};

/// Pin `pod` to the node `node` (`pinToNode`): a required node affinity on the node's name
/// (`matchFields metadata.name In [node]`), added to every term of the pod's own required node
/// affinity (terms are ORed: each must keep its own requirements and gain the pin), or as the only
/// term when it has none.
pub fn pin_to_node(pod: &mut Pod, node: &str) {
    let pin = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let spec = pod.spec.get_or_insert_with(Default::default);
    let required = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        let fields = term.match_fields.get_or_insert_with(Vec::new);
        if !fields.contains(&pin) {
            fields.push(pin.clone());
        }
    }
}

/// The pod's `Ready` condition, when it is `True`.
pub fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether the pod has a `Ready=True` condition (whatever its phase).
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some()
}

/// When the pod's `Ready=True` condition last changed: `None` when it is not ready,
/// `Some(None)` when it is ready without a time.
pub fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    Some(ready_condition(pod)?.last_transition_time.as_ref().map(|t| t.0))
}

/// Whether a pod whose readiness is `ready` ([`ready_since`]) counts as available at `now`:
/// ready, and for at least `min_ready_seconds` (Kubernetes' `podutil.IsPodAvailable`; without a
/// transition time only when `min_ready_seconds` is 0).
pub fn available_since(ready: Option<Option<Timestamp>>, min_ready_seconds: i64, now: Timestamp) -> bool {
    match ready {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(since) => since.is_some_and(|t| t.as_second() + min_ready_seconds <= now.as_second()),
    }
}

/// Whether the pod is available at `now`: `Ready=True` for at least `min_ready_seconds`.
pub fn is_available(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> bool {
    available_since(ready_since(pod), min_ready_seconds, now)
}

/// [`is_available`] of a pod as JSON (the API server's stored form).
pub fn json_is_available(pod: &serde_json::Value, min_ready_seconds: i64, now: Timestamp) -> bool {
    let ready = pod
        .pointer("/status/conditions")
        .and_then(serde_json::Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready" && c["status"] == "True"))
        .map(|c| {
            c["lastTransitionTime"]
                .as_str()
                .and_then(|t| t.parse::<Timestamp>().ok())
        });
    available_since(ready, min_ready_seconds, now)
}

/// [`is_ready`] of a pod as JSON (the API server's stored form).
pub fn json_is_ready(pod: &serde_json::Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// The ordinal of a pod named `<owner>-<digits>` (whatever the zero padding), or `None` for
/// another name. The owner is a NodeSet or a StatefulSet; see [`crate::NodeSet::pod_ordinal`] for
/// the exact names a NodeSet gives.
pub fn ordinal_after(owner: &str, pod: &str) -> Option<u32> {
    let rest = pod.strip_prefix(owner)?.strip_prefix('-')?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodStatus;

    use super::*;

    #[test]
    fn a_pin_is_added_to_every_required_term() -> Result<(), serde_json::Error> {
        let terms = |pod: &Pod| {
            serde_json::to_value(
                &pod.spec
                    .as_ref()?
                    .affinity
                    .as_ref()?
                    .node_affinity
                    .as_ref()?
                    .required_during_scheduling_ignored_during_execution
                    .as_ref()?
                    .node_selector_terms,
            )
            .ok()
        };
        let mut bare: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": []}}))?;
        pin_to_node(&mut bare, "n1");
        pin_to_node(&mut bare, "n1");
        assert_eq!(
            terms(&bare),
            Some(
                serde_json::json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])
            )
        );
        let mut gpu: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": [], "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}}))?;
        pin_to_node(&mut gpu, "n2");
        let t = terms(&gpu).unwrap_or_default();
        for (i, key) in ["gpu", "zone"].iter().enumerate() {
            assert_eq!(
                t[i]["matchExpressions"][0]["key"], *key,
                "the user's terms are kept"
            );
            assert_eq!(
                t[i]["matchFields"][0]["values"][0], "n2",
                "and each gains the pin"
            );
        }
        Ok(())
    }

    fn pod(conditions: &[(&str, &str)]) -> Pod {
        Pod {
            status: Some(PodStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ready_means_a_true_ready_condition() {
        assert!(is_ready(&pod(&[("ContainersReady", "True"), ("Ready", "True")])));
        assert!(!is_ready(&pod(&[("Ready", "False")])));
        assert!(!is_ready(&pod(&[("ContainersReady", "True")])));
        assert!(!is_ready(&Pod::default()));
    }

    #[test]
    fn json_pods_read_the_same() -> Result<(), serde_json::Error> {
        for p in [
            pod(&[("Ready", "True")]),
            pod(&[("Ready", "False")]),
            Pod::default(),
        ] {
            assert_eq!(json_is_ready(&serde_json::to_value(&p)?), is_ready(&p));
        }
        Ok(())
    }

    #[test]
    fn ordinals_follow_the_owner_name() {
        assert_eq!(ordinal_after("w", "w-7"), Some(7));
        assert_eq!(ordinal_after("w", "w-007"), Some(7));
        assert_eq!(ordinal_after("w", "w-"), None);
        assert_eq!(ordinal_after("w", "w-+1"), None);
        assert_eq!(ordinal_after("w", "w-1a"), None);
        assert_eq!(ordinal_after("w", "wx-1"), None);
        assert_eq!(ordinal_after("w", "w-99999999999"), None);
    }
}
