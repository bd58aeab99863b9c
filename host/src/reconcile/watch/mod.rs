//! One watch per kind. Each kind's watch fills its reflector store (managedFields stripped);
//! the same stream, *after* the store has applied an event, lowers the NodeSet expectations
//! (pods) and triggers the reconciles the event concerns. So a reconcile triggered by an event
//! always finds the event in the cache it reads, and no kind is watched twice.
//!
//! A parent's own event triggers only when it changed what a pass reads of it ([`Inputs`]: the
//! spec, by generation, the labels and annotations, the deletion): a status write, the host's
//! own included, triggers nothing, and a Controller's status write does not requeue its
//! NodeSets. Pods and children trigger their parents on every event.
//!
//! Relists (after a `410 Gone` or a broken watch): the reflector swaps the new list into its
//! store at once when the list completes, so pod sightings of a relist are applied to the
//! expectations at that moment too, never earlier; and an expected pod missing from the
//! completed list is released at once (see [`Expectations::relisted`]).

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
    time::Instant,
};

use futures::{Future, Stream, StreamExt, future::BoxFuture};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{ConfigMap, Pod, Service},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store, store::Writer},
        watcher,
    },
};
use slinky_api::{Controller, NodeSet, keys, owners::controller_uid};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{
    caches::{Caches, ChildCaches},
    expectations::{Expectations, Relist},
    parents::{child_parents, nodesets_of, nodesets_sharing, pod_owners},
};

/// The caches and the reconcile triggers derived from their watches.
pub struct Watches {
    /// The caches of the served namespaces.
    pub caches: Caches,
    /// NodeSets to reconcile (their pods, children, siblings, themselves or their Controller
    /// changed).
    pub nodeset_triggers: UnboundedReceiver<ObjectRef<NodeSet>>,
    /// Controllers to reconcile (their children, referenced ConfigMaps, NodeSets or themselves
    /// changed).
    pub controller_triggers: UnboundedReceiver<ObjectRef<Controller>>,
    /// Drives the watches; runs until dropped.
    pub task: BoxFuture<'static, ()>,
}

/// Whether a watch event concerns one of `allowed` namespaces (all when empty).
fn in_namespaces<K: Resource>(ev: &Result<watcher::Event<K>, watcher::Error>, allowed: &[String]) -> bool {
    match ev {
        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o)) => {
            allowed.is_empty() || o.meta().namespace.as_ref().is_some_and(|n| allowed.contains(n))
        }
        _ => true,
    }
}

fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Resource<DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The watch of one kind, reflected into `writer`'s store (after `modify` and stripping
/// managedFields); yields each event after the store applied it. Errors are logged and the watch
/// retried with backoff.
fn root<K>(
    api: Api<K>,
    writer: Writer<K>,
    allowed: Arc<Vec<String>>,
    kind: &'static str,
    mut modify: impl FnMut(&mut K) + Send + 'static,
) -> impl Stream<Item = watcher::Event<K>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .filter(move |ev| futures::future::ready(in_namespaces(ev, &allowed)))
        .modify(move |o| {
            o.meta_mut().managed_fields = None;
            modify(o);
        })
        .default_backoff()
        .reflect(writer)
        .filter_map(move |ev| {
            futures::future::ready(match ev {
                Ok(ev) => Some(ev),
                Err(error) => {
                    tracing::warn!(%error, kind, "watch error (retrying)");
                    None
                }
            })
        })
}

/// A ConfigMap the host did not build keeps its keys with empty values in the cache: the host
/// only needs the file names a Controller's referenced ConfigMaps provide.
fn keys_only(cm: &mut ConfigMap) {
    let ours = cm
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::ANNOTATION_BUILDER));
    if ours {
        return;
    }
    for v in cm.data.iter_mut().flat_map(|d| d.values_mut()) {
        v.clear();
    }
    for v in cm.binary_data.iter_mut().flat_map(|d| d.values_mut()) {
        v.0.clear();
    }
}

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

/// A pod as the expectations see it.
struct Sighting {
    owner: Option<String>,
    name: String,
    uid: Option<String>,
    terminating: bool,
}

