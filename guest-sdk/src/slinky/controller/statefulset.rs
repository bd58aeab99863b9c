//! Slinky's `BuildController`: the slurmctld StatefulSet (its pod template, volumes, the state
//! save claim, the reconfigure and logfile sidecars, the hash annotations that roll it).

use k8s_openapi::{
    api::{
        apps::v1::{StatefulSet, StatefulSetSpec},
        core::v1::{
            Affinity, ConfigMap, ConfigMapProjection, Container, EmptyDirVolumeSource, KeyToPath,
            PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
            PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec,
            ProjectedVolumeSource, SecretProjection, SecurityContext, Volume, VolumeProjection,
        },
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use slinky_api::{Controller, keys};

use super::super::{
    LOG_DIR, SLURMCTLD_PORT,
    conf::{JWKS_FILE, JWT_KEY_FILE, SLURM_ETC, SLURMCTLD_SPOOL},
    inherited_annotations, logfile_sidecar, mount, name_of, require_images,
};
use crate::{
    BuildContext, BuildError, ControllerInputs,
    helpers::{self, CONTROLLER, Labels, merge_maps, non_empty},
    merge,
};

use super::*;

/// The pod-template annotations Slinky hashes: the key hashes, and (without in-place
/// reconfigure) the hash of `config`'s data, so a configuration change rolls slurmctld.
pub(super) fn hash_annotations(
    controller: &Controller,
    inputs: &ControllerInputs,
    config: &ConfigMap,
) -> Labels {
    let mut hashes = Labels::from([
        (
            keys::ANNOTATION_SLURM_KEY_HASH.to_string(),
            inputs.slurm_key_hash.clone(),
        ),
        (
            keys::ANNOTATION_JWT_KEY_HASH.to_string(),
            inputs.jwt_key_hash.clone(),
        ),
    ]);
    if !controller.spec.inplace_reconfigure {
        let data = config.data.clone().unwrap_or_default();
        hashes.insert(
            keys::ANNOTATION_SLURM_CONFIG_HASH.to_string(),
            checksum_of_map(data.iter().map(|(k, v)| (k, v.as_bytes()))),
        );
    }
    hashes
}

/// An `emptyDir` volume, in memory when `medium` is `Memory`.
pub(crate) fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(String::from),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `slurm-etc` (projected, mode 0610: the ConfigMap, the keys, the extra ConfigMaps sorted by
/// name, the JWKS), `slurm-logfile` and `run` (memory), `slurm-authsocket`.
pub(super) fn controller_volumes(controller: &Controller) -> Result<Vec<Volume>, BuildError> {
    let s = &controller.spec;
    let missing = |field: &str| {
        BuildError::invalid(format!(
            "spec.{field} is required (a Secret holding the key): set it"
        ))
    };
    let slurm_key = s.slurm_key_ref.as_ref().ok_or_else(|| missing("slurmKeyRef"))?;
    let jwt_key = s.jwt_key_ref.as_ref().ok_or_else(|| missing("jwtKeyRef"))?;
    let secret = |name: &str, key: &str, path: &str| VolumeProjection {
        secret: Some(SecretProjection {
            name: name.into(),
            items: Some(vec![KeyToPath {
                key: key.into(),
                path: path.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let config_map = |name: &str, items: Option<Vec<KeyToPath>>| VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: name.into(),
            items,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut sources = vec![
        config_map(&controller.config_name(), None),
        secret(&slurm_key.name, &slurm_key.key, "slurm.key"),
        secret(&jwt_key.name, &jwt_key.key, JWT_KEY_FILE),
    ];
    let mut extra: Vec<&str> = s
        .config_file_refs
        .iter()
        .chain(&s.prolog_script_refs)
        .chain(&s.epilog_script_refs)
        .chain(&s.prolog_slurmctld_script_refs)
        .chain(&s.epilog_slurmctld_script_refs)
        .map(|r| r.name.as_str())
        .collect();
    extra.sort_unstable();
    sources.extend(extra.into_iter().map(|n| config_map(n, None)));
    if let Some(jwks) = &s.jwks_key_ref {
        sources.push(config_map(
            &jwks.name,
            Some(vec![KeyToPath {
                key: jwks.key.clone(),
                path: JWKS_FILE.into(),
                ..Default::default()
            }]),
        ));
    }
    Ok(vec![
        Volume {
            name: "slurm-etc".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o610),
                sources: Some(sources),
                ..Default::default()
            }),
            ..Default::default()
        },
        empty_dir("slurm-logfile", Some("Memory")),
        empty_dir("run", Some("Memory")),
        empty_dir("slurm-authsocket", None),
    ])
}

/// The slurmctld container: port 6817, `/livez` startup and liveness probes (6 × 10 s),
/// readiness `/readyz` (or `/livez` with HA: only the primary is ready otherwise), non-root
/// (401), mounts for the configuration, runtime, state, auth socket and logs.
pub(super) fn slurmctld_container(controller: &Controller) -> Container {
    let cluster = controller.cluster_name();
    let readiness = if controller.replicas() > 1 {
        "/livez"
    } else {
        "/readyz"
    };
    Container {
        name: "slurmctld".into(),
        ports: Some(vec![helpers::container_port("slurmctld", SLURMCTLD_PORT)]),
        startup_probe: Some(helpers::http_probe("/livez", "slurmctld", Some(6), Some(10))),
        readiness_probe: Some(helpers::http_probe(readiness, "slurmctld", None, None)),
        liveness_probe: Some(helpers::http_probe("/livez", "slurmctld", Some(6), Some(10))),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SLURM_UID),
            run_as_group: Some(SLURM_UID),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            mount("slurm-etc", SLURM_ETC, true),
            mount("run", "/run", false),
            mount(STATESAVE_VOLUME, &format!("{SLURMCTLD_SPOOL}/{cluster}"), false),
            mount("slurm-authsocket", AUTH_SOCKET_DIR, false),
            mount("slurm-logfile", LOG_DIR, false),
        ]),
        ..Default::default()
    }
}

/// The reconfigure sidecar of in-place reconfigure (a native sidecar).
pub(super) fn reconfigure_container(user: &slinky_api::ContainerWrapper) -> Result<Container, BuildError> {
    let base = Container {
        name: "reconfigure".into(),
        command: Some(
            ["tini", "-g", "--", "bash", "-c", RECONFIGURE_SCRIPT]
                .map(String::from)
                .to_vec(),
        ),
        restart_policy: Some("Always".into()),
        volume_mounts: Some(vec![
            mount("slurm-etc", SLURM_ETC, true),
            mount("slurm-authsocket", AUTH_SOCKET_DIR, true),
        ]),
        ..Default::default()
    };
    merge::merge_container(&base, &user.0).map_err(|e| BuildError::invalid(format!("spec.reconfigure: {e}")))
}

/// The state save volume by persistence mode: an existing claim, a volume claim template
/// (persistence on, no existing claim), or an emptyDir (persistence off).
pub(super) fn statesave(
    controller: &Controller,
) -> Result<(Option<Volume>, Option<PersistentVolumeClaim>), BuildError> {
    let persistence = controller.spec.persistence.clone().unwrap_or_default();
    let claim = persistence.existing_claim.clone().filter(|c| !c.is_empty());
    let enabled = controller.persistence_enabled();
    if controller.ha_enabled() && (!enabled || claim.is_none()) {
        return Err(BuildError::invalid(
            "spec.ha.enabled needs spec.persistence.enabled and spec.persistence.existingClaim (a \
             ReadWriteMany claim every slurmctld shares)",
        ));
    }
    Ok(match (enabled, claim) {
        (true, Some(claim)) => (
            Some(Volume {
                name: STATESAVE_VOLUME.into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            None,
        ),
        (true, None) => {
            let mut spec: PersistentVolumeClaimSpec = serde_json::to_value(&persistence.claim_spec)
                .and_then(serde_json::from_value)
                .map_err(|e| {
                    BuildError::invalid(format!(
                        "spec.persistence is not a PersistentVolumeClaim spec: {e}"
                    ))
                })?;
            // What Slinky's Helm chart sets; the API server refuses claims without an access mode.
            if spec.access_modes.as_ref().is_none_or(Vec::is_empty) {
                spec.access_modes = Some(vec!["ReadWriteOnce".into()]);
            }
            let storage = spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"));
            if storage.is_none() {
                return Err(BuildError::invalid(
                    "spec.persistence.resources.requests.storage: Required value: the state save \
                     volume claim needs a size (for example 4Gi); or set \
                     spec.persistence.existingClaim, or spec.persistence.enabled: false for an \
                     emptyDir",
                ));
            }
            (
                None,
                Some(PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name: Some(STATESAVE_VOLUME.into()),
                        namespace: controller.metadata.namespace.clone(),
                        ..Default::default()
                    },
                    spec: Some(spec),
                    status: None,
                }),
            )
        }
        (false, _) => (Some(empty_dir(STATESAVE_VOLUME, None)), None),
    })
}

/// Slinky's `BuildController`: the slurmctld StatefulSet `<controller>-controller`.
///
/// Replicas 1 (+ `ha.backups` with HA), no revision history, the selector labels, service name
/// `<controller>-controller-internal`; the pod template carries the Controller's and the
/// template's metadata, the key hashes of `inputs` and (without in-place reconfigure) the hash of
/// `config`'s data; no service account token; non-root security context (401); the volumes, the
/// reconfigure sidecar (in-place reconfigure), the logfile sidecar (with `logfile.image`), the
/// slurmctld container, the user's template merged Slinky's way, and a required anti-affinity
/// between slurmctld pods on `kubernetes.io/hostname`.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Controller, missing key references, HA without an
/// existing claim, or an invalid container or pod spec.
pub fn build_controller_statefulset(
    _ctx: &BuildContext,
    controller: &Controller,
    inputs: &ControllerInputs,
    config: &ConfigMap,
) -> Result<StatefulSet, BuildError> {
    let name = name_of(&controller.metadata, "Controller")?;
    let spec = &controller.spec;
    let template_meta = &spec.template.metadata;
    let selector = CONTROLLER.selector_labels(&name);

    let mut annotations = merge_maps([
        &inherited_annotations(&controller.metadata),
        &template_meta.annotations,
        &hash_annotations(controller, inputs, config),
    ]);
    annotations.insert(keys::ANNOTATION_DEFAULT_CONTAINER.into(), "slurmctld".into());
    let labels = merge_maps([
        &controller.metadata.labels.clone().unwrap_or_default(),
        &template_meta.labels,
        &CONTROLLER.labels(&name),
    ]);

    let (statesave_volume, claim) = statesave(controller)?;
    let mut init = Vec::new();
    if spec.inplace_reconfigure {
        init.push(reconfigure_container(&spec.reconfigure)?);
    }
    init.extend(
        logfile_sidecar(&spec.logfile, &format!("{LOG_DIR}/slurmctld.log"))
            .map_err(|e| BuildError::invalid(format!("spec.logfile: {e}")))?,
    );
    let slurmctld = merge::merge_container(&slurmctld_container(controller), &spec.slurmctld.0)
        .map_err(|e| BuildError::invalid(format!("spec.slurmctld: {e}")))?;
    let volumes = controller_volumes(controller)?;
    let base = PodSpec {
        automount_service_account_token: Some(false),
        containers: vec![slurmctld],
        init_containers: (!init.is_empty()).then_some(init),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SLURM_UID),
            run_as_group: Some(SLURM_UID),
            fs_group: Some(SLURM_UID),
            ..Default::default()
        }),
        volumes: Some(volumes),
        ..Default::default()
    };
    let mut pod_spec = merge::merge_pod_spec(&base, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    // The state save volume last, after the user's template's volumes, as Slinky appends it (a
    // volume of that name in the template is the user's).
    let volumes = pod_spec.volumes.get_or_insert_default();
    if let Some(v) = statesave_volume
        && !volumes.iter().any(|have| have.name == v.name)
    {
        volumes.push(v);
    }
    require_images(&pod_spec, |container| match container {
        "slurmctld" => "spec.slurmctld.image".to_string(),
        "logfile" => "spec.logfile.image".to_string(),
        "reconfigure" => "spec.reconfigure.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
    // Appended after the user's template is merged, so the user's terms stay and ours is always
    // there: a primary and its backups never share a node.
    pod_spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_default()
        .push(PodAffinityTerm {
            topology_key: "kubernetes.io/hostname".into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });

    let meta = &controller.metadata;
    Ok(StatefulSet {
        metadata: ObjectMeta {
            name: Some(controller.controller_key()),
            namespace: meta.namespace.clone(),
            labels: non_empty(labels.clone()),
            annotations: non_empty(merge_maps([
                &inherited_annotations(meta),
                &template_meta.annotations,
            ])),
            ..Default::default()
        },
        spec: StatefulSetSpec {
            replicas: Some(controller.replicas()),
            revision_history_limit: Some(0),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            service_name: Some(controller.internal_service_name()),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            volume_claim_templates: claim.map(|c| vec![c]),
            ..Default::default()
        },
        status: None,
    })
}
