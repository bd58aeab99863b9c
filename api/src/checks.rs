//! Spec checks the host makes before it builds anything: a Controller or NodeSet whose names,
//! hostnames or settings would make an object the API server refuses (a pod name past 63
//! characters in a label, a hostname with dots, `maxUnavailable: 0%`) is reported as a
//! [`SpecProblem`] naming the field and the fix, instead of a create refused over and over.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::{
    Controller, NodeSet, keys,
    validation::{dns1035_label, dns1123_label, dns1123_subdomain, label_value},
};

/// What is wrong with a spec: the field (a JSON path from the object's root) and why, with the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The field, e.g. `spec.updateStrategy.rollingUpdate.maxUnavailable`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl SpecProblem {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecProblem {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// All problems as one message (`; `-separated), or `None`.
pub fn summary(problems: &[SpecProblem]) -> Option<String> {
    (!problems.is_empty()).then(|| {
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The prefix of the headless Service name the worker pods use as `spec.subdomain`.
pub const WORKER_SUBDOMAIN_PREFIX: &str = "slurm-workers-";

/// The longest Controller name: `<name>-controller` names the slurmctld StatefulSet, whose pods
/// carry the label `controller-revision-hash=<statefulset>-<hash of up to 10 characters>` (a
/// label value: at most 63 characters), so Kubernetes keeps StatefulSet names to 52 characters;
/// `<name>-controller-internal` (a DNS-1035 label) fits too.
pub const CONTROLLER_NAME_MAX: usize = 52 - "-controller".len();

/// `maxUnavailable` checked: `Ok(None)` when unset (the default 25%), else the value.
///
/// # Errors
/// A message when it is 0, 0%, negative, over 100% or not a number or percentage.
pub fn max_unavailable(value: Option<&IntOrString>) -> Result<Option<MaxUnavailable>, String> {
    match value {
        None => Ok(None),
        Some(IntOrString::Int(n)) if *n >= 1 => Ok(Some(MaxUnavailable::Count(*n))),
        Some(IntOrString::Int(n)) => Err(format!(
            "{n} is not allowed: at least one pod must be replaceable at a time (use 1 or more, or a percentage like 25%)"
        )),
        Some(IntOrString::String(s)) => {
            let digits = s.strip_suffix('%').unwrap_or("");
            match digits.parse::<u32>() {
                Ok(p) if (1..=100).contains(&p) && digits.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(Some(MaxUnavailable::Percent(p)))
                }
                Ok(_) => Err(format!(
                    "{s:?} is not allowed: a percentage must be between 1% and 100%"
                )),
                Err(_) => Err(format!(
                    "{s:?} is neither a number nor a percentage: use e.g. 2 or \"25%\""
                )),
            }
        }
    }
}

/// A valid `maxUnavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// A number of pods (at least 1).
    Count(i32),
    /// A percentage of `replicas`, 1 to 100, rounded up.
    Percent(u32),
}

impl MaxUnavailable {
    /// The number of pods for `replicas`: at least 1, computed without overflow.
    pub fn resolve(value: Option<Self>, replicas: i32) -> i32 {
        let replicas = i64::from(replicas.max(0));
        let n = match value.unwrap_or(MaxUnavailable::Percent(25)) {
            MaxUnavailable::Count(n) => i64::from(n),
            MaxUnavailable::Percent(p) => (replicas * i64::from(p) + 99) / 100,
        };
        n.clamp(1, i64::from(i32::MAX)) as i32
    }
}

impl NodeSet {
    /// The first `extraConf` item that is not `Key=Value` (Slinky's `ParseExtraConf` error): then
    /// none of `extraConf` reaches slurmd, as in Slinky's manager (its webhook refuses the
    /// NodeSet). Not a spec problem: the pods are built, and a condition says what was left out.
    pub fn extra_conf_problem(&self) -> Option<String> {
        let item = self
            .spec
            .extra_conf
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .find(|item| !item.contains('='))?;
        Some(format!(
            "spec.extraConf: malformed --conf item {item:?}, expected Key=Value (space-separated \
             Key=Value items, a value may be a comma-separated list): none of extraConf is passed to \
             slurmd until it is fixed"
        ))
    }

    /// Problems that make the NodeSet's pods ones the API server refuses, or settings this host
    /// does not support. Checks the pod of the highest ordinal `replicas` asks for; pods of higher
    /// ordinals (when strangers hold some names) are checked with [`NodeSet::identity_problems`].
    pub fn spec_problems(&self) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        let name = self.metadata.name.as_deref().unwrap_or_default();
        for e in label_value(name) {
            problems.push(SpecProblem::new(
                "metadata.name",
                format!(
                    "{name:?} is used as the value of the pod label {}, which {e}: use a name of at most 63 characters",
                    keys::LABEL_INSTANCE
                ),
            ));
        }
        let controller = &self.spec.controller_ref.name;
        if controller.is_empty() {
            problems.push(SpecProblem::new(
                "spec.controllerRef.name",
                "is required: name the Controller (Slurm cluster) these workers join",
            ));
        } else {
            let subdomain = format!("{WORKER_SUBDOMAIN_PREFIX}{controller}");
            if let Some(e) = dns1123_label(&subdomain).into_iter().next() {
                problems.push(SpecProblem::new(
                    "spec.controllerRef.name",
                    format!(
                        "the pods' subdomain {subdomain:?} (a DNS label) {e}: the Controller name must be at most {} characters",
                        63 - WORKER_SUBDOMAIN_PREFIX.len()
                    ),
                ));
            }
        }
        if self.replicas() < 0 {
            problems.push(SpecProblem::new(
                "spec.replicas",
                format!("is {}, it must be 0 or more", self.replicas()),
            ));
        }
        if self.spec.min_ready_seconds.is_some_and(|s| s < 0) {
            problems.push(SpecProblem::new("spec.minReadySeconds", "must be 0 or more"));
        }
        if self
            .spec
            .ssh
            .as_ref()
            .is_some_and(|s| s.enabled && s.sssd_conf_ref.as_ref().is_none_or(|r| r.name.is_empty()))
        {
            problems.push(SpecProblem::new(
                "spec.ssh.sssdConfRef",
                "is required when spec.ssh.enabled is true (the Secret holding sssd.conf, which the \
                 pods mount): set it, or turn SSH off",
            ));
        }
        // Worded as kube-apiserver refuses a StatefulSet's.
        if let Some(limit) = self.spec.revision_history_limit.filter(|l| *l < 0) {
            problems.push(SpecProblem::new(
                "spec.revisionHistoryLimit",
                format!("Invalid value: {limit}: must be greater than or equal to 0"),
            ));
        }
        match self.spec.prune_slurm_node_records.as_deref() {
            None | Some("Never") => {}
            // Slinky prunes node records only in DaemonSet mode: elsewhere it would be ignored.
            Some("NodeNotFound") if self.is_daemon() => {}
            Some("NodeNotFound") => problems.push(SpecProblem::new(
                "spec.pruneSlurmNodeRecords",
                "NodeNotFound prunes the records of Slurm nodes whose Kubernetes node is gone, \
                 which only DaemonSet mode has (as in Slinky): set scalingMode: DaemonSet, or \
                 remove it (Never)",
            )),
            Some(other) => problems.push(SpecProblem::new(
                "spec.pruneSlurmNodeRecords",
                format!("is {other:?}: it must be Never (the default) or NodeNotFound"),
            )),
        }
        // DaemonSet-mode pods are named and bound by node: the ordinal fields would be ignored.
        if self.is_daemon() {
            if self.spec.pin_to_node {
                problems.push(SpecProblem::new(
                    "spec.pinToNode",
                    "DaemonSet mode binds each pod to its node already: remove pinToNode (it \
                     pins an ordinal's pod to its last node in StatefulSet mode)",
                ));
            }
            if self.spec.ordinal_padding.is_some_and(|p| p > 0) {
                problems.push(SpecProblem::new(
                    "spec.ordinalPadding",
                    "DaemonSet-mode pods are named <nodeset>-<hostname>, not by ordinal: remove \
                     ordinalPadding",
                ));
            }
        }
        if let Some(strategy) = &self.spec.update_strategy {
            let mu = strategy
                .rolling_update
                .as_ref()
                .and_then(|r| r.max_unavailable.as_ref());
            if let Err(e) = max_unavailable(mu) {
                problems.push(SpecProblem::new(
                    "spec.updateStrategy.rollingUpdate.maxUnavailable",
                    e,
                ));
            }
        }
        problems.extend(self.scheduled_update_problems());
        problems.extend(self.claim_problems());
        if problems.is_empty() && self.replicas() > 0 && !self.is_daemon() {
            problems.extend(self.identity_problems((self.replicas() - 1) as u32));
        }
        problems
    }

    /// Problems with the DaemonSet-mode pod whose hostname (Slurm node name) is `hostname`, on the
    /// Kubernetes node `node`: its name `<nodeset>-<hostname>` (a DNS-1123 subdomain, and the value
    /// of the `pod-name` label), its hostname (a DNS-1123 label), its claims' names.
    pub fn daemon_identity_problems(&self, node: &str, hostname: &str) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        let pod = self.daemon_pod_name(hostname);
        let errors: Vec<String> = dns1123_subdomain(&pod)
            .into_iter()
            .chain(
                label_value(&pod)
                    .into_iter()
                    .map(|e| format!("as the value of the label {} it {e}", keys::LABEL_POD_NAME)),
            )
            .collect();
        if let Some(e) = errors.first() {
            problems.push(SpecProblem::new(
                "metadata.name",
                format!(
                    "the pod name {pod:?} of node {node} is invalid: {e}; shorten the NodeSet name, or \
                     give the node a shorter {} annotation",
                    keys::ANNOTATION_HOSTNAME_OVERRIDE
                ),
            ));
        }
        if let Some(e) = dns1123_label(hostname).into_iter().next() {
            problems.push(SpecProblem::new(
                format!(
                    "metadata.annotations[{}] of node {node}",
                    keys::ANNOTATION_HOSTNAME_OVERRIDE
                ),
                format!("the hostname {hostname:?} {e}: set it to a DNS label"),
            ));
        }
        problems.extend(self.claim_name_problems(&pod));
        problems
    }

    /// Problems with the pod of `ordinal`: its name (a DNS-1123 subdomain, and the value of the
    /// `pod-name` label), its hostname (a DNS-1123 label, and the `pod-hostname` label).
    pub fn identity_problems(&self, ordinal: u32) -> Vec<SpecProblem> {
        let mut problems = Vec::new();
        let pod = self.pod_name(ordinal);
        let name_field = if self.ordinal_padding() > 0 {
            "metadata.name (with spec.ordinalPadding)"
        } else {
            "metadata.name"
        };
        let name_errors: Vec<String> = dns1123_subdomain(&pod)
            .into_iter()
            .chain(
                label_value(&pod)
                    .into_iter()
                    .map(|e| format!("as the value of the label {} it {e}", keys::LABEL_POD_NAME)),
            )
            .collect();
        if let Some(e) = name_errors.first() {
            problems.push(SpecProblem::new(
                name_field,
                format!(
                    "the pod name {pod:?} of ordinal {ordinal} is invalid: {e}; shorten the NodeSet name"
                ),
            ));
        }
        let hostname = self.pod_hostname(ordinal);
        let from_template = self.spec.template.spec.hostname().is_some_and(|h| !h.is_empty());
        if let Some(e) = dns1123_label(&hostname).into_iter().next() {
            let (field, fix) = if from_template {
                (
                    "spec.template.spec.hostname",
                    "use a shorter prefix of lower-case letters, digits and '-'",
                )
            } else {
                (
                    name_field,
                    "the hostname defaults to the pod name: shorten the NodeSet name or set spec.template.spec.hostname",
                )
            };
            // Dots in a NodeSet name are fine for a pod name, not for a hostname.
            if name_errors.is_empty() || from_template {
                problems.push(SpecProblem::new(
                    field,
                    format!("the pod hostname {hostname:?} of ordinal {ordinal} {e}: {fix}"),
                ));
            }
        }
        problems.extend(self.claim_name_problems(&pod));
        problems
    }
}

