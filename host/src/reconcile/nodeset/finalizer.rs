//! The NodeSet's finalizer (`nodeset.slinky.slurm.net/slurm-nodes`): a deleted NodeSet stays,
//! and with it its partition in `slurm.conf`, until no job runs on its Slurm nodes (Slinky's #138:
//! slurmctld crashed reconfiguring away nodes that still had job records).
//!
//! # Rules
//! * A NodeSet whose Controller has a slurmrestd gets the finalizer at its first pass that asks
//!   Slurm; without one it gets none. The finalizer also records that it had one: when the
//!   slurmrestd is gone later (a RestApi deleted, a flag dropped), Slurm is unreachable for it,
//!   not absent, and the finalizer stays while it is deleted (closed stays closed, see
//!   [`super::drain`]), unless the NodeSet's annotation `delete-without-drain=true` gives up.
//! * Deleted: its partition is closed first (the Controller's `slurm.conf` gives it
//!   `State=DRAIN`: submissions to it are refused, the jobs queued there still run). While any
//!   job waits in it, its nodes are not drained (they are where those jobs run). Then every node
//!   of its pods is drained (reason `slurm-operator: NodeSet … is being
//!   deleted`, so no job lands there) and the finalizer is removed once none is busy; the
//!   garbage collector then deletes the pods and the Controller rewrites `slurm.conf`. Decided
//!   on a fresh node list; a running pod's node that Slurm does not list counts as busy until it
//!   is listed again or has been missing for longer than `SlurmdTimeout` (absence is not evidence).
//! * When Slurm cannot be asked the finalizer stays (fail closed), with the `SlurmFailure`
//!   condition and an Event saying why; remove it by hand to give up on the jobs.
//! * The finalizer goes only once the nodes have been seen idle and drained for
//!   [`RELEASE_SETTLE`]: its removal rewrites `slurm.conf`, which restarts slurmctld (without
//!   in-place reconfigure) a second or two later, and slurmctld must have saved the end of the
//!   last job by then.
//! * Only background deletion waits: `--cascade=foreground` deletes the pods first, as for any
//!   owner.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use slinky_api::{Controller, keys::FINALIZER_SLURM_NODES};

use super::{
    Pass,
    drain::{Unlisted, unlisted_pod},
    has_finalizer,
    slurm_view::SlurmView,
};
use crate::reconcile::{
    core::writer,
    slurm::{Unavailable, node_name},
};

/// Add the finalizer `key` to the NodeSet; whether it was written (a conflict waits for the next
/// pass, which sees the fresh NodeSet).
pub(super) async fn add(pass: &mut Pass<'_>, key: &str) -> bool {
    let mut finalizers = pass.ns.finalizers().to_vec();
    finalizers.push(key.to_string());
    write(pass, finalizers).await
}

/// Remove the finalizer `key` from the NodeSet; whether it was written.
pub(super) async fn remove(pass: &mut Pass<'_>, key: &str) -> bool {
    let finalizers: Vec<String> = pass
        .ns
        .finalizers()
        .iter()
        .filter(|f| *f != key)
        .cloned()
        .collect();
    write(pass, finalizers).await
}

/// Write the finalizers; whether they were written.
async fn write(pass: &mut Pass<'_>, finalizers: Vec<String>) -> bool {
    match pass.core().writer.set_finalizers(pass.ns, &finalizers).await {
        Ok(_) => true,
        // Written on a NodeSet that changed meanwhile: the next pass sees the fresh one.
        Err(e) if writer::is_conflict(&e) => false,
        Err(e) => {
            pass.failed(
                "FailedUpdate",
                format!(
                    "Error writing the finalizers of NodeSet {}: {}",
                    pass.ns.name_any(),
                    writer::message(&e)
                ),
            )
            .await;
            false
        }
    }
}

/// A live NodeSet whose Slurm is configured gets the finalizer.
pub(super) async fn ensure(pass: &mut Pass<'_>, view: &SlurmView) {
    if matches!(view, SlurmView::Off) || has_finalizer(pass.ns, FINALIZER_SLURM_NODES) {
        return;
    }
    add(pass, FINALIZER_SLURM_NODES).await;
}

/// A deleted NodeSet's partition is closed (`State=DRAIN` in `slurm.conf`: no job is queued
/// there any more) but the jobs queued there before still run on its nodes: while any waits, its
/// nodes are not drained, and this returns true (or when Slurm cannot be asked).
async fn queued_first(pass: &mut Pass<'_>, cluster: &crate::reconcile::slurm::Cluster) -> bool {
    if !pass.ns.spec.partition.as_ref().is_some_and(|p| p.enabled) {
        return false;
    }
    let partition = pass.ns.slurm_name();
    match cluster.pending_in(&partition).await {
        Ok(pending) if pending.is_empty() => false,
        Ok(pending) => {
            pass.waits_for_slurm = true;
            let ids: Vec<String> = pending.iter().map(u64::to_string).collect();
            let note = format!(
                "NodeSet {} is being deleted: its partition {partition} takes no new job, and the {} \
                 job(s) queued there ({}) run first; then its nodes are drained (scancel them to go \
                 sooner, or remove the finalizer {FINALIZER_SLURM_NODES} to give up on them)",
                pass.ns.name_any(),
                pending.len(),
                crate::reconcile::core::events::name_list(&ids)
            );
            pass.core()
                .event(
                    pass.ns,
                    kube::runtime::events::EventType::Normal,
                    "QueuedJobsFirst",
                    note,
                )
                .await;
            true
        }
        Err(u) => {
            pass.slurm_failed(u).await;
            true
        }
    }
}

