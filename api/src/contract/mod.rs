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

/// Cluster facts the sandbox cannot see, supplied by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildContext {
    /// The cluster DNS domain, e.g. `cluster.local`.
    pub cluster_domain: String,
}

impl Default for BuildContext {
    fn default() -> Self {
        BuildContext {
            cluster_domain: "cluster.local".into(),
        }
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
