//! Drains that are not ours stay: telling the host's drains from everyone else's, remembering
//! the others durably and giving them back to the node of a replacement pod.
//!
//! # Rules
//! * **Ours is a known text, not a prefix.** The host's reasons for a pod are known exactly: its
//!   scale-in, rolling-update, maintenance-window, Kubernetes-cordon, `pod-cordon` and
//!   NodeSet-deletion drains (they name the NodeSet, so one request drains the nodes of a
//!   scale-in; the per-pod texts of earlier versions are recognised too), the pre-stop hook's
//!   DOWN (`slurm-operator: Pod is terminating`, Slinky's text), and the drains Slinky's operator wrote for the very same pod (its scale-in
//!   and cordon texts, which name the pod). Any other reason, even one starting with
//!   `slurm-operator:` (a GPU health checker's, an admin's copy), is someone else's: never undone.
//! * **`pod-cordon`** (Slinky's `nodeset.slinky.slurm.net/pod-cordon=true` on a pod) drains the
//!   pod's node with Slinky's reason `slurm-operator: Pod (<namespace>/<pod>) was cordoned`; the
//!   annotation removed, that drain is undone. It is the pod owner's wish, so it is kept like
//!   someone else's: carried to the replacement (whose pod gets the annotation again).
//! * **Kept durably.** Someone else's DRAIN or DOWN (and a `pod-cordon` drain) is written into
//!   the NodeSet's `status.keptDrains` (node → state, reason, pod) while the node has it, before its
//!   pod is deleted (a pod waits a pass for it), so a host restart or a new leader still has it.
//!   A pod's pre-stop hook marks its node DOWN with the host's reason; once the replacement pod
//!   is ready, the node gets back what it had: a DOWN is set again with its reason (the node
//!   never leaves DOWN), a DRAIN is given back by a RESUME and a DRAIN sent together: Slurm's
//!   RESUME of a DOWN node waits for the node's slurmd to answer a ping (`NOT_RESPONDING` until
//!   then) before the node may take a job, so the DRAIN, milliseconds later, lands first.
//! * A record names the pod (UID) it was taken from. A pod of another UID on that node is its
//!   replacement ([`succeed`]): a `pod-cordon` one is annotated at once; the drain is given back
//!   once the replacement is ready and its predecessor gone (the replacement may show up before
//!   the predecessor's pre-stop hook ran), also to a node back in service by itself
//!   (`ReturnToService=2`, a give-back cut short; a busy one is drained, never set DOWN); then the
//!   record names the replacement. Until then the drain is neither undone nor forgotten.
//! * A record is forgotten once the node of the pod it names is back in service (someone resumed
//!   it) or its reason changed to one of ours that is not the pre-stop hook's, and when the host
//!   deletes the node (DaemonSet mode's defunct nodes).

use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::events::EventType};
use slinky_api::{KeptDrain, NodeSet, keys};
use slinky_slurm::{Node, REASON_PREFIX};

use super::{Pass, plan::DeleteReason};
use crate::reconcile::{core::writer, slurm::Cluster};

/// The reason the pre-stop hook of every worker pod (the bundled builder's, and Slinky's) marks
/// its node DOWN with.
pub(super) const PRESTOP_REASON: &str = "slurm-operator: Pod is terminating";

/// `reason` with the host's prefix, as Slurm shows a drain of the host.
pub(super) fn prefixed(reason: &str) -> String {
    format!("{REASON_PREFIX} {reason}")
}

/// The pod carries `pod-cordon=true`.
pub(super) fn pod_cordoned(pod: &Pod) -> bool {
    pod.annotations()
        .get(keys::ANNOTATION_POD_CORDON)
        .is_some_and(|v| v == "true")
}

/// The drain reason of a `pod-cordon` (Slinky's text, without the prefix).
pub(super) fn pod_cordon_reason(pod: &Pod) -> String {
    format!(
        "Pod ({}/{}) was cordoned",
        pod.namespace().unwrap_or_default(),
        pod.name_any()
    )
}

