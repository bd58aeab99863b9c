//! The reconciliation host: caches, expectations, the writer, and the Controller and NodeSet
//! reconcilers, wired to kube-runtime controllers.
//!
//! Data flows one way: watches fill the caches (one reflector store per kind, managedFields
//! stripped); the work queue (kube-runtime `Controller`) hands object keys to a reconciler; the
//! reconciler reads the caches, consults expectations, asks a Wasm builder for the desired
//! children (with copies), diffs, and asks the [`writer::Writer`], the only code that writes.

mod controller;
pub mod expectations;
pub mod leader;
mod nodeset;
pub mod rollout;
pub mod writer;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller as KubeController, WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use slinky_api::{Controller, NodeSet};

use crate::plugins::{BuildContext, BuilderKind, PluginError, PluginRegistry};
pub use expectations::Expectations;
pub use leader::{LeaderConfig, Leadership};
pub use writer::{WriteMetrics, Writer};

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

/// Reconcile counters per kind.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (kind, result) → count.
    pub reconciles: Mutex<HashMap<(String, String), u64>>,
    /// Total reconcile seconds per kind (with counts above: the mean).
    pub seconds: Mutex<HashMap<String, f64>>,
    /// Plugin calls made.
    pub plugin_calls: AtomicU64,
    /// Plugin calls that failed (trap, deadline, memory, policy, builder error).
    pub plugin_failures: AtomicU64,
    /// (builder kind, result: `ok` or an error label) → (calls, seconds).
    pub plugin: Mutex<std::collections::BTreeMap<(String, String), (u64, f64)>>,
}

impl Metrics {
    fn record(&self, kind: &str, result: &str, secs: f64) {
        if let Ok(mut m) = self.reconciles.lock() {
            *m.entry((kind.to_string(), result.to_string())).or_default() += 1;
        }
        if let Ok(mut m) = self.seconds.lock() {
            *m.entry(kind.to_string()).or_default() += secs;
        }
    }

    /// Record one builder call of `kind` and time it.
    pub fn time_plugin_call<T>(
        &self,
        kind: crate::plugins::BuilderKind,
        call: impl FnOnce() -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let started = std::time::Instant::now();
        let r = call();
        let result = match &r {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        };
        if let Ok(mut m) = self.plugin.lock() {
            let e = m
                .entry((kind.as_str().to_string(), result.to_string()))
                .or_default();
            e.0 += 1;
            e.1 += started.elapsed().as_secs_f64();
        }
        r
    }

    /// Count of reconciles of `kind` with `result` (`ok` or an error label).
    pub fn count(&self, kind: &str, result: &str) -> u64 {
        self.reconciles
            .lock()
            .map(|m| {
                m.get(&(kind.to_string(), result.to_string()))
                    .copied()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    }
}

/// What every reconcile gets.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The active builder plugins.
    pub plugins: Arc<PluginRegistry>,
    /// The only writer.
    pub writer: Writer,
    /// Pending creations/deletions per NodeSet.
    pub expectations: Arc<Expectations>,
    /// Pod cache.
    pub pods: Store<Pod>,
    /// Service cache.
    pub services: Store<Service>,
    /// Controller cache.
    pub controllers: Store<Controller>,
    /// NodeSet cache.
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
}

/// Settings of [`run`].
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
    /// Caches.
    pub pods: Store<Pod>,
    /// Caches.
    pub nodesets: Store<NodeSet>,
    /// Caches.
    pub controllers: Store<Controller>,
    /// Leadership.
    pub leader: Leadership,
}

fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + kube::Resource<DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Whether a watch event concerns one of `allowed` namespaces (all when empty).
fn in_namespaces<K: kube::Resource>(
    ev: &Result<watcher::Event<K>, watcher::Error>,
    allowed: &[String],
) -> bool {
    match ev {
        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o)) => {
            allowed.is_empty() || o.meta().namespace.as_ref().is_some_and(|n| allowed.contains(n))
        }
        _ => true,
    }
}

/// The owning NodeSet key (`ns/name`) of a pod, from its controller owner reference.
pub fn owner_key(pod: &Pod) -> Option<String> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "NodeSet")?;
    Some(format!("{}/{}", pod.namespace().unwrap_or_default(), owner.name))
}

