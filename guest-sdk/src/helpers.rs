//! Helpers every Slinky builder needs: labels, metadata merge order, ports, probes, quantities.

use k8s_openapi::{
    api::core::v1::{ContainerPort, HTTPGetAction, Probe, ServicePort},
    apimachinery::pkg::{api::resource::Quantity, util::intstr::IntOrString},
};

/// sha256 of `data` as lower-case hex (for `*-hash` annotations).
pub use slinky_api::hash::sha256_hex;
pub use slinky_api::labels::{
    ACCOUNTING, CONTROLLER, Component, LOGIN, Labels, RESTAPI, WORKER, worker_labels,
};

/// Merge maps in order, later keys winning (Slinky's `metadata.go`). The usual order is the CR's
/// labels/annotations, then `spec.template.metadata`, then operator labels, then hash annotations.
pub fn merge_maps<'a>(maps: impl IntoIterator<Item = &'a Labels>) -> Labels {
    let mut out = Labels::new();
    for m in maps {
        out.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    out
}

/// Some(map), or None when empty (so empty maps are not serialized).
pub fn non_empty(map: Labels) -> Option<Labels> {
    (!map.is_empty()).then_some(map)
}

/// A TCP container port.
pub fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// A TCP service port targeting a named container port.
pub fn service_port(name: &str, port: i32, target: &str) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        protocol: Some("TCP".into()),
        target_port: Some(IntOrString::String(target.into())),
        ..Default::default()
    }
}

/// An HTTP GET probe on a named port.
pub fn http_probe(path: &str, port: &str, failure_threshold: Option<i32>, period: Option<i32>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(port.into()),
            ..Default::default()
        }),
        failure_threshold,
        period_seconds: period,
        ..Default::default()
    }
}

/// A Kubernetes quantity as a number (`500m` → 0.5, `8Gi` → 8589934592, `1e3` → 1000), or None
/// when it cannot be parsed: [`slinky_api::quantity::value`], the workspace's one parser.
pub fn quantity_value(q: &Quantity) -> Option<f64> {
    slinky_api::quantity::value(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse() {
        let q = |s: &str| quantity_value(&Quantity(s.into()));
        assert_eq!(q("4"), Some(4.0));
        assert_eq!(q("500m"), Some(0.5));
        assert_eq!(q("8Gi"), Some(8.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(q("1e3"), Some(1000.0));
        assert_eq!(q("2E"), Some(2e18));
        assert_eq!(q("lots"), None);
    }

    #[test]
    fn labels_follow_slinky() {
        let l = worker_labels("w", "slurm");
        assert_eq!(
            l.get("app.kubernetes.io/name").map(String::as_str),
            Some("slurmd")
        );
        assert_eq!(
            l.get("app.kubernetes.io/component").map(String::as_str),
            Some("worker")
        );
        assert_eq!(
            l.get("slinky.slurm.net/cluster").map(String::as_str),
            Some("slurm")
        );
        assert_eq!(CONTROLLER.selector_labels("x").len(), 2);
    }
}
