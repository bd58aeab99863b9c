//! Slinky's own builders, as library functions: the bundled plugins export exactly these, and a
//! custom plugin usually starts from them and changes what its site needs.
//!
//! They reproduce slurm-operator v1beta1's `BuildControllerService` and its StatefulSet-mode
//! NodeSet pod. Differences, each deliberate:
//! * An unparsable `extraConf` item is skipped (the other items are kept); Slinky drops the whole
//!   `extraConf` when one item is malformed.
//! * The Service selector carries `controller.slinky.slurm.net/active=true` only with HA enabled
//!   (Slinky HEAD always adds it; v1.2 never did): without HA there is one slurmctld pod to select.
//! * `pinToNode` node affinity is not built: it needs cluster state (the recorded node and whether
//!   it still exists) that a sandboxed builder cannot see.
//!
//! The Controller's other children are in [`controller`] (the slurmctld StatefulSet, the
//! `slurm.conf` ConfigMap, the internal Service; the configuration files in [`conf`]), the
//! NodeSet's other children in [`workers`].

pub mod conf;
pub mod controller;
pub mod workers;

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Affinity, Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, KeyToPath,
        Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, PodAffinityTerm, PodAntiAffinity,
        PodDNSConfig, PodSpec, ProjectedVolumeSource, ResourceRequirements, SecretProjection,
        SecurityContext, Service, ServiceSpec, Toleration, Volume, VolumeMount, VolumeProjection,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use slinky_api::{Controller, NodeSet, keys};

pub use controller::build_controller_children;
pub use workers::build_nodeset_children;

use crate::{
    BuildContext, BuildError, PodIdentity,
    helpers::{self, CONTROLLER, Labels, merge_maps, non_empty},
    merge,
};

/// slurmctld's port.
pub const SLURMCTLD_PORT: i32 = 6817;
/// slurmd's port.
pub const SLURMD_PORT: i32 = 6818;
/// sshd's port in worker pods.
pub const SSH_PORT: i32 = 22;
/// Where Slurm logs go inside pods.
pub const LOG_DIR: &str = "/var/log/slurm";
/// The logfile sidecar's script: tail the daemon's log file into the sidecar's stdout.
pub const LOGFILE_SCRIPT: &str = "set -eu\nmkdir -p \"$(dirname \"$SOCKET\")\"\n\
    [ -e \"$SOCKET\" ] || touch \"$SOCKET\"\nexec tail -F \"$SOCKET\"\n";

/// The annotation `kubectl apply` keeps the last applied object in: never copied to children.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A parent's annotations to copy onto its children (all but kubectl's bookkeeping).
pub fn inherited_annotations(meta: &ObjectMeta) -> Labels {
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    annotations.remove(LAST_APPLIED);
    annotations
}

fn name_of(meta: &ObjectMeta, what: &str) -> Result<String, BuildError> {
    meta.name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| BuildError::invalid(format!("the {what} has no metadata.name")))
}

/// The Controller's Service name: `<controller>-controller`.
pub fn controller_service_name(controller: &str) -> String {
    format!("{controller}-controller")
}

/// The address slurmd fetches its configuration from: `<controller>-controller.<ns>:6817`, or the
/// external controller's `host:port`.
pub fn conf_server(controller: &Controller) -> Result<String, BuildError> {
    if controller.spec.external {
        let ext = controller.spec.external_config.as_ref().ok_or_else(|| {
            BuildError::invalid(
                "spec.external is true but spec.externalConfig is missing: set its host and port",
            )
        })?;
        return Ok(format!("{}:{}", ext.host, ext.port));
    }
    Ok(format!(
        "{}.{}:{SLURMCTLD_PORT}",
        controller_service_name(&name_of(&controller.metadata, "Controller")?),
        controller.metadata.namespace.as_deref().unwrap_or_default()
    ))
}

