//! Helpers every Slinky builder needs: labels, metadata merge order, ports, probes, quantities.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ContainerPort, HTTPGetAction, Probe, ServicePort},
    apimachinery::pkg::{api::resource::Quantity, util::intstr::IntOrString},
};
use slinky_api::keys;

/// The `app.kubernetes.io/name` / `component` pair of a Slinky component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// `app.kubernetes.io/name`, e.g. `slurmd`.
    pub name: &'static str,
    /// `app.kubernetes.io/component`, e.g. `worker`.
    pub component: &'static str,
}

/// Controller (slurmctld).
pub const CONTROLLER: Component = Component {
    name: "slurmctld",
    component: "controller",
};
/// RestApi (slurmrestd).
pub const RESTAPI: Component = Component {
    name: "slurmrestd",
    component: "restapi",
};
/// Accounting (slurmdbd).
pub const ACCOUNTING: Component = Component {
    name: "slurmdbd",
    component: "accounting",
};
/// NodeSet (slurmd workers).
pub const WORKER: Component = Component {
    name: "slurmd",
    component: "worker",
};
/// LoginSet.
pub const LOGIN: Component = Component {
    name: "login",
    component: "login",
};

/// A label or annotation map.
pub type Labels = BTreeMap<String, String>;

impl Component {
    /// Selector labels: `app.kubernetes.io/name` and `app.kubernetes.io/instance=<instance>`.
    pub fn selector_labels(self, instance: &str) -> Labels {
        Labels::from([
            (keys::LABEL_NAME.to_string(), self.name.to_string()),
            (keys::LABEL_INSTANCE.to_string(), instance.to_string()),
        ])
    }

    /// Full labels: the selector labels plus `app.kubernetes.io/component`.
    pub fn labels(self, instance: &str) -> Labels {
        let mut labels = self.selector_labels(instance);
        labels.insert(keys::LABEL_COMPONENT.to_string(), self.component.to_string());
        labels
    }
}

/// Worker labels: the NodeSet's full labels plus `slinky.slurm.net/cluster=<controller>`.
pub fn worker_labels(nodeset: &str, controller: &str) -> Labels {
    let mut labels = WORKER.labels(nodeset);
    labels.insert(keys::LABEL_CLUSTER.to_string(), controller.to_string());
    labels
}

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
/// when it cannot be parsed.
pub fn quantity_value(q: &Quantity) -> Option<f64> {
    let s = q.0.trim();
    let split = s
        .char_indices()
        .find(|&(i, c)| c.is_ascii_alphabetic() && !(matches!(c, 'e' | 'E') && is_exponent(s, i)))
        .map_or(s.len(), |(i, _)| i);
    let (number, suffix) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    Some(number * factor)
}

fn is_exponent(s: &str, i: usize) -> bool {
    s[i + 1..]
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+')
}

/// sha256 of `data` as lower-case hex (for `*-hash` annotations).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha2::Sha256::digest(data);
    let mut out = String::with_capacity(2 * digest.len());
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
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
