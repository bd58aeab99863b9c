//! Slinky's LoginSet builders (`loginbuilder`): the login Deployment and its Service, both
//! `<loginset>`, port 22, and the `sshd_config` ConfigMap `<loginset>-ssh-config`. The host keys
//! Secret `<loginset>-ssh-host-keys` is made by the host (a builder has no randomness, and its
//! data never reaches a guest).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{
            ConfigMap, ConfigMapProjection, Container, ExecAction, KeyToPath, PodDNSConfig, PodSpec,
            PodTemplateSpec, Probe, ProjectedVolumeSource, SecretProjection, Service, Volume, VolumeMount,
            VolumeProjection,
        },
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use slinky_api::{Controller, LOGIN_SSH_PORT, LoginSet, keys};

use super::{
    component_service, conf_server, controller::empty_dir, inherited_annotations, mount, name_of, plain_env,
    require_images,
};
use crate::{
    BuildContext, BuildError, Child, LoginSetInputs,
    helpers::{self, LOGIN, merge_maps, non_empty, sha256_hex},
    merge,
};

/// The login container's (and port's) name.
const LOGIN_NAME: &str = "login";
/// sackd's directory and socket: the login pod is ready once sackd listens.
const SACKD_DIR: &str = "/run/slurm";
/// The ConfigMap key of `authorized_keys`.
pub const AUTHORIZED_KEYS: &str = "authorized_keys";
/// The ConfigMap key of `sshd_config`.
pub const SSHD_CONFIG: &str = "sshd_config";
/// `slinky.slurm.net/ssh-host-keys-hash`.
pub const ANNOTATION_SSH_HOST_KEYS_HASH: &str = "slinky.slurm.net/ssh-host-keys-hash";
/// What the `initconf` init container runs: copy the configuration and keys into the in-memory
/// `/etc/slurm`, owned by `slurm` (Slinky's `initconf.sh`).
pub const INITCONF_SCRIPT: &str = r#"#!/usr/bin/env sh
# SPDX-FileCopyrightText: Copyright (C) SchedMD LLC.
# SPDX-License-Identifier: Apache-2.0

set -eu

SLURM_USER_UID="401"
SLURM_USER_GID="401"
SLURM_MOUNT=/mnt/slurm
SLURM_DIR=/mnt/etc/slurm

# Workaround to ephemeral volumes not supporting securityContext
# https://github.com/kubernetes/kubernetes/issues/81089

# Copy Slurm config files, secrets, and scripts
mkdir -p "$SLURM_DIR"
find "${SLURM_MOUNT}" -type f -name "*.conf" -print0 | xargs -0r cp -vt "${SLURM_DIR}"
find "${SLURM_MOUNT}" -type f -name "*.key" -print0 | xargs -0r cp -vt "${SLURM_DIR}"

# Set general permissions and ownership
find "${SLURM_DIR}" -type f -print0 | xargs -0r chown -v "${SLURM_USER_UID}:${SLURM_USER_GID}"
find "${SLURM_DIR}" -type f -name "*.conf" -print0 | xargs -0r chmod -v 644
find "${SLURM_DIR}" -type f -name "slurmdbd.conf" -print0 | xargs -0r chmod -v 600
find "${SLURM_DIR}" -type f -name "*.key" -print0 | xargs -0r chmod -v 600
find "${SLURM_DIR}" -type f -name "*.key" -print0 | xargs -0r chown -v "${SLURM_USER_UID}:${SLURM_USER_GID}"

# Display Slurm directory files
ls -lAF "${SLURM_DIR}"
"#;

/// Slinky's LoginSet children: the Deployment `<loginset>` (`BuildLogin`), the Service
/// `<loginset>` (`BuildLoginService`) and the ConfigMap `<loginset>-ssh-config`
/// (`BuildLoginSshConfig`).
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed LoginSet or Controller, an external Controller
/// without `externalConfig`, a Controller without `spec.slurmKeyRef`, an invalid container, pod
/// spec or `spec.service`, or no login or initconf image.
pub fn build_loginset_children(
    ctx: &BuildContext,
    loginset: &LoginSet,
    controller: &Controller,
    inputs: &LoginSetInputs,
) -> Result<Vec<Child>, BuildError> {
    let config = build_login_ssh_config(loginset)?;
    Ok(vec![
        build_login_deployment(ctx, loginset, controller, inputs, &config)?.into(),
        build_login_service(loginset)?.into(),
        config.into(),
    ])
}

