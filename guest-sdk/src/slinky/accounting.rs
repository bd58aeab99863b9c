//! Slinky's Accounting builders (`accountingbuilder`): the slurmdbd StatefulSet and its Service,
//! both `<accounting>-accounting`, port 6819, and the Secret `<accounting>-accounting` holding
//! `slurmdbd.conf`.
//!
//! The database password is not the builder's to see: `slurmdbd.conf` carries the placeholder of
//! `spec.storageConfig.passwordKeyRef` ([`secret_refs::slurm_placeholder`]) and the host writes the
//! value into the Secret, escaped for Slurm's parser. Differences from Slinky, deliberate: the pod
//! template carries `spec.template.metadata` (Slinky's slurmdbd pods drop the template's labels and
//! annotations, which its other components keep), a password with `#` or a space is written
//! so slurmdbd reads it whole (Slinky's is cut at the `#`), and a slurmdbd older than 25.11 (or
//! of an image whose tag names no release) reads copies of its files made by an `initconf` init
//! container, mode 0600 and owned by `slurm`, as it requires (Slinky's pod, built for 25.11, mounts
//! the Secret's files, which such a slurmdbd refuses: `should be 600 is 640`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{StatefulSet, StatefulSetSpec},
        core::v1::{
            ConfigMapProjection, Container, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
            ProjectedVolumeSource, Secret, SecretProjection, SecurityContext, Service, TCPSocketAction,
            Volume, VolumeProjection,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use slinky_api::{
    Accounting, DEFAULT_STORAGE_DATABASE, DEFAULT_STORAGE_PORT, SLURMDBD_CONF, SLURMDBD_PORT,
    contract::secret_refs, keys,
};

use super::{
    component_service,
    conf::{JWKS_FILE, JWT_KEY_FILE, SLURM_ETC, SLURM_USER, merged_config},
    controller::empty_dir,
    inherited_annotations, mount, name_of, require_images,
};
use crate::{
    AccountingInputs, BuildContext, BuildError, Child,
    helpers::{self, ACCOUNTING, merge_maps, non_empty},
    merge,
};

/// The slurmdbd container's (and port's) name.
const SLURMDBD: &str = "slurmdbd";
/// slurmdbd's user and group (`slurm`, 401 in Slinky's images).
pub const SLURM_UID: i64 = 401;
/// `slinky.slurm.net/slurmdbd-conf-hash`.
pub const ANNOTATION_SLURMDBD_CONF_HASH: &str = "slinky.slurm.net/slurmdbd-conf-hash";

/// Slinky's Accounting children: the Service (`BuildAccountingService`), the `slurmdbd.conf`
/// Secret (`BuildAccountingConfig`) and the StatefulSet (`BuildAccounting`), all
/// `<accounting>-accounting`; none for an external Accounting.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Accounting, a missing key or password reference,
/// an invalid container, pod spec or `spec.service`, or no slurmdbd image.
pub fn build_accounting_children(
    ctx: &BuildContext,
    accounting: &Accounting,
    inputs: &AccountingInputs,
) -> Result<Vec<Child>, BuildError> {
    if accounting.spec.external {
        return Ok(Vec::new());
    }
    Ok(vec![
        build_accounting_service(accounting)?.into(),
        build_accounting_config(accounting)?.into(),
        build_accounting_statefulset(ctx, accounting, inputs)?.into(),
    ])
}

/// Slinky's `BuildAccountingService`: `<accounting>-accounting` selecting the slurmdbd pod, port
/// `slurmdbd` 6819 (`spec.service.port` changes it), the user's `spec.service` as the base.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Accounting, an invalid `spec.service` or a user
/// port that clashes with slurmdbd's.
pub fn build_accounting_service(accounting: &Accounting) -> Result<Service, BuildError> {
    let name = name_of(&accounting.metadata, "Accounting")?;
    let svc = &accounting.spec.service;
    let port = helpers::service_port(SLURMDBD, svc.port.unwrap_or(SLURMDBD_PORT), SLURMDBD);
    component_service(
        &accounting.metadata,
        svc,
        accounting.accounting_key(),
        &ACCOUNTING.labels(&name),
        ACCOUNTING.selector_labels(&name),
        port,
    )
}

/// Slinky's `BuildAccountingConfig`: the Secret `<accounting>-accounting` holding
/// `slurmdbd.conf`, its password a placeholder the host fills.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed Accounting or a missing password reference.
pub fn build_accounting_config(accounting: &Accounting) -> Result<Secret, BuildError> {
    let name = name_of(&accounting.metadata, "Accounting")?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(accounting.accounting_key()),
            namespace: accounting.metadata.namespace.clone(),
            labels: non_empty(merge_maps([
                &accounting.metadata.labels.clone().unwrap_or_default(),
                &ACCOUNTING.labels(&name),
            ])),
            annotations: non_empty(inherited_annotations(&accounting.metadata)),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            SLURMDBD_CONF.to_string(),
            slurmdbd_conf(accounting)?,
        )])),
        immutable: Some(false),
        ..Default::default()
    })
}