/// Lower expectations from the pod watch: a first sighting is a creation, a deletion timestamp
/// or a deletion (including one missed while the watch was down, found on relist) a deletion.
fn observe(
    expectations: &Expectations,
    seen: &mut HashMap<String, String>,
    relist: &mut Option<Vec<String>>,
    ev: &watcher::Event<Pod>,
) {
    let sighting = |pod: &Pod, seen: &mut HashMap<String, String>| {
        let Some(uid) = pod.uid() else { return };
        let key = owner_key(pod).unwrap_or_default();
        match seen.get(&uid) {
            // A pod seen for the first time with an owner: the creation we expect. A pod seen
            // before without one (an orphan being adopted) is no creation.
            None if !key.is_empty() => expectations.creation_observed(&key),
            _ => {}
        }
        seen.insert(uid.clone(), key.clone());
        if pod.metadata.deletion_timestamp.is_some() && !key.is_empty() {
            expectations.deletion_observed(&key, &uid);
        }
    };
    match ev {
        watcher::Event::Apply(pod) => sighting(pod, seen),
        watcher::Event::Delete(pod) => {
            if let Some(uid) = pod.uid() {
                let key = seen
                    .remove(&uid)
                    .filter(|k| !k.is_empty())
                    .or_else(|| owner_key(pod));
                if let Some(key) = key {
                    expectations.deletion_observed(&key, &uid);
                }
            }
        }
        watcher::Event::Init => *relist = Some(Vec::new()),
        watcher::Event::InitApply(pod) => {
            if let (Some(list), Some(uid)) = (relist.as_mut(), pod.uid()) {
                list.push(uid);
            }
            sighting(pod, seen);
        }
        watcher::Event::InitDone => {
            if let Some(list) = relist.take() {
                let present: std::collections::HashSet<String> = list.into_iter().collect();
                let gone: Vec<(String, String)> = seen
                    .iter()
                    .filter(|(uid, _)| !present.contains(*uid))
                    .map(|(u, k)| (u.clone(), k.clone()))
                    .collect();
                for (uid, key) in gone {
                    expectations.deletion_observed(&key, &uid);
                    seen.remove(&uid);
                }
            }
        }
    }
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

/// Run the host until `shutdown` completes: caches, then both controllers. In-flight reconciles
/// finish before it returns.
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
    let ns = match config.namespaces.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    };
    let allowed = Arc::new(config.namespaces.clone());
    let wc = watcher::Config::default();

    // Pod cache, with expectation observations.
    let (pods, pod_writer) = reflector::store::<Pod>();
    let exp = expectations.clone();
    let pod_allowed = allowed.clone();
    let pod_stream = watcher(api::<Pod>(&client, &ns), wc.clone())
        .filter(move |ev| futures::future::ready(in_namespaces(ev, &pod_allowed)))
        .modify(|p| p.managed_fields_mut().clear())
        .default_backoff()
        .reflect(pod_writer);
    let pod_task = async move {
        let mut seen = HashMap::new();
        let mut relist = None;
        futures::pin_mut!(pod_stream);
        while let Some(ev) = pod_stream.next().await {
            match ev {
                Ok(ev) => observe(&exp, &mut seen, &mut relist, &ev),
                Err(error) => tracing::warn!(%error, "pod watch error (retrying)"),
            }
        }
    };
    let (services, svc_writer) = reflector::store::<Service>();
    let svc_allowed = allowed.clone();
    let svc_stream = watcher(api::<Service>(&client, &ns), wc.clone())
        .filter(move |ev| futures::future::ready(in_namespaces(ev, &svc_allowed)))
        .modify(|s| s.managed_fields_mut().clear())
        .default_backoff()
        .reflect(svc_writer)
        .for_each(|_| futures::future::ready(()));

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: recorder_name.into(),
            instance: None,
        },
    );
    let controller_ctl = KubeController::new(api::<Controller>(&client, &ns), wc.clone())
        .owns(api::<Service>(&client, &ns), wc.clone());
    let controllers = controller_ctl.store();
    // After a builder swap, every parent of that builder's kind is re-reconciled (rate-limited).
    let controller_ctl = controller_ctl
        .reconcile_on(rollout::on_swap(
            plugins.clone(),
            BuilderKind::ControllerService,
            controllers.clone(),
            recorder.clone(),
            allowed.clone(),
        ))
        .reconcile_on(rollout::on_elected(
            config.leadership.clone(),
            controllers.clone(),
            allowed.clone(),
        ));
    let nodeset_ctl = KubeController::new(api::<NodeSet>(&client, &ns), wc.clone())
        .owns(api::<Pod>(&client, &ns), wc.clone());
    let nodesets = nodeset_ctl.store();
    let nodeset_ctl = nodeset_ctl
        .reconcile_on(rollout::on_swap(
            plugins.clone(),
            BuilderKind::NodesetPod,
            nodesets.clone(),
            recorder.clone(),
            allowed.clone(),
        ))
        .reconcile_on(rollout::on_elected(
            config.leadership.clone(),
            nodesets.clone(),
            allowed.clone(),
        ));
    let ns_store = nodesets.clone();
    let nodeset_ctl = nodeset_ctl.watches(api::<Controller>(&client, &ns), wc, move |c: Controller| {
        let (cns, cname) = (c.namespace().unwrap_or_default(), c.name_any());
        ns_store
            .state()
            .iter()
            .filter(|n| n.controller_namespace() == cns && n.spec.controller_ref.name == cname)
            .map(|n| ObjectRef::from_obj(n.as_ref()))
            .collect::<Vec<_>>()
    });

    let ctx = Arc::new(Context {
        client: client.clone(),
        plugins,
        writer: Writer::new(client, writes.clone(), config.leadership.clone()),
        expectations: expectations.clone(),
        pods: pods.clone(),
        services: services.clone(),
        controllers: controllers.clone(),
        nodesets: nodesets.clone(),
        recorder,
        build: config.build.clone(),
        namespaces: allowed.clone(),
        metrics: metrics.clone(),
        leader: config.leadership.clone(),
    });
    let ready = Arc::new(AtomicBool::new(false));
    let handles = Handles {
        ready: ready.clone(),
        writes,
        metrics,
        expectations,
        pods: pods.clone(),
        nodesets: nodesets.clone(),
        controllers: controllers.clone(),
        leader: config.leadership.clone(),
    };

    let resync = config.resync.unwrap_or(Duration::from_secs(300));
    let (tx_shutdown, _) = tokio::sync::broadcast::channel::<()>(1);
    let mk_shutdown = |tx: &tokio::sync::broadcast::Sender<()>| {
        let mut rx = tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };
    let sd1 = mk_shutdown(&tx_shutdown);
    let sd2 = mk_shutdown(&tx_shutdown);
    let ctx1 = ctx.clone();
    let ctx2 = ctx.clone();
    let gate_pods = pods.clone();
    let gate_svcs = services.clone();
    let fut = async move {
        let caches = tokio::spawn(async move { tokio::join!(pod_task, svc_stream) });
        // No reconcile before every cache has synced.
        synced(&gate_pods).await;
        synced(&gate_svcs).await;
        let controllers_run = controller_ctl
            .graceful_shutdown_on(sd1)
            .run(
                move |obj, ctx| controller::reconcile(obj, ctx, resync),
                controller::error_policy,
                ctx1,
            )
            .for_each(|r| {
                if let Err(error) = r {
                    tracing::debug!(%error, "controller reconcile");
                }
                futures::future::ready(())
            });
        let nodesets_run = nodeset_ctl
            .graceful_shutdown_on(sd2)
            .run(
                move |obj, ctx| nodeset::reconcile(obj, ctx, resync),
                nodeset::error_policy,
                ctx2,
            )
            .for_each(|r| {
                if let Err(error) = r {
                    tracing::debug!(%error, "nodeset reconcile");
                }
                futures::future::ready(())
            });
        let ready_flag = ready.clone();
        let (cs, ns_) = (controllers.clone(), nodesets.clone());
        tokio::spawn(async move {
            synced(&cs).await;
            synced(&ns_).await;
            ready_flag.store(true, Ordering::SeqCst);
        });
        let trigger = async move {
            shutdown.await;
            let _ = tx_shutdown.send(());
        };
        tokio::join!(controllers_run, nodesets_run, trigger);
        caches.abort();
        ready.store(false, Ordering::SeqCst);
    };
    (handles, Box::pin(fut))
}
