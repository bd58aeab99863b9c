//! Slurm's configuration files as Slinky writes them: `slurm.conf` (every line of
//! `buildSlurmConf`, in its order), the minimal `slurm.conf` of an external Controller,
//! `cgroup.conf`, and the workers' `sshd_config`.

use std::collections::{BTreeMap, BTreeSet};

use slinky_api::{Accounting, Controller, NodeSet};

use super::{LOG_DIR, SLURMCTLD_PORT, SLURMD_PORT, controller_service_name};
use crate::ControllerInputs;

pub use slinky_api::SLURMDBD_PORT;
/// Where the Slurm configuration is mounted in every Slurm pod.
pub const SLURM_ETC: &str = "/etc/slurm";
/// slurmctld's state save root; the state of cluster `c` is in `<root>/c`.
pub const SLURMCTLD_SPOOL: &str = "/var/spool/slurmctld";
/// slurmd's spool directory.
pub const SLURMD_SPOOL: &str = "/var/spool/slurmd";
/// The Slurm user (uid and gid 401 in Slinky's images).
pub const SLURM_USER: &str = "slurm";
/// The JWT key file in [`SLURM_ETC`].
pub const JWT_KEY_FILE: &str = "jwt.key";
/// The JWKS file in [`SLURM_ETC`].
pub const JWKS_FILE: &str = "jwks.json";
/// The cgroup configuration file name.
pub const CGROUP_CONF: &str = "cgroup.conf";
/// The main configuration file name.
pub const SLURM_CONF: &str = "slurm.conf";
/// The sshd configuration file name in a worker's SSH ConfigMap.
pub const SSHD_CONFIG: &str = "sshd_config";

/// Lines of a configuration file: `Key<sep>Value` properties and raw lines, joined by newlines,
/// with a final newline unless turned off (Slinky's `config.Builder`).
struct Conf {
    sep: &'static str,
    lines: Vec<String>,
}

impl Conf {
    fn new(sep: &'static str) -> Self {
        Conf {
            sep,
            lines: Vec::new(),
        }
    }

    fn prop(&mut self, key: &str, value: impl std::fmt::Display) {
        self.lines.push(format!("{key}{}{value}", self.sep));
    }

    fn raw(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    /// A section header: a `#` line, then `### NAME ###`.
    fn section(&mut self, name: &str) {
        self.raw("#");
        self.raw(format!("### {name} ###"));
    }

    fn build(self, final_newline: bool) -> String {
        let mut text = self.lines.join("\n");
        if final_newline {
            text.push('\n');
        }
        text
    }
}

/// The values slurm.conf keys must keep even when `extraConf` sets them: the operator's values are
/// merged into the user's (Slinky's `mergeConfig`).
fn merged_keys(controller: &Controller) -> BTreeMap<&'static str, Vec<String>> {
    let mut alt = vec![format!("jwt_key={SLURM_ETC}/{JWT_KEY_FILE}")];
    if controller.spec.jwks_key_ref.is_some() {
        alt.push(format!("jwks={SLURM_ETC}/{JWKS_FILE}"));
    }
    BTreeMap::from([
        ("AuthAltParameters", alt),
        ("AuthInfo", vec!["use_client_ids".to_string()]),
        (
            "SlurmctldParameters",
            vec!["enable_configless".to_string(), "reconfig_on_restart".to_string()],
        ),
    ])
}

/// The accounting lines: with `accountingRef`, slurmdbd where the Accounting says it is
/// ([`Accounting::storage_address`]: its Service and port, or its external address), or at its
/// default address `<accounting>-accounting:6819` while the Accounting does not exist (slurmctld
/// keeps the records until slurmdbd answers); without, none. Slinky writes
/// `<accounting>-accounting:6819` whatever the Accounting says, and no accounting at all while it
/// does not exist (the jobs of that time are never recorded).
fn accounting(conf: &mut Conf, controller: &Controller, found: Option<&Accounting>) {
    conf.section("ACCOUNTING");
    match controller
        .spec
        .accounting_ref
        .as_ref()
        .filter(|r| !r.name.is_empty())
    {
        Some(acct) => {
            let (host, port) = match found.filter(|a| a.metadata.name.as_deref() == Some(acct.name.as_str()))
            {
                Some(a) => a.storage_address(),
                None => (slinky_api::accounting_key(&acct.name), SLURMDBD_PORT),
            };
            conf.prop("AccountingStorageType", "accounting_storage/slurmdbd");
            conf.prop("AccountingStorageHost", host);
            conf.prop("AccountingStoragePort", port);
        }
        None => conf.prop("AccountingStorageType", "accounting_storage/none"),
    }
}

