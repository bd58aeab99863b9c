//! What a kubelet reads of a Slinky pod: which daemon it runs, its hostname, the main
//! container's arguments, environment and preStop hook, the init containers to run before it,
//! the volume mounts of all its containers, and the files of its ConfigMap, Secret and projected
//! volumes.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, Container, EnvVar, KeyToPath, Pod, PodSecurityContext, Secret,
    SecretProjection, Volume,
};
use kube::Api;
use slinky_api::{keys, labels};

use crate::error::{Error, Result};

/// The daemon a pod runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// A Controller's slurmctld pod (`app.kubernetes.io/name=slurmctld`).
    Slurmctld,
    /// A NodeSet's worker pod (`app.kubernetes.io/name=slurmd`).
    Slurmd,
    /// The slurmdbd pod of the Accounting the Controller's `spec.accountingRef` names
    /// (`app.kubernetes.io/name=slurmdbd`).
    Slurmdbd,
}

impl Role {
    /// `slurmctld` or `slurmd`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Slurmctld => "slurmctld",
            Role::Slurmd => "slurmd",
            Role::Slurmdbd => "slurmdbd",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The role of `pod` in the cluster of `controller`, if it is one of its Slurm pods: a slurmctld
/// pod labelled `app.kubernetes.io/instance=<controller>`, a worker pod labelled
/// `slinky.slurm.net/cluster=<controller>`, or the slurmdbd pod of its Accounting `accounting`
/// (`app.kubernetes.io/name=slurmdbd`, `app.kubernetes.io/instance=<accounting>`).
pub(crate) fn role_of(pod: &Pod, controller: &str, accounting: Option<&str>) -> Option<Role> {
    let l = pod.metadata.labels.as_ref()?;
    let is = |k: &str, v: &str| l.get(k).is_some_and(|x| x == v);
    if is(keys::LABEL_NAME, labels::CONTROLLER.name) && is(keys::LABEL_INSTANCE, controller) {
        Some(Role::Slurmctld)
    } else if is(keys::LABEL_NAME, labels::WORKER.name) && is(keys::LABEL_CLUSTER, controller) {
        Some(Role::Slurmd)
    } else if let Some(acct) = accounting
        && is(keys::LABEL_NAME, labels::ACCOUNTING.name)
        && is(keys::LABEL_INSTANCE, acct)
    {
        Some(Role::Slurmdbd)
    } else {
        None
    }
}

/// A volume mounted into one of the pod's containers, as the harness mounts it (into the pod's
/// one sandbox).
#[derive(Debug, Clone)]
pub(crate) struct Mount {
    /// Where (absolute).
    pub path: String,
    /// The volume's name.
    pub volume: String,
    /// What it is.
    pub kind: MountKind,
}

/// The kinds of volume the harness mounts.
#[derive(Debug, Clone)]
pub(crate) enum MountKind {
    /// ConfigMap, Secret or projected: a tmpfs filled with these files.
    Files(Vec<FileSource>),
    /// An emptyDir: a fresh directory of the pod (kept for its logs).
    EmptyDir,
    /// A PersistentVolumeClaim: a directory per claim, kept for the harness's lifetime.
    Claim(String),
    /// Anything else (hostPath, CSI …): not mounted.
    Unsupported(&'static str),
}

/// A ConfigMap or Secret whose keys become files.
#[derive(Debug, Clone)]
pub(crate) struct FileSource {
    /// A Secret (else a ConfigMap).
    pub secret: bool,
    /// Its name.
    pub name: String,
    /// The keys to project, with their paths and modes; `None`: every key, named after it.
    pub items: Option<Vec<KeyToPath>>,
    /// A missing object or key is no error.
    pub optional: bool,
    /// The mode of files without their own (the volume's `defaultMode`, else 0644).
    pub default_mode: u32,
}

/// A file of a volume, ready to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    /// Relative to the mount point.
    pub path: String,
    /// The content.
    pub data: Vec<u8>,
    /// The mode.
    pub mode: u32,
}

/// The parts of a pod the harness acts on.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The pod's name.
    pub name: String,
    /// The daemon.
    pub role: Role,
    /// `spec.hostname`, else the pod's name: the sandbox's hostname and the Slurm node name.
    pub hostname: String,
    /// `spec.subdomain` (the headless Service giving `hostname.subdomain.namespace`).
    pub subdomain: Option<String>,
    /// The main container (`slurmctld` or `slurmd`, else the default container, else the first).
    pub container: Container,
    /// The init containers to run to completion, in order, before the main container starts
    /// (sidecars, `restartPolicy: Always`, are not among them).
    pub init_containers: Vec<InitContainer>,
    /// The mounts of all the pod's containers (the main container's first, then the init
    /// containers' in order; a path mounted twice keeps its first volume), parents before
    /// children.
    pub mounts: Vec<Mount>,
    /// The main container runs as a non-root user (Slinky's slurmctld runs as uid 401,
    /// `slurm` in its images): run it as the local `slurm` user.
    pub run_as_slurm: bool,
    /// The pod has an `fsGroup`: its volumes are group-owned by the local `slurm` group.
    pub fs_group: bool,
    /// `terminationGracePeriodSeconds` (default 30).
    pub grace: Duration,
    /// slurmd's `--conf-server` (host, port), if given.
    pub conf_server: Option<(String, u16)>,
}

