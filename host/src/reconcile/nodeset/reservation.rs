//! `updateStrategy.type: ScheduledUpdate`: the NodeSet's Slurm maintenance reservation
//! (`SlurmOperatorMaint-<nodeset>`), kept by the host through slurmrestd, and which old pods its
//! window lets go.
//!
//! # Rules
//! * The reservation has the flags `MAINT` and `IGNORE_JOBS` (and the spec's), the user `slurm`,
//!   the window's start and end, and the Slurm nodes of the NodeSet's pods (those Slurm lists).
//!   It is created while the window has not ended; a window that has begun is reserved from now
//!   (Slurm refuses a start more than ten minutes past). Its nodes follow the NodeSet's (a
//!   scale-out adds, a scale-in removes, a replaced pod keeps its node). Times that differ from
//!   the spec are updated while the reservation has not begun; once it has, only its end can
//!   move, else it is deleted and created again; so are other flags or users.
//! * A one-off window ends by itself: once Slurm removed it, the host does not make it again
//!   (Slinky needs a status condition's transition time to know; the window's end is enough).
//! * A recurring window (`HOURLY`, `DAILY`, `WEEKLY`, `WEEKDAY`, `WEEKEND`, as Slinky serves
//!   them) is compared occurrence by occurrence: the host wants the occurrence open now or the
//!   next ([`slinky_api::scheduled::Window::at`]), which is what Slurm's reservation shows once it
//!   advanced it; one whose occurrence just ended is left for Slurm to advance.
//! * It is deleted when the strategy changes away, when the NodeSet has no pod to update (scaled
//!   to 0), and when the NodeSet is deleted. The finalizer
//!   `nodeset.slinky.slurm.net/reservation` is on the NodeSet from before the reservation is
//!   created until the host saw it gone: a deleted NodeSet stays until its reservation is deleted,
//!   which happens once its Slurm nodes are released (so not while slurmctld restarts for the
//!   closed partition), and the finalizer goes at a later pass that sees it gone.
//!   When Slurm cannot be asked the finalizer stays (fail closed), with `SlurmFailure` and an
//!   Event; without any slurmrestd (or Controller) there is nothing to delete, and it goes.
//! * While the reservation is active (its start and end, as Slurm reports them, around now),
//!   the healthy old pods whose Slurm nodes it holds are replaced, all of them, through the drain
//!   gate (no job is lost: a busy node is drained and its pod waits for the jobs). Unhealthy old
//!   pods are replaced at once, as Slinky; outside the window no healthy pod is.
//! * `ReservationCreated` says whether the reservation exists (`Scheduled`, `Active`) or why not
//!   (`WindowOver`, `NoSlurmNodes`, `NoReplicas`, `NoSlurmrestd`, `SlurmFailure`); it is removed
//!   with another strategy.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::{Controller, conditions, keys, scheduled::Window};
use slinky_slurm::{Reservation, ReservationRequest};

use super::{Pass, finalizer, has_finalizer, slurm_view::SlurmView};
use crate::reconcile::slurm::{Cluster, Reach, SLURM_USER, Unavailable, node_name};

/// Whether the host sets or compares the flag `f` (Slurm adds others, e.g. `SPEC_NODES`, which
/// are left out of the comparison).
fn compared(f: &str) -> bool {
    slinky_api::scheduled::ALLOWED_FLAGS.contains(&f)
        || slinky_api::scheduled::RECURRING_FLAGS
            .iter()
            .any(|(r, _)| *r == f)
}

/// The reservation the NodeSet should have now.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wanted {
    name: String,
    window: Window,
    /// Slurm node names, sorted, without duplicates.
    nodes: Vec<String>,
}

/// What the host does to the reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// It is as wanted (or there is none and none is wanted).
    Keep,
    /// Create it.
    Create(ReservationRequest),
    /// Change the fields set.
    Update(ReservationRequest),
    /// Delete it, then create it again when `Some`.
    Delete(Option<ReservationRequest>),
}

