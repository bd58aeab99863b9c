//! Pod writes of a pass: build pods with the `nodeset-pod` builder (created in [`super::create`]),
//! delete the planned ones, raising and lowering expectations around each.

use crate::plugins::Builder as _;
use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::{Controller, NodeSet};

use super::{Pass, plan::DeleteReason};
use crate::{
    plugins::{BuilderKind, Pipeline, PluginError, PodIdentity},
    reconcile::{
        Core, Error,
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
