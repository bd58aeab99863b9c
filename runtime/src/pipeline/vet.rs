//! Checks of a pipeline step: it builds the kinds it lists, and builds the example inputs after
//! each kind's base builder through the output policy, keeping every child before it.

use super::{Pipeline, Step};
use crate::{AccountingInputs, BuildContext, Builder, Child, LoginSetInputs, PluginError, PodIdentity};

impl Pipeline {
    /// Build the example inputs (`slinky_api::contract`'s examples) of `kind` through the pipeline.
    ///
    /// # Errors
    /// The first step that fails, or breaks the output policy.
    pub fn example_build(&self, ctx: &BuildContext, kind: crate::BuilderKind) -> Result<(), PluginError> {
        use crate::BuilderKind as K;
        let base = &self.base;
        let (controller, nodeset) = base.examples()?;
        match kind {
            K::ControllerService => drop(self.build_service(ctx, controller)?),
            K::NodesetPod => {
                let identity = PodIdentity::for_ordinal(nodeset, 0, "smoke");
                drop(self.build_pod(ctx, nodeset, controller, &identity)?);
            }
            K::ControllerChildren => {
                let inputs = slinky_api::contract::example_inputs(std::slice::from_ref(nodeset));
                drop(self.build_controller_children(ctx, controller, &inputs)?);
            }
            K::NodesetChildren => drop(self.build_nodeset_children(ctx, nodeset, controller)?),
            K::RestapiChildren => {
                drop(self.build_restapi_children(ctx, base.example_restapi()?, controller)?)
            }
            K::LoginsetChildren => {
                let (loginset, _) = base.example_parents()?;
                drop(self.build_loginset_children(ctx, loginset, controller, &LoginSetInputs::example())?);
            }
            K::AccountingChildren => {
                let (_, accounting) = base.example_parents()?;
                drop(self.build_accounting_children(ctx, accounting, &AccountingInputs::example())?);
            }
        }
        Ok(())
    }
}

/// Check `step` before it joins the pipelines of `kinds` (the caller has checked the spec: kinds,
/// selector, and the settings with [`Plugin::validate_settings`]): the module builds every kind,
/// and, after each kind's base builder, builds the example inputs through the output policy,
/// keeping every child the base builder made (as every build checks).
///
/// # Errors
/// [`PluginError::Refused`] saying what to fix; a build's own error, naming the step.
pub fn vet_step(
    registry: &crate::PluginRegistry,
    step: &Step,
    kinds: &[crate::BuilderKind],
    ctx: &BuildContext,
) -> Result<(), PluginError> {
    for kind in kinds {
        if !step.plugin.builds(*kind) {
            let built: Vec<&str> = step.plugin.info().kinds.iter().map(|k| k.as_str()).collect();
            return Err(PluginError::Refused {
                plugin: format!("{} (BuilderPlugin {})", step.plugin.label(), step.name),
                reason: format!(
                    "spec.kinds lists {kind}, but the module builds only [{}]: remove it from \
                     spec.kinds, or use a module that builds it",
                    built.join(", ")
                ),
            });
        }
    }
    for kind in kinds {
        Pipeline::new(registry.active(*kind), vec![step.clone()]).example_build(ctx, *kind)?;
    }
    Ok(())
}

/// A step keeps every child the builders before it made (it may change them, or add some): one it
/// left out would be deleted by the host from the parent.
#[allow(clippy::ptr_arg, reason = "the pipeline's closures take the output type")]
pub(super) fn keeps_children(before: &Vec<Child>, after: &Vec<Child>) -> Result<(), String> {
    let missing: Vec<String> = before
        .iter()
        .filter(|b| !after.iter().any(|a| a.kind == b.kind && a.name() == b.name()))
        .map(Child::describe)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "it left out {} that the builders before it made; a step keeps every child it receives in \
         build-context.previous (the host would delete what it leaves out)",
        missing.join(", ")
    ))
}

#[allow(clippy::ptr_arg, reason = "the pipeline's closures take the output type")]
pub(super) fn children_json(children: &Vec<Child>) -> Result<Vec<String>, serde_json::Error> {
    children
        .iter()
        .map(|c| serde_json::to_string(&c.object))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_must_keep_the_children_before_it() {
        let child = |name: &str| Child {
            kind: crate::ChildKind::ConfigMap,
            ownership: crate::Ownership::Controlled,
            object: serde_json::json!({"metadata": {"name": name}}),
        };
        assert!(keeps_children(&vec![child("a")], &vec![child("a"), child("b")]).is_ok());
        let dropped = keeps_children(&vec![child("a"), child("b")], &vec![child("b")]);
        assert!(dropped.is_err_and(|e| e.contains("ConfigMap a")));
    }
}
