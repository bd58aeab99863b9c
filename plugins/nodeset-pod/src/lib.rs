//! The bundled `nodeset-pod` builder: Slinky's StatefulSet-mode NodeSet pod, as a Wasm plugin.

use slinky_guest_sdk::{
    BuildContext, BuildError, NodeSetPodBuilder, PodIdentity,
    api::{Controller, NodeSet},
    k8s_openapi::api::core::v1::Pod,
    slinky,
};

/// Builds slurmd pods exactly as Slinky does.
pub struct NodeSetPod;

impl NodeSetPodBuilder for NodeSetPod {
    fn build_pod(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, BuildError> {
        slinky::build_nodeset_pod(ctx, nodeset, controller, identity)
    }
}

slinky_guest_sdk::export_plugin!(NodeSetPod, kinds = [nodeset_pod]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_pods() -> Result<(), BuildError> {
        let (nodeset, controller) = (testing::example_nodeset()?, testing::example_controller()?);
        let pod = testing::call_pod::<NodeSetPod>(&nodeset, &controller, 2)?;
        assert_eq!(pod.metadata.name.as_deref(), Some("slurm-worker-slinky-2"));
        let spec = pod.spec.ok_or(BuildError::invalid("no spec"))?;
        assert_eq!(spec.hostname.as_deref(), Some("slinky-2"));
        assert_eq!(spec.containers[0].name, "slurmd");
        Ok(())
    }
}