/// Compare `wanted` with `actual` at `now` (Unix seconds). Pure.
fn decide(wanted: Option<&Wanted>, actual: Option<&Reservation>, now: i64) -> Step {
    let Some(w) = wanted else {
        return match actual {
            Some(_) => Step::Delete(None),
            None => Step::Keep,
        };
    };
    let create = || ReservationRequest {
        name: w.name.clone(),
        start_time: Some(w.window.start.max(now)),
        end_time: Some(w.window.end),
        flags: w.window.flags.clone(),
        users: vec![SLURM_USER.to_string()],
        nodes: Some(w.nodes.clone()),
    };
    if w.window.is_over(now) {
        // Slurm removes a reservation whose end passed; one for another window goes.
        return match actual {
            Some(a) if a.end_time != Some(w.window.end) => Step::Delete(None),
            _ => Step::Keep,
        };
    }
    if w.nodes.is_empty() {
        // No Slurm node to reserve yet (Slurm refuses an empty reservation): keep what is there.
        return Step::Keep;
    }
    let Some(a) = actual else {
        return Step::Create(create());
    };
    let mut flags: Vec<String> = a
        .flags
        .iter()
        .map(|f| f.to_ascii_uppercase())
        .filter(|f| compared(f))
        .collect();
    flags.sort();
    flags.dedup();
    let users: Vec<&str> = a
        .users
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    if flags != w.window.flags || users != [SLURM_USER] {
        return Step::Delete(Some(create()));
    }
    if w.window.recurs.is_some() && a.end_time.is_some_and(|e| e <= now) {
        // An occurrence just ended: Slurm moves the reservation to the next one itself.
        return Step::Keep;
    }
    // A window that had begun when the reservation was made is reserved from then.
    let start_ok =
        a.start_time == Some(w.window.start) || a.start_time.is_some_and(|s| w.window.start < s && s <= now);
    let end_ok = a.end_time == Some(w.window.end);
    let begun = a.start_time.is_none_or(|s| s <= now);
    let mut update = ReservationRequest {
        name: a.name.clone(),
        ..Default::default()
    };
    if !start_ok {
        if begun {
            // Slurm cannot move the start of a reservation that has begun.
            return Step::Delete(Some(create()));
        }
        update.start_time = Some(w.window.start.max(now));
        update.end_time = Some(w.window.end);
    } else if !end_ok {
        update.end_time = Some(w.window.end);
    }
    // A node list this host cannot read is not rewritten every pass: its nodes are left as
    // Slurm has them (logged).
    match a.nodes() {
        Ok(mut held) => {
            held.sort();
            held.dedup();
            if held != w.nodes {
                update.nodes = Some(w.nodes.clone());
            }
        }
        Err(e) => tracing::warn!(reservation = %a.name, nodes = %a.node_list, error = %e,
            "cannot read the reservation's node list; its nodes are not compared"),
    }
    if update.start_time.is_none() && update.end_time.is_none() && update.nodes.is_none() {
        Step::Keep
    } else {
        Step::Update(update)
    }
}

/// The pods (by name) whose Slurm nodes `r` holds while it is active at `now`.
fn in_window(r: &Reservation, owned: &[Arc<Pod>], now: i64) -> BTreeSet<String> {
    if !r.is_active(now) {
        return BTreeSet::new();
    }
    let held: BTreeSet<String> = r.nodes().unwrap_or_default().into_iter().collect();
    owned
        .iter()
        .filter(|p| held.contains(&node_name(p)))
        .map(|p| p.name_any())
        .collect()
}

/// A Unix time as RFC 3339.
fn at(t: i64) -> String {
    Timestamp::from_second(t).map_or_else(|_| t.to_string(), |t| t.to_string())
}

