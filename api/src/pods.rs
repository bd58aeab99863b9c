//! Facts about pods the host, the API server and builders share: readiness and ordinal names.

use k8s_openapi::api::core::v1::{Pod, PodCondition};

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
