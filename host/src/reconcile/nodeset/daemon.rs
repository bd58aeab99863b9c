//! DaemonSet mode: one pod per eligible Kubernetes node, as Slinky's NodeSet does it with the
//! Kubernetes DaemonSet controller's rules ([`slinky_api::placement`]).
//!
//! # Rules
//! * A node is eligible when a pod built for it (one probe build a pass: the user's
//!   `nodeSelector`, node affinity and tolerations, plus the DaemonSet tolerations) should run
//!   there; its pod is `<nodeset>-<hostname>` (the hostname: the node's name up to its first dot,
//!   or its `hostname-override` annotation), bound to it by a required node affinity.
//! * A pod stays while its node exists and it may keep running there (`NoExecute` taints only,
//!   as the DaemonSet controller): a cordoned node keeps its pod (its Slurm node is drained), and a
//!   pod deleted on a cordoned node is made again (Slinky's #259). Otherwise it is deleted,
//!   through the drain gate like any pod that could run a job.
//! * A failed (or succeeded) pod is deleted and its node gets a new one, with a per-node
//!   exponential backoff (1 s doubling to 15 min, as the DaemonSet controller), so a pod that
//!   cannot start on a node does not loop. A second pod for a node (never made by this host: the
//!   names are the nodes') is deleted, the oldest kept; so is one whose hostname no longer matches
//!   its node's.
//! * A rolling update replaces pods of another revision within `maxUnavailable` of the eligible
//!   nodes, counting nodes without a pod; `OnDelete` leaves them; a scheduled update replaces
//!   the unhealthy ones and those in its open window (as [`super::plan`]).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Node, Pod, PodSpec},
    jiff::Timestamp,
};
use kube::ResourceExt;
use slinky_api::{
    NodeSet, UpdateStrategyType,
    checks::{self, MaxUnavailable},
    keys,
    placement::{hostname_of, target_node, unfit},
};

use super::plan::{
    BURST, CREATE_BURST, DeleteReason, condemn_order, is_available, is_running_and_ready, phase,
};

/// The first wait before a failed pod's node gets a new pod.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest.
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// The per-node backoff of failed pods, by NodeSet UID and node name (the DaemonSet
/// controller's `failedPodsBackoff`).
#[derive(Default)]
pub(crate) struct DaemonBackoff {
    inner: Mutex<HashMap<(String, String), (Duration, Instant)>>,
}

impl DaemonBackoff {
    /// How long the node's next pod must still wait (`None`: it may be made now).
    fn remaining(&self, uid: &str, node: &str, now: Instant) -> Option<Duration> {
        crate::reconcile::core::locked(&self.inner, |m| {
            m.get(&(uid.to_string(), node.to_string()))
                .and_then(|(_, until)| until.checked_duration_since(now))
                .filter(|d| !d.is_zero())
        })
    }

    /// A pod on `node` failed: its next one waits twice as long as the last (from 1 s).
    fn failed(&self, uid: &str, node: &str, now: Instant) {
        crate::reconcile::core::locked(&self.inner, |m| {
            let e = m
                .entry((uid.to_string(), node.to_string()))
                .or_insert((Duration::ZERO, now));
            e.0 = if e.0.is_zero() {
                BACKOFF_FIRST
            } else {
                (e.0 * 2).min(BACKOFF_MAX)
            };
            e.1 = now + e.0;
        });
    }

    /// A pod on `node` runs: forget its failures.
    fn ran(&self, uid: &str, node: &str) {
        crate::reconcile::core::locked(&self.inner, |m| {
            m.remove(&(uid.to_string(), node.to_string()));
        });
    }

    /// Forget a NodeSet.
    pub(crate) fn forget(&self, uid: &str) {
        crate::reconcile::core::locked(&self.inner, |m| m.retain(|(u, _), _| u != uid));
    }
}

/// A node the NodeSet's pods should run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Eligible {
    /// The Kubernetes node.
    pub node: String,
    /// Its Slurm node name (the pod's hostname).
    pub hostname: String,
}

