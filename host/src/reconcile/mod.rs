//! The reconciliation host: caches, expectations, the writer, and the Controller and NodeSet
//! reconcilers, wired to kube-runtime controllers.
//!
//! Data flows one way: watches fill the caches (one reflector store per kind, managedFields
//! stripped); the work queue (kube-runtime `Controller`) hands object keys to a reconciler; the
//! reconciler reads the caches, consults expectations, asks a Wasm builder for the desired
//! children (with copies), diffs, and asks the [`writer::Writer`], the only code that writes.

pub mod apply;
pub mod backoff;
mod compare;
mod controller;
pub mod expectations;
pub mod leader;
mod nodeset;
mod parents;
pub mod rollout;
pub mod status;
pub mod watch;
pub mod writer;

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
        Controller as KubeController,
        controller::Action,
        events::{Event, EventType, Recorder, Reporter},
        reflector::Store,
        watcher,
    },
};
use slinky_api::{Controller, NodeSet};

pub use crate::metrics::{ReconcileMetrics as Metrics, WriteMetrics};
use crate::plugins::{BuildContext, BuilderKind, PluginError, PluginRegistry};
pub use backoff::Backoff;
pub use expectations::Expectations;
pub use leader::{LeaderConfig, Leadership};
pub use writer::Writer;

/// Errors of a reconcile; each becomes a backoff, never a crash.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("API request failed: {0}")]
    Kube(#[source] kube::Error),
    /// A builder plugin failed.
    #[error("builder failed: {0}")]
    Plugin(#[source] Box<PluginError>),
    /// A blocking task could not run.
    #[error("internal task failed: {0}")]
    Task(String),
}

impl Error {
    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Plugin(p) => p.metric_label(),
            Error::Task(_) => "task",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

/// Call a builder once, counting and timing the call under its kind and result.
pub(crate) fn time_plugin_call<T>(
    metrics: &Metrics,
    kind: BuilderKind,
    call: impl FnOnce() -> Result<T, PluginError>,
) -> Result<T, PluginError> {
    let started = std::time::Instant::now();
    let r = call();
    let result = match &r {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    metrics.record_plugin_call(kind.as_str(), result, started.elapsed().as_secs_f64());
    r
}

/// What every reconcile gets.
pub struct Context {
    /// The API client (fresh reads: adoption checks, status conflicts, Service ownership).
    pub client: Client,
    /// The active builder plugins.
    pub plugins: Arc<PluginRegistry>,
    /// The only writer.
    pub writer: Writer,
    /// Pending pod creations/deletions per NodeSet UID.
    pub expectations: Arc<Expectations>,
    /// Pods of the served namespaces (managedFields stripped).
    pub pods: Store<Pod>,
    /// Services, ConfigMaps, StatefulSets and PodDisruptionBudgets of the served namespaces.
    pub children: apply::ChildCaches,
    /// What the host last applied to each child (hash and resulting resourceVersion).
    pub applied: Arc<apply::AppliedVersions>,
    /// Controllers of the served namespaces.
    pub controllers: Store<Controller>,
    /// NodeSets of the served namespaces.
    pub nodesets: Store<NodeSet>,
    /// Events.
    pub recorder: Recorder,
    /// What builders may know of the cluster.
    pub build: BuildContext,
    /// The namespaces served (all when empty).
    pub namespaces: Arc<Vec<String>>,
    /// Reconcile metrics.
    pub metrics: Arc<Metrics>,
    /// The write fence (leader election).
    pub leader: Leadership,
    /// Per-object retry backoff after failed writes and errors.
    pub backoff: Backoff,
    /// The period of the resync requeue of healthy objects.
    pub resync: Duration,
}

impl Context {
    /// Whether this host serves objects of namespace `ns`.
    pub fn serves(&self, ns: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == ns)
    }

    /// Publish an Event on `obj` (failures are logged, never fatal).
    pub(crate) async fn event<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(%error, reason, "cannot publish an Event");
        }
    }

    /// Run a builder call off the async threads.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Error::Task(e.to_string()))
    }

    /// The one reconcile wrapper: followers reconcile nothing; every log line carries the
    /// object's kind and key; the time and result are counted.
    async fn instrumented<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        pass: impl std::future::Future<Output = Result<Action, Error>>,
    ) -> Result<Action, Error> {
        if !self.leader.may_write() {
            // A follower: caches only. Becoming the leader re-reconciles everything.
            return Ok(Action::await_change());
        }
        let kind = K::kind(&());
        let started = std::time::Instant::now();
        let span = tracing::info_span!(
            "reconcile",
            kind = %kind,
            key = %format!("{}/{}", obj.meta().namespace.as_deref().unwrap_or_default(), obj.meta().name.as_deref().unwrap_or_default())
        );
        let r = tracing::Instrument::instrument(pass, span).await;
        let label = match &r {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        self.metrics.record(&kind, label, started.elapsed().as_secs_f64());
        r
    }

    /// The error policy of both kinds: log, and retry with the object's backoff.
    fn retry_after_error<K: Resource<DynamicType = ()>>(&self, obj: &K, error: &Error) -> Action {
        let key = object_key(obj);
        let after = self.backoff.failure(&key);
        tracing::warn!(%error, kind = %K::kind(&()), key, retry_in_ms = after.as_millis() as u64, "reconcile failed; retrying");
        Action::requeue(after)
    }
}

