//! `BuilderPlugin` custom resources: each is a step in the pipelines of the builder kinds it
//! lists (see `slinky_runtime::Pipeline`). A reconciler like every other: its objects come from
//! the shared watches, its Events from the host's publisher, its status through the writer.
//!
//! # What happens to a BuilderPlugin
//! 1. Its module is fetched by the plugin source (`slinky_plugin_source::ModuleSource`): pulled
//!    by digest from its OCI registry (kept on disk; its cosign signature verified when the host
//!    has `--plugin-public-key`), or read from its ConfigMap; `spec.module.digest`, when given,
//!    must be the component's sha256.
//! 2. It is loaded like any plugin (compiled, described, contract checked), must build every kind
//!    it lists, must accept its settings (`validate-settings`), and, after each kind's base
//!    builder, must build the example inputs through the output policy into the same children.
//! 3. Then it serves: the registry's steps of its kinds are replaced at once and the parents of
//!    those kinds re-reconciled (a step's module, settings, order or selector are part of the pod
//!    revision: pods roll within `maxUnavailable`).
//!
//! A version that fails any step is refused with the reason in `status` (phase `Refused`, the
//! `Loaded` condition False) and a Warning Event; the version that served before keeps serving.
//! The same inputs are not tried again until they change ([`slinky_api::failure::Retry`]).
//! Status and Events are written by the leader only (a new leader looks at every BuilderPlugin
//! at once); every replica loads the steps, so a new leader builds what the old one built. A
//! deleted BuilderPlugin's step leaves the pipelines as soon as the watch shows the deletion, or
//! its re-list no longer has it (deleted while the watch was down); a look under way when it was
//! deleted puts nothing in the pipelines.
//!
//! At start-up the host loads the BuilderPlugins before it reconciles anything ([`load_all`]): a
//! restart never builds a parent without its steps (which would roll its pods twice).

mod status;
mod steps;
mod wanted;

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        controller::Action,
        events::EventType,
        reflector::{ObjectRef, Store},
    },
};
use slinky_api::BuilderPlugin;
pub use steps::Steps;

use self::steps::Report;
use super::core::{Error, caches::Caches, context::Core, status::HasStatus, watch::WireBuilderPlugin};

/// How often every BuilderPlugin is looked at again without a change of its own (a ConfigMap's
/// content, a refusal that depends on a registry, a parent's labels for `status.appliesTo`).
pub const RESYNC: Duration = Duration::from_secs(10);

/// What the BuilderPlugin reconciler gets.
pub struct BuilderPluginContext {
    /// What every reconciler shares.
    pub core: Arc<Core>,
    /// The steps this process loaded.
    pub steps: Arc<Steps>,
    /// The caches (the parents, for `status.appliesTo`).
    pub caches: Caches,
    /// How long start-up waits for the BuilderPlugins ([`load_all`]).
    pub startup: Duration,
}

/// Whether the cluster serves BuilderPlugins (the CRD is installed).
///
/// # Errors
/// They cannot be listed for another reason (RBAC, the API server): reconciling without them
/// would rebuild every parent without its steps and roll its pods, so the host stops with the
/// reason instead (`--builder-plugins=false` runs without them).
pub async fn served(client: &Client) -> anyhow::Result<bool> {
    // Decoded as the watch decodes them: one the host cannot decode must not stop it here.
    let api = Api::<WireBuilderPlugin>::all(client.clone());
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::info!(
                "no BuilderPlugin CRD in the cluster: only the bundled and directory plugins serve"
            );
            Ok(false)
        }
        Err(error) => Err(anyhow::anyhow!(
            "cannot list BuilderPlugins ({error}); the host does not reconcile without them, since every \
             parent would be rebuilt without its steps and its pods rolled: grant `list` on \
             builderplugins.plugins.slinky.slurm.net, or run with --builder-plugins=false"
        )),
    }
}

