//! The builder contract's shared types: what the host sends a builder and what a builder answers,
//! the builder kinds and the contract versions. The host and the guest SDK both use these, so
//! they agree on every name without depending on each other.
//!
//! The WIT records (`slinky:builder@<version>`) cross the Wasm boundary; these are their Rust
//! faces on both sides.

mod examples;
mod inputs;
mod kinds;
/// Secret values a builder places without seeing them (`${secretKeyRef:<name>/<key>}`).
pub mod secret_refs;

pub use examples::{
    example_accounting, example_controller, example_inputs, example_loginset, example_nodeset,
    example_restapi,
};
pub use inputs::{
    AccountingInputs, ConfigMapFiles, ControllerInputs, LoginSetInputs, MissingReference, secret_hash,
    secret_value,
};
pub use kinds::{
    BuilderKind, CONTRACT_VERSION, Contract, LogLevel, PACKAGE, PluginInfo, SUPPORTED_CONTRACTS,
};

use crate::NodeSet;

/// Why a build failed; reported by the host on the parent's status and in an Event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The parent object is invalid for this builder. Name the field and the fix.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The request asks for something this builder does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A failure of the builder itself.
    #[error("internal error: {0}")]
    Internal(String),
}

impl BuildError {
    /// An [`BuildError::InvalidInput`] from anything displayable.
    pub fn invalid(message: impl std::fmt::Display) -> Self {
        BuildError::InvalidInput(message.to_string())
    }
}

/// Cluster facts the sandbox cannot see, supplied by the host, with the plugin's settings and the
/// pipeline's previous output (contract 0.3.0; plugins of older contracts get neither).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildContext {
    /// The cluster DNS domain, e.g. `cluster.local`.
    pub cluster_domain: String,
    /// The plugin's settings as JSON text: its `BuilderPlugin`'s `spec.settings`, `{}` without.
    pub settings: String,
    /// What the pipeline's previous step built for this call (JSON texts): empty for the first
    /// step, one object for a pod or a Service, the whole list for `*-children`.
    pub previous: Vec<String>,
}

/// The settings of a plugin that has none.
pub const NO_SETTINGS: &str = "{}";

impl Default for BuildContext {
    fn default() -> Self {
        BuildContext {
            cluster_domain: "cluster.local".into(),
            settings: NO_SETTINGS.into(),
            previous: Vec::new(),
        }
    }
}

impl BuildContext {
    /// The plugin's settings, parsed as `T` (`{}` when the plugin has none, so a `T` whose fields
    /// all have defaults always parses).
    ///
    /// # Errors
    /// [`BuildError::InvalidInput`] naming what does not parse; the host checked the settings
    /// with `validate-settings` first, so this only fails when the two disagree.
    pub fn settings<T: serde::de::DeserializeOwned>(&self) -> Result<T, BuildError> {
        serde_json::from_str(&self.settings)
            .map_err(|e| BuildError::InvalidInput(format!("the plugin's settings: {e}")))
    }

    /// The object the pipeline's previous step built (a pod, a Service), parsed as `T`; `None` for
    /// the first step. For the `*-children` kinds, whose previous output is a list, use the guest
    /// SDK's `previous_children`.
    ///
    /// # Errors
    /// [`BuildError::InvalidInput`] when it does not parse as `T`.
    pub fn previous<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, BuildError> {
        self.previous
            .first()
            .map(|json| {
                serde_json::from_str(json)
                    .map_err(|e| BuildError::InvalidInput(format!("the previous step's output: {e}")))
            })
            .transpose()
    }
}

/// Which pod of a NodeSet to build; computed by the host so every builder agrees on names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodIdentity {
    /// The ordinal (0-based).
    pub ordinal: u32,
    /// The pod name, `<nodeset>-<ordinal>` zero-padded to `ordinalPadding`.
    pub name: String,
    /// The hostname (the Slurm node name).
    pub hostname: String,
    /// The pod revision hash for the `controller-revision-hash` label.
    pub revision: String,
}

impl PodIdentity {
    /// The identity of `ordinal` in `nodeset`, named the way the host names it.
    pub fn for_ordinal(nodeset: &NodeSet, ordinal: u32, revision: impl Into<String>) -> Self {
        PodIdentity {
            ordinal,
            name: nodeset.pod_name(ordinal),
            hostname: nodeset.pod_hostname(ordinal),
            revision: revision.into(),
        }
    }

    /// The identity a live pod of `nodeset` was built with, for `revision`: its ordinal's, when
    /// named as the NodeSet names one (StatefulSet mode); its node's, by its `pod-hostname` label
    /// and under its own name (DaemonSet mode: Slinky's pods there have generated names, the
    /// host's `<nodeset>-<hostname>`); `None` for a pod of no identity the NodeSet gives.
    pub fn of_pod(nodeset: &NodeSet, pod: &k8s_openapi::api::core::v1::Pod, revision: &str) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        if nodeset.is_daemon() {
            let hostname = pod
                .metadata
                .labels
                .as_ref()?
                .get(crate::keys::LABEL_POD_HOSTNAME)
                .filter(|h| !h.is_empty())?;
            Some(PodIdentity {
                ordinal: 0,
                name,
                hostname: hostname.clone(),
                revision: revision.to_string(),
            })
        } else {
            nodeset
                .pod_ordinal(&name)
                .map(|o| Self::for_ordinal(nodeset, o, revision))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_errors_say_their_kind() {
        assert_eq!(BuildError::invalid("x").to_string(), "invalid input: x");
        assert_eq!(BuildError::Unsupported("y".into()).to_string(), "unsupported: y");
        assert_eq!(BuildError::Internal("z".into()).to_string(), "internal error: z");
    }

    #[test]
    fn identity_names_the_pod_as_the_nodeset_does() -> Result<(), BuildError> {
        let nodeset = example_nodeset()?;
        let id = PodIdentity::for_ordinal(&nodeset, 2, "abc");
        assert_eq!(id.name, "slurm-worker-slinky-2");
        assert_eq!(id.hostname, "slinky-2");
        assert_eq!((id.ordinal, id.revision.as_str()), (2, "abc"));
        Ok(())
    }
}
