//! A slurmctld pod that never started, on a revision its StatefulSet has left, is replaced.
//!
//! The StatefulSet controller rolls a pod only once every pod is Running and Ready, so a pod
//! stuck on a broken revision (an image that cannot be pulled, an init container that never
//! ends) stays forever after its Controller's spec is fixed (kubernetes/kubernetes#67250: "forced
//! rollback"), and Slinky's Controller with it. A pod still Pending never started slurmctld: no
//! state, no job, no client is lost by deleting it, and the StatefulSet recreates it from the
//! revision it updates to. A pod that ran is never touched here (its replacement is a slurmctld
//! restart, the StatefulSet's to order).

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::StatefulSet, core::v1::Pod};
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::Controller;

use super::ControllerContext;
use crate::reconcile::core::writer;

/// The pods of `sts` to replace: on a revision other than its `updateRevision`, and Pending.
pub(super) fn stuck<'a>(sts: &StatefulSet, pods: &'a [Arc<Pod>]) -> Vec<&'a Arc<Pod>> {
    let Some(update) = sts.status.as_ref().and_then(|s| s.update_revision.as_deref()) else {
        return Vec::new();
    };
    pods.iter()
        .filter(|p| {
            let revision = p.labels().get("controller-revision-hash").map(String::as_str);
            let pending = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
            pending && revision.is_some_and(|r| r != update) && p.metadata.deletion_timestamp.is_none()
        })
        .collect()
}

/// Delete the Controller's stuck slurmctld pods (see the module); a Normal Event says which
/// and why, a refused delete is a Warning Event (the next pass tries again).
pub(super) async fn replace_stuck(ctx: &ControllerContext, c: &Controller, pods: &[Arc<Pod>]) {
    let ns = c.namespace().unwrap_or_default();
    let Some(sts) = ctx
        .caches
        .children
        .statefulsets
        .state()
        .into_iter()
        .find(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.name_any() == c.controller_key())
    else {
        return;
    };
    for pod in stuck(&sts, pods) {
        let core = ctx.core.as_ref();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        match core.writer.delete_pod(&ns, &pod.name_any(), uid).await {
            Ok(true) => {
                core.event(
                    c,
                    EventType::Normal,
                    "ReplacedUnstartedPod",
                    format!(
                        "Deleted pod {}: it never started (Pending) and its revision is not the StatefulSet's \
                         current one; the StatefulSet recreates it from the new revision (it would wait for it \
                         forever)",
                        pod.name_any()
                    ),
                )
                .await;
            }
            Ok(false) => {}
            Err(e) => {
                core.event(
                    c,
                    EventType::Warning,
                    "FailedDelete",
                    format!(
                        "Error deleting the unstarted pod {}: {}",
                        pod.name_any(),
                        writer::message(&e)
                    ),
                )
                .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::{apps::v1::StatefulSetStatus, core::v1::PodStatus};

    fn pod(name: &str, revision: &str, phase: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some([("controller-revision-hash".to_string(), revision.to_string())].into());
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        Arc::new(p)
    }

    #[test]
    fn only_a_pending_pod_of_a_left_revision_is_stuck() {
        let sts = StatefulSet {
            status: Some(StatefulSetStatus {
                update_revision: Some("new".into()),
                current_revision: Some("old".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods = [
            pod("a", "old", "Pending"),
            pod("b", "old", "Running"),
            pod("c", "new", "Pending"),
        ];
        let names: Vec<String> = stuck(&sts, &pods).iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["a"]);
        assert!(
            stuck(&StatefulSet::default(), &pods).is_empty(),
            "no status: nothing known"
        );
    }
}
