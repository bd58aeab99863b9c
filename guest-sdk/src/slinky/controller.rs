//! The Controller's children besides its Service: Slinky's `BuildController` (the slurmctld
//! StatefulSet), `BuildControllerConfig` (`<controller>-config`) and
//! `BuildControllerServiceInternal` (`<controller>-controller-internal`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{StatefulSet, StatefulSetSpec},
        core::v1::{
            Affinity, ConfigMap, ConfigMapProjection, Container, EmptyDirVolumeSource, KeyToPath,
            PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
            PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec,
            ProjectedVolumeSource, SecretProjection, SecurityContext, Service, ServiceSpec, Volume,
            VolumeProjection,
        },
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use slinky_api::{Controller, keys};

use super::{
    LOG_DIR, SLURMCTLD_PORT,
    conf::{self, CGROUP_CONF, JWKS_FILE, JWT_KEY_FILE, SLURM_CONF, SLURM_ETC, SLURMCTLD_SPOOL},
    inherited_annotations, logfile_sidecar, mount, name_of, require_images,
};
use crate::{
    BuildContext, BuildError, Child, ControllerInputs,
    helpers::{self, CONTROLLER, Labels, merge_maps, non_empty},
    merge,
};

/// The uid and gid of the Slurm user in Slinky's images.
pub const SLURM_UID: i64 = 401;
/// The state save volume's name.
pub const STATESAVE_VOLUME: &str = "statesave";
/// Where slurmctld's auth socket lives (shared with the reconfigure sidecar).
pub const AUTH_SOCKET_DIR: &str = "/run/slurmctld";

/// The reconfigure sidecar's script (in-place reconfigure): every few seconds, hash the files of
/// `/etc/slurm` (skipping the kubelet's `..data` directories) and run `scontrol reconfigure`
/// (until it succeeds) when the hash changed.
pub const RECONFIGURE_SCRIPT: &str = r#"set -euo pipefail
dir=/etc/slurm
checksum() { find "$dir" -path '*/..*' -prune -o \( -type f -o -type l \) -exec sha256sum {} + | sort -k2 | sha256sum; }
seen="$(checksum)"
echo "watching $dir for configuration changes"
while sleep 5; do
  now="$(checksum)"
  [ "$now" = "$seen" ] && continue
  echo "$(date -Is) configuration changed: scontrol reconfigure"
  until scontrol reconfigure; do echo "$(date -Is) scontrol reconfigure failed; retrying"; sleep 2; done
  seen="$now"
done
"#;

/// Slinky's `CheckSumFromMap`, for the `*-hash` annotations of Secrets and ConfigMaps.
pub use slinky_api::hash::checksum_of_map;

/// Slinky's Controller children besides its Service: the ConfigMap `<controller>-config`, the
/// headless Service `<controller>-controller-internal` and the StatefulSet `<controller>-controller`;
/// for an external Controller only a minimal ConfigMap (no slurmctld runs here).
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Controller, a Controller without key references,
/// high availability without `persistence.existingClaim`, or containers/pod spec that are not
/// valid.
pub fn build_controller_children(
    ctx: &BuildContext,
    controller: &Controller,
    inputs: &ControllerInputs,
) -> Result<Vec<Child>, BuildError> {
    if controller.spec.external {
        return Ok(vec![build_controller_config(controller, inputs)?.into()]);
    }
    let config = build_controller_config(controller, inputs)?;
    let internal = build_controller_service_internal(controller)?;
    let statefulset = build_controller_statefulset(ctx, controller, inputs, &config)?;
    let mut children = vec![config.into(), internal.into(), statefulset.into()];
    children.extend(build_controller_service_monitor(controller)?);
    Ok(children)
}

/// slurmctld's metrics paths a ServiceMonitor scrapes when it names none.
pub const METRICS_PATHS: [&str; 4] = [
    "/metrics/jobs",
    "/metrics/nodes",
    "/metrics/partitions",
    "/metrics/scheduler",
];

