//! The reconcilers, wired to kube-runtime controllers: [`core`] (the machinery every kind
//! shares: watches and caches, contexts, passes and status, the child path, the writer, Events,
//! expectations, backoff, leader election) and one folder per kind (`controller`, `nodeset`,
//! `component` with `restapi`, `loginset` and `accounting`, `builder_plugin`).
//!
//! Data flows one way: the watches fill the caches (one reflector store per kind, managedFields
//! stripped) and trigger the parents an event concerns; each kind's queue (a kube-runtime
//! `Controller`) hands object keys to its reconciler; the reconciler reads the caches, consults
//! expectations, asks its builders for the desired children (with copies), diffs, and asks the
//! [`Writer`], through which every write is made.

mod accounting;
pub mod builder_plugin;
pub mod component;
pub mod controller;
pub mod core;
mod loginset;
pub mod nodeset;
mod restapi;
pub mod slurm;
pub mod token;

pub use self::core::{
    Error, Metrics, WriteMetrics,
    backoff::Backoff,
    caches::{Caches, ChildCaches},
    context::Core,
    events::Events,
    expectations::Expectations,
    leader::{LeaderConfig, Leadership},
    writer::Writer,
};

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture};
use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};
use kube::{
    Client, Resource,
    runtime::{
        Controller as KubeController, controller::Action, events::Reporter, reflector::Store, watcher,
    },
};
use slinky_api::{Accounting, BuilderPlugin, Controller, LoginSet, NodeSet, RestApi};

use self::core::{announced, applied, rollout, secrets, watch};
pub use self::{
    builder_plugin::BuilderPluginContext, component::ComponentContext, controller::ControllerContext,
    nodeset::NodeSetContext,
};
use crate::plugins::{BuildContext, BuilderKind, PluginRegistry};

/// Settings of [`start`].
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// Watch only these namespaces (all when empty). One namespace narrows the watches
    /// themselves; several watch cluster-wide and keep only these namespaces in the caches and
    /// the reconcilers.
    pub namespaces: Vec<String>,
    /// The build context for builders.
    pub build: BuildContext,
    /// The period of the resync requeue of healthy objects.
    pub resync: Option<Duration>,
    /// Leader election (default: always the leader).
    pub leadership: Leadership,
    /// Delete and recreate a StatefulSet whose immutable fields (`serviceName`, `selector`,
    /// `volumeClaimTemplates`) differ from what its builder builds (`--recreate-statefulsets`).
    /// Off by default: the difference is reported (a `ChildFailure` condition and an Event naming
    /// the field) and slurmctld keeps running on the StatefulSet it has.
    pub recreate_statefulsets: bool,
    /// How often the key Secrets Controllers reference are re-read to follow a rotation
    /// (default [`secrets::DEFAULT_INTERVAL`]; the host never lists or watches Secrets).
    pub secret_poll: Option<Duration>,
    /// `--slurmrestd-url` values: `NAMESPACE/CONTROLLER=URL`, or `URL` for every Controller.
    pub slurmrestd_urls: Vec<String>,
    /// The requests the client made (the one [`crate::client::client`] counts into), served in
    /// `/metrics`.
    pub api_requests: Arc<crate::client::ApiRequests>,
    /// Where BuilderPlugins' modules come from: the host watches and loads BuilderPlugins (the
    /// CRD must be served: [`builder_plugin::served`]); `None` runs without them.
    pub builder_plugins: Option<Arc<slinky_plugin_source::ModuleSource>>,
    /// How long start-up waits for the BuilderPlugins before reconciling without those still
    /// loading (default [`builder_plugin::STARTUP_BUDGET`]).
    pub builder_plugins_startup: Option<Duration>,
}

/// Handles to the running host, for the HTTP endpoints, summaries and tests.
#[derive(Clone)]
pub struct Handles {
    /// Caches synced (readiness).
    pub ready: Arc<AtomicBool>,
    /// Write counters.
    pub writes: Arc<WriteMetrics>,
    /// Reconcile counters.
    pub metrics: Arc<Metrics>,
    /// Expectations.
    pub expectations: Arc<Expectations>,
    /// Pod cache.
    pub pods: Store<Pod>,
    /// NodeSet cache.
    pub nodesets: Store<NodeSet>,
    /// Controller cache.
    pub controllers: Store<Controller>,
    /// StatefulSet cache.
    pub statefulsets: Store<StatefulSet>,
    /// RestApi cache.
    pub restapis: Store<slinky_api::RestApi>,
    /// LoginSet cache.
    pub loginsets: Store<slinky_api::LoginSet>,
    /// Accounting cache.
    pub accountings: Store<slinky_api::Accounting>,
    /// The Controllers' slurmrestd clients (request counts).
    pub slurm: Arc<slurm::SlurmClients>,
    /// The API requests of the client (when it is the host's, [`crate::client::client`]).
    pub api_requests: Arc<crate::client::ApiRequests>,
    /// Leadership.
    pub leader: Leadership,
}

