//! Strategic-merge patch keys of the core types' lists, defined once: the guest SDK merges a
//! user's partial pod spec over a builder's base with them, and the embedded API server applies
//! strategic merge patches and server-side apply with them.

/// Which object a list lives in, for fields whose merge key differs (`ports`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListContext {
    /// A pod spec or container.
    Pod,
    /// A service spec.
    Service,
}

/// The strategic-merge patch key of a list field of the core types builders handle, or `None`
/// when such a list is replaced as a whole (Kubernetes' `patchMergeKey` tags).
pub fn patch_merge_key(field: &str, ctx: ListContext) -> Option<&'static str> {
    Some(match (field, ctx) {
        ("ports", ListContext::Pod) => "containerPort",
        ("ports", ListContext::Service) => "port",
        ("containers" | "initContainers" | "ephemeralContainers", _) => "name",
        ("volumes" | "env" | "imagePullSecrets" | "resourceClaims" | "schedulingGates", _) => "name",
        ("volumeMounts", _) => "mountPath",
        ("volumeDevices", _) => "devicePath",
        ("hostAliases", _) => "ip",
        ("topologySpreadConstraints", _) => "topologyKey",
        _ => return None,
    })
}
