//! The example inputs (the repository's example cluster, as the Slinky Helm chart renders it):
//! what plugin authors test against and what the host builds with every new plugin version
//! before it serves.

use crate::{Accounting, Controller, LoginSet, NodeSet, RestApi, hash::sha256_hex};

use super::{AccountingInputs, BuildError, ControllerInputs, LoginSetInputs};

const EXAMPLE_CONTROLLER: &str = include_str!("example-controller.json");
const EXAMPLE_NODESET: &str = include_str!("example-nodeset.json");
const EXAMPLE_RESTAPI: &str = include_str!("example-restapi.json");
const EXAMPLE_LOGINSET: &str = include_str!("example-loginset.json");
const EXAMPLE_ACCOUNTING: &str = include_str!("example-accounting.json");

fn parse<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Result<T, BuildError> {
    serde_json::from_str(json).map_err(|e| BuildError::InvalidInput(format!("cannot parse the {what}: {e}")))
}

/// The example Controller (`slurm` in namespace `slurm`, as the Slinky Helm chart renders it).
///
/// # Errors
/// Never in practice: the example is checked by this crate's tests.
pub fn example_controller() -> Result<Controller, BuildError> {
    parse("example Controller", EXAMPLE_CONTROLLER)
}

/// The example NodeSet (`slurm-worker-slinky`, 3 replicas).
///
/// # Errors
/// Never in practice: the example is checked by this crate's tests.
pub fn example_nodeset() -> Result<NodeSet, BuildError> {
    parse("example NodeSet", EXAMPLE_NODESET)
}

/// The example RestApi (`slurm`, for the example Controller).
///
/// # Errors
/// Never in practice: the example is checked by this crate's tests.
pub fn example_restapi() -> Result<RestApi, BuildError> {
    parse("example RestApi", EXAMPLE_RESTAPI)
}

/// The example LoginSet (`slurm-login-slinky`, for the example Controller, as the Slinky Helm
/// chart renders it).
///
/// # Errors
/// Never in practice: the example is checked by this crate's tests.
pub fn example_loginset() -> Result<LoginSet, BuildError> {
    parse("example LoginSet", EXAMPLE_LOGINSET)
}

/// The example Accounting (`slurm`, storing in MariaDB at `mariadb:3306`, as the Slinky Helm
/// chart renders it).
///
/// # Errors
/// Never in practice: the example is checked by this crate's tests.
pub fn example_accounting() -> Result<Accounting, BuildError> {
    parse("example Accounting", EXAMPLE_ACCOUNTING)
}

impl LoginSetInputs {
    /// Example inputs of a LoginSet's children builder: hashes of `ssh-host-keys` and `sssd`.
    pub fn example() -> Self {
        LoginSetInputs {
            ssh_host_keys_hash: sha256_hex(b"ssh-host-keys"),
            sssd_conf_hash: sha256_hex(b"sssd"),
        }
    }
}

impl AccountingInputs {
    /// Example inputs of an Accounting's children builder: hashes of `slurm-key`, `jwt-key` and
    /// `slurmdbd.conf`.
    pub fn example() -> Self {
        AccountingInputs {
            slurm_key_hash: sha256_hex(b"slurm-key"),
            jwt_key_hash: sha256_hex(b"jwt-key"),
            slurmdbd_conf_hash: sha256_hex(b"slurmdbd.conf"),
        }
    }
}

/// Example inputs of `controller`'s children builder: the given NodeSets (sorted by name, as the
/// host sends them), key hashes of the Secrets `slurm-key` and `jwt-key`, no referenced
/// ConfigMaps.
pub fn example_inputs(nodesets: &[NodeSet]) -> ControllerInputs {
    let mut nodesets = nodesets.to_vec();
    nodesets.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    ControllerInputs {
        nodesets,
        slurm_key_hash: sha256_hex(b"slurm-key"),
        jwt_key_hash: sha256_hex(b"jwt-key"),
        config_maps: Vec::new(),
        accounting: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_parse() -> Result<(), BuildError> {
        assert_eq!(example_controller()?.metadata.name.as_deref(), Some("slurm"));
        assert_eq!(example_nodeset()?.replicas(), 3);
        assert_eq!(example_restapi()?.spec.controller_ref.name, "slurm");
        let login = example_loginset()?;
        assert_eq!(login.spec.controller_ref.name, "slurm");
        assert!(login.spec_problems().is_empty(), "{:?}", login.spec_problems());
        let acct = example_accounting()?;
        assert!(acct.spec_problems().is_empty(), "{:?}", acct.spec_problems());
        Ok(())
    }
}
