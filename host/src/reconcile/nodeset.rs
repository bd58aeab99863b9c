//! The NodeSet reconciler (StatefulSet mode): ordinal pods from the `nodeset-pod` builder,
//! slow-start scale up, Slinky's scale-down order, adoption and release, rolling updates within
//! `maxUnavailable`, and status.
//!
//! # Guarantees
//! * Pods are created or deleted only while the NodeSet's expectations are satisfied; every
//!   expectation raised for a write that failed or was never attempted is released at once.
//! * A missing Controller, an invalid spec or a failing builder sets a condition, emits an Event
//!   and backs off; it never deletes running pods.
//! * Status is written only when it changed, with `observedGeneration` the generation it was
//!   computed from.

use std::{cmp::Ordering, sync::Arc, time::Duration};

use futures::future::join_all;
use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::{apis::meta::v1::OwnerReference, util::intstr::IntOrString},
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use slinky_api::{Controller, NodeSet, NodeSetStatus, UpdateStrategyType, keys};

use super::{
    Context, Error,
    controller::{clear_condition, set_condition},
};
use crate::{
    plugins::{BuilderKind, PodIdentity, policy::nodeset_selector},
    revision::pod_revision,
};

/// Most creates (and deletes) in one pass.
const BURST: usize = 250;

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn ready_since(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let conds = p.status.as_ref()?.conditions.as_ref()?;
    let c = conds.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref().map(|t| t.0).unwrap_or_default())
}

fn is_ready(p: &Pod) -> bool {
    phase(p) == "Running" && ready_since(p).is_some()
}

fn is_available(p: &Pod, min_ready: i64) -> bool {
    is_ready(p)
        && (min_ready <= 0
            || ready_since(p).is_some_and(|t| {
                k8s_openapi::jiff::Timestamp::now().as_second() - t.as_second() >= min_ready
            }))
}

/// The ordinal of a pod named `<nodeset>-<digits>`.
pub fn ordinal_of(nodeset: &str, pod: &str) -> Option<u32> {
    let rest = pod.strip_prefix(nodeset)?.strip_prefix('-')?;
    if rest.is_empty() || !rest.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    rest.parse().ok()
}

fn deletion_cost(p: &Pod) -> i64 {
    p.annotations()
        .get(keys::ANNOTATION_POD_DELETION_COST)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Slinky's `ActivePods` order: the pods to delete first come first.
fn condemn_order(a: &Pod, b: &Pod, name: &str) -> Ordering {
    let scheduled = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
    let phase_rank = |p: &Pod| match phase(p) {
        "Pending" => 0,
        "Unknown" | "" => 1,
        _ => 2,
    };
    let cordoned = |p: &Pod| {
        p.annotations()
            .get(keys::ANNOTATION_POD_CORDON)
            .is_some_and(|v| v == "true")
    };
    let deadline = |p: &Pod| {
        p.annotations()
            .get(keys::ANNOTATION_POD_DEADLINE)
            .cloned()
            .unwrap_or_else(|| "~".into())
    };
    scheduled(a)
        .cmp(&scheduled(b))
        .then(phase_rank(a).cmp(&phase_rank(b)))
        .then(is_ready(a).cmp(&is_ready(b)))
        .then(deletion_cost(a).cmp(&deletion_cost(b)))
        .then(deadline(a).cmp(&deadline(b)))
        .then(cordoned(b).cmp(&cordoned(a)))
        .then(ordinal_of(name, &b.name_any()).cmp(&ordinal_of(name, &a.name_any())))
        .then(ready_since(b).cmp(&ready_since(a)))
        .then(b.creation_timestamp().cmp(&a.creation_timestamp()))
}

/// `maxUnavailable` resolved against `replicas`: a number, or a percentage rounded up; at least 1.
pub fn max_unavailable(v: Option<&IntOrString>, replicas: i32) -> i32 {
    let n = match v {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(25);
            ((i64::from(replicas) * pct + 99) / 100) as i32
        }
        None => (replicas * 25 + 99) / 100,
    };
    n.max(1)
}