/// Why a pod's node is drained for its delete (the drain reason after the host's prefix). It
/// names the NodeSet, not the pod (the node is the pod's hostname), so the nodes of one
/// scale-in or update step share it and are drained in one request.
pub(super) fn drain_reason(ns: &NodeSet, reason: DeleteReason) -> String {
    match reason {
        DeleteReason::Update if ns.is_scheduled_update() => format!(
            "replaced in the maintenance window of reservation {}",
            ns.reservation_name()
        ),
        DeleteReason::Update => format!("replaced by a rolling update of NodeSet {}", ns.name_any()),
        _ => format!("removed by a scale-in of NodeSet {}", ns.name_any()),
    }
}

/// The drain reason of the nodes of a NodeSet being deleted (without the prefix).
pub(super) fn deletion_reason(ns: &NodeSet) -> String {
    format!("NodeSet {} is being deleted", ns.name_any())
}

/// Whether `reason` is one the host writes for `pod`'s node (see the module's rules).
pub(super) fn ours(reason: &str, pod: &Pod, ns: &NodeSet) -> bool {
    if reason == PRESTOP_REASON {
        return true;
    }
    let Some(rest) = reason
        .strip_prefix(REASON_PREFIX)
        .and_then(|r| r.strip_prefix(' '))
    else {
        return false;
    };
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let k8s_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let exact = [
        drain_reason(ns, DeleteReason::ScaleDown),
        format!("replaced by a rolling update of NodeSet {}", ns.name_any()),
        // Whatever the strategy is now (it may have changed since the drain).
        format!(
            "replaced in the maintenance window of reservation {}",
            ns.reservation_name()
        ),
        // This host before 2026-12 named the pod.
        format!("pod {name} is removed by a scale-in"),
        format!("pod {name} is replaced by a rolling update"),
        format!(
            "pod {name} is replaced in the maintenance window of reservation {}",
            ns.reservation_name()
        ),
        pod_cordon_reason(pod),
        deletion_reason(ns),
        // Slinky's operator, for this pod.
        format!("Pod ({namespace}/{name}) is pending termination for scale-in"),
        format!("Node ({k8s_node}) was cordoned, Pod ({namespace}/{name}) must be cordoned"),
    ];
    exact.iter().any(|e| e == rest)
        || (!k8s_node.is_empty() && rest.starts_with(&format!("Kubernetes node {k8s_node} is cordoned")))
}

/// What `status.keptDrains` should hold for the node of `pod`: someone else's DRAIN or DOWN, or
/// the drain of the pod's `pod-cordon`; nothing for a node in service, one of the host's own
/// drains, or a DOWN slurmctld set because the node stopped answering (Slurm returns it).
pub(super) fn to_keep(node: &Node, pod: &Pod, ns: &NodeSet) -> Option<KeptDrain> {
    if !(node.is_drain() || node.is_down()) || node.reason.is_empty() {
        return None;
    }
    if node.is_down() && node.reason.eq_ignore_ascii_case("Not responding") {
        // slurmctld's own: Slurm returns the node when its slurmd answers again. (An admin's
        // DOWN on a node whose slurmd also stopped answering is someone else's all the same.)
        return None;
    }
    let cordon = pod_cordoned(pod) && node.reason == prefixed(&pod_cordon_reason(pod));
    if ours(&node.reason, pod, ns) && !cordon {
        return None;
    }
    Some(KeptDrain {
        state: if node.is_down() { "DOWN" } else { "DRAIN" }.into(),
        reason: node.reason.clone(),
        pod: pod.uid(),
    })
}

impl Pass<'_> {
    /// Keep `drain` for `node` in `status.keptDrains` (`None`: forget it) when the pass writes
    /// its status.
    pub(super) fn remember(&mut self, node: &str, drain: Option<KeptDrain>) {
        self.kept.insert(node.to_string(), drain);
    }
}

