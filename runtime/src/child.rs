//! The child objects the children builder kinds (`controller-children`, `nodeset-children`,
//! contract 0.2.0 on; `restapi-children`, 0.3.0 on) return, once checked by the output policy: their kinds and their owners.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::discovery::ApiResource;
use serde_json::Value;

/// At most this many objects in one children builder's output.
pub const MAX_CHILDREN: usize = 64;

/// The kinds of objects children builders may return, in the order they are applied (a
/// StatefulSet after the ConfigMap, Secret and Service its pods need).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChildKind {
    /// `v1 ConfigMap`.
    ConfigMap,
    /// `v1 Secret` (an Accounting's `slurmdbd.conf`; never cached, never shown to a builder:
    /// its secret placeholders are resolved by the host).
    Secret,
    /// `v1 Service`.
    Service,
    /// `policy/v1 PodDisruptionBudget`.
    PodDisruptionBudget,
    /// `apps/v1 StatefulSet`.
    StatefulSet,
    /// `apps/v1 Deployment`.
    Deployment,
    /// `monitoring.coreos.com/v1 ServiceMonitor` (the Prometheus Operator's: a Controller's
    /// metrics; not cached, since the kind may not be served).
    ServiceMonitor,
}

impl ChildKind {
    /// Every kind, in apply order.
    pub const ALL: [ChildKind; 7] = [
        ChildKind::ConfigMap,
        ChildKind::Secret,
        ChildKind::Service,
        ChildKind::PodDisruptionBudget,
        ChildKind::StatefulSet,
        ChildKind::Deployment,
        ChildKind::ServiceMonitor,
    ];

    /// `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            ChildKind::ConfigMap | ChildKind::Secret | ChildKind::Service => "v1",
            ChildKind::PodDisruptionBudget => "policy/v1",
            ChildKind::StatefulSet | ChildKind::Deployment => "apps/v1",
            ChildKind::ServiceMonitor => "monitoring.coreos.com/v1",
        }
    }

    /// `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            ChildKind::ConfigMap => "ConfigMap",
            ChildKind::Secret => "Secret",
            ChildKind::Service => "Service",
            ChildKind::PodDisruptionBudget => "PodDisruptionBudget",
            ChildKind::StatefulSet => "StatefulSet",
            ChildKind::Deployment => "Deployment",
            ChildKind::ServiceMonitor => "ServiceMonitor",
        }
    }

    /// The resource (plural) name.
    pub fn plural(self) -> &'static str {
        match self {
            ChildKind::ConfigMap => "configmaps",
            ChildKind::Secret => "secrets",
            ChildKind::Service => "services",
            ChildKind::PodDisruptionBudget => "poddisruptionbudgets",
            ChildKind::StatefulSet => "statefulsets",
            ChildKind::Deployment => "deployments",
            ChildKind::ServiceMonitor => "servicemonitors",
        }
    }

    /// The kind of `apiVersion`/`kind`, if it is one.
    pub fn of(api_version: &str, kind: &str) -> Option<ChildKind> {
        ChildKind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.kind() == kind)
    }

    /// The API resource, for dynamic API calls.
    pub fn api_resource(self) -> ApiResource {
        let (group, version) = match self.api_version().split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version()),
        };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: self.api_version().into(),
            kind: self.kind().into(),
            plural: self.plural().into(),
        }
    }
}

impl std::fmt::Display for ChildKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

/// Who owns a child, decided by the host's output policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Controlled by its parent (a controller owner reference): deleted by the host when its
    /// builder no longer returns it.
    Controlled,
    /// The workers' Service or PodDisruptionBudget of a Controller, shared by every NodeSet that
    /// references it: each is a plain owner (sorted by name), so the garbage collector removes it
    /// with the last one.
    Shared,
}

/// A child object a children builder returned, checked by the output policy and finished by the
/// host (namespace, owner references, builder annotations).
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// Its kind.
    pub kind: ChildKind,
    /// Who owns it.
    pub ownership: Ownership,
    /// The object, with `apiVersion` and `kind`.
    pub object: Value,
}

impl Child {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> &str {
        self.object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `Kind name`, for messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.kind, self.name())
    }

    /// Replace `metadata.ownerReferences` (absent when empty).
    pub fn set_owners(&mut self, owners: Vec<OwnerReference>) {
        let Some(meta) = self.object.get_mut("metadata").and_then(Value::as_object_mut) else {
            return;
        };
        if owners.is_empty() {
            meta.remove("ownerReferences");
        } else {
            meta.insert(
                "ownerReferences".into(),
                serde_json::to_value(owners).unwrap_or(Value::Null),
            );
        }
    }
}
