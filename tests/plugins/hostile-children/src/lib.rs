//! A deliberately misbehaving `controller-children` and `nodeset-children` builder for
//! slinky-host's tests. What it does is chosen per call by the parent's annotation
//! `hostile.test/behaviour` (the Controller's for `controller-children`, the NodeSet's for
//! `nodeset-children`):
//!
//! | value | behaviour |
//! |---|---|
//! | `secret` | adds a Secret `<parent>-stolen` holding a key |
//! | `other-namespace` | puts its first child in namespace `kube-system` |
//! | `cluster-scoped` | adds a Namespace |
//! | `foreign-name` | adds a ConfigMap `kube-root-ca.crt` (a name that is not the parent's) |
//! | `twice` | lists its first child twice |
//! | `drop-config` | leaves out the ConfigMaps (the host prunes the ones it built) |
//! | `drop-statefulset` | leaves out the slurmctld StatefulSet (the host keeps it and reports it) |
//! | `rename-statefulset` | names the slurmctld StatefulSet `<controller>-slurmctld` (the host would create a second one, with an empty state save claim) |
//! | `second-statefulset` | adds a copy of the slurmctld StatefulSet named `<controller>-controller-b` |
//! | `retention-delete` | asks for claim retention `Delete`/`Delete` on the StatefulSet (the host keeps `Retain`) |
//! | `finalizer` | puts the finalizer `hostile.test/keep` on every child |
//! | `host-path` | mounts the node's `/` (a `hostPath` volume `node-root`) into slurmctld's pods |
//! | `host-path-and-finalizer` | both: the StatefulSet's pods mount the node's `/`, the ConfigMaps carry a finalizer |
//! | `host-network` | runs slurmctld's pods in the node's network namespace |
//! | `service-account` | runs slurmctld's pods as the service account `admin` |
//! | `automount-token` | leaves `automountServiceAccountToken` out of slurmctld's pod template (the token is mounted) |
//! | `privileged` | makes the slurmctld container privileged |
//! | `load-balancer` | makes every Service a `LoadBalancer` |
//! | `external-ips` | gives every Service the external IP `203.0.113.7` |
//! | `wide-pdb` | makes the workers' PodDisruptionBudget select every slurmd pod of the namespace |
//! | anything else | builds Slinky's children |

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, ControllerChildrenBuilder, ControllerInputs, NodeSetChildrenBuilder,
    api::{Controller, NodeSet},
    k8s_openapi::{
        api::{
            apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy,
            core::v1::{ConfigMap, HostPathVolumeSource, PodSpec, SecurityContext, Volume},
        },
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    },
    slinky,
};

/// The hostile builder.
pub struct HostileChildren;

fn behaviour(meta: &ObjectMeta) -> String {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get("hostile.test/behaviour"))
        .cloned()
        .unwrap_or_default()
}

/// The metadata of a child.
fn meta_mut(child: &mut Child) -> Option<&mut ObjectMeta> {
    match child {
        Child::ConfigMap(o) => Some(&mut o.metadata),
        Child::Service(o) => Some(&mut o.metadata),
        Child::StatefulSet(o) => Some(&mut o.metadata),
        Child::PodDisruptionBudget(o) => Some(&mut o.metadata),
        _ => None,
    }
}

/// The pod spec of the StatefulSets' templates.
fn pod_specs(children: &mut [Child]) -> impl Iterator<Item = &mut PodSpec> {
    children.iter_mut().filter_map(|c| match c {
        Child::StatefulSet(s) => s.spec.template.spec.as_mut(),
        _ => None,
    })
}

/// Put the finalizer `hostile.test/keep` on the children `which` selects.
fn add_finalizer(children: &mut [Child], which: impl Fn(&Child) -> bool) {
    for child in children.iter_mut().filter(|c| which(c)) {
        if let Some(meta) = meta_mut(child) {
            meta.finalizers
                .get_or_insert_default()
                .push("hostile.test/keep".into());
        }
    }
}

/// Mount the node's `/` into the StatefulSets' pods.
fn add_host_path(children: &mut [Child]) {
    for spec in pod_specs(children) {
        spec.volumes.get_or_insert_default().push(Volume {
            name: "node-root".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                type_: None,
            }),
            ..Default::default()
        });
    }
}

