//! The NodeSet reconciler (StatefulSet mode): the NodeSet's other children from the
//! `nodeset-children` builder (the workers' Service and PodDisruptionBudget shared by the
//! Controller's NodeSets, the SSH ConfigMap) through the one child path ([`super::children`]),
//! then ordinal pods from the `nodeset-pod` builder, claimed ([`claim`]) and planned ([`plan`])
//! from the cache, then written.
//!
//! # Guarantees
//! * Pods are created or deleted only while the NodeSet's expectations are satisfied; every
//!   expectation raised for a write that failed or was never attempted is released at once.
//! * Every write the API server refuses (create, delete, adoption, release, relabel) is an Event
//!   (`FailedCreate`, `FailedDelete`, …) with the API's message and a `ReplicaFailure` condition,
//!   and the NodeSet is retried with its own exponential backoff (milliseconds up to minutes),
//!   not at the next resync. The condition is cleared by a pass whose writes all succeed.
//! * A spec that would make pods the API server refuses (names, hostnames, label values) or that
//!   asks for what this host does not support is an `InvalidSpec` condition naming the field;
//!   a missing Controller or a failing builder is a condition too. None deletes running pods.
//! * The shared workers' Service and PodDisruptionBudget are owned by every NodeSet referencing
//!   the Controller (plain owner references, sorted by name): several NodeSets reconciling at once
//!   all apply the same object under the same field manager, which is no conflict (Slinky's #152
//!   race has no path here); a refused child write is a `ChildFailure` condition and an Event.
//! * Status is written only when it changed, with `observedGeneration` the generation it was
//!   computed from; on a 409 it is recomputed on the fresh object, keeping other writers'
//!   conditions.

mod children;
mod claim;
#[cfg(test)]
pub(crate) mod fixtures;
mod plan;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::future::join_all;
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::OwnerReference, jiff::Timestamp};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use serde_json::Value;
use slinky_api::{Controller, NodeSet, NodeSetStatus, checks, conditions, keys};

use claim::{Blocker, Claims, classify};
pub use claim::{claims_name, owner_uid};
pub use plan::is_ready;
use plan::{DeleteReason, Inputs, is_available, phase, plan};

use children::sync_children;

use super::{
    Context, Error,
    compare::{contains, differences, dropped_note},
    object_key,
    status::ConditionChanges,
    writer,
};
use crate::{
    plugins::{BuilderKind, GuestError, Plugin, PluginError, PodIdentity, policy::nodeset_selector},
    revision::pod_revision,
};

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
/// API errors (retried with the NodeSet's backoff by the error policy).
pub async fn reconcile(ns: Arc<NodeSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.instrumented(ns.as_ref(), reconcile_inner(&ns, &ctx)).await
}

