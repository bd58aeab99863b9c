//! What the host reads from the cluster for a Controller's children builder, gathered by one
//! rule for `run` (from the caches and the API) and `render` (from files).

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret, SecretKeySelector},
};

use crate::{Accounting, Controller, LoginSet, NodeSet, hash::checksum_of_map};

/// A ConfigMap a Controller references, by the files it provides (its keys, sorted): never their
/// content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfigMapFiles {
    /// The ConfigMap's name.
    pub name: String,
    /// Its keys (`data` and `binaryData`), sorted.
    pub files: Vec<String>,
}

impl ConfigMapFiles {
    /// The files `config_map` provides, under the name `name` (the name the Controller uses).
    pub fn of(name: impl Into<String>, config_map: &ConfigMap) -> Self {
        let mut files: Vec<String> = config_map
            .data
            .iter()
            .flat_map(|d| d.keys().cloned())
            .chain(config_map.binary_data.iter().flat_map(|d| d.keys().cloned()))
            .collect();
        files.sort();
        ConfigMapFiles {
            name: name.into(),
            files,
        }
    }
}

/// What the host read from the cluster for a Controller's children. Builders never see Secret
/// data: only Slinky's hashes of it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControllerInputs {
    /// The NodeSets that reference the Controller, sorted by name.
    pub nodesets: Vec<NodeSet>,
    /// `slinky.slurm.net/slurm-key-hash`: sha256 (hex) of the Slurm key Secret's values in key
    /// order (Slinky's `CheckSumFromMap`); empty for an external Controller.
    pub slurm_key_hash: String,
    /// `slinky.slurm.net/jwt-key-hash`: the same over the JWT key Secret.
    pub jwt_key_hash: String,
    /// Every ConfigMap the Controller references, each once, sorted by name.
    pub config_maps: Vec<ConfigMapFiles>,
    /// The Accounting `spec.accountingRef` names, when it exists (its `AccountingStorage*`
    /// lines); contract 0.3.0 on.
    pub accounting: Option<Accounting>,
}

/// What the host read from the cluster for a LoginSet's children. Builders never see Secret
/// data: only Slinky's hashes of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginSetInputs {
    /// `slinky.slurm.net/ssh-host-keys-hash`: Slinky's hash of the host keys Secret
    /// `<loginset>-ssh-host-keys` (made by the host).
    pub ssh_host_keys_hash: String,
    /// `slinky.slurm.net/sssd-conf-hash`: sha256 (hex) of the `sssd.conf` value
    /// `spec.sssdConfRef` names.
    pub sssd_conf_hash: String,
}

/// What the host read from the cluster for an Accounting's children. Builders never see Secret
/// data: only Slinky's hashes of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AccountingInputs {
    /// `slinky.slurm.net/slurm-key-hash` of the Secret `spec.slurmKeyRef` names.
    pub slurm_key_hash: String,
    /// `slinky.slurm.net/jwt-key-hash` of the Secret `spec.jwtKeyRef` names.
    pub jwt_key_hash: String,
    /// `slinky.slurm.net/slurmdbd-conf-hash`: Slinky's hash of the `<accounting>-accounting`
    /// Secret as stored now (empty data when it does not exist yet), so a changed
    /// `slurmdbd.conf` rolls slurmdbd.
    pub slurmdbd_conf_hash: String,
}

/// A reference of a Controller that the cluster (or the rendered input) does not satisfy: the
/// children that need it wait for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissingReference {
    /// The Secret `name`, referenced by `field`, does not exist.
    Secret {
        /// `spec.slurmKeyRef` or `spec.jwtKeyRef`.
        field: &'static str,
        /// The Secret's name.
        name: String,
    },
    /// The Secret `name`, referenced by `field`, has no key `key`.
    SecretKey {
        /// `spec.slurmKeyRef` or `spec.jwtKeyRef`.
        field: &'static str,
        /// The Secret's name.
        name: String,
        /// The key the reference names.
        key: String,
    },
    /// The ConfigMap `name` does not exist.
    ConfigMap {
        /// The ConfigMap's name.
        name: String,
    },
    /// The ConfigMap `name`, referenced by `spec.jwksKeyRef`, has no key `key`.
    ConfigMapKey {
        /// The ConfigMap's name.
        name: String,
        /// The key the reference names.
        key: String,
    },
    /// The Accounting `name` (`spec.accountingRef`) does not exist. It does not hold the
    /// children back: `slurm.conf` names its default address, and slurmctld keeps the
    /// accounting records until slurmdbd answers.
    Accounting {
        /// The Accounting's name.
        name: String,
    },
}