/// The files of the ConfigMaps `refs` names, sorted (a script name appears once per ConfigMap
/// that has it).
fn script_files(
    inputs: &ControllerInputs,
    refs: &[k8s_openapi::api::core::v1::LocalObjectReference],
) -> Vec<String> {
    let mut files: Vec<String> = refs
        .iter()
        .flat_map(|r| inputs.files_of(&r.name).iter().cloned())
        .collect();
    files.sort();
    files
}

/// `slurm.conf` for a Controller slurmctld runs for: Slinky's `buildSlurmConf`, line for line.
///
/// Sections: GENERAL (cluster name, users, one `SlurmctldHost` per replica, ports, state and spool
/// directories, `MaxNodeCount`), LOGGING, PLUGINS & PARAMETERS (auth, cred, JWT, configless),
/// `MetricsType` with metrics enabled, ACCOUNTING, SLURMCTLD PROLOG & EPILOG and PROLOG &
/// EPILOG (the files of the script ConfigMaps, when any), NODESET & PARTITION (per NodeSet of
/// `inputs`, sorted by name: `NodeSet=<n> Feature=<n>` and, with its partition enabled,
/// `PartitionName=<n> Nodes=<n> <config>`), EXTRA CONFIG (`spec.extraConf`) and MERGED CONFIG
/// (the operator's values of the keys `extraConf` overrides, merged with the user's).
pub fn slurm_conf(controller: &Controller, inputs: &ControllerInputs) -> String {
    let name = controller.metadata.name.as_deref().unwrap_or_default();
    let namespace = controller.metadata.namespace.as_deref().unwrap_or_default();
    let cluster = controller.cluster_name();
    let merge = merged_keys(controller);
    let mut conf = Conf::new("=");

    conf.section("GENERAL");
    conf.prop("ClusterName", &cluster);
    conf.prop("SlurmUser", SLURM_USER);
    if controller.spec.external {
        let ext = controller.spec.external_config.clone().unwrap_or_default();
        conf.prop("SlurmctldHost", &ext.host);
        conf.prop("SlurmctldPort", ext.port);
    } else {
        let internal = controller.internal_service_name();
        for i in 0..controller.replicas() {
            let pod = format!("{}-{i}", controller_service_name(name));
            conf.prop("SlurmctldHost", format!("{pod}({pod}.{internal}.{namespace})"));
        }
        conf.prop("SlurmctldPort", SLURMCTLD_PORT);
        conf.prop(
            "SlurmctldAddr",
            format!("{}.{namespace}", controller_service_name(name)),
        );
    }
    conf.prop("StateSaveLocation", format!("{SLURMCTLD_SPOOL}/{cluster}"));
    conf.prop("SlurmdUser", "root");
    conf.prop("SlurmdPort", SLURMD_PORT);
    conf.prop("SlurmdSpoolDir", SLURMD_SPOOL);
    conf.prop("MaxNodeCount", 1024);

    conf.section("LOGGING");
    conf.prop("SlurmctldLogFile", format!("{LOG_DIR}/slurmctld.log"));
    conf.prop("SlurmSchedLogFile", format!("{LOG_DIR}/slurmctld.log"));
    conf.prop("SlurmdLogFile", format!("{LOG_DIR}/slurmd.log"));

    conf.section("PLUGINS & PARAMETERS");
    conf.prop("AuthType", "auth/slurm");
    conf.prop("CredType", "cred/slurm");
    conf.prop("AuthAltTypes", "auth/jwt");
    for key in ["AuthAltParameters", "AuthInfo", "SlurmctldParameters"] {
        conf.prop(key, merge.get(key).map(|v| v.join(",")).unwrap_or_default());
    }
    if controller.spec.metrics.as_ref().is_some_and(|m| m.enabled) {
        conf.prop("MetricsType", "metrics/openmetrics");
    }

    accounting(&mut conf, controller, inputs.accounting.as_ref());

    let s = &controller.spec;
    let (prolog_ctld, epilog_ctld) = (
        script_files(inputs, &s.prolog_slurmctld_script_refs),
        script_files(inputs, &s.epilog_slurmctld_script_refs),
    );
    if !prolog_ctld.is_empty() || !epilog_ctld.is_empty() {
        conf.section("SLURMCTLD PROLOG & EPILOG");
        let mut part = Conf::new("=");
        for f in &prolog_ctld {
            part.prop("PrologSlurmctld", format!("{SLURM_ETC}/{f}"));
        }
        for f in &epilog_ctld {
            part.prop("EpilogSlurmctld", format!("{SLURM_ETC}/{f}"));
        }
        conf.raw(part.build(false));
    }
    let (prolog, epilog) = (
        script_files(inputs, &s.prolog_script_refs),
        script_files(inputs, &s.epilog_script_refs),
    );
    if !prolog.is_empty() || !epilog.is_empty() {
        conf.section("PROLOG & EPILOG");
        let mut part = Conf::new("=");
        for f in &prolog {
            part.prop("Prolog", f);
        }
        for f in &epilog {
            part.prop("Epilog", f);
        }
        conf.raw(part.build(false));
    }

    let nodesets = nodeset_lines(&inputs.nodesets);
    if !nodesets.is_empty() {
        conf.section("NODESET & PARTITION");
        conf.raw(nodesets.join("\n"));
    }

    let extra = s.extra_conf.clone().unwrap_or_default();
    if !extra.is_empty() {
        conf.section("EXTRA CONFIG");
        conf.raw(extra.clone());
    }
    let merged = merged_config(&extra, &merge);
    if !merged.is_empty() {
        conf.section("MERGED CONFIG");
        conf.raw(merged);
    }
    conf.build(true)
}

