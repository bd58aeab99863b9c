//! What each kind's watch events trigger, once its store has applied them: the reconciles of
//! the parents an event concerns ([`Triggers`]), only when what a pass reads of a parent changed
//! ([`Inputs`]); the pod watch also lowers the expectations ([`super::sightings`]).

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use futures::{Future, Stream, StreamExt};
use k8s_openapi::api::{
    apps::v1::ControllerRevision,
    core::v1::{ConfigMap, PersistentVolumeClaim, Pod},
};
use kube::{
    Resource, ResourceExt,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi, keys};
use tokio::sync::mpsc::UnboundedSender;

use super::sightings::PodObserver;
use crate::reconcile::core::pod_index::PodIndex;
use crate::reconcile::{
    core::expectations::Expectations,
    core::parents::{
        ParentStores, child_parents, controllers_of_accounting, loginsets_of, nodesets_of, nodesets_sharing,
        pod_owners, restapis_of,
    },
};

fn send<K: Resource<DynamicType = ()>>(tx: &UnboundedSender<ObjectRef<K>>, obj: ObjectRef<K>) {
    // The receiver lives as long as the reconcilers; after shutdown there is nobody to tell.
    let _ = tx.send(obj);
}

/// What a pass reads of a parent besides its status: its spec (by `metadata.generation`), its
/// labels and annotations (builders copy them onto what they build; the revision of the pods
/// compared against Slinky's depends on the NodeSet's) and whether it is being deleted. Not
/// its status, resourceVersion, owner references or finalizers, which no pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Inputs {
    generation: Option<i64>,
    /// A hash of the labels and annotations.
    metadata: u64,
    deleting: bool,
}

