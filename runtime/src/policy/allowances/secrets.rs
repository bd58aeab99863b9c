//! The Secrets a pod may reference: those its parent's spec names (its template, its container
//! fields, its key references, and the Controller's keys its pods use by Slinky's design) and
//! those the same output creates. Any other is a Secret of the parent's namespace nothing asked
//! for (another workload's credentials, a token): a builder step could hand it to a container,
//! so it is refused unless the host allows `secrets`.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, PodSpec};

use super::{Allow, Allowances, refused};

/// Every Secret `c` references in its environment: `(field, name)`.
pub(super) fn in_container(c: &Container, at: &str) -> Vec<(String, String)> {
    in_environment(c.env.as_deref(), c.env_from.as_deref(), at)
}

/// Every Secret an environment (`env`, `envFrom`) references: `(field, name)`.
fn in_environment(
    env: Option<&[EnvVar]>,
    env_from: Option<&[EnvFromSource]>,
    at: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in env.into_iter().flatten() {
        if let Some(r) = e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()) {
            out.push((
                format!("{at}.env[name={}].valueFrom.secretKeyRef.name", e.name),
                r.name.clone(),
            ));
        }
    }
    for (i, f) in env_from.into_iter().flatten().enumerate() {
        if let Some(r) = &f.secret_ref {
            out.push((format!("{at}.envFrom[{i}].secretRef.name"), r.name.clone()));
        }
    }
    out
}

/// Every Secret `spec` references (volumes, projected sources, containers' environment, image
/// pull secrets): `(field, name)`.
pub(super) fn in_pod(spec: &PodSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            out.push((format!("spec.volumes[name={}].secret.secretName", v.name), name));
        }
        // Secrets the kubelet reads and hands to a volume driver (a secrets-store CSI driver
        // turns one into files).
        let driver_refs = [
            (
                "csi.nodePublishSecretRef",
                v.csi
                    .as_ref()
                    .and_then(|c| c.node_publish_secret_ref.as_ref())
                    .map(|r| r.name.clone()),
            ),
            (
                "flexVolume.secretRef",
                v.flex_volume
                    .as_ref()
                    .and_then(|f| f.secret_ref.as_ref())
                    .map(|r| r.name.clone()),
            ),
            (
                "azureFile.secretName",
                v.azure_file.as_ref().map(|a| a.secret_name.clone()),
            ),
            (
                "cephfs.secretRef",
                v.cephfs
                    .as_ref()
                    .and_then(|c| c.secret_ref.as_ref())
                    .map(|r| r.name.clone()),
            ),
            (
                "rbd.secretRef",
                v.rbd
                    .as_ref()
                    .and_then(|c| c.secret_ref.as_ref())
                    .map(|r| r.name.clone()),
            ),
            (
                "iscsi.secretRef",
                v.iscsi
                    .as_ref()
                    .and_then(|c| c.secret_ref.as_ref())
                    .map(|r| r.name.clone()),
            ),
            (
                "scaleIO.secretRef",
                v.scale_io.as_ref().map(|c| c.secret_ref.name.clone()),
            ),
            (
                "storageos.secretRef",
                v.storageos
                    .as_ref()
                    .and_then(|c| c.secret_ref.as_ref())
                    .map(|r| r.name.clone()),
            ),
        ];
        for (field, name) in driver_refs {
            if let Some(name) = name {
                out.push((format!("spec.volumes[name={}].{field}", v.name), name));
            }
        }
        let sources = v.projected.iter().flat_map(|p| p.sources.iter().flatten());
        for (i, s) in sources.enumerate() {
            if let Some(secret) = &s.secret {
                out.push((
                    format!("spec.volumes[name={}].projected.sources[{i}].secret.name", v.name),
                    secret.name.clone(),
                ));
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .map(|c| (format!("spec.containers[name={}]", c.name), c))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| (format!("spec.initContainers[name={}]", c.name), c)),
        );
    for (at, c) in containers {
        out.extend(in_container(c, &at));
    }
    for e in spec.ephemeral_containers.iter().flatten() {
        let at = format!("spec.ephemeralContainers[name={}]", e.name);
        out.extend(in_environment(e.env.as_deref(), e.env_from.as_deref(), &at));
    }
    for (i, r) in spec.image_pull_secrets.iter().flatten().enumerate() {
        out.push((format!("spec.imagePullSecrets[{i}].name"), r.name.clone()));
    }
    out
}

/// Every Secret `spec` references is in `granted`, unless `allow`ed; `whose` names the parent.
///
/// # Errors
/// The first reference past the grant.
pub(super) fn check(
    spec: &PodSpec,
    granted: &BTreeSet<String>,
    whose: &str,
    allow: &Allowances,
) -> Result<(), String> {
    if allow.allows(Allow::Secrets) {
        return Ok(());
    }
    match in_pod(spec).into_iter().find(|(_, name)| !granted.contains(name)) {
        None => Ok(()),
        Some((field, name)) => Err(refused(
            &field,
            &format!("is {name:?}"),
            "the pod would read a Secret of the namespace that nothing asked for (another workload's \
             credentials)",
            &format!(
                "the {whose}'s spec names only {:?} (its template, its containers, its keys and the \
                 Controller's), and this output creates no such Secret",
                granted.iter().collect::<Vec<_>>()
            ),
            Allow::Secrets,
        )),
    }
}