fn owner_ref(ns: &NodeSet) -> OwnerReference {
    OwnerReference {
        api_version: NodeSet::api_version(&()).into_owned(),
        kind: NodeSet::kind(&()).into_owned(),
        name: ns.name_any(),
        uid: ns.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Reconcile one NodeSet.
///
/// # Errors
/// API errors (retried with backoff by the error policy).
pub async fn reconcile(ns: Arc<NodeSet>, ctx: Arc<Context>, resync: Duration) -> Result<Action, Error> {
    if !ctx.leader.may_write() {
        // A follower: caches only. Becoming the leader re-reconciles everything.
        return Ok(Action::await_change());
    }
    let started = std::time::Instant::now();
    // Every log line of this reconcile carries the object's kind and key.
    let span = tracing::info_span!(
        "reconcile",
        kind = "NodeSet",
        key = %format!("{}/{}", ns.namespace().unwrap_or_default(), ns.name_any())
    );
    let r = tracing::Instrument::instrument(reconcile_inner(&ns, &ctx, resync), span).await;
    let label = match &r {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics
        .record("NodeSet", label, started.elapsed().as_secs_f64());
    r
}

struct Outcome {
    conditions_problem: Option<(&'static str, String)>,
    requeue: Duration,
}

#[tracing::instrument(skip_all, fields(nodeset = %format!("{}/{}", ns.namespace().unwrap_or_default(), ns.name_any())))]
async fn reconcile_inner(ns: &NodeSet, ctx: &Context, resync: Duration) -> Result<Action, Error> {
    let namespace = ns.namespace().unwrap_or_default();
    let name = ns.name_any();
    let key = format!("{namespace}/{name}");
    if !ctx.serves(&namespace) {
        return Ok(Action::await_change());
    }
    if ns.metadata.deletion_timestamp.is_some() {
        ctx.expectations.forget(&key);
        return Ok(Action::await_change());
    }
    // Expectations first, the cache second: when they are satisfied, every event they waited for
    // has been applied to the cache, so what is read next is no older than our own writes. (Read
    // the other way round, a pass could act on pods its previous pass already deleted.)
    let satisfied = ctx.expectations.satisfied(&key);
    let uid = ns.uid().unwrap_or_default();
    let selector = nodeset_selector(ns);
    let matches_selector = |p: &Pod| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v));

    // Claim: owned pods, adopt matching orphans, release owned pods that no longer match.
    let mut owned: Vec<Arc<Pod>> = Vec::new();
    let mut orphans: Vec<Arc<Pod>> = Vec::new();
    for p in ctx.pods.state() {
        if p.namespace().as_deref() != Some(namespace.as_str()) {
            continue;
        }
        let controller = p.owner_references().iter().find(|o| o.controller == Some(true));
        match controller {
            Some(o) if o.uid == uid => owned.push(p),
            None if matches_selector(&p)
                && ordinal_of(&name, &p.name_any()).is_some()
                && p.metadata.deletion_timestamp.is_none() =>
            {
                orphans.push(p)
            }
            _ => {}
        }
    }
    if !orphans.is_empty() {
        // Re-read the NodeSet from the API: adopt only for the live, undeleted owner.
        let api: Api<NodeSet> = Api::namespaced(ctx.client.clone(), &namespace);
        let fresh = api.get(&name).await?;
        if fresh.uid().as_deref() == Some(uid.as_str()) && fresh.metadata.deletion_timestamp.is_none() {
            for p in orphans {
                let mut refs = p.owner_references().to_vec();
                refs.push(owner_ref(ns));
                match ctx
                    .writer
                    .set_pod_owners(&p, serde_json::to_value(refs).unwrap_or_default())
                    .await
                {
                    Ok(adopted) => owned.push(Arc::new(adopted)),
                    Err(error) => tracing::info!(pod = %p.name_any(), %error, "adoption failed; will retry"),
                }
            }
        }
    }
    let mut kept = Vec::new();
    for p in owned {
        if matches_selector(&p) {
            kept.push(p);
        } else {
            let refs: Vec<&OwnerReference> = p.owner_references().iter().filter(|o| o.uid != uid).collect();
            if let Err(error) = ctx
                .writer
                .set_pod_owners(&p, serde_json::to_value(refs).unwrap_or_default())
                .await
            {
                tracing::info!(pod = %p.name_any(), %error, "release failed; will retry");
            }
        }
    }
    let owned = kept;

    let controller = ctx
        .controllers
        .get(&ObjectRef::<Controller>::new(&ns.spec.controller_ref.name).within(ns.controller_namespace()));
    let plugin = ctx.plugins.active(BuilderKind::NodesetPod);
    let revision = controller.as_ref().map(|c| pod_revision(ns, c, plugin.digest()));

    let mut outcome = Outcome {
        conditions_problem: None,
        requeue: resync,
    };
    if let Some(problem) = spec_problem(ns) {
        outcome.conditions_problem = Some(("InvalidSpec", problem));
        outcome.requeue = Duration::from_secs(60);
    } else if let (Some(controller), Some(revision)) = (controller.as_ref(), revision.as_ref()) {
        if satisfied {
            if let Err(e) = sync_pods(ns, controller, revision, &owned, &key, ctx, &plugin).await {
                match e {
                    Error::Plugin(p) => {
                        ctx.metrics
                            .plugin_failures
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        outcome.conditions_problem = Some(("BuilderFailed", p.to_string()));
                        outcome.requeue = Duration::from_secs(30);
                    }
                    other => return Err(other),
                }
            }
        } else {
            outcome.requeue = Duration::from_millis(500);
        }
    } else {
        outcome.conditions_problem = Some((
            "ControllerNotFound",
            format!(
                "Controller {}/{} does not exist (yet)",
                ns.controller_namespace(),
                ns.spec.controller_ref.name
            ),
        ));
        outcome.requeue = Duration::from_secs(30);
    }
    if let Some((reason, msg)) = &outcome.conditions_problem {
        let already = ns.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == *reason && c.status == "True" && c.message == *msg)
        });
        if !already {
            ctx.event(ns, EventType::Warning, reason, msg.clone()).await;
        }
    }
    write_status(ns, ctx, &owned, revision.as_deref(), &outcome).await?;
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let ready = owned.iter().filter(|p| is_ready(p)).count();
    let available = owned.iter().filter(|p| is_available(p, min_ready)).count();
    if ready != available {
        outcome.requeue = outcome.requeue.min(Duration::from_secs(min_ready as u64 + 1));
    }
    Ok(Action::requeue(outcome.requeue))
}