impl Controller {
    /// Problems with the Controller's name: it names the Services `<name>-controller` and
    /// `<name>-controller-internal` (DNS-1035 labels) and the StatefulSet `<name>-controller`
    /// (at most 52 characters), and is the value of the `app.kubernetes.io/instance` label.
    pub fn name_problems(&self) -> Vec<SpecProblem> {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let fix = format!(
            "use a Controller name that starts with a letter and has at most {CONTROLLER_NAME_MAX} characters"
        );
        let service = self.controller_key();
        let internal = self.internal_service_name();
        let mut errors: Vec<String> = dns1035_label(&service)
            .into_iter()
            .map(|e| format!("the Service name {service:?} {e}: {fix}"))
            .collect();
        if errors.is_empty() && !self.spec.external {
            errors.extend(
                dns1035_label(&internal)
                    .into_iter()
                    .map(|e| format!("the internal Service name {internal:?} {e}: {fix}")),
            );
            if errors.is_empty() && name.len() > CONTROLLER_NAME_MAX {
                errors.push(format!(
                    "the StatefulSet name {service:?} has more than 52 characters (its pods' \
                     controller-revision-hash label would pass 63): {fix}"
                ));
            }
        }
        errors
            .into_iter()
            .map(|e| SpecProblem::new("metadata.name", e))
            .take(1)
            .collect()
    }