impl MissingReference {
    /// The reason of the `ReferenceNotFound` condition and Event: `SecretNotFound`,
    /// `SecretKeyNotFound`, `ConfigMapNotFound` or `ConfigMapKeyNotFound`.
    pub fn reason(&self) -> &'static str {
        match self {
            MissingReference::Secret { .. } => "SecretNotFound",
            MissingReference::SecretKey { .. } => "SecretKeyNotFound",
            MissingReference::ConfigMap { .. } => "ConfigMapNotFound",
            MissingReference::ConfigMapKey { .. } => "ConfigMapKeyNotFound",
            MissingReference::Accounting { .. } => "AccountingNotFound",
        }
    }

    /// Whether the children that need it wait for it (every missing reference but an
    /// Accounting's).
    pub fn holds_back(&self) -> bool {
        !matches!(self, MissingReference::Accounting { .. })
    }

    /// What is missing, of a parent in namespace `ns`, naming the object and the field:
    /// `Secret ns/k (spec.slurmKeyRef) does not exist`.
    pub fn describe(&self, ns: &str) -> String {
        match self {
            MissingReference::Secret { field, name } => {
                format!("Secret {ns}/{name} ({field}) does not exist")
            }
            MissingReference::SecretKey { field, name, key } => {
                format!("Secret {ns}/{name} ({field}) has no key {key:?}")
            }
            MissingReference::ConfigMap { name } => {
                format!("ConfigMap {ns}/{name} (referenced by the Controller's spec) does not exist")
            }
            MissingReference::ConfigMapKey { name, key } => {
                format!("ConfigMap {ns}/{name} (spec.jwksKeyRef) has no key {key:?}")
            }
            MissingReference::Accounting { name } => {
                format!("Accounting {ns}/{name} (spec.accountingRef) does not exist")
            }
        }
    }
}

/// The value of `key` of `secret`: `stringData`'s (what a client wrote and the API server has
/// not merged yet) over `data`'s.
pub fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|ByteString(v)| v.clone())
        })
}

/// Slinky's hash of a Secret's data (`stringData` over `data`, as the API server stores it).
pub fn secret_hash(secret: &Secret) -> String {
    let mut data = secret.data.clone().unwrap_or_default();
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), ByteString(v.as_bytes().to_vec()));
    }
    checksum_of_map(data.iter().map(|(k, ByteString(v))| (k, v.as_slice())))
}

