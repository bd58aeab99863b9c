//! Slinky's StatefulSet-mode NodeSet pod: the slurmd container, its volumes, the pod spec
//! around them, and the labels that make it the NodeSet's pod of one ordinal.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Affinity, Capabilities, ConfigMapProjection, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
        ExecAction, KeyToPath, Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, PodAffinityTerm,
        PodAntiAffinity, PodDNSConfig, PodSpec, ProjectedVolumeSource, SecretKeySelector, SecretProjection,
        SecurityContext, Toleration, Volume, VolumeMount, VolumeProjection,
    },
    apimachinery::{
        pkg::api::resource::Quantity,
        pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta},
    },
};
use slinky_api::{Controller, NodeSet, Ssh, keys};

use super::{
    LOG_DIR, SLURMD_PORT, SSH_PORT, conf, conf_server, inherited_annotations, logfile_sidecar, mount,
    name_of, plain_env, require_images,
};
use crate::{
    BuildContext, BuildError, PodIdentity,
    helpers::{self, Labels, merge_maps},
    merge,
};

/// Parse `extraConf` as Slinky's `ParseExtraConf` does: white-space separated `Key=Value` items,
/// each key title-cased (`weight` and `WEIGHT` are `Weight`, `RealMemory` is `Realmemory`: Slurm
/// reads keys in any case), each value split on `,`, a repeated key's values gathered in order.
/// `None` when an item is not `Key=Value`: Slinky then passes none of `extraConf` to slurmd (its
/// webhook, when installed, refuses such a NodeSet).
pub fn parse_extra_conf(extra: &str) -> Option<BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in extra.split_whitespace() {
        let (key, value) = item.split_once('=')?;
        out.entry(title_case(key))
            .or_default()
            .extend(value.split(',').map(String::from));
    }
    Some(out)
}

/// `cases.Title(language.English)` for the keys of `extraConf`: the first letter of each word
/// upper case, the rest lower case; letters, digits, `_`, `.` and `'` keep a word going.
fn title_case(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut in_word = false;
    for c in key.chars() {
        if c.is_alphanumeric() {
            if in_word {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            in_word = true;
        } else {
            out.push(c);
            in_word = matches!(c, '_' | '.' | '\'') && in_word;
        }
    }
    out
}

/// slurmd's `--conf` value, as Slinky's `slurmdConfArgs` makes it: `Features=` the sorted,
/// de-duplicated `nodeset` (the NodeSet's Slurm name, [`NodeSet::slurm_name`], the feature
/// slurm.conf's `NodeSet=` line selects on) and every `Feature`/`Features` of `extraConf`;
/// `Topology='"$SLINKY_TOPOLOGY"'` unless `extraConf` sets one; the other `extraConf` keys; the
/// `Key=Value` items sorted and wrapped in single quotes for the image's shell entrypoint.
pub fn slurmd_conf(nodeset: &str, extra_conf: Option<&str>) -> String {
    let parsed = parse_extra_conf(extra_conf.unwrap_or_default()).unwrap_or_default();
    let mut features: Vec<String> = std::iter::once(nodeset.to_string())
        .chain(
            ["Feature", "Features"]
                .iter()
                .flat_map(|k| parsed.get(*k).cloned().unwrap_or_default()),
        )
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty())
        .collect();
    features.sort_unstable();
    features.dedup();
    let mut conf = BTreeMap::from([
        ("Features".to_string(), features.join(",")),
        ("Topology".to_string(), "'\"$SLINKY_TOPOLOGY\"'".to_string()),
    ]);
    for (key, values) in parsed {
        if key != "Feature" && key != "Features" {
            conf.insert(key, values.join(","));
        }
    }
    let mut items: Vec<String> = conf.iter().map(|(k, v)| format!("{k}={v}")).collect();
    items.sort_unstable();
    format!("'{}'", items.join(" "))
}

