//! The NodeSet's plan: a pure function from what the cache shows (after claiming) to the pods to
//! create and delete.
//!
//! # Rules
//! * Ordinals are stable, like a StatefulSet's: the missing pods are the lowest ordinals that no
//!   live pod holds (a pod the NodeSet does not own holding `<nodeset>-N` makes N used: see
//!   [`super::claim`]). Of those, one whose pod is on its way out (terminating, or Failed /
//!   Succeeded and deleted now) is recreated under the same ordinal once it is gone; meanwhile it
//!   waits and no other ordinal takes its place. No Slurm node is renamed by a replacement, and
//!   there are never more live pods than `replicas`.
//! * A pod on its way out above those ordinals (left by a scale down, stuck terminating on a dead
//!   node) holds no place: it is not coming back, and the ordinals below it are filled meanwhile.
//! * Scale up fills the lowest ordinals nobody holds.
//! * Scale down removes pods in Slinky's `ActivePods` order (unscheduled, pending, not ready,
//!   lower `pod-deletion-cost`, earlier `pod-deadline` (compared as times; none first), cordoned,
//!   higher ordinal, more recently ready, newer), except that among pods equally alive the ones
//!   whose Slurm nodes the host drains go first, then idle ones, then busy ones: a busy node is
//!   never drained while an idle one can go. The ordinal gap this leaves is filled by the next
//!   scale up (the lowest free ordinal).
//! * A rolling update replaces pods of another revision (or named with another padding) without
//!   more than `maxUnavailable` pods unavailable, counting missing pods: old unhealthy pods first,
//!   then healthy ones in scale-down order.
//! * A scheduled update replaces old unhealthy pods at once, and the healthy ones whose Slurm
//!   nodes are in the open maintenance window ([`Inputs::window`]), all of them.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::ResourceExt;
use slinky_api::{
    NodeSet, UpdateStrategyType,
    checks::{self, MaxUnavailable},
    keys,
    pods::{ordinal_after, ready_since},
};

use super::classify::Blocker;

/// Most deletes (and scheduled-update replacements) in one pass.
pub const BURST: usize = 250;

/// Most creates in one pass. A scale-up of up to this many is one pass, as one sync of the
/// StatefulSet controller: its slow-start batches (1, 2, 4, …, 32, two in flight) follow each
/// other without waiting for the watch between them, and slow start does not begin again at 1.
/// A spec changed meanwhile is still seen at once: a pass sends no batch after its NodeSet's
/// generation moved (`create::superseded`).
pub const CREATE_BURST: usize = 10_000;

/// A pod's phase (`""` when it has none yet).
pub fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// Running with a `Ready=True` condition.
pub fn is_running_and_ready(p: &Pod) -> bool {
    phase(p) == "Running" && slinky_api::pods::is_ready(p)
}

/// Running, and ready for at least `min_ready` seconds at `now` (`slinky_api::pods::is_available`).
pub fn is_available(p: &Pod, min_ready: i64, now: Timestamp) -> bool {
    phase(p) == "Running" && slinky_api::pods::is_available(p, min_ready, now)
}

fn is_finished(p: &Pod) -> bool {
    matches!(phase(p), "Failed" | "Succeeded")
}