/// What the stored status (the cache's) keeps for `node`.
pub(super) fn stored<'a>(ns: &'a NodeSet, node: &str) -> Option<&'a KeptDrain> {
    ns.status.as_ref()?.kept_drains.get(node)
}

/// `pod` replaced the pod whose node's drain `kept` records (`may`: it is ready and its
/// predecessor is gone). While the node still has the drain, the record passes to `pod` once the
/// predecessor is gone (its pre-stop hook, if it runs, comes first); a node marked DOWN by that
/// hook, or back in service without the drain (`ReturnToService=2`, a give-back cut short), gets
/// it back. The record names `pod` from then on.
pub(super) async fn succeed(
    pass: &mut Pass<'_>,
    cluster: &Cluster,
    pod: &Pod,
    node: &Node,
    kept: &KeptDrain,
    may: bool,
) {
    if kept.reason == prefixed(&pod_cordon_reason(pod)) && !pod_cordoned(pod) {
        // The wish passes to the replacement: the annotation first.
        annotate_cordon(pass, pod).await;
        pass.retry_soon();
        return;
    }
    if !may {
        return;
    }
    let has_it = node.reason == kept.reason && (node.is_down() || (kept.state == "DRAIN" && node.is_drain()));
    if !has_it && !give_back(pass, cluster, pod, node, kept).await {
        // Not given back (yet): the record stays the predecessor's, and is tried again.
        return;
    }
    pass.remember(
        &node.name,
        Some(KeptDrain {
            pod: pod.uid(),
            ..kept.clone()
        }),
    );
}

/// Give the node of `pod` (ready, its predecessor's pre-stop hook having marked it DOWN) what
/// it had: a DOWN set again with its reason, or a DRAIN. A `pod-cordon` drain is given back as
/// the annotation on the pod first, then (on a pass whose cache shows it) the drain.
pub(super) async fn give_back(
    pass: &mut Pass<'_>,
    cluster: &Cluster,
    pod: &Pod,
    node: &Node,
    kept: &KeptDrain,
) -> bool {
    let name = &node.name;
    if kept.reason == prefixed(&pod_cordon_reason(pod)) && !pod_cordoned(pod) {
        // The annotation first, the drain on a pass that sees it: a drain of the host's
        // text on a pod without it would be undone.
        annotate_cordon(pass, pod).await;
        pass.retry_soon();
        return false;
    }
    let done = if kept.state == "DOWN" && !node.is_busy() {
        cluster.down_as_is(name, &kept.reason).await
    } else if node.is_busy() {
        // Jobs landed meanwhile (a node back in service by itself): DOWN would kill them.
        cluster.drain_as_is(name, &kept.reason).await
    } else {
        let resumed = if node.is_down() {
            cluster.undrain(name, true).await
        } else {
            Ok(())
        };
        match resumed {
            Ok(()) => cluster.drain_as_is(name, &kept.reason).await,
            Err(u) => Err(u),
        }
    };
    if let Err(u) = done {
        pass.slurm_failed(u).await;
        return false;
    }
    let what = if kept.state == "DOWN" { "DOWN" } else { "drain" };
    pass.core()
        .event(
            pass.ns,
            EventType::Normal,
            "DrainKept",
            format!(
                "Slurm node {name} keeps the {what} it had before its pod was replaced: {}",
                kept.reason
            ),
        )
        .await;
    true
}

