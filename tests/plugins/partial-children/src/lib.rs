//! A `controller-children` builder for slinky-host's tests: Slinky's children without the
//! slurmctld StatefulSet, for every Controller (the example inputs included), as a new plugin
//! version written carelessly would build them. The hot reload must refuse it.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, ControllerChildrenBuilder, ControllerInputs, api::Controller, slinky,
};

/// The builder.
pub struct PartialChildren;

impl ControllerChildrenBuilder for PartialChildren {
    fn build_controller_children(
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, BuildError> {
        let mut children = slinky::build_controller_children(ctx, controller, inputs)?;
        children.retain(|c| c.as_stateful_set().is_none());
        Ok(children)
    }
}

slinky_guest_sdk::export_plugin!(PartialChildren, kinds = [controller_children]);
