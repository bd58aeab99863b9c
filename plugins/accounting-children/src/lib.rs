//! The bundled `accounting-children` builder: Slinky's `BuildAccounting`,
//! `BuildAccountingService` and `BuildAccountingConfig` (slurmdbd's StatefulSet, Service and
//! `slurmdbd.conf` Secret), as a Wasm plugin.

use slinky_guest_sdk::{
    AccountingChildrenBuilder, AccountingInputs, BuildContext, BuildError, Child, api::Accounting, slinky,
};

/// Builds an Accounting's children exactly as Slinky does.
pub struct AccountingChildren;

impl AccountingChildrenBuilder for AccountingChildren {
    fn build_accounting_children(
        ctx: &BuildContext,
        accounting: &Accounting,
        inputs: &AccountingInputs,
    ) -> Result<Vec<Child>, BuildError> {
        slinky::build_accounting_children(ctx, accounting, inputs)
    }
}

slinky_guest_sdk::export_plugin!(AccountingChildren, kinds = [accounting_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children = testing::call_accounting_children::<AccountingChildren>(
            &testing::example_accounting()?,
            &AccountingInputs::example(),
        )?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [
                ("Service", "slurm-accounting"),
                ("Secret", "slurm-accounting"),
                ("StatefulSet", "slurm-accounting")
            ]
        );
        Ok(())
    }
}
