//! The NodeSet reconciler (StatefulSet mode): the NodeSet's other children from the
//! `nodeset-children` builder (the workers' Service and PodDisruptionBudget shared by the
//! Controller's NodeSets, the SSH ConfigMap) through the one child path ([`super::core::apply`]),
//! then ordinal pods from the `nodeset-pod` builder, classified ([`classify`]) and planned ([`plan`])
//! from the cache, then written; each pod revision is kept as a ControllerRevision ([`history`]).
//!
//! # Guarantees
//! * Pods are created or deleted only while the NodeSet's expectations are satisfied; every
//!   expectation raised for a write that failed or was never attempted is released at once.
//! * Every write the API server refuses (create, delete, adoption, release, relabel) is an Event
//!   (`FailedCreate`, `FailedDelete`, …) with the API's message and a `ReplicaFailure` condition,
//!   and the NodeSet is retried with its own exponential backoff (milliseconds up to minutes),
//!   not at the next resync. The condition is cleared by a pass whose writes all succeed.
//! * A spec that would make pods the API server refuses (names, hostnames, label values) or that
//!   asks for what this host does not support is an `InvalidSpec` condition naming the field;
//!   a missing Controller or a failing builder is a condition too. None deletes running pods.
//! * The shared workers' Service and PodDisruptionBudget are owned by every NodeSet referencing
//!   the Controller (plain owner references, sorted by name): several NodeSets reconciling at once
//!   all apply the same object under the same field manager, which is no conflict (Slinky's #152
//!   race has no path here); a refused child write is a `ChildFailure` condition and an Event.
//! * Status is written only when it changed, with `observedGeneration` the generation it was
//!   computed from, unless the pass waited on its expectations (then it keeps the generation
//!   of the last pass that acted); on a 409 it is recomputed on the fresh object, keeping other
//!   writers' conditions.

