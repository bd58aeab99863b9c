//! The bundled `loginset-children` builder: Slinky's `BuildLogin`, `BuildLoginService` and
//! `BuildLoginSshConfig` (the login Deployment, its Service and `sshd_config`), as a Wasm plugin.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, LoginSetChildrenBuilder, LoginSetInputs,
    api::{Controller, LoginSet},
    slinky,
};

/// Builds a LoginSet's children exactly as Slinky does.
pub struct LoginSetChildren;

impl LoginSetChildrenBuilder for LoginSetChildren {
    fn build_loginset_children(
        ctx: &BuildContext,
        loginset: &LoginSet,
        controller: &Controller,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<Child>, BuildError> {
        slinky::build_loginset_children(ctx, loginset, controller, inputs)
    }
}

slinky_guest_sdk::export_plugin!(LoginSetChildren, kinds = [loginset_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children = testing::call_loginset_children::<LoginSetChildren>(
            &testing::example_loginset()?,
            &testing::example_controller()?,
            &LoginSetInputs::example(),
        )?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [
                ("Deployment", "slurm-login-slinky"),
                ("Service", "slurm-login-slinky"),
                ("ConfigMap", "slurm-login-slinky-ssh-config")
            ]
        );
        Ok(())
    }
}