impl Sighting {
    fn of(pod: &Pod) -> Self {
        Sighting {
            owner: controller_uid(pod.owner_references(), "NodeSet").map(str::to_string),
            name: pod.name_any(),
            uid: pod.uid(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    fn observe(&self, expectations: &Expectations, deleted: bool) {
        let Some(owner) = &self.owner else { return };
        expectations.creation_observed(owner, &self.name);
        if let (true, Some(uid)) = (deleted || self.terminating, &self.uid) {
            expectations.deletion_observed(owner, uid);
        }
    }
}

/// Lowers expectations from the pod watch, deferring a relist's sightings to its end.
#[derive(Default)]
struct PodObserver {
    relist: Option<(Instant, Vec<Sighting>)>,
}

impl PodObserver {
    fn observe(&mut self, expectations: &Expectations, ev: &watcher::Event<Pod>) {
        match ev {
            watcher::Event::Apply(pod) => Sighting::of(pod).observe(expectations, false),
            watcher::Event::Delete(pod) => Sighting::of(pod).observe(expectations, true),
            watcher::Event::Init => self.relist = Some((Instant::now(), Vec::new())),
            watcher::Event::InitApply(pod) => {
                if let Some((_, seen)) = self.relist.as_mut() {
                    seen.push(Sighting::of(pod));
                }
            }
            watcher::Event::InitDone => {
                let Some((started, seen)) = self.relist.take() else {
                    return;
                };
                let mut relist = Relist {
                    started: Some(started),
                    names: HashMap::new(),
                    uids: HashSet::new(),
                };
                for s in &seen {
                    s.observe(expectations, false);
                    if let Some(owner) = &s.owner {
                        relist
                            .names
                            .entry(owner.clone())
                            .or_default()
                            .insert(s.name.clone());
                    }
                    relist.uids.extend(s.uid.clone());
                }
                expectations.relisted(&relist);
            }
        }
    }
}

/// Where watch events send reconciles: the parent caches (to find whom an event concerns) and
/// the two trigger channels.
#[derive(Clone)]
struct Triggers {
    nodesets: Store<NodeSet>,
    controllers: Store<Controller>,
    nodeset_tx: UnboundedSender<ObjectRef<NodeSet>>,
    controller_tx: UnboundedSender<ObjectRef<Controller>>,
}

impl Triggers {
    fn nodeset(&self, obj: ObjectRef<NodeSet>) {
        send(&self.nodeset_tx, obj);
    }

    fn controller(&self, obj: ObjectRef<Controller>) {
        send(&self.controller_tx, obj);
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
                let (c, n) = child_parents(meta, &self.nodesets, &self.controllers);
                tracing::trace!(kind, controllers = c.len(), nodesets = n.len(), "child event");
                c.into_iter().for_each(|r| self.controller(r));
                n.into_iter().for_each(|r| self.nodeset(r));
            }
            watcher::Event::InitDone => {
                self.all_controllers();
                self.all_nodesets();
            }
            _ => {}
        }
    }
}

/// What every watch needs: the client, the namespace watched (one, or all) and the namespaces
/// kept.
struct Scope<'a> {
    client: &'a Client,
    namespace: &'a Option<String>,
    allowed: &'a Arc<Vec<String>>,
}

impl Scope<'_> {
    /// The watch of kind `K` into `writer` (see [`root`]).
    fn watch<K>(
        &self,
        writer: Writer<K>,
        kind: &'static str,
        modify: impl FnMut(&mut K) + Send + 'static,
    ) -> impl Stream<Item = watcher::Event<K>> + Send + 'static
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        root(
            api::<K>(self.client, self.namespace),
            writer,
            self.allowed.clone(),
            kind,
            modify,
        )
    }
}

/// Pods: lower the expectations, trigger the NodeSets a pod concerns, and every NodeSet after a
/// relist.
fn pod_task(
    pods: impl Stream<Item = watcher::Event<Pod>> + Send + 'static,
    expectations: Arc<Expectations>,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut observer = PodObserver::default();
    pods.for_each(move |ev| {
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
fn child_task<K: Resource + Send + 'static>(
    children: impl Stream<Item = watcher::Event<K>> + Send + 'static,
    kind: &'static str,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    children.for_each(move |ev| {
        t.child_event(kind, &meta_event(ev, |mut o| std::mem::take(o.meta_mut())));
        futures::future::ready(())
    })
}

/// ConfigMaps: a child like the others, and also the Controllers that reference one.
fn config_map_task(
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

/// Controllers: the Controller itself and its NodeSets (which build with it), when what they read
/// of it changed ([`Inputs`]); on a deletion, its NodeSets.
fn controller_task(
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
            }
            _ => {}
        }
        futures::future::ready(())
    })
}