mod adoption;
mod classify;
pub(crate) mod daemon;
pub(crate) mod differing;
mod drain;
mod finalizer;
#[cfg(test)]
pub(crate) mod fixtures;
mod history;
mod kept;
mod other_children;
mod plan;
mod pods;
mod protect;
pub use pods::CREATES_IN_FLIGHT;
mod reservation;
pub(crate) mod revisions;
mod slurm_conditions;
mod slurm_view;
mod status;
mod volumes;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{
    ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use slinky_api::{Controller, NodeSet, checks, failure::Failure, keys};

use adoption::{adopt_and_release, refresh_provenance, relabel_equal_pods};
use classify::{Blocker, Claims, classify};
use other_children::sync_children;
pub use plan::is_running_and_ready;
use plan::{DeleteReason, Inputs, is_available, plan};
use pods::{create_pods, delete_pods, ordinal_slots};
use status::{Reached, write_status};

use super::{
    core::{
        Error, applied::AppliedVersions, backoff, caches::Caches, context::Core, expectations::Expectations,
        pass::PassState,
    },
    slurm::{SlurmClients, Unavailable},
};
use slurm_view::SlurmView;

/// Whether the NodeSet carries the finalizer `key` (the host's:
/// [`keys::FINALIZER_SLURM_NODES`], [`keys::FINALIZER_RESERVATION`]).
fn has_finalizer(ns: &NodeSet, key: &str) -> bool {
    ns.finalizers().iter().any(|f| f == key)
}

/// The longest wait between two passes of a NodeSet whose Slurm could not be asked.
const SLURM_RETRY_CAP: Duration = Duration::from_secs(10);
/// How soon a pass comes back while a pod waits for its Slurm node to drain.
const DRAIN_RECHECK: Duration = Duration::from_secs(3);
/// How soon a pass of a NodeSet whose pods are Slurm nodes comes back, whatever else it waits
/// on: a job that starts on an idle pod gets `pod-protect` within this plus the node list's age
/// (at most [`crate::reconcile::slurm::NODES_TTL`]): 25 s, within Slinky's 30 s refresh.
pub const PROTECT_INTERVAL: Duration = Duration::from_secs(15);
use crate::plugins::{BuilderKind, Pipeline};
pub use finalizer::RELEASE_SETTLE;

/// What the NodeSet reconciler gets.
pub struct NodeSetContext {
    /// What every reconciler shares.
    pub core: Arc<Core>,
    /// The caches (it reads its pods, its Controller, the NodeSets sharing its workers' objects
    /// and its children).
    pub caches: Caches,
    /// What the host last applied to each child (hash and resulting resourceVersion).
    pub applied: Arc<AppliedVersions>,
    /// Pending pod creations/deletions per NodeSet UID.
    pub expectations: Arc<Expectations>,
    /// The slurmrestd clients of the Controllers (drains, node states, reservations).
    pub slurm: Arc<SlurmClients>,
    /// Pods being built or created, across NodeSets (at most [`CREATES_IN_FLIGHT`]).
    pub create_permits: tokio::sync::Semaphore,
    /// Pods labelled by Slinky found to differ from what the builder makes (not compared again
    /// until they or the NodeSet change).
    pub(crate) differing: differing::DifferingPods,
    /// Each NodeSet's pod revision, under the build key it was built for.
    pub(crate) revisions: revisions::Revisions,
    /// DaemonSet mode: the per-node backoff of failed pods.
    pub(crate) daemon_backoff: daemon::DaemonBackoff,
    /// Deleted NodeSets whose nodes were seen idle, waiting out [`finalizer::RELEASE_SETTLE`].
    pub(crate) settling: finalizer::Settling,
}

impl NodeSetContext {
    /// A context over `core` and `caches`, its own state empty.
    pub fn new(
        core: Arc<Core>,
        caches: Caches,
        applied: Arc<AppliedVersions>,
        expectations: Arc<Expectations>,
        slurm: Arc<SlurmClients>,
    ) -> Self {
        NodeSetContext {
            core,
            caches,
            applied,
            expectations,
            slurm,
            create_permits: tokio::sync::Semaphore::new(CREATES_IN_FLIGHT),
            differing: differing::DifferingPods::default(),
            revisions: revisions::Revisions::default(),
            daemon_backoff: daemon::DaemonBackoff::default(),
            settling: finalizer::Settling::default(),
        }
    }
}

/// Reconcile one NodeSet.
///
/// # Errors
/// API errors (retried with the NodeSet's backoff by the error policy).
pub async fn reconcile(ns: Arc<NodeSet>, ctx: Arc<NodeSetContext>) -> Result<Action, Error> {
    ctx.core
        .instrumented(ns.as_ref(), reconcile_inner(&ns, &ctx))
        .await
}

/// One pass: what it decided about conditions, and the writes that failed.
struct Pass<'a> {
    ctx: &'a NodeSetContext,
    ns: &'a NodeSet,
    uid: String,
    /// The conditions, the problem that stops the pass, and whether a builder failed.
    state: PassState<'a, NodeSet>,
    /// Each refused pod write (`ReplicaFailure`).
    failures: Vec<Failure>,
    /// Each refused child write (not a pod) or ownership problem (`ChildFailure`).
    child_failures: Vec<Failure>,
    /// The children were synced (so `ChildFailure` is set or cleared by this pass).
    children_synced: bool,
    /// Why Slurm could not be asked or refused what was asked (`None`: it answered, or it is
    /// not configured, or the pass did not get that far).
    slurm_failure: Option<Failure>,
    /// The pass asked Slurm (so `SlurmFailure` is set or cleared by it).
    slurm_asked: bool,
    /// The Slurm node counts of the NodeSet's pods (when Slurm was asked).
    slurm_counts: Option<slinky_slurm::Counts>,
    /// A pod waits on its Slurm node: come back soon.
    waits_for_slurm: bool,
    /// Slurm listed the nodes in this pass and `pod-protect` was refreshed from the list: the
    /// pass comes back within [`PROTECT_INTERVAL`].
    watches_slurm: bool,
    /// A write met a 409 because the cache lagged behind our own previous write: come back soon
    /// (not a failure: no Event, no backoff).
    retry_soon: bool,
    /// DaemonSet mode: the nodes the pods should run on (the status' `desired`).
    desired: Option<i32>,
    /// The soonest the pass must come back: a DaemonSet-mode node's failure backoff, a
    /// maintenance window's start or end.
    come_back: Option<Duration>,
    /// Changes to `status.keptDrains` (node → the drain to keep, `None`: forget it).
    kept: std::collections::BTreeMap<String, Option<slinky_api::KeptDrain>>,
}

