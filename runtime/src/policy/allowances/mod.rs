//! What the output policy refuses unless the host allows it: an object reaching past what its
//! parent asks for.
//!
//! A builder is third-party code; its parent (a Controller, a NodeSet) was written by someone the
//! cluster's RBAC allowed to. What the bundled builder would give an object is *granted*: what
//! the parent's own spec asks for (the pod template's `hostNetwork`, volumes, service account,
//! the containers' security contexts; the Controller's `spec.service.spec` type and
//! `loadBalancerIP`), and Slinky's design (slurmd runs privileged, with `BPF`, `NET_ADMIN`,
//! `SYS_ADMIN` and `SYS_NICE`; slurmctld and the sidecars have no privileges; Services are
//! `ClusterIP`; the workers' PodDisruptionBudget covers the Controller's protected workers). A
//! plugin may build anything within the grants; beyond them, each [`Allow`] class is refused,
//! naming the object, the field and the flag, unless the host runs with `--allow <class>`.
//!
//! # Guarantees
//! * With no allowance, no object a plugin builds carries a finalizer, shares a node namespace,
//!   mounts a node path, names a node, runs as a service account or mounts its token, is
//!   privileged, may escalate or adds a capability, is a Service reachable from outside the
//!   cluster, or is a PodDisruptionBudget over other pods, unless its parent's spec (or Slinky's
//!   design, for slurmd) asks for exactly that.
//! * The checks read the output and the parent only: they are pure, and cheap next to a build.
//!
//! Here: the classes and the one-field checks (finalizers, a PodDisruptionBudget's selector);
//! [`pods`]: what a pod spec is granted and its checks; [`services`]: a Service's.

mod pods;
mod secrets;
mod services;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use slinky_api::labels::Labels;

pub(crate) use pods::{PodGrants, pod_spec, slurm_key};
pub(crate) use services::{ServiceGrants, service_spec};

/// A class of output the policy refuses unless the host allows it (`--allow <class>`): each
/// reaches past what the object's parent asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Allow {
    /// `metadata.finalizers` on any object (a StatefulSet's pod template too): it blocks the
    /// object's deletion, and a foreground deletion of its parent, until a controller removes it.
    Finalizers,
    /// `hostNetwork`, `hostPID`, `hostIPC`: the pod shares the node's namespaces.
    HostNamespaces,
    /// `hostPath` volumes: the node's filesystem in the pod.
    HostPath,
    /// `nodeName`: the pod bound to a node past the scheduler.
    NodeName,
    /// `serviceAccountName`, or `automountServiceAccountToken` other than `false`: the pod runs
    /// with that account's (or the namespace's `default` account's) API credentials.
    ServiceAccount,
    /// `privileged`, `allowPrivilegeEscalation`, `capabilities.add` beyond the container's grant.
    Privileges,
    /// A Service `type` other than `ClusterIP`, `externalIPs`, `loadBalancerIP`.
    ServiceExposure,
    /// A PodDisruptionBudget whose selector does not keep to its NodeSet's (or the Controller's
    /// protected workers') pods: it blocks evicting other pods.
    WidePdb,
    /// A pod referencing a Secret its parent's spec does not name (and the output does not
    /// create): a Secret of the namespace nothing asked for.
    Secrets,
}

impl Allow {
    /// Every class, in order.
    pub const ALL: [Allow; 9] = [
        Allow::Finalizers,
        Allow::HostNamespaces,
        Allow::HostPath,
        Allow::NodeName,
        Allow::ServiceAccount,
        Allow::Privileges,
        Allow::ServiceExposure,
        Allow::WidePdb,
        Allow::Secrets,
    ];

    /// The class as `--allow` takes it (`host-path`).
    pub fn as_str(self) -> &'static str {
        match self {
            Allow::Finalizers => "finalizers",
            Allow::HostNamespaces => "host-namespaces",
            Allow::HostPath => "host-path",
            Allow::NodeName => "node-name",
            Allow::ServiceAccount => "service-account",
            Allow::Privileges => "privileges",
            Allow::ServiceExposure => "service-exposure",
            Allow::WidePdb => "wide-pdb",
            Allow::Secrets => "secrets",
        }
    }
}

impl fmt::Display for Allow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The classes a host allows (none by default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowances(BTreeSet<Allow>);

impl Allowances {
    /// Whether `class` is allowed.
    pub fn allows(&self, class: Allow) -> bool {
        self.0.contains(&class)
    }

    /// Whether nothing is allowed (the default).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The allowed classes, in order.
    pub fn iter(&self) -> impl Iterator<Item = Allow> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<Allow> for Allowances {
    fn from_iter<I: IntoIterator<Item = Allow>>(iter: I) -> Self {
        Allowances(iter.into_iter().collect())
    }
}

impl fmt::Display for Allowances {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.iter().map(Allow::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// A refusal: the field and what it has, why, what grants it, and the flag.
pub(super) fn refused(field: &str, has: &str, why: &str, granted: &str, class: Allow) -> String {
    format!("{field} {has}: refused: {why}, and {granted} (a host allows it with --allow {class})")
}

/// `meta.finalizers` (`field` names the metadata: `metadata`, `spec.template.metadata`), unless
/// `allow`ed.
///
/// # Errors
/// When there are finalizers.
pub(crate) fn finalizers(field: &str, meta: &ObjectMeta, allow: &Allowances) -> Result<(), String> {
    match &meta.finalizers {
        Some(list) if !list.is_empty() && !allow.allows(Allow::Finalizers) => Err(refused(
            &format!("{field}.finalizers"),
            &format!("is {list:?}"),
            "a finalizer keeps the object (and a foreground deletion of its parent) from being deleted \
             until a controller removes it (the host removes none)",
            "Slinky's builders set none",
            Allow::Finalizers,
        )),
        _ => Ok(()),
    }
}

/// A PodDisruptionBudget's `matchLabels` (`have`) include `want` (what keeps it to its pods:
/// `whose`), unless `allow`ed.
///
/// # Errors
/// The first label missing or different.
pub(crate) fn pdb_selector(
    have: &BTreeMap<String, String>,
    want: &Labels,
    whose: &str,
    allow: &Allowances,
) -> Result<(), String> {
    if allow.allows(Allow::WidePdb) {
        return Ok(());
    }
    for (k, v) in want {
        if have.get(k) != Some(v) {
            return Err(refused(
                "spec.selector.matchLabels",
                &format!("lacks {k}={v}"),
                "a PodDisruptionBudget over other pods blocks their eviction (node drains, upgrades)",
                &format!("this one must select only {whose} ({want:?})"),
                Allow::WidePdb,
            ));
        }
    }
    Ok(())
}
