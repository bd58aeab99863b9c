//! Native test helpers for plugin authors: example inputs (the repository's example cluster) and
//! calls that round-trip through JSON exactly as the host's calls do.

use k8s_openapi::api::core::v1::{Pod, Service};
use slinky_api::{Controller, NodeSet};

use crate::{
    BuildContext, BuildError, Child, ControllerChildrenBuilder, ControllerInputs, ControllerServiceBuilder,
    NodeSetChildrenBuilder, NodeSetPodBuilder, PodIdentity,
};

/// The example inputs, shared with the host (which builds them with every new plugin version).
pub use slinky_api::contract::{
    example_accounting, example_controller, example_inputs, example_loginset, example_nodeset,
    example_restapi,
};

fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(what: &str, v: &T) -> Result<T, BuildError> {
    crate::from_json(what, &crate::to_json(v)?)
}

/// Call `B::build_service` as the host would: inputs and output through JSON.
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_service<B: ControllerServiceBuilder>(controller: &Controller) -> Result<Service, BuildError> {
    let controller = round_trip("Controller", controller)?;
    round_trip(
        "Service",
        &B::build_service(&BuildContext::default(), &controller)?,
    )
}

/// Call `B::build_pod` for `ordinal` as the host would (revision `test`).
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_pod<B: NodeSetPodBuilder>(
    nodeset: &NodeSet,
    controller: &Controller,
    ordinal: u32,
) -> Result<Pod, BuildError> {
    call_pod_with::<B>(&BuildContext::default(), nodeset, controller, ordinal)
}

/// [`call_pod`] as a step of a pipeline: with `ctx` ([`step_context`]: its settings and what the
/// step before it built).
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_pod_with<B: NodeSetPodBuilder>(
    ctx: &BuildContext,
    nodeset: &NodeSet,
    controller: &Controller,
    ordinal: u32,
) -> Result<Pod, BuildError> {
    let identity = pod_identity(nodeset, ordinal);
    let nodeset = round_trip("NodeSet", nodeset)?;
    let controller = round_trip("Controller", controller)?;
    round_trip("Pod", &B::build_pod(ctx, &nodeset, &controller, &identity)?)
}

/// The identity the host gives pod `ordinal` of `nodeset` in these helpers (revision `test`).
pub fn pod_identity(nodeset: &NodeSet, ordinal: u32) -> PodIdentity {
    PodIdentity::for_ordinal(nodeset, ordinal, "test")
}

/// The context a step of a pipeline is called with: its BuilderPlugin's `spec.settings`, and
/// what the step before it built (`previous`: a pod or a Service; the children, each as its own
/// object, for `*-children`; nothing for the first step), as the host passes them.
///
/// # Errors
/// Something of `previous` does not serialize.
pub fn step_context<T: serde::Serialize>(
    settings: &serde_json::Value,
    previous: impl IntoIterator<Item = T>,
) -> Result<BuildContext, BuildError> {
    Ok(BuildContext {
        settings: settings.to_string(),
        previous: previous
            .into_iter()
            .map(|p| crate::to_json(&p))
            .collect::<Result<_, _>>()?,
        ..BuildContext::default()
    })
}

fn round_trip_children(children: Vec<Child>) -> Result<Vec<Child>, BuildError> {
    children.iter().map(|c| Child::from_json(&c.to_json()?)).collect()
}

/// Call `B::build_controller_children` as the host would: inputs and outputs through JSON.
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_controller_children<B: ControllerChildrenBuilder>(
    controller: &Controller,
    inputs: &ControllerInputs,
) -> Result<Vec<Child>, BuildError> {
    let controller = round_trip("Controller", controller)?;
    let mut inputs = inputs.clone();
    inputs.nodesets = inputs
        .nodesets
        .iter()
        .map(|n| round_trip("NodeSet", n))
        .collect::<Result<_, _>>()?;
    round_trip_children(B::build_controller_children(
        &BuildContext::default(),
        &controller,
        &inputs,
    )?)
}

/// Call `B::build_nodeset_children` as the host would: inputs and outputs through JSON.
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_nodeset_children<B: NodeSetChildrenBuilder>(
    nodeset: &NodeSet,
    controller: &Controller,
) -> Result<Vec<Child>, BuildError> {
    let nodeset = round_trip("NodeSet", nodeset)?;
    let controller = round_trip("Controller", controller)?;
    round_trip_children(B::build_nodeset_children(
        &BuildContext::default(),
        &nodeset,
        &controller,
    )?)
}

/// Call `B::build_restapi_children` as the host would: inputs and outputs through JSON.
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_restapi_children<B: crate::RestApiChildrenBuilder>(
    restapi: &slinky_api::RestApi,
    controller: &Controller,
) -> Result<Vec<Child>, BuildError> {
    let restapi = round_trip("RestApi", restapi)?;
    let controller = round_trip("Controller", controller)?;
    round_trip_children(B::build_restapi_children(
        &BuildContext::default(),
        &restapi,
        &controller,
    )?)
}

/// Call `B::build_loginset_children` as the host would: inputs and outputs through JSON.
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_loginset_children<B: crate::LoginSetChildrenBuilder>(
    loginset: &slinky_api::LoginSet,
    controller: &Controller,
    inputs: &crate::LoginSetInputs,
) -> Result<Vec<Child>, BuildError> {
    let loginset = round_trip("LoginSet", loginset)?;
    let controller = round_trip("Controller", controller)?;
    round_trip_children(B::build_loginset_children(
        &BuildContext::default(),
        &loginset,
        &controller,
        inputs,
    )?)
}

/// Call `B::build_accounting_children` as the host would: inputs and outputs through JSON.
///
/// # Errors
/// What the builder returns, or a serialization failure.
pub fn call_accounting_children<B: crate::AccountingChildrenBuilder>(
    accounting: &slinky_api::Accounting,
    inputs: &crate::AccountingInputs,
) -> Result<Vec<Child>, BuildError> {
    let accounting = round_trip("Accounting", accounting)?;
    round_trip_children(B::build_accounting_children(
        &BuildContext::default(),
        &accounting,
        inputs,
    )?)
}

/// The lines this thread logged with [`crate::log`] since the last call (taken out): what a
/// native test asserts its builder logged. (In a host the lines go to the host's log.)
#[cfg(not(target_arch = "wasm32"))]
pub fn logged() -> Vec<(crate::log::Level, String)> {
    crate::log::take()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_parse() -> Result<(), BuildError> {
        assert_eq!(example_controller()?.metadata.name.as_deref(), Some("slurm"));
        assert_eq!(example_nodeset()?.replicas(), 3);
        Ok(())
    }
}