impl Pass<'_> {
    /// What both reconcilers share.
    fn core(&self) -> &Core {
        &self.ctx.core
    }

    /// A refused write: an Event now, the `ReplicaFailure` condition at the end of the pass.
    async fn failed(&mut self, reason: &'static str, message: String) {
        tracing::warn!(reason, "{message}");
        self.core()
            .event(self.ns, EventType::Warning, reason, message.clone())
            .await;
        self.failures.push(Failure::replica(reason, message));
    }

    /// Slurm could not be asked or refused: an Event when the message is new, the
    /// `SlurmFailure` condition at the end of the pass (the first failure of the pass).
    async fn slurm_failed(&mut self, u: Unavailable) {
        let failure = Failure::slurm(u.reason, u.message);
        self.core().report(self.ns, self.state.current(), &failure).await;
        self.slurm_failure.get_or_insert(failure);
    }

    /// A Normal `Draining` Event naming the Slurm nodes just drained, and what waits for them.
    async fn draining(&self, nodes: &[String], until: &str) {
        if nodes.is_empty() {
            return;
        }
        let note = format!(
            "Draining Slurm nodes {}: {until} once no job runs there",
            crate::reconcile::core::events::name_list(nodes)
        );
        self.core()
            .event(self.ns, EventType::Normal, "Draining", note)
            .await;
    }

    /// A pod waits for its Slurm node to drain.
    fn wait_for_slurm(&mut self) {
        self.waits_for_slurm = true;
    }

    /// Come back within seconds (see [`Pass::retry_soon`]).
    fn retry_soon(&mut self) {
        self.retry_soon = true;
    }

    /// Come back within `after` (a node's backoff, a maintenance window's start or end).
    fn come_back_within(&mut self, after: Duration) {
        self.come_back = Some(self.come_back.map_or(after, |c| c.min(after)));
    }
}