/// A trigger stream that never yields: the controllers have no watch of their own.
fn no_watch<K: Send + 'static>() -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    futures::stream::pending()
}

fn receiver_stream<T: Send + 'static>(
    rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// What every queue of a host is made with.
struct QueueSetup<'a> {
    plugins: &'a Arc<PluginRegistry>,
    events: &'a Events,
    leadership: &'a Leadership,
    allowed: &'a Arc<Vec<String>>,
}

impl QueueSetup<'_> {
    /// A kube-runtime controller of `K` with no watch of its own: every trigger comes from the
    /// shared watches (after their stores applied the event), a swap of one of `builders`, or
    /// this process becoming the leader.
    fn queue<K>(
        &self,
        store: &Store<K>,
        triggers: tokio::sync::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<K>>,
        builders: &[BuilderKind],
    ) -> KubeController<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let mut ctl = KubeController::for_stream(no_watch::<K>(), store.clone())
            .reconcile_on(receiver_stream(triggers));
        for &kind in builders {
            ctl = ctl.reconcile_on(rollout::on_swap(
                self.plugins.clone(),
                kind,
                store.clone(),
                self.events.clone(),
                self.allowed.clone(),
            ));
        }
        ctl.reconcile_on(rollout::on_elected(
            self.leadership.clone(),
            store.clone(),
            self.allowed.clone(),
        ))
    }
}

/// A future that completes when `tx` sends (or is dropped).
fn on_signal(tx: &tokio::sync::broadcast::Sender<()>) -> impl std::future::Future<Output = ()> + use<> {
    let mut rx = tx.subscribe();
    async move {
        let _ = rx.recv().await;
    }
}

/// A reconciler's context: it reaches the [`Core`] every reconciler shares.
trait HasCore: Send + Sync + 'static {
    fn core(&self) -> &Core;
}

impl HasCore for ControllerContext {
    fn core(&self) -> &Core {
        &self.core
    }
}

impl HasCore for NodeSetContext {
    fn core(&self) -> &Core {
        &self.core
    }
}

impl HasCore for ComponentContext {
    fn core(&self) -> &Core {
        &self.core
    }
}

impl HasCore for BuilderPluginContext {
    fn core(&self) -> &Core {
        &self.core
    }
}

/// Run one kind's queue with `reconcile` until `tx_shutdown` sends: its errors retried with the
/// object's backoff, each pass' error logged.
fn run_queue<K, C, F, Fut>(
    queue: KubeController<K>,
    reconcile: F,
    ctx: Arc<C>,
    tx_shutdown: &tokio::sync::broadcast::Sender<()>,
) -> impl std::future::Future<Output = ()> + Send + use<K, C, F, Fut>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    C: HasCore,
    F: FnMut(Arc<K>, Arc<C>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let kind = K::kind(&()).to_string();
    queue
        .graceful_shutdown_on(on_signal(tx_shutdown))
        .run(
            reconcile,
            |obj, error, ctx: Arc<C>| ctx.core().retry_after_error(obj.as_ref(), error),
            ctx,
        )
        .for_each(move |r| {
            if let Err(error) = r {
                tracing::debug!(%error, "{kind} reconcile");
            }
            futures::future::ready(())
        })
}

/// The controllers of a host.
struct Queues {
    controllers: KubeController<Controller>,
    nodesets: KubeController<NodeSet>,
    restapis: KubeController<RestApi>,
    loginsets: KubeController<LoginSet>,
    accountings: KubeController<Accounting>,
}

/// The contexts of a host's reconcilers.
struct Contexts {
    controller: Arc<ControllerContext>,
    nodeset: Arc<NodeSetContext>,
    component: Arc<ComponentContext>,
    /// With BuilderPlugins: their context and queue.
    builder_plugins: Option<(Arc<BuilderPluginContext>, KubeController<BuilderPlugin>)>,
    /// The Tokens' context, and the one namespace their watch is narrowed to.
    token: (Arc<token::TokenContext>, Option<String>),
}

