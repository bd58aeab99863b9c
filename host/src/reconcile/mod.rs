//! The reconciliation host: caches, expectations, the writer, and the Controller and NodeSet
//! reconcilers, wired to kube-runtime controllers.
//!
//! Data flows one way: watches fill the caches (one reflector store per kind, managedFields
//! stripped); the work queue (kube-runtime `Controller`) hands object keys to a reconciler; the
//! reconciler reads the caches, consults expectations, asks a Wasm builder for the desired
//! children (with copies), diffs, and asks the [`writer::Writer`], the only code that writes.

mod accounting;
pub mod builder_plugin;
mod component;
mod controller;
pub mod core;
mod loginset;
mod nodeset;
mod restapi;
pub mod slurm;

pub use self::core::{
    Error, Metrics, WriteMetrics,
    backoff::Backoff,
    caches::{Caches, ChildCaches},
    context::{ControllerContext, Core, NodeSetContext},
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
    runtime::{Controller as KubeController, events::Reporter, reflector::Store, watcher},
};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi};

use self::core::{announced, applied, rollout, secrets, watch};
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

/// A kube-runtime controller of `K` with no watch of its own: every trigger comes from the shared
/// watches (after their stores applied the event), a swap of one of `builders`, or this process
/// becoming the leader.
fn queue<K>(
    store: &Store<K>,
    triggers: tokio::sync::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<K>>,
    builders: &[BuilderKind],
    plugins: &Arc<PluginRegistry>,
    events: &Events,
    config: &RunConfig,
    allowed: &Arc<Vec<String>>,
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
    let mut ctl =
        KubeController::for_stream(no_watch::<K>(), store.clone()).reconcile_on(receiver_stream(triggers));
    for &kind in builders {
        ctl = ctl.reconcile_on(rollout::on_swap(
            plugins.clone(),
            kind,
            store.clone(),
            events.clone(),
            allowed.clone(),
        ));
    }
    ctl.reconcile_on(rollout::on_elected(
        config.leadership.clone(),
        store.clone(),
        allowed.clone(),
    ))
}

/// A future that completes when `tx` sends (or is dropped).
fn on_signal(tx: &tokio::sync::broadcast::Sender<()>) -> impl std::future::Future<Output = ()> + use<> {
    let mut rx = tx.subscribe();
    async move {
        let _ = rx.recv().await;
    }
}

/// Log the end of one reconcile of a controller's stream (its error, if any).
fn log_reconcile<T, E: std::fmt::Display>(
    what: &'static str,
) -> impl FnMut(Result<T, E>) -> futures::future::Ready<()> {
    move |r| {
        if let Err(error) = r {
            tracing::debug!(%error, "{what} reconcile");
        }
        futures::future::ready(())
    }
}

/// The controllers of a host.
struct Queues {
    controllers: KubeController<Controller>,
    nodesets: KubeController<NodeSet>,
    restapis: KubeController<RestApi>,
    loginsets: KubeController<LoginSet>,
    accountings: KubeController<Accounting>,
}