impl Plan {
    /// Read `pod` as the daemon `role`.
    pub fn new(pod: &Pod, role: Role) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let name = pod.metadata.name.clone()?;
        let container = main_container(pod, role)?.clone();
        let inits = spec.init_containers.iter().flatten();
        let mounts = mounts(
            &name,
            std::iter::once(&container).chain(inits.clone()),
            spec.volumes.iter().flatten(),
        );
        let pod_sc = spec.security_context.as_ref();
        let init_containers = inits
            .filter(|c| c.restart_policy.as_deref() != Some("Always"))
            .map(|c| InitContainer {
                run_as_slurm: runs_as_non_root(c, pod_sc),
                container: c.clone(),
            })
            .collect();
        let conf_server = container
            .args
            .iter()
            .flatten()
            .zip(container.args.iter().flatten().skip(1).map(Some).chain([None]))
            .find_map(|(a, next)| match a.strip_prefix("--conf-server") {
                Some("") => next.cloned(),
                Some(v) => v.strip_prefix('=').map(str::to_string),
                None => None,
            })
            .map(|v| match v.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().unwrap_or(6817)),
                None => (v, 6817),
            });
        Some(Plan {
            role,
            hostname: spec
                .hostname
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| name.clone()),
            subdomain: spec.subdomain.clone().filter(|s| !s.is_empty()),
            name,
            run_as_slurm: runs_as_non_root(&container, pod_sc),
            container,
            init_containers,
            mounts,
            fs_group: pod_sc.and_then(|s| s.fs_group).is_some_and(|g| g != 0),
            grace: Duration::from_secs(
                spec.termination_grace_period_seconds
                    .unwrap_or(30)
                    .clamp(0, 3600)
                    .unsigned_abs(),
            ),
            conf_server,
        })
    }

    /// The main container's preStop exec command, if any.
    pub fn pre_stop(&self) -> Option<Vec<String>> {
        let cmd = self
            .container
            .lifecycle
            .as_ref()?
            .pre_stop
            .as_ref()?
            .exec
            .as_ref()?
            .command
            .clone()?;
        (!cmd.is_empty()).then_some(cmd)
    }

    /// The main container's arguments.
    pub fn args(&self) -> Vec<String> {
        self.container.args.clone().unwrap_or_default()
    }
}

/// An init container of the pod, run to completion before the main container.
#[derive(Debug, Clone)]
pub(crate) struct InitContainer {
    /// The container.
    pub container: Container,
    /// It runs as a non-root user (its own `runAsUser`, else the pod's): run it as the local
    /// `slurm` user, as the main container.
    pub run_as_slurm: bool,
}

impl InitContainer {
    /// What it runs: its `command` and then its `args`, as a kubelet runs them; `None` without a
    /// `command` (the image's entrypoint, which the harness does not know).
    pub fn command(&self) -> Option<(String, Vec<String>)> {
        let command = self.container.command.as_ref()?;
        let (program, rest) = command.split_first()?;
        let mut args = rest.to_vec();
        args.extend(self.container.args.iter().flatten().cloned());
        Some((program.clone(), args))
    }
}

/// Whether `c` runs as a non-root user: its `runAsUser`, else the pod's.
fn runs_as_non_root(c: &Container, pod_sc: Option<&PodSecurityContext>) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user))
        .is_some_and(|u| u != 0)
}