impl ControllerInputs {
    /// The files ConfigMap `name` provides (none when it is not among the inputs).
    pub fn files_of(&self, name: &str) -> &[String] {
        self.config_maps
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.files.as_slice())
            .unwrap_or_default()
    }

    /// Of `nodesets`, those that reference `controller` (its name, in its namespace), sorted by
    /// name.
    pub fn nodesets_of<'a>(
        controller: &Controller,
        nodesets: impl IntoIterator<Item = &'a NodeSet>,
    ) -> Vec<NodeSet> {
        let ns = controller.metadata.namespace.as_deref().unwrap_or_default();
        let name = controller.metadata.name.as_deref().unwrap_or_default();
        let mut out: Vec<NodeSet> = nodesets
            .into_iter()
            .filter(|n| n.controller_namespace() == ns && n.spec.controller_ref.name == name)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        out
    }

    /// The inputs of `controller`'s children builder, with every reference the lookups could not
    /// satisfy, in the order the host reports them (the Slurm key, the JWT key, then the
    /// ConfigMaps by name).
    ///
    /// `nodesets` are all the NodeSets known (those of `controller` are picked); `secret`,
    /// `config_map` and `accounting` look an object of the Controller's namespace up by name. An
    /// external Controller needs no Secret or ConfigMap: its inputs are its NodeSets (and its
    /// Accounting) only. A missing Secret leaves its hash empty; a Secret without its key is still
    /// hashed; a missing ConfigMap provides no files; a missing Accounting is reported last.
    pub fn gather<'a>(
        controller: &Controller,
        nodesets: impl IntoIterator<Item = &'a NodeSet>,
        secret: impl Fn(&str) -> Option<&'a Secret>,
        config_map: impl Fn(&str) -> Option<&'a ConfigMap>,
        accounting: impl Fn(&str) -> Option<&'a Accounting>,
    ) -> (ControllerInputs, Vec<MissingReference>) {
        let mut inputs = ControllerInputs {
            nodesets: Self::nodesets_of(controller, nodesets),
            ..Default::default()
        };
        let mut missing = Vec::new();
        let account = controller
            .spec
            .accounting_ref
            .as_ref()
            .filter(|r| !r.name.is_empty());
        if let Some(r) = account {
            inputs.accounting = accounting(&r.name).cloned();
        }
        let account_missing = account
            .filter(|_| inputs.accounting.is_none())
            .map(|r| MissingReference::Accounting { name: r.name.clone() });
        if controller.spec.external {
            missing.extend(account_missing);
            return (inputs, missing);
        }
        let spec = &controller.spec;
        for (field, reference, hash) in [
            (
                "spec.slurmKeyRef",
                &spec.slurm_key_ref,
                &mut inputs.slurm_key_hash,
            ),
            ("spec.jwtKeyRef", &spec.jwt_key_ref, &mut inputs.jwt_key_hash),
        ] {
            if let Some(r) = reference {
                *hash = key_hash(field, r, &secret, &mut missing);
            }
        }
        for name in controller.config_map_refs() {
            let Some(cm) = config_map(&name) else {
                missing.push(MissingReference::ConfigMap { name: name.clone() });
                inputs.config_maps.push(ConfigMapFiles { name, files: vec![] });
                continue;
            };
            let files = ConfigMapFiles::of(name, cm);
            if let Some(jwks) = spec.jwks_key_ref.as_ref().filter(|j| j.name == files.name)
                && !files.files.contains(&jwks.key)
            {
                missing.push(MissingReference::ConfigMapKey {
                    name: files.name.clone(),
                    key: jwks.key.clone(),
                });
            }
            inputs.config_maps.push(files);
        }
        missing.extend(account_missing);
        (inputs, missing)
    }
}

impl LoginSetInputs {
    /// The inputs of `loginset`'s children builder: the hash of its host keys Secret (`keys`,
    /// `None` before the host made it: the hash is empty) and of the `sssd.conf` value
    /// `spec.sssdConfRef` names (`secret` looks a Secret of its namespace up by name), with the
    /// reference the lookup could not satisfy.
    pub fn gather<'a>(
        loginset: &LoginSet,
        keys: Option<&Secret>,
        secret: impl Fn(&str) -> Option<&'a Secret>,
    ) -> (LoginSetInputs, Option<MissingReference>) {
        let sssd = &loginset.spec.sssd_conf_ref;
        const FIELD: &str = "spec.sssdConfRef";
        let (sssd_conf_hash, missing) = match secret(&sssd.name) {
            None => (
                String::new(),
                Some(MissingReference::Secret {
                    field: FIELD,
                    name: sssd.name.clone(),
                }),
            ),
            Some(found) => match secret_value(found, &sssd.key) {
                Some(value) => (crate::hash::sha256_hex(&value), None),
                None => (
                    String::new(),
                    Some(MissingReference::SecretKey {
                        field: FIELD,
                        name: sssd.name.clone(),
                        key: sssd.key.clone(),
                    }),
                ),
            },
        };
        let inputs = LoginSetInputs {
            ssh_host_keys_hash: keys.map(secret_hash).unwrap_or_default(),
            sssd_conf_hash,
        };
        (inputs, missing)
    }
}