/// `namespace/name` of an object.
pub(crate) fn object_key<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

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
    /// Leadership.
    pub leader: Leadership,
}

/// Wait until a store has synced. Re-polls with a fresh future every 100 ms: a single
/// `wait_until_ready` future was seen to miss its wake-up when polled before the store synced.
async fn synced<K: kube::Resource + Clone + 'static>(store: &Store<K>)
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(Ok(())) => return,
            Ok(Err(_)) => {
                tracing::error!("a cache's writer stopped before it synced");
                return std::future::pending().await;
            }
            Err(_) => {}
        }
    }
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
    builders: [BuilderKind; 2],
    plugins: &Arc<PluginRegistry>,
    recorder: &Recorder,
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
    for kind in builders {
        ctl = ctl.reconcile_on(rollout::on_swap(
            plugins.clone(),
            kind,
            store.clone(),
            recorder.clone(),
            allowed.clone(),
        ));
    }
    ctl.reconcile_on(rollout::on_elected(
        config.leadership.clone(),
        store.clone(),
        allowed.clone(),
    ))
}

/// Wait until every cache has synced.
async fn all_synced(ctx: &Context) {
    synced(&ctx.pods).await;
    synced(&ctx.children.services).await;
    synced(&ctx.children.configmaps).await;
    synced(&ctx.children.statefulsets).await;
    synced(&ctx.children.pdbs).await;
    synced(&ctx.controllers).await;
    synced(&ctx.nodesets).await;
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

/// The two controllers of a host.
struct Queues {
    controllers: KubeController<Controller>,
    nodesets: KubeController<NodeSet>,
}

/// Run the watches, and both controllers once every cache has synced, until `shutdown` completes.
async fn run(
    ctx: Arc<Context>,
    queues: Queues,
    watch_task: BoxFuture<'static, ()>,
    ready: Arc<AtomicBool>,
    shutdown: BoxFuture<'static, ()>,
) {
    let caches = tokio::spawn(watch_task);
    // Nothing is reconciled before every cache has synced: a NodeSet reconciled before the
    // Controllers are known would report its Controller missing.
    all_synced(&ctx).await;
    ready.store(true, Ordering::SeqCst);
    let (tx_shutdown, _) = tokio::sync::broadcast::channel::<()>(1);
    let controllers_run = queues
        .controllers
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            controller::reconcile,
            |obj, error, ctx: Arc<Context>| ctx.retry_after_error(obj.as_ref(), error),
            ctx.clone(),
        )
        .for_each(log_reconcile("controller"));
    let nodesets_run = queues
        .nodesets
        .graceful_shutdown_on(on_signal(&tx_shutdown))
        .run(
            nodeset::reconcile,
            |obj, error, ctx: Arc<Context>| ctx.retry_after_error(obj.as_ref(), error),
            ctx,
        )
        .for_each(log_reconcile("nodeset"));
    let trigger = async move {
        shutdown.await;
        let _ = tx_shutdown.send(());
    };
    tokio::join!(controllers_run, nodesets_run, trigger);
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
    let watches = watch::start(&client, &one_namespace, allowed.clone(), expectations.clone());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: recorder_name.into(),
            instance: None,
        },
    );
    let queues = Queues {
        controllers: queue(
            &watches.controllers,
            watches.controller_triggers,
            [BuilderKind::ControllerService, BuilderKind::ControllerChildren],
            &plugins,
            &recorder,
            &config,
            &allowed,
        ),
        nodesets: queue(
            &watches.nodesets,
            watches.nodeset_triggers,
            [BuilderKind::NodesetPod, BuilderKind::NodesetChildren],
            &plugins,
            &recorder,
            &config,
            &allowed,
        ),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        plugins,
        writer: Writer::new(client, writes.clone(), config.leadership.clone()),
        expectations: expectations.clone(),
        pods: watches.pods.clone(),
        children: watches.children.clone(),
        applied: apply::applied_versions(),
        controllers: watches.controllers.clone(),
        nodesets: watches.nodesets.clone(),
        recorder,
        build: config.build.clone(),
        namespaces: allowed,
        metrics: metrics.clone(),
        leader: config.leadership.clone(),
        backoff: Backoff::default(),
        resync: config.resync.unwrap_or(slinky_api::defaults::RESYNC),
    });
    let ready = Arc::new(AtomicBool::new(false));
    let handles = Handles {
        ready: ready.clone(),
        writes,
        metrics,
        expectations,
        pods: watches.pods,
        nodesets: watches.nodesets,
        controllers: watches.controllers,
        statefulsets: watches.children.statefulsets,
        leader: config.leadership,
    };
    (handles, Box::pin(run(ctx, queues, watches.task, ready, shutdown)))
}
