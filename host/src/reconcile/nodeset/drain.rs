//! Drain before delete: a worker pod leaves (scale-in, rolling update) only once its Slurm node
//! is drained and no job runs there; and what Slurm says of the pods that stay (the
//! `pod-protect` label, undraining a node the host drained for a pod that is kept after all).
//!
//! # Rules
//! * A planned delete of a live pod (scale-in, update) is done now only on Slurm's positive word,
//!   read from a fresh node list: its node is DRAIN or DOWN with no job (not ALLOCATED, MIXED or
//!   COMPLETING). Otherwise the node is marked DRAIN with a reason starting `slurm-operator:` and
//!   the pod waits; the pass comes back within seconds. A pod already Failed or Succeeded, or
//!   still Pending (its slurmd never started), is deleted at once, also when Slurm cannot be
//!   asked.
//! * Absence is not evidence: a running pod whose node Slurm does not list (slurmctld just
//!   restarted and its dynamic nodes have not registered again, a partial answer) keeps its pod
//!   until the node is listed again (and then drains as any other), or until it has been missing
//!   for longer than the Controller's `SlurmdTimeout` (Slurm's own window for a slurmd to answer;
//!   300 s unless `extraConf` sets it), counted from the first list that missed it.
//! * When the Controller's Slurm cannot be asked (see [`crate::reconcile::slurm`]) no live pod
//!   is deleted: fail closed, never "treat as drained" (Slinky's PR #79), never wait on it
//!   (#239): the pass records why, and the NodeSet retries with its backoff.
//! * Closed stays closed: a NodeSet that had a slurmrestd (it carries the finalizer
//!   [`FINALIZER_SLURM_NODES`], added at its first pass with one) and has none now (its RestApi
//!   deleted or being deleted, the Service gone, the `--slurmrestd-url` flag dropped) is
//!   `SlurmUnreachable`, never "delete without a drain". Only the NodeSet's annotation
//!   [`ANNOTATION_DELETE_WITHOUT_DRAIN`]`=true` lets its pods go undrained again (a Warning Event
//!   says so once).
//! * A node the host drained (one of its own reason texts for the pod, see [`super::kept`])
//!   whose pod is no longer to be deleted is undrained (resumed if the host also set it DOWN). A
//!   drain or DOWN someone else set (whatever its prefix), and a DOWN "Not responding" node, are
//!   never undone (#3): they are kept in `status.keptDrains` and given back to the node of a
//!   replacement pod.
//! * A pod on a cordoned Kubernetes node has its Slurm node drained (reason from the node's
//!   `nodeset.slinky.slurm.net/node-cordon-reason` annotation), and so has a pod annotated
//!   `nodeset.slinky.slurm.net/pod-cordon=true`; uncordoned, the host's drain is undone.
//!   Someone else's drain is left alone either way.
//! * `nodeset.slinky.slurm.net/pod-protect=true` is on exactly the pods whose node is busy
//!   (with `workloadDisruptionProtection`, the default): the workers' PodDisruptionBudget selects
//!   them, so an eviction (a node drain by `kubectl drain`, the cluster autoscaler) waits for their
//!   jobs. [`super::protect`] writes it, with the `SlurmNodeState*` conditions and `pod-deadline`.
//!
//! [`FINALIZER_SLURM_NODES`]: slinky_api::keys::FINALIZER_SLURM_NODES
//! [`ANNOTATION_DELETE_WITHOUT_DRAIN`]: slinky_api::keys::ANNOTATION_DELETE_WITHOUT_DRAIN

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_slurm::Node;

use super::{
    Pass, kept,
    plan::DeleteReason,
    protect::{set_deadline, set_protect, write_conditions},
    slurm_view::SlurmView,
};
use crate::reconcile::{
    core::watch::nodes::cordoned,
    slurm::{Cluster, Unavailable, node_name},
};

/// Whether the pod of `node` may be deleted now: nothing runs there and nothing will.
fn may_delete(node: &Node) -> bool {
    !node.is_busy() && (node.is_drain() || node.is_down())
}

/// Whether the pod's slurmd may have started: it is past Pending (a Pending pod's containers
/// never ran, so no job can have run there). An unknown phase counts as started.
fn slurmd_may_run(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Pending")
}