/// Slinky's `BuildControllerService`: the Service in front of slurmctld.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Controller, an invalid `spec.service`, or a user
/// port that clashes with the `slurmctld` port by name or number.
pub fn build_controller_service(_ctx: &BuildContext, controller: &Controller) -> Result<Service, BuildError> {
    if controller.spec.external {
        return Err(BuildError::Unsupported(
            "spec.external is true: an external slurmctld has no Service".into(),
        ));
    }
    let name = name_of(&controller.metadata, "Controller")?;
    let svc = &controller.spec.service;
    let user_spec = svc
        .spec
        .to_service_spec()
        .map_err(|e| BuildError::invalid(format!("spec.service.spec: {e}")))?;

    let mut selector = CONTROLLER.selector_labels(&name);
    if controller.spec.ha.as_ref().is_some_and(|ha| ha.enabled) {
        selector.insert(keys::LABEL_CONTROLLER_ACTIVE.into(), "true".into());
    }
    let mut port = helpers::service_port("slurmctld", svc.port.unwrap_or(SLURMCTLD_PORT), "slurmctld");
    port.node_port = svc.node_port;

    let mut ports = user_spec.ports.clone().unwrap_or_default();
    if let Some(clash) = ports
        .iter()
        .find(|p| p.port == port.port || (p.name.is_some() && p.name == port.name))
    {
        return Err(BuildError::invalid(format!(
            "spec.service.spec.ports: port {} ({}) clashes with the slurmctld port {} (name slurmctld); \
             remove it or change spec.service.port",
            clash.port,
            clash.name.as_deref().unwrap_or("unnamed"),
            port.port
        )));
    }
    ports.push(port);

    let spec = ServiceSpec {
        selector: Some(merge_maps([
            &user_spec.selector.clone().unwrap_or_default(),
            &selector,
        ])),
        ports: Some(ports),
        external_ips: None,
        ..user_spec
    };
    let meta = &controller.metadata;
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(controller_service_name(&name)),
            namespace: meta.namespace.clone(),
            labels: non_empty(merge_maps([
                &meta.labels.clone().unwrap_or_default(),
                &svc.metadata.labels,
                &CONTROLLER.labels(&name),
            ])),
            annotations: non_empty(merge_maps([
                &inherited_annotations(meta),
                &svc.metadata.annotations,
            ])),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Parse `extraConf` (`Key=Value` items separated by white space). Items that are not
/// `Key=Value` with a non-empty alphanumeric key are skipped.
pub fn parse_extra_conf(extra: &str) -> BTreeMap<String, String> {
    extra
        .split_whitespace()
        .filter_map(|item| item.split_once('='))
        .filter(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// slurmd's `--conf` value: sorted `Key=Value` items, always with `Features=<nodeset>[,extra]` and
/// `nodeset` the NodeSet's Slurm name ([`NodeSet::slurm_name`], the feature slurm.conf's
/// `NodeSet=` line selects on), and
/// `Topology='"$SLINKY_TOPOLOGY"'`, wrapped in single quotes for the image's shell entrypoint.
pub fn slurmd_conf(nodeset: &str, extra_conf: Option<&str>) -> String {
    let mut conf = parse_extra_conf(extra_conf.unwrap_or_default());
    let features = match conf.get("Features").filter(|f| !f.is_empty()) {
        Some(extra) => format!("{nodeset},{extra}"),
        None => nodeset.to_string(),
    };
    conf.insert("Features".into(), features);
    conf.insert("Topology".into(), "'\"$SLINKY_TOPOLOGY\"'".into());
    let items: Vec<String> = conf.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("'{}'", items.join(" "))
}

/// `POD_CPUS` and `POD_MEMORY` (MiB) from the container's limits, else the pod-level limits.
fn resource_env(container: &Container, pod: &PodSpec) -> Vec<EnvVar> {
    let limit = |res: Option<&ResourceRequirements>, key: &str| {
        res.and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(key))
            .and_then(helpers::quantity_value)
    };
    let get =
        |key: &str| limit(container.resources.as_ref(), key).or_else(|| limit(pod.resources.as_ref(), key));
    let mut env = Vec::new();
    if let Some(cpus) = get("cpu") {
        env.push(plain_env("POD_CPUS", format!("{}", cpus.ceil() as i64)));
    }
    if let Some(bytes) = get("memory") {
        env.push(plain_env(
            "POD_MEMORY",
            format!("{}", (bytes / 1048576.0).floor() as i64),
        ));
    }
    env
}

fn plain_env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// The logfile sidecar (a native sidecar: an init container with `restartPolicy: Always`), or
/// `None` when the user's `logfile` container sets no image.
///
/// Slinky always adds the sidecar and the API server then refuses every pod without
/// `logfile.image` (`initContainers[0].image: Required value`). Here the sidecar is left out
/// instead: the daemon keeps logging to its file on the `slurm-logfile` volume, and
/// `kubectl logs` shows only the main container. Set `spec.logfile.image` (Slinky's chart uses
/// `alpine`) to stream the log file.
///
/// # Errors
/// [`BuildError::InvalidInput`] when the user's container is not a valid container.
pub fn logfile_sidecar(
    user: &slinky_api::ContainerWrapper,
    log_file: &str,
) -> Result<Option<Container>, BuildError> {
    let base = Container {
        name: "logfile".into(),
        command: Some(vec!["sh".into(), "-c".into(), LOGFILE_SCRIPT.into()]),
        env: Some(vec![plain_env("SOCKET", log_file.into())]),
        restart_policy: Some("Always".into()),
        volume_mounts: Some(vec![mount("slurm-logfile", LOG_DIR, false)]),
        ..Default::default()
    };
    let sidecar = merge::merge_container(&base, &user.0)?;
    Ok(sidecar
        .image
        .as_deref()
        .is_some_and(|i| !i.is_empty())
        .then_some(sidecar))
}

/// Every container and init container has an image (the API server refuses one without).
///
/// # Errors
/// [`BuildError::InvalidInput`] naming the container and the field that sets it.
pub fn require_images(spec: &PodSpec, field_of: impl Fn(&str) -> String) -> Result<(), BuildError> {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    match containers
        .into_iter()
        .find(|c| c.image.as_deref().is_none_or(str::is_empty))
    {
        Some(c) => Err(BuildError::invalid(format!(
            "{} is required: container {:?} has no image, and the API server refuses a pod without one",
            field_of(&c.name),
            c.name
        ))),
        None => Ok(()),
    }
}

/// Slinky's StatefulSet-mode NodeSet pod, for `identity`.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed NodeSet, a Controller without `spec.slurmKeyRef`,
/// or a `slurmd`/`logfile`/`template.spec` that is not a valid container/pod spec.
pub fn build_nodeset_pod(
    ctx: &BuildContext,
    nodeset: &NodeSet,
    controller: &Controller,
    identity: &PodIdentity,
) -> Result<Pod, BuildError> {
    let ns_name = name_of(&nodeset.metadata, "NodeSet")?;
    let namespace = nodeset.metadata.namespace.clone().unwrap_or_default();
    let spec = &nodeset.spec;
    let cluster = &spec.controller_ref.name;
    let slurm_key = controller.spec.slurm_key_ref.as_ref().ok_or_else(|| {
        BuildError::invalid(format!(
            "Controller {}/{} has no spec.slurmKeyRef: set it to the Secret holding the Slurm key",
            controller.metadata.namespace.as_deref().unwrap_or_default(),
            controller.metadata.name.as_deref().unwrap_or_default()
        ))
    })?;
    let ssh = spec.ssh.as_ref().filter(|s| s.enabled);
    let subdomain = format!("slurm-workers-{cluster}");
    let log_file = format!("{LOG_DIR}/slurmd.log");

    // Metadata: NodeSet → template → worker labels (→ hash annotations → default container).
    let labels = merge_maps([
        &nodeset.metadata.labels.clone().unwrap_or_default(),
        &spec.template.metadata.labels,
        &helpers::worker_labels(&ns_name, cluster),
    ]);
    let sshd_conf = ssh.and_then(|s| s.extra_sshd_config.clone()).unwrap_or_default();
    let sssd_ref = ssh
        .and_then(|s| s.sssd_conf_ref.as_ref())
        .map(|r| format!("{}/{}", r.name, r.key))
        .unwrap_or_default();
    let annotations = merge_maps([
        &inherited_annotations(&nodeset.metadata),
        &spec.template.metadata.annotations,
        &Labels::from([
            (
                keys::ANNOTATION_SSHD_CONF_HASH.into(),
                helpers::sha256_hex(sshd_conf.as_bytes()),
            ),
            (
                keys::ANNOTATION_SSSD_CONF_HASH.into(),
                helpers::sha256_hex(sssd_ref.as_bytes()),
            ),
            (keys::ANNOTATION_DEFAULT_CONTAINER.into(), "slurmd".into()),
        ]),
    ]);

    // The slurmd container.
    let user_args = spec.slurmd.0.get("args").cloned();
    let args = vec![
        "-Z".to_string(),
        "--conf-server".into(),
        conf_server(controller)?,
        "--conf".into(),
        // The NodeSet's Slurm name, as in slurm.conf's `NodeSet=<n> Feature=<n>` (Slinky's
        // `GetSlurmNodeSetName`): with a template hostname prefix it is not the object's name.
        slurmd_conf(&nodeset.slurm_name(), spec.extra_conf.as_deref()),
    ];
    let mut ports = vec![helpers::container_port("slurmd", SLURMD_PORT)];
    let mut mounts = vec![
        mount("slurm-etc", "/etc/slurm", true),
        mount("slurm-logfile", LOG_DIR, false),
    ];
    if ssh.is_some() {
        ports.push(helpers::container_port("ssh", SSH_PORT));
        mounts.push(mount("ssh-config", "/etc/ssh/sshd_config.d", true));
        mounts.push(mount("sssd-conf", "/etc/sssd", true));
    }
    let base = Container {
        name: "slurmd".into(),
        args: Some(args),
        env: Some(vec![EnvVar {
            name: "SLINKY_TOPOLOGY".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.annotations['{}']", keys::ANNOTATION_TOPOLOGY),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(ports),
        startup_probe: Some(helpers::http_probe("/livez", "slurmd", Some(6), Some(10))),
        liveness_probe: Some(helpers::http_probe("/livez", "slurmd", Some(6), Some(10))),
        readiness_probe: Some(helpers::http_probe("/readyz", "slurmd", None, None)),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            capabilities: Some(Capabilities {
                add: Some(
                    ["BPF", "NET_ADMIN", "SYS_ADMIN", "SYS_NICE"]
                        .map(String::from)
                        .to_vec(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "/usr/bin/sh".into(),
                        "-c".into(),
                        format!(
                            "scontrol update nodename={} state=down reason=\"slurm-operator: Pod is terminating\"",
                            identity.hostname
                        ),
                    ]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut slurmd_user = spec.slurmd.0.clone();
    if let Some(obj) = slurmd_user.as_object_mut() {
        obj.remove("args");
    }
    let mut slurmd = merge::merge_container(&base, &slurmd_user)
        .map_err(|e| BuildError::invalid(format!("spec.slurmd: {e}")))?;
    if let Some(extra) = user_args {
        let extra: Vec<String> = serde_json::from_value(extra)
            .map_err(|e| BuildError::invalid(format!("spec.slurmd.args must be a list of strings: {e}")))?;
        slurmd.args.get_or_insert_default().extend(extra);
    }

    // Volumes.
    let mut volumes = vec![
        Volume {
            name: "slurm-etc".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o600),
                sources: Some(vec![VolumeProjection {
                    secret: Some(SecretProjection {
                        name: slurm_key.name.clone(),
                        items: Some(vec![KeyToPath {
                            key: slurm_key.key.clone(),
                            path: "slurm.key".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "slurm-logfile".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    if let Some(ssh) = ssh {
        volumes.push(Volume {
            name: "ssh-config".into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: format!("{ns_name}-ssh-config"),
                ..Default::default()
            }),
            ..Default::default()
        });
        if let Some(sssd) = &ssh.sssd_conf_ref {
            volumes.push(Volume {
                name: "sssd-conf".into(),
                secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                    secret_name: Some(sssd.name.clone()),
                    default_mode: Some(0o600),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }

    let base_spec = PodSpec {
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        subdomain: Some(subdomain.clone()),
        dns_config: Some(PodDNSConfig {
            searches: Some(vec![format!(
                "{subdomain}.{namespace}.svc.{}",
                ctx.cluster_domain
            )]),
            ..Default::default()
        }),
        tolerations: Some(vec![Toleration {
            key: Some(keys::TAINT_WORKER.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        }]),
        init_containers: logfile_sidecar(&spec.logfile, &log_file)
            .map_err(|e| BuildError::invalid(format!("spec.logfile: {e}")))?
            .map(|c| vec![c]),
        containers: vec![slurmd],
        volumes: Some(volumes),
        ..Default::default()
    };
    let mut pod_spec = merge::merge_pod_spec(&base_spec, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    require_images(&pod_spec, |name| match name {
        "slurmd" => "spec.slurmd.image".to_string(),
        "logfile" => "spec.logfile.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
    let env = resource_env(&pod_spec.containers[0], &pod_spec);
    pod_spec.containers[0].env.get_or_insert_default().extend(env);

    if !spec.oversubscribe_node {
        let term = PodAffinityTerm {
            topology_key: "kubernetes.io/hostname".into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    keys::LABEL_NAME.into(),
                    helpers::WORKER.name.into(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let affinity = pod_spec.affinity.get_or_insert_with(Affinity::default);
        let anti = affinity
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default);
        anti.required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(term);
    }
    pod_spec.hostname = Some(identity.hostname.clone());
    pod_spec.node_name = None;

    let mut pod_labels = labels;
    pod_labels.extend([
        (keys::LABEL_POD_INDEX.to_string(), identity.ordinal.to_string()),
        (keys::LABEL_POD_NAME.to_string(), identity.name.clone()),
        (keys::LABEL_POD_HOSTNAME.to_string(), identity.hostname.clone()),
        (
            keys::LABEL_SCALING_MODE.to_string(),
            spec.scaling_mode.as_str().to_string(),
        ),
        (keys::LABEL_REVISION_HASH.to_string(), identity.revision.clone()),
    ]);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(identity.name.clone()),
            generate_name: Some(format!("{ns_name}-")),
            namespace: Some(namespace),
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    })
}