/// One pass: what it decided about conditions, and the writes that failed.
struct Pass<'a> {
    ctx: &'a Context,
    ns: &'a NodeSet,
    uid: String,
    conditions: ConditionChanges,
    /// `(reason, message)` of each refused write.
    failures: Vec<(&'static str, String)>,
    /// `(reason, message)` of each refused child write (not a pod) or ownership problem.
    child_failures: Vec<(&'static str, String)>,
    /// The children were synced (so `ChildFailure` is set or cleared by this pass).
    children_synced: bool,
    /// A condition that stops the pass: `(type, message)`.
    problem: Option<(&'static str, String)>,
    /// The builder failed (back off like a failed write).
    builder_failed: bool,
}

impl<'a> Pass<'a> {
    fn current_conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
        self.ns
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }

    /// A condition that stops the pass; an Event the first time its message is seen.
    async fn problem(&mut self, type_: &'static str, message: String) {
        if !ConditionChanges::already_true(self.current_conditions(), type_, &message) {
            self.ctx
                .event(self.ns, EventType::Warning, type_, message.clone())
                .await;
        }
        self.problem = Some((type_, message));
    }

    /// A refused write: an Event now, the `ReplicaFailure` condition at the end of the pass.
    async fn failed(&mut self, reason: &'static str, message: String) {
        tracing::warn!(reason, "{message}");
        self.ctx
            .event(self.ns, EventType::Warning, reason, message.clone())
            .await;
        self.failures.push((reason, message));
    }

    /// A builder error: `InvalidSpec` when the builder says the input is invalid, else
    /// `BuilderFailed`.
    async fn builder_error(&mut self, e: &PluginError) {
        self.ctx
            .metrics
            .plugin_failures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match e {
            PluginError::Build {
                error: GuestError::InvalidInput(m),
                ..
            } => self.problem(conditions::INVALID_SPEC, m.clone()).await,
            other => {
                self.builder_failed = true;
                self.problem(conditions::BUILDER_FAILED, other.to_string()).await;
            }
        }
    }
}

async fn reconcile_inner(ns: &NodeSet, ctx: &Context) -> Result<Action, Error> {
    let namespace = ns.namespace().unwrap_or_default();
    let key = object_key(ns);
    let uid = ns.uid().unwrap_or_default();
    if !ctx.serves(&namespace) {
        return Ok(Action::await_change());
    }
    if ns.metadata.deletion_timestamp.is_some() {
        ctx.expectations.forget(&uid);
        return Ok(Action::await_change());
    }
    // Expectations first, the cache second: when they are satisfied, every event they waited for
    // has been applied to the cache, so what is read next is no older than our own writes. (Read
    // the other way round, a pass could act on pods its previous pass already deleted.)
    let satisfied = ctx.expectations.satisfied(&uid);
    let claims = classify(ns, ctx.pods.state());
    let controller = ctx
        .controllers
        .get(&ObjectRef::<Controller>::new(&ns.spec.controller_ref.name).within(ns.controller_namespace()));
    let plugin = ctx.plugins.active(BuilderKind::NodesetPod);
    let revision = controller
        .as_ref()
        .map(|c| pod_revision(ns, c, plugin.digest(), &ctx.build));

    let mut pass = Pass {
        ctx,
        ns,
        uid,
        conditions: ConditionChanges::new(ns.metadata.generation),
        failures: Vec::new(),
        child_failures: Vec::new(),
        children_synced: false,
        problem: None,
        builder_failed: false,
    };
    let mut owned = claims.owned.clone();
    let mut requeue = ctx.resync;
    let synced;
    if let Some(problem) = checks::summary(&ns.spec_problems()) {
        pass.problem(conditions::INVALID_SPEC, problem).await;
        synced = false;
    } else if let (Some(controller), Some(revision)) = (controller.as_ref(), revision.as_deref()) {
        if satisfied {
            owned = sync(&mut pass, controller, revision, claims, &plugin).await?;
            synced = true;
        } else {
            // The watch will trigger the next pass when it shows what we wait for.
            requeue = Duration::from_millis(500);
            synced = false;
        }
    } else {
        let message = format!(
            "Controller {}/{} does not exist (yet)",
            ns.controller_namespace(),
            ns.spec.controller_ref.name
        );
        pass.problem(conditions::CONTROLLER_NOT_FOUND, message).await;
        synced = false;
    }

    write_status(&mut pass, &owned, revision.as_deref(), synced).await?;
    if !pass.failures.is_empty() || !pass.child_failures.is_empty() || pass.builder_failed {
        requeue = ctx.backoff.failure(&key);
    } else {
        ctx.backoff.success(&key);
    }
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let now = Timestamp::now();
    if owned
        .iter()
        .any(|p| is_ready(p) && !is_available(p, min_ready, now))
    {
        requeue = requeue.min(Duration::from_secs(min_ready.max(0) as u64 + 1));
    }
    Ok(Action::requeue(requeue))
}

/// Claim, plan and write; returns the pods the NodeSet owns afterwards (for status).
async fn sync(
    pass: &mut Pass<'_>,
    controller: &Controller,
    revision: &str,
    mut claims: Claims,
    plugin: &Plugin,
) -> Result<Vec<Arc<Pod>>, Error> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    sync_children(pass, controller).await?;
    if pass.problem.is_some() {
        return Ok(claims.owned);
    }
    adopt_and_release(pass, &mut claims).await?;
    relabel_equal_pods(pass, controller, revision, &mut claims.owned, plugin).await?;
    if pass.problem.is_some() {
        return Ok(claims.owned);
    }
    let plan = plan(&Inputs {
        nodeset: ns,
        revision,
        owned: &claims.owned,
        blocked: &claims.blocked,
        leaving: &claims.leaving,
        now: Timestamp::now(),
    });
    if let Some(problem) = plan
        .creates
        .iter()
        .find_map(|o| checks::summary(&ns.identity_problems(*o)))
    {
        pass.problem(conditions::INVALID_SPEC, problem).await;
        return Ok(claims.owned);
    }
    tracing::debug!(
        creates = ?plan.creates,
        waiting = ?plan.waiting,
        deletes = ?plan.deletes.iter().map(|(p, r)| (p.name_any(), *r)).collect::<Vec<_>>(),
        "sync pods"
    );
    if !plan.skipped.is_empty() {
        ctx.event(
            ns,
            EventType::Warning,
            "PodNameTaken",
            skipped_note(&plan.skipped),
        )
        .await;
    }
    delete_pods(pass, &plan.deletes).await;
    create_pods(pass, controller, revision, &plan.creates, plugin).await?;
    Ok(claims.owned)
}

