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

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use k8s_openapi::{
    api::core::v1::{HostPathVolumeSource, PodSpec, SecurityContext, ServiceSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use slinky_api::{ContainerWrapper, Controller, NodeSet, PodSpecWrapper, labels::Labels};

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
}

impl Allow {
    /// Every class, in order.
    pub const ALL: [Allow; 8] = [
        Allow::Finalizers,
        Allow::HostNamespaces,
        Allow::HostPath,
        Allow::NodeName,
        Allow::ServiceAccount,
        Allow::Privileges,
        Allow::ServiceExposure,
        Allow::WidePdb,
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
fn refused(field: &str, has: &str, why: &str, granted: &str, class: Allow) -> String {
    format!("{field} {has}: refused: {why}, and {granted} (a host allows it with --allow {class})")
}

/// Slinky's slurmd container: privileged, with the capabilities it needs for cgroups and
/// networking (`slinky_guest_sdk::slinky::build_nodeset_pod`; a test keeps the two equal).
const SLURMD: &str = "slurmd";
/// slurmd's capabilities in Slinky.
pub(crate) const SLURMD_CAPABILITIES: [&str; 4] = ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE"];

/// What one container is granted.
#[derive(Debug, Default, Clone)]
struct ContainerGrant {
    privileged: bool,
    escalation: bool,
    capabilities: BTreeSet<String>,
}

impl ContainerGrant {
    fn add(&mut self, sc: Option<&SecurityContext>) {
        let Some(sc) = sc else { return };
        self.privileged |= sc.privileged == Some(true);
        self.escalation |= sc.allow_privilege_escalation == Some(true);
        let added = sc.capabilities.iter().flat_map(|c| c.add.iter().flatten());
        self.capabilities.extend(added.map(|c| capability(c)));
    }
}

/// A capability as the kernel names it: upper case, without `CAP_` (Kubernetes takes both).
fn capability(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    match upper.strip_prefix("CAP_") {
        Some(rest) => rest.to_string(),
        None => upper,
    }
}

/// What the bundled builder gives the pods of a parent: what the parent's spec asks for, and
/// Slinky's design.
#[derive(Debug, Default)]
pub(crate) struct PodGrants {
    /// The parent's kind, for messages (`NodeSet`, `Controller`).
    whose: &'static str,
    host_network: bool,
    host_pid: bool,
    host_ipc: bool,
    service_account: Option<String>,
    /// The template sets `automountServiceAccountToken: true` (the bundled builders set `false`
    /// and merge the template over it).
    automount_token: bool,
    node_name: Option<String>,
    host_paths: BTreeMap<String, HostPathVolumeSource>,
    containers: BTreeMap<String, ContainerGrant>,
}

impl PodGrants {
    /// A NodeSet's pods: its template, `spec.slurmd` and `spec.logfile`, slurmd privileged with
    /// Slinky's capabilities; never a `nodeName` (the bundled builder clears it: the scheduler
    /// places workers).
    pub(crate) fn of_nodeset(nodeset: &NodeSet) -> Self {
        let spec = &nodeset.spec;
        let mut grants = Self::of_template("NodeSet", &spec.template.spec);
        grants.node_name = None;
        let slurmd = grants.containers.entry(SLURMD.into()).or_default();
        slurmd.privileged = true;
        slurmd.capabilities.extend(SLURMD_CAPABILITIES.map(String::from));
        grants.container(&spec.slurmd, SLURMD);
        grants.container(&spec.logfile, "logfile");
        grants
    }

    /// A Controller's slurmctld pods: its template, `spec.slurmctld`, `spec.reconfigure` and
    /// `spec.logfile`; Slinky grants them no privileges.
    pub(crate) fn of_controller(controller: &Controller) -> Self {
        let spec = &controller.spec;
        let mut grants = Self::of_template("Controller", &spec.template.spec);
        grants.container(&spec.slurmctld, "slurmctld");
        grants.container(&spec.reconfigure, "reconfigure");
        grants.container(&spec.logfile, "logfile");
        grants
    }

    fn of_template(whose: &'static str, template: &PodSpecWrapper) -> Self {
        // A template that does not parse fails the bundled builder: it grants nothing.
        let t = template.to_pod_spec().unwrap_or_default();
        let mut grants = PodGrants {
            whose,
            host_network: t.host_network == Some(true),
            host_pid: t.host_pid == Some(true),
            host_ipc: t.host_ipc == Some(true),
            service_account: t.service_account_name.or(t.service_account),
            automount_token: t.automount_service_account_token == Some(true),
            node_name: t.node_name,
            host_paths: t
                .volumes
                .into_iter()
                .flatten()
                .filter_map(|v| v.host_path.map(|h| (v.name, h)))
                .collect(),
            containers: BTreeMap::new(),
        };
        for c in t.containers.iter().chain(t.init_containers.iter().flatten()) {
            grants
                .containers
                .entry(c.name.clone())
                .or_default()
                .add(c.security_context.as_ref());
        }
        grants
    }

    /// What the parent's container field (`spec.slurmd` …) asks for, for its container.
    fn container(&mut self, wrapper: &ContainerWrapper, name: &str) {
        if let Ok(c) = wrapper.to_container(name) {
            self.containers
                .entry(c.name.clone())
                .or_default()
                .add(c.security_context.as_ref());
        }
    }

    /// "the NodeSet's spec.template.spec does not ask for it"
    fn not_asked(&self) -> String {
        format!("the {}'s spec.template.spec does not ask for it", self.whose)
    }
}

/// A pod spec (a pod's, a StatefulSet's template's) within `grants`, unless `allow`ed. Fields are
/// named from the pod spec (`spec.hostNetwork`).
///
/// # Errors
/// The first field past its grant.
pub(crate) fn pod_spec(spec: &PodSpec, grants: &PodGrants, allow: &Allowances) -> Result<(), String> {
    let not_asked = grants.not_asked();
    if !allow.allows(Allow::HostNamespaces) {
        for (field, set, granted, why) in [
            (
                "spec.hostNetwork",
                spec.host_network,
                grants.host_network,
                "the pod would share the node's network namespace (its interfaces, and whatever listens on the node's loopback)",
            ),
            (
                "spec.hostPID",
                spec.host_pid,
                grants.host_pid,
                "the pod would see, and could signal, every process of the node",
            ),
            (
                "spec.hostIPC",
                spec.host_ipc,
                grants.host_ipc,
                "the pod would share the node's IPC namespace (its shared memory)",
            ),
        ] {
            if set == Some(true) && !granted {
                return Err(refused(field, "is true", why, &not_asked, Allow::HostNamespaces));
            }
        }
    }
    if !allow.allows(Allow::ServiceAccount) {
        for (field, value) in [
            ("spec.serviceAccountName", &spec.service_account_name),
            ("spec.serviceAccount", &spec.service_account),
        ] {
            if let Some(name) = value.as_deref().filter(|n| !n.is_empty())
                && grants.service_account.as_deref() != Some(name)
            {
                return Err(refused(
                    field,
                    &format!("is {name:?}"),
                    "the pod would run with that account's API credentials, and whatever RBAC grants it",
                    &not_asked,
                    Allow::ServiceAccount,
                ));
            }
        }
        if spec.automount_service_account_token != Some(false) && !grants.automount_token {
            let has = match spec.automount_service_account_token {
                Some(_) => "is true",
                None => "is not set (Kubernetes mounts the token then)",
            };
            return Err(refused(
                "spec.automountServiceAccountToken",
                has,
                "the pod would get its service account's API token (the namespace's `default` \
                 account's, without serviceAccountName) mounted; set it to false as Slinky's builders do",
                &not_asked,
                Allow::ServiceAccount,
            ));
        }
    }
    if !allow.allows(Allow::NodeName)
        && let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && grants.node_name.as_deref() != Some(node)
    {
        let granted = if grants.whose == "NodeSet" {
            "Slinky's builder never binds a NodeSet's pod to a node".to_string()
        } else {
            not_asked.clone()
        };
        return Err(refused(
            "spec.nodeName",
            &format!("is {node:?}"),
            "the pod would be bound to that node past the scheduler (its taints, resources and affinities)",
            &granted,
            Allow::NodeName,
        ));
    }
    if !allow.allows(Allow::HostPath) {
        for v in spec.volumes.iter().flatten() {
            if let Some(path) = &v.host_path
                && grants.host_paths.get(&v.name) != Some(path)
            {
                return Err(refused(
                    &format!("spec.volumes[name={}].hostPath", v.name),
                    &format!("is {:?}", path.path),
                    "it mounts the node's filesystem into the pod",
                    &format!("the {}'s spec.template.spec has no such volume", grants.whose),
                    Allow::HostPath,
                ));
            }
        }
    }
    if !allow.allows(Allow::Privileges) {
        privileges(spec, grants)?;
    }
    Ok(())
}

/// Every container's `privileged`, `allowPrivilegeEscalation` and `capabilities.add` within its
/// grant.
fn privileges(spec: &PodSpec, grants: &PodGrants) -> Result<(), String> {
    let containers = spec
        .containers
        .iter()
        .map(|c| ("containers", &c.name, &c.security_context))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| ("initContainers", &c.name, &c.security_context)),
        )
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| ("ephemeralContainers", &c.name, &c.security_context)),
        );
    let none = ContainerGrant::default();
    for (list, name, sc) in containers {
        let Some(sc) = sc else { continue };
        let grant = grants.containers.get(name).unwrap_or(&none);
        let field = format!("spec.{list}[name={name}].securityContext");
        let granted = || {
            let design = if grants.whose == "NodeSet" {
                "Slinky makes only slurmd privileged"
            } else {
                "Slinky grants slurmctld and its sidecars no privileges"
            };
            format!(
                "{design}, and the {}'s spec does not ask for it for this container",
                grants.whose
            )
        };
        if sc.privileged == Some(true) && !grant.privileged {
            return Err(refused(
                &format!("{field}.privileged"),
                "is true",
                "a privileged container has every capability and the node's devices",
                &granted(),
                Allow::Privileges,
            ));
        }
        if sc.allow_privilege_escalation == Some(true) && !grant.escalation && !grant.privileged {
            return Err(refused(
                &format!("{field}.allowPrivilegeEscalation"),
                "is true",
                "a process could gain more privileges than its parent (setuid binaries, file capabilities)",
                &granted(),
                Allow::Privileges,
            ));
        }
        let added = sc.capabilities.iter().flat_map(|c| c.add.iter().flatten());
        for cap in added {
            if !grant.capabilities.contains(&capability(cap)) {
                let has: Vec<&String> = grant.capabilities.iter().collect();
                return Err(refused(
                    &format!("{field}.capabilities.add"),
                    &format!("has {cap:?}"),
                    "a capability widens what the container may do on the node",
                    &format!(
                        "this container is granted only {has:?} (by Slinky's design and the {}'s spec)",
                        grants.whose
                    ),
                    Allow::Privileges,
                ));
            }
        }
    }
    Ok(())
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

