//! The Kubernetes Nodes, for what a cordon means to Slurm: a cordoned node's worker pods have
//! their Slurm nodes drained, uncordoned undrained (see `nodeset::drain`). The cache keeps of a
//! Node only its name, `spec.unschedulable` and the cordon-reason annotation; an event triggers
//! the NodeSets of the pods bound there only when one of those changed.
//!
//! The watch is cluster-wide whatever namespaces the host serves (Nodes have none). A host
//! without RBAC on Nodes logs the refused watch and retries; nothing else waits for it.

use std::{collections::HashMap, sync::Arc};

use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        reflector::{Store, store::Writer},
        watcher,
    },
};
use slinky_api::keys;

use super::triggers::Triggers;
use crate::reconcile::parents::pod_owners;

/// Keep what a pass reads of a Node: the cordon and its reason.
fn slim(node: &mut Node) {
    node.status = None;
    node.metadata.labels = None;
    if let Some(a) = node.metadata.annotations.as_mut() {
        a.retain(|k, _| k == keys::ANNOTATION_NODE_CORDON_REASON);
    }
    if let Some(spec) = node.spec.as_mut() {
        let unschedulable = spec.unschedulable;
        *spec = Default::default();
        spec.unschedulable = unschedulable;
    }
}

/// `(unschedulable, reason)` of a Node.
fn cordon(node: &Node) -> (bool, Option<String>) {
    (
        node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
        node.annotations()
            .get(keys::ANNOTATION_NODE_CORDON_REASON)
            .cloned(),
    )
}

/// Whether the Kubernetes node of `pod` is cordoned, and the reason its annotation gives.
pub fn cordoned(nodes: &Store<Node>, pod: &Pod) -> Option<Option<String>> {
    let name = pod.spec.as_ref()?.node_name.as_ref()?;
    let node = nodes.get(&kube::runtime::reflector::ObjectRef::new(name))?;
    let (unschedulable, reason) = cordon(&node);
    unschedulable.then_some(reason)
}

/// The Node watch into `writer`: a change of a node's cordon triggers the NodeSets of the pods
/// bound there (read from `pods`).
pub(super) fn node_task(
    client: &Client,
    writer: Writer<Node>,
    pods: Store<Pod>,
    t: Triggers,
) -> impl Future<Output = ()> + Send + 'static {
    let mut seen: HashMap<String, (bool, Option<String>)> = HashMap::new();
    // Nodes have no namespace: none is filtered out.
    let stream = super::root(
        Api::<Node>::all(client.clone()),
        writer,
        Arc::new(Vec::new()),
        "Node",
        slim,
    );
    let pods = Arc::new(pods);
    stream.for_each(move |ev| {
        let changed: Vec<String> = match &ev {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                let now = cordon(n);
                let before = seen.insert(n.name_any(), now.clone());
                // First sight of an uncordoned node: nothing to tell.
                let first_and_plain = before.is_none() && !now.0;
                if before.as_ref() == Some(&now) || first_and_plain {
                    Vec::new()
                } else {
                    vec![n.name_any()]
                }
            }
            watcher::Event::Delete(n) => {
                seen.remove(&n.name_any());
                Vec::new()
            }
            _ => Vec::new(),
        };
        for node in changed {
            for pod in pods
                .state()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()))
            {
                for n in pod_owners(pod, &t.nodesets) {
                    t.nodeset(n);
                }
            }
        }
        futures::future::ready(())
    })
}