/// Run the watches, and both controllers once every cache has synced, until `shutdown` completes.
async fn run(
    contexts: (Arc<ControllerContext>, Arc<NodeSetContext>),
    queues: Queues,
    watch_task: BoxFuture<'static, ()>,
    ready: Arc<AtomicBool>,
    shutdown: BoxFuture<'static, ()>,
) {
    let caches = tokio::spawn(watch_task);
    // Nothing is reconciled before every cache has synced: a NodeSet reconciled before the
    // Controllers are known would report its Controller missing.
    let (controller_ctx, nodeset_ctx) = contexts;
    let (restapi_ctx, loginset_ctx, accounting_ctx) = (
        controller_ctx.clone(),
        controller_ctx.clone(),
        controller_ctx.clone(),
    );
    nodeset_ctx.caches.synced().await;
    ready.store(true, Ordering::SeqCst);
    let (tx_shutdown, _) = tokio::sync::broadcast::channel::<()>(1);
    let controllers_run = queues
        .controllers
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            controller::reconcile,
            |obj, error, ctx: Arc<ControllerContext>| ctx.core.retry_after_error(obj.as_ref(), error),
            controller_ctx,
        )
        .for_each(log_reconcile("controller"));
    let nodesets_run = queues
        .nodesets
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            nodeset::reconcile,
            |obj, error, ctx: Arc<NodeSetContext>| ctx.core.retry_after_error(obj.as_ref(), error),
            nodeset_ctx,
        )
        .for_each(log_reconcile("nodeset"));
    let restapis_run = queues
        .restapis
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            restapi::reconcile,
            |obj, error, ctx: Arc<ControllerContext>| ctx.core.retry_after_error(obj.as_ref(), error),
            restapi_ctx,
        )
        .for_each(log_reconcile("restapi"));
    let loginsets_run = queues
        .loginsets
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            loginset::reconcile,
            |obj, error, ctx: Arc<ControllerContext>| ctx.core.retry_after_error(obj.as_ref(), error),
            loginset_ctx,
        )
        .for_each(log_reconcile("loginset"));
    let accountings_run = queues
        .accountings
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            accounting::reconcile,
            |obj, error, ctx: Arc<ControllerContext>| ctx.core.retry_after_error(obj.as_ref(), error),
            accounting_ctx,
        )
        .for_each(log_reconcile("accounting"));
    let trigger = async move {
        shutdown.await;
        let _ = tx_shutdown.send(());
    };
    tokio::join!(
        controllers_run,
        nodesets_run,
        restapis_run,
        loginsets_run,
        accountings_run,
        trigger
    );
    caches.abort();
    ready.store(false, Ordering::SeqCst);
}

/// Run the host until `shutdown` completes: one watch per kind, then both controllers once every
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
    let watches = watch::start(
        &client,
        &one_namespace,
        allowed.clone(),
        expectations.clone(),
        config.secret_poll.unwrap_or(secrets::DEFAULT_INTERVAL),
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
    let queues = Queues {
        controllers: queue(
            &watches.caches.controllers,
            watches.controller_triggers,
            &[BuilderKind::ControllerService, BuilderKind::ControllerChildren],
            &plugins,
            &events,
            &config,
            &allowed,
        ),
        nodesets: queue(
            &watches.caches.nodesets,
            watches.nodeset_triggers,
            &[BuilderKind::NodesetPod, BuilderKind::NodesetChildren],
            &plugins,
            &events,
            &config,
            &allowed,
        ),
        restapis: queue(
            &watches.caches.restapis,
            watches.restapi_triggers,
            &[BuilderKind::RestapiChildren],
            &plugins,
            &events,
            &config,
            &allowed,
        ),
        loginsets: queue(
            &watches.caches.loginsets,
            watches.loginset_triggers,
            &[BuilderKind::LoginsetChildren],
            &plugins,
            &events,
            &config,
            &allowed,
        ),
        accountings: queue(
            &watches.caches.accountings,
            watches.accounting_triggers,
            &[BuilderKind::AccountingChildren],
            &plugins,
            &events,
            &config,
            &allowed,
        ),
    };
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
        slurm: slurm.clone(),
        create_permits: tokio::sync::Semaphore::new(nodeset::CREATES_IN_FLIGHT),
    });
    let applied = applied::applied_versions();
    let contexts = (
        Arc::new(ControllerContext {
            core: core.clone(),
            caches: watches.caches.clone(),
            applied: applied.clone(),
        }),
        Arc::new(NodeSetContext {
            core,
            caches: watches.caches.clone(),
            applied,
            expectations: expectations.clone(),
            differing: nodeset::differing::DifferingPods::default(),
            daemon_backoff: nodeset::daemon::DaemonBackoff::default(),
        }),
    );
    let ready = Arc::new(AtomicBool::new(false));
    let handles = Handles {
        ready: ready.clone(),
        writes,
        metrics,
        expectations,
        pods: watches.caches.pods,
        nodesets: watches.caches.nodesets,
        controllers: watches.caches.controllers,
        statefulsets: watches.caches.children.statefulsets,
        restapis: watches.caches.restapis,
        loginsets: watches.caches.loginsets,
        accountings: watches.caches.accountings,
        leader: config.leadership,
        slurm,
        api_requests: config.api_requests,
    };
    (
        handles,
        Box::pin(run(contexts, queues, watches.task, ready, shutdown)),
    )
}