impl AccountingInputs {
    /// The inputs of `accounting`'s children builder: the hashes of its key Secrets (`secret`
    /// looks one of its namespace up by name) and of its `slurmdbd.conf` Secret as stored
    /// (`stored`, `None` before it exists), with every key reference the lookups could not
    /// satisfy. An external Accounting needs none.
    pub fn gather<'a>(
        accounting: &Accounting,
        secret: impl Fn(&str) -> Option<&'a Secret>,
        stored: Option<&Secret>,
    ) -> (AccountingInputs, Vec<MissingReference>) {
        let mut inputs = AccountingInputs {
            slurmdbd_conf_hash: stored.map(secret_hash).unwrap_or_default(),
            ..Default::default()
        };
        let mut missing = Vec::new();
        if accounting.spec.external {
            return (inputs, missing);
        }
        let spec = &accounting.spec;
        for (field, reference, hash) in [
            (
                "spec.slurmKeyRef",
                &spec.slurm_key_ref,
                &mut inputs.slurm_key_hash,
            ),
            ("spec.jwtKeyRef", &spec.jwt_key_ref, &mut inputs.jwt_key_hash),
        ] {
            if let Some(r) = reference {
                *hash = key_hash(field, r, &secret, &mut missing);
            }
        }
        (inputs, missing)
    }
}