impl Inputs {
    fn of(meta: &kube::api::ObjectMeta) -> Self {
        let mut h = DefaultHasher::new();
        (&meta.labels, &meta.annotations).hash(&mut h);
        Inputs {
            generation: meta.generation,
            metadata: h.finish(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }
}

/// The [`Inputs`] each parent of one kind was last seen with, by UID.
#[derive(Default)]
struct SeenInputs(HashMap<String, Inputs>);

impl SeenInputs {
    /// Note `obj`'s inputs; whether they changed (a parent not seen before, or recreated under
    /// its name, has changed).
    fn changed<K: Resource>(&mut self, obj: &K) -> bool {
        let inputs = Inputs::of(obj.meta());
        self.0.insert(obj.meta().uid.clone().unwrap_or_default(), inputs) != Some(inputs)
    }

    fn forget<K: Resource>(&mut self, obj: &K) {
        self.0.remove(obj.meta().uid.as_deref().unwrap_or_default());
    }

    /// Start again from a relisted store (every parent is triggered then).
    fn reset<K: Resource>(&mut self, objs: &[Arc<K>]) {
        self.0 = objs
            .iter()
            .map(|o| (o.meta().uid.clone().unwrap_or_default(), Inputs::of(o.meta())))
            .collect();
    }
}

/// Where watch events send reconciles: the parent caches (to find whom an event concerns) and
/// the trigger channels.
#[derive(Clone)]
pub(super) struct Triggers {
    pub(super) nodesets: Store<NodeSet>,
    pub(super) controllers: Store<Controller>,
    pub(super) restapis: Store<RestApi>,
    pub(super) loginsets: Store<LoginSet>,
    pub(super) accountings: Store<Accounting>,
    pub(super) nodeset_tx: UnboundedSender<ObjectRef<NodeSet>>,
    pub(super) controller_tx: UnboundedSender<ObjectRef<Controller>>,
    pub(super) restapi_tx: UnboundedSender<ObjectRef<RestApi>>,
    pub(super) loginset_tx: UnboundedSender<ObjectRef<LoginSet>>,
    pub(super) accounting_tx: UnboundedSender<ObjectRef<Accounting>>,
}

impl Triggers {
    /// Triggers over the parents' stores, and the receiving ends of their channels (no
    /// BuilderPlugin triggers: the caller sets those when it watches them).
    pub(super) fn new(
        nodesets: &Store<NodeSet>,
        controllers: &Store<Controller>,
        restapis: &Store<RestApi>,
        loginsets: &Store<LoginSet>,
        accountings: &Store<Accounting>,
    ) -> (Triggers, super::Receivers) {
        let (nodeset_tx, nodesets_rx) = tokio::sync::mpsc::unbounded_channel();
        let (controller_tx, controllers_rx) = tokio::sync::mpsc::unbounded_channel();
        let (restapi_tx, restapis_rx) = tokio::sync::mpsc::unbounded_channel();
        let (loginset_tx, loginsets_rx) = tokio::sync::mpsc::unbounded_channel();
        let (accounting_tx, accountings_rx) = tokio::sync::mpsc::unbounded_channel();
        let triggers = Triggers {
            nodesets: nodesets.clone(),
            controllers: controllers.clone(),
            restapis: restapis.clone(),
            loginsets: loginsets.clone(),
            accountings: accountings.clone(),
            nodeset_tx,
            controller_tx,
            restapi_tx,
            loginset_tx,
            accounting_tx,
        };
        let receivers = super::Receivers {
            nodesets: nodesets_rx,
            controllers: controllers_rx,
            restapis: restapis_rx,
            loginsets: loginsets_rx,
            accountings: accountings_rx,
            builder_plugins: tokio::sync::mpsc::unbounded_channel().1,
        };
        (triggers, receivers)
    }

    pub(super) fn nodeset(&self, obj: ObjectRef<NodeSet>) {
        send(&self.nodeset_tx, obj);
    }

    fn controller(&self, obj: ObjectRef<Controller>) {
        send(&self.controller_tx, obj);
    }

    fn restapi(&self, obj: ObjectRef<RestApi>) {
        send(&self.restapi_tx, obj);
    }

    fn loginset(&self, obj: ObjectRef<LoginSet>) {
        send(&self.loginset_tx, obj);
    }

    fn accounting(&self, obj: ObjectRef<Accounting>) {
        send(&self.accounting_tx, obj);
    }

    /// Every cached RestApi, LoginSet and Accounting (the component parents).
    fn all_components(&self) {
        for r in self.restapis.state() {
            self.restapi(ObjectRef::from_obj(r.as_ref()));
        }
        for l in self.loginsets.state() {
            self.loginset(ObjectRef::from_obj(l.as_ref()));
        }
        for a in self.accountings.state() {
            self.accounting(ObjectRef::from_obj(a.as_ref()));
        }
    }

    /// Every cached NodeSet.
    fn all_nodesets(&self) {
        for n in self.nodesets.state() {
            self.nodeset(ObjectRef::from_obj(n.as_ref()));
        }
    }

    /// Every cached Controller.
    fn all_controllers(&self) {
        for c in self.controllers.state() {
            self.controller(ObjectRef::from_obj(c.as_ref()));
        }
    }

    /// A child's event triggers its parents; the end of a relist triggers every parent.
    fn child_event(&self, kind: &'static str, ev: &watcher::Event<kube::api::ObjectMeta>) {
        match ev {
            watcher::Event::Apply(meta) | watcher::Event::Delete(meta) => {
                let stores = ParentStores {
                    nodesets: &self.nodesets,
                    controllers: &self.controllers,
                    restapis: &self.restapis,
                    loginsets: &self.loginsets,
                    accountings: &self.accountings,
                };
                let p = child_parents(meta, &stores);
                tracing::trace!(
                    kind,
                    controllers = p.controllers.len(),
                    nodesets = p.nodesets.len(),
                    restapis = p.restapis.len(),
                    loginsets = p.loginsets.len(),
                    accountings = p.accountings.len(),
                    "child event"
                );
                p.controllers.into_iter().for_each(|r| self.controller(r));
                p.nodesets.into_iter().for_each(|r| self.nodeset(r));
                p.restapis.into_iter().for_each(|r| self.restapi(r));
                p.loginsets.into_iter().for_each(|r| self.loginset(r));
                p.accountings.into_iter().for_each(|r| self.accounting(r));
            }
            watcher::Event::InitDone => {
                self.all_controllers();
                self.all_nodesets();
                self.all_components();
            }
            _ => {}
        }
    }
}

/// Pods: lower the expectations, trigger the NodeSets a pod concerns, and every NodeSet after a
/// relist.
pub(super) fn pod_task(
    pods: impl Stream<Item = watcher::Event<Pod>> + Send + 'static,
    expectations: Arc<Expectations>,
    index: (PodIndex, Store<Pod>),
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut observer = PodObserver::default();
    pods.for_each(move |ev| {
        // The index first, the expectations second (see `pod_index`).
        match &ev {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => index.0.apply(pod),
            watcher::Event::Delete(pod) => index.0.delete(pod),
            watcher::Event::InitDone => index.0.rebuild(&index.1),
            watcher::Event::Init => {}
        }
        observer.observe(&expectations, &ev);
        match &ev {
            watcher::Event::Apply(pod) | watcher::Event::Delete(pod) => {
                for n in pod_owners(pod, &t.nodesets) {
                    t.nodeset(n);
                }
            }
            watcher::Event::InitDone => t.all_nodesets(),
            _ => {}
        }
        futures::future::ready(())
    })
}

/// A child kind's watch: each event triggers the child's parents.
pub(super) fn child_task<K: Resource + Send + 'static>(
    children: impl Stream<Item = watcher::Event<K>> + Send + 'static,
    kind: &'static str,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    children.for_each(move |ev| {
        t.child_event(kind, &meta_event(ev, |mut o| std::mem::take(o.meta_mut())));
        futures::future::ready(())
    })
}

