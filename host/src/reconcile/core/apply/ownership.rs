//! Whose a live child is: its owner references, read from the object as the API returns it.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::plugins::Ownership;

/// The owner references of a live object: `(uid, controller)`.
pub(super) fn owners(v: &Value) -> Vec<(String, bool)> {
    v.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o.get("uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                o.get("controller").and_then(Value::as_bool).unwrap_or(false),
            )
        })
        .collect()
}

/// Who holds a live object, for messages.
pub(super) fn holder(v: &Value) -> String {
    v.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
        .map_or("no controller".to_string(), |o| {
            format!(
                "controller {} {}",
                o.get("kind").and_then(Value::as_str).unwrap_or_default(),
                o.get("name").and_then(Value::as_str).unwrap_or_default()
            )
        })
}

/// Whether a live object belongs to the parent: for a controlled child, a controller owner
/// reference with the parent's UID; for a shared child, an owner reference to one of `sharers`
/// and no controller.
pub fn owned_by(live: &Value, ownership: Ownership, parent_uid: &str, sharers: &BTreeSet<String>) -> bool {
    let refs = owners(live);
    match ownership {
        Ownership::Controlled => refs.iter().any(|(uid, ctl)| *ctl && uid == parent_uid),
        Ownership::Shared => {
            !refs.iter().any(|(_, ctl)| *ctl) && refs.iter().any(|(uid, _)| sharers.contains(uid))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ownership_follows_controller_and_shared_owners() {
        let obj = |refs: Value| json!({"metadata": {"ownerReferences": refs}});
        let sharers: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        let controlled = obj(json!([{"uid": "p", "controller": true}]));
        assert!(owned_by(&controlled, Ownership::Controlled, "p", &sharers));
        assert!(!owned_by(&controlled, Ownership::Controlled, "q", &sharers));
        assert!(!owned_by(&controlled, Ownership::Shared, "p", &sharers));
        let shared = obj(json!([{"uid": "z"}, {"uid": "b", "blockOwnerDeletion": true}]));
        assert!(owned_by(&shared, Ownership::Shared, "x", &sharers));
        assert!(!owned_by(
            &obj(json!([{"uid": "z"}])),
            Ownership::Shared,
            "x",
            &sharers
        ));
        assert!(!owned_by(
            &json!({"metadata": {}}),
            Ownership::Shared,
            "x",
            &sharers
        ));
    }
}
