//! A NodeSet's children besides its pods: Slinky's `BuildClusterWorkerService`,
//! `BuildClusterWorkerPodDisruptionBudget` (shared by every NodeSet of a Controller) and
//! `BuildWorkerSshConfig`.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, Service, ServiceSpec},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta},
        util::intstr::IntOrString,
    },
};
use slinky_api::{Controller, NodeSet, checks::WORKER_SUBDOMAIN_PREFIX, keys};

use super::{SLURMD_PORT, conf, inherited_annotations, name_of};
use crate::{
    BuildContext, BuildError, Child,
    helpers::{self, Labels, WORKER, merge_maps, non_empty},
};

/// `slurm-workers-<controller>`: the workers' headless Service (their pods' subdomain).
pub fn worker_service_name(controller: &str) -> String {
    format!("{WORKER_SUBDOMAIN_PREFIX}{controller}")
}

/// `slurm-workers-pdb-<controller>`: the workers' PodDisruptionBudget.
pub fn worker_pdb_name(controller: &str) -> String {
    format!("{WORKER_SUBDOMAIN_PREFIX}pdb-{controller}")
}

/// Slinky's NodeSet children besides its pods: the workers' Service and PodDisruptionBudget of
/// its Controller (shared: the host makes every NodeSet of the Controller their owner) and, with
/// SSH on, the ConfigMap `<nodeset>-ssh-config`.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed NodeSet or one without `spec.controllerRef.name`.
pub fn build_nodeset_children(
    _ctx: &BuildContext,
    nodeset: &NodeSet,
    _controller: &Controller,
) -> Result<Vec<Child>, BuildError> {
    let mut children: Vec<Child> = vec![
        build_worker_service(nodeset)?.into(),
        build_worker_pdb(nodeset)?.into(),
    ];
    if nodeset.spec.ssh.as_ref().is_some_and(|s| s.enabled) {
        children.push(build_worker_ssh_config(nodeset)?.into());
    }
    Ok(children)
}

fn cluster_of(nodeset: &NodeSet) -> Result<&str, BuildError> {
    let cluster = nodeset.spec.controller_ref.name.as_str();
    if cluster.is_empty() {
        return Err(BuildError::invalid(
            "spec.controllerRef.name is required: name the Controller these workers join",
        ));
    }
    Ok(cluster)
}

/// Slinky's `BuildClusterWorkerService`: headless, no labels, selector `app.kubernetes.io/name=
/// slurmd` and `slinky.slurm.net/cluster=<controller>`, port `slurmd` 6818.
///
/// # Errors
/// [`BuildError::InvalidInput`] for a NodeSet without `spec.controllerRef.name`.
pub fn build_worker_service(nodeset: &NodeSet) -> Result<Service, BuildError> {
    let cluster = cluster_of(nodeset)?;
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(worker_service_name(cluster)),
            namespace: nodeset.metadata.namespace.clone(),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([
                (keys::LABEL_NAME.to_string(), WORKER.name.to_string()),
                (keys::LABEL_CLUSTER.to_string(), cluster.to_string()),
            ])),
            ports: Some(vec![helpers::service_port("slurmd", SLURMD_PORT, "slurmd")]),
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    })
}

/// Slinky's `BuildClusterWorkerPodDisruptionBudget`: `maxUnavailable: 0` over the protected pods
/// (`nodeset.slinky.slurm.net/pod-protect=true`) of the cluster: a worker running jobs is not
/// evicted.
///
/// # Errors
/// [`BuildError::InvalidInput`] for a NodeSet without `spec.controllerRef.name`.
pub fn build_worker_pdb(nodeset: &NodeSet) -> Result<PodDisruptionBudget, BuildError> {
    let cluster = cluster_of(nodeset)?;
    Ok(PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(worker_pdb_name(cluster)),
            namespace: nodeset.metadata.namespace.clone(),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (keys::LABEL_POD_PROTECT.to_string(), "true".to_string()),
                    (keys::LABEL_CLUSTER.to_string(), cluster.to_string()),
                ])),
                ..Default::default()
            }),
            max_unavailable: Some(IntOrString::Int(0)),
            ..Default::default()
        }),
        status: None,
    })
}

/// Slinky's `BuildWorkerSshConfig`: `<nodeset>-ssh-config` holding `sshd_config`, with the
/// NodeSet's annotations and its labels plus the worker labels.
///
/// # Errors
/// [`BuildError::InvalidInput`] for an unnamed NodeSet.
pub fn build_worker_ssh_config(nodeset: &NodeSet) -> Result<ConfigMap, BuildError> {
    let name = name_of(&nodeset.metadata, "NodeSet")?;
    let extra = nodeset
        .spec
        .ssh
        .as_ref()
        .and_then(|s| s.extra_sshd_config.clone())
        .unwrap_or_default();
    let labels: Labels = merge_maps([
        &nodeset.metadata.labels.clone().unwrap_or_default(),
        &helpers::worker_labels(&name, &nodeset.spec.controller_ref.name),
    ]);
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(nodeset.ssh_config_name()),
            namespace: nodeset.metadata.namespace.clone(),
            labels: non_empty(labels),
            annotations: non_empty(inherited_annotations(&nodeset.metadata)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            conf::SSHD_CONFIG.to_string(),
            conf::sshd_config(&extra),
        )])),
        immutable: Some(false),
        ..Default::default()
    })
}