/// `slurmdbd.conf` as Slinky writes it (`buildSlurmdbdConf`): GENERAL (`DbdHost` the pod,
/// `DbdPort`, `SlurmUser`), PLUGINS & PARAMETERS (auth, JWT), STORAGE (MySQL/MariaDB: host,
/// port, user, database, and the password's placeholder), LOGGING, then `spec.extraConf` and the
/// MERGED CONFIG of the keys it overrides.
///
/// # Errors
/// [`BuildError::InvalidInput`] when `spec.storageConfig.passwordKeyRef` names no Secret and key.
pub fn slurmdbd_conf(accounting: &Accounting) -> Result<String, BuildError> {
    let spec = &accounting.spec;
    let storage = &spec.storage_config;
    let pass = &storage.password_key_ref;
    if pass.name.is_empty() || pass.key.is_empty() {
        return Err(BuildError::invalid(
            "spec.storageConfig.passwordKeyRef is required: name the Secret and key holding the \
             database user's password",
        ));
    }
    let mut alt = vec![format!("jwt_key={SLURM_ETC}/{JWT_KEY_FILE}")];
    if spec.jwks_key_ref.is_some() {
        alt.push(format!("jwks={SLURM_ETC}/{JWKS_FILE}"));
    }
    let merge = BTreeMap::from([
        ("AuthAltParameters", alt.clone()),
        ("AuthInfo", vec!["use_client_ids".to_string()]),
    ]);
    let mut lines = vec![
        "#".to_string(),
        "### GENERAL ###".into(),
        format!("DbdHost={}", accounting.primary_name()),
        format!("DbdPort={SLURMDBD_PORT}"),
        format!("SlurmUser={SLURM_USER}"),
        "#".into(),
        "### PLUGINS & PARAMETERS ###".into(),
        "AuthType=auth/slurm".into(),
        "AuthAltTypes=auth/jwt".into(),
        format!("AuthAltParameters={}", alt.join(",")),
        "AuthInfo=use_client_ids".into(),
        "#".into(),
        "### STORAGE ###".into(),
        "StorageType=accounting_storage/mysql".into(),
        format!("StorageHost={}", storage.host),
        format!("StoragePort={}", storage.port.unwrap_or(DEFAULT_STORAGE_PORT)),
        format!("StorageUser={}", storage.username.as_deref().unwrap_or_default()),
        format!(
            "StorageLoc={}",
            storage.database.as_deref().unwrap_or(DEFAULT_STORAGE_DATABASE)
        ),
        format!(
            "StoragePass={}",
            secret_refs::slurm_placeholder(&pass.name, &pass.key)
        ),
        "#".into(),
        "### LOGGING ###".into(),
        "LogFile=/dev/null".into(),
    ];
    if !spec.extra_conf.is_empty() {
        lines.extend(["#".into(), "### EXTRA CONFIG ###".into(), spec.extra_conf.clone()]);
    }
    let merged = merged_config(&spec.extra_conf, &merge);
    if !merged.is_empty() {
        lines.extend(["#".into(), "### MERGED CONFIG ###".into(), merged]);
    }
    lines.push(String::new());
    Ok(lines.join("\n"))
}

