//! The LoginSet reconciler: the login pods' host keys Secret (made here, by the host), then the
//! Deployment, Service and `sshd_config` ConfigMap (`loginset-children` builder), applied through
//! the one child path ([`super::core::apply`]); status conditions, `replicas`, `selector` and
//! `observedGeneration`.
//!
//! # Guarantees
//! * The builder gets copies of the LoginSet and its Controller, and hashes of the Secrets it
//!   needs: never a Secret's data. The host keys are generated here, once per LoginSet, into the
//!   immutable Secret `<loginset>-ssh-host-keys` controlled by the LoginSet (so they survive every
//!   roll of the login pods, and go with the LoginSet); a Secret of that name the LoginSet does not
//!   control is left alone (`ChildFailure`, `NotOwned`).
//! * A missing Controller is `ControllerNotFound`; a missing `sssd.conf` Secret (or key) is
//!   `ReferenceNotFound`: the children wait (the existing ones stay) and the pass is retried with
//!   backoff.
//! * Every child is applied only over an object this LoginSet controls, or created; a steady
//!   state makes no writes; children the builder no longer returns are deleted with a UID
//!   precondition.

mod host_keys;

use crate::plugins::Builder as _;
use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use serde_json::Value;
use slinky_api::{
    Controller, LoginSet, LoginSetStatus, checks, conditions,
    contract::{LoginSetInputs, secret_hash},
    hash::sha256_hex,
    owners,
};

use super::{
    ControllerContext, Error, component, core::apply::ChildSync, core::backoff, core::pass::PassState,
    core::writer,
};
use crate::plugins::{BuilderKind, ChildKind};

/// The kinds of a LoginSet's built children (what pruning looks at).
const CHILD_KINDS: [ChildKind; 3] = [ChildKind::Deployment, ChildKind::Service, ChildKind::ConfigMap];

/// Reconcile one LoginSet.
///
/// # Errors
/// API errors (retried with the LoginSet's backoff by the error policy).
pub async fn reconcile(l: Arc<LoginSet>, ctx: Arc<ControllerContext>) -> Result<Action, Error> {
    ctx.core.instrumented(l.as_ref(), reconcile_inner(&l, &ctx)).await
}

/// What stops a pass before the builder runs: `(condition type, reason, message)`.
type Waiting = (&'static str, &'static str, String);

async fn reconcile_inner(l: &LoginSet, ctx: &ControllerContext) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    let ns = l.namespace().unwrap_or_default();
    if l.metadata.deletion_timestamp.is_some() || !core.serves(&ns) {
        return Ok(Action::await_change());
    }
    let current = l
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut state = PassState::new(core, l, current);
    let mut sync = ChildSync::new(
        core,
        &ctx.caches.children,
        &ctx.applied,
        l,
        current,
        BTreeSet::new(),
    );
    let mut applied = Vec::new();
    let mut waiting: Option<Waiting> = None;
    let controller = ctx
        .caches
        .controllers
        .get(&ObjectRef::<Controller>::new(&l.spec.controller_ref.name).within(&ns));
    if let Some(problem) = checks::summary(&l.spec_problems()) {
        state.problem(conditions::INVALID_SPEC, problem).await;
    } else if let Some(controller) = controller {
        match read_inputs(ctx, l, &mut sync).await? {
            Err(w) => waiting = w,
            Ok(inputs) => {
                let (copy, ctl) = (l.clone(), controller.as_ref().clone());
                let built = core
                    .call_builder(BuilderKind::LoginsetChildren, l.labels(), move |plugin, build| {
                        plugin.build_loginset_children(build, &copy, &ctl, &inputs)
                    })
                    .await?;
                match built {
                    Ok(desired) => {
                        applied.push(format!("Secret {}", l.ssh_host_keys_name()));
                        applied
                            .extend(component::apply_and_prune(&mut sync, desired, &CHILD_KINDS, &[]).await?);
                    }
                    Err(e) => state.builder_error(&e).await,
                }
            }
        }
    } else {
        waiting = Some((
            conditions::CONTROLLER_NOT_FOUND,
            conditions::CONTROLLER_NOT_FOUND,
            format!(
                "Controller {ns}/{} (spec.controllerRef) does not exist: the login pods wait for it \
                 (the existing ones are kept)",
                l.spec.controller_ref.name
            ),
        ));
    }
    if let Some((type_, reason, message)) = &waiting {
        if !super::core::status::ConditionChanges::already_true(current, type_, message) {
            tracing::warn!(reason, "{message}");
            core.event(l, EventType::Warning, reason, message.clone()).await;
        }
        state.problem = Some((type_, message.clone()));
    }
    let failures = sync.finish();
    let retry = !failures.is_empty() || state.builder_failed || waiting.is_some();
    component::set_conditions(
        &mut state,
        &[
            conditions::INVALID_SPEC,
            conditions::BUILDER_FAILED,
            conditions::CONTROLLER_NOT_FOUND,
            conditions::REFERENCE_NOT_FOUND,
        ],
        &failures,
        &applied,
        readiness(ctx, l).map(|(ready, _)| ready),
    );
    // A missing reference's reason is its own (`SecretNotFound`), not its type.
    if let Some((type_, reason, message)) = &waiting {
        state.conditions.set(type_, true, reason, message.clone());
        state
            .conditions
            .set(conditions::READY, false, reason, message.clone());
    }
    let changes = state.conditions.clone();
    let generation = l.metadata.generation;
    let replicas = readiness(ctx, l).map(|(_, replicas)| replicas).unwrap_or(0);
    let selector = slinky_api::labels::LOGIN
        .selector_labels(&l.name_any())
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    component::write_status(
        core,
        l,
        move |obj: &LoginSet| LoginSetStatus {
            replicas,
            selector: selector.clone(),
            observed_generation: generation,
            conditions: changes.apply(
                obj.status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default(),
            ),
        },
        |obj: &LoginSet| obj.status.clone(),
    )
    .await?;
    let requeue = core
        .backoff
        .record(&backoff::key(l), backoff::Outcome::of(true, retry))
        .unwrap_or(core.resync);
    Ok(Action::requeue(requeue))
}