/// ControllerRevisions: the NodeSet that owns one, or (an orphan) the NodeSet its instance label
/// names, which adopts it; every NodeSet after a relist.
pub(super) fn revision_task(
    revisions: impl Stream<Item = watcher::Event<ControllerRevision>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    revisions.for_each(move |ev| {
        match &ev {
            watcher::Event::Apply(r) | watcher::Event::Delete(r) => {
                let ns = r.namespace().unwrap_or_default();
                let owners: Vec<&str> = r
                    .owner_references()
                    .iter()
                    .filter(|o| o.kind == "NodeSet")
                    .map(|o| o.name.as_str())
                    .collect();
                let instance = r.labels().get(keys::LABEL_INSTANCE).map(String::as_str);
                let names = if owners.is_empty() {
                    instance.into_iter().collect()
                } else {
                    owners
                };
                for name in names {
                    t.nodeset(ObjectRef::new(name).within(&ns));
                }
            }
            watcher::Event::InitDone => t.all_nodesets(),
            _ => {}
        }
        futures::future::ready(())
    })
}

/// Volume claims: the NodeSets whose per-pod claim a claim is, by name
/// (`<template>-<nodeset>-<ordinal>`, whatever its labels: a claim someone else made counts), so
/// a pod waiting for a claim being deleted, or a claim whose owners drifted, is looked at again.
pub(super) fn claim_task(
    claims: impl Stream<Item = watcher::Event<PersistentVolumeClaim>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    claims.for_each(move |ev| {
        if let watcher::Event::Apply(c) | watcher::Event::Delete(c) = &ev {
            let (ns, name) = (c.namespace().unwrap_or_default(), c.name_any());
            for n in t.nodesets.state() {
                if n.namespace().as_deref() != Some(ns.as_str()) || n.spec.volume_claim_templates.is_empty() {
                    continue;
                }
                let own = n.claim_templates().unwrap_or_default().iter().any(|tpl| {
                    let prefix = format!(
                        "{}-{}-",
                        tpl.metadata.name.as_deref().unwrap_or_default(),
                        n.name_any()
                    );
                    name.strip_prefix(&prefix)
                        .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
                });
                if own {
                    t.nodeset(ObjectRef::from_obj(n.as_ref()));
                }
            }
        }
        futures::future::ready(())
    })
}

/// ConfigMaps: a child like the others, and also the Controllers that reference one.
pub(super) fn config_map_task(
    configmaps: impl Stream<Item = watcher::Event<ConfigMap>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    configmaps.for_each(move |ev| {
        // A ConfigMap a Controller references (its files are in slurm.conf and the pods).
        if let watcher::Event::Apply(cm) | watcher::Event::Delete(cm) = &ev {
            let (ns, name) = (cm.namespace().unwrap_or_default(), cm.name_any());
            for c in t.controllers.state() {
                if c.namespace().as_deref() == Some(ns.as_str()) && c.config_map_refs().contains(&name) {
                    t.controller(ObjectRef::from_obj(c.as_ref()));
                }
            }
        }
        t.child_event("ConfigMap", &meta_event(ev, |o| o.metadata));
        futures::future::ready(())
    })
}

