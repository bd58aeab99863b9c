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
//! | `retention-delete` | asks for claim retention `Delete`/`Delete` on the StatefulSet (the host keeps `Retain`) |
//! | anything else | builds Slinky's children |

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, ControllerChildrenBuilder, ControllerInputs, NodeSetChildrenBuilder,
    api::{Controller, NodeSet},
    k8s_openapi::{
        api::{apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy, core::v1::ConfigMap},
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