/// `POD_CPUS` and `POD_MEMORY` (MiB), as Slinky sets them: the limits of `spec.slurmd` where
/// non-zero, else the template's pod-level limits, else 0; CPUs rounded up, memory down.
fn resource_env(slurmd: &serde_json::Value, pod: &serde_json::Value) -> [EnvVar; 2] {
    // A quantity as text, or as a bare number (unquoted YAML: the field keeps unknown fields).
    let limit = |v: &serde_json::Value, key: &str| {
        let text = match v.pointer(&format!("/resources/limits/{key}")) {
            Some(serde_json::Value::String(q)) => q.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => return 0.0,
        };
        helpers::quantity_value(&Quantity(text)).unwrap_or(0.0)
    };
    let get = |key: &str| {
        Some(limit(slurmd, key))
            .filter(|v| *v != 0.0)
            .unwrap_or_else(|| limit(pod, key))
    };
    [
        plain_env("POD_CPUS", format!("{}", get("cpu").ceil() as i64)),
        plain_env(
            "POD_MEMORY",
            format!("{}", (get("memory").ceil() / 1048576.0).floor() as i64),
        ),
    ]
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

    let slurmd = slurmd_container(nodeset, controller, ssh.is_some())?;
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
/// of the sshd configuration (the `sshd_config` the NodeSet's ConfigMap holds) and of the sssd
/// one (its reference: the builder does not see the Secret), and slurmd as the default container.
fn pod_annotations(nodeset: &NodeSet, ssh: Option<&Ssh>) -> Labels {
    // Slinky hashes the `sshd_config` of the NodeSet's ConfigMap, which exists with SSH on.
    let sshd_conf = ssh
        .map(|s| conf::sshd_config(s.extra_sshd_config.as_deref().unwrap_or_default()))
        .unwrap_or_default();
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
fn slurmd_container(nodeset: &NodeSet, controller: &Controller, ssh: bool) -> Result<Container, BuildError> {
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
    let resources = resource_env(&spec.slurmd.0, &spec.template.spec.0);
    let base = slurmd_base(args, resources, ssh);
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

/// Slinky's slurmd container before the user's: `args`, the topology from the pod annotation and
/// the `resources` (`POD_CPUS`, `POD_MEMORY`), the ports, probes, privileges, the drain on stop, and the mounts (the SSH ones with `ssh`).
fn slurmd_base(args: Vec<String>, resources: [EnvVar; 2], ssh: bool) -> Container {
    let mut ports = vec![helpers::container_port("slurmd", SLURMD_PORT)];
    let mut mounts = vec![
        mount("slurm-etc", "/etc/slurm", true),
        mount("slurm-logfile", LOG_DIR, false),
    ];
    if ssh {
        ports.push(helpers::container_port("ssh", SSH_PORT));
        mounts.push(sub_path_mount(
            "ssh-config",
            "/etc/ssh/sshd_config",
            conf::SSHD_CONFIG,
        ));
        mounts.push(sub_path_mount("sssd-conf", "/etc/sssd/sssd.conf", "sssd.conf"));
    }
    let topology = EnvVar {
        name: "SLINKY_TOPOLOGY".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: format!("metadata.annotations['{}']", keys::ANNOTATION_TOPOLOGY),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Container {
        name: "slurmd".into(),
        args: Some(args),
        env: Some(std::iter::once(topology).chain(resources).collect()),
        ports: Some(ports),
        startup_probe: Some(helpers::http_probe("/livez", "slurmd", Some(6), Some(10))),
        liveness_probe: Some(helpers::http_probe("/livez", "slurmd", Some(6), Some(10))),
        readiness_probe: Some(helpers::http_probe("/readyz", "slurmd", None, None)),
        security_context: Some(slurmd_security_context()),
        lifecycle: Some(drain_on_stop()),
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

/// A read-only mount of one file of a volume.
fn sub_path_mount(volume: &str, path: &str, sub_path: &str) -> VolumeMount {
    VolumeMount {
        sub_path: Some(sub_path.into()),
        ..mount(volume, path, true)
    }
}

/// A pre-stop hook that sets the pod's Slurm node (its hostname) down before the pod
/// terminates: Slinky's command, word for word (its text is part of the pod).
fn drain_on_stop() -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec![
                    "/usr/bin/sh".into(),
                    "-c".into(),
                    "scontrol update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating';"
                        .into(),
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
        let projected = |source: VolumeProjection| ProjectedVolumeSource {
            default_mode: Some(0o600),
            sources: Some(vec![source]),
            ..Default::default()
        };
        let item = |key: &str, path: &str| {
            Some(vec![KeyToPath {
                key: key.into(),
                path: path.into(),
                mode: Some(0o600),
                ..Default::default()
            }])
        };
        volumes.push(Volume {
            name: "ssh-config".into(),
            projected: Some(projected(VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: format!("{ns_name}-ssh-config"),
                    items: item(conf::SSHD_CONFIG, conf::SSHD_CONFIG),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        });
        // Slinky mounts it with no `sssdConfRef` too, and the pod is then refused.
        if let Some(sssd) = &ssh.sssd_conf_ref {
            volumes.push(Volume {
                name: "sssd-conf".into(),
                projected: Some(projected(VolumeProjection {
                    secret: Some(SecretProjection {
                        name: sssd.name.clone(),
                        items: item(&sssd.key, "sssd.conf"),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
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
            operator: Some("Equal".into()),
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

/// The template merged over `base`, checked for images, with the one-slurmd-per-node
/// anti-affinity (unless `oversubscribeNode`) and the identity's hostname.
fn finish_pod_spec(nodeset: &NodeSet, base: &PodSpec, identity: &PodIdentity) -> Result<PodSpec, BuildError> {
    let spec = &nodeset.spec;
    let mut pod_spec = merge::merge_pod_spec(base, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    require_images(&pod_spec, |name| match name {
        "slurmd" => "spec.slurmd.image".to_string(),
        "logfile" => "spec.logfile.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
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
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: keys::LABEL_NAME.into(),
                operator: "In".into(),
                values: Some(vec![helpers::WORKER.name.into()]),
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The labels naming the pod's ordinal (StatefulSet mode only: a DaemonSet-mode pod is its
/// node's, as in Slinky), name, hostname, scaling mode and revision.
fn identity_labels(nodeset: &NodeSet, identity: &PodIdentity) -> Vec<(String, String)> {
    // Zero-padded to `ordinalPadding`, as the pod's name.
    let index = (!nodeset.is_daemon()).then(|| {
        let width = nodeset.ordinal_padding();
        (
            keys::LABEL_POD_INDEX.to_string(),
            format!("{:0width$}", identity.ordinal),
        )
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    const TOPOLOGY: &str = "Topology='\"$SLINKY_TOPOLOGY\"'";

    #[test]
    fn slurmd_conf_is_slinkys() {
        assert_eq!(
            slurmd_conf("slinky", Some("Features=gpu,ib Weight=10")),
            format!("'Features=gpu,ib,slinky {TOPOLOGY} Weight=10'"),
            "features sorted with the NodeSet's"
        );
        assert_eq!(
            slurmd_conf(
                "w",
                Some(" weight=5  feature=b,w Features=a,,b realMemory=100 WEIGHT=6 ")
            ),
            format!("'Features=a,b,w Realmemory=100 {TOPOLOGY} Weight=5,6'"),
            "keys title-cased, Feature and Features gathered, repeated keys joined"
        );
        assert_eq!(
            slurmd_conf("w", Some("Weight=5 NotAKeyValue")),
            format!("'Features=w {TOPOLOGY}'"),
            "an item that is not Key=Value: none of extraConf"
        );
        assert_eq!(
            slurmd_conf("w", Some("topology=x Port2=1 Port=2")),
            "'Features=w Port2=1 Port=2 Topology=x'",
            "the user's Topology wins; whole items sorted"
        );
        assert_eq!(title_case("gres-x"), "Gres-X");
    }

    #[test]
    fn pod_cpus_and_memory_as_slinky_sets_them() {
        let env = |slurmd: serde_json::Value, pod: serde_json::Value| {
            resource_env(&slurmd, &pod).map(|e| e.value.unwrap_or_default())
        };
        let none = serde_json::json!({});
        assert_eq!(
            env(none.clone(), none.clone()),
            ["0", "0"],
            "always set, 0 without limits"
        );
        let numeric = serde_json::json!({"resources": {"limits": {"cpu": 4, "memory": 1073741824}}});
        assert_eq!(
            env(numeric, none.clone()),
            ["4", "1024"],
            "numbers are quantities too"
        );
        let slurmd = serde_json::json!({"resources": {"limits": {"cpu": "1500m", "memory": "0"}}});
        let pod = serde_json::json!({"resources": {"limits": {"cpu": "8", "memory": "2Gi"}}});
        assert_eq!(
            env(slurmd, pod),
            ["2", "2048"],
            "the container's limit where non-zero (rounded up), else the pod's"
        );
        assert_eq!(title_case("cpu_spec_list"), "Cpu_spec_list");
    }
}
