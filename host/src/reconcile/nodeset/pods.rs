//! Pod writes of a pass: build pods with the `nodeset-pod` builder, delete the planned ones and
//! create the missing ones in slow-start batches, raising and lowering expectations around each.

use crate::plugins::Builder as _;
use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::{Controller, NodeSet};

use super::{Pass, plan::DeleteReason, volumes};
use crate::{
    plugins::{BuilderKind, Pipeline, PluginError, PodIdentity},
    reconcile::{
        Core, Error, Expectations,
        core::compare::{differences, dropped_note},
        core::events::name_list,
        core::time_plugin_call,
        core::writer,
    },
};

/// A Warning Event when the API server stored a created pod without fields its builder set.
pub(super) async fn warn_dropped_fields(pass: &Pass<'_>, built: &Pod, created: &Pod) {
    let part = |p: &Pod| serde_json::json!({"metadata": {"labels": p.labels(), "annotations": p.annotations()}, "spec": p.spec});
    let paths = differences(&part(created), &part(built), 10);
    if !paths.is_empty() {
        let note = dropped_note(&format!("pod {}", built.name_any()), &paths);
        tracing::warn!("{note}");
        pass.core()
            .event(pass.ns, EventType::Warning, "FieldsDropped", note)
            .await;
    }
}

/// `pinToNode`: the node the pod of `ordinal` last ran on (`status.ordinalToNode`), while it
/// exists and is schedulable (as Slinky: a pod is not pinned to a node it cannot go back to).
fn pin_target(pass: &Pass<'_>, ordinal: u32) -> Option<String> {
    let node = pass
        .ns
        .status
        .as_ref()?
        .ordinal_to_node
        .get(&ordinal.to_string())?;
    let nodes = &pass.ctx.caches.nodes;
    if nodes.is_empty() {
        // No Node is known (the cache has not synced, or the host may not read Nodes): pin; the
        // scheduler keeps the pod Pending if the node is really gone.
        return Some(node.clone());
    }
    let cached = nodes.get(&kube::runtime::reflector::ObjectRef::new(node));
    let usable = cached.is_some_and(|n| !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false));
    if !usable {
        tracing::info!(
            ordinal,
            node,
            "pod not pinned to its node: the node is gone or cordoned"
        );
    }
    usable.then(|| node.clone())
}

/// Where a new pod goes, besides what its builder says.
pub(super) enum Place {
    /// `pinToNode`: the node its ordinal last ran on.
    Pin(String),
    /// DaemonSet mode: its node (a required node affinity and the daemon tolerations).
    Node(String),
}

/// A pod to create: who it is, and where it goes.
pub(super) struct Slot {
    pub(super) identity: PodIdentity,
    pub(super) place: Option<Place>,
}

/// The slots of the StatefulSet-mode ordinals `creates` (pinned to their last node with
/// `pinToNode`).
pub(super) fn ordinal_slots(pass: &Pass<'_>, revision: &str, creates: &[u32]) -> Vec<Slot> {
    creates
        .iter()
        .map(|o| Slot {
            identity: PodIdentity::for_ordinal(pass.ns, *o, revision),
            place: pass
                .ns
                .spec
                .pin_to_node
                .then(|| pin_target(pass, *o))
                .flatten()
                .map(Place::Pin),
        })
        .collect()
}

/// Why a pod of a batch was not created.
enum Refused {
    /// One of its claims could not be made, or is being deleted.
    Claim(volumes::Missing),
    /// The API server refused the pod (after the claims named were made for it).
    Api(kube::Error, Vec<String>),
}

