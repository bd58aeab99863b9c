//! One watch per kind. Each kind's watch fills its reflector store (managedFields stripped);
//! the same stream, *after* the store has applied an event, lowers the NodeSet expectations
//! (pods) and triggers the reconciles the event concerns. So a reconcile triggered by an event
//! always finds the event in the cache it reads, and no kind is watched twice.
//!
//! A parent's own event triggers only when it changed what a pass reads of it
//! ([`Inputs`](triggers::Inputs): the spec, by generation, the labels and annotations, the
//! deletion): a status write, the host's own included, triggers nothing, and a Controller's
//! status write does not requeue its NodeSets. Pods and children trigger their parents on every
//! event.
//!
//! Relists (after a `410 Gone` or a broken watch): the reflector swaps the new list into its
//! store at once when the list completes, so pod sightings of a relist are applied to the
//! expectations at that moment too, never earlier; and an expected pod missing from the
//! completed list is released at once (see [`Expectations::relisted`]). A BuilderPlugin the
//! completed list no longer has (deleted while the watch was down) is triggered, so its step
//! leaves the pipelines ([`listed`]).
//!
//! Here: the watches and their wiring; [`triggers`]: what each kind's events trigger;
//! [`sightings`]: what the pod watch tells the expectations.

mod listed;
pub mod nodes;
mod sightings;
pub(crate) mod slim;
mod triggers;
mod wire;

use std::sync::Arc;

use futures::{Stream, StreamExt, future::BoxFuture};
use k8s_openapi::api::{
    apps::v1::{ControllerRevision, Deployment, StatefulSet},
    core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service},
    policy::v1::PodDisruptionBudget,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::{
    Api, Client, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, store::Writer},
        watcher,
    },
};
use slinky_api::{Accounting, BuilderPlugin, Controller, LoginSet, NodeSet, RestApi, keys};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::{
    caches::{Caches, ChildCaches},
    expectations::Expectations,
};
use triggers::{
    Triggers, accounting_task, builder_plugin_task, child_task, claim_task, config_map_task, controller_task,
    loginset_task, nodeset_task, pod_task, restapi_task, revision_task,
};
pub use wire::{UNDECODABLE, WireBuilderPlugin};

/// The caches and the reconcile triggers derived from their watches.
pub struct Watches {
    /// The caches of the served namespaces.
    pub caches: Caches,
    /// The parents to reconcile, per kind.
    pub triggers: Receivers,
    /// Drives the watches; runs until dropped.
    pub task: BoxFuture<'static, ()>,
}

/// The parents to reconcile, per kind, as the watches find them.
pub struct Receivers {
    /// NodeSets (their pods, children, siblings, themselves or their Controller changed).
    pub nodesets: UnboundedReceiver<ObjectRef<NodeSet>>,
    /// Controllers (their children, referenced ConfigMaps, NodeSets or themselves changed).
    pub controllers: UnboundedReceiver<ObjectRef<Controller>>,
    /// RestApis (their children, their Controller or themselves changed).
    pub restapis: UnboundedReceiver<ObjectRef<RestApi>>,
    /// LoginSets (their children, their Controller, their `sssd.conf` Secret or themselves
    /// changed).
    pub loginsets: UnboundedReceiver<ObjectRef<LoginSet>>,
    /// Accountings (their children, their Secrets or themselves changed).
    pub accountings: UnboundedReceiver<ObjectRef<Accounting>>,
    /// BuilderPlugins (themselves changed or went away).
    pub builder_plugins: UnboundedReceiver<ObjectRef<BuilderPlugin>>,
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
/// retried with backoff. Objects are decoded as `W` and converted into `K`: the same type for
/// every kind but pods, whose wire type (`slim::SlimPod`) parses only what the cache keeps.
fn root<W, K>(
    api: Api<W>,
    config: watcher::Config,
    writer: Writer<K>,
    allowed: Arc<Vec<String>>,
    kind: &'static str,
    mut modify: impl FnMut(&mut K) + Send + 'static,
) -> impl Stream<Item = watcher::Event<K>> + Send + 'static
where
    W: Resource<DynamicType = ()>
        + Into<K>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(api, config)
        .map(|ev| ev.map(wire_into))
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
                Err(error) if not_served(&error) => {
                    // Nothing is reconciled until every cache has synced: say what is missing.
                    tracing::error!(%error, kind,
                        "the API server does not serve {kind}: install the CRDs of this version \
                         (`slinky-host crds | kubectl apply --server-side -f -`; Helm does not \
                         upgrade a chart's crds/); retrying");
                    None
                }
                Err(error) => {
                    tracing::warn!(%error, kind, "watch error (retrying)");
                    None
                }
            })
        })
}