async fn reconcile_inner(ns: &NodeSet, ctx: &NodeSetContext) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    let namespace = ns.namespace().unwrap_or_default();
    let uid = ns.uid().unwrap_or_default();
    if !core.serves(&namespace) {
        return Ok(Action::await_change());
    }
    if ns.metadata.deletion_timestamp.is_some()
        && !has_finalizer(ns, keys::FINALIZER_SLURM_NODES)
        && !has_finalizer(ns, keys::FINALIZER_RESERVATION)
    {
        ctx.expectations.forget(&uid);
        ctx.differing.forget(&uid);
        ctx.revisions.forget(&uid);
        ctx.daemon_backoff.forget(&uid);
        return Ok(Action::await_change());
    }
    // Expectations first, the cache second: when they are satisfied, every event they waited for
    // has been applied to the cache, so what is read next is no older than our own writes. (Read
    // the other way round, a pass could act on pods its previous pass already deleted.)
    let satisfied = ctx.expectations.satisfied(&uid);
    let claims = classify(
        ns,
        ctx.caches
            .pod_index
            .pods(&ctx.caches.pods, &namespace, &ns.name_any()),
    );
    let controller = ctx
        .caches
        .controllers
        .get(&ObjectRef::<Controller>::new(&ns.spec.controller_ref.name).within(ns.controller_namespace()));
    let plugin = core.plugins.pipeline(BuilderKind::NodesetPod, &ns.metadata);
    // What the builders make decides the revision (see `crate::revision`): built for a NodeSet
    // that is to sync only (not one being deleted or invalid).
    let spec_problem = checks::summary(&ns.spec_problems());
    let built = match controller.as_ref() {
        Some(c) if ns.metadata.deletion_timestamp.is_none() && spec_problem.is_none() => {
            Some(ctx.revisions.of(core, ns, c, &plugin).await?)
        }
        _ => None,
    };
    // A probe that cannot be built leaves the last revision in force: scale-downs, failed pods
    // and drains go on; creates and relabelling need the builder and wait for it.
    let last = || ns.status.as_ref().and_then(|s| s.node_set_hash.clone());
    let (known, probe_error) = match built {
        Some(Ok(k)) => (Some(k), None),
        Some(Err(e)) => (last().map(revisions::Known::last), Some(e)),
        None => (None, None),
    };
    let revision = known.as_ref().map(|k| k.revision.clone());

    let current = super::core::status::HasStatus::conditions(ns);
    let mut pass = Pass {
        ctx,
        ns,
        uid,
        state: PassState::new(core, ns, current),
        failures: Vec::new(),
        child_failures: Vec::new(),
        children_synced: false,
        slurm_failure: None,
        slurm_asked: false,
        slurm_counts: None,
        waits_for_slurm: false,
        watches_slurm: false,
        retry_soon: false,
        desired: None,
        come_back: None,
        kept: Default::default(),
    };
    let mut owned = claims.owned.clone();
    let mut requeue = core.resync;
    let reached;
    if ns.metadata.deletion_timestamp.is_some() {
        // Its Slurm nodes' finalizer first (their jobs end, slurmctld has read the closed
        // partition), then the reservation's: deleted on a slurmctld that is not restarting.
        if finalizer::finalize(&mut pass, controller.as_deref(), &owned).await
            && reservation::finalize(&mut pass, controller.as_deref()).await
        {
            ctx.expectations.forget(&pass.uid);
            ctx.settling.forget(&pass.uid);
            ctx.differing.forget(&pass.uid);
            ctx.revisions.forget(&pass.uid);
            return Ok(Action::await_change());
        }
        reached = Reached::Waiting;
    } else if let Some(problem) = spec_problem {
        pass.state.problem(Failure::invalid_spec(problem)).await;
        reached = Reached::Problem;
    } else if let (Some(e), None) = (&probe_error, &known) {
        pass.state.builder_error(e).await;
        reached = Reached::Problem;
    } else if let (Some(controller), Some(known)) = (controller.as_ref(), known.as_ref()) {
        if satisfied {
            owned = sync(&mut pass, controller, known, claims, &plugin).await?;
            reached = Reached::Synced;
        } else {
            // The watch will trigger the next pass when it shows what we wait for.
            requeue = Duration::from_millis(500);
            reached = Reached::Waiting;
        }
        if let Some(e) = &probe_error {
            pass.state.builder_error(e).await;
        }
    } else {
        let message = format!(
            "Controller {}/{} does not exist (yet)",
            ns.controller_namespace(),
            ns.spec.controller_ref.name
        );
        pass.state.problem(Failure::controller_not_found(message)).await;
        reached = Reached::Problem;
    }

    if !pass.watches_slurm
        && ns.metadata.deletion_timestamp.is_none()
        && let Some(controller) = controller.as_deref()
    {
        // The pass did not get to its pods (an invalid spec, its expectations, a builder or
        // child problem): protection still follows the jobs.
        protect::refresh_protection(&mut pass, controller, &owned).await;
    }
    // Without a revision this pass (no Controller, a failing builder), the last one counts.
    let shown = revision.or_else(|| ns.status.as_ref().and_then(|s| s.node_set_hash.clone()));
    write_status(&mut pass, &owned, shown.as_deref(), reached).await?;
    Ok(Action::requeue(pass.come_back_after(requeue, reached, &owned)))
}

impl Pass<'_> {
    /// When the NodeSet comes back after this pass (`requeue` unless something sooner): its
    /// backoff after a failure, within seconds while Slurm cannot be asked or a pod waits on its
    /// node, at a maintenance window's edge, when a pod becomes available.
    fn come_back_after(&self, mut requeue: Duration, reached: Reached, owned: &[Arc<Pod>]) -> Duration {
        let failed = !self.failures.is_empty()
            || !self.child_failures.is_empty()
            || self.state.retry_problem()
            || self.slurm_failure.is_some();
        let synced = reached == Reached::Synced;
        if let Some(after) = self
            .core()
            .backoff
            .record(&backoff::key(self.ns), backoff::Outcome::of(synced, failed))
        {
            requeue = after;
        }
        if self.slurm_failure.is_some() && self.failures.is_empty() && self.child_failures.is_empty() {
            // Slurm unreachable holds scale-ins and updates: ask again within seconds of its
            // return, whatever the backoff has grown to (Slinky: every 30 s).
            requeue = requeue.min(SLURM_RETRY_CAP);
        }
        if let Some(after) = self.come_back {
            requeue = requeue.min(after);
        }
        if self.watches_slurm && owned.iter().any(|p| p.metadata.deletion_timestamp.is_none()) {
            requeue = requeue.min(PROTECT_INTERVAL);
        }
        if (self.waits_for_slurm || self.retry_soon) && !failed {
            // A node drains as its jobs end: look again soon (Slinky: 30 s).
            requeue = requeue.min(DRAIN_RECHECK);
        }
        let min_ready = i64::from(self.ns.spec.min_ready_seconds.unwrap_or(0));
        let now = Timestamp::now();
        if owned
            .iter()
            .any(|p| is_running_and_ready(p) && !is_available(p, min_ready, now))
        {
            requeue = requeue.min(Duration::from_secs(min_ready.max(0) as u64 + 1));
        }
        requeue
    }
}

