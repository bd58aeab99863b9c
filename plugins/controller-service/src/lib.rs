//! The bundled `controller-service` builder: Slinky's `BuildControllerService`, as a Wasm plugin.

use slinky_guest_sdk::{
    BuildContext, BuildError, ControllerServiceBuilder, api::Controller, k8s_openapi::api::core::v1::Service,
    slinky,
};

/// Builds the slurmctld Service exactly as Slinky does.
pub struct ControllerService;

impl ControllerServiceBuilder for ControllerService {
    fn build_service(ctx: &BuildContext, controller: &Controller) -> Result<Service, BuildError> {
        slinky::build_controller_service(ctx, controller)
    }
}

slinky_guest_sdk::export_plugin!(ControllerService, kinds = [controller_service]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_service() -> Result<(), BuildError> {
        let svc = testing::call_service::<ControllerService>(&testing::example_controller()?)?;
        assert_eq!(svc.metadata.name.as_deref(), Some("slurm-controller"));
        let ports = svc.spec.and_then(|s| s.ports).unwrap_or_default();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, 6817);
        Ok(())
    }
}