/// The NodeSet's reservation kept in step with its spec and pods (see the module's rules), for a
/// live NodeSet. Returns the pods an update may replace now: `None` without `ScheduledUpdate`.
pub(super) async fn sync(
    pass: &mut Pass<'_>,
    view: &SlurmView,
    owned: &[Arc<Pod>],
) -> Option<BTreeSet<String>> {
    let ns = pass.ns;
    let name = ns.reservation_name();
    let now = Timestamp::now().as_second();
    let window = match ns.maintenance_window() {
        // A recurring window: the occurrence open now, or the next.
        Some(Ok(w)) => Some(w.at(now)),
        // Checked before the pass got here.
        Some(Err(_)) => return Some(BTreeSet::new()),
        None => None,
    };
    let scheduled = window.is_some();
    let (cluster, slurm_nodes) = match view {
        SlurmView::Nodes(cluster, nodes) => (cluster.clone(), nodes),
        SlurmView::Off => {
            // A finalizer stays: the reservation it guards may still be in Slurm (a RestApi
            // deleted or being replaced), and the pass that can ask again deletes what is not
            // wanted. Deleting the NodeSet meanwhile lets it go ([`finalize`]).
            if scheduled {
                let message = format!(
                    "ScheduledUpdate keeps a Slurm reservation, and no slurmrestd is configured for \
                     Controller {}: apply a RestApi (or give --slurmrestd-url); old pods are not \
                     replaced meanwhile",
                    ns.spec.controller_ref.name
                );
                set_condition(pass, false, "NoSlurmrestd", message);
            } else {
                pass.state.conditions.clear(conditions::RESERVATION_CREATED);
            }
            return window.map(|_| BTreeSet::new());
        }
        SlurmView::Failed(_) => {
            // The drain gate reports why; the reservation and its condition are left as they are.
            return window.map(|_| BTreeSet::new());
        }
    };
    if !scheduled && !has_finalizer(ns, keys::FINALIZER_RESERVATION) {
        // Never had one (or removed it once it was gone): nothing to ask.
        pass.state.conditions.clear(conditions::RESERVATION_CREATED);
        return None;
    }
    let actual = match cluster.client().reservation(&name).await {
        Ok(r) => r,
        Err(e) => {
            pass.slurm_asked = true;
            pass.slurm_failed(Unavailable::of(&e)).await;
            return window.map(|_| BTreeSet::new());
        }
    };
    pass.slurm_asked = true;
    let has_pods = ns.is_daemon() || ns.replicas() > 0;
    let wanted = window
        .as_ref()
        .filter(|_| has_pods)
        .map(|w| wanted_reservation(&name, w, owned, slurm_nodes));
    let step = decide(wanted.as_ref(), actual.as_ref(), now);
    tracing::debug!(reservation = %name, ?step, ?actual, "maintenance reservation");
    let Some(exists) = converge(pass, &cluster, &step, actual.is_some()).await else {
        return window.map(|_| BTreeSet::new());
    };
    let Some(w) = window else {
        pass.state.conditions.clear(conditions::RESERVATION_CREATED);
        return None;
    };
    // Come back when the window opens (to replace) and when it ends (to say so).
    for t in [w.start, w.end] {
        if t > now {
            pass.come_back_within(std::time::Duration::from_secs((t - now) as u64 + 1));
            break;
        }
    }
    report(pass, &w, &name, wanted.as_ref(), actual.as_ref(), exists, now);
    let replace = match (&step, &actual) {
        (Step::Keep | Step::Update(_), Some(a)) => in_window(a, owned, now),
        _ => BTreeSet::new(),
    };
    Some(replace)
}

