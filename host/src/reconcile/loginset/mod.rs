//! The LoginSet: the login pods' host keys Secret (made here, by the host), then the
//! Deployment, Service and `sshd_config` ConfigMap (`loginset-children` builder), through the
//! generic component pass ([`crate::reconcile::component`]); status `replicas` and `selector`.
//!
//! # Guarantees
//! * The builder gets copies of the LoginSet and its Controller, and hashes of the Secrets it
//!   needs: never a Secret's data. The host keys are generated here, once per LoginSet, into the
//!   immutable Secret `<loginset>-ssh-host-keys` controlled by the LoginSet (so they survive every
//!   roll of the login pods, and go with the LoginSet); a Secret of that name the LoginSet does not
//!   control is left alone (`ChildFailure`, `NotOwned`).
//! * A missing Controller is `ControllerNotFound`; a missing `sssd.conf` Secret (or key) is
//!   `ReferenceNotFound`: the children wait (the existing ones stay). The pass runs again when
//!   the Controller appears (its watch triggers the LoginSet); a missing reference is retried
//!   with backoff.

mod host_keys;

use std::sync::Arc;

use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{
    Api, ResourceExt,
    runtime::{events::EventType, reflector::ObjectRef},
};
use serde_json::Value;
use slinky_api::{
    Controller, LoginSet, LoginSetStatus, checks, contract::LoginSetInputs, failure::Failure, owners,
};

use super::{
    component::{Component, ComponentContext, controller_of},
    core::{Error, apply::ChildSync, caches::Caches, writer},
};
use crate::plugins::{BuildContext, Builder as _, BuilderKind, Child, ChildKind, Pipeline, PluginError};

impl Component for LoginSet {
    const BUILDER: BuilderKind = BuilderKind::LoginsetChildren;
    const CHILD_KINDS: &'static [ChildKind] =
        &[ChildKind::Deployment, ChildKind::Service, ChildKind::ConfigMap];
    type Inputs = (Arc<Controller>, LoginSetInputs);

    fn spec_problem(&self) -> Option<String> {
        checks::summary(&self.spec_problems())
    }

    async fn inputs(
        &self,
        ctx: &ComponentContext,
        sync: &mut ChildSync<'_, Self>,
    ) -> Result<Result<Self::Inputs, Option<Failure>>, Error> {
        let ns = self.namespace().unwrap_or_default();
        let controller =
            match controller_of(&ctx.caches, &ns, &self.spec.controller_ref.name, "the login pods") {
                Ok(c) => c,
                Err(f) => return Ok(Err(Some(f))),
            };
        let api: Api<Secret> = Api::namespaced(ctx.core.client.clone(), &ns);
        let sssd = api.get_opt(&self.spec.sssd_conf_ref.name).await?;
        if let (_, Some(missing)) = LoginSetInputs::gather(self, None, |_| sssd.as_ref()) {
            let message = format!(
                "{}: the login pods mount it, and wait for it (the existing ones are kept)",
                missing.describe(&ns)
            );
            return Ok(Err(Some(Failure::reference_not_found(missing.reason(), message))));
        }
        let Some(keys) = host_keys(ctx, self, &api, sync).await? else {
            return Ok(Err(None));
        };
        let (inputs, _) = LoginSetInputs::gather(self, Some(&keys), |_| sssd.as_ref());
        Ok(Ok((controller, inputs)))
    }

    fn build(
        &self,
        builder: &Pipeline,
        ctx: &BuildContext,
        (controller, inputs): &Self::Inputs,
    ) -> Result<Vec<Child>, PluginError> {
        builder.build_loginset_children(ctx, self, controller, inputs)
    }

    fn made_by_host(&self) -> Option<String> {
        Some(format!("Secret {}", self.ssh_host_keys_name()))
    }

    fn readiness(&self, caches: &Caches) -> Option<String> {
        let (ready, _) = login_pods(self, caches)?;
        Some(format!("login {ready}/{} ready", self.replicas()))
    }

    fn status_after(&self, _: &Self, conditions: Vec<Condition>, caches: &Caches) -> LoginSetStatus {
        let selector = slinky_api::labels::LOGIN
            .selector_labels(&self.name_any())
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        LoginSetStatus {
            replicas: login_pods(self, caches)
                .map(|(_, replicas)| replicas)
                .unwrap_or(0),
            selector,
            observed_generation: self.metadata.generation,
            conditions,
        }
    }
}

/// The login pods' ready count and count, as their Deployment reports them.
fn login_pods(l: &LoginSet, caches: &Caches) -> Option<(i32, i32)> {
    let key = ObjectRef::new(&l.login_key()).within(&l.namespace().unwrap_or_default());
    let status = caches
        .children
        .deployments
        .get(&key)?
        .status
        .clone()
        .unwrap_or_default();
    Some((status.ready_replicas.unwrap_or(0), status.replicas.unwrap_or(0)))
}

/// The LoginSet's host keys Secret: read, or made and created when it does not exist. `None`
/// when it cannot be had this pass (a failure of `sync`: not the LoginSet's, or refused).
async fn host_keys(
    ctx: &ComponentContext,
    l: &LoginSet,
    api: &Api<Secret>,
    sync: &mut ChildSync<'_, LoginSet>,
) -> Result<Option<Secret>, Error> {
    let name = l.ssh_host_keys_name();
    let uid = l.uid().unwrap_or_default();
    if let Some(found) = api.get_opt(&name).await? {
        if owners::controller_uid(found.owner_references(), "LoginSet") == Some(uid.as_str()) {
            return Ok(Some(found));
        }
        let msg = format!(
            "Secret {name} exists and is not this LoginSet's: it is left alone (its keys are not \
             sshd's of these login pods); delete it to let the host make the host keys"
        );
        sync.refused_once("NotOwned", ChildKind::Secret, &name, msg).await;
        return Ok(None);
    }
    let comment = format!("{}@{}", l.name_any(), l.namespace().unwrap_or_default());
    let data = ctx
        .core
        .blocking(move || host_keys::generate(&comment))
        .await?
        .map_err(|e| Error::Task(e.to_string()))?;
    let mut meta = kube::api::ObjectMeta {
        name: Some(name.clone()),
        namespace: l.namespace(),
        labels: Some(slinky_api::labels::LOGIN.labels(&l.name_any())),
        ..Default::default()
    };
    meta.owner_references = owners::controller_ref(l).map(|o| vec![o]);
    let secret = Secret {
        metadata: meta,
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        immutable: Some(true),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let object = serde_json::to_value(&secret).unwrap_or(Value::Null);
    match ctx.core.writer.create_child(ChildKind::Secret, &object).await {
        Ok(created) => {
            ctx.core
                .event(
                    l,
                    EventType::Normal,
                    "HostKeysCreated",
                    format!("Created Secret {name}: the login pods' sshd host keys (RSA, Ed25519, ECDSA)"),
                )
                .await;
            Ok(serde_json::from_value(created).ok())
        }
        // Made meanwhile (another pass, or someone else): the next pass reads it.
        Err(e) if writer::is_already_exists(&e) => Ok(None),
        Err(e) => {
            let msg = format!("Error creating Secret {name}: {}", writer::message(&e));
            sync.refused("FailedCreate", ChildKind::Secret, &name, msg).await;
            Ok(None)
        }
    }
}