/// Slinky's `BuildLoginService`: `<loginset>` selecting the login pods, port `login` 22
/// (`spec.service.port` changes it), the user's `spec.service` as the base.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed LoginSet, an invalid `spec.service` or a user
/// port that clashes with the login port.
pub fn build_login_service(loginset: &LoginSet) -> Result<Service, BuildError> {
    let name = name_of(&loginset.metadata, "LoginSet")?;
    let svc = &loginset.spec.service;
    let port = helpers::service_port(LOGIN_NAME, svc.port.unwrap_or(LOGIN_SSH_PORT), LOGIN_NAME);
    component_service(
        &loginset.metadata,
        svc,
        loginset.login_key(),
        &LOGIN.labels(&name),
        LOGIN.selector_labels(&name),
        port,
    )
}

/// Slinky's `BuildLoginSshConfig`: `<loginset>-ssh-config` holding `authorized_keys` (root's:
/// `spec.rootSshAuthorizedKeys`) and `sshd_config` (PAM, X11 forwarding, sftp, then
/// `spec.extraSshdConfig`).
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed LoginSet.
pub fn build_login_ssh_config(loginset: &LoginSet) -> Result<ConfigMap, BuildError> {
    let name = name_of(&loginset.metadata, "LoginSet")?;
    let spec = &loginset.spec;
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(loginset.ssh_config_name()),
            namespace: loginset.metadata.namespace.clone(),
            labels: non_empty(merge_maps([
                &loginset.metadata.labels.clone().unwrap_or_default(),
                &LOGIN.labels(&name),
            ])),
            annotations: non_empty(inherited_annotations(&loginset.metadata)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                AUTHORIZED_KEYS.to_string(),
                format!("#\n### SLINKY ###\n{}\n", spec.root_ssh_authorized_keys),
            ),
            (
                SSHD_CONFIG.to_string(),
                login_sshd_config(&spec.extra_sshd_config),
            ),
        ])),
        immutable: Some(false),
        ..Default::default()
    })
}

/// A login pod's `sshd_config`: PAM, X11 forwarding, sftp, then `extraSshdConfig` (Slinky's
/// `buildSshdConfig`).
pub fn login_sshd_config(extra: &str) -> String {
    format!(
        "#\n### GENERAL ###\nInclude /etc/ssh/sshd_config.d/*.conf\nUsePAM yes\nX11Forwarding yes\n\
         Subsystem sftp internal-sftp\n#\n### EXTRA CONFIG ###\n{extra}\n"
    )
}