/// The mounts of `containers` into the pod's one sandbox, parents before children: each path
/// once (the first container's volume; another volume at the same path is not mounted, as the
/// harness has one mount namespace per pod), paths leaving the root dropped.
fn mounts<'a>(
    pod: &str,
    containers: impl Iterator<Item = &'a Container>,
    volumes: impl Iterator<Item = &'a Volume>,
) -> Vec<Mount> {
    let volumes: BTreeMap<&str, &Volume> = volumes.map(|v| (v.name.as_str(), v)).collect();
    let mut out: Vec<Mount> = Vec::new();
    for c in containers {
        for m in c.volume_mounts.iter().flatten() {
            let Some(volume) = volumes.get(m.name.as_str()) else {
                continue;
            };
            let path = m.mount_path.trim_end_matches('/').to_string();
            if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
                continue;
            }
            match out.iter().find(|o| o.path == path) {
                Some(o) if o.volume != m.name => tracing::warn!(%pod, %path, mounted = %o.volume,
                    container = %c.name, volume = %m.name,
                    "two containers mount different volumes at one path: the harness's pod has one mount namespace, the first is mounted"),
                Some(_) => {}
                None => out.push(Mount {
                    path,
                    volume: m.name.clone(),
                    kind: mount_kind(volume),
                }),
            }
        }
    }
    out.sort_by_key(|m| m.path.matches('/').count());
    out
}

fn main_container(pod: &Pod, role: Role) -> Option<&Container> {
    let containers = &pod.spec.as_ref()?.containers;
    let default = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubectl.kubernetes.io/default-container"));
    containers
        .iter()
        .find(|c| c.name == role.as_str())
        .or_else(|| default.and_then(|d| containers.iter().find(|c| c.name == *d)))
        .or_else(|| containers.first())
}

/// The Kubernetes default file mode of ConfigMap and Secret volumes.
const DEFAULT_MODE: u32 = 0o644;

fn mode(m: Option<i32>, default: u32) -> u32 {
    m.and_then(|m| u32::try_from(m).ok())
        .map_or(default, |m| m & 0o777)
}

fn mount_kind(v: &Volume) -> MountKind {
    if let Some(p) = &v.projected {
        let default_mode = mode(p.default_mode, DEFAULT_MODE);
        let sources = p
            .sources
            .iter()
            .flatten()
            .filter_map(|s| {
                if let Some(ConfigMapProjection { name, items, optional }) = &s.config_map {
                    Some(FileSource {
                        secret: false,
                        name: name.clone(),
                        items: items.clone(),
                        optional: optional.unwrap_or(false),
                        default_mode,
                    })
                } else if let Some(SecretProjection { name, items, optional }) = &s.secret {
                    Some(FileSource {
                        secret: true,
                        name: name.clone(),
                        items: items.clone(),
                        optional: optional.unwrap_or(false),
                        default_mode,
                    })
                } else {
                    tracing::debug!(volume = %v.name, "a projected source other than ConfigMap or Secret is not mounted");
                    None
                }
            })
            .collect();
        MountKind::Files(sources)
    } else if let Some(c) = &v.config_map {
        MountKind::Files(vec![FileSource {
            secret: false,
            name: c.name.clone(),
            items: c.items.clone(),
            optional: c.optional.unwrap_or(false),
            default_mode: mode(c.default_mode, DEFAULT_MODE),
        }])
    } else if let Some(s) = &v.secret {
        MountKind::Files(vec![FileSource {
            secret: true,
            name: s.secret_name.clone().unwrap_or_default(),
            items: s.items.clone(),
            optional: s.optional.unwrap_or(false),
            default_mode: mode(s.default_mode, DEFAULT_MODE),
        }])
    } else if v.empty_dir.is_some() {
        MountKind::EmptyDir
    } else if let Some(c) = &v.persistent_volume_claim {
        MountKind::Claim(c.claim_name.clone())
    } else if v.host_path.is_some() {
        MountKind::Unsupported("hostPath")
    } else {
        MountKind::Unsupported("this volume type")
    }
}

/// Whether `path` (a projected item's path) stays inside its volume.
fn safe_relative(path: &str) -> bool {
    !path.is_empty() && !path.starts_with('/') && path.split('/').all(|c| !c.is_empty() && c != "..")
}

/// The keys of a ConfigMap or Secret, as bytes.
async fn object_data(
    client: &kube::Client,
    namespace: &str,
    src: &FileSource,
) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    let kind = if src.secret { "Secret" } else { "ConfigMap" };
    let what = || format!("cannot read the {kind} {namespace}/{} a pod mounts", src.name);
    if src.secret {
        let got = Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(&src.name)
            .await
            .map_err(|source| Error::Kube { what: what(), source })?;
        Ok(got.map(|s| {
            let mut data: BTreeMap<String, Vec<u8>> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                data.insert(k, v.into_bytes());
            }
            data
        }))
    } else {
        let got = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(&src.name)
            .await
            .map_err(|source| Error::Kube { what: what(), source })?;
        Ok(got.map(|c| {
            let mut data: BTreeMap<String, Vec<u8>> = c
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            for (k, v) in c.binary_data.unwrap_or_default() {
                data.insert(k, v.0);
            }
            data
        }))
    }
}

