//! Owner references: which parent a child belongs to, so Kubernetes deletes it with its parent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_core::{Resource, ResourceExt};

use crate::NodeSet;

/// The owner reference that makes `parent` the controller of a child (`controller` and
/// `blockOwnerDeletion` true), or `None` before the parent has a UID. The host sets it on every
/// child a builder returns (whatever the builder set) and on the pods a NodeSet adopts.
pub fn controller_ref<K: Resource<DynamicType = ()>>(parent: &K) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: parent.name_any(),
        uid: parent.meta().uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// The owners of an object the NodeSets of one Controller share (the workers' Service and
/// PodDisruptionBudget): every NodeSet of `nodesets` with a UID, sorted by name, as plain owners
/// blocking their deletion, none of them the controller (Slinky's `SetOwnerReferences`).
pub fn shared_refs<'a>(nodesets: impl IntoIterator<Item = &'a NodeSet>) -> Vec<OwnerReference> {
    let mut sorted: Vec<&NodeSet> = nodesets
        .into_iter()
        .filter(|n| n.metadata.uid.is_some())
        .collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    sorted
        .into_iter()
        .filter_map(|n| {
            Some(OwnerReference {
                controller: None,
                ..controller_ref(n)?
            })
        })
        .collect()
}

/// The UID of the object of kind `kind` that controls the object with `owners` (its owner
/// reference with `controller: true`), if any.
pub fn controller_uid<'a>(owners: &'a [OwnerReference], kind: &str) -> Option<&'a str> {
    owners
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| o.uid.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Controller, ControllerSpec, NodeSetSpec};

    fn nodeset(name: &str, uid: Option<&str>) -> NodeSet {
        let mut ns = NodeSet::new(name, NodeSetSpec::default());
        ns.metadata.uid = uid.map(String::from);
        ns
    }

    #[test]
    fn the_controller_reference_names_the_parent() {
        let r = controller_ref(&nodeset("w", Some("u1")));
        assert_eq!(
            r,
            Some(OwnerReference {
                api_version: "slinky.slurm.net/v1beta1".into(),
                kind: "NodeSet".into(),
                name: "w".into(),
                uid: "u1".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            })
        );
        assert_eq!(controller_ref(&nodeset("w", None)), None);
        let mut c = Controller::new("slurm", ControllerSpec::default());
        c.metadata.uid = Some("u2".into());
        assert_eq!(controller_ref(&c).map(|r| r.kind), Some("Controller".to_string()));
    }

    #[test]
    fn shared_owners_are_sorted_plain_owners_with_uids() {
        let sets = [
            nodeset("b", Some("ub")),
            nodeset("a", Some("ua")),
            nodeset("c", None),
        ];
        let refs = shared_refs(&sets);
        let names: Vec<&str> = refs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(
            refs.iter()
                .all(|r| r.controller.is_none() && r.block_owner_deletion == Some(true))
        );
        assert_eq!(refs[0].api_version, crate::API_VERSION);
    }

    #[test]
    fn the_controller_uid_is_the_controlling_owners() {
        let mut refs = shared_refs(&[nodeset("a", Some("ua"))]);
        assert_eq!(controller_uid(&refs, "NodeSet"), None);
        refs.extend(controller_ref(&nodeset("b", Some("ub"))));
        assert_eq!(controller_uid(&refs, "NodeSet"), Some("ub"));
        assert_eq!(controller_uid(&refs, "Controller"), None);
    }
}
