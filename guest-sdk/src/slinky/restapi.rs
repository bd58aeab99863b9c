//! Slinky's RestApi builders (`restapibuilder`): the slurmrestd Deployment and its Service, both
//! `<restapi>-restapi`, port 6820.

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            ConfigMapProjection, Container, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
            ProjectedVolumeSource, SecretProjection, SecurityContext, Service, TCPSocketAction, Volume,
            VolumeProjection,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use slinky_api::{Controller, RestApi, SLURMRESTD_PORT, keys};

use super::{
    component_service,
    conf::{SLURM_CONF, SLURM_ETC},
    inherited_annotations, mount, name_of, plain_env, require_images,
};
use crate::{
    BuildContext, BuildError, Child,
    helpers::{self, RESTAPI, merge_maps, non_empty},
    merge,
};

/// slurmrestd's user: `nobody` (uid and gid 65534), as Slinky runs it.
pub const SLURMRESTD_UID: i64 = 65534;
/// The container (and port) name.
const SLURMRESTD: &str = "slurmrestd";

/// Slinky's RestApi children: the Deployment `<restapi>-restapi` (`BuildRestapi`) and the
/// Service `<restapi>-restapi` (`BuildRestapiService`).
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed RestApi or Controller, a Controller without
/// `spec.slurmKeyRef`, an invalid container, pod spec or `spec.service`, or no slurmrestd image.
pub fn build_restapi_children(
    ctx: &BuildContext,
    restapi: &RestApi,
    controller: &Controller,
) -> Result<Vec<Child>, BuildError> {
    Ok(vec![
        build_restapi_deployment(ctx, restapi, controller)?.into(),
        build_restapi_service(restapi)?.into(),
    ])
}

/// Slinky's `BuildRestapiService`: `<restapi>-restapi` selecting the RestApi's slurmrestd pods,
/// port `slurmrestd` 6820 (`spec.service.port` changes the Service's port), the user's
/// `spec.service` as the base.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed RestApi, an invalid `spec.service` or a user port
/// that clashes with slurmrestd's.
pub fn build_restapi_service(restapi: &RestApi) -> Result<Service, BuildError> {
    let name = name_of(&restapi.metadata, "RestApi")?;
    let svc = &restapi.spec.service;
    let port = helpers::service_port(SLURMRESTD, svc.port.unwrap_or(SLURMRESTD_PORT), SLURMRESTD);
    component_service(
        &restapi.metadata,
        svc,
        restapi.restapi_key(),
        &RESTAPI.labels(&name),
        RESTAPI.selector_labels(&name),
        port,
    )
}

/// Slinky's `BuildRestapi`: the Deployment `<restapi>-restapi` of `spec.replicas` slurmrestd
/// pods (no revision history), selecting the selector labels. Each pod runs `slurmrestd` as
/// `nobody` (65534) with `SLURM_JWT=daemon` (it passes the client's token on to slurmctld), `-s
/// openapi/slurmctld` when the Controller has no accounting, the user's args, then
/// `0.0.0.0:6820`; TCP probes on 6820; `/etc/slurm` holds `slurm.conf` from `<controller>-config`
/// and the Controller's `slurm.key`; no service account token.
///
/// # Errors
/// As [`build_restapi_children`].
pub fn build_restapi_deployment(
    _ctx: &BuildContext,
    restapi: &RestApi,
    controller: &Controller,
) -> Result<Deployment, BuildError> {
    let name = name_of(&restapi.metadata, "RestApi")?;
    name_of(&controller.metadata, "Controller")?;
    let spec = &restapi.spec;
    let template_meta = &spec.template.metadata;
    let labels = merge_maps([
        &restapi.metadata.labels.clone().unwrap_or_default(),
        &template_meta.labels,
        &RESTAPI.labels(&name),
    ]);
    let annotations = merge_maps([
        &inherited_annotations(&restapi.metadata),
        &template_meta.annotations,
    ]);
    let mut pod_annotations = annotations.clone();
    pod_annotations.insert(keys::ANNOTATION_DEFAULT_CONTAINER.into(), SLURMRESTD.into());

    let mut slurmrestd = merge::merge_container(
        &slurmrestd_container(controller.spec.accounting_ref.is_some()),
        &spec.slurmrestd.0,
    )
    .map_err(|e| BuildError::invalid(format!("spec.slurmrestd: {e}")))?;
    // Usage: slurmrestd [OPTIONS] [host:port]...: the listen address comes last.
    slurmrestd
        .args
        .get_or_insert_default()
        .push(format!("0.0.0.0:{SLURMRESTD_PORT}"));
    let base = PodSpec {
        automount_service_account_token: Some(false),
        containers: vec![slurmrestd],
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SLURMRESTD_UID),
            run_as_group: Some(SLURMRESTD_UID),
            fs_group: Some(SLURMRESTD_UID),
            ..Default::default()
        }),
        volumes: Some(vec![slurm_etc(controller)?]),
        ..Default::default()
    };
    let pod_spec = merge::merge_pod_spec(&base, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    require_images(&pod_spec, |container| match container {
        SLURMRESTD => "spec.slurmrestd.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(restapi.restapi_key()),
            namespace: restapi.metadata.namespace.clone(),
            labels: non_empty(labels.clone()),
            annotations: non_empty(annotations),
            ..Default::default()
        },
        spec: DeploymentSpec {
            replicas: Some(restapi.replicas()),
            revision_history_limit: Some(0),
            selector: LabelSelector {
                match_labels: Some(RESTAPI.selector_labels(&name)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: non_empty(labels),
                    annotations: non_empty(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            ..Default::default()
        },
        status: None,
    })
}

fn tcp_probe(failure_threshold: Option<i32>, period: Option<i32>) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(SLURMRESTD_PORT),
            ..Default::default()
        }),
        failure_threshold,
        period_seconds: period,
        ..Default::default()
    }
}

