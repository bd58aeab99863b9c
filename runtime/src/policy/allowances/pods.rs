//! What a parent's pods are granted ([`PodGrants`]: what its spec asks for, and Slinky's design)
//! and the checks of a pod spec against it: node namespaces, service account and token, node
//! name, host paths, and each container's privileges.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, PodSpec, SecurityContext, ServiceAccountTokenProjection, Volume,
};
use slinky_api::{Accounting, ContainerWrapper, Controller, LoginSet, NodeSet, PodSpecWrapper, RestApi};

use super::{Allow, Allowances, refused, secrets};

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
    /// The template's projected volumes that carry a service account token, by name, with their
    /// token sources.
    token_volumes: BTreeMap<String, Vec<ServiceAccountTokenProjection>>,
    host_paths: BTreeMap<String, HostPathVolumeSource>,
    containers: BTreeMap<String, ContainerGrant>,
    /// The Secrets the pods may reference ([`secrets`]).
    secrets: BTreeSet<String>,
}

impl PodGrants {
    /// A NodeSet's pods: its template, `spec.slurmd` and `spec.logfile`, slurmd privileged with
    /// Slinky's capabilities; never a `nodeName` (the bundled builder clears it: the scheduler
    /// places workers).
    pub(crate) fn of_nodeset(nodeset: &NodeSet) -> Self {
        let spec = &nodeset.spec;
        let mut grants = Self::of_template("NodeSet", &spec.template.spec);
        grants.node_name = None;
        let sssd = spec.ssh.iter().flat_map(|s| s.sssd_conf_ref.iter());
        grants.secrets.extend(sssd.map(|r| r.name.clone()));
        let slurmd = grants.containers.entry(SLURMD.into()).or_default();
        slurmd.privileged = true;
        slurmd.capabilities.extend(SLURMD_CAPABILITIES.map(String::from));
        grants.container(&spec.slurmd, SLURMD);
        grants.container(&spec.logfile, "logfile");
        grants
    }

    /// A NodeSet's pods as its Controller's workers: [`PodGrants::of_nodeset`] and the
    /// Controller's `slurm.key` (Slinky's workers mount it; not the JWT key).
    pub(crate) fn of_worker(nodeset: &NodeSet, controller: &Controller) -> Self {
        Self::of_nodeset(nodeset).with_secrets(slurm_key(controller))
    }

    /// A Controller's slurmctld pods: its template, `spec.slurmctld`, `spec.reconfigure` and
    /// `spec.logfile`; Slinky grants them no privileges.
    pub(crate) fn of_controller(controller: &Controller) -> Self {
        let spec = &controller.spec;
        let mut grants = Self::of_template("Controller", &spec.template.spec)
            .with_secrets(controller.key_secret_refs().map(|r| r.name.clone()));
        grants.container(&spec.slurmctld, "slurmctld");
        grants.container(&spec.reconfigure, "reconfigure");
        grants.container(&spec.logfile, "logfile");
        grants
    }

    /// A RestApi's slurmrestd pods: its template and `spec.slurmrestd`; Slinky grants them no
    /// privileges (they run as `nobody`).
    pub(crate) fn of_restapi(restapi: &RestApi) -> Self {
        let mut grants = Self::of_template("RestApi", &restapi.spec.template.spec);
        grants.container(&restapi.spec.slurmrestd, "slurmrestd");
        grants
    }

    /// A LoginSet's login pods: its template, `spec.login` and `spec.initconf`; Slinky grants
    /// them no privileges of its own (the login container's security context is the user's).
    pub(crate) fn of_loginset(loginset: &LoginSet) -> Self {
        let mut grants = Self::of_template("LoginSet", &loginset.spec.template.spec).with_secrets([loginset
            .spec
            .sssd_conf_ref
            .name
            .clone()]);
        grants.container(&loginset.spec.login, "login");
        grants.container(&loginset.spec.initconf, "initconf");
        grants
    }