/// Slinky's `BuildControllerServiceMonitor`: with `spec.metrics.enabled` and
/// `spec.metrics.serviceMonitor.enabled`, the Prometheus Operator ServiceMonitor
/// `<controller>-controller` selecting the Controller's slurmctld Service in its namespace, one
/// endpoint per metrics path on the `slurmctld` port (http), with the intervals it sets; `None`
/// otherwise (the host deletes one it built before).
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Controller or an endpoint without a path.
pub fn build_controller_service_monitor(controller: &Controller) -> Result<Option<Child>, BuildError> {
    let Some(metrics) = controller.spec.metrics.as_ref().filter(|m| m.enabled) else {
        return Ok(None);
    };
    let Some(sm) = metrics.service_monitor.as_ref().filter(|s| s.enabled) else {
        return Ok(None);
    };
    let name = name_of(&controller.metadata, "Controller")?;
    let at = "spec.metrics.serviceMonitor";
    prometheus_duration(&format!("{at}.interval"), sm.interval.as_deref())?;
    prometheus_duration(&format!("{at}.scrapeTimeout"), sm.scrape_timeout.as_deref())?;
    for (i, e) in sm.metric_endpoints.iter().enumerate() {
        prometheus_duration(&format!("{at}.endpoints[{i}].interval"), e.interval.as_deref())?;
        prometheus_duration(
            &format!("{at}.endpoints[{i}].scrapeTimeout"),
            e.scrape_timeout.as_deref(),
        )?;
    }
    let endpoint = |path: &str, interval: &Option<String>, timeout: &Option<String>| {
        let mut e = serde_json::json!({"path": path, "port": "slurmctld", "scheme": "http"});
        if let Some(i) = interval.as_ref().or(sm.interval.as_ref()) {
            e["interval"] = i.clone().into();
        }
        if let Some(t) = timeout.as_ref().or(sm.scrape_timeout.as_ref()) {
            e["scrapeTimeout"] = t.clone().into();
        }
        e
    };
    let endpoints: Vec<serde_json::Value> = if sm.metric_endpoints.is_empty() {
        METRICS_PATHS.iter().map(|p| endpoint(p, &None, &None)).collect()
    } else {
        let mut out = Vec::new();
        for (i, e) in sm.metric_endpoints.iter().enumerate() {
            if e.path.is_empty() {
                return Err(BuildError::invalid(format!(
                    "spec.metrics.serviceMonitor.endpoints[{i}].path is required: the HTTP path to scrape"
                )));
            }
            out.push(endpoint(&e.path, &e.interval, &e.scrape_timeout));
        }
        out
    };
    let meta = controller_metadata(controller, controller.controller_key(), &sm.labels);
    let annotations = merge_maps([&meta.annotations.clone().unwrap_or_default(), &sm.annotations]);
    let object = serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "labels": meta.labels,
            "annotations": non_empty(annotations),
        },
        "spec": {
            "selector": {"matchLabels": CONTROLLER.selector_labels(&name)},
            "namespaceSelector": {"matchNames": [controller.metadata.namespace.clone().unwrap_or_default()]},
            "endpoints": endpoints,
        },
    });
    let mut object = object;
    if let Some(m) = object["metadata"].as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    Ok(Some(Child::Json(Box::new(object))))
}

/// A Prometheus duration (`0`, or units in order: `1h30m`, `30s`, `500ms`), as the Prometheus
/// Operator's CRD requires of a ServiceMonitor's intervals; absent is fine.
fn prometheus_duration(field: &str, value: Option<&str>) -> Result<(), BuildError> {
    let Some(v) = value else { return Ok(()) };
    const UNITS: [&str; 7] = ["y", "w", "d", "h", "m", "s", "ms"];
    let mut rest = v;
    let mut next = 0;
    let mut ok = !v.is_empty();
    while ok && !rest.is_empty() && v != "0" {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let tail = &rest[digits..];
        // The longest unit that follows, among those after the last one used.
        let unit = UNITS[next..]
            .iter()
            .enumerate()
            .filter(|(_, u)| tail.starts_with(**u) && !(**u == "m" && tail.starts_with("ms")))
            .map(|(i, u)| (next + i, *u))
            .next();
        match unit {
            Some((i, u)) if digits > 0 => {
                rest = &tail[u.len()..];
                next = i + 1;
            }
            _ => ok = false,
        }
    }
    if ok {
        Ok(())
    } else {
        Err(BuildError::invalid(format!(
            "{field} is {v:?}, not a Prometheus duration: write a number and a unit (ms, s, m, h, d, \
             w, y), largest first, e.g. \"30s\" or \"1m30s\""
        )))
    }
}

fn controller_metadata(controller: &Controller, name: String, extra_labels: &Labels) -> ObjectMeta {
    let meta = &controller.metadata;
    let cr = meta.name.as_deref().unwrap_or_default();
    ObjectMeta {
        name: Some(name),
        namespace: meta.namespace.clone(),
        labels: non_empty(merge_maps([
            &meta.labels.clone().unwrap_or_default(),
            extra_labels,
            &CONTROLLER.labels(cr),
        ])),
        annotations: non_empty(inherited_annotations(meta)),
        ..Default::default()
    }
}

