//! Which parents a watch event concerns: the NodeSets of a Controller, the NodeSets sharing a
//! Controller's workers' objects, the RestApis of a Controller, the parents of a child object,
//! the NodeSets of a pod.

use k8s_openapi::api::core::v1::Pod;
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use slinky_api::{Controller, NodeSet, RestApi, checks::WORKER_SUBDOMAIN_PREFIX};

/// The NodeSets that reference the Controller `c_name` of namespace `c_ns`.
pub(super) fn nodesets_of(store: &Store<NodeSet>, c_ns: &str, c_name: &str) -> Vec<ObjectRef<NodeSet>> {
    store
        .state()
        .iter()
        .filter(|n| n.controller_namespace() == c_ns && n.spec.controller_ref.name == c_name)
        .map(|n| ObjectRef::from_obj(n.as_ref()))
        .collect()
}

/// The RestApis of namespace `ns` that reference the Controller `controller` (of their namespace).
pub(super) fn restapis_of(store: &Store<RestApi>, ns: &str, controller: &str) -> Vec<ObjectRef<RestApi>> {
    store
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns) && r.spec.controller_ref.name == controller)
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// The parents a child object concerns.
#[derive(Debug, Default)]
pub(super) struct ChildParents {
    pub(super) controllers: Vec<ObjectRef<Controller>>,
    pub(super) nodesets: Vec<ObjectRef<NodeSet>>,
    pub(super) restapis: Vec<ObjectRef<RestApi>>,
}

/// The NodeSets of namespace `ns` that reference the Controller `controller` of namespace
/// `controller_ns` (of any namespace when `None`: a stranger holding a shared name does not say)
/// and share its workers' objects in `ns`.
pub(super) fn nodesets_sharing(
    store: &Store<NodeSet>,
    ns: &str,
    controller_ns: Option<&str>,
    controller: &str,
) -> Vec<ObjectRef<NodeSet>> {
    store
        .state()
        .iter()
        .filter(|n| n.namespace().as_deref() == Some(ns) && n.spec.controller_ref.name == controller)
        .filter(|n| controller_ns.is_none_or(|c| n.controller_namespace() == c))
        .map(|n| ObjectRef::from_obj(n.as_ref()))
        .collect()
}

/// The parents a child object concerns: its controlling Controller, NodeSet or RestApi, the
/// NodeSets that own it (shared workers' objects), or (for an object holding a name the host
/// builds) the parent that would build it.
pub(super) fn child_parents(
    meta: &kube::api::ObjectMeta,
    nodesets: &Store<NodeSet>,
    controllers: &Store<Controller>,
    restapis: &Store<RestApi>,
) -> ChildParents {
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let mut ctl = Vec::new();
    let mut sets = Vec::new();
    let mut rest = Vec::new();
    for o in meta.owner_references.iter().flatten() {
        match o.kind.as_str() {
            "Controller" if o.controller == Some(true) => ctl.push(ObjectRef::new(&o.name).within(&ns)),
            "NodeSet" => sets.push(ObjectRef::new(&o.name).within(&ns)),
            "RestApi" if o.controller == Some(true) => rest.push(ObjectRef::new(&o.name).within(&ns)),
            _ => {}
        }
    }
    if ctl.is_empty() && sets.is_empty() && rest.is_empty() {
        if let Some(r) = name.strip_suffix("-restapi") {
            rest.push(ObjectRef::new(r).within(&ns));
        }
        // A name the host builds, held by an object no parent owns (or owned by a stranger).
        let controller = name
            .strip_suffix("-controller-internal")
            .or_else(|| name.strip_suffix("-controller"))
            .or_else(|| name.strip_suffix("-config"));
        if let Some(c) = controller {
            ctl.push(ObjectRef::new(c).within(&ns));
        }
        let shared = name
            .strip_prefix(WORKER_SUBDOMAIN_PREFIX)
            .map(|rest| rest.strip_prefix("pdb-").unwrap_or(rest));
        if let Some(c) = shared {
            sets.extend(nodesets_sharing(nodesets, &ns, None, c));
        }
        if let Some(n) = name.strip_suffix("-ssh-config") {
            sets.push(ObjectRef::new(n).within(&ns));
        }
    }
    ctl.retain(|r| controllers.get(r).is_some());
    sets.retain(|r| nodesets.get(r).is_some());
    rest.retain(|r| restapis.get(r).is_some());
    ChildParents {
        controllers: ctl,
        nodesets: sets,
        restapis: rest,
    }
}

/// The NodeSets a pod concerns: its controlling NodeSet, or, for a pod no NodeSet controls, the
/// NodeSets of its namespace that could adopt it or whose ordinal name it holds.
pub(super) fn pod_owners(pod: &Pod, nodesets: &Store<NodeSet>) -> Vec<ObjectRef<NodeSet>> {
    let ns = pod.namespace().unwrap_or_default();
    if let Some(owner) = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "NodeSet")
    {
        return vec![ObjectRef::new(&owner.name).within(&ns)];
    }
    nodesets
        .state()
        .iter()
        .filter(|n| n.namespace().as_deref() == Some(ns.as_str()))
        .filter(|n| {
            n.pod_ordinal(&pod.name_any()).is_some()
                || n.selector_labels()
                    .iter()
                    .all(|(k, v)| pod.labels().get(k) == Some(v))
        })
        .map(|n| ObjectRef::from_obj(n.as_ref()))
        .collect()
}
