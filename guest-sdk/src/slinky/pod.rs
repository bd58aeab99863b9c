//! Slinky's StatefulSet-mode NodeSet pod: the slurmd container, its volumes, the pod spec
//! around them, and the labels that make it the NodeSet's pod of one ordinal.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Affinity, Capabilities, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
        ExecAction, KeyToPath, Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, PodAffinityTerm,
        PodAntiAffinity, PodDNSConfig, PodSpec, ProjectedVolumeSource, ResourceRequirements,
        SecretKeySelector, SecretProjection, SecretVolumeSource, SecurityContext, Toleration, Volume,
        VolumeProjection,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use slinky_api::{Controller, NodeSet, Ssh, keys};

use super::{
    LOG_DIR, SLURMD_PORT, SSH_PORT, conf_server, inherited_annotations, logfile_sidecar, mount, name_of,
    plain_env, require_images,
};
use crate::{
    BuildContext, BuildError, PodIdentity,
    helpers::{self, Labels, merge_maps},
    merge,
};

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
    let slurm_key = slurm_key_ref(controller)?;
    let ssh = spec.ssh.as_ref().filter(|s| s.enabled);

    // Metadata: NodeSet → template → worker labels (→ hash annotations → default container).
    let labels = merge_maps([
        &nodeset.metadata.labels.clone().unwrap_or_default(),
        &spec.template.metadata.labels,
        &helpers::worker_labels(&ns_name, cluster),
    ]);
    let annotations = pod_annotations(nodeset, ssh);

    let slurmd = slurmd_container(nodeset, controller, identity, ssh.is_some())?;
    let volumes = pod_volumes(slurm_key, ssh, &ns_name);
    let base_spec = base_pod_spec(ctx, nodeset, &namespace, slurmd, volumes)?;
    let pod_spec = finish_pod_spec(nodeset, &base_spec, identity)?;

    let mut pod_labels = labels;
    pod_labels.extend(identity_labels(nodeset, identity));
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

/// The Controller's Slurm key reference, which every slurmd needs.
fn slurm_key_ref(controller: &Controller) -> Result<&SecretKeySelector, BuildError> {
    controller.spec.slurm_key_ref.as_ref().ok_or_else(|| {
        BuildError::invalid(format!(
            "Controller {}/{} has no spec.slurmKeyRef: set it to the Secret holding the Slurm key",
            controller.metadata.namespace.as_deref().unwrap_or_default(),
            controller.metadata.name.as_deref().unwrap_or_default()
        ))
    })
}

/// The pod's annotations: the NodeSet's (but kubectl's bookkeeping), the template's, the hashes
/// of the sshd and sssd configuration, and slurmd as the default container.
fn pod_annotations(nodeset: &NodeSet, ssh: Option<&Ssh>) -> Labels {
    let sshd_conf = ssh.and_then(|s| s.extra_sshd_config.clone()).unwrap_or_default();
    let sssd_ref = ssh
        .and_then(|s| s.sssd_conf_ref.as_ref())
        .map(|r| format!("{}/{}", r.name, r.key))
        .unwrap_or_default();
    merge_maps([
        &inherited_annotations(&nodeset.metadata),
        &nodeset.spec.template.metadata.annotations,
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
    ])
}

/// The slurmd container: Slinky's base merged with the user's `spec.slurmd`, whose `args` are
/// appended to the operator's rather than replacing them.
fn slurmd_container(
    nodeset: &NodeSet,
    controller: &Controller,
    identity: &PodIdentity,
    ssh: bool,
) -> Result<Container, BuildError> {
    let spec = &nodeset.spec;
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
    let base = slurmd_base(args, &identity.hostname, ssh);
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
    Ok(slurmd)
}