/// Controllers: the Controller itself, its NodeSets, RestApis and LoginSets (which build with it),
/// when what they read of it changed ([`Inputs`]); on a deletion, its NodeSets, RestApis and
/// LoginSets.
pub(super) fn controller_task(
    controllers: impl Stream<Item = watcher::Event<Controller>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut seen = SeenInputs::default();
    controllers.for_each(move |ev| {
        let nodesets = |c: &Controller| {
            let ns = c.namespace().unwrap_or_default();
            for n in nodesets_of(&t.nodesets, &ns, &c.name_any()) {
                t.nodeset(n);
            }
            for r in restapis_of(&t.restapis, &ns, &c.name_any()) {
                t.restapi(r);
            }
            for l in loginsets_of(&t.loginsets, &ns, &c.name_any()) {
                t.loginset(l);
            }
        };
        match &ev {
            watcher::Event::Apply(c) if seen.changed(c) => {
                t.controller(ObjectRef::from_obj(c));
                nodesets(c);
            }
            watcher::Event::Delete(c) => {
                seen.forget(c);
                nodesets(c);
            }
            watcher::Event::InitDone => {
                seen.reset(&t.controllers.state());
                t.all_controllers();
                t.all_nodesets();
                t.all_components();
            }
            _ => {}
        }
        futures::future::ready(())
    })
}

/// NodeSets: when what a pass reads of a NodeSet changed ([`Inputs`]), the NodeSet, its
/// Controller (its `slurm.conf` lists the NodeSet) and its siblings (their shared objects' owners);
/// on a deletion, the Controller and the siblings, and the NodeSet's expectations are forgotten.
pub(super) fn nodeset_task(
    nodesets: impl Stream<Item = watcher::Event<NodeSet>> + Send + 'static,
    expectations: Arc<Expectations>,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut seen = SeenInputs::default();
    nodesets.for_each(move |ev| {
        // The NodeSet's Controller and the other NodeSets sharing its workers' objects.
        let neighbours = |n: &NodeSet| {
            let ns = n.namespace().unwrap_or_default();
            let controller =
                ObjectRef::<Controller>::new(&n.spec.controller_ref.name).within(n.controller_namespace());
            t.controller(controller);
            let itself = ObjectRef::from_obj(n);
            for sibling in nodesets_sharing(
                &t.nodesets,
                &ns,
                Some(n.controller_namespace()),
                &n.spec.controller_ref.name,
            ) {
                if sibling != itself {
                    t.nodeset(sibling);
                }
            }
        };
        match &ev {
            watcher::Event::Apply(n) if seen.changed(n) => {
                t.nodeset(ObjectRef::from_obj(n));
                neighbours(n);
            }
            // The NodeSet is gone: so are its expectations (its pods go with it).
            watcher::Event::Delete(n) => {
                expectations.forget(&n.uid().unwrap_or_default());
                seen.forget(n);
                neighbours(n);
            }
            watcher::Event::InitDone => {
                let state = t.nodesets.state();
                let live: HashSet<String> = state.iter().filter_map(|n| n.uid()).collect();
                expectations.retain_owners(&live);
                seen.reset(&state);
                t.all_nodesets();
            }
            _ => {}
        }
        futures::future::ready(())
    })
}

/// RestApis: the RestApi, when what a pass reads of it changed ([`Inputs`]); its Controller's
/// slurmrestd address follows the oldest RestApi (read from the cache at each Slurm call).
pub(super) fn restapi_task(
    restapis: impl Stream<Item = watcher::Event<RestApi>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut seen = SeenInputs::default();
    restapis.for_each(move |ev| {
        match &ev {
            watcher::Event::Apply(r) if seen.changed(r) => t.restapi(ObjectRef::from_obj(r)),
            watcher::Event::Delete(r) => seen.forget(r),
            watcher::Event::InitDone => {
                seen.reset(&t.restapis.state());
                t.all_components();
            }
            _ => {}
        }
        futures::future::ready(())
    })
}