/// Slinky's `BuildLogin`: the Deployment `<loginset>` of `spec.replicas` login pods (no revision
/// history, `spec.strategy`), each running sshd and sackd (`SACKD_OPTIONS=--conf-server
/// <controller>-controller.<ns>:6817`) after `initconf` copied the Slurm key into `/etc/slurm`;
/// sshd's host keys, `sshd_config`, root's `authorized_keys` and `sssd.conf` are mounted from the
/// host keys Secret, `config`, and `spec.sssdConfRef`; the pod template carries their hashes, so a
/// change rolls the login pods.
///
/// # Errors
/// As [`build_loginset_children`].
pub fn build_login_deployment(
    ctx: &BuildContext,
    loginset: &LoginSet,
    controller: &Controller,
    inputs: &LoginSetInputs,
    config: &ConfigMap,
) -> Result<Deployment, BuildError> {
    let name = name_of(&loginset.metadata, "LoginSet")?;
    let controller_name = name_of(&controller.metadata, "Controller")?;
    let spec = &loginset.spec;
    let template_meta = &spec.template.metadata;
    let labels = merge_maps([
        &loginset.metadata.labels.clone().unwrap_or_default(),
        &template_meta.labels,
        &LOGIN.labels(&name),
    ]);
    let annotations = merge_maps([
        &inherited_annotations(&loginset.metadata),
        &template_meta.annotations,
    ]);
    let sshd_config = config
        .data
        .as_ref()
        .and_then(|d| d.get(SSHD_CONFIG))
        .cloned()
        .unwrap_or_default();
    let mut pod_annotations = annotations.clone();
    pod_annotations.extend([
        (
            ANNOTATION_SSH_HOST_KEYS_HASH.to_string(),
            inputs.ssh_host_keys_hash.clone(),
        ),
        (
            keys::ANNOTATION_SSHD_CONF_HASH.to_string(),
            sha256_hex(sshd_config.as_bytes()),
        ),
        (
            keys::ANNOTATION_SSSD_CONF_HASH.to_string(),
            inputs.sssd_conf_hash.clone(),
        ),
        (
            keys::ANNOTATION_DEFAULT_CONTAINER.to_string(),
            LOGIN_NAME.to_string(),
        ),
    ]);
    let login = merge::merge_container(&login_container(controller, &spec.login.0)?, &spec.login.0)
        .map_err(|e| BuildError::invalid(format!("spec.login: {e}")))?;
    let initconf = merge::merge_container(&initconf_container(), &spec.initconf.0)
        .map_err(|e| BuildError::invalid(format!("spec.initconf: {e}")))?;
    let ns = loginset.metadata.namespace.clone().unwrap_or_default();
    let base = PodSpec {
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        containers: vec![login],
        init_containers: Some(vec![initconf]),
        dns_config: Some(PodDNSConfig {
            searches: Some(vec![format!(
                "{}.{ns}.svc.{}",
                super::workers::worker_service_name(&controller_name),
                ctx.cluster_domain
            )]),
            ..Default::default()
        }),
        volumes: Some(login_volumes(loginset, controller)?),
        ..Default::default()
    };
    let pod_spec = merge::merge_pod_spec(&base, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    require_images(&pod_spec, |container| match container {
        LOGIN_NAME => "spec.login.image".to_string(),
        "initconf" => "spec.initconf.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(loginset.login_key()),
            namespace: loginset.metadata.namespace.clone(),
            labels: non_empty(labels.clone()),
            annotations: non_empty(annotations),
            ..Default::default()
        },
        spec: DeploymentSpec {
            replicas: Some(loginset.replicas()),
            revision_history_limit: Some(0),
            strategy: spec.strategy.clone(),
            selector: LabelSelector {
                match_labels: Some(LOGIN.selector_labels(&name)),
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

/// The login container: `SACKD_OPTIONS` naming slurmctld, sshd's port (22, or the user's
/// `login` port: with `hostNetwork` a site moves sshd), ready once sackd's socket exists, the
/// mounts of `/etc/slurm`, sackd's directory, the host keys, `sshd_config`, root's
/// `authorized_keys` and `sssd.conf`.
fn login_container(controller: &Controller, user: &serde_json::Value) -> Result<Container, BuildError> {
    let ssh_port = user
        .get("ports")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| p.get("name").and_then(serde_json::Value::as_str) == Some(LOGIN_NAME))
        .filter_map(|p| p.get("containerPort").and_then(serde_json::Value::as_i64))
        .filter_map(|p| i32::try_from(p).ok())
        .rfind(|p| *p != 0)
        .unwrap_or(LOGIN_SSH_PORT);
    let sub = |path: &str, volume: &str, file: &str| VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        sub_path: Some(file.into()),
        read_only: Some(true),
        ..Default::default()
    };
    let mut mounts = vec![
        mount("slurm-etc", super::conf::SLURM_ETC, true),
        mount("sackd-dir", SACKD_DIR, false),
    ];
    for (file, _) in HOST_KEYS {
        mounts.push(sub(&format!("/etc/ssh/{file}"), "ssh-host-keys", file));
    }
    mounts.extend([
        sub("/etc/ssh/sshd_config", "ssh-config", SSHD_CONFIG),
        sub("/root/.ssh/authorized_keys", "ssh-config", AUTHORIZED_KEYS),
        sub("/etc/sssd/sssd.conf", "sssd-conf", "sssd.conf"),
    ]);
    Ok(Container {
        name: LOGIN_NAME.into(),
        env: Some(vec![plain_env(
            "SACKD_OPTIONS",
            format!("--conf-server {}", conf_server_short(controller)?),
        )]),
        ports: Some(vec![helpers::container_port(LOGIN_NAME, ssh_port)]),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "test".into(),
                    "-S".into(),
                    format!("{SACKD_DIR}/sack.socket"),
                ]),
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    })
}

/// Where sackd fetches its configuration: `<controller>-controller.<ns>:6817`, or the external
/// controller's `host:port` (Slinky's `ConfiglessArgs`).
fn conf_server_short(controller: &Controller) -> Result<String, BuildError> {
    conf_server(controller)
}

/// The `initconf` init container: copies the Slurm configuration and keys into the in-memory
/// `/etc/slurm`, owned by `slurm` (Slinky's `InitconfContainer`).
pub fn initconf_container() -> Container {
    Container {
        name: "initconf".into(),
        env: Some(vec![plain_env("SLURM_USER", super::conf::SLURM_USER.into())]),
        command: Some(vec!["sh".into(), "-c".into(), INITCONF_SCRIPT.into()]),
        volume_mounts: Some(vec![
            mount("slurm-etc", "/mnt/etc/slurm", false),
            mount("slurm-config", "/mnt/slurm", true),
        ]),
        ..Default::default()
    }
}

/// The host keys, each with its file mode (private 0600, public 0644).
const HOST_KEYS: [(&str, i32); 6] = [
    ("ssh_host_rsa_key", 0o600),
    ("ssh_host_rsa_key.pub", 0o644),
    ("ssh_host_ed25519_key", 0o600),
    ("ssh_host_ed25519_key.pub", 0o644),
    ("ssh_host_ecdsa_key", 0o600),
    ("ssh_host_ecdsa_key.pub", 0o644),
];

/// `slurm-etc` and `sackd-dir` (memory), `slurm-config` (the Controller's Slurm key),
/// `ssh-host-keys`, `ssh-config` and `sssd-conf` (projected, mode 0600).
fn login_volumes(loginset: &LoginSet, controller: &Controller) -> Result<Vec<Volume>, BuildError> {
    let slurm_key = controller.spec.slurm_key_ref.as_ref().ok_or_else(|| {
        BuildError::invalid(format!(
            "Controller {}: spec.slurmKeyRef is required (sackd on the login pods authenticates to \
             slurmctld with the Slurm key): set it",
            controller.metadata.name.as_deref().unwrap_or_default()
        ))
    })?;
    let item = |key: &str, path: &str, mode: Option<i32>| KeyToPath {
        key: key.into(),
        path: path.into(),
        mode,
        ..Default::default()
    };
    let projected = |name: &str, source: VolumeProjection| Volume {
        name: name.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o600),
            sources: Some(vec![source]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let secret = |name: &str, items: Vec<KeyToPath>| VolumeProjection {
        secret: Some(SecretProjection {
            name: name.into(),
            items: Some(items),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sssd = &loginset.spec.sssd_conf_ref;
    Ok(vec![
        empty_dir("slurm-etc", Some("Memory")),
        empty_dir("sackd-dir", Some("Memory")),
        projected(
            "slurm-config",
            secret(&slurm_key.name, vec![item(&slurm_key.key, "slurm.key", None)]),
        ),
        projected(
            "ssh-host-keys",
            secret(
                &loginset.ssh_host_keys_name(),
                HOST_KEYS.iter().map(|(f, m)| item(f, f, Some(*m))).collect(),
            ),
        ),
        projected(
            "ssh-config",
            VolumeProjection {
                config_map: Some(ConfigMapProjection {
                    name: loginset.ssh_config_name(),
                    items: Some(vec![
                        item(SSHD_CONFIG, SSHD_CONFIG, Some(0o600)),
                        item(AUTHORIZED_KEYS, AUTHORIZED_KEYS, Some(0o600)),
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ),
        projected(
            "sssd-conf",
            secret(&sssd.name, vec![item(&sssd.key, "sssd.conf", Some(0o600))]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn children() -> Result<Vec<Child>, BuildError> {
        build_loginset_children(
            &BuildContext::default(),
            &testing::example_loginset()?,
            &testing::example_controller()?,
            &LoginSetInputs::example(),
        )
    }

    #[test]
    fn the_example_loginset_is_built_as_slinky_builds_it() -> Result<(), BuildError> {
        let children = children()?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [
                ("Deployment", "slurm-login-slinky"),
                ("Service", "slurm-login-slinky"),
                ("ConfigMap", "slurm-login-slinky-ssh-config")
            ]
        );
        let d = children[0]
            .as_deployment()
            .ok_or_else(|| BuildError::invalid("no Deployment"))?;
        let spec = d.spec.clone();
        let pod = spec.template.spec.clone().unwrap_or_default();
        let login = &pod.containers[0];
        assert_eq!(
            login
                .env
                .as_ref()
                .map(|e| (e[0].name.as_str(), e[0].value.clone())),
            Some((
                "SACKD_OPTIONS",
                Some("--conf-server slurm-controller.slurm:6817".into())
            ))
        );
        assert_eq!(login.ports.as_ref().map(|p| p[0].container_port), Some(22));
        assert_eq!(login.volume_mounts.as_ref().map(Vec::len), Some(11));
        assert_eq!(
            pod.init_containers.as_ref().map(|i| i[0].name.as_str()),
            Some("initconf")
        );
        assert_eq!(
            pod.dns_config.and_then(|d| d.searches),
            Some(vec!["slurm-workers-slurm.slurm.svc.cluster.local".to_string()])
        );
        let annotations = spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        let config = children[2]
            .as_config_map()
            .and_then(|c| c.data.clone())
            .unwrap_or_default();
        assert_eq!(
            annotations.get(keys::ANNOTATION_SSHD_CONF_HASH),
            Some(&sha256_hex(config[SSHD_CONFIG].as_bytes())),
            "the sshd_config built rolls the pods"
        );
        assert_eq!(
            annotations.get(ANNOTATION_SSH_HOST_KEYS_HASH),
            Some(&LoginSetInputs::example().ssh_host_keys_hash)
        );
        assert_eq!(spec.revision_history_limit, Some(0));
        Ok(())
    }

    #[test]
    fn a_user_ssh_port_moves_sshd() -> Result<(), BuildError> {
        let mut l = testing::example_loginset()?;
        l.spec.login.0["ports"] = serde_json::json!([{"name": "login", "containerPort": 2222}]);
        let d = build_login_deployment(
            &BuildContext::default(),
            &l,
            &testing::example_controller()?,
            &LoginSetInputs::example(),
            &build_login_ssh_config(&l)?,
        )?;
        let pod = d.spec.template.spec.unwrap_or_default();
        let ports: Vec<i32> = pod.containers[0]
            .ports
            .iter()
            .flatten()
            .map(|p| p.container_port)
            .collect();
        assert_eq!(ports, [2222]);
        Ok(())
    }

    #[test]
    fn the_ssh_config_is_slinkys() -> Result<(), BuildError> {
        let mut l = testing::example_loginset()?;
        l.spec.root_ssh_authorized_keys = "ssh-ed25519 AAAA user".into();
        l.spec.extra_sshd_config = "PermitRootLogin yes".into();
        let data = build_login_ssh_config(&l)?.data.unwrap_or_default();
        assert_eq!(
            data[AUTHORIZED_KEYS],
            "#\n### SLINKY ###\nssh-ed25519 AAAA user\n"
        );
        assert_eq!(
            data[SSHD_CONFIG],
            "#\n### GENERAL ###\nInclude /etc/ssh/sshd_config.d/*.conf\nUsePAM yes\nX11Forwarding yes\n\
             Subsystem sftp internal-sftp\n#\n### EXTRA CONFIG ###\nPermitRootLogin yes\n"
        );
        Ok(())
    }
}
