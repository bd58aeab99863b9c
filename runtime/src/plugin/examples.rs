//! A plugin's builds of the example inputs (`slinky_api::contract`'s examples): what a new
//! version must build before it serves, and what `plugin check` compares.

use slinky_api::{Controller, NodeSet};

use crate::{BuildContext, BuilderKind, PluginError, PodIdentity};

use super::*;

impl Plugin {
    /// Build the example inputs (`slinky_api::contract`'s examples, the guest SDK's `testing` ones) with every kind the
    /// plugin builds, through the output policy; the outputs, kind by kind, in debug form.
    ///
    /// # Errors
    /// The first call that fails; [`PluginError::Refused`] when the examples do not parse.
    pub(crate) fn example_builds(&self, ctx: &BuildContext) -> Result<Vec<String>, PluginError> {
        let (controller, nodeset) = self.examples()?;
        let mut out = Vec::new();
        if self.builds(BuilderKind::ControllerService) {
            out.push(format!("{:?}", self.build_service(ctx, controller)?));
        }
        if self.builds(BuilderKind::NodesetPod) {
            let identity = PodIdentity::for_ordinal(nodeset, 0, "smoke");
            out.push(format!(
                "{:?}",
                self.build_pod(ctx, nodeset, controller, &identity)?
            ));
        }
        if self.builds(BuilderKind::ControllerChildren) {
            let inputs = slinky_api::contract::example_inputs(std::slice::from_ref(nodeset));
            out.push(format!(
                "{:?}",
                self.build_controller_children(ctx, controller, &inputs)?
            ));
        }
        if self.builds(BuilderKind::NodesetChildren) {
            out.push(format!(
                "{:?}",
                self.build_nodeset_children(ctx, nodeset, controller)?
            ));
        }
        if self.builds(BuilderKind::RestapiChildren) {
            let restapi = self.example_restapi()?;
            out.push(format!(
                "{:?}",
                self.build_restapi_children(ctx, restapi, controller)?
            ));
        }
        for kind in [BuilderKind::LoginsetChildren, BuilderKind::AccountingChildren] {
            if self.builds(kind) {
                out.push(format!("{:?}", self.example_of(ctx, kind)?));
            }
        }
        Ok(out)
    }

    /// What this plugin's LoginSet or Accounting builder makes of the example inputs.
    pub(super) fn example_of(
        &self,
        ctx: &BuildContext,
        kind: BuilderKind,
    ) -> Result<Vec<crate::Child>, PluginError> {
        let (controller, _) = self.examples()?;
        let (loginset, accounting) = self.example_parents()?;
        match kind {
            BuilderKind::LoginsetChildren => {
                self.build_loginset_children(ctx, loginset, controller, &crate::LoginSetInputs::example())
            }
            _ => self.build_accounting_children(ctx, accounting, &crate::AccountingInputs::example()),
        }
    }

    /// The example LoginSet and Accounting, parsed once per process.
    pub(crate) fn example_parents(
        &self,
    ) -> Result<&'static (slinky_api::LoginSet, slinky_api::Accounting), PluginError> {
        use slinky_api::contract as examples;
        static EXAMPLES: std::sync::LazyLock<Result<(slinky_api::LoginSet, slinky_api::Accounting), String>> =
            std::sync::LazyLock::new(|| {
                examples::example_loginset()
                    .and_then(|l| Ok((l, examples::example_accounting()?)))
                    .map_err(|e| format!("the example LoginSet or Accounting does not parse: {e}"))
            });
        EXAMPLES.as_ref().map_err(|reason| PluginError::Refused {
            plugin: self.label(),
            reason: reason.clone(),
        })
    }

    /// The example inputs (`slinky_api::contract`'s examples), parsed once per process: every
    /// reload and every switch to optimized code builds them.
    pub(crate) fn examples(&self) -> Result<&'static (Controller, NodeSet), PluginError> {
        use slinky_api::contract as examples;
        static EXAMPLES: std::sync::LazyLock<Result<(Controller, NodeSet), String>> =
            std::sync::LazyLock::new(|| {
                examples::example_controller()
                    .and_then(|c| Ok((c, examples::example_nodeset()?)))
                    .map_err(|e| format!("the example inputs do not parse: {e}"))
            });
        EXAMPLES.as_ref().map_err(|reason| PluginError::Refused {
            plugin: self.label(),
            reason: reason.clone(),
        })
    }

    /// The example RestApi, parsed once per process.
    pub(crate) fn example_restapi(&self) -> Result<&'static slinky_api::RestApi, PluginError> {
        static EXAMPLE: std::sync::LazyLock<Result<slinky_api::RestApi, String>> =
            std::sync::LazyLock::new(|| {
                slinky_api::contract::example_restapi()
                    .map_err(|e| format!("the example RestApi does not parse: {e}"))
            });
        EXAMPLE.as_ref().map_err(|reason| PluginError::Refused {
            plugin: self.label(),
            reason: reason.clone(),
        })
    }

    /// The children (kind and name) this plugin's `kind` builder (a children kind:
    /// `controller-children`, `nodeset-children`, `restapi-children`, `loginset-children`,
    /// `accounting-children`) builds from the example inputs; `None` for the other kinds or when
    /// the plugin does not build `kind`.
    ///
    /// # Errors
    /// The call failed or its output broke the output policy.
    pub(crate) fn example_children(
        &self,
        ctx: &BuildContext,
        kind: BuilderKind,
    ) -> Result<Option<std::collections::BTreeSet<(crate::ChildKind, String)>>, PluginError> {
        let (controller, nodeset) = self.examples()?;
        let children = match kind {
            _ if !self.builds(kind) => return Ok(None),
            BuilderKind::ControllerChildren => {
                let inputs = slinky_api::contract::example_inputs(std::slice::from_ref(nodeset));
                self.build_controller_children(ctx, controller, &inputs)?
            }
            BuilderKind::NodesetChildren => self.build_nodeset_children(ctx, nodeset, controller)?,
            BuilderKind::RestapiChildren => {
                self.build_restapi_children(ctx, self.example_restapi()?, controller)?
            }
            BuilderKind::LoginsetChildren | BuilderKind::AccountingChildren => self.example_of(ctx, kind)?,
            BuilderKind::ControllerService | BuilderKind::NodesetPod => return Ok(None),
        };
        Ok(Some(
            children.iter().map(|c| (c.kind, c.name().to_string())).collect(),
        ))
    }
}