/// What a pod whose node Slurm does not list may do.
pub(super) enum Unlisted {
    /// Nothing can run there: its slurmd never started, or Slurm has not listed the node for
    /// longer than `SlurmdTimeout`.
    Gone,
    /// Wait for the node to be listed (`first`: it was found missing just now).
    Wait { first: bool },
}

/// Absence is not evidence: a running pod whose node Slurm does not list waits until the node
/// is listed again or has been missing for longer than the Controller's `SlurmdTimeout`.
pub(super) fn unlisted_pod(
    cluster: &Cluster,
    controller: &slinky_api::Controller,
    pod: &Pod,
    node: &str,
) -> Unlisted {
    if !slurmd_may_run(pod) {
        return Unlisted::Gone;
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let (gone, first) = cluster.missing_for(node, uid);
    if gone >= controller.slurmd_timeout() {
        tracing::info!(pod = %pod.name_any(), node, missing_s = gone.as_secs(), "Slurm has not listed the node for longer than SlurmdTimeout: nothing runs there");
        Unlisted::Gone
    } else {
        Unlisted::Wait { first }
    }
}

/// Split the planned deletes: those done now are returned; the others are drained (when their
/// node is not DRAIN yet) and wait for a later pass.
pub(super) async fn gate(
    pass: &mut Pass<'_>,
    controller: &slinky_api::Controller,
    view: &SlurmView,
    deletes: Vec<(Arc<Pod>, DeleteReason)>,
) -> Vec<(Arc<Pod>, DeleteReason)> {
    let mut now = Vec::new();
    let mut drained = Vec::new();
    let mut waiting: Vec<(Arc<Pod>, DeleteReason, String)> = Vec::new();
    // A node drained now was idle: it is drained at once, so its pod may go in this pass.
    let mut drains_idle = false;
    let mut unlisted = Vec::new();
    let mut to_drain: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut withheld = 0;
    pass.slurm_asked = !matches!(view, SlurmView::Off);
    for (pod, reason) in deletes {
        // A finished pod, or one still Pending (its slurmd never started: no job can be there),
        // goes without asking Slurm, even when Slurm cannot be asked (a pod stuck in its init
        // containers or its image pull is replaced, not held until slurmrestd answers).
        if reason == DeleteReason::Finished || !slurmd_may_run(&pod) {
            now.push((pod, reason));
            continue;
        }
        match view {
            SlurmView::Off => now.push((pod, reason)),
            SlurmView::Failed(_) => withheld += 1,
            SlurmView::Nodes(cluster, nodes) => {
                let name = node_name(&pod);
                let Some(node) = nodes.get(&name) else {
                    match unlisted_pod(cluster, controller, &pod, &name) {
                        Unlisted::Gone => now.push((pod, reason)),
                        Unlisted::Wait { first } => {
                            if first {
                                unlisted.push(name);
                            }
                            pass.wait_for_slurm();
                        }
                    }
                    continue;
                };
                if may_delete(node) {
                    if let Some(k) = kept::to_keep(node, &pod, pass.ns)
                        && kept::stored(pass.ns, &name) != Some(&k)
                    {
                        // Someone else's drain or DOWN: the pod's pre-stop hook overwrites it,
                        // so it is kept in the status first and the pod goes on a later pass.
                        pass.remember(&name, Some(k));
                        pass.retry_soon();
                        continue;
                    }
                    now.push((pod, reason));
                    continue;
                }
                if !node.is_drain() {
                    let why = kept::drain_reason(pass.ns, reason);
                    to_drain.entry(why).or_default().push(name.clone());
                    drains_idle |= !node.is_busy();
                }
                waiting.push((pod, reason, name));
            }
        }
    }
    if let SlurmView::Nodes(cluster, _) = view {
        // One request per reason: a scale-in of a hundred nodes is one drain.
        for (why, names) in to_drain {
            let (done, error) = cluster.drain_nodes(&names, &why).await;
            drained.extend(done);
            if let Some(u) = error {
                pass.slurm_failed(u).await;
            }
        }
        if drains_idle && !drained.is_empty() {
            waiting = drained_now(pass, cluster, waiting, &mut now).await;
        }
    }
    if let SlurmView::Failed(u) = view {
        let message = if withheld > 0 {
            format!(
                "{withheld} pod(s) to delete wait: Slurm cannot be asked whether jobs run on their \
                 nodes, and nothing is deleted until it can: {}",
                u.message
            )
        } else {
            u.message.clone()
        };
        pass.slurm_failed(Unavailable {
            reason: u.reason,
            message,
        })
        .await;
    }
    pass.draining(&drained, "their pods are deleted").await;
    if !unlisted.is_empty() {
        waiting_for_unlisted(pass, controller, &unlisted).await;
    }
    if !waiting.is_empty() {
        pass.wait_for_slurm();
    }
    now
}

/// After drains of idle nodes: a fresh list, and the waiting pods whose nodes are now drained
/// with nothing running there go in this pass (`now`), not seconds later. Returns the pods that
/// still wait (on a failed read, all of them: the next pass looks again).
async fn drained_now(
    pass: &mut Pass<'_>,
    cluster: &Cluster,
    waiting: Vec<(Arc<Pod>, DeleteReason, String)>,
    now: &mut Vec<(Arc<Pod>, DeleteReason)>,
) -> Vec<(Arc<Pod>, DeleteReason, String)> {
    let nodes = match cluster.fresh_nodes().await {
        Ok(n) => n,
        Err(u) => {
            tracing::debug!(message = %u.message, "no fresh node list after the drains; the next pass looks");
            return waiting;
        }
    };
    let mut still = Vec::new();
    for (pod, reason, name) in waiting {
        match nodes.iter().find(|n| n.name == name) {
            Some(node) if may_delete(node) && kept::to_keep(node, &pod, pass.ns).is_none() => {
                now.push((pod, reason));
            }
            _ => still.push((pod, reason, name)),
        }
    }
    still
}

/// A Normal Event (and a warning in the log) naming the nodes just found missing from Slurm's
/// list, whose pods are kept.
async fn waiting_for_unlisted(pass: &Pass<'_>, controller: &slinky_api::Controller, unlisted: &[String]) {
    let note = format!(
        "Slurm does not list nodes {} (slurmctld may have restarted and they have not registered \
         again): their pods are kept until the nodes are listed and drained, or have been missing \
         for longer than SlurmdTimeout ({} s)",
        crate::reconcile::core::events::name_list(unlisted),
        controller.slurmd_timeout().as_secs()
    );
    tracing::warn!("{note}");
    pass.core()
        .event(pass.ns, EventType::Normal, "WaitingForSlurmNode", note)
        .await;
}

/// For the pods that stay: undrain the nodes the host drained for them, and set
/// `pod-protect` on the busy ones (removing it from the others).
pub(super) async fn sync_kept(
    pass: &mut Pass<'_>,
    view: &SlurmView,
    owned: &[Arc<Pod>],
    deleting: &[String],
) {
    let SlurmView::Nodes(cluster, nodes) = view else {
        return;
    };
    pass.watches_slurm = true;
    let protect = pass.ns.spec.workload_disruption_protection.unwrap_or(true);
    let live = || owned.iter().filter(|p| p.metadata.deletion_timestamp.is_none());
    // When the busy nodes' jobs end (`pod-deadline`), when some node is busy.
    let deadlines = if live().any(|p| nodes.get(&node_name(p)).is_some_and(Node::is_busy)) {
        match cluster.deadlines().await {
            Ok(d) => Some(d),
            Err(u) => {
                tracing::debug!(nodeset = %pass.ns.name_any(), message = %u.message, "cannot list the jobs; pod-deadline stays as it is");
                None
            }
        }
    } else {
        None
    };
    // Drains for cordons by reason; nodes to undrain ([0]) and to resume ([1]).
    let mut cordons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut back: [Vec<String>; 2] = Default::default();
    for pod in live() {
        let name = node_name(pod);
        let Some(node) = nodes.get(&name) else { continue };
        // Each write of the pod goes over the version the one before it left (a label patch
        // carries the resourceVersion it was decided on).
        let mut now: Pod = pod.as_ref().clone();
        if let Some(p) = write_conditions(pass, &now, node).await {
            now = p;
        }
        let want = protect && node.is_busy();
        if let Some(p) = set_protect(pass, &now, want).await {
            now = p;
        }
        if !node.is_busy() || deadlines.is_some() {
            let deadline = deadlines
                .as_ref()
                .filter(|_| node.is_busy())
                .and_then(|d| d.get(&name).copied());
            set_deadline(pass, &now, deadline).await;
        }
        if deleting.contains(&pod.name_any()) {
            // Draining for its delete: nothing to undo.
            continue;
        }
        let ours = kept::ours(&node.reason, pod, pass.ns) && node.host_may_change();
        let ready = super::is_running_and_ready(pod);
        let stored = kept::stored(pass.ns, &name).cloned();
        // After its predecessor's pre-stop hook: the node waits to get its drain back.
        let replaced = node.is_down() && node.reason == kept::PRESTOP_REASON;
        if let Some(k) = stored
            .as_ref()
            .filter(|k| k.pod.as_deref() != pod.uid().as_deref())
        {
            // The record of the pod this one replaced.
            let gone = !owned.iter().any(|p| p.uid().as_deref() == k.pod.as_deref());
            kept::succeed(pass, cluster, &now, node, k, ready && gone).await;
            continue;
        }
        let keep = kept::to_keep(node, pod, pass.ns);
        if keep != stored && !(keep.is_none() && replaced) {
            // Kept, changed, or back in service (or drained by the host since): forgotten.
            pass.remember(&name, keep.clone());
        }
        let cordon = cordoned(&pass.ctx.caches.nodes, pod);
        tracing::debug!(pod = %pod.name_any(), uid = ?pod.uid(), k8s = ?pod.spec.as_ref().and_then(|s| s.node_name.clone()), node = %name, ?cordon, state = ?node.state, reason = %node.reason, "slurm node of a kept pod");
        let free = !node.is_drain() && !node.is_down() && node.host_may_change();
        if let Some(why) = &cordon {
            if free {
                let k8s_node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                cordons
                    .entry(cordon_reason(&k8s_node, why.as_deref()))
                    .or_default()
                    .push(name);
            }
        } else if let (Some(k), true) = (&stored, replaced) {
            if ready {
                kept::give_back(pass, cluster, &now, node, k).await;
            }
        } else if kept::pod_cordoned(pod) {
            if free {
                cordons
                    .entry(kept::pod_cordon_reason(pod))
                    .or_default()
                    .push(name);
            }
        } else if ours && (node.is_drain() || (node.is_down() && ready)) {
            // Resumed when the host also set it DOWN, else undrained.
            back[usize::from(node.is_down())].push(name);
        }
    }
    // One request per reason and per kind of return.
    for (reason, names) in cordons {
        drain_for_cordon(pass, cluster, &names, &reason).await;
    }
    for (names, resume) in back.into_iter().zip([false, true]) {
        if names.is_empty() {
            continue;
        }
        let outcome = cluster.undrain_nodes(&names, resume).await;
        report(pass, outcome, "Undrained", |list| {
            format!("Slurm nodes {list} returned to service: their pods are kept")
        })
        .await;
    }
}

/// Drain the nodes `names` of kept pods with the host's `reason` (a cordon), with an Event.
async fn drain_for_cordon(pass: &mut Pass<'_>, cluster: &Cluster, names: &[String], reason: &str) {
    let outcome = cluster.drain_nodes(names, reason).await;
    report(pass, outcome, "Draining", |list| {
        format!("Draining Slurm nodes {list}: {reason}")
    })
    .await;
}

/// A Normal Event `reason` naming the nodes an update did (`note` of their list), and the
/// failure of the others.
async fn report(
    pass: &mut Pass<'_>,
    (done, error): (Vec<String>, Option<Unavailable>),
    reason: &str,
    note: impl FnOnce(&str) -> String,
) {
    if !done.is_empty() {
        let list = crate::reconcile::core::events::name_list(&done);
        pass.core()
            .event(pass.ns, EventType::Normal, reason, note(&list))
            .await;
    }
    if let Some(u) = error {
        pass.slurm_failed(u).await;
    }
}

/// The drain reason of a cordoned Kubernetes node's Slurm nodes: the node's
/// `node-cordon-reason` annotation (control characters made spaces, at most 256 bytes), else
/// that it is cordoned.
fn cordon_reason(k8s_node: &str, annotation: Option<&str>) -> String {
    let mut reason = match annotation.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) => format!("Kubernetes node {k8s_node} is cordoned: {a}"),
        None => format!("Kubernetes node {k8s_node} is cordoned"),
    }
    .chars()
    .map(|c| if c.is_control() { ' ' } else { c })
    .collect::<String>();
    let mut end = reason.len().min(256);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.truncate(end);
    reason
}

