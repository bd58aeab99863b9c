//! A NodeSet's children other than pods: the workers' Service and PodDisruptionBudget shared by
//! the Controller's NodeSets, and the NodeSet's own (the SSH ConfigMap), through the one child
//! path.
//!
//! # Guarantees
//! * A pass builds and compares them only when something they are made from may have changed
//!   since the last pass that found them all as built ([`SyncedChildren`]): the NodeSet or its
//!   Controller (another resourceVersion), the builder, the NodeSets sharing them, or one of the
//!   children itself (another resourceVersion in the cache, or gone); and at least once a resync
//!   period. A scale-up's passes (one per pod event) build no children: with 100 NodeSets sharing
//!   the workers' Service and PodDisruptionBudget, each of those passes built both with 100 owner
//!   references and compared them, a fifth of the host's CPU.

use crate::plugins::Builder as _;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::ResourceExt;
use slinky_api::{Controller, NodeSet};

use super::Pass;
use crate::{
    plugins::{BuilderKind, Child, ChildKind, Ownership},
    reconcile::{
        Error,
        core::apply::{ChildSync, keys_of},
        core::{caches::ChildCaches, locked, time_plugin_call},
    },
};

/// The kinds of a NodeSet's children other than pods (what pruning looks at).
const CHILD_KINDS: [ChildKind; 3] = [
    ChildKind::ConfigMap,
    ChildKind::Service,
    ChildKind::PodDisruptionBudget,
];

/// Build the NodeSet's children other than pods, give the shared ones their owners (every
/// NodeSet of the namespace referencing the same Controller), apply them, and prune the ones
/// this NodeSet controls that are no longer built.
pub(super) async fn sync_children(pass: &mut Pass<'_>, controller: &Controller) -> Result<(), Error> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    let core = ctx.core.as_ref();
    let plugin = core.plugins.pipeline(BuilderKind::NodesetChildren, &ns.metadata);
    let sharing: Vec<Arc<NodeSet>> = ctx
        .caches
        .nodesets
        .state()
        .into_iter()
        .filter(|n| n.shares_workers_with(ns) && n.metadata.deletion_timestamp.is_none())
        .collect();
    // This NodeSet is a sharer even before the cache shows it (or after a recreate).
    let mut sharers: Vec<&NodeSet> = sharing
        .iter()
        .map(|n| n.as_ref())
        .filter(|n| n.uid() != ns.uid())
        .collect();
    sharers.push(ns);
    let inputs = SyncedChildren::inputs(ns, controller, plugin.digest(), &sharers);
    let namespace = ns.namespace().unwrap_or_default();
    let caches = &ctx.caches.children;
    if ctx
        .synced_children
        .still_as_built(&pass.uid, &namespace, &inputs, caches, core.resync)
    {
        pass.children_synced = true;
        return Ok(());
    }
    let (p, nsc, cc, build) = (plugin, ns.clone(), controller.clone(), core.build.clone());
    let metrics = core.metrics.clone();
    core.metrics.plugin_calls.inc_by(1);
    let built = core
        .blocking(move || {
            time_plugin_call(&metrics, BuilderKind::NodesetChildren, || {
                p.build_nodeset_children(&build, &nsc, &cc)
            })
        })
        .await?;
    let mut children: Vec<Child> = match built {
        Ok(children) => children,
        Err(e) => {
            pass.state.builder_error(&e).await;
            return Ok(());
        }
    };
    let owners = slinky_api::owners::shared_refs(sharers.iter().copied());
    let uids = owners.iter().map(|o| o.uid.clone()).collect();
    for c in children.iter_mut().filter(|c| c.ownership == Ownership::Shared) {
        c.set_owners(owners.clone());
    }
    children.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
    let current = pass.state.current();
    let mut sync = ChildSync::new(core, &ctx.caches.children, &ctx.applied, ns, current, uids);
    // Each child's resourceVersion as the cache has it before its ensure compares it: a version
    // written meanwhile (by the apply, or by someone else) is another, and the next pass syncs.
    let mut checked = Vec::with_capacity(children.len());
    let mut as_built = true;
    for child in &children {
        let (ns, name) = (child.namespace().to_string(), child.name().to_string());
        let rv = caches.resource_version(child.kind, &ns, &name);
        as_built &= sync.ensure(child).await?;
        checked.push((child.kind, ns, name, rv));
    }
    let own: Vec<Child> = children
        .iter()
        .filter(|c| c.ownership == Ownership::Controlled)
        .cloned()
        .collect();
    sync.prune(&CHILD_KINDS, &keys_of(&own), &[]).await;
    pass.child_failures = sync.finish();
    pass.children_synced = true;
    // A child the cache does not show (Secrets and ServiceMonitors are never cached; one just
    // created is not yet) would not be seen to change or go.
    let seen = checked.iter().all(|(.., rv)| rv.is_some());
    if as_built && seen && pass.child_failures.is_empty() {
        ctx.synced_children.remember(&pass.uid, inputs, checked);
    } else {
        ctx.synced_children.forget(&pass.uid);
    }
    Ok(())
}

