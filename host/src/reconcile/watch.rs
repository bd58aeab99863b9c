//! One watch per kind. Each kind's watch fills its reflector store (managedFields stripped);
//! the same stream, *after* the store has applied an event, lowers the NodeSet expectations
//! (pods) and triggers the reconciles the event concerns. So a reconcile triggered by an event
//! always finds the event in the cache it reads, and no kind is watched twice.
//!
//! Relists (after a `410 Gone` or a broken watch): the reflector swaps the new list into its
//! store at once when the list completes, so pod sightings of a relist are applied to the
//! expectations at that moment too, never earlier; and an expected pod missing from the
//! completed list is released at once (see [`Expectations::relisted`]).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use futures::{Stream, StreamExt, future::BoxFuture};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store, store::Writer},
        watcher,
    },
};
use slinky_api::{Controller, NodeSet};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::{
    expectations::{Expectations, Relist},
    nodeset::{claims_name, owner_uid},
};
use crate::plugins::policy::nodeset_selector;

/// The caches and the reconcile triggers derived from their watches.
pub struct Watches {
    /// Pods of the served namespaces.
    pub pods: Store<Pod>,
    /// Services of the served namespaces.
    pub services: Store<Service>,
    /// Controllers of the served namespaces.
    pub controllers: Store<Controller>,
    /// NodeSets of the served namespaces.
    pub nodesets: Store<NodeSet>,
    /// NodeSets to reconcile (their pods, themselves or their Controller changed).
    pub nodeset_triggers: UnboundedReceiver<ObjectRef<NodeSet>>,
    /// Controllers to reconcile (their Service or themselves changed).
    pub controller_triggers: UnboundedReceiver<ObjectRef<Controller>>,
    /// Drives the four watches; runs until dropped.
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

/// The watch of one kind, reflected into `writer`'s store; yields each event after the store
/// applied it. Errors are logged and the watch retried with backoff.
fn root<K>(
    api: Api<K>,
    writer: Writer<K>,
    allowed: Arc<Vec<String>>,
    kind: &'static str,
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
        .modify(|o| o.meta_mut().managed_fields = None)
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

fn send<K: Resource<DynamicType = ()>>(tx: &UnboundedSender<ObjectRef<K>>, obj: ObjectRef<K>) {
    // The receiver lives as long as the reconcilers; after shutdown there is nobody to tell.
    let _ = tx.send(obj);
}

fn nodesets_of(store: &Store<NodeSet>, c_ns: &str, c_name: &str) -> Vec<ObjectRef<NodeSet>> {
    store
        .state()
        .iter()
        .filter(|n| n.controller_namespace() == c_ns && n.spec.controller_ref.name == c_name)
        .map(|n| ObjectRef::from_obj(n.as_ref()))
        .collect()
}

/// The NodeSets a pod concerns: its controlling NodeSet, or, for a pod no NodeSet controls, the
/// NodeSets of its namespace that could adopt it or whose ordinal name it holds.
fn pod_owners(pod: &Pod, nodesets: &Store<NodeSet>) -> Vec<ObjectRef<NodeSet>> {
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
            claims_name(n, &pod.name_any()).is_some()
                || nodeset_selector(n)
                    .iter()
                    .all(|(k, v)| pod.labels().get(k) == Some(v))
        })
        .map(|n| ObjectRef::from_obj(n.as_ref()))
        .collect()
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
            owner: owner_uid(pod),
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

/// Start the four watches (namespaced when `namespace` is one namespace, else cluster-wide
/// filtered to `allowed`).
pub fn start(
    client: &Client,
    namespace: &Option<String>,
    allowed: Arc<Vec<String>>,
    expectations: Arc<Expectations>,
) -> Watches {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (services, svc_writer) = reflector::store::<Service>();
    let (controllers, ctl_writer) = reflector::store::<Controller>();
    let (nodesets, ns_writer) = reflector::store::<NodeSet>();
    let (ns_tx, nodeset_triggers) = unbounded_channel();
    let (ctl_tx, controller_triggers) = unbounded_channel();

    let all_nodesets = {
        let (store, tx) = (nodesets.clone(), ns_tx.clone());
        move || {
            for n in store.state() {
                send(&tx, ObjectRef::from_obj(n.as_ref()));
            }
        }
    };
    let all_controllers = {
        let (store, tx) = (controllers.clone(), ctl_tx.clone());
        move || {
            for c in store.state() {
                send(&tx, ObjectRef::from_obj(c.as_ref()));
            }
        }
    };

    let pod_task = {
        let (store, tx, exp, all) = (
            nodesets.clone(),
            ns_tx.clone(),
            expectations.clone(),
            all_nodesets.clone(),
        );
        let mut observer = PodObserver::default();
        root(api::<Pod>(client, namespace), pod_writer, allowed.clone(), "Pod").for_each(move |ev| {
            observer.observe(&exp, &ev);
            match &ev {
                watcher::Event::Apply(pod) | watcher::Event::Delete(pod) => {
                    for n in pod_owners(pod, &store) {
                        send(&tx, n);
                    }
                }
                watcher::Event::InitDone => all(),
                _ => {}
            }
            futures::future::ready(())
        })
    };
    let svc_task = {
        let (store, tx, all) = (controllers.clone(), ctl_tx.clone(), all_controllers.clone());
        root(
            api::<Service>(client, namespace),
            svc_writer,
            allowed.clone(),
            "Service",
        )
        .for_each(move |ev| {
            match &ev {
                watcher::Event::Apply(svc) | watcher::Event::Delete(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    let owner = svc
                        .owner_references()
                        .iter()
                        .find(|o| o.controller == Some(true) && o.kind == "Controller")
                        .map(|o| o.name.clone())
                        // A Service holding a Controller's Service name (owned or not) concerns it.
                        .or_else(|| svc.name_any().strip_suffix("-controller").map(str::to_string));
                    if let Some(name) = owner {
                        let r = ObjectRef::<Controller>::new(&name).within(&ns);
                        if store.get(&r).is_some() {
                            send(&tx, r);
                        }
                    }
                }
                watcher::Event::InitDone => all(),
                _ => {}
            }
            futures::future::ready(())
        })
    };
    let ctl_task = {
        let (store, ns_tx, ctl_tx, all_c, all_n) = (
            nodesets.clone(),
            ns_tx.clone(),
            ctl_tx.clone(),
            all_controllers,
            all_nodesets.clone(),
        );
        root(
            api::<Controller>(client, namespace),
            ctl_writer,
            allowed.clone(),
            "Controller",
        )
        .for_each(move |ev| {
            match &ev {
                watcher::Event::Apply(c) | watcher::Event::Delete(c) => {
                    if matches!(ev, watcher::Event::Apply(_)) {
                        send(&ctl_tx, ObjectRef::from_obj(c));
                    }
                    let ns = c.namespace().unwrap_or_default();
                    for n in nodesets_of(&store, &ns, &c.name_any()) {
                        send(&ns_tx, n);
                    }
                }
                watcher::Event::InitDone => {
                    all_c();
                    all_n();
                }
                _ => {}
            }
            futures::future::ready(())
        })
    };
    let ns_task = {
        let (store, tx, exp) = (nodesets.clone(), ns_tx, expectations);
        root(api::<NodeSet>(client, namespace), ns_writer, allowed, "NodeSet").for_each(move |ev| {
            match &ev {
                watcher::Event::Apply(n) => send(&tx, ObjectRef::from_obj(n)),
                // The NodeSet is gone: so are its expectations (its pods go with it).
                watcher::Event::Delete(n) => exp.forget(&n.uid().unwrap_or_default()),
                watcher::Event::InitDone => {
                    let live: HashSet<String> = store.state().iter().filter_map(|n| n.uid()).collect();
                    exp.retain_owners(&live);
                    all_nodesets();
                }
                _ => {}
            }
            futures::future::ready(())
        })
    };
    let task = async move {
        tokio::join!(pod_task, svc_task, ctl_task, ns_task);
    };
    Watches {
        pods,
        services,
        controllers,
        nodesets,
        nodeset_triggers,
        controller_triggers,
        task: Box::pin(task),
    }
}