/// How long a deleted NodeSet's nodes must have been seen idle and drained before its finalizer
/// goes. On the real node, slurmctld restarted 1 s after a job's end (the finalizer's removal
/// rewrote `slurm.conf`) and in 2 of 6 deletions recovered that job from its saved state as still
/// running: `COMPLETING` on nodes then gone, requeued minutes later, to run again. slurmctld saves
/// a changed job within 5 s (`SAVE_MAX_WAIT`): twice that.
pub const RELEASE_SETTLE: Duration = Duration::from_secs(10);

/// When each deleted NodeSet (by uid) was first seen with every node idle and drained.
#[derive(Debug, Default)]
pub(crate) struct Settling(Mutex<HashMap<String, Instant>>);

impl Settling {
    /// How long `uid` must still wait, first seen settled now if it was not (`None`: release).
    fn remaining(&self, uid: &str, now: Instant) -> Option<Duration> {
        let mut seen = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let since = *seen.entry(uid.to_string()).or_insert(now);
        let waited = now.saturating_duration_since(since);
        if waited >= RELEASE_SETTLE {
            seen.remove(uid);
            None
        } else {
            Some(RELEASE_SETTLE - waited)
        }
    }

    /// `uid` is not settled (a node busy or drained just now), or gone.
    pub(crate) fn forget(&self, uid: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(uid);
    }
}

/// A deleted NodeSet: drain its nodes and remove the finalizer once no job runs there (at a
/// pass that drained nothing: a job may have landed on a node between the list and its drain).
/// Returns whether the finalizer was removed.
pub(super) async fn finalize(
    pass: &mut Pass<'_>,
    controller: Option<&Controller>,
    owned: &[Arc<Pod>],
) -> bool {
    if !has_finalizer(pass.ns, FINALIZER_SLURM_NODES) {
        return true;
    }
    let Some(controller) = controller else {
        return remove(pass, FINALIZER_SLURM_NODES).await;
    };
    // Released only on a fresh list, as every delete is decided.
    let view = SlurmView::read(pass, controller).await.fresh().await;
    let release = match &view {
        SlurmView::Off => true,
        SlurmView::Failed(u) => {
            pass.slurm_asked = true;
            let message = format!(
                "NodeSet {} is being deleted; it stays, and its nodes in slurm.conf, until Slurm can be \
                 asked whether jobs run there (remove the finalizer {FINALIZER_SLURM_NODES} to give up on \
                 them): {}",
                pass.ns.name_any(),
                u.message
            );
            pass.slurm_failed(Unavailable {
                reason: u.reason,
                message,
            })
            .await;
            false
        }
        SlurmView::Nodes(cluster, nodes) => {
            pass.slurm_asked = true;
            if queued_first(pass, cluster).await {
                return false;
            }
            let mut busy = Vec::new();
            let (mut to_drain, mut drained) = (Vec::new(), Vec::<String>::new());
            for pod in owned.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
                let name = node_name(pod);
                let Some(node) = nodes.get(&name) else {
                    // Absence is not evidence (slurmctld may have just restarted).
                    if let Unlisted::Wait { .. } = unlisted_pod(cluster, controller, pod, &name) {
                        busy.push(name);
                    }
                    continue;
                };
                if !node.is_drain() && !node.is_down() && node.host_may_change() {
                    to_drain.push(name.clone());
                }
                if node.is_busy() {
                    busy.push(name);
                }
            }
            if !to_drain.is_empty() {
                // One request for every node of the NodeSet.
                let why = super::kept::deletion_reason(pass.ns);
                let (done, error) = cluster.drain_nodes(&to_drain, &why).await;
                drained = done;
                if let Some(u) = error {
                    pass.slurm_failed(u).await;
                }
            }
            pass.draining(&drained, "the NodeSet is deleted").await;
            // Nodes still busy, or drained just now (the finalizer goes at a later pass that
            // drains nothing): look again within seconds, not at the next resync.
            if !busy.is_empty() || !drained.is_empty() {
                pass.waits_for_slurm = true;
            }
            let settling = &pass.ctx.settling;
            if busy.is_empty() && drained.is_empty() && pass.slurm_failure.is_some() {
                // A call that failed (a drain refused, slurmrestd slow) is no sight of a job:
                // the clock keeps running, the release waits for a pass without failure.
                false
            } else if busy.is_empty() && drained.is_empty() {
                match settling.remaining(&pass.uid, Instant::now()) {
                    None => true,
                    Some(wait) => {
                        tracing::debug!(
                            ?wait,
                            "the deleted NodeSet's nodes are idle: its finalizer goes once they stay so"
                        );
                        pass.come_back_within(wait);
                        false
                    }
                }
            } else {
                tracing::debug!(?busy, ?drained, "the deleted NodeSet's nodes are not settled");
                settling.forget(&pass.uid);
                false
            }
        }
    };
    if release {
        return remove(pass, FINALIZER_SLURM_NODES).await;
    }
    false
}