/// A NodeSet's last children sync that found every child as built (nothing refused, nothing
/// left to prune): what it was made from and each child's resourceVersion in the cache then.
#[derive(Debug)]
struct Synced {
    /// [`SyncedChildren::inputs`].
    inputs: String,
    /// Each child's kind, namespace, name and cached resourceVersion (`None`: not cached yet).
    children: Vec<(ChildKind, String, String, Option<String>)>,
    at: Instant,
}

/// The last children sync of each NodeSet that found them all as built, per NodeSet UID.
///
/// # Guarantees
/// * One entry per NodeSet UID, forgotten when the NodeSet goes or a sync is not as built.
/// * An entry stands only while its inputs, every child's cached resourceVersion and its age
///   (under the resync period) do: then a pass would build and apply nothing. Children of kinds
///   not cached (Secrets, ServiceMonitors) are never remembered.
///
/// * A child's resourceVersion is the one the cache had before that sync compared it: a write
///   meanwhile (the sync's own apply, or anyone's) makes the next pass sync again. A sync after
///   which a child is not in the cache (just created; Secrets and ServiceMonitors are never
///   cached) is not remembered.
/// * The cache must show nothing else the NodeSet controls and the host built: such an object
///   (one the builder no longer returns, seen late by the watch) is pruned by a full sync.
#[derive(Debug, Default)]
pub(crate) struct SyncedChildren {
    entries: Mutex<HashMap<String, Synced>>,
}

impl SyncedChildren {
    /// What a NodeSet's children are made from: the NodeSet and its Controller (UID and
    /// resourceVersion: any change to either), the builder's digest and the UIDs of the NodeSets
    /// sharing them (their owner references).
    fn inputs(ns: &NodeSet, controller: &Controller, digest: &str, sharers: &[&NodeSet]) -> String {
        let mut uids: Vec<&str> = sharers
            .iter()
            .map(|n| n.metadata.uid.as_deref().unwrap_or_default())
            .collect();
        uids.sort_unstable();
        let version = |m: &kube::core::ObjectMeta| {
            format!(
                "{}@{}",
                m.uid.as_deref().unwrap_or_default(),
                m.resource_version.as_deref().unwrap_or_default()
            )
        };
        format!(
            "{} {} {digest} {}",
            version(&ns.metadata),
            version(&controller.metadata),
            uids.join(",")
        )
    }

    /// Whether the children of NodeSet `uid` (in namespace `ns`) were found as built under
    /// `inputs` less than `max_age` ago, none has changed in `caches` since, and the cache shows
    /// nothing else the NodeSet controls and the host built (nothing to prune).
    fn still_as_built(
        &self,
        uid: &str,
        ns: &str,
        inputs: &str,
        caches: &ChildCaches,
        max_age: Duration,
    ) -> bool {
        locked(&self.entries, |m| {
            m.get(uid).is_some_and(|s| {
                s.inputs == inputs
                    && s.at.elapsed() < max_age
                    && s.children
                        .iter()
                        .all(|(kind, at, name, rv)| caches.resource_version(*kind, at, name) == *rv)
                    && CHILD_KINDS.iter().all(|&kind| {
                        caches.controlled(kind, ns, uid).iter().all(|(name, _)| {
                            s.children
                                .iter()
                                .any(|(k, n, c, _)| *k == kind && n == ns && c == name)
                        })
                    })
            })
        })
    }

    fn remember(
        &self,
        uid: &str,
        inputs: String,
        children: Vec<(ChildKind, String, String, Option<String>)>,
    ) {
        let synced = Synced {
            inputs,
            children,
            at: Instant::now(),
        };
        locked(&self.entries, |m| m.insert(uid.to_string(), synced));
    }

    /// Forget NodeSet `uid` (it is gone, or its children are not all as built).
    pub fn forget(&self, uid: &str) {
        locked(&self.entries, |m| m.remove(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharing_needs_the_same_controller_namespace_and_name() {
        let nodeset = |ns: &str, ctl_ns: Option<&str>, ctl: &str| -> NodeSet {
            let mut n: NodeSet = serde_json::from_value(serde_json::json!({
                "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "metadata": {"name": "w", "namespace": ns},
                "spec": {"controllerRef": {"name": ctl}, "replicas": 1}
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            n.spec.controller_ref.namespace = ctl_ns.map(str::to_string);
            n
        };
        let a = nodeset("workers", Some("slurm-a"), "slurm");
        assert!(a.shares_workers_with(&nodeset("workers", Some("slurm-a"), "slurm")));
        assert!(
            !a.shares_workers_with(&nodeset("workers", Some("slurm-b"), "slurm")),
            "another cluster"
        );
        assert!(
            !a.shares_workers_with(&nodeset("workers", None, "slurm")),
            "the Controller of `workers`"
        );
        assert!(!a.shares_workers_with(&nodeset("other", Some("slurm-a"), "slurm")));
        assert!(!a.shares_workers_with(&nodeset("workers", Some("slurm-a"), "other")));
        assert!(nodeset("slurm-a", None, "slurm").shares_workers_with(&nodeset(
            "slurm-a",
            Some("slurm-a"),
            "slurm"
        )));
    }
}
