//! The children builder kinds of contract 0.2.0 (`controller-children`, `nodeset-children`):
//! their calls, and the checked children they return.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::discovery::ApiResource;
use serde_json::Value;
use slinky_api::{Controller, NodeSet};
pub use slinky_guest_sdk::{ConfigMapFiles, ControllerInputs};

use super::{BuildContext, BuilderKind, Exports, Plugin, PluginError, bindings, policy};

/// At most this many objects in one children builder's output.
pub const MAX_CHILDREN: usize = 64;

/// The kinds of objects children builders may return, in the order they are applied (a
/// StatefulSet after the ConfigMap and Service its pods need).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChildKind {
    /// `v1 ConfigMap`.
    ConfigMap,
    /// `v1 Service`.
    Service,
    /// `policy/v1 PodDisruptionBudget`.
    PodDisruptionBudget,
    /// `apps/v1 StatefulSet`.
    StatefulSet,
}

impl ChildKind {
    /// Every kind, in apply order.
    pub const ALL: [ChildKind; 4] = [
        ChildKind::ConfigMap,
        ChildKind::Service,
        ChildKind::PodDisruptionBudget,
        ChildKind::StatefulSet,
    ];

    /// `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            ChildKind::ConfigMap | ChildKind::Service => "v1",
            ChildKind::PodDisruptionBudget => "policy/v1",
            ChildKind::StatefulSet => "apps/v1",
        }
    }

    /// `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            ChildKind::ConfigMap => "ConfigMap",
            ChildKind::Service => "Service",
            ChildKind::PodDisruptionBudget => "PodDisruptionBudget",
            ChildKind::StatefulSet => "StatefulSet",
        }
    }

    /// The resource (plural) name.
    pub fn plural(self) -> &'static str {
        match self {
            ChildKind::ConfigMap => "configmaps",
            ChildKind::Service => "services",
            ChildKind::PodDisruptionBudget => "poddisruptionbudgets",
            ChildKind::StatefulSet => "statefulsets",
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

    /// The shared owners of a workers' object: every NodeSet of `nodesets` (with a UID), sorted by
    /// name, as plain owners blocking their deletion (Slinky's `SetOwnerReferences`).
    pub fn shared_owners<'a>(nodesets: impl IntoIterator<Item = &'a NodeSet>) -> Vec<OwnerReference> {
        let mut sorted: Vec<&NodeSet> = nodesets
            .into_iter()
            .filter(|n| n.metadata.uid.is_some())
            .collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        sorted
            .into_iter()
            .map(|n| OwnerReference {
                api_version: slinky_api::API_VERSION.into(),
                kind: "NodeSet".into(),
                name: n.metadata.name.clone().unwrap_or_default(),
                uid: n.metadata.uid.clone().unwrap_or_default(),
                controller: None,
                block_owner_deletion: Some(true),
            })
            .collect()
    }
}

impl Plugin {
    /// Call `build-controller-children` and return the raw JSON texts, with no output policy
    /// applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_controller_children_raw(
        &self,
        ctx: &BuildContext,
        controller: &String,
        inputs: &ControllerInputs,
    ) -> Result<Vec<String>, PluginError> {
        const CALL: &str = "build-controller-children";
        let code = self.code();
        let Exports::V2 {
            controller_children: Some(idx),
            ..
        } = &code.exports
        else {
            return Err(self.not_a_kind(BuilderKind::ControllerChildren));
        };
        let wctx = bindings::v2::types::BuildContext::from_host(ctx);
        let winputs = bindings::v2::types::ControllerInputs {
            nodesets: inputs
                .nodesets
                .iter()
                .map(|n| self.input(CALL, n))
                .collect::<Result<_, _>>()?,
            slurm_key_hash: inputs.slurm_key_hash.clone(),
            jwt_key_hash: inputs.jwt_key_hash.clone(),
            config_maps: inputs
                .config_maps
                .iter()
                .map(|c| bindings::v2::types::ConfigMapFiles {
                    name: c.name.clone(),
                    files: c.files.clone(),
                })
                .collect(),
        };
        let out = self.call(&code, CALL, |store, instance| {
            let r = idx
                .load(&mut *store, instance)?
                .call_build_controller_children(store, &wctx, controller, &winputs)?;
            Ok(r.map_err(bindings::guest_error_v2))
        })?;
        self.bounded_list(CALL, out)
    }

    /// Call `build-nodeset-children` and return the raw JSON texts, with no output policy applied.
    ///
    /// # Errors
    /// A [`PluginError`] for a trap, deadline, memory cap, or the builder's own error.
    #[allow(
        clippy::ptr_arg,
        reason = "the generated binding takes the WIT `json` (a String) by reference"
    )]
    pub fn build_nodeset_children_raw(
        &self,
        ctx: &BuildContext,
        nodeset: &String,
        controller: &String,
    ) -> Result<Vec<String>, PluginError> {
        const CALL: &str = "build-nodeset-children";
        let code = self.code();
        let Exports::V2 {
            nodeset_children: Some(idx),
            ..
        } = &code.exports
        else {
            return Err(self.not_a_kind(BuilderKind::NodesetChildren));
        };
        let wctx = bindings::v2::types::BuildContext::from_host(ctx);
        let out = self.call(&code, CALL, |store, instance| {
            let r = idx
                .load(&mut *store, instance)?
                .call_build_nodeset_children(store, &wctx, nodeset, controller)?;
            Ok(r.map_err(bindings::guest_error_v2))
        })?;
        self.bounded_list(CALL, out)
    }

    /// Build a Controller's children besides its Service: serialize copies, call the plugin,
    /// apply the output policy (the host sets owner references and builder annotations).
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    pub fn build_controller_children(
        &self,
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = "build-controller-children";
        let input = self.input(CALL, controller)?;
        let raw = self.build_controller_children_raw(ctx, &input, inputs)?;
        policy::controller_children(&raw, controller, self).map_err(|reason| PluginError::Rejected {
            plugin: self.label(),
            call: CALL,
            reason,
        })
    }

    /// Build a NodeSet's children besides its pods: serialize copies, call the plugin, apply the
    /// output policy. Shared children come without owner references: the host sets them to
    /// every NodeSet of the Controller ([`Child::shared_owners`]).
    ///
    /// # Errors
    /// A [`PluginError`]; [`PluginError::Rejected`] when an object breaks the policy.
    pub fn build_nodeset_children(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError> {
        const CALL: &str = "build-nodeset-children";
        let ns_json = self.input(CALL, nodeset)?;
        let ctl_json = self.input(CALL, controller)?;
        let raw = self.build_nodeset_children_raw(ctx, &ns_json, &ctl_json)?;
        policy::nodeset_children(&raw, nodeset, self).map_err(|reason| PluginError::Rejected {
            plugin: self.label(),
            call: CALL,
            reason,
        })
    }

    /// `list`, unless it has too many objects or one is larger than an API server accepts.
    fn bounded_list(&self, call: &'static str, list: Vec<String>) -> Result<Vec<String>, PluginError> {
        if list.len() > MAX_CHILDREN {
            return Err(PluginError::Rejected {
                plugin: self.label(),
                call,
                reason: format!(
                    "the output has {} objects, more than the {MAX_CHILDREN} allowed",
                    list.len()
                ),
            });
        }
        list.into_iter().map(|json| self.bounded(call, json)).collect()
    }
}