/// Make Slurm's reservation what `step` says, its finalizer first (a reservation never exists
/// without it); whether it exists afterwards, `None` when the pass stops here (the finalizer was
/// just written, or Slurm refused).
async fn converge(pass: &mut Pass<'_>, cluster: &Cluster, step: &Step, existed: bool) -> Option<bool> {
    let ns = pass.ns;
    let will_exist = match &step {
        Step::Keep => existed,
        Step::Create(_) | Step::Update(_) | Step::Delete(Some(_)) => true,
        Step::Delete(None) => false,
    };
    if will_exist && !has_finalizer(ns, keys::FINALIZER_RESERVATION) {
        // The finalizer first: a reservation never exists without it. (When the NodeSet's other
        // finalizer was written this pass, the next one writes this.)
        if has_finalizer(ns, keys::FINALIZER_SLURM_NODES) {
            finalizer::add(pass, keys::FINALIZER_RESERVATION).await;
        }
        pass.retry_soon();
        return None;
    }
    let result = apply(pass, cluster, step).await;
    let exists = match (step, result) {
        (_, Err(u)) => {
            if matches!(step, Step::Create(_)) {
                set_condition(pass, false, u.reason, u.message.clone());
            }
            pass.slurm_failed(u).await;
            return None;
        }
        (Step::Keep, Ok(())) => existed,
        (Step::Delete(None), Ok(())) => false,
        (_, Ok(())) => {
            // Written: the next pass reads what Slurm made of it.
            pass.retry_soon();
            true
        }
    };
    if !exists && has_finalizer(ns, keys::FINALIZER_RESERVATION) {
        finalizer::remove(pass, keys::FINALIZER_RESERVATION).await;
    }
    Some(exists)
}

/// The reservation a maintenance window wants: the Slurm nodes of the NodeSet's pods that Slurm
/// lists, sorted.
fn wanted_reservation(
    name: &str,
    window: &Window,
    owned: &[Arc<Pod>],
    slurm_nodes: &std::collections::HashMap<String, slinky_slurm::Node>,
) -> Wanted {
    let mut names: Vec<String> = owned
        .iter()
        .map(|p| node_name(p))
        .filter(|n| slurm_nodes.contains_key(n))
        .collect();
    names.sort();
    names.dedup();
    Wanted {
        name: name.to_string(),
        window: window.clone(),
        nodes: names,
    }
}

/// The `ReservationCreated` condition of a window: whether its reservation exists, why not, and
/// when the old pods are replaced.
fn report(
    pass: &mut Pass<'_>,
    w: &Window,
    name: &str,
    wanted: Option<&Wanted>,
    actual: Option<&Reservation>,
    exists: bool,
    now: i64,
) {
    let list = match wanted.filter(|w| !w.nodes.is_empty()) {
        Some(w) => slinky_slurm::hostlist::compress(&w.nodes),
        None => actual.map(|a| a.node_list.clone()).unwrap_or_default(),
    };
    let held = |when: &str| {
        format!(
            "Slurm reservation {name} (MAINT) holds nodes {list} from {} to {}: old pods are replaced {when}",
            at(w.start),
            at(w.end)
        )
    };
    let (status, reason, message) = if wanted.is_none() {
        (
            exists,
            "NoReplicas",
            format!("the NodeSet has no pod to update: no reservation {name}"),
        )
    } else if w.is_over(now) {
        (
            exists,
            "WindowOver",
            format!(
                "the maintenance window ended at {}: set a later startTime for another",
                at(w.end)
            ),
        )
    } else if exists && w.is_open(now) {
        (true, "Active", held("now"))
    } else if exists {
        (true, "Scheduled", held("then"))
    } else {
        (
            false,
            "NoSlurmNodes",
            format!("no pod of the NodeSet has a Slurm node yet: reservation {name} is made once one has"),
        )
    };
    set_condition(pass, status, reason, message);
}