/// How long the host waits at start-up for the BuilderPlugins before it reconciles anything
/// (default of `run --builder-plugins-startup-seconds`).
pub const STARTUP_BUDGET: Duration = Duration::from_secs(60);
/// Load every BuilderPlugin of the synced cache before anything else reconciles (with their
/// Events; their status is the queue's to write, right after), all at once (their compiles a few at a time), for at most `budget`: a registry that answers slowly or
/// never (each request is bounded, a tarpit is not) delays only its own step. Those still loading
/// then go on in the background, and join their pipelines when they load (their parents' pods
/// may then roll once more).
pub(crate) async fn load_all(
    ctx: &Arc<BuilderPluginContext>,
    store: &Store<BuilderPlugin>,
    budget: Duration,
) {
    let mut loads = tokio::task::JoinSet::new();
    for bp in store.state() {
        let ctx = ctx.clone();
        loads.spawn(async move {
            if let Err(error) = look(&bp, &ctx, false).await {
                tracing::warn!(builder_plugin = %bp.name_any(), %error, "cannot write the BuilderPlugin's status; its next reconcile tries again");
            }
        });
    }
    let all = async { while loads.join_next().await.is_some() {} };
    if tokio::time::timeout(budget, all).await.is_err() {
        tracing::warn!(
            still_loading = loads.len(),
            budget_seconds = budget.as_secs(),
            "BuilderPlugins still loading after the start-up budget: the host reconciles without them, \
             and each joins its pipelines when it loads"
        );
        loads.detach_all();
    }
}

/// Reconcile one BuilderPlugin: on every replica (the steps serve everywhere); its Event and
/// status on the leader only.
///
/// # Errors
/// API errors writing the status (retried with the object's backoff).
pub(crate) async fn reconcile(
    bp: Arc<BuilderPlugin>,
    ctx: Arc<BuilderPluginContext>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let r = look(&bp, &ctx, true).await;
    let label = r.as_ref().map_or_else(Error::metric_label, |_| "ok");
    ctx.core
        .metrics
        .record(&BuilderPlugin::kind(&()), label, started.elapsed().as_secs_f64());
    r.map(|()| Action::requeue(RESYNC))
}

/// Look at `bp`, report what is new and, once the queue runs (`synced`), write its status with
/// the parents it applies to, from the caches.
async fn look(bp: &BuilderPlugin, ctx: &BuilderPluginContext, synced: bool) -> Result<(), Error> {
    let core = &ctx.core;
    match ctx.steps.sync(bp).await {
        Some(Report::Loaded {
            plugin,
            digest,
            kinds,
            order,
        }) => {
            let note = format!("{plugin} ({digest}) serves {kinds} at order {order}");
            core.events
                .publish(bp, None, EventType::Normal, "PluginLoaded", "Load", note)
                .await;
        }
        Some(Report::Refused(failure)) => {
            core.events
                .publish(
                    bp,
                    None,
                    EventType::Warning,
                    failure.reason,
                    "Load",
                    failure.message,
                )
                .await;
        }
        None => {}
    }
    // At start-up no status is written: a load still going on after the budget would write what
    // it saw of an older spec over the queue's status of the newer one. The queue's first
    // reconcile of each BuilderPlugin, right after, writes it.
    if !synced || !core.leader.may_write() {
        return Ok(());
    }
    let changes = status::conditions(bp, &ctx.steps);
    let caches = Some(&ctx.caches);
    // Through the wire type, as the watch decodes: the write's answer (and a re-read after a
    // 409) decodes even for a BuilderPlugin nested too deep for the host's decoder.
    let api = Api::<WireBuilderPlugin>::all(core.client.clone());
    core.writer
        .update_status(
            &api,
            &WireBuilderPlugin(bp.clone()),
            |w| status::status(&w.0, &ctx.steps, changes.apply(w.0.conditions()), caches),
            |w| w.0.status.clone(),
        )
        .await?;
    Ok(())
}

/// The BuilderPlugins to reconcile, from the watch's triggers: one that is gone from the cache
/// leaves the pipelines at once (the queue reconciles only objects it finds).
pub(crate) fn triggers(
    refs: impl Stream<Item = ObjectRef<BuilderPlugin>> + Send + 'static,
    store: Store<BuilderPlugin>,
    steps: Arc<Steps>,
) -> impl Stream<Item = ObjectRef<BuilderPlugin>> + Send + 'static {
    refs.filter_map(move |r| {
        let found = store.get(&r).is_some();
        if !found {
            steps.forget(&r.name);
        }
        futures::future::ready(found.then_some(r))
    })
}

/// Load the cluster's BuilderPlugins into `steps` once, as the host loads them at start-up (no
/// status, no Event): what `plugin diff` compares with.
///
/// # Errors
/// They cannot be listed (a cluster without the CRD has none).
pub async fn load_once(client: &Client, steps: &Steps) -> anyhow::Result<usize> {
    if !served(client).await? {
        return Ok(0);
    }
    // Each decoded on its own, as the watch decodes them.
    let list = Api::<WireBuilderPlugin>::all(client.clone())
        .list(&Default::default())
        .await?;
    for bp in &list.items {
        steps.sync(&bp.0).await;
    }
    Ok(list.items.len())
}
