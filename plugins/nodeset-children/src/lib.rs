//! The bundled `nodeset-children` builder: Slinky's `BuildClusterWorkerService`,
//! `BuildClusterWorkerPodDisruptionBudget` and `BuildWorkerSshConfig`, as a Wasm plugin.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, NodeSetChildrenBuilder,
    api::{Controller, NodeSet},
    slinky,
};

/// Builds a NodeSet's children besides its pods exactly as Slinky does.
pub struct NodeSetChildren;

impl NodeSetChildrenBuilder for NodeSetChildren {
    fn build_nodeset_children(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError> {
        slinky::build_nodeset_children(ctx, nodeset, controller)
    }
}

slinky_guest_sdk::export_plugin!(NodeSetChildren, kinds = [nodeset_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children = testing::call_nodeset_children::<NodeSetChildren>(
            &testing::example_nodeset()?,
            &testing::example_controller()?,
        )?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [
                ("Service", "slurm-workers-slurm"),
                ("PodDisruptionBudget", "slurm-workers-pdb-slurm")
            ]
        );
        Ok(())
    }
}