/// `pruneSlurmNodeRecords: NodeNotFound` in DaemonSet mode (as Slinky): delete the record of each
/// Slurm node of this NodeSet (its feature is the NodeSet's Slurm name) that is DOWN and not
/// responding, whose pod is gone and that no Kubernetes node maps to any more (by its hostname).
/// A node some pod or Kubernetes node still names, or one that responds, is never touched.
pub(super) async fn prune_defunct(
    pass: &mut Pass<'_>,
    view: &SlurmView,
    owned: &[Arc<Pod>],
    nodes: &[Arc<k8s_openapi::api::core::v1::Node>],
) {
    let SlurmView::Nodes(cluster, slurm_nodes) = view else {
        return;
    };
    let feature = pass.ns.slurm_name();
    let named: std::collections::BTreeSet<String> = owned
        .iter()
        .map(|p| node_name(p))
        .chain(nodes.iter().map(|n| slinky_api::placement::hostname_of(n)))
        .collect();
    let mut defunct: Vec<&Node> = slurm_nodes
        .values()
        .filter(|n| n.features.iter().any(|f| f == &feature))
        .filter(|n| n.is_down() && n.is_not_responding() && !n.is_busy())
        .filter(|n| !named.contains(&n.name))
        .collect();
    defunct.sort_by(|a, b| a.name.cmp(&b.name));
    let mut pruned = Vec::new();
    for n in defunct {
        match cluster.delete_node(&n.name).await {
            Ok(()) => {
                if kept::stored(pass.ns, &n.name).is_some() {
                    // Its drain has no node to go back to.
                    pass.remember(&n.name, None);
                }
                pruned.push(n.name.clone());
            }
            Err(u) => {
                pass.slurm_failed(u).await;
                break;
            }
        }
    }
    pass.slurm_asked = true;
    if !pruned.is_empty() {
        pass.core()
            .event(
                pass.ns,
                EventType::Normal,
                "DefunctSlurmNodePruned",
                format!(
                    "Deleted defunct Slurm nodes {}: their pods are gone and no Kubernetes node maps to them \
                     (pruneSlurmNodeRecords: NodeNotFound)",
                    crate::reconcile::core::events::name_list(&pruned)
                ),
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cordon_reason_is_one_line_of_at_most_256_bytes() {
        assert_eq!(cordon_reason("n1", None), "Kubernetes node n1 is cordoned");
        assert_eq!(
            cordon_reason("n1", Some("disk\nfailing ")),
            "Kubernetes node n1 is cordoned: disk failing"
        );
        let long = cordon_reason("n1", Some(&"é".repeat(300)));
        assert!(long.len() <= 256 && long.starts_with("Kubernetes node n1"));
    }

    #[test]
    fn a_pod_goes_only_when_its_node_runs_nothing_and_takes_nothing() {
        let node = |state: &[&str]| Node::new("n", state, "");
        assert!(may_delete(&node(&["IDLE", "DRAIN"])));
        assert!(may_delete(&node(&["DOWN"])));
        assert!(
            !may_delete(&node(&["IDLE"])),
            "idle but not drained: a job may land"
        );
        assert!(!may_delete(&node(&["MIXED", "DRAIN"])));
        assert!(!may_delete(&node(&["IDLE", "COMPLETING", "DRAIN"])));
    }

    #[test]
    fn only_a_pending_pod_never_ran_slurmd() {
        let pod = |phase: Option<&str>| Pod {
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: phase.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!slurmd_may_run(&pod(Some("Pending"))));
        assert!(slurmd_may_run(&pod(Some("Running"))));
        assert!(slurmd_may_run(&pod(None)), "unknown: it may run");
    }
}