fn skipped_note(skipped: &[(u32, Blocker)]) -> String {
    let items: Vec<String> = skipped
        .iter()
        .map(|(o, b)| format!("ordinal {o} (pod {}: {})", b.pod, b.why))
        .collect();
    format!(
        "skipped {} held by pods this NodeSet does not own; other ordinals were used instead \
         (delete or rename those pods to free their names)",
        items.join(", ")
    )
}

/// Adopt matching orphans (after re-reading the NodeSet from the API: only a live, undeleted
/// owner adopts) and release owned pods that lost the selector labels.
async fn adopt_and_release(pass: &mut Pass<'_>, claims: &mut Claims) -> Result<(), Error> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    if !claims.adopt.is_empty() {
        let api: Api<NodeSet> = Api::namespaced(ctx.client.clone(), &ns.namespace().unwrap_or_default());
        let fresh = api.get(&ns.name_any()).await?;
        if fresh.uid().as_deref() == Some(pass.uid.as_str()) && fresh.metadata.deletion_timestamp.is_none() {
            for p in std::mem::take(&mut claims.adopt) {
                let mut refs = p.owner_references().to_vec();
                refs.push(owner_ref(ns));
                match ctx.writer.set_pod_owners(&p, owners(&refs)).await {
                    Ok(adopted) => {
                        if let Some(o) = claims_name(ns, &p.name_any()) {
                            claims.blocked.remove(&o);
                        }
                        claims.owned.push(Arc::new(adopted));
                    }
                    Err(e) => {
                        let msg = format!("Error adopting pod {}: {}", p.name_any(), writer::message(&e));
                        if let Some(b) =
                            claims_name(ns, &p.name_any()).and_then(|o| claims.blocked.get_mut(&o))
                        {
                            b.why = format!("its adoption failed: {}", writer::message(&e));
                        }
                        pass.failed("FailedAdopt", msg).await;
                    }
                }
            }
        }
    }
    for p in std::mem::take(&mut claims.release) {
        let refs: Vec<OwnerReference> = p
            .owner_references()
            .iter()
            .filter(|o| o.uid != pass.uid)
            .cloned()
            .collect();
        if let Err(e) = ctx.writer.set_pod_owners(&p, owners(&refs)).await {
            let msg = format!("Error releasing pod {}: {}", p.name_any(), writer::message(&e));
            pass.failed("FailedRelease", msg).await;
        }
    }
    Ok(())
}

fn owners(refs: &[OwnerReference]) -> Value {
    serde_json::to_value(refs).unwrap_or(Value::Null)
}

/// Owned pods labelled with another revision scheme (Slinky's `<nodeset>-<hash>`) whose content
/// equals what the active builder makes for their ordinal get this revision's label instead of
/// being replaced: switching from Slinky does not roll the fleet.
async fn relabel_equal_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    revision: &str,
    owned: &mut [Arc<Pod>],
    plugin: &Plugin,
) -> Result<(), Error> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    let foreign = format!("{}-", ns.name_any());
    let candidates: Vec<(usize, u32)> = owned
        .iter()
        .enumerate()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .filter(|(_, p)| {
            p.labels()
                .get(keys::LABEL_REVISION_HASH)
                .is_some_and(|r| r.starts_with(&foreign))
        })
        .filter_map(|(i, p)| claims_name(ns, &p.name_any()).map(|o| (i, o)))
        .take(plan::BURST)
        .collect();
    if candidates.is_empty() {
        return Ok(());
    }
    let identities: Vec<PodIdentity> = candidates
        .iter()
        .map(|(_, o)| PodIdentity::for_ordinal(ns, *o, revision))
        .collect();
    let built = match build_pods(ctx, ns, controller, plugin, identities).await? {
        Ok(built) => built,
        Err(e) => {
            pass.builder_error(&e).await;
            return Ok(());
        }
    };
    for ((i, _), want) in candidates.into_iter().zip(built) {
        let have = &owned[i];
        // Compare with what the server would store of ours (its defaults, its dropped fields).
        let stored = match ctx.writer.dry_run_pod(&want).await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::info!(pod = %have.name_any(), error = %writer::message(&e), "dry run failed; comparing with the built pod");
                want.clone()
            }
        };
        if !same_pod(have, &stored) {
            continue;
        }
        let labels = BTreeMap::from([(keys::LABEL_REVISION_HASH.to_string(), revision.to_string())]);
        let annotations: BTreeMap<String, String> = want
            .annotations()
            .iter()
            .filter(|(k, _)| {
                k.as_str() == keys::ANNOTATION_BUILDER || k.as_str() == keys::ANNOTATION_BUILDER_DIGEST
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match ctx.writer.relabel_pod(have, &labels, &annotations).await {
            Ok(p) => owned[i] = Arc::new(p),
            Err(e) => {
                let msg = format!(
                    "Error relabelling pod {}: {}",
                    have.name_any(),
                    writer::message(&e)
                );
                pass.failed("FailedUpdate", msg).await;
            }
        }
    }
    Ok(())
}