fn misbehave(mut children: Vec<Child>, meta: &ObjectMeta) -> Result<Vec<Child>, BuildError> {
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone();
    match behaviour(meta).as_str() {
        "other-namespace" => {
            if let Some(Child::ConfigMap(c)) = children.iter_mut().find(|c| c.as_config_map().is_some()) {
                c.metadata.namespace = Some("kube-system".into());
            } else if let Some(Child::Service(s)) = children.first_mut() {
                s.metadata.namespace = Some("kube-system".into());
            }
        }
        "foreign-name" => children.push(
            ConfigMap {
                metadata: ObjectMeta {
                    name: Some("kube-root-ca.crt".into()),
                    namespace,
                    ..Default::default()
                },
                ..Default::default()
            }
            .into(),
        ),
        "twice" => {
            if let Some(first) = children.first().cloned() {
                children.push(first);
            }
        }
        "drop-config" => children.retain(|c| c.as_config_map().is_none()),
        "drop-statefulset" => children.retain(|c| c.as_stateful_set().is_none()),
        "rename-statefulset" | "second-statefulset" => {
            let rename = behaviour(meta) == "rename-statefulset";
            let copy = children.iter_mut().find_map(|c| match c {
                Child::StatefulSet(s) if rename => {
                    s.metadata.name = Some(format!("{name}-slurmctld"));
                    None
                }
                Child::StatefulSet(s) => {
                    let mut copy = s.clone();
                    copy.metadata.name = Some(format!("{name}-controller-b"));
                    Some(copy)
                }
                _ => None,
            });
            children.extend(copy.map(Child::StatefulSet));
        }
        "retention-delete" => {
            for child in &mut children {
                if let Child::StatefulSet(s) = child {
                    s.spec.persistent_volume_claim_retention_policy =
                        Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
                            when_deleted: Some("Delete".into()),
                            when_scaled: Some("Delete".into()),
                        });
                }
            }
        }
        "finalizer" => add_finalizer(&mut children, |_| true),
        "host-path" => add_host_path(&mut children),
        "host-path-and-finalizer" => {
            add_host_path(&mut children);
            add_finalizer(&mut children, |c| c.as_config_map().is_some());
        }
        "host-network" => pod_specs(&mut children).for_each(|s| s.host_network = Some(true)),
        "service-account" => {
            pod_specs(&mut children).for_each(|s| s.service_account_name = Some("admin".into()))
        }
        "automount-token" => pod_specs(&mut children).for_each(|s| s.automount_service_account_token = None),
        "privileged" => pod_specs(&mut children)
            .flat_map(|s| s.containers.iter_mut())
            .filter(|c| c.name == "slurmctld")
            .for_each(|c| {
                c.security_context
                    .get_or_insert_with(SecurityContext::default)
                    .privileged = Some(true)
            }),
        "load-balancer" | "external-ips" => {
            let behaviour = behaviour(meta);
            for child in &mut children {
                if let Child::Service(s) = child
                    && let Some(spec) = s.spec.as_mut()
                {
                    if behaviour == "load-balancer" {
                        spec.type_ = Some("LoadBalancer".into());
                        spec.cluster_ip = None;
                    } else {
                        spec.external_ips = Some(vec!["203.0.113.7".into()]);
                    }
                }
            }
        }
        "wide-pdb" => {
            for child in &mut children {
                if let Child::PodDisruptionBudget(p) = child
                    && let Some(selector) = p.spec.as_mut().and_then(|s| s.selector.as_mut())
                {
                    selector.match_labels =
                        Some([("app.kubernetes.io/name".to_string(), "slurmd".to_string())].into());
                }
            }
        }
        "secret" => children.push(Child::Json(Box::new(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{name}-stolen"), "namespace": namespace},
            "stringData": {"key": "value"},
        })))),
        "cluster-scoped" => children.push(Child::Json(Box::new(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("{name}-escape")},
        })))),
        _ => {}
    }
    Ok(children)
}

impl ControllerChildrenBuilder for HostileChildren {
    fn build_controller_children(
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, BuildError> {
        misbehave(
            slinky::build_controller_children(ctx, controller, inputs)?,
            &controller.metadata,
        )
    }
}

impl NodeSetChildrenBuilder for HostileChildren {
    fn build_nodeset_children(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError> {
        misbehave(
            slinky::build_nodeset_children(ctx, nodeset, controller)?,
            &nodeset.metadata,
        )
    }
}

slinky_guest_sdk::export_plugin!(HostileChildren, kinds = [controller_children, nodeset_children]);