/// The NODESET & PARTITION lines of `nodesets`, sorted by NodeSet name.
pub fn nodeset_lines(nodesets: &[NodeSet]) -> Vec<String> {
    let mut sorted: Vec<&NodeSet> = nodesets.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut lines = Vec::new();
    for n in sorted {
        let name = n.slurm_name();
        lines.push(format!("NodeSet={name} Feature={name}"));
        if let Some(p) = n.spec.partition.as_ref().filter(|p| p.enabled) {
            let config = p.config.as_deref().unwrap_or_default();
            // A NodeSet being deleted closes its partition first: no new job is queued there,
            // the queued ones still run (its finalizer waits for them).
            let config = if n.metadata.deletion_timestamp.is_some() {
                config
                    .split_whitespace()
                    .filter(|item| {
                        !item
                            .split_once('=')
                            .is_some_and(|(k, _)| k.eq_ignore_ascii_case("state"))
                    })
                    .chain(["State=DRAIN"])
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                config.to_string()
            };
            // Joined with a space even when the config is empty, as Slinky does.
            lines.push(format!("PartitionName={name} Nodes={name} {config}"));
        }
    }
    lines
}

/// The keys of `slurm.conf` text (lower-cased) with their single-word values: comments dropped,
/// `\`-continued lines joined, values with spaces skipped (Slinky's `parseSlurmConfKV`).
fn conf_values(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut logical = String::new();
    let mut set = |line: &str| {
        let line = line.trim();
        let Some((key, value)) = line.split_once('=') else {
            return;
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || value.is_empty() || value.contains([' ', '\n']) {
            return;
        }
        out.insert(key.to_lowercase(), value.to_string());
    };
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let line = line
            .split('#')
            .next()
            .unwrap_or_default()
            .trim_end_matches([' ', '\t']);
        if line.is_empty() {
            continue;
        }
        if let Some(before) = line.strip_suffix('\\') {
            logical.push_str(before);
            continue;
        }
        logical.push_str(line);
        set(&logical);
        logical.clear();
    }
    if !logical.is_empty() {
        set(&logical);
    }
    out
}

/// The MERGED CONFIG lines: for each key the operator needs (sorted) that `extra` sets, the
/// operator's values plus the user's options whose names it does not have, lower-cased, sorted
/// and comma-joined (Slinky's `BuildMergedConfig`).
pub fn merged_config(extra: &str, merge: &BTreeMap<&'static str, Vec<String>>) -> String {
    let values = conf_values(extra);
    let option = |v: &str| v.split('=').next().unwrap_or_default().to_lowercase();
    let mut conf = Conf::new("=");
    for (key, ours) in merge {
        let Some(theirs) = values.get(&key.to_lowercase()) else {
            continue;
        };
        let mut merged: BTreeSet<String> = ours.iter().cloned().collect();
        let mut seen: BTreeSet<String> = ours.iter().map(|v| option(v)).collect();
        for v in theirs.split(',').filter(|v| !v.is_empty()) {
            if seen.insert(option(v)) {
                merged.insert(v.to_lowercase());
            }
        }
        conf.prop(key, merged.into_iter().collect::<Vec<_>>().join(","));
    }
    conf.build(false)
}