/// `pod-cordon=true` on `pod` again (its predecessor had it).
pub(super) async fn annotate_cordon(pass: &mut Pass<'_>, pod: &Pod) {
    let set = pass
        .core()
        .writer
        .set_pod_annotation(pod, keys::ANNOTATION_POD_CORDON, Some("true"))
        .await;
    if let Err(e) = set {
        pass.failed(
            "FailedUpdate",
            format!(
                "Error setting {} on pod {}: {}",
                keys::ANNOTATION_POD_CORDON,
                pod.name_any(),
                writer::message(&e)
            ),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, k8s_node: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("slurm".into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some(k8s_node.into()),
            ..Default::default()
        });
        p
    }

    fn node(state: &[&str], reason: &str) -> Node {
        Node::new("slinky-1", state, reason)
    }

    #[test]
    fn only_the_hosts_own_texts_for_the_pod_are_ours() {
        let ns = NodeSet::new("slinky", Default::default());
        let p = pod("slinky-1", "k1");
        for reason in [
            PRESTOP_REASON,
            "slurm-operator: removed by a scale-in of NodeSet slinky",
            "slurm-operator: replaced by a rolling update of NodeSet slinky",
            "slurm-operator: replaced in the maintenance window of reservation SlurmOperatorMaint-slinky",
            "slurm-operator: pod slinky-1 is removed by a scale-in",
            "slurm-operator: pod slinky-1 is replaced by a rolling update",
            "slurm-operator: Kubernetes node k1 is cordoned: disk failing",
            "slurm-operator: Pod (slurm/slinky-1) was cordoned",
            "slurm-operator: NodeSet slinky is being deleted",
            "slurm-operator: Pod (slurm/slinky-1) is pending termination for scale-in",
            // A maintenance window's drain, after the strategy changed away.
            "slurm-operator: pod slinky-1 is replaced in the maintenance window of reservation SlurmOperatorMaint-slinky",
        ] {
            assert!(ours(reason, &p, &ns), "{reason}");
        }
        for reason in [
            "slurm-operator: GPU XID 79 (health check)",
            "slurm-operator: pod slinky-2 is removed by a scale-in",
            "slurm-operator: removed by a scale-in of NodeSet other",
            "slurm-operator: Kubernetes node k2 is cordoned",
            "slurm-operator:pod slinky-1 is removed by a scale-in",
            "bad-gpu",
            "",
        ] {
            assert!(!ours(reason, &p, &ns), "{reason}");
        }
    }

    #[test]
    fn someone_elses_drain_or_down_and_a_pod_cordon_are_kept() {
        let ns = NodeSet::new("slinky", Default::default());
        let mut p = pod("slinky-1", "k1");
        let kept = |n: &Node, p: &Pod| to_keep(n, p, &ns).map(|k| (k.state, k.reason));
        let health = "slurm-operator: GPU XID 79 (health check)";
        assert_eq!(
            kept(&node(&["IDLE", "DRAIN"], health), &p),
            Some(("DRAIN".into(), health.into()))
        );
        assert_eq!(
            kept(&node(&["DOWN", "DRAIN"], "bad-gpu"), &p),
            Some(("DOWN".into(), "bad-gpu".into()))
        );
        assert_eq!(kept(&node(&["DOWN"], PRESTOP_REASON), &p), None);
        assert_eq!(
            kept(&node(&["DOWN", "NOT_RESPONDING"], "Not responding"), &p),
            None
        );
        assert_eq!(
            kept(&node(&["DOWN", "NOT_RESPONDING"], "bad-gpu"), &p),
            Some(("DOWN".into(), "bad-gpu".into())),
            "an admin's DOWN on a node whose slurmd stopped answering"
        );
        assert_eq!(kept(&node(&["IDLE"], ""), &p), None);
        let cordon = "slurm-operator: Pod (slurm/slinky-1) was cordoned";
        assert_eq!(
            kept(&node(&["IDLE", "DRAIN"], cordon), &p),
            None,
            "annotation gone: ours to undo"
        );
        p.metadata.annotations = Some([(keys::ANNOTATION_POD_CORDON.to_string(), "true".to_string())].into());
        assert_eq!(
            kept(&node(&["IDLE", "DRAIN"], cordon), &p),
            Some(("DRAIN".into(), cordon.into()))
        );
    }
}