fn deletion_cost(p: &Pod) -> i64 {
    p.annotations()
        .get(keys::ANNOTATION_POD_DELETION_COST)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Slinky's `ActivePods` order: the pods to delete first come first.
pub fn condemn_order(a: &Pod, b: &Pod, nodeset: &NodeSet) -> Ordering {
    liveness_order(a, b).then(preference_order(a, b, nodeset, false))
}

/// A scale-down's order: [`condemn_order`], but among pods equally alive the Slurm node's rank
/// ([`Inputs::update_ranks`]: nodes the host drains, then idle, then busy ones) comes before
/// every preference: a busy node is never drained while an idle one of the NodeSet can go.
fn scale_down_order(a: &Pod, b: &Pod, nodeset: &NodeSet, ranks: &BTreeMap<String, u8>) -> Ordering {
    let rank = |p: &Pod| ranks.get(&p.name_any()).copied().unwrap_or(1);
    // Among busy nodes, one whose jobs have no known end goes last.
    let busy = rank(a) == 2 && rank(b) == 2;
    liveness_order(a, b)
        .then(rank(a).cmp(&rank(b)))
        .then(preference_order(a, b, nodeset, busy))
}

/// Unscheduled, pending, not ready first.
fn liveness_order(a: &Pod, b: &Pod) -> Ordering {
    let scheduled = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
    let phase_rank = |p: &Pod| match phase(p) {
        "Pending" => 0,
        "Unknown" | "" => 1,
        _ => 2,
    };
    scheduled(a)
        .cmp(&scheduled(b))
        .then(phase_rank(a).cmp(&phase_rank(b)))
        .then(is_running_and_ready(a).cmp(&is_running_and_ready(b)))
}

/// The `pod-deadline` of a pod (when its node's jobs end), as a time: none (no job, or not
/// written) sorts first, as in Slinky, or last among busy nodes (`busy`: a job without an end);
/// an unreadable one last.
fn deadline(p: &Pod, busy: bool) -> (u8, Option<Timestamp>) {
    match p.annotations().get(keys::ANNOTATION_POD_DEADLINE) {
        None if busy => (3, None),
        None => (0, None),
        Some(v) => match v.parse::<Timestamp>() {
            Ok(t) => (1, Some(t)),
            Err(_) => (2, None),
        },
    }
}

/// Lower `pod-deletion-cost`, earlier `pod-deadline`, cordoned, higher ordinal, more recently
/// ready, newer first (`busy`: both pods' nodes are busy).
fn preference_order(a: &Pod, b: &Pod, nodeset: &NodeSet, busy: bool) -> Ordering {
    let cordoned = |p: &Pod| {
        p.annotations()
            .get(keys::ANNOTATION_POD_CORDON)
            .is_some_and(|v| v == "true")
    };
    let ordinal = |p: &Pod| ordinal_after(&nodeset.name_any(), &p.name_any());
    deletion_cost(a)
        .cmp(&deletion_cost(b))
        .then(deadline(a, busy).cmp(&deadline(b, busy)))
        .then(cordoned(b).cmp(&cordoned(a)))
        .then(ordinal(b).cmp(&ordinal(a)))
        .then(ready_since(b).cmp(&ready_since(a)))
        .then(b.creation_timestamp().cmp(&a.creation_timestamp()))
}

/// Why a pod is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// More live pods than `replicas`.
    ScaleDown,
    /// Failed or Succeeded: replaced under the same ordinal once gone.
    Finished,
    /// Of an old revision (rolling update).
    Update,
}

/// What one pass does.
#[derive(Debug, Default)]
pub struct Plan {
    /// Ordinals to create now.
    pub creates: Vec<u32>,
    /// Pods to delete now.
    pub deletes: Vec<(Arc<Pod>, DeleteReason)>,
    /// Ordinals waiting for their pod to go before they are created again.
    pub waiting: Vec<u32>,
    /// Ordinals below the created ones skipped because a pod the NodeSet does not own holds them.
    pub skipped: Vec<(u32, Blocker)>,
}

/// What the plan is made from.
pub struct Inputs<'a> {
    /// The NodeSet.
    pub nodeset: &'a NodeSet,
    /// The pod revision pods should have.
    pub revision: &'a str,
    /// The pods the NodeSet owns (claimed).
    pub owned: &'a [Arc<Pod>],
    /// Ordinal names held by pods it does not own.
    pub blocked: &'a BTreeMap<u32, Blocker>,
    /// Of those, the ordinals whose holders are on their way out (waited for, not skipped).
    pub leaving: &'a BTreeSet<u32>,
    /// The time availability is judged at.
    pub now: Timestamp,
    /// How a scale down and a rolling update rank pods by their Slurm node (pod name → rank,
    /// lower first; see [`super::slurm_view::SlurmView::update_ranks`]); empty without Slurm.
    pub update_ranks: &'a BTreeMap<String, u8>,
    /// `ScheduledUpdate`: the pods whose Slurm nodes are in the open maintenance window (see
    /// [`super::reservation`]); `None` for another strategy.
    pub window: Option<&'a BTreeSet<String>>,
    /// UIDs of pods of another revision scheme not yet compared with what the builders make:
    /// not updated until they are (see [`super::adoption`]).
    pub unjudged: &'a std::collections::HashSet<String>,
}

