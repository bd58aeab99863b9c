//! The bundled `restapi-children` builder: Slinky's `BuildRestapi` and `BuildRestapiService`
//! (slurmrestd's Deployment and Service), as a Wasm plugin.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, RestApiChildrenBuilder,
    api::{Controller, RestApi},
    slinky,
};

/// Builds a RestApi's children exactly as Slinky does.
pub struct RestApiChildren;

impl RestApiChildrenBuilder for RestApiChildren {
    fn build_restapi_children(
        ctx: &BuildContext,
        restapi: &RestApi,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError> {
        slinky::build_restapi_children(ctx, restapi, controller)
    }
}

slinky_guest_sdk::export_plugin!(RestApiChildren, kinds = [restapi_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children = testing::call_restapi_children::<RestApiChildren>(
            &testing::example_restapi()?,
            &testing::example_controller()?,
        )?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [("Deployment", "slurm-restapi"), ("Service", "slurm-restapi")]
        );
        Ok(())
    }
}