/// Run the watches, and every controller once every cache has synced, until `shutdown`
/// completes.
async fn run(
    contexts: Contexts,
    queues: Queues,
    watch_task: BoxFuture<'static, ()>,
    ready: Arc<AtomicBool>,
    shutdown: BoxFuture<'static, ()>,
) {
    let caches = tokio::spawn(watch_task);
    // Nothing is reconciled before every cache has synced: a NodeSet reconciled before the
    // Controllers are known would report its Controller missing.
    contexts.nodeset.caches.synced().await;
    // The BuilderPlugins' steps before any parent is built: a parent built without them would
    // roll its pods twice.
    if let (Some((ctx, _)), Some(store)) = (&contexts.builder_plugins, &ctx_store(&contexts)) {
        builder_plugin::load_all(ctx, store, ctx.startup).await;
    }
    ready.store(true, Ordering::SeqCst);
    let (tx_shutdown, _) = tokio::sync::broadcast::channel::<()>(1);
    let component = contexts.component;
    let tx = &tx_shutdown;
    let runs = futures::future::join5(
        run_queue(queues.controllers, controller::reconcile, contexts.controller, tx),
        run_queue(queues.nodesets, nodeset::reconcile, contexts.nodeset, tx),
        run_queue(
            queues.restapis,
            component::reconcile::<RestApi>,
            component.clone(),
            tx,
        ),
        run_queue(
            queues.loginsets,
            component::reconcile::<LoginSet>,
            component.clone(),
            tx,
        ),
        run_queue(
            queues.accountings,
            component::reconcile::<Accounting>,
            component,
            tx,
        ),
    );
    let builder_plugins = match contexts.builder_plugins {
        Some((ctx, queue)) => {
            futures::future::Either::Left(run_queue(queue, builder_plugin::reconcile, ctx, tx))
        }
        None => futures::future::Either::Right(futures::future::ready(())),
    };
    let (token_ctx, token_ns) = contexts.token;
    // Subscribed now: a shutdown while the CRD is looked up still stops the queue.
    let (tx_token, stop_token) = (tx_shutdown.clone(), on_signal(&tx_shutdown));
    let tokens = async move {
        let served = tokio::select! {
            served = token::served(&token_ctx.core.client) => served,
            () = stop_token => false,
        };
        if served {
            let queue = token::queue(&token_ctx.core.client, token_ns.as_deref());
            run_queue(queue, token::reconcile, token_ctx, &tx_token).await;
        }
    };
    let trigger = async move {
        shutdown.await;
        let _ = tx_shutdown.send(());
    };
    tokio::join!(runs, builder_plugins, tokens, trigger);
    caches.abort();
    ready.store(false, Ordering::SeqCst);
}

/// The BuilderPlugin cache, when the host serves BuilderPlugins.
fn ctx_store(contexts: &Contexts) -> Option<Store<BuilderPlugin>> {
    contexts.nodeset.caches.builder_plugins.clone()
}

/// The queues of every kind over the shared watches' stores and triggers.
fn queues(c: &Caches, triggers: watch::Receivers, setup: &QueueSetup<'_>) -> Queues {
    Queues {
        controllers: setup.queue(
            &c.controllers,
            triggers.controllers,
            &[BuilderKind::ControllerService, BuilderKind::ControllerChildren],
        ),
        nodesets: setup.queue(
            &c.nodesets,
            triggers.nodesets,
            &[BuilderKind::NodesetPod, BuilderKind::NodesetChildren],
        ),
        restapis: setup.queue(&c.restapis, triggers.restapis, &[BuilderKind::RestapiChildren]),
        loginsets: setup.queue(&c.loginsets, triggers.loginsets, &[BuilderKind::LoginsetChildren]),
        accountings: setup.queue(
            &c.accountings,
            triggers.accountings,
            &[BuilderKind::AccountingChildren],
        ),
    }
}

/// Every reconciler's context over one core and the shared caches.
fn contexts(
    config: &RunConfig,
    core: Arc<Core>,
    caches: &Caches,
    expectations: &Arc<Expectations>,
    slurm: &Arc<slurm::SlurmClients>,
    bp_triggers: tokio::sync::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<BuilderPlugin>>,
    one_namespace: Option<String>,
) -> Contexts {
    let applied = applied::applied_versions();
    Contexts {
        token: (
            Arc::new(token::TokenContext { core: core.clone() }),
            one_namespace,
        ),
        controller: Arc::new(ControllerContext {
            core: core.clone(),
            caches: caches.clone(),
            applied: applied.clone(),
            slurm: slurm.clone(),
        }),
        nodeset: Arc::new(NodeSetContext::new(
            core.clone(),
            caches.clone(),
            applied.clone(),
            expectations.clone(),
            slurm.clone(),
        )),
        component: Arc::new(ComponentContext {
            core: core.clone(),
            caches: caches.clone(),
            applied,
        }),
        builder_plugins: builder_plugins_queue(config, core, caches, bp_triggers),
    }
}