/// Slinky's slurmd container before the user's: `args`, the topology from the pod annotation,
/// the ports, probes, privileges, the drain on stop, and the mounts (the SSH ones with `ssh`).
fn slurmd_base(args: Vec<String>, hostname: &str, ssh: bool) -> Container {
    let mut ports = vec![helpers::container_port("slurmd", SLURMD_PORT)];
    let mut mounts = vec![
        mount("slurm-etc", "/etc/slurm", true),
        mount("slurm-logfile", LOG_DIR, false),
    ];
    if ssh {
        ports.push(helpers::container_port("ssh", SSH_PORT));
        mounts.push(mount("ssh-config", "/etc/ssh/sshd_config.d", true));
        mounts.push(mount("sssd-conf", "/etc/sssd", true));
    }
    Container {
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
        security_context: Some(slurmd_security_context()),
        lifecycle: Some(drain_on_stop(hostname)),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// slurmd runs privileged, with the capabilities it needs for cgroups and networking.
fn slurmd_security_context() -> SecurityContext {
    SecurityContext {
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
    }
}

/// A pre-stop hook that sets the Slurm node `hostname` down before the pod terminates.
fn drain_on_stop(hostname: &str) -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec![
                    "/usr/bin/sh".into(),
                    "-c".into(),
                    format!(
                        "scontrol update nodename={hostname} state=down reason=\"slurm-operator: Pod is terminating\""
                    ),
                ]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's volumes: `/etc/slurm` with the Slurm key, the log directory in memory, and with SSH
/// the NodeSet's sshd ConfigMap (and the sssd Secret when one is set).
fn pod_volumes(slurm_key: &SecretKeySelector, ssh: Option<&Ssh>, ns_name: &str) -> Vec<Volume> {
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
            config_map: Some(ConfigMapVolumeSource {
                name: format!("{ns_name}-ssh-config"),
                ..Default::default()
            }),
            ..Default::default()
        });
        if let Some(sssd) = &ssh.sssd_conf_ref {
            volumes.push(Volume {
                name: "sssd-conf".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(sssd.name.clone()),
                    default_mode: Some(0o600),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    volumes
}

/// Slinky's pod spec before the template: the workers' subdomain and DNS search, the worker
/// taint's toleration, the logfile sidecar, slurmd and the volumes.
fn base_pod_spec(
    ctx: &BuildContext,
    nodeset: &NodeSet,
    namespace: &str,
    slurmd: Container,
    volumes: Vec<Volume>,
) -> Result<PodSpec, BuildError> {
    let subdomain = format!("slurm-workers-{}", nodeset.spec.controller_ref.name);
    let log_file = format!("{LOG_DIR}/slurmd.log");
    Ok(PodSpec {
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
        init_containers: logfile_sidecar(&nodeset.spec.logfile, &log_file)
            .map_err(|e| BuildError::invalid(format!("spec.logfile: {e}")))?
            .map(|c| vec![c]),
        containers: vec![slurmd],
        volumes: Some(volumes),
        ..Default::default()
    })
}

/// The template merged over `base`, checked for images, with slurmd's resource environment, the
/// one-slurmd-per-node anti-affinity (unless `oversubscribeNode`) and the identity's hostname.
fn finish_pod_spec(nodeset: &NodeSet, base: &PodSpec, identity: &PodIdentity) -> Result<PodSpec, BuildError> {
    let spec = &nodeset.spec;
    let mut pod_spec = merge::merge_pod_spec(base, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    require_images(&pod_spec, |name| match name {
        "slurmd" => "spec.slurmd.image".to_string(),
        "logfile" => "spec.logfile.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
    let env = resource_env(&pod_spec.containers[0], &pod_spec);
    pod_spec.containers[0].env.get_or_insert_default().extend(env);

    if !spec.oversubscribe_node {
        let affinity = pod_spec.affinity.get_or_insert_with(Affinity::default);
        let anti = affinity
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default);
        anti.required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(one_slurmd_per_node());
    }
    pod_spec.hostname = Some(identity.hostname.clone());
    pod_spec.node_name = None;
    Ok(pod_spec)
}

/// The anti-affinity term keeping two slurmd pods off one Kubernetes node.
fn one_slurmd_per_node() -> PodAffinityTerm {
    PodAffinityTerm {
        topology_key: "kubernetes.io/hostname".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                keys::LABEL_NAME.into(),
                helpers::WORKER.name.into(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The labels naming the pod's ordinal (StatefulSet mode only: a DaemonSet-mode pod is its
/// node's, as in Slinky), name, hostname, scaling mode and revision.
fn identity_labels(nodeset: &NodeSet, identity: &PodIdentity) -> Vec<(String, String)> {
    let index =
        (!nodeset.is_daemon()).then(|| (keys::LABEL_POD_INDEX.to_string(), identity.ordinal.to_string()));
    index
        .into_iter()
        .chain([
            (keys::LABEL_POD_NAME.to_string(), identity.name.clone()),
            (keys::LABEL_POD_HOSTNAME.to_string(), identity.hostname.clone()),
            (
                keys::LABEL_SCALING_MODE.to_string(),
                nodeset.spec.scaling_mode.as_str().to_string(),
            ),
            (keys::LABEL_REVISION_HASH.to_string(), identity.revision.clone()),
        ])
        .collect()
}
