//! What a NodeSet pass knows of its Controller's Slurm ([`SlurmView`]): the nodes as Slurm
//! listed them, or why Slurm cannot be asked (closed stays closed: a NodeSet that had a
//! slurmrestd and has none now is unreachable, not "no Slurm"; see [`super::drain`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::keys;
use slinky_slurm::Node;

use super::{Pass, plan::DeleteReason};
use crate::reconcile::slurm::{Cluster, Reach, Unavailable, node_name};

/// What a pass knows of its Controller's Slurm.
pub(super) enum SlurmView {
    /// No slurmrestd is configured: pods are deleted without a drain.
    Off,
    /// Configured, but it could not be asked.
    Failed(Unavailable),
    /// The nodes, by name, as Slurm listed them at the start of the pass.
    Nodes(Arc<Cluster>, HashMap<String, Node>),
}

impl SlurmView {
    /// Ask the Controller's Slurm for its nodes (at most once per Controller per
    /// [`crate::reconcile::slurm::NODES_TTL`]).
    pub(super) async fn read(pass: &Pass<'_>, controller: &slinky_api::Controller) -> SlurmView {
        match pass.ctx.slurm.reach(controller, &pass.ctx.caches).await {
            Reach::Off => SlurmView::off(pass, controller).await,
            Reach::Failed(u) => SlurmView::Failed(u),
            Reach::On(cluster) => match cluster.nodes().await {
                Ok(nodes) => {
                    let by_name = nodes.iter().map(|n| (n.name.clone(), n.clone())).collect();
                    SlurmView::Nodes(cluster, by_name)
                }
                Err(u) => SlurmView::Failed(u),
            },
        }
    }

    /// No slurmrestd is configured for `controller`: [`SlurmView::Off`] for a NodeSet that never
    /// had one (or that opts out); for one that had, Slurm is unreachable (closed stays closed).
    async fn off(pass: &Pass<'_>, controller: &slinky_api::Controller) -> SlurmView {
        if !super::has_finalizer(pass.ns, keys::FINALIZER_SLURM_NODES) {
            return SlurmView::Off;
        }
        let opted_out = pass
            .ns
            .annotations()
            .get(keys::ANNOTATION_DELETE_WITHOUT_DRAIN)
            .is_some_and(|v| v == "true");
        let controller = controller.name_any();
        if opted_out {
            let message = format!(
                "NodeSet {} had a slurmrestd and Controller {controller} has none now; its annotation \
                 {}=true lets its pods be deleted without a drain (jobs on them are killed)",
                pass.ns.name_any(),
                keys::ANNOTATION_DELETE_WITHOUT_DRAIN
            );
            let once = format!("{}/delete-without-drain", pass.ns.uid().unwrap_or_default());
            if pass.core().announced.first(&once, &message) {
                tracing::warn!(nodeset = %pass.ns.name_any(), "{message}");
                pass.core()
                    .event(pass.ns, EventType::Warning, "DeleteWithoutDrain", message)
                    .await;
            }
            return SlurmView::Off;
        }
        SlurmView::Failed(Unavailable {
            reason: "SlurmUnreachable",
            message: format!(
                "no slurmrestd is configured for Controller {controller} any more (its RestApi deleted, \
                 the RestApi's Service gone, or the --slurmrestd-url flag dropped), but NodeSet {} had one \
                 (finalizer {}): no pod that could run a job is deleted without a drain. Bring the \
                 slurmrestd back, or annotate the NodeSet {}=true to delete its pods without draining them",
                pass.ns.name_any(),
                keys::FINALIZER_SLURM_NODES,
                keys::ANNOTATION_DELETE_WITHOUT_DRAIN
            ),
        })
    }

    /// The same view read afresh from Slurm when `deletes` holds a live pod (a delete is never
    /// decided on the shared list, which may predate the pass).
    pub(super) async fn for_deletes(self, deletes: &[(Arc<Pod>, DeleteReason)]) -> SlurmView {
        if deletes.iter().any(|(_, r)| *r != DeleteReason::Finished) {
            self.fresh().await
        } else {
            self
        }
    }

    /// The same view read afresh from Slurm.
    pub(super) async fn fresh(self) -> SlurmView {
        match self {
            SlurmView::Nodes(cluster, _) => match cluster.fresh_nodes().await {
                Ok(nodes) => {
                    let by_name = nodes.iter().map(|n| (n.name.clone(), n.clone())).collect();
                    SlurmView::Nodes(cluster, by_name)
                }
                Err(u) => SlurmView::Failed(u),
            },
            view => view,
        }
    }

    /// The node of `pod`, when Slurm was asked and lists it.
    pub(super) fn node(&self, pod: &Pod) -> Option<&Node> {
        match self {
            SlurmView::Nodes(_, nodes) => nodes.get(&node_name(pod)),
            _ => None,
        }
    }

    /// The Slurm counts of `pods`' nodes (when Slurm was asked).
    pub(super) fn counts(&self, pods: &[Arc<Pod>]) -> Option<slinky_slurm::Counts> {
        let SlurmView::Nodes(_, nodes) = self else {
            return None;
        };
        Some(slinky_slurm::Counts::of(
            pods.iter().filter_map(|p| nodes.get(&node_name(p))),
        ))
    }

    /// How a rolling update ranks old pods: nodes the host is draining first (their turn has
    /// come), then idle ones, then busy ones (pod name → rank; unknown pods rank as idle).
    pub(super) fn update_ranks(&self, ns: &slinky_api::NodeSet, pods: &[Arc<Pod>]) -> BTreeMap<String, u8> {
        pods.iter()
            .map(|p| {
                let rank = match self.node(p) {
                    Some(n) if n.is_drain() && super::kept::ours(&n.reason, p, ns) => 0,
                    Some(n) if n.is_busy() => 2,
                    _ => 1,
                };
                (p.name_any(), rank)
            })
            .collect()
    }
}