/// Slinky's `BuildControllerConfig`: `<controller>-config` with `slurm.conf` and, unless one of
/// `spec.configFileRefs` provides it, `cgroup.conf`; for an external Controller the minimal
/// `slurm.conf` only, with the template's metadata (`BuildControllerConfigExternal`).
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Controller, or an external one without
/// `externalConfig`.
pub fn build_controller_config(
    controller: &Controller,
    inputs: &ControllerInputs,
) -> Result<ConfigMap, BuildError> {
    let name = name_of(&controller.metadata, "Controller")?;
    if controller.spec.external {
        if controller.spec.external_config.is_none() {
            return Err(BuildError::invalid(
                "spec.external is true but spec.externalConfig is missing: set its host and port",
            ));
        }
        let template = &controller.spec.template.metadata;
        return Ok(ConfigMap {
            metadata: ObjectMeta {
                name: Some(controller.config_name()),
                namespace: controller.metadata.namespace.clone(),
                labels: non_empty(merge_maps([&template.labels, &CONTROLLER.labels(&name)])),
                annotations: non_empty(template.annotations.clone()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                SLURM_CONF.to_string(),
                conf::slurm_conf_minimal(controller, inputs),
            )])),
            immutable: Some(false),
            ..Default::default()
        });
    }
    check_metrics(controller)?;
    let has_cgroup = controller
        .spec
        .config_file_refs
        .iter()
        .any(|r| inputs.files_of(&r.name).iter().any(|f| f == CGROUP_CONF));
    let mut data = BTreeMap::from([(SLURM_CONF.to_string(), conf::slurm_conf(controller, inputs))]);
    if !has_cgroup {
        data.insert(CGROUP_CONF.to_string(), conf::cgroup_conf());
    }
    Ok(ConfigMap {
        metadata: controller_metadata(controller, controller.config_name(), &Labels::new()),
        data: Some(data),
        immutable: Some(false),
        ..Default::default()
    })
}

/// The first Slurm release whose slurmctld knows `MetricsType` (`metrics/openmetrics`).
pub const METRICS_SINCE: (u32, u32) = (25, 11);