    /// Problems that stop the Controller's children from being built: its name, the keys and
    /// `externalConfig` Slinky's CRD requires, and high availability without a shared state
    /// (Slinky's CRD rule: HA needs `persistence.existingClaim`, a ReadWriteMany claim).
    pub fn spec_problems(&self) -> Vec<SpecProblem> {
        let mut problems = self.name_problems();
        let s = &self.spec;
        if s.external {
            if s.external_config.is_none() {
                problems.push(SpecProblem::new(
                    "spec.externalConfig",
                    "is required when spec.external is true (the external slurmctld's host and port)",
                ));
            }
            return problems;
        }
        if s.slurm_key_ref.is_none() {
            problems.push(SpecProblem::new(
                "spec.slurmKeyRef",
                "is required (the Secret holding the Slurm key)",
            ));
        }
        if s.jwt_key_ref.is_none() {
            problems.push(SpecProblem::new(
                "spec.jwtKeyRef",
                "is required (the Secret holding the JWT key)",
            ));
        }
        if self.ha_enabled() {
            let claim = s
                .persistence
                .as_ref()
                .and_then(|p| p.existing_claim.as_deref())
                .unwrap_or_default();
            if !self.persistence_enabled() || claim.is_empty() {
                problems.push(SpecProblem::new(
                    "spec.ha.enabled",
                    "high availability needs the state shared by every slurmctld: enable \
                     spec.persistence and set spec.persistence.existingClaim to a ReadWriteMany \
                     PersistentVolumeClaim (or turn HA off)",
                ));
            }
            if s.ha.as_ref().and_then(|h| h.backups).is_some_and(|b| b < 1) {
                problems.push(SpecProblem::new("spec.ha.backups", "must be at least 1"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests;