/// Plan one pass. The NodeSet's spec is valid ([`NodeSet::spec_problems`] is empty).
pub fn plan(inp: &Inputs<'_>) -> Plan {
    let ns = inp.nodeset;
    let replicas = ns.replicas().max(0) as usize;
    let _min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let ordinal = |p: &Pod| ordinal_after(&ns.name_any(), &p.name_any());
    let mut plan = Plan::default();

    let (going, live): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) = inp
        .owned
        .iter()
        .partition(|p| p.metadata.deletion_timestamp.is_some() || is_finished(p));
    for p in going.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        plan.deletes.push(((*p).clone(), DeleteReason::Finished));
    }
    let held: BTreeSet<u32> = inp
        .owned
        .iter()
        .filter_map(|p| ordinal(p))
        .chain(inp.blocked.keys().copied())
        .collect();
    let live_ordinals: BTreeSet<u32> = live.iter().filter_map(|p| ordinal(p)).collect();
    // Ordinals on their way out, to be recreated under the same name once gone.
    let returning: BTreeSet<u32> = going
        .iter()
        .filter_map(|p| ordinal(p))
        .chain(inp.leaving.iter().copied())
        .filter(|o| !live_ordinals.contains(o))
        .collect();

    if live.len() > replicas {
        let mut sorted = live.clone();
        sorted.sort_by(|a, b| scale_down_order(a, b, ns, inp.update_ranks));
        let n = (live.len() - replicas).min(BURST);
        plan.deletes.extend(
            sorted
                .into_iter()
                .take(n)
                .map(|p| (p.clone(), DeleteReason::ScaleDown)),
        );
        return plan;
    }
    let need = replicas - live.len();
    // The `need` lowest ordinals no live pod and no staying stranger holds are the ones to fill:
    // free ones are created, those on their way out wait. An ordinal on its way out above them
    // (left by a scale down, still terminating) holds no slot: it is not coming back.
    let mut next = 0u32;
    let mut skipped = Vec::new();
    while plan.creates.len() + plan.waiting.len() < need && plan.creates.len() < CREATE_BURST {
        if live_ordinals.contains(&next) {
            // Live: not a hole.
        } else if returning.contains(&next) {
            plan.waiting.push(next);
        } else if !held.contains(&next) {
            plan.creates.push(next);
            plan.skipped.append(&mut skipped);
        } else if let Some(b) = inp.blocked.get(&next) {
            skipped.push((next, b.clone()));
        }
        next += 1;
    }

    plan_updates(inp, &mut plan, &live, need);
    plan
}

/// The old pods a rolling (or scheduled) update replaces now: every unavailable one, then healthy
/// ones (draining, idle, busy; then in condemn order) while the `maxUnavailable` budget lasts,
/// counting the `need` pods still missing as unavailable (a scheduled update: those in its
/// window, at most a burst).
fn plan_updates(inp: &Inputs<'_>, plan: &mut Plan, live: &[&Arc<Pod>], need: usize) {
    let ns = inp.nodeset;
    let replicas = ns.replicas().max(0) as usize;
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let strategy = ns.spec.update_strategy.as_ref();
    let scheduled = strategy.is_some_and(|s| s.type_ == UpdateStrategyType::ScheduledUpdate);
    if strategy.is_some_and(|s| s.type_ == UpdateStrategyType::OnDelete) {
        return;
    }
    let old: Vec<&Arc<Pod>> = live
        .iter()
        .copied()
        .filter(|p| {
            (p.labels().get(keys::LABEL_REVISION_HASH).map(String::as_str) != Some(inp.revision)
                && !p.uid().is_some_and(|u| inp.unjudged.contains(&u)))
                || ns.pod_ordinal(&p.name_any()).is_none()
        })
        .collect();
    if old.is_empty() {
        return;
    }
    let max = MaxUnavailable::resolve(
        checks::max_unavailable(
            strategy
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.as_ref()),
        )
        .ok()
        .flatten(),
        replicas as i32,
    );
    let unavailable = live
        .iter()
        .filter(|p| !is_available(p, min_ready, inp.now))
        .count()
        + need;
    let mut budget = i64::from(max) - unavailable as i64;
    let (mut unhealthy, mut healthy): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) = old
        .into_iter()
        .partition(|p| !is_available(p, min_ready, inp.now));
    if scheduled {
        // The window is the budget (its nodes are in maintenance), at most a burst a pass.
        healthy.retain(|p| inp.window.is_some_and(|w| w.contains(&p.name_any())));
        budget = BURST as i64;
    }
    unhealthy.sort_by(|a, b| condemn_order(a, b, ns));
    // Nodes the host is draining, then idle ones, then busy ones: a job keeps its node longest.
    let rank = |p: &Pod| inp.update_ranks.get(&p.name_any()).copied().unwrap_or(1);
    healthy.sort_by(|a, b| rank(a).cmp(&rank(b)).then(condemn_order(a, b, ns)));
    // Old pods already unavailable cost no budget.
    plan.deletes
        .extend(unhealthy.into_iter().map(|p| (p.clone(), DeleteReason::Update)));
    for p in healthy {
        if budget <= 0 {
            break;
        }
        plan.deletes.push((p.clone(), DeleteReason::Update));
        budget -= 1;
    }
}

#[cfg(test)]
mod tests;