/// LoginSets: the LoginSet, when what a pass reads of it changed ([`Inputs`]).
pub(super) fn loginset_task(
    loginsets: impl Stream<Item = watcher::Event<LoginSet>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut seen = SeenInputs::default();
    loginsets.for_each(move |ev| {
        match &ev {
            watcher::Event::Apply(l) if seen.changed(l) => t.loginset(ObjectRef::from_obj(l)),
            watcher::Event::Delete(l) => seen.forget(l),
            watcher::Event::InitDone => {
                seen.reset(&t.loginsets.state());
                t.all_components();
            }
            _ => {}
        }
        futures::future::ready(())
    })
}

/// Accountings: the Accounting, and the Controllers that reference it (their `slurm.conf` names
/// its address), when what a pass reads of it changed ([`Inputs`]) or it went away.
pub(super) fn accounting_task(
    accountings: impl Stream<Item = watcher::Event<Accounting>> + Send + 'static,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut seen = SeenInputs::default();
    accountings.for_each(move |ev| {
        let controllers = |a: &Accounting| {
            for c in
                controllers_of_accounting(&t.controllers, &a.namespace().unwrap_or_default(), &a.name_any())
            {
                t.controller(c);
            }
        };
        match &ev {
            watcher::Event::Apply(a) if seen.changed(a) => {
                t.accounting(ObjectRef::from_obj(a));
                controllers(a);
            }
            watcher::Event::Delete(a) => {
                seen.forget(a);
                controllers(a);
            }
            watcher::Event::InitDone => {
                seen.reset(&t.accountings.state());
                t.all_components();
                t.all_controllers();
            }
            _ => {}
        }
        futures::future::ready(())
    })
}

/// A watch event of an object, as an event of its metadata.
fn meta_event<K>(
    ev: watcher::Event<K>,
    meta: impl Fn(K) -> kube::api::ObjectMeta,
) -> watcher::Event<kube::api::ObjectMeta> {
    match ev {
        watcher::Event::Apply(o) => watcher::Event::Apply(meta(o)),
        watcher::Event::Delete(o) => watcher::Event::Delete(meta(o)),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(meta(o)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// BuilderPlugins: every change and deletion (the queue's trigger stream lets a deleted one
/// leave the pipelines at once), every one when a list completes (their status), and every one
/// that a re-list no longer has (deleted while the watch was down: no deletion event tells).
pub(super) fn builder_plugin_task(
    builder_plugins: impl Stream<Item = watcher::Event<slinky_api::BuilderPlugin>> + Send + 'static,
    store: Store<slinky_api::BuilderPlugin>,
    tx: UnboundedSender<ObjectRef<slinky_api::BuilderPlugin>>,
) -> impl Future<Output = ()> + Send + 'static {
    let mut names = super::listed::ListedNames::default();
    builder_plugins.for_each(move |ev| {
        match &ev {
            watcher::Event::Apply(bp) | watcher::Event::Delete(bp) => send(&tx, ObjectRef::from_obj(bp)),
            watcher::Event::InitDone => {
                for name in names.gone() {
                    send(&tx, ObjectRef::new(&name));
                }
                for bp in store.state() {
                    send(&tx, ObjectRef::from_obj(bp.as_ref()));
                }
            }
            _ => {}
        }
        names.see(&ev);
        futures::future::ready(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_resource_version_are_no_inputs() {
        let mut seen = SeenInputs::default();
        let mut n = NodeSet::new("w", Default::default());
        n.metadata.uid = Some("u".into());
        n.metadata.generation = Some(1);
        assert!(seen.changed(&n), "a new parent");
        n.metadata.resource_version = Some("2".into());
        n.status = Some(Default::default());
        n.metadata.finalizers = Some(vec!["x".into()]);
        assert!(
            !seen.changed(&n),
            "status, resourceVersion and finalizers are not read"
        );
        n.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(seen.changed(&n), "labels");
        n.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert!(seen.changed(&n), "annotations");
        n.metadata.generation = Some(2);
        assert!(seen.changed(&n), "the spec");
        n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(seen.changed(&n), "a deletion");
        n.metadata.uid = Some("v".into());
        assert!(seen.changed(&n), "recreated under its name");
    }
}
