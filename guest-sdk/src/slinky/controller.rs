//! The Controller's children besides its Service: Slinky's `BuildController` (the slurmctld
//! StatefulSet), `BuildControllerConfig` (`<controller>-config`) and
//! `BuildControllerServiceInternal` (`<controller>-controller-internal`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Service, ServiceSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use slinky_api::Controller;

use super::{
    SLURMCTLD_PORT,
    conf::{self, CGROUP_CONF, SLURM_CONF},
    inherited_annotations, name_of,
};
use crate::{
    BuildContext, BuildError, Child, ControllerInputs,
    helpers::{self, CONTROLLER, Labels, merge_maps, non_empty},
};

/// The uid and gid of the Slurm user in Slinky's images.
pub const SLURM_UID: i64 = 401;
/// The state save volume's name.
pub const STATESAVE_VOLUME: &str = "statesave";
/// Where slurmctld's auth socket lives (shared with the reconfigure sidecar).
pub const AUTH_SOCKET_DIR: &str = "/run/slurmctld";

/// The reconfigure sidecar's script (in-place reconfigure), Slinky's `reconfigure.sh` verbatim
/// (its text is in the pod template: another text would restart an adopted slurmctld): every
/// few seconds, hash the files of `/etc/slurm` (skipping the kubelet's `..data` directories) and
/// run `scontrol reconfigure` (until it succeeds) when the hash changed.
pub const RECONFIGURE_SCRIPT: &str = include_str!("scripts/reconfigure.sh");

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

mod statefulset;
pub use statefulset::build_controller_statefulset;
pub(crate) use statefulset::empty_dir;

#[cfg(test)]
mod tests;