/// NodeSets: when what a pass reads of a NodeSet changed ([`Inputs`]), the NodeSet, its
/// Controller (its `slurm.conf` lists the NodeSet) and its siblings (their shared objects' owners);
/// on a deletion, the Controller and the siblings, and the NodeSet's expectations are forgotten.
fn nodeset_task(
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

/// Start the watches (namespaced when `namespace` is one namespace, else cluster-wide filtered
/// to `allowed`).
pub fn start(
    client: &Client,
    namespace: &Option<String>,
    allowed: Arc<Vec<String>>,
    expectations: Arc<Expectations>,
    secret_poll: std::time::Duration,
) -> Watches {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (services, svc_writer) = reflector::store::<Service>();
    let (configmaps, cm_writer) = reflector::store::<ConfigMap>();
    let (statefulsets, sts_writer) = reflector::store::<StatefulSet>();
    let (pdbs, pdb_writer) = reflector::store::<PodDisruptionBudget>();
    let (controllers, ctl_writer) = reflector::store::<Controller>();
    let (nodesets, ns_writer) = reflector::store::<NodeSet>();
    let (nodeset_tx, nodeset_triggers) = unbounded_channel();
    let (controller_tx, controller_triggers) = unbounded_channel();
    let t = Triggers {
        nodesets: nodesets.clone(),
        controllers: controllers.clone(),
        nodeset_tx,
        controller_tx,
    };
    let scope = Scope {
        client,
        namespace,
        allowed: &allowed,
    };
    let pod_task = pod_task(
        scope.watch(pod_writer, "Pod", |_| {}),
        expectations.clone(),
        t.clone(),
    );
    let svc_task = child_task(scope.watch(svc_writer, "Service", |_| {}), "Service", t.clone());
    let sts_task = child_task(
        scope.watch(sts_writer, "StatefulSet", |_| {}),
        "StatefulSet",
        t.clone(),
    );
    let pdb_task = child_task(
        scope.watch(pdb_writer, "PodDisruptionBudget", |_| {}),
        "PodDisruptionBudget",
        t.clone(),
    );
    let cm_task = config_map_task(scope.watch(cm_writer, "ConfigMap", keys_only), t.clone());
    let ctl_task = controller_task(scope.watch(ctl_writer, "Controller", |_| {}), t.clone());
    // Key Secrets are polled by name, not watched (see `secrets`).
    let secret_task = super::secrets::poll(
        client.clone(),
        controllers.clone(),
        t.controller_tx.clone(),
        allowed.clone(),
        secret_poll,
    );
    let ns_task = nodeset_task(scope.watch(ns_writer, "NodeSet", |_| {}), expectations, t);
    let task = async move {
        tokio::join!(
            pod_task,
            svc_task,
            cm_task,
            sts_task,
            pdb_task,
            ctl_task,
            ns_task,
            secret_task
        );
    };
    Watches {
        caches: Caches {
            pods,
            children: ChildCaches {
                services,
                configmaps,
                statefulsets,
                pdbs,
            },
            controllers,
            nodesets,
        },
        nodeset_triggers,
        controller_triggers,
        task: Box::pin(task),
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, owner: &str) -> Result<Pod, serde_json::Error> {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": format!("uid-{name}"),
            "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "name": "w", "uid": owner, "controller": true}]}}))
    }

    #[test]
    fn a_relist_shows_its_pods_to_the_expectations_only_when_it_completes() -> Result<(), serde_json::Error> {
        let expectations = Expectations::new();
        let mut observer = PodObserver::default();
        expectations.expect_creations("ns-uid", ["w-0".to_string()]);
        expectations.creation_succeeded("ns-uid", "w-0");
        observer.observe(&expectations, &watcher::Event::Init);
        observer.observe(&expectations, &watcher::Event::InitApply(pod("w-0", "ns-uid")?));
        // The store still holds the previous list until the relist completes: a pass that
        // found its expectations satisfied now would read a cache without w-0.
        assert!(!expectations.satisfied("ns-uid"), "seen before the store has it");
        observer.observe(&expectations, &watcher::Event::InitDone);
        assert!(expectations.satisfied("ns-uid"));
        Ok(())
    }

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