/// The minimal `slurm.conf` of an external Controller (for clients such as slurmrestd; no
/// configless): Slinky's `buildSlurmConfMinimal`.
pub fn slurm_conf_minimal(controller: &Controller, inputs: &ControllerInputs) -> String {
    let ext = controller.spec.external_config.clone().unwrap_or_default();
    let mut conf = Conf::new("=");
    conf.section("GENERAL");
    conf.prop("ClusterName", controller.cluster_name());
    conf.prop("SlurmUser", SLURM_USER);
    conf.prop("SlurmctldHost", &ext.host);
    conf.prop("SlurmctldPort", ext.port);
    conf.section("PLUGINS & PARAMETERS");
    conf.prop("AuthType", "auth/slurm");
    conf.prop("CredType", "cred/slurm");
    conf.prop("AuthAltTypes", "auth/jwt");
    accounting(&mut conf, controller, inputs.accounting.as_ref());
    conf.build(true)
}

/// `cgroup.conf`: cgroup v2, systemd ignored.
pub fn cgroup_conf() -> String {
    let mut conf = Conf::new("=");
    conf.prop("CgroupPlugin", "cgroup/v2");
    conf.prop("IgnoreSystemd", "yes");
    conf.build(true)
}

/// A worker's `sshd_config`: PAM, sftp, public key or password, then `extraSshdConfig`.
pub fn sshd_config(extra: &str) -> String {
    let mut conf = Conf::new(" ");
    conf.section("GENERAL");
    conf.prop("Include", "/etc/ssh/sshd_config.d/*.conf");
    conf.prop("UsePAM", "yes");
    conf.prop("Subsystem", "sftp internal-sftp");
    conf.prop("AuthenticationMethods", "publickey password");
    conf.section("EXTRA CONFIG");
    conf.raw(extra);
    conf.build(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_nodesets_partition_is_drained_and_the_others_are_not() {
        let nodeset = |name: &str, config: &str, deleted: bool| -> NodeSet {
            let mut n: NodeSet = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"controllerRef": {"name": "slurm"},
                         "partition": {"enabled": true, "config": config}}
            }))
            .unwrap_or_else(|e| panic!("{e}"));
            if deleted {
                n.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            }
            n
        };
        let lines = nodeset_lines(&[
            nodeset("gone", "state=UP MaxTime=INFINITE", true),
            nodeset("kept", "State=UP MaxTime=INFINITE", false),
        ]);
        assert_eq!(
            lines,
            [
                "NodeSet=gone Feature=gone",
                "PartitionName=gone Nodes=gone MaxTime=INFINITE State=DRAIN",
                "NodeSet=kept Feature=kept",
                "PartitionName=kept Nodes=kept State=UP MaxTime=INFINITE",
            ]
        );
    }

    #[test]
    fn merged_config_unions_the_operators_values_into_the_users() {
        let c = Controller::new("slurm", Default::default());
        let merge = merged_keys(&c);
        assert_eq!(merged_config("", &merge), "");
        assert_eq!(
            merged_config(
                "SlurmctldParameters=Enable_Stepmgr,reconfig_on_restart\n# AuthInfo=x\nOther=1",
                &merge
            ),
            "SlurmctldParameters=enable_configless,enable_stepmgr,reconfig_on_restart"
        );
        // A user option of a name the operator sets keeps the operator's value.
        assert_eq!(
            merged_config("AuthAltParameters=jwt_key=/x,disable_token_creation", &merge),
            "AuthAltParameters=disable_token_creation,jwt_key=/etc/slurm/jwt.key"
        );
        // Continued lines are joined; values with spaces are not single values.
        assert_eq!(
            merged_config("AuthInfo=a,\\\nb\nSlurmctldParameters=x y", &merge),
            "AuthInfo=a,b,use_client_ids"
        );
    }

    #[test]
    fn sshd_config_ends_with_the_extra_lines() {
        let text = sshd_config("PermitRootLogin no");
        assert!(text.starts_with("#\n### GENERAL ###\nInclude /etc/ssh/sshd_config.d/*.conf\n"));
        assert!(
            text.ends_with("### EXTRA CONFIG ###\nPermitRootLogin no\n"),
            "{text}"
        );
        assert_eq!(cgroup_conf(), "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n");
    }
}