fn spec_problem(ns: &NodeSet) -> Option<String> {
    if ns.spec.controller_ref.name.is_empty() {
        return Some("spec.controllerRef.name is required".into());
    }
    if ns.replicas() < 0 {
        return Some(format!(
            "spec.replicas is {}, it must be 0 or more",
            ns.replicas()
        ));
    }
    if let Some(IntOrString::Int(0)) = ns
        .spec
        .update_strategy
        .as_ref()
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.as_ref())
    {
        return Some("spec.updateStrategy.rollingUpdate.maxUnavailable must not be 0".into());
    }
    if ns.spec.scaling_mode == slinky_api::ScalingMode::DaemonSet {
        return Some("spec.scalingMode DaemonSet is not supported by this host yet: use StatefulSet".into());
    }
    None
}

#[allow(clippy::too_many_arguments, reason = "the reconcile's inputs")]
async fn sync_pods(
    ns: &NodeSet,
    controller: &Controller,
    revision: &str,
    owned: &[Arc<Pod>],
    key: &str,
    ctx: &Context,
    plugin: &crate::plugins::Plugin,
) -> Result<(), Error> {
    let name = ns.name_any();
    let namespace = ns.namespace().unwrap_or_default();
    let replicas = ns.replicas().max(0) as usize;
    let live: Vec<&Arc<Pod>> = owned
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();

    // Failed or finished pods go (and come back on the next pass).
    let mut condemned: Vec<&Arc<Pod>> = live
        .iter()
        .copied()
        .filter(|p| matches!(phase(p), "Failed" | "Succeeded"))
        .collect();
    let live: Vec<&Arc<Pod>> = live
        .into_iter()
        .filter(|p| !matches!(phase(p), "Failed" | "Succeeded"))
        .collect();
    let mut creates: Vec<u32> = Vec::new();
    if live.len() > replicas {
        let mut sorted = live.clone();
        sorted.sort_by(|a, b| condemn_order(a, b, &name));
        condemned.extend(sorted.into_iter().take((live.len() - replicas).min(BURST)));
    } else if live.len() < replicas {
        let used: std::collections::BTreeSet<u32> = owned
            .iter()
            .filter_map(|p| ordinal_of(&name, &p.name_any()))
            .collect();
        creates = (0u32..)
            .filter(|o| !used.contains(o))
            .take((replicas - live.len()).min(BURST))
            .collect();
    } else if condemned.is_empty() {
        // Rolling update: replace old-revision pods within maxUnavailable.
        let strategy = ns.spec.update_strategy.as_ref();
        if strategy.is_none_or(|s| s.type_ == UpdateStrategyType::RollingUpdate) {
            let max = max_unavailable(
                strategy
                    .and_then(|s| s.rolling_update.as_ref())
                    .and_then(|r| r.max_unavailable.as_ref()),
                replicas as i32,
            );
            let old: Vec<&Arc<Pod>> = live
                .iter()
                .copied()
                .filter(|p| p.labels().get(keys::LABEL_REVISION_HASH).map(String::as_str) != Some(revision))
                .collect();
            if !old.is_empty() {
                let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
                let unavailable = live.iter().filter(|p| !is_available(p, min_ready)).count() as i32;
                let mut budget = max - unavailable;
                let (mut unhealthy, mut healthy): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) =
                    old.into_iter().partition(|p| !is_available(p, min_ready));
                unhealthy.sort_by(|a, b| condemn_order(a, b, &name));
                healthy.sort_by(|a, b| condemn_order(a, b, &name));
                // Old pods that are already unavailable cost no budget.
                condemned.extend(unhealthy);
                for p in healthy {
                    if budget <= 0 {
                        break;
                    }
                    condemned.push(p);
                    budget -= 1;
                }
            }
        }
    }

    tracing::debug!(
        replicas,
        live = live.len(),
        creates = ?creates,
        condemned = ?condemned.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        nodeset_rv = ?ns.resource_version(),
        "sync pods"
    );
    if !condemned.is_empty() {
        let uids: Vec<String> = condemned.iter().filter_map(|p| p.uid()).collect();
        ctx.expectations.expect_deletions(key, uids);
        let results = join_all(condemned.iter().map(|p| {
            let (pn, uid) = (p.name_any(), p.uid().unwrap_or_default());
            let ns_name = namespace.clone();
            async move {
                (
                    pn.clone(),
                    uid.clone(),
                    ctx.writer.delete_pod(&ns_name, &pn, &uid).await,
                )
            }
        }))
        .await;
        let mut deleted = Vec::new();
        for (pn, uid, r) in results {
            match r {
                Ok(true) => deleted.push(pn),
                // Already gone: its deletion may have been observed before we expected it.
                Ok(false) => ctx.expectations.deletion_observed(key, &uid),
                Err(error) => {
                    ctx.expectations.deletion_observed(key, &uid);
                    tracing::warn!(pod = %pn, %error, "delete failed");
                }
            }
        }
        if !deleted.is_empty() {
            ctx.event(
                ns,
                EventType::Normal,
                "SuccessfulDelete",
                format!("Deleted pods: {}", deleted.join(", ")),
            )
            .await;
        }
    }

    if creates.is_empty() {
        return Ok(());
    }
    // Build every pod of this pass in one blocking task (copies in, untrusted output checked).
    let identities: Vec<PodIdentity> = creates
        .iter()
        .map(|o| PodIdentity::for_ordinal(ns, *o, revision))
        .collect();
    let (p, nsc, cc, build) = (plugin.clone(), ns.clone(), controller.clone(), ctx.build.clone());
    let metrics = ctx.metrics.clone();
    ctx.metrics
        .plugin_calls
        .fetch_add(identities.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let built = ctx
        .blocking(move || {
            identities
                .iter()
                .map(|id| {
                    metrics.time_plugin_call(BuilderKind::NodesetPod, || p.build_pod(&build, &nsc, &cc, id))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .await?
        .map_err(|e| Error::Plugin(Box::new(e)))?;

    // Slow start: batches of 1, 2, 4, …; stop at the first batch with a failure.
    ctx.expectations.expect_creations(key, built.len());
    let mut pending = built.into_iter();
    let mut remaining = creates.len();
    let mut batch = 1;
    let mut created = Vec::new();
    let mut failure = None;
    while remaining > 0 {
        let this: Vec<Pod> = pending.by_ref().take(batch.min(remaining)).collect();
        remaining -= this.len();
        let results = join_all(this.iter().map(|pod| ctx.writer.create_pod(pod))).await;
        let mut failed = 0;
        for (pod, r) in this.iter().zip(results) {
            match r {
                Ok(_) => created.push(pod.name_any()),
                Err(error) => {
                    failed += 1;
                    ctx.expectations.creation_observed(key);
                    failure = Some(format!("creating pod {}: {error}", pod.name_any()));
                }
            }
        }
        if failed > 0 {
            // Creates never attempted are released: nothing will ever observe them.
            ctx.expectations.release_creations(key, remaining);
            break;
        }
        batch *= 2;
    }
    if !created.is_empty() {
        ctx.event(
            ns,
            EventType::Normal,
            "SuccessfulCreate",
            format!("Created pods: {}", created.join(", ")),
        )
        .await;
    }
    if let Some(f) = failure {
        tracing::warn!(nodeset = %name, "{f}");
    }
    Ok(())
}

async fn write_status(
    ns: &NodeSet,
    ctx: &Context,
    owned: &[Arc<Pod>],
    revision: Option<&str>,
    outcome: &Outcome,
) -> Result<(), Error> {
    let generation = ns.metadata.generation;
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let live: Vec<&Arc<Pod>> = owned
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let desired = ns.replicas().max(0);
    let available = live.iter().filter(|p| is_available(p, min_ready)).count() as i32;
    let mut conditions = ns
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for t in ["InvalidSpec", "BuilderFailed", "ControllerNotFound"] {
        clear_condition(&mut conditions, t);
    }
    match &outcome.conditions_problem {
        Some((reason, msg)) => {
            set_condition(&mut conditions, reason, true, reason, msg.clone(), generation);
            set_condition(&mut conditions, "Ready", false, reason, msg.clone(), generation);
        }
        None => {
            let ok = available == desired;
            let msg = format!("{available}/{desired} pods available");
            set_condition(
                &mut conditions,
                "Ready",
                ok,
                if ok { "AllPodsAvailable" } else { "PodsUnavailable" },
                msg,
                generation,
            );
        }
    }
    let selector: Vec<String> = nodeset_selector(ns)
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
        ready_replicas: live.iter().filter(|p| is_ready(p)).count() as i32,
        available_replicas: available,
        unavailable_replicas: (desired - available).max(0),
        desired,
        observed_generation: generation,
        node_set_hash: revision
            .map(str::to_string)
            .or_else(|| ns.status.as_ref().and_then(|s| s.node_set_hash.clone())),
        selector: Some(selector.join(",")),
        conditions,
    };
    let api: Api<NodeSet> = Api::namespaced(ctx.client.clone(), &ns.namespace().unwrap_or_default());
    ctx.writer
        .update_status(
            &api,
            ns,
            |_: &NodeSet| status.clone(),
            |obj: &NodeSet| obj.status.clone(),
        )
        .await?;
    Ok(())
}

/// Back off on errors.
pub fn error_policy(_ns: Arc<NodeSet>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "NodeSet reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_and_max_unavailable() {
        assert_eq!(ordinal_of("w", "w-007"), Some(7));
        assert_eq!(ordinal_of("w", "w-x"), None);
        assert_eq!(ordinal_of("w", "ww-1"), None);
        assert_eq!(max_unavailable(None, 10), 3);
        assert_eq!(max_unavailable(None, 1), 1);
        assert_eq!(max_unavailable(Some(&IntOrString::String("50%".into())), 5), 3);
        assert_eq!(max_unavailable(Some(&IntOrString::Int(2)), 5), 2);
    }
}