/// What one DaemonSet-mode pass does.
#[derive(Debug, Default)]
pub(super) struct DaemonPlan {
    /// Nodes to make a pod for now.
    pub creates: Vec<Eligible>,
    /// Pods to delete now.
    pub deletes: Vec<(Arc<Pod>, DeleteReason)>,
    /// The nodes the pods should run on (the status' `desired`).
    pub desired: usize,
    /// The soonest a node in backoff may get its pod.
    pub backoff: Option<Duration>,
}

/// What the plan is made from.
pub(super) struct DaemonInputs<'a> {
    pub nodeset: &'a NodeSet,
    pub uid: &'a str,
    pub revision: &'a str,
    pub owned: &'a [Arc<Pod>],
    /// Every Kubernetes node.
    pub nodes: &'a [Arc<Node>],
    /// A pod built for the NodeSet (its placement fields decide eligibility).
    pub probe: &'a PodSpec,
    pub now: Timestamp,
    pub backoff: &'a DaemonBackoff,
    /// `ScheduledUpdate`: the pods in the open maintenance window (`None` for another strategy).
    pub window: Option<&'a std::collections::BTreeSet<String>>,
    /// UIDs of pods of another revision scheme not yet compared with what the builders make:
    /// not updated until they are.
    pub unjudged: &'a std::collections::HashSet<String>,
}

fn finished(p: &Pod) -> bool {
    matches!(phase(p), "Failed" | "Succeeded")
}

/// Plan one pass.
pub(super) fn plan_daemon(inp: &DaemonInputs<'_>) -> DaemonPlan {
    let ns = inp.nodeset;
    let clock = Instant::now();
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let mut plan = DaemonPlan::default();
    let nodes: BTreeMap<String, &Arc<Node>> = inp.nodes.iter().map(|n| (n.name_any(), n)).collect();
    let eligible: Vec<Eligible> = inp
        .nodes
        .iter()
        .filter(|n| unfit(inp.probe, n, false).is_none())
        .map(|n| Eligible {
            node: n.name_any(),
            hostname: hostname_of(n),
        })
        .collect();
    plan.desired = eligible.len();

    // The pods of each node (a pod bound to no node at all is not a daemon pod: replaced).
    let mut by_node: BTreeMap<String, Vec<&Arc<Pod>>> = BTreeMap::new();
    for p in inp.owned {
        match target_node(p) {
            Some(n) => by_node.entry(n).or_default().push(p),
            None if p.metadata.deletion_timestamp.is_none() => {
                plan.deletes.push((p.clone(), DeleteReason::Update));
            }
            None => {}
        }
    }
    let mut old_live: Vec<&Arc<Pod>> = Vec::new();
    let mut unavailable = 0usize;
    for (node, pods) in &by_node {
        let known = nodes.get(node);
        let stays = known.is_some_and(|n| unfit(inp.probe, n, true).is_none());
        let hostname = known.map(|n| hostname_of(n));
        let mut live: Vec<&Arc<Pod>> = Vec::new();
        for p in pods {
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if !stays {
                plan.deletes.push(((*p).clone(), DeleteReason::ScaleDown));
            } else if finished(p) {
                match inp.backoff.remaining(inp.uid, node, clock) {
                    Some(wait) => {
                        plan.backoff = Some(plan.backoff.map_or(wait, |b| b.min(wait)));
                    }
                    None => {
                        inp.backoff.failed(inp.uid, node, clock);
                        plan.deletes.push(((*p).clone(), DeleteReason::Finished));
                    }
                }
            } else if p.labels().get(keys::LABEL_POD_HOSTNAME) != hostname.as_ref() {
                // The node's hostname override changed: its Slurm node is another now.
                plan.deletes.push(((*p).clone(), DeleteReason::Update));
            } else {
                live.push(p);
            }
        }
        // A second pod for a node: keep the oldest.
        live.sort_by_key(|p| p.creation_timestamp().map(|t| t.0));
        for extra in live.iter().skip(1) {
            plan.deletes.push(((*extra).clone(), DeleteReason::ScaleDown));
        }
        if let Some(p) = live.first() {
            if is_running_and_ready(p) {
                inp.backoff.ran(inp.uid, node);
            }
            if !is_available(p, min_ready, inp.now) {
                unavailable += 1;
            }
            let revision = p.labels().get(keys::LABEL_REVISION_HASH).map(String::as_str);
            let current = (revision == Some(inp.revision)
                || p.uid().is_some_and(|u| inp.unjudged.contains(&u)))
                && p.labels().get(keys::LABEL_SCALING_MODE).map(String::as_str)
                    == Some(ns.spec.scaling_mode.as_str());
            if !current {
                old_live.push(p);
            }
        }
    }
    for e in &eligible {
        let has = by_node.get(&e.node).is_some_and(|pods| !pods.is_empty());
        if has {
            continue;
        }
        unavailable += 1;
        match inp.backoff.remaining(inp.uid, &e.node, clock) {
            Some(wait) => plan.backoff = Some(plan.backoff.map_or(wait, |b| b.min(wait))),
            None if plan.creates.len() < CREATE_BURST => plan.creates.push(e.clone()),
            None => {}
        }
    }
    plan.deletes.truncate(BURST);

    plan_updates(inp, &mut plan, old_live, unavailable);
    plan
}