/// The BuilderPlugin reconciler and its queue, when the host serves BuilderPlugins.
fn builder_plugins_queue(
    config: &RunConfig,
    core: Arc<Core>,
    caches: &Caches,
    triggers: tokio::sync::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<BuilderPlugin>>,
) -> Option<(Arc<BuilderPluginContext>, KubeController<BuilderPlugin>)> {
    let (source, store) = (config.builder_plugins.clone()?, caches.builder_plugins.clone()?);
    let steps = Arc::new(builder_plugin::Steps::new(
        core.plugins.clone(),
        source,
        config.build.clone(),
    ));
    // A new leader writes every BuilderPlugin's status at once (they are cluster-scoped: no
    // namespace filter).
    let elected = rollout::on_elected(core.leader.clone(), store.clone(), Arc::new(Vec::new()));
    let queue = KubeController::for_stream(no_watch::<BuilderPlugin>(), store.clone())
        .reconcile_on(builder_plugin::triggers(
            receiver_stream(triggers),
            store,
            steps.clone(),
        ))
        .reconcile_on(elected);
    let ctx = BuilderPluginContext {
        core,
        steps,
        caches: caches.clone(),
        startup: config
            .builder_plugins_startup
            .unwrap_or(builder_plugin::STARTUP_BUDGET),
    };
    Some((Arc::new(ctx), queue))
}

/// Run the host until `shutdown` completes: one watch per kind, then every controller once every
/// cache has synced. In-flight reconciles finish before it returns.
///
/// # Errors
/// Never in practice; controller stream errors are logged and retried.
pub fn start(
    client: Client,
    plugins: Arc<PluginRegistry>,
    config: RunConfig,
    recorder_name: &str,
    shutdown: BoxFuture<'static, ()>,
) -> (Handles, BoxFuture<'static, ()>) {
    let writes = Arc::new(WriteMetrics::default());
    let metrics = Arc::new(Metrics::default());
    let expectations = Arc::new(Expectations::new());
    let one_namespace = match config.namespaces.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    };
    let allowed = Arc::new(config.namespaces.clone());
    let watch::Watches {
        caches,
        mut triggers,
        task: watch_task,
    } = watch::start(
        &client,
        &one_namespace,
        allowed.clone(),
        expectations.clone(),
        config.secret_poll.unwrap_or(secrets::DEFAULT_INTERVAL),
        config.builder_plugins.is_some(),
    );
    let bp_triggers = std::mem::replace(
        &mut triggers.builder_plugins,
        tokio::sync::mpsc::unbounded_channel().1,
    );
    let events = Events::new(
        client.clone(),
        Reporter {
            controller: recorder_name.into(),
            instance: None,
        },
        config.leadership.clone(),
        writes.clone(),
    );
    let queues = queues(
        &caches,
        triggers,
        &QueueSetup {
            plugins: &plugins,
            events: &events,
            leadership: &config.leadership,
            allowed: &allowed,
        },
    );
    let slurm = Arc::new(slurm::SlurmClients::new(
        client.clone(),
        &config.slurmrestd_urls,
        slinky_slurm::DEFAULT_TIMEOUT,
    ));
    let core = Arc::new(Core {
        client: client.clone(),
        writer: Writer::new(client, writes.clone(), config.leadership.clone()),
        events,
        plugins,
        build: config.build.clone(),
        metrics: metrics.clone(),
        namespaces: allowed,
        leader: config.leadership.clone(),
        backoff: Backoff::default(),
        announced: announced::Announced::default(),
        resync: config.resync.unwrap_or(slinky_api::defaults::RESYNC),
        recreate_statefulsets: config.recreate_statefulsets,
    });
    let contexts = contexts(
        &config,
        core,
        &caches,
        &expectations,
        &slurm,
        bp_triggers,
        one_namespace,
    );
    let ready = Arc::new(AtomicBool::new(false));
    let handles = Handles {
        ready: ready.clone(),
        writes,
        metrics,
        expectations,
        pods: caches.pods,
        nodesets: caches.nodesets,
        controllers: caches.controllers,
        statefulsets: caches.children.statefulsets,
        restapis: caches.restapis,
        loginsets: caches.loginsets,
        accountings: caches.accountings,
        leader: config.leadership,
        slurm,
        api_requests: config.api_requests,
    };
    (
        handles,
        Box::pin(run(contexts, queues, watch_task, ready, shutdown)),
    )
}