/// What the bundled builder makes a Service: `ClusterIP` (headless or not), and for the
/// Controller's Service what its `spec.service.spec` asks for.
#[derive(Debug, Default)]
pub(crate) struct ServiceGrants {
    type_: Option<String>,
    load_balancer_ip: Option<String>,
}

impl ServiceGrants {
    /// The Controller's Service (`<controller>-controller`): the type and `loadBalancerIP` of
    /// `spec.service.spec` (the bundled builder drops its `externalIPs`).
    pub(crate) fn of_controller_service(controller: &Controller) -> Self {
        let asked = controller.spec.service.spec.to_service_spec().unwrap_or_default();
        ServiceGrants {
            type_: asked.type_,
            load_balancer_ip: asked.load_balancer_ip,
        }
    }

    fn granted(&self) -> String {
        match &self.type_ {
            Some(t) => format!(
                "Slinky's builder makes this Service ClusterIP or, as the Controller's spec.service.spec asks, {t}"
            ),
            None => "Slinky's builders make ClusterIP Services".into(),
        }
    }
}

/// A Service's spec within `grants`, unless `allow`ed.
///
/// # Errors
/// The first field past its grant.
pub(crate) fn service_spec(
    spec: Option<&ServiceSpec>,
    grants: &ServiceGrants,
    allow: &Allowances,
) -> Result<(), String> {
    let Some(spec) = spec else { return Ok(()) };
    if allow.allows(Allow::ServiceExposure) {
        return Ok(());
    }
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ != "ClusterIP" && grants.type_.as_deref() != Some(type_) {
        return Err(refused(
            "spec.type",
            &format!("is {type_}"),
            &match type_ {
                "ExternalName" => "an ExternalName Service points its name at another host".to_string(),
                _ => format!("a {type_} Service is reachable from outside the cluster"),
            },
            &grants.granted(),
            Allow::ServiceExposure,
        ));
    }
    if let Some(ips) = spec.external_ips.as_ref().filter(|ips| !ips.is_empty()) {
        return Err(refused(
            "spec.externalIPs",
            &format!("is {ips:?}"),
            "the nodes would route traffic for these addresses to the Service's pods, away from \
             whoever owns them",
            "Slinky's builders set none",
            Allow::ServiceExposure,
        ));
    }
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty())
        && grants.load_balancer_ip.as_deref() != Some(ip)
    {
        return Err(refused(
            "spec.loadBalancerIP",
            &format!("is {ip:?}"),
            "it claims an address of the load balancer",
            "the Controller's spec.service.spec does not ask for it",
            Allow::ServiceExposure,
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A pod spec; `automountServiceAccountToken: false` (as Slinky's builders set it) unless `v`
    /// sets it (`null` leaves it out).
    fn spec(mut v: serde_json::Value) -> PodSpec {
        if let Some(o) = v.as_object_mut() {
            o.entry("automountServiceAccountToken").or_insert(json!(false));
        }
        serde_json::from_value(v).unwrap_or_default()
    }

    fn nodeset(mut spec: serde_json::Value) -> NodeSet {
        spec["controllerRef"] = json!({"name": "slurm"});
        serde_json::from_value(json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": "w", "namespace": "slurm"},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("the test NodeSet: {e}"))
    }

    fn controller(spec: serde_json::Value) -> Controller {
        serde_json::from_value(json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
            "metadata": {"name": "slurm", "namespace": "slurm"},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("the test Controller: {e}"))
    }

    fn only(class: Allow) -> Allowances {
        [class].into_iter().collect()
    }

    /// `check` refuses by default, naming `field` and the flag, and passes with the class allowed.
    fn refused_unless_allowed(check: impl Fn(&Allowances) -> Result<(), String>, field: &str, class: Allow) {
        let e = check(&Allowances::default()).err().unwrap_or_default();
        assert!(e.contains(field), "{field}: {e}");
        assert!(e.contains(&format!("--allow {class}")), "{class}: {e}");
        assert_eq!(check(&only(class)), Ok(()), "{class}");
        let others: Allowances = Allow::ALL.into_iter().filter(|a| *a != class).collect();
        assert!(check(&others).is_err(), "{class}: another class allowed it");
    }

    fn slurmd_pod(extra: serde_json::Value) -> PodSpec {
        let mut pod = json!({"containers": [{"name": "slurmd", "image": "slurmd",
            "securityContext": {"privileged": true,
                "capabilities": {"add": ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE"]}}}],
            "initContainers": [{"name": "logfile", "image": "alpine", "restartPolicy": "Always"}]});
        if let (Some(p), Some(e)) = (pod.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        spec(pod)
    }

    #[test]
    fn a_pod_within_slinkys_design_passes() {
        let grants = PodGrants::of_nodeset(&nodeset(json!({})));
        assert_eq!(
            pod_spec(&slurmd_pod(json!({})), &grants, &Allowances::default()),
            Ok(())
        );
        // `CAP_` prefixes and case do not matter.
        let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x",
            "securityContext": {"capabilities": {"add": ["cap_sys_admin"]}}}]}));
        assert_eq!(pod_spec(&pod, &grants, &Allowances::default()), Ok(()));
    }

    #[test]
    fn host_namespaces_are_refused_unless_the_parent_asks() {
        let grants = PodGrants::of_nodeset(&nodeset(json!({})));
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            let pod = slurmd_pod(json!({field: true}));
            refused_unless_allowed(
                |a| pod_spec(&pod, &grants, a),
                &format!("spec.{field} is true"),
                Allow::HostNamespaces,
            );
            let asked = PodGrants::of_nodeset(&nodeset(json!({"template": {"spec": {field: true}}})));
            assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()), "{field}");
        }
    }

    #[test]
    fn host_paths_are_refused_unless_the_parent_has_that_volume() {
        let pod = slurmd_pod(json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}));
        let grants = PodGrants::of_nodeset(&nodeset(json!({})));
        refused_unless_allowed(
            |a| pod_spec(&pod, &grants, a),
            "spec.volumes[name=root].hostPath is \"/\"",
            Allow::HostPath,
        );
        let asked = |path: &str| {
            PodGrants::of_nodeset(&nodeset(json!({"template": {"spec": {"volumes": [
                {"name": "root", "hostPath": {"path": path}}]}}})))
        };
        assert_eq!(pod_spec(&pod, &asked("/"), &Allowances::default()), Ok(()));
        // The same volume name pointing elsewhere is not what the NodeSet asked for.
        assert!(pod_spec(&pod, &asked("/scratch"), &Allowances::default()).is_err());
    }

    #[test]
    fn node_names_are_refused_for_nodeset_pods_and_kept_to_the_controllers_template() {
        let pod = slurmd_pod(json!({"nodeName": "node-0"}));
        // A NodeSet's template cannot grant it: the bundled builder clears it.
        let grants = PodGrants::of_nodeset(&nodeset(json!({"template": {"spec": {"nodeName": "node-0"}}})));
        refused_unless_allowed(
            |a| pod_spec(&pod, &grants, a),
            "spec.nodeName is \"node-0\"",
            Allow::NodeName,
        );
        let asked =
            PodGrants::of_controller(&controller(json!({"template": {"spec": {"nodeName": "node-0"}}})));
        let sts = spec(json!({"containers": [{"name": "slurmctld", "image": "x"}], "nodeName": "node-0"}));
        assert_eq!(pod_spec(&sts, &asked, &Allowances::default()), Ok(()));
    }

    #[test]
    fn service_accounts_are_refused_unless_the_parent_names_the_same() {
        let grants = PodGrants::of_controller(&controller(json!({})));
        for field in ["serviceAccountName", "serviceAccount"] {
            let pod = spec(json!({"containers": [{"name": "slurmctld", "image": "x"}], field: "admin"}));
            refused_unless_allowed(
                |a| pod_spec(&pod, &grants, a),
                &format!("spec.{field} is \"admin\""),
                Allow::ServiceAccount,
            );
            let asked = PodGrants::of_controller(&controller(
                json!({"template": {"spec": {"serviceAccountName": "admin"}}}),
            ));
            assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
            let other = PodGrants::of_controller(&controller(
                json!({"template": {"spec": {"serviceAccountName": "slurm"}}}),
            ));
            assert!(pod_spec(&pod, &other, &Allowances::default()).is_err());
        }
    }

    #[test]
    fn service_account_tokens_are_refused_unless_the_parent_asks() {
        let workers = PodGrants::of_nodeset(&nodeset(json!({})));
        let slurmctld = PodGrants::of_controller(&controller(json!({})));
        for (token, has) in [(json!(null), "is not set"), (json!(true), "is true")] {
            for grants in [&workers, &slurmctld] {
                let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
                    "automountServiceAccountToken": token}));
                refused_unless_allowed(
                    |a| pod_spec(&pod, grants, a),
                    &format!("spec.automountServiceAccountToken {has}"),
                    Allow::ServiceAccount,
                );
            }
            // The template asks for the token: the bundled builder mounts it.
            let template = json!({"template": {"spec": {"automountServiceAccountToken": true}}});
            let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
                "automountServiceAccountToken": token}));
            for asked in [
                PodGrants::of_nodeset(&nodeset(template.clone())),
                PodGrants::of_controller(&controller(template.clone())),
            ] {
                assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
            }
        }
        // `false` in the template (or nothing) grants nothing more than `false`.
        let pod = spec(json!({"containers": [{"name": "slurmd", "image": "x"}]}));
        assert_eq!(pod_spec(&pod, &workers, &Allowances::default()), Ok(()));
        let asked_false = PodGrants::of_nodeset(&nodeset(
            json!({"template": {"spec": {"automountServiceAccountToken": false}}}),
        ));
        let mounted = spec(json!({"containers": [{"name": "slurmd", "image": "x"}],
            "automountServiceAccountToken": true}));
        assert!(pod_spec(&mounted, &asked_false, &Allowances::default()).is_err());
    }

    #[test]
    fn privileges_beyond_a_containers_grant_are_refused() {
        let workers = PodGrants::of_nodeset(&nodeset(json!({})));
        let slurmctld = PodGrants::of_controller(&controller(json!({})));
        let sc = |name: &str, list: &str, sc: serde_json::Value| {
            let mut pod = json!({"containers": [{"name": "main", "image": "x"}]});
            pod[list] = json!([{"name": name, "image": "x", "securityContext": sc}]);
            spec(pod)
        };
        for (grants, pod, field) in [
            // slurmctld and the sidecars are not privileged.
            (
                &slurmctld,
                sc("slurmctld", "containers", json!({"privileged": true})),
                "spec.containers[name=slurmctld].securityContext.privileged is true",
            ),
            (
                &workers,
                sc("logfile", "initContainers", json!({"privileged": true})),
                "spec.initContainers[name=logfile].securityContext.privileged is true",
            ),
            (
                &workers,
                sc("escape", "containers", json!({"allowPrivilegeEscalation": true})),
                "spec.containers[name=escape].securityContext.allowPrivilegeEscalation is true",
            ),
            // slurmd: Slinky's capabilities, no others.
            (
                &workers,
                sc(
                    "slurmd",
                    "containers",
                    json!({"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE"]}}),
                ),
                "spec.containers[name=slurmd].securityContext.capabilities.add has \"SYS_PTRACE\"",
            ),
            (
                &workers,
                sc(
                    "debug",
                    "ephemeralContainers",
                    json!({"capabilities": {"add": ["ALL"]}}),
                ),
                "spec.ephemeralContainers[name=debug].securityContext.capabilities.add has \"ALL\"",
            ),
        ] {
            refused_unless_allowed(|a| pod_spec(&pod, grants, a), field, Allow::Privileges);
        }
        // What the parent's spec asks for, its container gets.
        let asked = PodGrants::of_nodeset(&nodeset(json!({
            "slurmd": {"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}},
            "logfile": {"securityContext": {"allowPrivilegeEscalation": true}},
            "template": {"spec": {"containers": [{"name": "debug",
                "securityContext": {"privileged": true}}]}},
        })));
        for pod in [
            sc(
                "slurmd",
                "containers",
                json!({"capabilities": {"add": ["SYS_PTRACE", "BPF"]}}),
            ),
            sc(
                "logfile",
                "initContainers",
                json!({"allowPrivilegeEscalation": true}),
            ),
            sc(
                "debug",
                "containers",
                json!({"privileged": true, "allowPrivilegeEscalation": true}),
            ),
        ] {
            assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
        }
        let asked = PodGrants::of_controller(&controller(
            json!({"slurmctld": {"securityContext": {"privileged": true}}}),
        ));
        let pod = sc("slurmctld", "containers", json!({"privileged": true}));
        assert_eq!(pod_spec(&pod, &asked, &Allowances::default()), Ok(()));
    }

    #[test]
    fn finalizers_are_refused() {
        let meta = ObjectMeta {
            finalizers: Some(vec!["example.com/keep".into()]),
            ..Default::default()
        };
        refused_unless_allowed(
            |a| finalizers("metadata", &meta, a),
            "metadata.finalizers is [\"example.com/keep\"]",
            Allow::Finalizers,
        );
        assert_eq!(
            finalizers("metadata", &ObjectMeta::default(), &Allowances::default()),
            Ok(())
        );
    }

    #[test]
    fn services_are_cluster_ip_unless_the_controller_asks_for_more() {
        let svc = |v: serde_json::Value| -> ServiceSpec { serde_json::from_value(v).unwrap_or_default() };
        let cluster_ip = ServiceGrants::default();
        let none = Allowances::default();
        assert_eq!(
            service_spec(Some(&svc(json!({"clusterIP": "None"}))), &cluster_ip, &none),
            Ok(())
        );
        assert_eq!(
            service_spec(Some(&svc(json!({"type": "ClusterIP"}))), &cluster_ip, &none),
            Ok(())
        );
        for (s, field) in [
            (svc(json!({"type": "LoadBalancer"})), "spec.type is LoadBalancer"),
            (svc(json!({"type": "NodePort"})), "spec.type is NodePort"),
            (
                svc(json!({"type": "ExternalName", "externalName": "x.example.com"})),
                "spec.type is ExternalName",
            ),
            (
                svc(json!({"externalIPs": ["203.0.113.7"]})),
                "spec.externalIPs is [\"203.0.113.7\"]",
            ),
            (
                svc(json!({"loadBalancerIP": "203.0.113.7"})),
                "spec.loadBalancerIP is \"203.0.113.7\"",
            ),
        ] {
            refused_unless_allowed(
                |a| service_spec(Some(&s), &cluster_ip, a),
                field,
                Allow::ServiceExposure,
            );
        }
        // The Controller's Service: what `spec.service.spec` asks for, but not external IPs
        // (the bundled builder drops them).
        let asked = ServiceGrants::of_controller_service(&controller(json!({"service": {"spec": {
            "type": "LoadBalancer", "loadBalancerIP": "203.0.113.7", "externalIPs": ["203.0.113.8"]}}})));
        let lb = svc(json!({"type": "LoadBalancer", "loadBalancerIP": "203.0.113.7"}));
        assert_eq!(service_spec(Some(&lb), &asked, &none), Ok(()));
        assert!(service_spec(Some(&svc(json!({"type": "NodePort"}))), &asked, &none).is_err());
        assert!(
            service_spec(
                Some(&svc(json!({"loadBalancerIP": "203.0.113.9"}))),
                &asked,
                &none
            )
            .is_err()
        );
        assert!(service_spec(Some(&svc(json!({"externalIPs": ["203.0.113.8"]}))), &asked, &none).is_err());
    }

    #[test]
    fn a_pdb_selects_only_its_pods() {
        let want = Labels::from([
            ("app.kubernetes.io/name".to_string(), "slurmd".to_string()),
            ("app.kubernetes.io/instance".to_string(), "w".to_string()),
        ]);
        let mut have = want.clone();
        have.insert("extra".into(), "narrower".into());
        assert_eq!(
            pdb_selector(&have, &want, "NodeSet w's pods", &Allowances::default()),
            Ok(())
        );
        let wide = BTreeMap::from([("app.kubernetes.io/name".to_string(), "slurmd".to_string())]);
        refused_unless_allowed(
            |a| pdb_selector(&wide, &want, "NodeSet w's pods", a),
            "spec.selector.matchLabels lacks app.kubernetes.io/instance=w",
            Allow::WidePdb,
        );
    }

    #[test]
    fn classes_print_as_the_flag_takes_them() {
        let all: Allowances = Allow::ALL.into_iter().collect();
        assert_eq!(
            all.to_string(),
            "finalizers,host-namespaces,host-path,node-name,service-account,privileges,service-exposure,wide-pdb"
        );
        assert_eq!(Allowances::default().to_string(), "none");
    }

    /// The bundled builder's own pods pass with no allowance, whatever their NodeSet asks for:
    /// the grants follow `slinky_guest_sdk::slinky::build_nodeset_pod` (slurmd's capabilities
    /// included).
    #[test]
    fn slinkys_own_pods_and_statefulset_are_within_their_grants() -> Result<(), String> {
        use slinky_api::contract::{
            BuildContext, PodIdentity, example_controller, example_inputs, example_nodeset,
        };
        use slinky_guest_sdk::slinky;
        let ctx = BuildContext::default();
        let asks = json!({"volumes": [{"name": "scratch", "hostPath": {"path": "/scratch"}}],
            "hostNetwork": true, "serviceAccountName": "slurm", "automountServiceAccountToken": true,
            "containers": [{"name": "sidecar", "image": "x", "securityContext": {"privileged": true}}]});
        let mut nodeset = example_nodeset().map_err(|e| format!("{e:?}"))?;
        let mut controller = example_controller().map_err(|e| format!("{e:?}"))?;
        for asked in [json!({}), asks] {
            nodeset.spec.template.spec = PodSpecWrapper(asked.clone());
            controller.spec.template.spec = PodSpecWrapper(asked);
            let identity = PodIdentity::for_ordinal(&nodeset, 0, "r");
            let pod = slinky::build_nodeset_pod(&ctx, &nodeset, &controller, &identity)
                .map_err(|e| format!("{e:?}"))?;
            let pod = pod.spec.ok_or("the pod has no spec")?;
            pod_spec(&pod, &PodGrants::of_nodeset(&nodeset), &Allowances::default())?;

            let inputs = example_inputs(std::slice::from_ref(&nodeset));
            let children = slinky::build_controller_children(&ctx, &controller, &inputs)
                .map_err(|e| format!("{e:?}"))?;
            let sts = children
                .iter()
                .find_map(|c| c.as_stateful_set())
                .ok_or("no StatefulSet")?;
            let template = sts.spec.template.spec.as_ref().ok_or("no pod template")?;
            pod_spec(
                template,
                &PodGrants::of_controller(&controller),
                &Allowances::default(),
            )?;
        }
        Ok(())
    }
}
