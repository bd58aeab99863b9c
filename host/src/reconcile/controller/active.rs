//! The `controller.slinky.slurm.net/active=true` label of a Controller's slurmctld pods: an HA
//! Controller's Service selects it, so it must be on exactly the slurmctld that is in charge.
//!
//! # Rules
//! * With a slurmrestd ([`super::slurm`]), the active pod is the slurmctld in control: the first
//!   in `SlurmctldHost` order that answers `ping` (the primary while it is up, else the backup
//!   that took over); the label is added to it before it is taken from the
//!   others (the Service never selects nobody because of a move). The pass comes back every
//!   [`HA_RECHECK`], so a fail-over moves the label within seconds.
//! * Without one (or when it answers with no responding primary, or cannot be asked), a label
//!   already on a live pod stays; when no live pod has it, pod 0 gets it (as Slinky does
//!   without a Slurm client), so the Service always has an endpoint to try.
//! * Without HA there is one slurmctld pod, and it carries the label (as Slinky labels it): the
//!   bundled builder's Service selects no `active` label then, but a Service that Slinky's
//!   operator made (v1.2.2 on selects `active=true` with or without HA) and the host adopted keeps
//!   that selector, which only its first manager can drop: without the label a new slurmctld pod
//!   would be no endpoint of it. Nothing is asked of Slurm, and nothing is looked at again once
//!   the label is on (the pod's StatefulSet changes when the pod is replaced, and that runs the
//!   Controller's pass); a write that did not land is tried again after [`HA_RECHECK`].

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::{Controller, keys};

use super::ControllerContext;
use crate::reconcile::{core::writer, slurm::Reach};

/// How often an HA Controller's primary is asked for.
pub const HA_RECHECK: Duration = Duration::from_secs(5);

/// The Controller's live slurmctld pods, by ordinal.
fn slurmctld_pods(ctx: &ControllerContext, c: &Controller) -> Vec<Arc<Pod>> {
    let ns = c.namespace().unwrap_or_default();
    let selector = c.selector_labels();
    let prefix = format!("{}-", c.controller_key());
    let mut pods: Vec<Arc<Pod>> = ctx
        .caches
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
        .filter(|p| p.name_any().starts_with(&prefix))
        .collect();
    pods.sort_by_key(|p| {
        p.name_any()
            .strip_prefix(&prefix)
            .and_then(|o| o.parse::<u32>().ok())
            .unwrap_or(u32::MAX)
    });
    pods
}

fn is_active(p: &Pod) -> bool {
    p.labels()
        .get(keys::LABEL_CONTROLLER_ACTIVE)
        .is_some_and(|v| v == "true")
}

fn hostname(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| p.name_any())
}

/// Label the active slurmctld pod. Returns when to look again (`None` without HA). Refused
/// writes are Warning Events (the next look retries them).
pub(super) async fn sync_active(ctx: &ControllerContext, c: &Controller) -> Option<Duration> {
    if c.spec.external {
        return None;
    }
    let pods = slurmctld_pods(ctx, c);
    super::stuck::replace_stuck(ctx, c, &pods).await;
    if !c.ha_enabled() {
        // A write that did not land is tried again soon, not at the next resync.
        let landed = match pods.first() {
            Some(pod) => move_label(ctx, c, &pods, pod).await,
            None => true,
        };
        return (!landed).then_some(HA_RECHECK);
    }
    if pods.is_empty() {
        return Some(HA_RECHECK);
    }
    let primary = match ctx.slurm.reach(c, &ctx.caches).await {
        Reach::On(cluster) => match cluster.client().ping().await {
            Ok(pings) => slinky_slurm::in_control(&pings).map(|p| p.hostname.clone()),
            Err(e) => {
                // Re-asked every few seconds: a warning only while no pod carries the label.
                if pods.iter().any(|p| is_active(p)) {
                    tracing::debug!(controller = %c.name_any(), "cannot ask Slurm which slurmctld is primary: {e}");
                } else {
                    tracing::warn!(controller = %c.name_any(), "cannot ask Slurm which slurmctld is primary: {e}");
                }
                None
            }
        },
        Reach::Off | Reach::Failed(_) => None,
    };
    let active = match primary.and_then(|h| pods.iter().find(|p| hostname(p) == h)) {
        Some(p) => p.clone(),
        None => match pods.iter().find(|p| is_active(p)) {
            Some(p) => p.clone(),
            None => pods[0].clone(),
        },
    };
    move_label(ctx, c, &pods, &active).await;
    Some(HA_RECHECK)
}

/// Put the label on `active` and take it from the other `pods`: added first, then taken away,
/// so the Service keeps an endpoint throughout. Whether every write landed.
async fn move_label(ctx: &ControllerContext, c: &Controller, pods: &[Arc<Pod>], active: &Arc<Pod>) -> bool {
    let core = ctx.core.as_ref();
    let mut landed = true;
    let mut writes: Vec<(Arc<Pod>, Option<&str>)> = Vec::new();
    if !is_active(active) {
        writes.push((active.clone(), Some("true")));
    }
    for p in pods
        .iter()
        .filter(|p| is_active(p) && p.name_any() != active.name_any())
    {
        writes.push((p.clone(), None));
    }
    for (pod, value) in writes {
        let r = core
            .writer
            .set_pod_label(&pod, keys::LABEL_CONTROLLER_ACTIVE, value)
            .await;
        if let Err(e) = &r
            && writer::is_conflict(e)
        {
            // Decided on a stale cache: the next look decides on the fresh pod.
            tracing::debug!(pod = %pod.name_any(), "active label not moved: {e}");
            return false;
        }
        if let Err(e) = r {
            let adding = value.is_some();
            core.event(
                c,
                EventType::Warning,
                "FailedUpdate",
                format!(
                    "Error {} {} on pod {}: {}",
                    if adding { "setting" } else { "removing" },
                    keys::LABEL_CONTROLLER_ACTIVE,
                    pod.name_any(),
                    writer::message(&e)
                ),
            )
            .await;
            if adding {
                // The new active pod has no label: the old one keeps it (the Service keeps an
                // endpoint) until the next look.
                return false;
            }
            landed = false;
        } else if value.is_some() {
            tracing::info!(controller = %c.name_any(), pod = %pod.name_any(), "slurmctld pod is active");
        }
    }
    landed
}