/// Do `step`; a Normal Event for each change.
async fn apply(pass: &mut Pass<'_>, cluster: &Cluster, step: &Step) -> Result<(), Unavailable> {
    let client = cluster.client();
    let unavailable = |e: slinky_slurm::Error| Unavailable::of(&e);
    let describe = |r: &ReservationRequest| {
        let mut parts = Vec::new();
        if let Some(nodes) = &r.nodes {
            parts.push(format!("nodes {}", slinky_slurm::hostlist::compress(nodes)));
        }
        if let (Some(s), Some(e)) = (r.start_time, r.end_time) {
            parts.push(format!("from {} to {}", at(s), at(e)));
        } else if let Some(e) = r.end_time {
            parts.push(format!("until {}", at(e)));
        }
        parts.join(" ")
    };
    let (reason, note) = match step {
        Step::Keep => return Ok(()),
        Step::Create(r) => {
            client.put_reservation(r).await.map_err(unavailable)?;
            (
                "ReservationCreated",
                format!("Created Slurm reservation {} (MAINT): {}", r.name, describe(r)),
            )
        }
        Step::Update(r) => {
            client.put_reservation(r).await.map_err(unavailable)?;
            (
                "ReservationUpdated",
                format!("Updated Slurm reservation {}: {}", r.name, describe(r)),
            )
        }
        Step::Delete(again) => {
            let name = pass.ns.reservation_name();
            delete(client, &name).await?;
            match again {
                Some(r) => {
                    client.put_reservation(r).await.map_err(unavailable)?;
                    (
                        "ReservationCreated",
                        format!(
                            "Replaced Slurm reservation {} (its start, flags or users differed from the spec): {}",
                            r.name,
                            describe(r)
                        ),
                    )
                }
                None => ("ReservationDeleted", format!("Deleted Slurm reservation {name}")),
            }
        }
    };
    tracing::info!(reason, "{note}");
    pass.core().event(pass.ns, EventType::Normal, reason, note).await;
    Ok(())
}

/// Delete `name`; one Slurm removed meanwhile (its end passed) counts as deleted.
async fn delete(client: &slinky_slurm::Client, name: &str) -> Result<(), Unavailable> {
    match client.delete_reservation(name).await {
        Ok(()) => Ok(()),
        Err(e) => match client.reservation(name).await {
            Ok(None) => Ok(()),
            _ => Err(Unavailable::of(&e)),
        },
    }
}

fn set_condition(pass: &mut Pass<'_>, status: bool, reason: &str, message: String) {
    pass.state
        .conditions
        .set(conditions::RESERVATION_CREATED, status, reason, message);
}

/// A deleted NodeSet: delete its reservation, then, at a later pass that sees it gone, remove the
/// finalizer. Returns whether the NodeSet had no such finalizer when the pass began (after
/// removing it, the pass stops: the next one sees the fresh NodeSet).
pub(super) async fn finalize(pass: &mut Pass<'_>, controller: Option<&Controller>) -> bool {
    if !has_finalizer(pass.ns, keys::FINALIZER_RESERVATION) {
        return true;
    }
    let name = pass.ns.reservation_name();
    let reach = match controller {
        Some(c) => pass.ctx.slurm.reach(c, &pass.ctx.caches).await,
        None => Reach::Off,
    };
    let result = match reach {
        // No Slurm the host could ask: nothing it could delete.
        Reach::Off => Ok(true),
        Reach::Failed(u) => Err(u),
        Reach::On(cluster) => {
            pass.slurm_asked = true;
            match cluster.client().reservation(&name).await {
                Ok(None) => Ok(true),
                // Deleted now; the finalizer goes at a later pass that sees it gone (a slurmctld
                // restored from an older state would show it again).
                Ok(Some(_)) => apply(pass, &cluster, &Step::Delete(None)).await.map(|()| {
                    pass.retry_soon();
                    false
                }),
                Err(e) => Err(Unavailable::of(&e)),
            }
        }
    };
    let result = match result {
        Ok(true) => Ok(()),
        Ok(false) => return false,
        Err(u) => Err(u),
    };
    match result {
        Ok(()) => {
            finalizer::remove(pass, keys::FINALIZER_RESERVATION).await;
            false
        }
        Err(u) => {
            pass.slurm_asked = true;
            let message = format!(
                "NodeSet {} is being deleted; it stays until its Slurm reservation {name} is deleted \
                 (remove the finalizer {} to leave the reservation to Slurm): {}",
                pass.ns.name_any(),
                keys::FINALIZER_RESERVATION,
                u.message
            );
            pass.slurm_failed(Unavailable {
                reason: u.reason,
                message,
            })
            .await;
            false
        }
    }
}

#[cfg(test)]
mod tests;
