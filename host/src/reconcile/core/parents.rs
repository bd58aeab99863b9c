//! Which parents a watch event concerns: the NodeSets of a Controller, the NodeSets sharing a
//! Controller's workers' objects, the RestApis of a Controller, the parents of a child object,
//! the NodeSets of a pod.

use k8s_openapi::api::core::v1::Pod;
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi, checks::WORKER_SUBDOMAIN_PREFIX};

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

/// The LoginSets of namespace `ns` that reference the Controller `controller` (of their
/// namespace).
pub(super) fn loginsets_of(store: &Store<LoginSet>, ns: &str, controller: &str) -> Vec<ObjectRef<LoginSet>> {
    store
        .state()
        .iter()
        .filter(|l| l.namespace().as_deref() == Some(ns) && l.spec.controller_ref.name == controller)
        .map(|l| ObjectRef::from_obj(l.as_ref()))
        .collect()
}

/// The Controllers of namespace `ns` whose `spec.accountingRef` names `accounting`.
pub(super) fn controllers_of_accounting(
    store: &Store<Controller>,
    ns: &str,
    accounting: &str,
) -> Vec<ObjectRef<Controller>> {
    store
        .state()
        .iter()
        .filter(|c| {
            c.namespace().as_deref() == Some(ns)
                && c.spec
                    .accounting_ref
                    .as_ref()
                    .is_some_and(|r| r.name == accounting)
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// The parent caches a child's event is looked up in.
pub(super) struct ParentStores<'a> {
    pub(super) nodesets: &'a Store<NodeSet>,
    pub(super) controllers: &'a Store<Controller>,
    pub(super) restapis: &'a Store<RestApi>,
    pub(super) loginsets: &'a Store<LoginSet>,
    pub(super) accountings: &'a Store<Accounting>,
}

/// The parents a child object concerns.
#[derive(Debug, Default)]
pub(super) struct ChildParents {
    pub(super) controllers: Vec<ObjectRef<Controller>>,
    pub(super) nodesets: Vec<ObjectRef<NodeSet>>,
    pub(super) restapis: Vec<ObjectRef<RestApi>>,
    pub(super) loginsets: Vec<ObjectRef<LoginSet>>,
    pub(super) accountings: Vec<ObjectRef<Accounting>>,
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

/// The parents a child object concerns: its controlling Controller, NodeSet, RestApi, LoginSet
/// or Accounting, the NodeSets that own it (shared workers' objects), or (for an object holding
/// a name the host builds) the parent that would build it.
pub(super) fn child_parents(meta: &kube::api::ObjectMeta, stores: &ParentStores<'_>) -> ChildParents {
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let mut ctl = Vec::new();
    let mut sets = Vec::new();
    let mut rest = Vec::new();
    let mut logins = Vec::new();
    let mut accts = Vec::new();
    for o in meta.owner_references.iter().flatten() {
        let controls = o.controller == Some(true);
        match o.kind.as_str() {
            "Controller" if controls => ctl.push(ObjectRef::new(&o.name).within(&ns)),
            "NodeSet" => sets.push(ObjectRef::new(&o.name).within(&ns)),
            "RestApi" if controls => rest.push(ObjectRef::new(&o.name).within(&ns)),
            "LoginSet" if controls => logins.push(ObjectRef::new(&o.name).within(&ns)),
            "Accounting" if controls => accts.push(ObjectRef::new(&o.name).within(&ns)),
            _ => {}
        }
    }
    let owned =
        !(ctl.is_empty() && sets.is_empty() && rest.is_empty() && logins.is_empty() && accts.is_empty());
    if !owned {
        if let Some(r) = name.strip_suffix("-restapi") {
            rest.push(ObjectRef::new(r).within(&ns));
        }
        if let Some(a) = name.strip_suffix("-accounting") {
            accts.push(ObjectRef::new(a).within(&ns));
        }
        // A LoginSet's Deployment and Service carry its own name.
        logins.push(ObjectRef::new(name.strip_suffix("-ssh-config").unwrap_or(&name)).within(&ns));
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
            sets.extend(nodesets_sharing(stores.nodesets, &ns, None, c));
        }
        if let Some(n) = name.strip_suffix("-ssh-config") {
            sets.push(ObjectRef::new(n).within(&ns));
        }
    }
    ctl.retain(|r| stores.controllers.get(r).is_some());
    sets.retain(|r| stores.nodesets.get(r).is_some());
    rest.retain(|r| stores.restapis.get(r).is_some());
    logins.retain(|r| stores.loginsets.get(r).is_some());
    accts.retain(|r| stores.accountings.get(r).is_some());
    ChildParents {
        controllers: ctl,
        nodesets: sets,
        restapis: rest,
        loginsets: logins,
        accountings: accts,
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