/// Claim, plan and write; returns the pods the NodeSet owns afterwards (for status).
async fn sync(
    pass: &mut Pass<'_>,
    controller: &Controller,
    known: &revisions::Known,
    mut claims: Claims,
    plugin: &Pipeline,
) -> Result<Vec<Arc<Pod>>, Error> {
    let ns = pass.ns;
    let revision = known.revision.as_str();
    sync_children(pass, controller).await?;
    if pass.state.problem.is_some() {
        return Ok(claims.owned);
    }
    adopt_and_release(pass, &mut claims).await?;
    claims.unjudged = relabel_equal_pods(pass, controller, revision, &mut claims.owned, plugin).await?;
    if pass.state.problem.is_some() {
        return Ok(claims.owned);
    }
    refresh_provenance(pass, revision, &known.provenance, &mut claims.owned).await;
    let history = history::record(pass, revision).await;
    let slurm = SlurmView::read(pass, controller).await;
    finalizer::ensure(pass, &slurm).await;
    let window = reservation::sync(pass, &slurm, &claims.owned).await;
    if ns.is_daemon() {
        let owned = sync_daemon(pass, controller, revision, claims, plugin, slurm, window).await?;
        history::truncate(pass, &history, &owned, revision).await;
        return Ok(owned);
    }
    let plan_with = |slurm: &SlurmView| {
        plan(&Inputs {
            nodeset: ns,
            revision,
            owned: &claims.owned,
            blocked: &claims.blocked,
            leaving: &claims.leaving,
            now: Timestamp::now(),
            update_ranks: &slurm.update_ranks(ns, &claims.owned),
            window: window.as_ref(),
            unjudged: &claims.unjudged,
        })
    };
    let mut plan = plan_with(&slurm);
    // A delete is decided on a fresh node list, and so is which pod it takes: a job that started a
    // moment ago makes its node busy, not idle.
    let refresh = plan.deletes.iter().any(|(_, r)| *r != DeleteReason::Finished);
    let slurm = slurm.for_deletes(&plan.deletes).await;
    if refresh {
        plan = plan_with(&slurm);
    }
    if let Some(problem) = plan
        .creates
        .iter()
        .find_map(|o| checks::summary(&ns.identity_problems(*o)))
    {
        pass.state.problem(Failure::invalid_spec(problem)).await;
        return Ok(claims.owned);
    }
    tracing::debug!(
        creates = ?plan.creates,
        waiting = ?plan.waiting,
        deletes = ?plan.deletes.iter().map(|(p, r)| (p.name_any(), *r)).collect::<Vec<_>>(),
        "sync pods"
    );
    if !plan.skipped.is_empty() {
        pass.core()
            .event(
                ns,
                EventType::Warning,
                "PodNameTaken",
                skipped_note(&plan.skipped),
            )
            .await;
    }
    let deleting: Vec<String> = plan.deletes.iter().map(|(p, _)| p.name_any()).collect();
    let deletes = drain::gate(pass, controller, &slurm, plan.deletes).await;
    let deletes = volumes::sync_owners(pass, &claims.owned, deletes).await;
    delete_pods(pass, &deletes).await;
    let slots = ordinal_slots(pass, revision, &plan.creates);
    create_pods(pass, controller, slots, plugin).await?;
    drain::sync_kept(pass, &slurm, &claims.owned, &deleting).await;
    history::truncate(pass, &history, &claims.owned, revision).await;
    pass.slurm_counts = slurm.counts(&claims.owned);
    Ok(claims.owned)
}