/// The files of `sources`, as a kubelet projects them (later sources win a path).
///
/// # Errors
/// A ConfigMap or Secret (or an item's key) that is missing and not optional, or API errors.
pub(crate) async fn files(
    client: &kube::Client,
    namespace: &str,
    sources: &[FileSource],
) -> Result<Vec<File>> {
    let mut out: BTreeMap<String, File> = BTreeMap::new();
    for src in sources {
        let kind = if src.secret { "Secret" } else { "ConfigMap" };
        let Some(data) = object_data(client, namespace, src).await? else {
            if src.optional {
                continue;
            }
            return Err(Error::NotReady(format!(
                "the {kind} {namespace}/{} a pod mounts does not exist (yet)",
                src.name
            )));
        };
        let items: Vec<(String, String, u32)> = match &src.items {
            Some(items) => items
                .iter()
                .map(|i| (i.key.clone(), i.path.clone(), mode(i.mode, src.default_mode)))
                .collect(),
            None => data
                .keys()
                .map(|k| (k.clone(), k.clone(), src.default_mode))
                .collect(),
        };
        for (key, path, mode) in items {
            if !safe_relative(&path) {
                tracing::warn!(%path, "a volume item's path leaves its volume: not written");
                continue;
            }
            match data.get(&key) {
                Some(d) => {
                    out.insert(
                        path.clone(),
                        File {
                            path,
                            data: d.clone(),
                            mode,
                        },
                    );
                }
                None if src.optional => {}
                None => {
                    return Err(Error::NotReady(format!(
                        "the {kind} {namespace}/{} has no key {key} a pod mounts",
                        src.name
                    )));
                }
            }
        }
    }
    Ok(out.into_values().collect())
}

/// A container's environment: values, and `fieldRef`, `configMapKeyRef` and
/// `secretKeyRef` resolved as a kubelet does (`status.podIP` is the sandbox's address).
///
/// # Errors
/// A referenced ConfigMap or Secret key that is missing and not optional, or API errors.
pub(crate) async fn env(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Vec<(String, String)>> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = Vec::new();
    for EnvVar {
        name,
        value,
        value_from,
    } in container.env.iter().flatten()
    {
        let value = match (value, value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field(pod, &f.field_path, pod_ip, host_ip)
                } else if let Some(r) = &from.config_map_key_ref {
                    let src = FileSource {
                        secret: false,
                        name: r.name.clone(),
                        items: None,
                        optional: r.optional.unwrap_or(false),
                        default_mode: DEFAULT_MODE,
                    };
                    key_value(client, &namespace, &src, &r.key).await?
                } else if let Some(r) = &from.secret_key_ref {
                    let src = FileSource {
                        secret: true,
                        name: r.name.clone(),
                        items: None,
                        optional: r.optional.unwrap_or(false),
                        default_mode: DEFAULT_MODE,
                    };
                    key_value(client, &namespace, &src, &r.key).await?
                } else {
                    tracing::debug!(env = %name, "resourceFieldRef is not resolved: empty");
                    String::new()
                }
            }
            (None, None) => String::new(),
        };
        out.push((name.clone(), value));
    }
    Ok(out)
}

async fn key_value(client: &kube::Client, namespace: &str, src: &FileSource, key: &str) -> Result<String> {
    let data = object_data(client, namespace, src).await?;
    match data.and_then(|d| d.get(key).cloned()) {
        Some(v) => Ok(String::from_utf8_lossy(&v).into_owned()),
        None if src.optional => Ok(String::new()),
        None => Err(Error::NotReady(format!(
            "the key {key} of {namespace}/{} a pod's environment references does not exist (yet)",
            src.name
        ))),
    }
}

/// A `fieldRef` of the pod (an unknown or missing field is empty, as a kubelet gives a missing
/// annotation).
fn field(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> String {
    let m = &pod.metadata;
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| -> Option<String> {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    if let Some(v) =
        keyed("metadata.annotations", &m.annotations).or_else(|| keyed("metadata.labels", &m.labels))
    {
        return v;
    }
    let spec = pod.spec.as_ref();
    match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => pod_ip.to_string(),
        "status.hostIP" => host_ip.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests;