    /// An Accounting's slurmdbd pods: its template and `spec.slurmdbd`; Slinky grants them no
    /// privileges (they run as `slurm`).
    pub(crate) fn of_accounting(accounting: &Accounting) -> Self {
        let spec = &accounting.spec;
        let keys = [&spec.slurm_key_ref, &spec.jwt_key_ref].into_iter().flatten();
        let mut grants = Self::of_template("Accounting", &spec.template.spec).with_secrets(
            keys.chain([&spec.storage_config.password_key_ref])
                .map(|r| r.name.clone()),
        );
        grants.container(&spec.slurmdbd, "slurmdbd");
        grants
    }

    fn of_template(whose: &'static str, template: &PodSpecWrapper) -> Self {
        // A template that does not parse fails the bundled builder: it grants nothing.
        let t = template.to_pod_spec().unwrap_or_default();
        let secrets = secrets::in_pod(&t).into_iter().map(|(_, name)| name).collect();
        let mut grants = PodGrants {
            whose,
            host_network: t.host_network == Some(true),
            host_pid: t.host_pid == Some(true),
            host_ipc: t.host_ipc == Some(true),
            service_account: t.service_account_name.or(t.service_account),
            automount_token: t.automount_service_account_token == Some(true),
            node_name: t.node_name,
            token_volumes: t
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| {
                    let tokens = token_sources(v);
                    (!tokens.is_empty()).then(|| (v.name.clone(), tokens))
                })
                .collect(),
            host_paths: t
                .volumes
                .into_iter()
                .flatten()
                .filter_map(|v| v.host_path.map(|h| (v.name, h)))
                .collect(),
            containers: BTreeMap::new(),
            secrets,
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

    /// The pods may reference these Secrets too (the Controller's keys, Secrets the same output
    /// creates).
    #[must_use]
    pub(crate) fn with_secrets(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.secrets.extend(names);
        self
    }

    /// What the parent's container field (`spec.slurmd` …) asks for, for its container.
    fn container(&mut self, wrapper: &ContainerWrapper, name: &str) {
        if let Ok(c) = wrapper.to_container(name) {
            self.secrets
                .extend(secrets::in_container(&c, name).into_iter().map(|(_, n)| n));
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

/// The Secret of a Controller's `slurm.key`, which the pods of its NodeSets, LoginSets and
/// RestApis mount (Slinky's design).
pub(crate) fn slurm_key(controller: &Controller) -> Option<String> {
    controller.spec.slurm_key_ref.as_ref().map(|r| r.name.clone())
}

/// The service account token sources of a projected volume.
fn token_sources(v: &Volume) -> Vec<ServiceAccountTokenProjection> {
    v.projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.clone())
        .collect()
}

/// A pod spec (a pod's, a StatefulSet's template's) within `grants`, unless `allow`ed. Fields are
/// named from the pod spec (`spec.hostNetwork`).
///
/// # Errors
/// The first field past its grant.
pub(crate) fn pod_spec(spec: &PodSpec, grants: &PodGrants, allow: &Allowances) -> Result<(), String> {
    secrets::check(spec, &grants.secrets, grants.whose, allow)?;
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
        // A token projected into a volume reaches the pod whatever automountServiceAccountToken
        // says: only the template's own (the same volume, the same sources) passes.
        for v in spec.volumes.iter().flatten() {
            let tokens = token_sources(v);
            if !tokens.is_empty() && grants.token_volumes.get(&v.name) != Some(&tokens) {
                return Err(refused(
                    &format!(
                        "spec.volumes[name={}].projected.sources[].serviceAccountToken",
                        v.name
                    ),
                    "is set",
                    "the pod would get an API token of its service account mounted, which \
                     automountServiceAccountToken: false does not stop",
                    &format!("the {}'s spec.template.spec has no such volume", grants.whose),
                    Allow::ServiceAccount,
                ));
            }
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