/// DaemonSet mode: a pod per eligible node ([`daemon`]), deleted through the same drain gate
/// and claim owners as ordinal pods.
async fn sync_daemon(
    pass: &mut Pass<'_>,
    controller: &Controller,
    revision: &str,
    claims: Claims,
    plugin: &Pipeline,
    slurm: SlurmView,
    window: Option<BTreeSet<String>>,
) -> Result<Vec<Arc<Pod>>, Error> {
    let ns = pass.ns;
    let nodes = pass.ctx.caches.nodes.state();
    if nodes.is_empty() {
        // Never "every node is gone": the Node cache has not synced, or the host may not read
        // Nodes. Nothing is created or deleted until it knows them.
        pass.failed(
            "NodesUnknown",
            "no Kubernetes Node is known (the Node cache has not synced, or the host's RBAC does not \
             let it list and watch Nodes): DaemonSet mode places and deletes no pod until it knows them"
                .into(),
        )
        .await;
        return Ok(claims.owned);
    }
    // One pod built as any would be (the first node's, or a node-less one): its placement
    // fields decide which nodes are eligible.
    let probe_identity = crate::plugins::PodIdentity {
        ordinal: 0,
        name: ns.daemon_pod_name("probe"),
        hostname: "probe".into(),
        revision: revision.to_string(),
    };
    let probe = match pods::build_pods(pass.core(), ns, controller, plugin, vec![probe_identity]).await? {
        Ok(mut built) => built.pop().and_then(|p| p.spec).unwrap_or_default(),
        Err(e) => {
            pass.state.builder_error(&e).await;
            return Ok(claims.owned);
        }
    };
    let plan = daemon::plan_daemon(&daemon::DaemonInputs {
        nodeset: ns,
        uid: &pass.uid,
        revision,
        owned: &claims.owned,
        nodes: &nodes,
        probe: &probe,
        now: Timestamp::now(),
        backoff: &pass.ctx.daemon_backoff,
        window: window.as_ref(),
        unjudged: &claims.unjudged,
    });
    pass.desired = Some(i32::try_from(plan.desired).unwrap_or(i32::MAX));
    if let Some(after) = plan.backoff {
        pass.come_back_within(after);
    }
    let mut slots = Vec::new();
    for e in &plan.creates {
        if let Some(problem) = checks::summary(&ns.daemon_identity_problems(&e.node, &e.hostname)) {
            pass.failed("FailedCreate", format!("No pod for node {}: {problem}", e.node))
                .await;
            continue;
        }
        slots.push(pods::Slot {
            identity: crate::plugins::PodIdentity {
                ordinal: 0,
                name: ns.daemon_pod_name(&e.hostname),
                hostname: e.hostname.clone(),
                revision: revision.to_string(),
            },
            place: Some(pods::Place::Node(e.node.clone())),
        });
    }
    tracing::debug!(
        creates = ?plan.creates.iter().map(|e| &e.node).collect::<Vec<_>>(),
        deletes = ?plan.deletes.iter().map(|(p, r)| (p.name_any(), *r)).collect::<Vec<_>>(),
        desired = plan.desired,
        "sync daemon pods"
    );
    let deleting: Vec<String> = plan.deletes.iter().map(|(p, _)| p.name_any()).collect();
    let deletes = drain::gate(pass, controller, &slurm, plan.deletes).await;
    let deletes = volumes::sync_owners(pass, &claims.owned, deletes).await;
    delete_pods(pass, &deletes).await;
    create_pods(pass, controller, slots, plugin).await?;
    drain::sync_kept(pass, &slurm, &claims.owned, &deleting).await;
    if ns.spec.prune_slurm_node_records.as_deref() == Some("NodeNotFound") {
        drain::prune_defunct(pass, &slurm, &claims.owned, &nodes).await;
    }
    pass.slurm_counts = slurm.counts(&claims.owned);
    Ok(claims.owned)
}

fn skipped_note(skipped: &[(u32, Blocker)]) -> String {
    let items: Vec<String> = skipped
        .iter()
        .map(|(o, b)| format!("ordinal {o} (pod {}: {})", b.pod, b.why))
        .collect();
    format!(
        "skipped {} held by pods this NodeSet does not own; other ordinals were used instead \
         (delete or rename those pods to free their names)",
        crate::reconcile::core::events::name_list(&items)
    )
}