/// Slinky's `BuildAccounting`: the StatefulSet `<accounting>-accounting` of one slurmdbd (Parallel,
/// no revision history, governed by its Service), running as `slurm` (401) with `/etc/slurm`
/// holding `slurmdbd.conf` and the keys; the pod template carries the key and `slurmdbd.conf`
/// hashes, so a change rolls slurmdbd.
///
/// # Errors
/// As [`build_accounting_children`].
pub fn build_accounting_statefulset(
    _ctx: &BuildContext,
    accounting: &Accounting,
    inputs: &AccountingInputs,
) -> Result<StatefulSet, BuildError> {
    let name = name_of(&accounting.metadata, "Accounting")?;
    let spec = &accounting.spec;
    let template_meta = &spec.template.metadata;
    let own = accounting.metadata.labels.clone().unwrap_or_default();
    let labels = merge_maps([&own, &template_meta.labels, &ACCOUNTING.labels(&name)]);
    let annotations = merge_maps([
        &inherited_annotations(&accounting.metadata),
        &template_meta.annotations,
    ]);
    let mut pod_annotations = annotations.clone();
    pod_annotations.extend([
        (
            keys::ANNOTATION_SLURM_KEY_HASH.to_string(),
            inputs.slurm_key_hash.clone(),
        ),
        (
            keys::ANNOTATION_JWT_KEY_HASH.to_string(),
            inputs.jwt_key_hash.clone(),
        ),
        (
            ANNOTATION_SLURMDBD_CONF_HASH.to_string(),
            inputs.slurmdbd_conf_hash.clone(),
        ),
        (
            keys::ANNOTATION_DEFAULT_CONTAINER.to_string(),
            SLURMDBD.to_string(),
        ),
    ]);
    let mut slurmdbd = merge::merge_container(&slurmdbd_container(), &spec.slurmdbd.0)
        .map_err(|e| BuildError::invalid(format!("spec.slurmdbd: {e}")))?;
    let mut volumes = vec![slurm_etc(accounting)?, empty_dir("run", Some("Memory"))];
    let mut init_containers = Vec::new();
    let image = slurmdbd.image.clone().unwrap_or_default();
    if needs_private_conf(&image) {
        // slurmdbd before 25.11 wants slurmdbd.conf mode 0600 and owned by SlurmUser; a kubelet
        // mounts Secret files root-owned (group fsGroup): copy them into memory as 401, 0600.
        init_containers.push(initconf_container(&image));
        volumes.push(empty_dir(PRIVATE_ETC, Some("Memory")));
        for m in slurmdbd.volume_mounts.iter_mut().flatten() {
            if m.mount_path == SLURM_ETC && m.name == "slurm-etc" {
                m.name = PRIVATE_ETC.into();
            }
        }
    }
    let base = PodSpec {
        automount_service_account_token: Some(false),
        init_containers: non_empty_vec(init_containers),
        containers: vec![slurmdbd],
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
    let pod_spec = merge::merge_pod_spec(&base, &spec.template.spec.0)
        .map_err(|e| BuildError::invalid(format!("spec.template.spec: {e}")))?;
    require_images(&pod_spec, |container| match container {
        SLURMDBD => "spec.slurmdbd.image".to_string(),
        other => format!("spec.template.spec.containers[name={other}].image"),
    })?;
    Ok(StatefulSet {
        metadata: ObjectMeta {
            name: Some(accounting.accounting_key()),
            namespace: accounting.metadata.namespace.clone(),
            labels: non_empty(labels.clone()),
            annotations: non_empty(annotations),
            ..Default::default()
        },
        spec: StatefulSetSpec {
            pod_management_policy: Some("Parallel".into()),
            replicas: Some(1),
            revision_history_limit: Some(0),
            selector: LabelSelector {
                match_labels: Some(ACCOUNTING.selector_labels(&name)),
                ..Default::default()
            },
            service_name: Some(accounting.accounting_key()),
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

/// The in-memory `/etc/slurm` of a slurmdbd older than 25.11 (its files copied by `initconf`).
const PRIVATE_ETC: &str = "slurm-etc-private";
/// Where `initconf` reads the projected `slurm-etc` volume.
const PROJECTED_ETC: &str = "/mnt/slurm";
/// The first Slurm release whose slurmdbd reads a `slurmdbd.conf` a kubelet mounts (group
/// readable, owned by root): Slinky dropped its `initconf` copy step with it.
const KUBELET_CONF_SINCE: (u32, u32) = (25, 11);

/// Whether slurmdbd of `image` needs its files copied (an older release, or a tag that names
/// none: the copy is harmless to a newer slurmdbd, a missing one fatal to an older).
fn needs_private_conf(image: &str) -> bool {
    super::controller::slurm_release_of_image(image).is_none_or(|r| r < KUBELET_CONF_SINCE)
}

/// `initconf` (Slinky's before 25.11): copies the projected files into the in-memory `/etc/slurm`
/// as `slurm` (401) with mode 0600, as slurmdbd before 25.11 requires of `slurmdbd.conf`
/// (`should be 600`, `owned by … not SlurmUser`).
fn initconf_container(image: &str) -> Container {
    Container {
        name: "initconf".into(),
        image: Some(image.to_string()),
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            format!("install -m 0600 {PROJECTED_ETC}/* {SLURM_ETC}/"),
        ]),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SLURM_UID),
            run_as_group: Some(SLURM_UID),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            mount("slurm-etc", PROJECTED_ETC, true),
            mount(PRIVATE_ETC, SLURM_ETC, false),
        ]),
        ..Default::default()
    }
}

fn non_empty_vec<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

/// The slurmdbd container: port 6819, ready once it listens, as `slurm` (401), `/etc/slurm`
/// read-only and `/run`.
fn slurmdbd_container() -> Container {
    Container {
        name: SLURMDBD.into(),
        ports: Some(vec![helpers::container_port(SLURMDBD, SLURMDBD_PORT)]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(SLURMDBD_PORT),
                ..Default::default()
            }),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SLURM_UID),
            run_as_group: Some(SLURM_UID),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            mount("slurm-etc", SLURM_ETC, true),
            mount("run", "/run", false),
        ]),
        ..Default::default()
    }
}