/// The login pods' readiness and count, as their Deployment reports them.
fn readiness(ctx: &ControllerContext, l: &LoginSet) -> Option<(String, i32)> {
    let key = ObjectRef::new(&l.login_key()).within(&l.namespace().unwrap_or_default());
    let d = ctx.caches.children.deployments.get(&key)?;
    let status = d.status.clone().unwrap_or_default();
    let ready = status.ready_replicas.unwrap_or(0);
    Some((
        format!("login {ready}/{} ready", l.replicas()),
        status.replicas.unwrap_or(0),
    ))
}

/// What the builder needs: the hash of the host keys (made now when missing) and of
/// `sssd.conf`; or what the pass waits for (`None`: the host keys, whose failure `sync` has).
async fn read_inputs(
    ctx: &ControllerContext,
    l: &LoginSet,
    sync: &mut ChildSync<'_, LoginSet>,
) -> Result<Result<LoginSetInputs, Option<Waiting>>, Error> {
    let ns = l.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.core.client.clone(), &ns);
    let sssd = &l.spec.sssd_conf_ref;
    let missing = |reason, what: String| {
        Err(Some((
            conditions::REFERENCE_NOT_FOUND,
            reason,
            format!("{what}: the login pods mount it, and wait for it (the existing ones are kept)"),
        )))
    };
    let Some(secret) = api.get_opt(&sssd.name).await? else {
        return Ok(missing(
            "SecretNotFound",
            format!("Secret {ns}/{} (spec.sssdConfRef) does not exist", sssd.name),
        ));
    };
    let Some(sssd_conf) = secret_value(&secret, &sssd.key) else {
        return Ok(missing(
            "SecretKeyNotFound",
            format!(
                "Secret {ns}/{} (spec.sssdConfRef) has no key {:?}",
                sssd.name, sssd.key
            ),
        ));
    };
    let Some(keys) = host_keys(ctx, l, &api, sync).await? else {
        return Ok(Err(None));
    };
    Ok(Ok(LoginSetInputs {
        ssh_host_keys_hash: secret_hash(&keys),
        sssd_conf_hash: sha256_hex(&sssd_conf),
    }))
}

/// The value of `key` of `secret` (`stringData` over `data`).
fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|ByteString(v)| v.clone())
        })
}

/// The LoginSet's host keys Secret: read, or made and created when it does not exist. `None`
/// when it cannot be had this pass (a failure of `sync`: not the LoginSet's, or refused).
async fn host_keys(
    ctx: &ControllerContext,
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