/// The old pods a rolling (or scheduled) update replaces now: every unavailable one, then healthy
/// ones in condemn order while the `maxUnavailable` budget lasts (a scheduled update: those in
/// its window, no budget).
fn plan_updates(inp: &DaemonInputs<'_>, plan: &mut DaemonPlan, old_live: Vec<&Arc<Pod>>, unavailable: usize) {
    let ns = inp.nodeset;
    let min_ready = i64::from(ns.spec.min_ready_seconds.unwrap_or(0));
    let strategy = ns.spec.update_strategy.as_ref();
    let scheduled = strategy.is_some_and(|s| s.type_ == UpdateStrategyType::ScheduledUpdate);
    if old_live.is_empty() || strategy.is_some_and(|s| s.type_ == UpdateStrategyType::OnDelete) {
        return;
    }
    let max = MaxUnavailable::resolve(
        checks::max_unavailable(
            strategy
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.as_ref()),
        )
        .ok()
        .flatten(),
        plan.desired as i32,
    );
    let mut budget = i64::from(max) - unavailable as i64;
    let (unhealthy, mut healthy): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) = old_live
        .into_iter()
        .partition(|p| !is_available(p, min_ready, inp.now));
    if scheduled {
        healthy.retain(|p| inp.window.is_some_and(|w| w.contains(&p.name_any())));
        budget = i64::MAX;
    }
    // Old pods already unavailable cost no budget.
    plan.deletes
        .extend(unhealthy.into_iter().map(|p| (p.clone(), DeleteReason::Update)));
    healthy.sort_by(|a, b| condemn_order(a, b, ns));
    for p in healthy {
        if budget <= 0 || plan.deletes.len() >= BURST {
            break;
        }
        plan.deletes.push((p.clone(), DeleteReason::Update));
        budget -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::nodeset::fixtures::{nodeset, pod};

    fn node(name: &str, extra: serde_json::Value) -> Arc<Node> {
        let mut v = serde_json::json!({"metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}}});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            for (k, val) in e {
                o.insert(k.clone(), val.clone());
            }
        }
        Arc::new(serde_json::from_value(v).unwrap_or_default())
    }

    fn daemon(name: &str) -> NodeSet {
        let mut ns = nodeset(name, 0);
        ns.spec.scaling_mode = slinky_api::ScalingMode::DaemonSet;
        ns
    }

    fn on(ns: &NodeSet, node: &str, rev: &str) -> crate::reconcile::nodeset::fixtures::PodFixture {
        pod(ns, 0)
            .named(&ns.daemon_pod_name(node))
            .on_node(node)
            .label(keys::LABEL_POD_HOSTNAME, node)
            .label(keys::LABEL_SCALING_MODE, "DaemonSet")
            .revision(rev)
    }

    fn inputs<'a>(
        ns: &'a NodeSet,
        owned: &'a [Arc<Pod>],
        nodes: &'a [Arc<Node>],
        probe: &'a PodSpec,
        backoff: &'a DaemonBackoff,
    ) -> DaemonInputs<'a> {
        DaemonInputs {
            nodeset: ns,
            uid: "u",
            revision: "r2",
            owned,
            nodes,
            probe,
            now: Timestamp::now(),
            backoff,
            window: None,
            unjudged: Box::leak(Box::default()),
        }
    }

    #[test]
    fn one_pod_per_eligible_node_and_none_elsewhere() {
        let ns = daemon("w");
        let nodes = [
            node("a", serde_json::json!({})),
            node("b.example.org", serde_json::json!({})),
            node(
                "tainted",
                serde_json::json!({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
            ),
            node(
                "cordoned",
                serde_json::json!({"spec": {"unschedulable": true,
                "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}),
            ),
        ];
        let owned = vec![
            on(&ns, "a", "r2").ready().arc(),
            on(&ns, "gone", "r2").ready().arc(),
        ];
        let probe = PodSpec::default();
        let backoff = DaemonBackoff::default();
        let plan = plan_daemon(&inputs(&ns, &owned, &nodes, &probe, &backoff));
        let creates: Vec<(&str, &str)> = plan
            .creates
            .iter()
            .map(|e| (e.node.as_str(), e.hostname.as_str()))
            .collect();
        assert_eq!(creates, [("b.example.org", "b"), ("cordoned", "cordoned")]);
        assert_eq!(plan.desired, 3, "a, b and the cordoned node; not the tainted one");
        let deletes: Vec<String> = plan.deletes.iter().map(|(p, _)| p.name_any()).collect();
        assert_eq!(deletes, ["w-gone"], "the pod of a node that left");
    }

    #[test]
    fn failed_pods_back_off_per_node_and_duplicates_go() {
        let ns = daemon("w");
        let nodes = [node("a", serde_json::json!({})), node("b", serde_json::json!({}))];
        let probe = PodSpec::default();
        let backoff = DaemonBackoff::default();
        let owned = vec![
            on(&ns, "a", "r2").phase("Failed").arc(),
            on(&ns, "b", "r2").ready().created(1).arc(),
            on(&ns, "b", "r2").named("w-b-dup").ready().created(2).arc(),
        ];
        let plan = plan_daemon(&inputs(&ns, &owned, &nodes, &probe, &backoff));
        let deletes: Vec<(String, DeleteReason)> =
            plan.deletes.iter().map(|(p, r)| (p.name_any(), *r)).collect();
        assert_eq!(
            deletes,
            [
                ("w-a".to_string(), DeleteReason::Finished),
                ("w-b-dup".to_string(), DeleteReason::ScaleDown)
            ]
        );
        // The failed pod is back before its node's backoff ended: it waits.
        let plan = plan_daemon(&inputs(&ns, &owned[..1], &nodes, &probe, &backoff));
        assert!(plan.deletes.is_empty());
        assert!(plan.backoff.is_some_and(|b| b <= BACKOFF_FIRST));
    }

    #[test]
    fn a_rolling_update_stays_within_max_unavailable() {
        let ns = daemon("w");
        let nodes: Vec<Arc<Node>> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| node(n, serde_json::json!({})))
            .collect();
        let owned: Vec<Arc<Pod>> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| on(&ns, n, "r1").ready().arc())
            .collect();
        let probe = PodSpec::default();
        let backoff = DaemonBackoff::default();
        let plan = plan_daemon(&inputs(&ns, &owned, &nodes, &probe, &backoff));
        assert_eq!(plan.deletes.len(), 2, "25% of 5, rounded up");
        assert!(plan.deletes.iter().all(|(_, r)| *r == DeleteReason::Update));
    }
}