/// A watch event of the wire type `W` as one of `K`.
fn wire_into<W: Into<K>, K>(ev: watcher::Event<W>) -> watcher::Event<K> {
    match ev {
        watcher::Event::Apply(o) => watcher::Event::Apply(o.into()),
        watcher::Event::Delete(o) => watcher::Event::Delete(o.into()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(o) => watcher::Event::InitApply(o.into()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A watch whose list the API server answers 404: the kind is not served (its CRD is missing).
fn not_served(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
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
        self.watch_with(writer, kind, watcher::Config::default(), modify)
    }

    /// [`Scope::watch`] with a watch configuration (a label selector).
    fn watch_with<K>(
        &self,
        writer: Writer<K>,
        kind: &'static str,
        config: watcher::Config,
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
        root::<K, K>(
            api::<K>(self.client, self.namespace),
            config,
            writer,
            self.allowed.clone(),
            kind,
            modify,
        )
    }
}

/// The child kinds' watches (Services, ConfigMaps, StatefulSets, PodDisruptionBudgets,
/// Deployments, claims, the NodeSets' revisions), each triggering the parents of what changed.
fn children_task(
    scope: &Scope<'_>,
    writers: ChildWriters,
    t: &Triggers,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let ChildWriters {
        services,
        configmaps,
        statefulsets,
        pdbs,
        deployments,
        claims,
        revisions,
    } = writers;
    let svc = child_task(scope.watch(services, "Service", |_| {}), "Service", t.clone());
    let sts = child_task(
        scope.watch(statefulsets, "StatefulSet", |_| {}),
        "StatefulSet",
        t.clone(),
    );
    let pdb = child_task(
        scope.watch(pdbs, "PodDisruptionBudget", |_| {}),
        "PodDisruptionBudget",
        t.clone(),
    );
    let deploy = child_task(
        scope.watch(deployments, "Deployment", |_| {}),
        "Deployment",
        t.clone(),
    );
    let claim = claim_task(scope.watch(claims, "PersistentVolumeClaim", |_| {}), t.clone());
    let cm = config_map_task(scope.watch(configmaps, "ConfigMap", keys_only), t.clone());
    // The NodeSets' revisions only (not every StatefulSet's and DaemonSet's of the cluster), and
    // without what they record.
    let revision = revision_task(
        scope.watch_with(
            revisions,
            "ControllerRevision",
            watcher::Config::default().labels(&format!(
                "{}={}",
                keys::LABEL_NAME,
                slinky_api::labels::WORKER.name
            )),
            |r| r.data = RawExtension(serde_json::Value::Null),
        ),
        t.clone(),
    );
    async move {
        tokio::join!(svc, sts, pdb, deploy, claim, cm, revision);
    }
}

impl ChildWriters {
    /// The child kinds' stores (and the claims' and revisions'), and their writers.
    fn stores() -> (
        ChildCaches,
        reflector::Store<PersistentVolumeClaim>,
        reflector::Store<ControllerRevision>,
        ChildWriters,
    ) {
        let (services, svc_writer) = reflector::store::<Service>();
        let (configmaps, cm_writer) = reflector::store::<ConfigMap>();
        let (statefulsets, sts_writer) = reflector::store::<StatefulSet>();
        let (pdbs, pdb_writer) = reflector::store::<PodDisruptionBudget>();
        let (deployments, deploy_writer) = reflector::store::<Deployment>();
        let (claims, claim_writer) = reflector::store::<PersistentVolumeClaim>();
        let (revisions, revision_writer) = reflector::store::<ControllerRevision>();
        let caches = ChildCaches {
            services,
            configmaps,
            statefulsets,
            pdbs,
            deployments,
        };
        let writers = ChildWriters {
            services: svc_writer,
            configmaps: cm_writer,
            statefulsets: sts_writer,
            pdbs: pdb_writer,
            deployments: deploy_writer,
            claims: claim_writer,
            revisions: revision_writer,
        };
        (caches, claims, revisions, writers)
    }
}

/// The writers of the child kinds' stores.
struct ChildWriters {
    services: Writer<Service>,
    configmaps: Writer<ConfigMap>,
    statefulsets: Writer<StatefulSet>,
    pdbs: Writer<PodDisruptionBudget>,
    deployments: Writer<Deployment>,
    claims: Writer<PersistentVolumeClaim>,
    revisions: Writer<ControllerRevision>,
}

/// The BuilderPlugins' watch (cluster-scoped) when `enabled`: its store and task.
fn builder_plugin_watch(
    client: &Client,
    enabled: bool,
    tx: tokio::sync::mpsc::UnboundedSender<ObjectRef<BuilderPlugin>>,
) -> (
    Option<reflector::Store<BuilderPlugin>>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    if !enabled {
        return (None, futures::future::Either::Right(futures::future::ready(())));
    }
    let (store, writer) = reflector::store::<BuilderPlugin>();
    // Each decoded on its own (see `wire`): one the host cannot decode is refused alone.
    let events = root::<WireBuilderPlugin, BuilderPlugin>(
        Api::all(client.clone()),
        watcher::Config::default(),
        writer,
        Arc::new(Vec::new()),
        "BuilderPlugin",
        |_| {},
    );
    let task = builder_plugin_task(events, store.clone(), tx);
    (Some(store), futures::future::Either::Left(task))
}

/// Start the watches (namespaced when `namespace` is one namespace, else cluster-wide filtered
/// to `allowed`; BuilderPlugins, cluster-scoped, only when `builder_plugins`).
pub fn start(
    client: &Client,
    namespace: &Option<String>,
    allowed: Arc<Vec<String>>,
    expectations: Arc<Expectations>,
    secret_poll: std::time::Duration,
    builder_plugins: bool,
) -> Watches {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (children, claims, revisions, writers) = ChildWriters::stores();
    let (restapis, restapi_writer) = reflector::store::<RestApi>();
    let (loginsets, loginset_writer) = reflector::store::<LoginSet>();
    let (accountings, accounting_writer) = reflector::store::<Accounting>();
    let (controllers, ctl_writer) = reflector::store::<Controller>();
    let (nodesets, ns_writer) = reflector::store::<NodeSet>();
    let (nodes, node_writer) = reflector::store::<k8s_openapi::api::core::v1::Node>();
    let (t, mut receivers) = Triggers::new(&nodesets, &controllers, &restapis, &loginsets, &accountings);
    let scope = Scope {
        client,
        namespace,
        allowed: &allowed,
    };
    let pod_index = super::pod_index::PodIndex::default();
    let pod_task = pod_task(
        // Decoded slim (see `slim`): the cache keeps only what a pass reads of a pod.
        root::<slim::SlimPod, Pod>(
            api(client, namespace),
            watcher::Config::default(),
            pod_writer,
            allowed.clone(),
            "Pod",
            |_| {},
        ),
        expectations.clone(),
        (pod_index.clone(), pods.clone()),
        t.clone(),
    );
    let children_task = children_task(&scope, writers, &t);
    let parents_task = futures::future::join4(
        restapi_task(scope.watch(restapi_writer, "RestApi", |_| {}), t.clone()),
        loginset_task(scope.watch(loginset_writer, "LoginSet", |_| {}), t.clone()),
        accounting_task(scope.watch(accounting_writer, "Accounting", |_| {}), t.clone()),
        controller_task(scope.watch(ctl_writer, "Controller", |_| {}), t.clone()),
    );
    // Key Secrets are polled by name, not watched (see `secrets`).
    let poll = super::secrets::Poll {
        client: client.clone(),
        allowed: allowed.clone(),
        interval: secret_poll,
    };
    let secret_task = poll.run_all(
        (&controllers, &loginsets, &accountings),
        (
            t.controller_tx.clone(),
            t.loginset_tx.clone(),
            t.accounting_tx.clone(),
        ),
    );
    let node_task = nodes::node_task(client, node_writer, pods.clone(), t.clone());
    let (bp_tx, bp_triggers) = unbounded_channel();
    receivers.builder_plugins = bp_triggers;
    let (bp_store, bp_task) = builder_plugin_watch(client, builder_plugins, bp_tx);
    let ns_task = nodeset_task(scope.watch(ns_writer, "NodeSet", |_| {}), expectations, t);
    let task = async move {
        tokio::join!(
            pod_task,
            children_task,
            parents_task,
            ns_task,
            secret_task,
            node_task,
            bp_task
        );
    };
    Watches {
        caches: Caches {
            pods,
            pod_index,
            children,
            controllers,
            nodesets,
            restapis,
            loginsets,
            accountings,
            claims,
            nodes,
            revisions,
            builder_plugins: bp_store,
        },
        triggers: receivers,
        task: Box::pin(task),
    }
}