fn slurmrestd_container(has_accounting: bool) -> Container {
    let args = if has_accounting {
        Vec::new()
    } else {
        vec!["-s".to_string(), "openapi/slurmctld".to_string()]
    };
    Container {
        name: SLURMRESTD.into(),
        env: Some(vec![
            plain_env("SLURM_JWT", "daemon".into()),
            plain_env(
                "SLURMRESTD_SECURITY",
                "disable_unshare_files,disable_unshare_sysv".into(),
            ),
        ]),
        args: Some(args),
        ports: Some(vec![helpers::container_port(SLURMRESTD, SLURMRESTD_PORT)]),
        startup_probe: Some(tcp_probe(Some(6), Some(10))),
        liveness_probe: Some(tcp_probe(Some(6), Some(10))),
        readiness_probe: Some(tcp_probe(None, None)),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SLURMRESTD_UID),
            run_as_group: Some(SLURMRESTD_UID),
            ..Default::default()
        }),
        volume_mounts: Some(vec![mount("slurm-etc", SLURM_ETC, true)]),
        ..Default::default()
    }
}

/// `slurm-etc` (projected, mode 0600): `slurm.conf` from `<controller>-config` and the
/// Controller's slurm key as `slurm.key`.
fn slurm_etc(controller: &Controller) -> Result<Volume, BuildError> {
    let key = controller.spec.slurm_key_ref.as_ref().ok_or_else(|| {
        BuildError::invalid(format!(
            "Controller {}: spec.slurmKeyRef is required (slurmrestd authenticates to slurmctld with \
             the Slurm key): set it",
            controller.metadata.name.as_deref().unwrap_or_default()
        ))
    })?;
    let item = |key: &str, path: &str| {
        Some(vec![KeyToPath {
            key: key.into(),
            path: path.into(),
            ..Default::default()
        }])
    };
    Ok(Volume {
        name: "slurm-etc".into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o600),
            default_user: None,
            sources: Some(vec![
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: controller.config_name(),
                        items: item(SLURM_CONF, SLURM_CONF),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    secret: Some(SecretProjection {
                        name: key.name.clone(),
                        items: item(&key.key, "slurm.key"),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn the_example_restapi_is_built_as_slinky_builds_it() -> Result<(), BuildError> {
        let (restapi, controller) = (testing::example_restapi()?, testing::example_controller()?);
        let children = build_restapi_children(&BuildContext::default(), &restapi, &controller)?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [("Deployment", "slurm-restapi"), ("Service", "slurm-restapi")]
        );
        let deployment = children[0]
            .as_deployment()
            .ok_or_else(|| BuildError::invalid("no Deployment"))?;
        let pod = deployment.spec.template.spec.clone().unwrap_or_default();
        let c = &pod.containers[0];
        assert_eq!(
            c.args.as_deref().unwrap_or_default(),
            ["-s", "openapi/slurmctld", "0.0.0.0:6820"],
            "no accounting: the slurmctld plugin only; the address last"
        );
        let mut with_accounting = controller.clone();
        with_accounting.spec.accounting_ref = Some(Default::default());
        let d = build_restapi_deployment(&BuildContext::default(), &restapi, &with_accounting)?;
        let args = d.spec.template.spec.and_then(|p| p.containers[0].args.clone());
        assert_eq!(args.unwrap_or_default(), ["0.0.0.0:6820"]);
        Ok(())
    }
}