/// The hash of the Secret `r` references, noting it when it or its key is missing.
fn key_hash<'a>(
    field: &'static str,
    r: &SecretKeySelector,
    secret: &impl Fn(&str) -> Option<&'a Secret>,
    missing: &mut Vec<MissingReference>,
) -> String {
    let Some(found) = secret(&r.name) else {
        missing.push(MissingReference::Secret {
            field,
            name: r.name.clone(),
        });
        return String::new();
    };
    let has_key = found.data.as_ref().is_some_and(|d| d.contains_key(&r.key))
        || found.string_data.as_ref().is_some_and(|d| d.contains_key(&r.key));
    if !has_key {
        missing.push(MissingReference::SecretKey {
            field,
            name: r.name.clone(),
            key: r.key.clone(),
        });
    }
    secret_hash(found)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, LocalObjectReference};

    use super::*;
    use crate::{ControllerReference, ControllerSpec, NodeSetSpec, hash::sha256_hex};

    fn controller() -> Controller {
        let mut c = Controller::new(
            "slurm",
            ControllerSpec {
                slurm_key_ref: Some(SecretKeySelector {
                    name: "slurm-key".into(),
                    key: "slurm.key".into(),
                    ..Default::default()
                }),
                jwks_key_ref: Some(ConfigMapKeySelector {
                    name: "jwks".into(),
                    key: "jwks.json".into(),
                    ..Default::default()
                }),
                config_file_refs: vec![LocalObjectReference { name: "extra".into() }],
                ..Default::default()
            },
        );
        c.metadata.namespace = Some("hpc".into());
        c
    }

    fn nodeset(name: &str, controller: &str, namespace: &str) -> NodeSet {
        let mut n = NodeSet::new(
            name,
            NodeSetSpec {
                controller_ref: ControllerReference {
                    name: controller.into(),
                    namespace: None,
                },
                ..Default::default()
            },
        );
        n.metadata.namespace = Some(namespace.into());
        n
    }

    fn config_map(keys: &[&str]) -> ConfigMap {
        ConfigMap {
            data: Some(keys.iter().map(|k| (k.to_string(), String::new())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn the_controllers_nodesets_sorted() {
        let all = [
            nodeset("b", "slurm", "hpc"),
            nodeset("a", "slurm", "hpc"),
            nodeset("c", "other", "hpc"),
            nodeset("d", "slurm", "elsewhere"),
        ];
        let names: Vec<_> = ControllerInputs::nodesets_of(&controller(), &all)
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn everything_found_hashes_keys_and_lists_files() {
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "slurm.key".to_string(),
                ByteString(b"k".to_vec()),
            )])),
            ..Default::default()
        };
        let (jwks, extra) = (config_map(&["jwks.json"]), config_map(&["b.conf", "a.conf"]));
        let (inputs, missing) = ControllerInputs::gather(
            &controller(),
            &[],
            |name| (name == "slurm-key").then_some(&secret),
            |name| match name {
                "jwks" => Some(&jwks),
                "extra" => Some(&extra),
                _ => None,
            },
            |_| None,
        );
        assert_eq!(missing, []);
        assert_eq!(inputs.slurm_key_hash, sha256_hex(b"k"));
        assert_eq!(inputs.jwt_key_hash, "");
        assert_eq!(inputs.files_of("extra"), ["a.conf", "b.conf"]);
        assert_eq!(inputs.config_maps.len(), 2);
    }

    #[test]
    fn missing_references_in_the_order_the_host_reports_them() {
        let empty = Secret::default();
        let jwks = config_map(&["other"]);
        let (inputs, missing) = ControllerInputs::gather(
            &controller(),
            &[],
            |_| Some(&empty),
            |name| (name == "jwks").then_some(&jwks),
            |_| None,
        );
        let reasons: Vec<_> = missing.iter().map(MissingReference::reason).collect();
        assert_eq!(
            reasons,
            ["SecretKeyNotFound", "ConfigMapNotFound", "ConfigMapKeyNotFound"]
        );
        assert_eq!(inputs.files_of("extra"), [] as [String; 0]);
        let (_, missing) = ControllerInputs::gather(&controller(), &[], |_| None, |_| None, |_| None);
        assert_eq!(
            missing.first(),
            Some(&MissingReference::Secret {
                field: "spec.slurmKeyRef",
                name: "slurm-key".into()
            })
        );
    }

    #[test]
    fn an_external_controller_needs_no_references() {
        let mut c = controller();
        c.spec.external = true;
        let (inputs, missing) = ControllerInputs::gather(&c, &[], |_| None, |_| None, |_| None);
        assert_eq!((inputs, missing), (ControllerInputs::default(), vec![]));
    }

    #[test]
    fn a_missing_accounting_is_reported_last_and_holds_nothing_back() {
        let mut c = controller();
        c.spec.slurm_key_ref = None;
        c.spec.jwks_key_ref = None;
        c.spec.config_file_refs.clear();
        c.spec.accounting_ref = Some(LocalObjectReference { name: "acct".into() });
        let (inputs, missing) = ControllerInputs::gather(&c, &[], |_| None, |_| None, |_| None);
        assert_eq!(inputs.accounting, None);
        assert_eq!(missing, [MissingReference::Accounting { name: "acct".into() }]);
        assert!(!missing[0].holds_back());
        assert_eq!(missing[0].reason(), "AccountingNotFound");
        let acct = Accounting::new("acct", Default::default());
        let (inputs, missing) =
            ControllerInputs::gather(&c, &[], |_| None, |_| None, |n| (n == "acct").then_some(&acct));
        assert_eq!(
            inputs.accounting.map(|a| a.metadata.name),
            Some(Some("acct".to_string()))
        );
        assert_eq!(missing, []);
    }

    #[test]
    fn accounting_inputs_hash_keys_and_the_stored_conf() {
        let key = Secret {
            data: Some(BTreeMap::from([("k".to_string(), ByteString(b"key".to_vec()))])),
            ..Default::default()
        };
        let acct: Accounting = serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Accounting",
            "metadata": {"name": "a", "namespace": "hpc"},
            "spec": {"slurmKeyRef": {"name": "slurm", "key": "k"}, "jwtKeyRef": {"name": "jwt", "key": "k"}}
        }))
        .unwrap_or_default();
        let (inputs, missing) = AccountingInputs::gather(&acct, |n| (n == "slurm").then_some(&key), None);
        assert_eq!(inputs.slurm_key_hash, sha256_hex(b"key"));
        assert_eq!(inputs.slurmdbd_conf_hash, "", "Slinky's hash of no data");
        assert_eq!(missing.len(), 1, "{missing:?}");
        let conf = Secret {
            data: Some(BTreeMap::from([(
                "slurmdbd.conf".to_string(),
                ByteString(b"x".to_vec()),
            )])),
            ..Default::default()
        };
        let (inputs, _) = AccountingInputs::gather(&acct, |_| Some(&key), Some(&conf));
        assert_eq!(inputs.slurmdbd_conf_hash, sha256_hex(b"x"));
    }

    #[test]
    fn string_data_counts_in_the_secret_hash() {
        let secret = Secret {
            data: Some(BTreeMap::from([("a".to_string(), ByteString(b"1".to_vec()))])),
            string_data: Some(BTreeMap::from([("b".to_string(), "2".to_string())])),
            ..Default::default()
        };
        assert_eq!(secret_hash(&secret), sha256_hex(b"12"));
    }
}
