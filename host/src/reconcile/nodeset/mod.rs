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
mod create;
pub(crate) mod daemon;
pub(crate) mod differing;
mod drain;
mod finalizer;
#[cfg(test)]
pub(crate) mod fixtures;
mod history;
mod kept;
mod other_children;
mod pass;
mod plan;
mod pods;
mod protect;
pub use create::CREATES_IN_FLIGHT;
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
use create::create_pods;
use other_children::sync_children;
use pass::Pass;
pub use plan::is_running_and_ready;
use plan::{DeleteReason, Inputs, plan};
use pods::{delete_pods, ordinal_slots};
use status::{Reached, write_status};

use super::{
    core::{
        Error, applied::AppliedVersions, caches::Caches, context::Core, expectations::Expectations,
        pass::PassState,
    },
    slurm::SlurmClients,
};
use slurm_view::SlurmView;

/// Whether the NodeSet carries the finalizer `key` (the host's:
/// [`keys::FINALIZER_SLURM_NODES`], [`keys::FINALIZER_RESERVATION`]).
fn has_finalizer(ns: &NodeSet, key: &str) -> bool {
    ns.finalizers().iter().any(|f| f == key)
}

use crate::plugins::{BuilderKind, Pipeline};
pub use finalizer::RELEASE_SETTLE;
pub use pass::PROTECT_INTERVAL;

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
    /// Batches of pods being built at once, across NodeSets: one a core (builds are CPU work;
    /// more at once only add blocking threads, warm plugin instances and pods held built).
    pub build_permits: tokio::sync::Semaphore,
    /// Pods labelled by Slinky found to differ from what the builder makes (not compared again
    /// until they or the NodeSet change).
    pub(crate) differing: differing::DifferingPods,
    /// Each NodeSet's pod revision, under the build key it was built for.
    pub(crate) revisions: revisions::Revisions,
    /// DaemonSet mode: the per-node backoff of failed pods.
    pub(crate) daemon_backoff: daemon::DaemonBackoff,
    /// Deleted NodeSets whose nodes were seen idle, waiting out [`finalizer::RELEASE_SETTLE`].
    pub(crate) settling: finalizer::Settling,
    /// Each NodeSet's children other than pods, when last found as built.
    pub(crate) synced_children: other_children::SyncedChildren,
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
            build_permits: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
            ),
            differing: differing::DifferingPods::default(),
            revisions: revisions::Revisions::default(),
            daemon_backoff: daemon::DaemonBackoff::default(),
            settling: finalizer::Settling::default(),
            synced_children: other_children::SyncedChildren::default(),
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
        ctx.synced_children.forget(&uid);
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
    let mut pass = Pass::new(ctx, ns, uid, PassState::new(core, ns, current));
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
            ctx.synced_children.forget(&pass.uid);
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
            tracing::debug!(nodeset = %ns.name_any(), "pass waits for its expectations");
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
