//! The bundled `controller-children` builder: Slinky's `BuildController` (the slurmctld
//! StatefulSet), `BuildControllerConfig` (`slurm.conf`) and `BuildControllerServiceInternal`, as a
//! Wasm plugin.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, ControllerChildrenBuilder, ControllerInputs, api::Controller, slinky,
};

/// Builds the Controller's children besides its Service exactly as Slinky does.
pub struct ControllerChildren;

impl ControllerChildrenBuilder for ControllerChildren {
    fn build_controller_children(
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, BuildError> {
        slinky::build_controller_children(ctx, controller, inputs)
    }
}

slinky_guest_sdk::export_plugin!(ControllerChildren, kinds = [controller_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let inputs = testing::example_inputs(&[testing::example_nodeset()?]);
        let children = testing::call_controller_children::<ControllerChildren>(
            &testing::example_controller()?,
            &inputs,
        )?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [
                ("ConfigMap", "slurm-config"),
                ("Service", "slurm-controller-internal"),
                ("StatefulSet", "slurm-controller")
            ]
        );
        Ok(())
    }
}
