//! The NodeSet's status: replica counts computed from the owned pods, and the conditions the
//! pass decided, merged into the fresh object's on every attempt.

use std::sync::Arc;

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::ResourceExt;
use slinky_api::{NodeSet, NodeSetStatus, conditions, failure::Failure, keys};

use super::{
    Pass,
    plan::{is_available, is_running_and_ready, phase},
};
use crate::reconcile::core::{Error, status};

/// How far a pass got, for the status it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reached {
    /// It ran its writes: `ReplicaFailure` is set or cleared by them.
    Synced,
    /// It stopped at a problem of this generation (an invalid spec, a missing Controller), which
    /// the conditions report for it.
    Problem,
    /// It waited on its expectations and acted on nothing: `observedGeneration` stays the
    /// generation of the last pass that acted.
    Waiting,
}

/// The status, computed from the owned pods; conditions merged into the fresh object's on every
/// attempt. `ReplicaFailure` is left as it is unless the pass [`Reached::Synced`];
/// `observedGeneration` is this generation unless the pass was [`Reached::Waiting`].
pub(super) async fn write_status(
    pass: &mut Pass<'_>,
    owned: &[Arc<Pod>],
    revision: Option<&str>,
    reached: Reached,
) -> Result<(), Error> {
    let ns = pass.ns;
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let now = Timestamp::now();
    let live: Vec<&Arc<Pod>> = owned
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let desired = pass.desired.unwrap_or_else(|| ns.replicas().max(0));
    let available = live.iter().filter(|p| is_available(p, min_ready, now)).count() as i32;
    set_conditions(pass, available, desired, reached);
    extra_conf(pass).await;
    let old = ns.status.clone().unwrap_or_default();
    let counts = pass.slurm_counts.unwrap_or(slinky_slurm::Counts {
        idle: old.slurm_idle,
        allocated: old.slurm_allocated,
        down: old.slurm_down,
        drain: old.slurm_drain,
    });
    let selector: Vec<String> = ns
        .selector_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let status = NodeSetStatus {
        replicas: live.iter().filter(|p| !phase(p).is_empty()).count() as i32,
        updated_replicas: revision.map_or(0, |r| {
            live.iter()
                .filter(|p| p.labels().get(keys::LABEL_REVISION_HASH).map(String::as_str) == Some(r))
                .count() as i32
        }),
        ready_replicas: live.iter().filter(|p| is_running_and_ready(p)).count() as i32,
        available_replicas: available,
        unavailable_replicas: (desired - available).max(0),
        desired,
        slurm_idle: counts.idle,
        slurm_allocated: counts.allocated,
        slurm_down: counts.down,
        slurm_drain: counts.drain,
        observed_generation: ns.metadata.generation,
        node_set_hash: revision
            .map(str::to_string)
            .or_else(|| ns.status.as_ref().and_then(|s| s.node_set_hash.clone())),
        selector: Some(selector.join(",")),
        conditions: Vec::new(),
        ordinal_to_node: Default::default(),
        kept_drains: Default::default(),
    };
    let kept = pass.kept.clone();
    // pinToNode: where each ordinal's pod runs now, added to what the status remembers.
    let placed: Vec<(String, String)> = if ns.spec.pin_to_node {
        live.iter()
            .filter_map(|p| {
                let ordinal = ns.pod_ordinal(&p.name_any())?;
                let node = p.spec.as_ref()?.node_name.clone()?;
                Some((ordinal.to_string(), node))
            })
            .collect()
    } else {
        Vec::new()
    };
    let compute = move |obj: &NodeSet, conditions| {
        let current = obj.status.as_ref();
        let mut ordinal_to_node = current.map(|s| s.ordinal_to_node.clone()).unwrap_or_default();
        ordinal_to_node.extend(placed.iter().cloned());
        // The drains kept (see `kept`), with this pass' changes.
        let mut kept_drains = current.map(|s| s.kept_drains.clone()).unwrap_or_default();
        for (node, drain) in &kept {
            match drain {
                Some(d) => kept_drains.insert(node.clone(), d.clone()),
                None => kept_drains.remove(node),
            };
        }
        NodeSetStatus {
            ordinal_to_node,
            kept_drains,
            conditions,
            observed_generation: match reached {
                Reached::Waiting => current.and_then(|s| s.observed_generation),
                Reached::Synced | Reached::Problem => status.observed_generation,
            },
            ..status.clone()
        }
    };
    status::write(pass.core(), ns, &pass.state.conditions, compute).await?;
    Ok(())
}

/// `ExtraConfIgnored` while `extraConf` has a malformed item (a Warning Event when it starts).
async fn extra_conf(pass: &mut Pass<'_>) {
    let ns = pass.ns;
    match ns.extra_conf_problem() {
        Some(message) => {
            let was = pass
                .state
                .current()
                .iter()
                .any(|c| c.type_ == conditions::EXTRA_CONF_IGNORED && c.status == "True");
            if !was {
                pass.core()
                    .event(
                        ns,
                        kube::runtime::events::EventType::Warning,
                        "ExtraConfIgnored",
                        message.clone(),
                    )
                    .await;
            }
            pass.state
                .conditions
                .set(conditions::EXTRA_CONF_IGNORED, true, "MalformedItem", message);
        }
        None => pass.state.conditions.clear(conditions::EXTRA_CONF_IGNORED),
    }
}

/// The host's conditions after a pass: the problem that stopped it, `Ready` from the available
/// pods, the refused pod and child writes, Slurm's failure (each cleared by a pass that got far
/// enough to know).
fn set_conditions(pass: &mut Pass<'_>, available: i32, desired: i32, reached: Reached) {
    let c = &mut pass.state.conditions;
    for t in [
        conditions::INVALID_SPEC,
        conditions::BUILDER_FAILED,
        conditions::CONTROLLER_NOT_FOUND,
    ] {
        c.clear(t);
    }
    match &pass.state.problem {
        Some(f) => c.set_problem(f),
        None => {
            let ok = available >= desired;
            c.set(
                conditions::READY,
                ok,
                if ok { "AllPodsAvailable" } else { "PodsUnavailable" },
                format!("{available}/{desired} pods available"),
            );
        }
    }
    if let Some(f) = Failure::first_of(&pass.failures, " refused writes") {
        c.set_failure(&f);
    } else if reached == Reached::Synced && pass.state.problem.is_none() {
        c.clear(conditions::REPLICA_FAILURE);
    }
    if let Some(f) = Failure::first_of(&pass.child_failures, "") {
        c.set_failure(&f);
    } else if pass.children_synced {
        c.clear(conditions::CHILD_FAILURE);
    }
    match &pass.slurm_failure {
        Some(f) => c.set_failure(f),
        None if pass.slurm_asked => c.clear(conditions::SLURM_FAILURE),
        None => {}
    }
}
