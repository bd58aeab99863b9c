//! The Kubernetes Nodes, for what a cordon means to Slurm (a cordoned node's worker pods have
//! their Slurm nodes drained, uncordoned undrained: see `nodeset::drain`) and where
//! DaemonSet-mode NodeSets put their pods (`nodeset::daemon`). The cache keeps of a Node only its
//! name, labels, `spec.unschedulable`, taints and the cordon-reason and hostname-override
//! annotations. An event triggers the NodeSets of the pods bound there when the cordon changed,
//! and every DaemonSet-mode NodeSet when the node came, went, or changed where pods may go.
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
use crate::reconcile::core::parents::pod_owners;

/// Keep what a pass reads of a Node: its labels and taints (placement), the cordon and its
/// reason, the hostname override.
fn slim(node: &mut Node) {
    node.status = None;
    if let Some(a) = node.metadata.annotations.as_mut() {
        a.retain(|k, _| k == keys::ANNOTATION_NODE_CORDON_REASON || k == keys::ANNOTATION_HOSTNAME_OVERRIDE);
    }
    if let Some(spec) = node.spec.as_mut() {
        let (unschedulable, taints) = (spec.unschedulable, spec.taints.take());
        *spec = Default::default();
        spec.unschedulable = unschedulable;
        spec.taints = taints;
    }
}

/// A hash of what decides whether a DaemonSet-mode pod goes on a node (its labels, taints and
/// hostname override).
fn placement(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    node.annotations()
        .get(keys::ANNOTATION_HOSTNAME_OVERRIDE)
        .hash(&mut h);
    for t in node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        (&t.key, &t.value, &t.effect).hash(&mut h);
    }
    h.finish()
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
    let mut placed: HashMap<String, u64> = HashMap::new();
    // Nodes have no namespace: none is filtered out.
    let stream = super::root(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        writer,
        Arc::new(Vec::new()),
        "Node",
        slim,
    );
    let pods = Arc::new(pods);
    stream.for_each(move |ev| {
        // A node came, went or changed where pods may go: every DaemonSet-mode NodeSet looks.
        let moved = match &ev {
            watcher::Event::Apply(n) => placed.insert(n.name_any(), placement(n)) != Some(placement(n)),
            watcher::Event::InitApply(n) => {
                placed.insert(n.name_any(), placement(n));
                false
            }
            watcher::Event::Delete(n) => placed.remove(&n.name_any()).is_some(),
            watcher::Event::InitDone => true,
            watcher::Event::Init => false,
        };
        if moved {
            for n in t.nodesets.state().iter().filter(|n| n.is_daemon()) {
                t.nodeset(kube::runtime::reflector::ObjectRef::from_obj(n.as_ref()));
            }
        }
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
