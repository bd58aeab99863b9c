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
//!   it still exists) that a sandboxed builder cannot see; the host adds it to the built pod.
//!
//! The Controller's other children are in [`controller`] (the slurmctld StatefulSet, the
//! `slurm.conf` ConfigMap, the internal Service; the configuration files in [`conf`]), the
//! NodeSet's other children in [`workers`], a RestApi's (slurmrestd) in [`restapi`], a LoginSet's
//! (login nodes) in [`loginset`], an Accounting's (slurmdbd) in [`accounting`].

pub mod accounting;
pub mod conf;
pub mod controller;
pub mod loginset;
mod pod;
pub mod restapi;
pub mod workers;

use k8s_openapi::{
    api::core::v1::{Container, EnvVar, PodSpec, Service, ServiceSpec, VolumeMount},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use slinky_api::{Controller, keys};

pub use accounting::build_accounting_children;
pub use controller::build_controller_children;
pub use loginset::build_loginset_children;
pub use pod::{build_nodeset_pod, parse_extra_conf, slurmd_conf};
pub use restapi::build_restapi_children;
pub use workers::build_nodeset_children;

use crate::{
    BuildContext, BuildError,
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
/// The logfile sidecar's script, Slinky's `logfile.sh` verbatim (its text is in every pod
/// template: another text would restart an adopted slurmctld and replace adopted workers): a
/// FIFO at `$SOCKET` the daemon logs into, copied to the sidecar's stdout.
pub const LOGFILE_SCRIPT: &str = include_str!("slinky/scripts/logfile.sh");

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
    let mut selector = CONTROLLER.selector_labels(&name);
    if controller.spec.ha.as_ref().is_some_and(|ha| ha.enabled) {
        selector.insert(keys::LABEL_CONTROLLER_ACTIVE.into(), "true".into());
    }
    let svc = &controller.spec.service;
    let port = helpers::service_port("slurmctld", svc.port.unwrap_or(SLURMCTLD_PORT), "slurmctld");
    component_service(
        &controller.metadata,
        svc,
        controller_service_name(&name),
        &CONTROLLER.labels(&name),
        selector,
        port,
    )
}

/// Slinky's `common.BuildService`: the user's `spec.service` as the base, the operator's selector
/// merged into it and its port (with the spec's `nodePort`) appended, external IPs cleared; the
/// parent's labels, the service's, then the component's; the parent's annotations, then the
/// service's.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an invalid `spec.service`, or a user port that clashes with
/// the operator's port by name or number.
pub fn component_service(
    meta: &ObjectMeta,
    svc: &slinky_api::ServiceSpec,
    name: String,
    component_labels: &Labels,
    selector: Labels,
    mut port: k8s_openapi::api::core::v1::ServicePort,
) -> Result<Service, BuildError> {
    let user_spec = svc
        .spec
        .to_service_spec()
        .map_err(|e| BuildError::invalid(format!("spec.service.spec: {e}")))?;
    port.node_port = svc.node_port;
    let ours = port.name.clone().unwrap_or_default();
    let mut ports = user_spec.ports.clone().unwrap_or_default();
    if let Some(clash) = ports
        .iter()
        .find(|p| p.port == port.port || (p.name.is_some() && p.name == port.name))
    {
        return Err(BuildError::invalid(format!(
            "spec.service.spec.ports: port {} ({}) clashes with the {ours} port {} (name {ours}); \
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
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: meta.namespace.clone(),
            labels: non_empty(merge_maps([
                &meta.labels.clone().unwrap_or_default(),
                &svc.metadata.labels,
                component_labels,
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