/// Whether a live pod has the labels, annotations and spec of `want` (our pod as stored), but
/// for the revision label and the builder annotations.
fn same_pod(have: &Pod, want: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut labels = p.labels().clone();
        labels.remove(keys::LABEL_REVISION_HASH);
        let mut annotations = p.annotations().clone();
        annotations.remove(keys::ANNOTATION_BUILDER);
        annotations.remove(keys::ANNOTATION_BUILDER_DIGEST);
        serde_json::json!({"labels": labels, "annotations": annotations, "spec": p.spec})
    };
    contains(&strip(have), &strip(want))
}

/// A Warning Event when the API server stored a created pod without fields its builder set.
async fn warn_dropped_fields(pass: &Pass<'_>, built: &Pod, created: &Pod) {
    let part = |p: &Pod| serde_json::json!({"metadata": {"labels": p.labels(), "annotations": p.annotations()}, "spec": p.spec});
    let paths = differences(&part(created), &part(built), 10);
    if !paths.is_empty() {
        let note = dropped_note(&format!("pod {}", built.name_any()), &paths);
        tracing::warn!("{note}");
        pass.ctx
            .event(pass.ns, EventType::Warning, "FieldsDropped", note)
            .await;
    }
}

/// Build pods in one blocking task (copies in, untrusted output checked by the policy).
async fn build_pods(
    ctx: &Context,
    ns: &NodeSet,
    controller: &Controller,
    plugin: &Plugin,
    identities: Vec<PodIdentity>,
) -> Result<Result<Vec<Pod>, PluginError>, Error> {
    let (p, nsc, cc, build) = (plugin.clone(), ns.clone(), controller.clone(), ctx.build.clone());
    let metrics = ctx.metrics.clone();
    ctx.metrics
        .plugin_calls
        .fetch_add(identities.len() as u64, std::sync::atomic::Ordering::Relaxed);
    ctx.blocking(move || {
        identities
            .iter()
            .map(|id| {
                metrics.time_plugin_call(BuilderKind::NodesetPod, || p.build_pod(&build, &nsc, &cc, id))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
}

async fn delete_pods(pass: &mut Pass<'_>, deletes: &[(Arc<Pod>, DeleteReason)]) {
    if deletes.is_empty() {
        return;
    }
    let (ns, ctx) = (pass.ns, pass.ctx);
    let namespace = ns.namespace().unwrap_or_default();
    let uids: Vec<String> = deletes.iter().filter_map(|(p, _)| p.uid()).collect();
    ctx.expectations.expect_deletions(&pass.uid, uids);
    let results = join_all(deletes.iter().map(|(p, _)| {
        let (pn, uid, namespace) = (p.name_any(), p.uid().unwrap_or_default(), namespace.clone());
        async move {
            let r = ctx.writer.delete_pod(&namespace, &pn, &uid).await;
            (pn, uid, r)
        }
    }))
    .await;
    let mut deleted = Vec::new();
    for (pn, uid, r) in results {
        match r {
            Ok(true) => deleted.push(pn),
            // Already gone: its deletion may have been observed before we expected it.
            Ok(false) => ctx.expectations.deletion_observed(&pass.uid, &uid),
            Err(e) => {
                ctx.expectations.deletion_observed(&pass.uid, &uid);
                pass.failed(
                    "FailedDelete",
                    format!("Error deleting pod {pn}: {}", writer::message(&e)),
                )
                .await;
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

/// Build and create the pods of `creates` in slow-start batches (1, 2, 4, …). A name taken
/// meanwhile (409 AlreadyExists) skips that ordinal and the batch goes on; any other refusal
/// stops after its batch, and every create not made is released.
async fn create_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    revision: &str,
    creates: &[u32],
    plugin: &Plugin,
) -> Result<(), Error> {
    if creates.is_empty() {
        return Ok(());
    }
    let (ns, ctx) = (pass.ns, pass.ctx);
    let identities: Vec<PodIdentity> = creates
        .iter()
        .map(|o| PodIdentity::for_ordinal(ns, *o, revision))
        .collect();
    let built = match build_pods(ctx, ns, controller, plugin, identities).await? {
        Ok(built) => built,
        Err(e) => {
            pass.builder_error(&e).await;
            return Ok(());
        }
    };
    let owner = pass.uid.clone();
    ctx.expectations
        .expect_creations(&owner, built.iter().map(ResourceExt::name_any));
    let mut pending = built.into_iter();
    let mut batch = 1;
    let mut created = Vec::new();
    let mut taken = Vec::new();
    loop {
        let this: Vec<Pod> = pending.by_ref().take(batch).collect();
        if this.is_empty() {
            break;
        }
        let results = join_all(this.iter().map(|pod| ctx.writer.create_pod(pod))).await;
        let mut refused = false;
        for (pod, r) in this.iter().zip(results) {
            let name = pod.name_any();
            match r {
                Ok(stored) => {
                    ctx.expectations.creation_succeeded(&owner, &name);
                    // Pods of one pass are built alike: the first tells what the server drops.
                    if created.is_empty() {
                        warn_dropped_fields(pass, pod, &stored).await;
                    }
                    created.push(name);
                }
                Err(e) => {
                    ctx.expectations.creation_observed(&owner, &name);
                    if writer::is_already_exists(&e) {
                        taken.push(name);
                    } else {
                        refused = true;
                        pass.failed(
                            "FailedCreate",
                            format!("Error creating pod {name}: {}", writer::message(&e)),
                        )
                        .await;
                    }
                }
            }
        }
        if refused {
            // Creates never attempted are released: nothing will ever observe them.
            for p in pending.by_ref() {
                ctx.expectations.creation_observed(&owner, &p.name_any());
            }
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
    if !taken.is_empty() {
        ctx.event(
            ns,
            EventType::Warning,
            "PodNameTaken",
            format!(
                "pods {} already exist and are not this NodeSet's (the cache had not shown them yet); \
                 their ordinals were skipped",
                taken.join(", ")
            ),
        )
        .await;
    }
    Ok(())
}

/// The status, computed from the owned pods; conditions merged into the fresh object's on every
/// attempt. `synced`: the pass ran its writes (so `ReplicaFailure` is set or cleared by them;
/// otherwise it is left as it is).
async fn write_status(
    pass: &mut Pass<'_>,
    owned: &[Arc<Pod>],
    revision: Option<&str>,
    synced: bool,
) -> Result<(), Error> {
    let ns = pass.ns;
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let now = Timestamp::now();
    let live: Vec<&Arc<Pod>> = owned
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let desired = ns.replicas().max(0);
    let available = live.iter().filter(|p| is_available(p, min_ready, now)).count() as i32;
    let c = &mut pass.conditions;
    for t in [
        conditions::INVALID_SPEC,
        conditions::BUILDER_FAILED,
        conditions::CONTROLLER_NOT_FOUND,
    ] {
        c.clear(t);
    }
    match &pass.problem {
        Some((type_, msg)) => {
            c.set(type_, true, type_, msg.clone());
            c.set(conditions::READY, false, type_, msg.clone());
        }
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
    if let Some((reason, first)) = pass.failures.first() {
        let message = match pass.failures.len() {
            1 => first.clone(),
            n => format!("{first} (and {} more refused writes)", n - 1),
        };
        c.set(conditions::REPLICA_FAILURE, true, reason, message);
    } else if synced && pass.problem.is_none() {
        c.clear(conditions::REPLICA_FAILURE);
    }
    if let Some((reason, first)) = pass.child_failures.first() {
        let message = match pass.child_failures.len() {
            1 => first.clone(),
            n => format!("{first} (and {} more)", n - 1),
        };
        c.set(conditions::CHILD_FAILURE, true, reason, message);
    } else if pass.children_synced {
        c.clear(conditions::CHILD_FAILURE);
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
        observed_generation: ns.metadata.generation,
        node_set_hash: revision
            .map(str::to_string)
            .or_else(|| ns.status.as_ref().and_then(|s| s.node_set_hash.clone())),
        selector: Some(selector.join(",")),
        conditions: Vec::new(),
    };
    let changes = pass.conditions.clone();
    let compute = move |obj: &NodeSet| NodeSetStatus {
        conditions: changes.apply(
            obj.status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default(),
        ),
        ..status.clone()
    };
    let api: Api<NodeSet> = Api::namespaced(pass.ctx.client.clone(), &ns.namespace().unwrap_or_default());
    pass.ctx
        .writer
        .update_status(&api, ns, compute, |obj: &NodeSet| obj.status.clone())
        .await?;
    Ok(())
}
