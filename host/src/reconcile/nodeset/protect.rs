//! What Slurm says of the pods that stay, written on them: the `SlurmNodeState*` conditions,
//! `nodeset.slinky.slurm.net/pod-protect=true` on exactly the pods whose node is busy (with
//! `workloadDisruptionProtection`, the default: the workers' PodDisruptionBudget selects them, so
//! an eviction waits for their jobs), and `pod-deadline` (when the busy node's jobs end).
//! [`super::drain::sync_kept`] writes them at each pass that reads the node list;
//! [`refresh_protection`] at the passes that do not sync their pods.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use slinky_api::keys;
use slinky_slurm::Node;

use super::{Pass, slurm_conditions, slurm_view::SlurmView};
use crate::reconcile::{core::writer, slurm::node_name};

/// The pod's `SlurmNodeState*` conditions made to match its node. A refused `test` (the
/// kubelet wrote meanwhile) is left to the next pass.
pub(super) async fn write_conditions(pass: &mut Pass<'_>, pod: &Pod, node: &Node) -> Option<Pod> {
    let conditions = slurm_conditions::desired(pod, node, k8s_openapi::jiff::Timestamp::now())?;
    let patch = slurm_conditions::patch(pod, &conditions);
    match pass.core().writer.patch_pod_status(pod, patch).await {
        Ok(p) => return Some(p),
        Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 422 || s.code == 409) => {
            tracing::debug!(pod = %pod.name_any(), "pod conditions changed meanwhile: {e}");
        }
        Err(e) => {
            pass.failed(
                "FailedUpdate",
                format!(
                    "Error writing the Slurm conditions of pod {}: {}",
                    pod.name_any(),
                    writer::message(&e)
                ),
            )
            .await;
        }
    }
    None
}

/// `pod-protect` on the busy pods and off the others, from the Controller's shared node list,
/// for a pass that does not sync its pods (the NodeSet is `InvalidSpec`, waits on its
/// expectations, or its builder fails): a job that starts meanwhile is protected all the same.
pub(super) async fn refresh_protection(
    pass: &mut Pass<'_>,
    controller: &slinky_api::Controller,
    owned: &[Arc<Pod>],
) {
    let view = SlurmView::read(pass, controller).await;
    let SlurmView::Nodes(_, nodes) = &view else {
        return;
    };
    pass.watches_slurm = true;
    let protect = pass.ns.spec.workload_disruption_protection.unwrap_or(true);
    for pod in owned.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        if let Some(node) = nodes.get(&node_name(pod)) {
            set_protect(pass, pod, protect && node.is_busy()).await;
        }
    }
}

/// `pod-deadline` on the pod: when its node's jobs end (Slinky's annotation, RFC 3339), none
/// when the node is idle or a job has no end.
pub(super) async fn set_deadline(pass: &mut Pass<'_>, pod: &Pod, deadline: Option<slinky_slurm::Deadline>) {
    let want = match deadline {
        Some(slinky_slurm::Deadline::At(t)) => k8s_openapi::jiff::Timestamp::from_second(t)
            .ok()
            .map(|t| t.to_string()),
        _ => None,
    };
    let have = pod.annotations().get(keys::ANNOTATION_POD_DEADLINE);
    if have == want.as_ref() {
        return;
    }
    match pass
        .core()
        .writer
        .set_pod_annotation(pod, keys::ANNOTATION_POD_DEADLINE, want.as_deref())
        .await
    {
        Ok(_) => {}
        Err(e) if writer::is_conflict(&e) => pass.retry_soon = true,
        Err(e) => {
            pass.failed(
                "FailedUpdate",
                format!(
                    "Error setting {} on pod {}: {}",
                    keys::ANNOTATION_POD_DEADLINE,
                    pod.name_any(),
                    writer::message(&e)
                ),
            )
            .await;
        }
    }
}

/// `pod-protect=true` on the pod when `want`, off otherwise.
pub(super) async fn set_protect(pass: &mut Pass<'_>, pod: &Pod, want: bool) -> Option<Pod> {
    let has = pod
        .labels()
        .get(keys::LABEL_POD_PROTECT)
        .is_some_and(|v| v == "true");
    if want == has {
        return None;
    }
    let value = want.then_some("true");
    match pass
        .core()
        .writer
        .set_pod_label(pod, keys::LABEL_POD_PROTECT, value)
        .await
    {
        Ok(p) => Some(p),
        Err(e) if writer::is_conflict(&e) => {
            // The pod changed since the cache showed it: look again soon, not in 20 s.
            pass.retry_soon = true;
            None
        }
        Err(e) => {
            pass.failed(
                "FailedUpdate",
                format!(
                    "Error setting {} on pod {}: {}",
                    keys::LABEL_POD_PROTECT,
                    pod.name_any(),
                    writer::message(&e)
                ),
            )
            .await;
            None
        }
    }
}