/// The Slurm release an image's tag names (`…/slurmctld:25.05-ubuntu24.04` → `(25, 5)`), when
/// it starts with `<major>.<minor>`; `None` for tags that name no release (`latest`, digests).
pub fn slurm_release_of_image(image: &str) -> Option<(u32, u32)> {
    let image = image.split('@').next().unwrap_or_default();
    let last = image.rsplit('/').next().unwrap_or_default();
    let (_, tag) = last.split_once(':')?;
    let mut parts = tag.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// `spec.metrics.enabled` writes `MetricsType=metrics/openmetrics`, which slurmctld before 25.11
/// refuses (`Parsing error at unrecognized key: MetricsType`) and then never starts: refused here
/// when `spec.slurmctld.image`'s tag names an older release, rather than a crash-looping slurmctld.
fn check_metrics(controller: &Controller) -> Result<(), BuildError> {
    let spec = &controller.spec;
    if !spec.metrics.as_ref().is_some_and(|m| m.enabled) {
        return Ok(());
    }
    let image = spec.slurmctld.0["image"].as_str().unwrap_or_default();
    match slurm_release_of_image(image) {
        Some(release) if release < METRICS_SINCE => Err(BuildError::invalid(format!(
            "spec.metrics.enabled needs Slurm {}.{} or later (slurmctld {}.{:02} refuses the \
             MetricsType line and does not start), but spec.slurmctld.image is {image:?}: use a \
             {}.{} or later image, or set spec.metrics.enabled to false",
            METRICS_SINCE.0, METRICS_SINCE.1, release.0, release.1, METRICS_SINCE.0, METRICS_SINCE.1
        ))),
        _ => Ok(()),
    }
}

/// Slinky's `BuildControllerServiceInternal`: the headless Service governing the StatefulSet, so
/// every slurmctld pod has a stable DNS name (`SlurmctldHost` lines); its selector has no
/// `active` label.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Controller.
pub fn build_controller_service_internal(controller: &Controller) -> Result<Service, BuildError> {
    let name = name_of(&controller.metadata, "Controller")?;
    Ok(Service {
        metadata: controller_metadata(controller, controller.internal_service_name(), &Labels::new()),
        spec: Some(ServiceSpec {
            selector: Some(CONTROLLER.selector_labels(&name)),
            ports: Some(vec![helpers::service_port(
                "slurmctld",
                SLURMCTLD_PORT,
                "slurmctld",
            )]),
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    })
}

/// The pod-template annotations Slinky hashes: the key hashes, and (without in-place
/// reconfigure) the hash of `config`'s data, so a configuration change rolls slurmctld.
fn hash_annotations(controller: &Controller, inputs: &ControllerInputs, config: &ConfigMap) -> Labels {
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
fn controller_volumes(controller: &Controller) -> Result<Vec<Volume>, BuildError> {
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
fn slurmctld_container(controller: &Controller) -> Container {
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
fn reconfigure_container(user: &slinky_api::ContainerWrapper) -> Result<Container, BuildError> {
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
fn statesave(controller: &Controller) -> Result<(Option<Volume>, Option<PersistentVolumeClaim>), BuildError> {
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
    let mut volumes = controller_volumes(controller)?;
    volumes.extend(statesave_volume);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_name_their_slurm_release() {
        let cases = [
            ("ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04", Some((25, 5))),
            ("ghcr.io/slinkyproject/slurmctld:25.11.2-rocky9", Some((25, 11))),
            ("registry:5000/slurmctld:26.05", Some((26, 5))),
            ("registry:5000/slurmctld", None),
            ("slurmctld:latest", None),
            ("slurmctld@sha256:0123", None),
            ("slurmctld:25.05@sha256:0123", Some((25, 5))),
        ];
        for (image, want) in cases {
            assert_eq!(slurm_release_of_image(image), want, "{image}");
        }
    }

    #[test]
    fn prometheus_durations_are_checked() {
        for ok in [
            "0",
            "30s",
            "1m30s",
            "500ms",
            "1h",
            "2d12h",
            "1y2w3d4h5m6s7ms",
            "1m500ms",
        ] {
            assert!(prometheus_duration("f", Some(ok)).is_ok(), "{ok} refused");
        }
        for bad in [
            "", "30", "s", "1.5s", "30S", "1s1m", "1m1m", "-1s", "30 s", "1mss",
        ] {
            let Err(BuildError::InvalidInput(m)) = prometheus_duration("spec.x", Some(bad)) else {
                panic!("{bad:?} accepted");
            };
            assert!(m.contains("spec.x") && m.contains("Prometheus duration"), "{m}");
        }
    }

    #[test]
    fn the_service_monitor_is_built_only_with_metrics_and_its_own_switch() {
        let controller = |metrics: serde_json::Value| -> Controller {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"slurmKeyRef": {"name": "k", "key": "slurm.key"},
                         "jwtKeyRef": {"name": "j", "key": "jwt.key"}, "metrics": metrics}
            }))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let sm = serde_json::json!({"enabled": true});
        for off in [
            serde_json::json!({"enabled": false, "serviceMonitor": sm}),
            serde_json::json!({"enabled": true}),
            serde_json::json!({"enabled": true, "serviceMonitor": {"enabled": false}}),
        ] {
            let built = build_controller_service_monitor(&controller(off.clone()))
                .unwrap_or_else(|e| panic!("{e:?}"));
            assert!(built.is_none(), "built with {off}");
        }
        let built = build_controller_service_monitor(&controller(
            serde_json::json!({"enabled": true, "serviceMonitor": {"enabled": true, "interval": "soon"}}),
        ));
        assert!(
            matches!(built, Err(BuildError::InvalidInput(m)) if m.contains("spec.metrics.serviceMonitor.interval"))
        );
        let built = build_controller_service_monitor(&controller(
            serde_json::json!({"enabled": true, "serviceMonitor": {"enabled": true, "endpoints": [{"interval": "5s"}]}}),
        ));
        assert!(matches!(built, Err(BuildError::InvalidInput(m)) if m.contains("endpoints[0].path")));
    }

    #[test]
    fn metrics_are_refused_with_a_slurmctld_older_than_25_11() {
        let controller = |image: &str, metrics: bool| -> Controller {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"slurmKeyRef": {"name": "k", "key": "slurm.key"},
                         "jwtKeyRef": {"name": "j", "key": "jwt.key"},
                         "slurmctld": {"image": image}, "metrics": {"enabled": metrics}}
            }))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let inputs = ControllerInputs::default();
        let old = "ghcr.io/slinkyproject/slurmctld:25.05-ubuntu24.04";
        let Err(BuildError::InvalidInput(message)) = build_controller_config(&controller(old, true), &inputs)
        else {
            panic!("metrics with a 25.05 slurmctld were not refused");
        };
        for part in [
            "spec.metrics.enabled",
            "25.11",
            old,
            "set spec.metrics.enabled to false",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        for (image, metrics) in [
            (old, false),
            ("ghcr.io/slinkyproject/slurmctld:25.11-ubuntu24.04", true),
            ("mine:latest", true),
        ] {
            let config = build_controller_config(&controller(image, metrics), &inputs)
                .unwrap_or_else(|e| panic!("{image} {metrics}: {e:?}"));
            let conf = config
                .data
                .unwrap_or_default()
                .remove(SLURM_CONF)
                .unwrap_or_default();
            assert_eq!(
                conf.contains("MetricsType=metrics/openmetrics"),
                metrics,
                "{image}"
            );
        }
    }

    #[test]
    fn checksums_follow_slinky() {
        let data = BTreeMap::from([("b".to_string(), b"2".to_vec()), ("a".to_string(), b"1".to_vec())]);
        assert_eq!(
            checksum_of_map(data.iter().map(|(k, v)| (k, v.as_slice()))),
            helpers::sha256_hex(b"12"),
            "values concatenated in key order"
        );
        assert_eq!(checksum_of_map(std::iter::empty()), "");
    }
}