/// `slurm-etc` (projected, mode 0600): `slurmdbd.conf` from the Accounting's Secret, the Slurm
/// key as `slurm.key`, the JWT key as `jwt.key`, and the JWKS as `jwks.json`.
fn slurm_etc(accounting: &Accounting) -> Result<Volume, BuildError> {
    let spec = &accounting.spec;
    let missing = |field: &str| {
        BuildError::invalid(format!(
            "spec.{field} is required (a Secret holding the key; the Controller's): set it"
        ))
    };
    let slurm_key = spec
        .slurm_key_ref
        .as_ref()
        .ok_or_else(|| missing("slurmKeyRef"))?;
    let jwt_key = spec.jwt_key_ref.as_ref().ok_or_else(|| missing("jwtKeyRef"))?;
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
    let mut sources = vec![
        secret(&accounting.accounting_key(), SLURMDBD_CONF, SLURMDBD_CONF),
        secret(&slurm_key.name, &slurm_key.key, "slurm.key"),
        secret(&jwt_key.name, &jwt_key.key, JWT_KEY_FILE),
    ];
    if let Some(jwks) = &spec.jwks_key_ref {
        sources.push(VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: jwks.name.clone(),
                items: Some(vec![KeyToPath {
                    key: jwks.key.clone(),
                    path: JWKS_FILE.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    Ok(Volume {
        name: "slurm-etc".into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o600),
            sources: Some(sources),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn the_example_accounting_is_built_as_slinky_builds_it() -> Result<(), BuildError> {
        let acct = testing::example_accounting()?;
        let children =
            build_accounting_children(&BuildContext::default(), &acct, &AccountingInputs::example())?;
        let names: Vec<(&str, &str)> = children.iter().map(|c| (c.kind(), c.name())).collect();
        assert_eq!(
            names,
            [
                ("Service", "slurm-accounting"),
                ("Secret", "slurm-accounting"),
                ("StatefulSet", "slurm-accounting")
            ]
        );
        let sts = children[2]
            .as_stateful_set()
            .ok_or_else(|| BuildError::invalid("no StatefulSet"))?;
        assert_eq!(sts.spec.service_name.as_deref(), Some("slurm-accounting"));
        assert_eq!(sts.spec.pod_management_policy.as_deref(), Some("Parallel"));
        let annotations = sts
            .spec
            .template
            .metadata
            .clone()
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        assert_eq!(
            annotations.get(ANNOTATION_SLURMDBD_CONF_HASH),
            Some(&AccountingInputs::example().slurmdbd_conf_hash)
        );
        let conf = children[1]
            .as_secret()
            .and_then(|s| s.string_data.clone())
            .unwrap_or_default()
            .remove(SLURMDBD_CONF)
            .unwrap_or_default();
        assert_eq!(
            conf,
            "#\n### GENERAL ###\nDbdHost=slurm-accounting-0\nDbdPort=6819\nSlurmUser=slurm\n#\n\
             ### PLUGINS & PARAMETERS ###\nAuthType=auth/slurm\nAuthAltTypes=auth/jwt\n\
             AuthAltParameters=jwt_key=/etc/slurm/jwt.key\nAuthInfo=use_client_ids\n#\n### STORAGE ###\n\
             StorageType=accounting_storage/mysql\nStorageHost=mariadb\nStoragePort=3306\nStorageUser=slurm\n\
             StorageLoc=slurm_acct_db\nStoragePass=${secretKeyRef:mariadb-password/password|slurm}\n#\n\
             ### LOGGING ###\nLogFile=/dev/null\n"
        );
        Ok(())
    }

    #[test]
    fn extra_conf_and_merged_keys_come_last() -> Result<(), BuildError> {
        let mut acct = testing::example_accounting()?;
        acct.spec.extra_conf = "AuthInfo=cred_expire=70\nPurgeJobAfter=12month".into();
        let conf = slurmdbd_conf(&acct)?;
        assert!(
            conf.ends_with(
                "### EXTRA CONFIG ###\nAuthInfo=cred_expire=70\nPurgeJobAfter=12month\n#\n\
                 ### MERGED CONFIG ###\nAuthInfo=cred_expire=70,use_client_ids\n"
            ),
            "{conf}"
        );
        let mut external = acct.clone();
        external.spec.external = true;
        assert_eq!(
            build_accounting_children(&BuildContext::default(), &external, &AccountingInputs::example())?,
            []
        );
        Ok(())
    }
}