/// Build pods in one blocking task (copies in, untrusted output checked by the policy).
pub(super) async fn build_pods(
    core: &Core,
    ns: &NodeSet,
    controller: &Controller,
    plugin: &Pipeline,
    identities: Vec<PodIdentity>,
) -> Result<Result<Vec<Pod>, PluginError>, Error> {
    let (p, nsc, cc, build) = (plugin.clone(), ns.clone(), controller.clone(), core.build.clone());
    let metrics = core.metrics.clone();
    core.metrics.plugin_calls.inc_by(identities.len() as u64);
    core.blocking(move || {
        identities
            .iter()
            .map(|id| {
                time_plugin_call(&metrics, BuilderKind::NodesetPod, || {
                    p.build_pod(&build, &nsc, &cc, id)
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
}

pub(super) async fn delete_pods(pass: &mut Pass<'_>, deletes: &[(Arc<Pod>, DeleteReason)]) {
    if deletes.is_empty() {
        return;
    }
    let (ns, ctx) = (pass.ns, pass.ctx);
    let core = ctx.core.as_ref();
    let namespace = ns.namespace().unwrap_or_default();
    let uids: Vec<String> = deletes.iter().filter_map(|(p, _)| p.uid()).collect();
    ctx.expectations.expect_deletions(&pass.uid, uids);
    let results = join_all(deletes.iter().map(|(p, _)| {
        let (pn, uid, namespace) = (p.name_any(), p.uid().unwrap_or_default(), namespace.clone());
        async move {
            let r = core.writer.delete_pod(&namespace, &pn, &uid).await;
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
        core.event(
            ns,
            EventType::Normal,
            "SuccessfulDelete",
            format!("Deleted pods: {}", name_list(&deleted)),
        )
        .await;
    }
}

/// At most this many pods are built and being created at once, across all NodeSets (the
/// semaphore [`Core::create_permits`]; a slow-start batch takes at most this many).
///
/// Below the HTTP/2 streams a kube-apiserver allows on one connection (100 since the fix of
/// CVE-2023-44487, about 15 of them held by the watches): a create past them would wait in the
/// client, and an elected host's write timeout (counted from the call) would abandon it.
pub const CREATES_IN_FLIGHT: usize = 64;

/// Release the create expectations of pods that will not be created (nothing will observe them).
fn release(expectations: &Expectations, owner: &str, names: impl Iterator<Item = String>) {
    for name in names {
        expectations.creation_observed(owner, &name);
    }
}

/// Create the pods of `slots` in slow-start batches (1, 2, 4, …), each built with the
/// `nodeset-pod` builder just before it is sent, and each pod after its volume claims
/// ([`volumes::ensure`]). A name taken meanwhile (409 AlreadyExists) skips that pod and the
/// batch goes on; any other refusal (a claim's or the builder's included) stops after its batch,
/// and every create not made is released.
///
/// A batch holds [`Core::create_permits`] (one a pod) while it is built and sent: however many
/// NodeSets scale at once, at most that many built pods exist and that many creates are in
/// flight (100 NodeSets building all their pods first held hundreds of MiB).
pub(super) async fn create_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    slots: Vec<Slot>,
    plugin: &Pipeline,
) -> Result<(), Error> {
    if slots.is_empty() {
        return Ok(());
    }
    let (ns, ctx) = (pass.ns, pass.ctx);
    let core = ctx.core.as_ref();
    let owner = pass.uid.clone();
    ctx.expectations
        .expect_creations(&owner, slots.iter().map(|s| s.identity.name.clone()));
    let mut pending = slots.into_iter();
    let mut batch = 1;
    let mut done = Created::default();
    loop {
        let this: Vec<Slot> = pending.by_ref().take(batch.min(CREATES_IN_FLIGHT)).collect();
        if this.is_empty() {
            break;
        }
        // The semaphore is never closed: an error here cannot happen, and would only mean no
        // bound.
        let _permits = pass.ctx.create_permits.acquire_many(this.len() as u32).await.ok();
        let names: Vec<String> = this.iter().map(|s| s.identity.name.clone()).collect();
        let (identities, places): (Vec<PodIdentity>, Vec<Option<Place>>) =
            this.into_iter().map(|s| (s.identity, s.place)).unzip();
        let built = build_pods(core, ns, controller, plugin, identities).await;
        if !matches!(built, Ok(Ok(_))) {
            // A failed build creates nothing of this batch or after it: release them all.
            release(
                &ctx.expectations,
                &owner,
                names.into_iter().chain(pending.by_ref().map(|s| s.identity.name)),
            );
        }
        let mut built = match built {
            Ok(Ok(built)) => built,
            Ok(Err(e)) => {
                pass.state.builder_error(&e).await;
                break;
            }
            Err(e) => return Err(e),
        };
        for (pod, place) in built.iter_mut().zip(&places) {
            match place {
                Some(Place::Pin(node)) => slinky_api::pods::pin_to_node(pod, node),
                Some(Place::Node(node)) => slinky_api::placement::place_on_node(pod, node),
                None => {}
            }
        }
        let results = create_batch(pass, &built, batch == 1).await;
        if done.record(pass, &built, results).await {
            // Creates never attempted are released: nothing will ever observe them.
            release(&ctx.expectations, &owner, pending.map(|s| s.identity.name));
            break;
        }
        batch *= 2;
    }
    done.announce(core, ns).await;
    Ok(())
}

/// Create one batch of pods, each after its claims (as the StatefulSet controller: no pod
/// without its storage). The pass's first pod is read back (`first_of_pass`: what the server
/// dropped of it is checked; the pods of a pass are built alike); the others' answers are not
/// decoded.
async fn create_batch(pass: &Pass<'_>, built: &[Pod], first_of_pass: bool) -> Vec<Made> {
    let core = pass.core();
    join_all(built.iter().enumerate().map(|(i, pod)| async move {
        let made = volumes::ensure(pass, &pod.name_any())
            .await
            .map_err(Refused::Claim)?;
        let created = if first_of_pass && i == 0 {
            core.writer.create_pod(pod).await.map(Some)
        } else {
            core.writer.create_pod_unread(pod).await.map(|()| None)
        };
        match created {
            Ok(stored) => Ok((stored, made)),
            Err(e) => Err(Refused::Api(e, made)),
        }
    }))
    .await
}

/// What one create made: the pod as stored (the first of a pass, read back) and the claims made
/// for it; or why it was refused.
type Made = Result<(Option<Pod>, Vec<String>), Refused>;

/// What the creates of a pass made: pods, names found taken, claims.
#[derive(Default)]
struct Created {
    pods: Vec<String>,
    taken: Vec<String>,
    claims: Vec<String>,
}

impl Created {
    /// Record the answers of one batch (expectations lowered for every pod not created, a
    /// `FailedCreate` for every refusal); whether a create was refused (the pass stops).
    async fn record(&mut self, pass: &mut Pass<'_>, built: &[Pod], results: Vec<Made>) -> bool {
        let (ctx, owner) = (pass.ctx, pass.uid.clone());
        let mut refused = false;
        for (pod, r) in built.iter().zip(results) {
            let name = pod.name_any();
            match r {
                Err(Refused::Claim(missing)) => {
                    ctx.expectations.creation_observed(&owner, &name);
                    refused |= !missing.deleting;
                    pass.failed("FailedCreate", missing.message).await;
                }
                Ok((stored, made)) => {
                    self.claims.extend(made);
                    ctx.expectations.creation_succeeded(&owner, &name);
                    // Pods of one pass are built alike: the first tells what the server drops.
                    if let Some(stored) = stored {
                        warn_dropped_fields(pass, pod, &stored).await;
                    }
                    self.pods.push(name);
                }
                Err(Refused::Api(e, made)) => {
                    self.claims.extend(made);
                    ctx.expectations.creation_observed(&owner, &name);
                    if writer::is_already_exists(&e) {
                        self.taken.push(name);
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
        refused
    }

    /// One Event each for the claims and pods created and the names found taken.
    async fn announce(&self, core: &crate::reconcile::core::context::Core, ns: &NodeSet) {
        if !self.claims.is_empty() {
            let note = format!("Created claims: {}", name_list(&self.claims));
            core.event(ns, EventType::Normal, "SuccessfulCreate", note).await;
        }
        if !self.pods.is_empty() {
            let note = format!("Created pods: {}", name_list(&self.pods));
            core.event(ns, EventType::Normal, "SuccessfulCreate", note).await;
        }
        if !self.taken.is_empty() {
            let note = format!(
                "pods {} already exist and are not this NodeSet's (the cache had not shown them yet); \
                 they were skipped",
                name_list(&self.taken)
            );
            core.event(ns, EventType::Warning, "PodNameTaken", note).await;
        }
    }
}
