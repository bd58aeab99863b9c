//! The bundled builders, compiled from `plugins/*` by the build script and embedded in the
//! binary (the registry that serves them is [`crate::PluginRegistry`]).

use super::BuilderKind;

/// The bundled `controller-service` component.
pub const CONTROLLER_SERVICE: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_CONTROLLER_SERVICE"));
/// The bundled `nodeset-pod` component.
pub const NODESET_POD: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_NODESET_POD"));
/// The bundled `controller-children` component.
pub const CONTROLLER_CHILDREN: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_CONTROLLER_CHILDREN"));
/// The bundled `nodeset-children` component.
pub const NODESET_CHILDREN: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_NODESET_CHILDREN"));
/// The bundled `restapi-children` component.
pub const RESTAPI_CHILDREN: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_RESTAPI_CHILDREN"));
/// The bundled `loginset-children` component.
pub const LOGINSET_CHILDREN: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_LOGINSET_CHILDREN"));
/// The bundled `accounting-children` component.
pub const ACCOUNTING_CHILDREN: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_ACCOUNTING_CHILDREN"));

/// Every builder kind.
pub const KINDS: [BuilderKind; 7] = BuilderKind::ALL;

/// The bundled component for a kind.
pub fn bundled_bytes(kind: BuilderKind) -> &'static [u8] {
    match kind {
        BuilderKind::ControllerService => CONTROLLER_SERVICE,
        BuilderKind::NodesetPod => NODESET_POD,
        BuilderKind::ControllerChildren => CONTROLLER_CHILDREN,
        BuilderKind::NodesetChildren => NODESET_CHILDREN,
        BuilderKind::RestapiChildren => RESTAPI_CHILDREN,
        BuilderKind::LoginsetChildren => LOGINSET_CHILDREN,
        BuilderKind::AccountingChildren => ACCOUNTING_CHILDREN,
    }
}

/// The sha256 of the bundled component for a kind (hex, as [`crate::digest`] gives it), computed
/// by the build script: loading a bundled builder whose compiled code is in the cache reads none of
/// its bytes (hashing them at each start kept their ~8 MiB of the binary resident).
pub fn bundled_digest(kind: BuilderKind) -> &'static str {
    match kind {
        BuilderKind::ControllerService => env!("SLINKY_BUNDLED_CONTROLLER_SERVICE_SHA256"),
        BuilderKind::NodesetPod => env!("SLINKY_BUNDLED_NODESET_POD_SHA256"),
        BuilderKind::ControllerChildren => env!("SLINKY_BUNDLED_CONTROLLER_CHILDREN_SHA256"),
        BuilderKind::NodesetChildren => env!("SLINKY_BUNDLED_NODESET_CHILDREN_SHA256"),
        BuilderKind::RestapiChildren => env!("SLINKY_BUNDLED_RESTAPI_CHILDREN_SHA256"),
        BuilderKind::LoginsetChildren => env!("SLINKY_BUNDLED_LOGINSET_CHILDREN_SHA256"),
        BuilderKind::AccountingChildren => env!("SLINKY_BUNDLED_ACCOUNTING_CHILDREN_SHA256"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build script's digests are those of the embedded bytes.
    #[test]
    fn the_digests_are_the_embedded_bytes() {
        for kind in KINDS {
            assert_eq!(bundled_digest(kind), crate::digest(bundled_bytes(kind)), "{kind}");
        }
    }
}
