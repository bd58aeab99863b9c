//! A NodeSet's children other than pods: the workers' Service and PodDisruptionBudget shared by
//! the Controller's NodeSets, and the NodeSet's own (the SSH ConfigMap), through the one child
//! path.

use crate::plugins::Builder as _;
use std::sync::Arc;

use kube::ResourceExt;
use slinky_api::{Controller, NodeSet};

use super::Pass;
use crate::{
    plugins::{BuilderKind, Child, ChildKind, Ownership},
    reconcile::{
        Error,
        core::apply::{ChildSync, keys_of},
        core::time_plugin_call,
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
    let owners = slinky_api::owners::shared_refs(sharers.iter().copied());
    let uids = owners.iter().map(|o| o.uid.clone()).collect();
    for c in children.iter_mut().filter(|c| c.ownership == Ownership::Shared) {
        c.set_owners(owners.clone());
    }
    children.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
    let current = pass.state.current();
    let mut sync = ChildSync::new(core, &ctx.caches.children, &ctx.applied, ns, current, uids);
    for child in &children {
        sync.ensure(child).await?;
    }
    let own: Vec<Child> = children
        .iter()
        .filter(|c| c.ownership == Ownership::Controlled)
        .cloned()
        .collect();
    sync.prune(&CHILD_KINDS, &keys_of(&own), &[]).await;
    pass.child_failures = sync.finish();
    pass.children_synced = true;
    Ok(())
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
